//! The `intruder` nemesis: processes on the victim's host that do not hold the
//! cluster secret, run while the nemesis is on.
//!
//! - a stranger: a tollgate node with its own `node_id` and a guessed secret,
//!   seeded with the cluster's nodes, in `lease` mode (it would own keys);
//! - an impostor: the same under the victim's `node_id` (its newer generation
//!   would supersede the victim);
//! - an interceptor (`tollgate-jepsen intercept`): copies of every gossip
//!   datagram and internal RPC request the victim receives, captured with raw
//!   sockets: each datagram sent again at once to the victim and to every
//!   other node, each RPC request sent again to the victim 200 ms later, as it
//!   was and altered (a larger `want`, the old plain-secret attack's
//!   far-future `seq`).
//!
//! Its check (`intruders kept out`): no node lists an intruder's address as a
//! member, no replayed or altered RPC is answered 2xx, and the nodes counted
//! refused gossip; its detail says how much the interceptor captured and sent
//! again. Every other check of the run (the mode's promise, liveness) must
//! hold alongside.

use crate::checker::Check;
use crate::hosts::Host;
use crate::procs::Proc;
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The secret the intruders guess.
pub const GUESSED_SECRET: &str = "an-intruders-guess-0123456789";

/// How far the stranger's and the impostor's ports are from the node's.
const SHIFTS: [(&str, u16); 2] = [("stranger", 100), ("impostor", 200)];

/// The cluster's ports on every host.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// Proxy.
    pub proxy: u16,
    /// Gossip (UDP).
    pub gossip: u16,
    /// Internal RPC.
    pub rpc: u16,
}

/// The victim's config turned into an intruder's: ports moved by `shift`, the
/// guessed secret, `lease` mode without Redis, and `node_id` replaced unless
/// `node_id` is `None` (the impostor keeps the victim's).
fn intruder_toml(
    victim: &str,
    ip: &str,
    ports: Ports,
    shift: u16,
    node_id: Option<&str>,
) -> String {
    let mut lines = Vec::new();
    let mut in_redis = false;
    for line in victim.lines() {
        if line.starts_with('[') {
            in_redis = line == "[redis]";
        }
        if in_redis {
            continue;
        }
        let moved = |key: &str, port: u16| format!("{key} = \"{ip}:{}\"", port + shift);
        let line = match line.split_once(" = ").map(|(k, _)| k) {
            Some("listen") => moved("listen", ports.proxy),
            Some("gossip_listen") => moved("gossip_listen", ports.gossip),
            Some("rpc_listen") => moved("rpc_listen", ports.rpc),
            Some("secret") => format!("secret = \"{GUESSED_SECRET}\""),
            Some("mode") => "mode = \"lease\"".to_owned(),
            Some("node_id") => match node_id {
                Some(id) => format!("node_id = \"{id}\""),
                None => line.to_owned(),
            },
            _ => line.to_owned(),
        };
        lines.push(line);
    }
    lines.join("\n") + "\n"
}

/// The intruders of one run, while the nemesis is on.
pub struct Intrusion {
    victim_ip: String,
    procs: Vec<Proc>,
    interceptor: Proc,
    counts: PathBuf,
}

impl Intrusion {
    /// Starts the intruders on `host` (node `victim`'s), whose config is in
    /// `dir`; `ips` are every node's addresses.
    pub fn start(
        dir: &Path,
        bin: &Path,
        host: &Host,
        victim: usize,
        ips: &[String],
        ports: Ports,
    ) -> anyhow::Result<Intrusion> {
        let config = std::fs::read_to_string(dir.join(format!("n{victim}.toml")))?;
        let mut procs = Vec::new();
        for (name, shift) in SHIFTS {
            let id = (name == "stranger").then_some("intruder");
            let path = dir.join(format!("{name}.toml"));
            std::fs::write(&path, intruder_toml(&config, &host.ip, ports, shift, id))?;
            let args = vec!["node".into(), "--config".into(), path.display().to_string()];
            let log = dir.join(format!("{name}.log"));
            procs.push(Proc::start(name, host, bin, args, log)?);
        }
        let counts = dir.join("interceptor.json");
        let mut args = vec![
            "intercept".to_owned(),
            "--ip".into(),
            host.ip.clone(),
            "--gossip-port".into(),
            ports.gossip.to_string(),
            "--rpc-port".into(),
            ports.rpc.to_string(),
            "--counts".into(),
            counts.display().to_string(),
        ];
        for ip in ips.iter().filter(|ip| **ip != host.ip) {
            args.extend(["--peer".into(), ip.clone()]);
        }
        let interceptor = Proc::start("interceptor", host, bin, args, dir.join("interceptor.log"))?;
        Ok(Intrusion {
            victim_ip: host.ip.clone(),
            procs,
            interceptor,
            counts,
        })
    }

    /// Reads what the nodes saw of the intruders, stops them, and returns the
    /// run's `intruders kept out` check.
    pub async fn end(mut self, ips: &[String], ports: Ports) -> Check {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_default();
        let intruder_addrs: Vec<String> = (SHIFTS.iter())
            .map(|(_, shift)| format!("@{}:{}", self.victim_ip, ports.gossip + shift))
            .collect();
        let mut seen_intruders = Vec::new();
        let mut gossip_refused = 0;
        let mut rpc_refused = 0;
        for ip in ips {
            let base = format!("http://{ip}:{}", ports.proxy);
            let cluster = get_json(&client, &format!("{base}/admin/cluster")).await;
            let members = cluster["cluster"]["members"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for id in members.iter().filter_map(|m| m["id"].as_str()) {
                if intruder_addrs.iter().any(|a| id.ends_with(a.as_str())) {
                    seen_intruders.push(id.to_owned());
                }
            }
            let metrics = get_text(&client, &format!("{base}/metrics")).await;
            gossip_refused += sum(&metrics, "tollgate_gossip_datagrams_refused_total{");
            rpc_refused += [
                "unauthenticated",
                "wrong_secret",
                "bad_tag",
                "replayed",
                "stale",
            ]
            .iter()
            .map(|r| {
                sum(
                    &metrics,
                    &format!("tollgate_internal_rpc_refused_total{{reason=\"{r}\"}}"),
                )
            })
            .sum::<u64>();
        }
        for proc in &mut self.procs {
            proc.stop(Duration::from_secs(3)).await;
        }
        self.interceptor.stop(Duration::from_secs(3)).await;
        let counts: Counts = std::fs::read(&self.counts)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        // Nothing captured is no failure (a victim cut from every peer for
        // the whole intrusion hears none), but the detail says so.
        let ok = seen_intruders.is_empty()
            && counts.rpc_accepted == 0
            && counts.altered_accepted == 0
            && gossip_refused > 0;
        Check {
            name: "intruders kept out".into(),
            ok,
            detail: format!(
                "members from intruders' addresses: {seen_intruders:?}; gossip datagrams refused by the nodes: {gossip_refused}; \
                 captured {} gossip datagrams, sent again {}; captured {} RPC requests, sent again {} ({} answered 2xx) and altered {} ({} answered 2xx); \
                 RPCs refused for authentication: {rpc_refused}",
                counts.gossip_captured,
                counts.gossip_sent,
                counts.rpc_captured,
                counts.rpc_sent,
                counts.rpc_accepted,
                counts.altered_sent,
                counts.altered_accepted,
            ),
        }
    }
}

async fn get_text(client: &reqwest::Client, url: &str) -> String {
    match client.get(url).bearer_auth("jepsen-admin").send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

async fn get_json(client: &reqwest::Client, url: &str) -> serde_json::Value {
    serde_json::from_str(&get_text(client, url).await).unwrap_or_default()
}

/// The sum of the series starting with `prefix` in a metrics text.
fn sum(text: &str, prefix: &str) -> u64 {
    (text.lines())
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// What the interceptor did.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Gossip datagrams captured on their way to the victim.
    pub gossip_captured: u64,
    /// Copies sent (to the victim and every other node).
    pub gossip_sent: u64,
    /// Whole RPC requests captured on their way to the victim.
    pub rpc_captured: u64,
    /// Sent again as they were.
    pub rpc_sent: u64,
    /// Of those, answered 2xx.
    pub rpc_accepted: u64,
    /// Sent again altered.
    pub altered_sent: u64,
    /// Of those, answered 2xx.
    pub altered_accepted: u64,
}

#[derive(Default)]
struct Counters {
    gossip_captured: AtomicU64,
    gossip_sent: AtomicU64,
    rpc_captured: AtomicU64,
    rpc_sent: AtomicU64,
    rpc_accepted: AtomicU64,
    altered_sent: AtomicU64,
    altered_accepted: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> Counts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counts {
            gossip_captured: get(&self.gossip_captured),
            gossip_sent: get(&self.gossip_sent),
            rpc_captured: get(&self.rpc_captured),
            rpc_sent: get(&self.rpc_sent),
            rpc_accepted: get(&self.rpc_accepted),
            altered_sent: get(&self.altered_sent),
            altered_accepted: get(&self.altered_accepted),
        }
    }
}

/// The interceptor's options.
#[derive(clap::Args)]
pub struct InterceptArgs {
    /// The victim's address (the interceptor runs in its namespace).
    #[arg(long)]
    ip: Ipv4Addr,
    /// The other nodes' addresses.
    #[arg(long = "peer")]
    peers: Vec<Ipv4Addr>,
    /// The cluster's gossip port.
    #[arg(long)]
    gossip_port: u16,
    /// The cluster's internal RPC port.
    #[arg(long)]
    rpc_port: u16,
    /// Where its counts are written (every 200 ms and on SIGTERM).
    #[arg(long)]
    counts: PathBuf,
}

/// Most RPC requests sent again (each twice), so a long run stays cheap.
const MAX_RPC_REPLAYS: u64 = 500;

/// `tollgate-jepsen intercept`: runs until SIGTERM.
pub async fn intercept(args: InterceptArgs) -> anyhow::Result<()> {
    let counters = Arc::new(Counters::default());
    let udp = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))?;
    let tcp = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::TCP))?;
    let out = UdpSocket::bind((args.ip, 0))?;
    let targets: Vec<SocketAddr> = (std::iter::once(args.ip).chain(args.peers.iter().copied()))
        .map(|ip| SocketAddr::from((ip, args.gossip_port)))
        .collect();
    let (gossip, rpc) = (counters.clone(), counters.clone());
    let (own, gossip_port, rpc_port) = (args.ip, args.gossip_port, args.rpc_port);
    std::thread::spawn(move || resend_gossip(&udp, &out, own, gossip_port, &targets, &gossip));
    let to = SocketAddr::from((args.ip, args.rpc_port));
    std::thread::spawn(move || resend_rpcs(&tcp, own, rpc_port, to, &rpc));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let snapshot = serde_json::to_vec(&counters.snapshot())?;
        std::fs::write(&args.counts, snapshot)?;
        tokio::select! {
            _ = term.recv() => break,
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    std::fs::write(&args.counts, serde_json::to_vec(&counters.snapshot())?)?;
    Ok(())
}

/// An IPv4 packet's source, and its payload past the IP header.
fn ip_payload(packet: &[u8]) -> Option<(Ipv4Addr, &[u8])> {
    let header = usize::from(packet.first()? & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([*packet.get(2)?, *packet.get(3)?]));
    let source = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    Some((source, packet.get(header..total.min(packet.len()))?))
}

/// The next packet `raw` reads, from its transport header on, when it came
/// from another host to `port` (UDP and TCP keep the destination port at the
/// same offset). The interceptor's own copies come from its host's address:
/// never captured again.
fn next_to_port<'a>(raw: &Socket, buf: &'a mut [u8], own: Ipv4Addr, port: u16) -> Option<&'a [u8]> {
    let mut reader: &Socket = raw;
    let len = reader.read(buf).ok()?;
    let (source, transport) = ip_payload(&buf[..len])?;
    let to_port = transport.len() >= 8 && u16::from_be_bytes([transport[2], transport[3]]) == port;
    (source != own && to_port).then_some(transport)
}

fn resend_gossip(
    raw: &Socket,
    out: &UdpSocket,
    own: Ipv4Addr,
    port: u16,
    targets: &[SocketAddr],
    counters: &Counters,
) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let Some(udp) = next_to_port(raw, &mut buf, own, port) else {
            continue;
        };
        counters.gossip_captured.fetch_add(1, Ordering::Relaxed);
        for target in targets {
            if out.send_to(&udp[8..], target).is_ok() {
                counters.gossip_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// How long after capturing a request the interceptor sends its copies: by
/// then the original was answered, so a copy answered 2xx is a request served
/// twice (sent at once, a copy may be served first and the original refused:
/// served once, which an attacker on the path achieves by dropping packets
/// too).
const RESEND_AFTER: Duration = Duration::from_millis(200);

fn resend_rpcs(raw: &Socket, own: Ipv4Addr, port: u16, to: SocketAddr, counters: &Arc<Counters>) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let Some(tcp) = next_to_port(raw, &mut buf, own, port).filter(|t| t.len() >= 20) else {
            continue;
        };
        let offset = usize::from(tcp[12] >> 4) * 4;
        let Some(request) = tcp.get(offset..).and_then(whole_request) else {
            continue;
        };
        counters.rpc_captured.fetch_add(1, Ordering::Relaxed);
        if counters.rpc_sent.load(Ordering::Relaxed) >= MAX_RPC_REPLAYS {
            continue;
        }
        counters.rpc_sent.fetch_add(1, Ordering::Relaxed);
        let counters = counters.clone();
        std::thread::spawn(move || {
            std::thread::sleep(RESEND_AFTER);
            let (head, body) = request;
            if send_again(to, &head, &body) {
                counters.rpc_accepted.fetch_add(1, Ordering::Relaxed);
            }
            counters.altered_sent.fetch_add(1, Ordering::Relaxed);
            if send_again(to, &head, &alter(&body)) {
                counters.altered_accepted.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

/// A segment holding a whole HTTP POST: its head (without `content-length`,
/// `connection` and the blank line) and its body.
fn whole_request(segment: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    if !segment.starts_with(b"POST ") {
        return None;
    }
    let end = segment.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&segment[..end]).ok()?;
    let mut length = None;
    let mut kept = Vec::new();
    for line in head.split("\r\n") {
        let lower = line.to_ascii_lowercase();
        if let Some(value) = lower.strip_prefix("content-length:") {
            length = value.trim().parse::<usize>().ok();
        } else if !lower.starts_with("connection:") {
            kept.push(line);
        }
    }
    let body = segment.get(end + 4..end + 4 + length?)?;
    Some((kept.join("\r\n").into_bytes(), body.to_vec()))
}

/// The body with every `"want":N` raised and every `"seq":N` pushed far ahead.
fn alter(body: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let mut out = String::with_capacity(text.len() + 32);
    let mut rest = text.as_ref();
    let next = |s: &str| {
        let (want, seq) = (s.find("\"want\":"), s.find("\"seq\":"));
        want.into_iter().chain(seq).min()
    };
    while let Some(at) = next(rest) {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let key_end = from.find(':').map_or(from.len(), |i| i + 1);
        let (key, after) = from.split_at(key_end);
        out.push_str(key);
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        out.push_str(if key.contains("seq") {
            "18446744073709551000"
        } else {
            "1000000"
        });
        rest = &after[digits..];
    }
    out.push_str(rest);
    out.into_bytes()
}

/// Sends `head` and `body` to `to` on a fresh connection: whether the answer
/// was 2xx.
fn send_again(to: SocketAddr, head: &[u8], body: &[u8]) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut request = head.to_vec();
    request.extend_from_slice(
        format!(
            "\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    request.extend_from_slice(body);
    if stream.write_all(&request).is_err() {
        return false;
    }
    let mut answer = [0u8; 12];
    stream.read_exact(&mut answer).is_ok() && answer.starts_with(b"HTTP/1.1 2")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_intruders_config_moves_ports_guesses_the_secret_and_leaves_redis() {
        let victim = "[server]\nlisten = \"10.0.0.2:8080\"\n\n[cluster]\nnode_id = \"n1\"\ngossip_listen = \"10.0.0.2:7200\"\nrpc_listen = \"10.0.0.2:7300\"\nsecret = \"real\"\nseeds = [\"10.0.0.3:7200\"]\nmode = \"redis\"\n\n[redis]\nurl = \"redis://10.0.0.9/\"\n\n[[tenants]]\nid = \"t\"\n";
        let ports = Ports {
            proxy: 8080,
            gossip: 7200,
            rpc: 7300,
        };
        let toml = intruder_toml(victim, "10.0.0.2", ports, 100, Some("intruder"));
        assert!(toml.contains("listen = \"10.0.0.2:8180\""), "{toml}");
        assert!(toml.contains("gossip_listen = \"10.0.0.2:7300\""), "{toml}");
        assert!(toml.contains("rpc_listen = \"10.0.0.2:7400\""), "{toml}");
        assert!(toml.contains("seeds = [\"10.0.0.3:7200\"]"), "{toml}");
        assert!(
            toml.contains(GUESSED_SECRET) && toml.contains("mode = \"lease\""),
            "{toml}"
        );
        assert!(
            toml.contains("node_id = \"intruder\"") && !toml.contains("[redis]"),
            "{toml}"
        );
        assert!(toml.contains("[[tenants]]"), "{toml}");
        let impostor = intruder_toml(victim, "10.0.0.2", ports, 200, None);
        assert!(impostor.contains("node_id = \"n1\""), "{impostor}");
    }

    #[test]
    fn a_captured_request_is_read_whole_and_altered() {
        let body = br#"{"entries":[{"key":"k","seq":7,"want":2}]}"#;
        let segment = [
            b"POST /internal/v1/lease/sync HTTP/1.1\r\nhost: a\r\nx-tollgate-auth: v1 x\r\ncontent-length: ".as_slice(),
            body.len().to_string().as_bytes(),
            b"\r\nconnection: keep-alive\r\n\r\n",
            body,
        ]
        .concat();
        let (head, read) = whole_request(&segment).unwrap();
        assert_eq!(read, body);
        let head = String::from_utf8(head).unwrap();
        assert!(
            head.contains("x-tollgate-auth") && !head.contains("content-length"),
            "{head}"
        );
        assert_eq!(
            whole_request(&segment[..segment.len() - 1]),
            None,
            "a body cut short"
        );
        let altered = String::from_utf8(alter(body)).unwrap();
        assert_eq!(
            altered,
            r#"{"entries":[{"key":"k","seq":18446744073709551000,"want":1000000}]}"#
        );
    }
}
