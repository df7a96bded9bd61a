//! Test hosts: one Linux network namespace per node, the mock upstream and Redis,
//! each with a veth pair to a bridge the harness creates, on a /24 of its own
//! (10.77.K.0/24, K from the run). The harness itself (the clients) sits on the
//! bridge at .1. Everything is torn down on drop, also when a test panics.
//!
//! Needs root (CAP_NET_ADMIN) and `ip`; iptables for partitions.

use anyhow::{Context, bail};
use std::process::Command;

/// Runs a command, failing with its stderr.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program} (is it installed?)"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One host.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its namespace.
    pub ns: String,
    /// Its address on the bridge.
    pub ip: String,
}

/// The test network.
#[derive(Debug)]
pub struct Net {
    /// The bridge.
    pub bridge: String,
    /// The harness's address on the bridge (clients run here).
    pub gateway_ip: String,
    /// The hosts, in creation order.
    pub hosts: Vec<Host>,
    prefix: String,
}

impl Net {
    /// Fails with a clear message when the harness may not create namespaces.
    pub fn check_privileges() -> anyhow::Result<()> {
        let uid = sh("id", &["-u"])?;
        if uid.trim() != "0" {
            bail!(
                "the jepsen harness needs root (CAP_NET_ADMIN) to create network namespaces; run it as root or inside `unshare -Urn`"
            );
        }
        sh("ip", &["-V"]).context("`ip` (iproute2) is required")?;
        Ok(())
    }

    /// Creates `count` hosts on subnet `10.77.{k}.0/24`.
    pub fn create(k: u8, count: usize) -> anyhow::Result<Net> {
        Self::check_privileges()?;
        let prefix = format!("tgj{k}");
        Self::sweep(&prefix);
        let bridge = format!("{prefix}br");
        let mut net = Net {
            bridge: bridge.clone(),
            gateway_ip: format!("10.77.{k}.1"),
            hosts: Vec::new(),
            prefix: prefix.clone(),
        };
        sh("ip", &["link", "add", &bridge, "type", "bridge"])?;
        sh(
            "ip",
            &["addr", "add", &format!("10.77.{k}.1/24"), "dev", &bridge],
        )?;
        sh("ip", &["link", "set", &bridge, "up"])?;
        for i in 0..count {
            let ns = format!("{prefix}h{i}");
            let veth = format!("{prefix}v{i}");
            let ip = format!("10.77.{k}.{}", 10 + i);
            sh("ip", &["netns", "add", &ns])?;
            sh(
                "ip",
                &[
                    "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                ],
            )?;
            sh("ip", &["link", "set", &veth, "master", &bridge])?;
            sh("ip", &["link", "set", &veth, "up"])?;
            let exec = |args: &[&str]| {
                let mut all = vec!["netns", "exec", ns.as_str()];
                all.extend_from_slice(args);
                sh("ip", &all)
            };
            exec(&["ip", "link", "set", "lo", "up"])?;
            exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            exec(&["ip", "link", "set", "eth0", "up"])?;
            net.hosts.push(Host { ns, ip });
        }
        Ok(net)
    }

    /// Removes leftovers of an earlier run with the same prefix (a killed harness).
    fn sweep(prefix: &str) {
        if let Ok(list) = sh("ip", &["netns", "list"]) {
            for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
                if ns.starts_with(prefix) {
                    let _ = sh("ip", &["netns", "del", ns]);
                }
            }
        }
        let _ = sh("ip", &["link", "del", &format!("{prefix}br")]);
        // A host end whose namespace outlived its name (a killed node still held
        // it when the name was deleted) keeps its veth pair: `link add` then
        // fails with "File exists" (as after a run killed mid-bench).
        if let Ok(links) = sh("ip", &["-o", "link", "show"]) {
            let veth = format!("{prefix}v");
            for link in links.lines() {
                let name = link.split(':').nth(1).map(str::trim).unwrap_or_default();
                let name = name.split('@').next().unwrap_or_default();
                if name.starts_with(&veth) {
                    let _ = sh("ip", &["link", "del", name]);
                }
            }
        }
    }

    /// Runs `args` inside `host`'s namespace.
    pub fn exec(&self, host: &Host, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["netns", "exec", host.ns.as_str()];
        all.extend_from_slice(args);
        sh("ip", &all)
    }

    /// Cuts all traffic between `a` and `b` (both directions), leaving everything else.
    pub fn cut(&self, a: &Host, b: &Host) -> anyhow::Result<()> {
        self.rules("-A", a, b, &[])
    }

    /// Undoes [`Net::cut`] of `a` and `b` only.
    pub fn uncut(&self, a: &Host, b: &Host) -> anyhow::Result<()> {
        self.rules("-D", a, b, &[])
    }

    /// Drops a random `percent` of the packets between `a` and `b`, each direction
    /// (iptables `statistic`, no qdisc needed).
    pub fn lossy(&self, a: &Host, b: &Host, percent: u8) -> anyhow::Result<()> {
        let p = format!("{:.2}", f64::from(percent) / 100.0);
        self.rules("-A", a, b, &statistic(&p))
    }

    /// Undoes [`Net::lossy`].
    pub fn unlossy(&self, a: &Host, b: &Host, percent: u8) -> anyhow::Result<()> {
        let p = format!("{:.2}", f64::from(percent) / 100.0);
        self.rules("-D", a, b, &statistic(&p))
    }

    /// Adds (`-A`) or deletes (`-D`) DROP rules for traffic between `a` and `b` in
    /// both namespaces, with `extra` matches (so each fault removes only its own).
    fn rules(&self, op: &str, a: &Host, b: &Host, extra: &[&str]) -> anyhow::Result<()> {
        for (from, to) in [(a, b), (b, a)] {
            for (chain, dir) in [("INPUT", "-s"), ("OUTPUT", "-d")] {
                let mut args = vec!["iptables", op, chain, dir, to.ip.as_str()];
                args.extend_from_slice(extra);
                args.extend_from_slice(&["-j", "DROP"]);
                self.exec(from, &args)?;
            }
        }
        Ok(())
    }

    /// Removes every cut of `host`.
    pub fn heal(&self, host: &Host) -> anyhow::Result<()> {
        self.exec(host, &["iptables", "-F"])?;
        Ok(())
    }
}

fn statistic(probability: &str) -> [&str; 6] {
    [
        "-m",
        "statistic",
        "--mode",
        "random",
        "--probability",
        probability,
    ]
}

impl Drop for Net {
    fn drop(&mut self) {
        Self::sweep(&self.prefix);
    }
}
