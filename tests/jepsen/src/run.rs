//! One run: hosts, the mock upstream, N nodes, the workload, the nemesis schedule,
//! then the checks and the report in `target/jepsen/<run>/`.

use crate::checker::{self, Check, MockLine, Op};
use crate::hosts::Net;
use crate::procs::Proc;
use anyhow::{Context, bail};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The tenant key every client uses.
pub const KEY: &str = "sk-jepsen";
const PROXY_PORT: u16 = 8080;
const GOSSIP_PORT: u16 = 7200;
const RPC_PORT: u16 = 7300;
const MOCK_PORT: u16 = 9090;
const REDIS_PORT: u16 = 6379;

/// What to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// `local-full`, `local-split`, `gossip`, `lease`, `redis`, `redis-lease`.
    pub mode: String,
    /// `none`, `partition`, `kill`, `pause` (comma-separated: several).
    pub nemesis: Vec<String>,
    /// Nodes.
    pub nodes: usize,
    /// Workload length.
    pub duration: Duration,
    /// Seeds the schedule and the clients.
    pub seed: u64,
    /// L: the tenant's (and the upstream's) requests per window.
    pub limit: u64,
    /// The window.
    pub window: Duration,
    /// Subnet index (10.77.K.0/24): distinct runs may overlap in time.
    pub subnet: u8,
    /// The harness binary (started as `node` and `mock` in the hosts).
    pub bin: PathBuf,
    /// Where the run's files go.
    pub dir: PathBuf,
}

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    /// Every check.
    pub checks: Vec<Check>,
    /// The report's path.
    pub report: PathBuf,
}

impl Outcome {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

fn node_toml(
    spec: &RunSpec,
    i: usize,
    ips: &[String],
    mock_ip: &str,
    redis_ip: Option<&str>,
) -> String {
    let (mode, share) = match spec.mode.as_str() {
        "local-full" => ("local", "full"),
        "local-split" => ("local", "split"),
        other => (other, "full"),
    };
    let seeds: Vec<String> = (ips.iter().enumerate())
        .filter(|(j, _)| *j != i)
        .map(|(_, ip)| format!("\"{ip}:{GOSSIP_PORT}\""))
        .collect();
    let ip = &ips[i];
    let window = spec.window.as_millis();
    format!(
        r#"[server]
listen = "{ip}:{PROXY_PORT}"
admin_token = "jepsen-admin"

[limits]
window = "{window}ms"
buckets = 10

[cluster]
cluster_id = "jepsen"
node_id = "n{i}"
gossip_listen = "{ip}:{GOSSIP_PORT}"
rpc_listen = "{ip}:{RPC_PORT}"
secret = "jepsen-cluster-secret-0123"
seeds = [{seeds}]
mode = "{mode}"
local_share = "{share}"

[[upstreams]]
id = "mock"
kind = "openai"
base_url = "http://{mock_ip}:{MOCK_PORT}/v1"

[[routes]]
models = ["*"]
upstreams = ["mock"]

[[tenants]]
id = "t"
api_key_hashes = ["sha256:{hash}"]
rpm = {limit}
max_wait = "500ms"
{redis}"#,
        seeds = seeds.join(", "),
        limit = spec.limit,
        hash = tollgate::config::hash_api_key(KEY),
        redis = redis_ip.map_or(String::new(), |ip| format!(
            "\n[redis]\nurl = \"redis://{ip}:{REDIS_PORT}/\"\ntimeout = \"50ms\"\n"
        )),
    )
}

async fn wait_ready(ips: &[String], deadline: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let end = Instant::now() + deadline;
    for ip in ips {
        loop {
            let url = format!("http://{ip}:{PROXY_PORT}/admin/cluster");
            let ok = match client.get(&url).bearer_auth("jepsen-admin").send().await {
                Ok(r) if r.status().is_success() => {
                    let body: serde_json::Value =
                        serde_json::from_slice(&r.bytes().await.unwrap_or_default())
                            .unwrap_or_default();
                    body["cluster"]["members"].as_array().map_or(0, Vec::len) == ips.len()
                }
                _ => false,
            };
            if ok {
                break;
            }
            if Instant::now() > end {
                bail!("node {ip} never became ready with {} members", ips.len());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Clients (on the bridge) sending to each node at a skewed rate; every operation
/// is recorded with a terminal outcome.
async fn workload(ips: Vec<String>, spec: &RunSpec, started: Instant) -> Vec<Op> {
    let ops = Arc::new(Mutex::new(Vec::new()));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default();
    let end = started + spec.duration;
    let mut tasks = Vec::new();
    for (node, ip) in ips.into_iter().enumerate() {
        // Skewed demand: node 0 sends most; together well above the limit.
        let per_second = spec.limit as f64 / spec.window.as_secs_f64() * 4.0 / (node as f64 + 1.0);
        let gap = Duration::from_secs_f64(1.0 / per_second.max(0.5));
        let (ops, client) = (ops.clone(), client.clone());
        let mut rng = SmallRng::seed_from_u64(spec.seed ^ node as u64);
        tasks.push(tokio::spawn(async move {
            let body = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#;
            while Instant::now() < end {
                let invoke_ms = started.elapsed().as_millis() as u64;
                let response = client
                    .post(format!("http://{ip}:{PROXY_PORT}/v1/chat/completions"))
                    .bearer_auth(KEY)
                    .header("content-type", "application/json")
                    .body(body.to_vec())
                    .send()
                    .await;
                let status = match response {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        let _ = r.bytes().await;
                        s
                    }
                    Err(_) => 0,
                };
                let op = Op {
                    node,
                    invoke_ms,
                    complete_ms: Some(started.elapsed().as_millis() as u64),
                    status: Some(status),
                };
                ops.lock().unwrap_or_else(|p| p.into_inner()).push(op);
                let jitter = rng.random_range(0.5..1.5);
                tokio::time::sleep(gap.mul_f64(jitter)).await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    ops.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// One nemesis event, for the report.
#[derive(Debug, Clone)]
struct Event {
    at_ms: u64,
    what: String,
}

/// Runs `spec`: returns the checks and writes the run's files.
pub async fn run(spec: RunSpec) -> anyhow::Result<Outcome> {
    // A fresh directory: an earlier run's Redis AOF or logs must not leak in.
    let _ = std::fs::remove_dir_all(&spec.dir);
    std::fs::create_dir_all(&spec.dir)?;
    let uses_redis = spec.mode.starts_with("redis");
    let extra = usize::from(uses_redis);
    let net = Net::create(spec.subnet, spec.nodes + 1 + extra)?;
    let mock_host = net.hosts[0].clone();
    let node_hosts: Vec<_> = net.hosts[1 + extra..].to_vec();
    // Redis (the Redis modes) on a host of its own.
    let mut redis = match uses_redis {
        true => {
            let host = &net.hosts[1];
            Some(Proc::start(
                "redis",
                host,
                Path::new("redis-server"),
                [
                    "--bind",
                    &host.ip,
                    "--port",
                    &REDIS_PORT.to_string(),
                    "--save",
                    "",
                    // Every write fsynced: kill -9 and restart keep the windows, as
                    // a production Redis with persistence would.
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--dir",
                    &spec.dir.display().to_string(),
                    "--protected-mode",
                    "no",
                ]
                .map(String::from)
                .to_vec(),
                spec.dir.join("redis.log"),
            )?)
        }
        false => None,
    };
    let redis_ip = uses_redis.then(|| net.hosts[1].ip.clone());
    let ips: Vec<String> = node_hosts.iter().map(|h| h.ip.clone()).collect();
    let mock_log = spec.dir.join("mock.jsonl");
    let window_ms = spec.window.as_millis() as u64;
    let mut mock = Proc::start(
        "mock",
        &mock_host,
        &spec.bin,
        [
            "mock",
            "--listen",
            &format!("{}:{MOCK_PORT}", mock_host.ip),
            "--rpm",
            &spec.limit.to_string(),
            "--window-ms",
            &window_ms.to_string(),
            "--log",
            &mock_log.display().to_string(),
        ]
        .map(String::from)
        .to_vec(),
        spec.dir.join("mock.log"),
    )?;
    let mut nodes = Vec::new();
    for (i, host) in node_hosts.iter().enumerate() {
        let config = spec.dir.join(format!("n{i}.toml"));
        std::fs::write(
            &config,
            node_toml(&spec, i, &ips, &mock_host.ip, redis_ip.as_deref()),
        )?;
        nodes.push(Proc::start(
            &format!("n{i}"),
            host,
            &spec.bin,
            vec![
                "node".into(),
                "--config".into(),
                config.display().to_string(),
            ],
            spec.dir.join(format!("n{i}.log")),
        )?);
    }
    wait_ready(&ips, Duration::from_secs(30)).await?;
    let started = Instant::now();
    let load = {
        let (ips, spec) = (ips.clone(), spec.clone());
        tokio::spawn(async move { workload(ips, &spec, started).await })
    };
    let mut events = Vec::new();
    let at = |f: f64| started + spec.duration.mul_f64(f);
    let n = nodes.len();
    let half = n / 2;
    for nemesis in &spec.nemesis {
        match nemesis.as_str() {
            "partition" => {
                tokio::time::sleep_until(at(0.25)).await;
                for a in &node_hosts[..half] {
                    for b in &node_hosts[half..] {
                        net.cut(a, b)?;
                    }
                }
                events.push(Event {
                    at_ms: started.elapsed().as_millis() as u64,
                    what: format!(
                        "partition: n0..n{} | n{half}..n{}",
                        half.saturating_sub(1),
                        n - 1
                    ),
                });
                tokio::time::sleep_until(at(0.75)).await;
                for h in &node_hosts {
                    net.heal(h)?;
                }
                events.push(Event {
                    at_ms: started.elapsed().as_millis() as u64,
                    what: "heal".into(),
                });
            }
            "kill" => {
                tokio::time::sleep_until(at(0.33)).await;
                nodes[n - 1].kill9().await;
                events.push(Event {
                    at_ms: started.elapsed().as_millis() as u64,
                    what: format!("kill -9 n{}", n - 1),
                });
            }
            "pause" => {
                tokio::time::sleep_until(at(0.33)).await;
                nodes[n - 1].pause(true);
                events.push(Event {
                    at_ms: started.elapsed().as_millis() as u64,
                    what: format!("SIGSTOP n{}", n - 1),
                });
                tokio::time::sleep_until(at(0.66)).await;
                nodes[n - 1].pause(false);
                events.push(Event {
                    at_ms: started.elapsed().as_millis() as u64,
                    what: format!("SIGCONT n{}", n - 1),
                });
            }
            "redis-kill" => {
                let Some(redis) = redis.as_mut() else {
                    bail!("nemesis redis-kill needs a Redis mode");
                };
                tokio::time::sleep_until(at(0.33)).await;
                redis.kill9().await;
                events.push(Event {
                    at_ms: started.elapsed().as_millis() as u64,
                    what: "kill -9 redis".into(),
                });
                tokio::time::sleep_until(at(0.66)).await;
                redis.restart()?;
                events.push(Event {
                    at_ms: started.elapsed().as_millis() as u64,
                    what: "restart redis (empty)".into(),
                });
            }
            "none" => {}
            other => bail!("unknown nemesis {other:?} (none, partition, kill, pause, redis-kill)"),
        }
    }
    let ops = load.await.context("workload")?;
    for node in &mut nodes {
        node.stop(Duration::from_secs(5)).await;
    }
    mock.stop(Duration::from_secs(5)).await;
    if let Some(redis) = redis.as_mut() {
        redis.stop(Duration::from_secs(2)).await;
    }
    drop(net);
    let lines = read_mock_log(&mock_log)?;
    let history = spec.dir.join("history.jsonl");
    let mut text = String::new();
    for op in &ops {
        text.push_str(&serde_json::to_string(op)?);
        text.push('\n');
    }
    std::fs::write(&history, text)?;
    let case = checker::Case {
        mode: &spec.mode,
        nemeses: &spec.nemesis,
        nodes: spec.nodes as u64,
        limit: spec.limit,
        window_ms,
    };
    let checks = checker::check(&case, &lines, &ops);
    let report = spec.dir.join("report.md");
    std::fs::write(&report, render(&spec, &checks, &events, &ops))?;
    let rate = spec.limit as f64 / spec.window.as_secs_f64();
    let svg = crate::timeline::render(
        &ops,
        spec.nodes,
        spec.duration.as_millis() as u64,
        rate,
        &marks(&events),
    );
    std::fs::write(spec.dir.join("timeline.svg"), svg)?;
    Ok(Outcome { checks, report })
}

/// Pairs of events (partition..heal, SIGSTOP..SIGCONT, kill..restart) become
/// shaded intervals; the rest single marks.
fn marks(events: &[Event]) -> Vec<crate::timeline::Mark> {
    let mut out = Vec::new();
    let mut open: Option<&Event> = None;
    for e in events {
        let ends = e.what.starts_with("heal")
            || e.what.starts_with("SIGCONT")
            || e.what.starts_with("restart");
        match (open, ends) {
            (Some(start), true) => {
                out.push(crate::timeline::Mark {
                    from_ms: start.at_ms,
                    to_ms: Some(e.at_ms),
                    label: start.what.clone(),
                });
                open = None;
            }
            (None, false)
                if e.what.starts_with("partition")
                    || e.what.starts_with("SIGSTOP")
                    || e.what.contains("redis") =>
            {
                open = Some(e);
            }
            _ => out.push(crate::timeline::Mark {
                from_ms: e.at_ms,
                to_ms: None,
                label: e.what.clone(),
            }),
        }
    }
    if let Some(start) = open {
        out.push(crate::timeline::Mark {
            from_ms: start.at_ms,
            to_ms: None,
            label: start.what.clone(),
        });
    }
    out
}

fn read_mock_log(path: &Path) -> anyhow::Result<Vec<MockLine>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad mock log line {l:?}")))
        .collect()
}

fn render(spec: &RunSpec, checks: &[Check], events: &[Event], ops: &[Op]) -> String {
    let mut out = format!(
        "# jepsen run: mode {}, nemesis {}, {} nodes, {:?}, seed {}\n\nL = {} requests per {:?} (tenant and upstream)\n\n",
        spec.mode,
        spec.nemesis.join(","),
        spec.nodes,
        spec.duration,
        spec.seed,
        spec.limit,
        spec.window
    );
    out.push_str("| check | result | detail |\n|---|---|---|\n");
    for c in checks {
        let verdict = if c.ok { "pass" } else { "**FAIL**" };
        out.push_str(&format!("| {} | {verdict} | {} |\n", c.name, c.detail));
    }
    out.push_str("\n## Nemesis events\n\n");
    for e in events {
        out.push_str(&format!("- {} ms: {}\n", e.at_ms, e.what));
    }
    out.push_str(
        "\n## Client outcomes per node\n\n| node | 200 | 429 | other |\n|---|---|---|---|\n",
    );
    for node in 0..spec.nodes {
        let mine: Vec<&Op> = ops.iter().filter(|o| o.node == node).collect();
        let count = |s: u16| mine.iter().filter(|o| o.status == Some(s)).count();
        let other = mine.len() - count(200) - count(429);
        out.push_str(&format!(
            "| n{node} | {} | {} | {other} |\n",
            count(200),
            count(429)
        ));
    }
    out
}
