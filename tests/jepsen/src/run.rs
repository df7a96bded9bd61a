//! One run: hosts, the mock upstream, N nodes, the workload, the nemesis schedule,
//! then the checks and the report in `target/jepsen/<run>/`.

use crate::checker::{self, Check, Interval, MockLine, Op, Sample, UpstreamSample};
use crate::hosts::Net;
use crate::nemesis::{self, Action, Step, Targets};
use crate::procs::Proc;
use crate::tasks::{self, TaskSpec};
use crate::workload::{self, PROXY_PORT, Shape};
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

const GOSSIP_PORT: u16 = 7200;
const RPC_PORT: u16 = 7300;
const MOCK_PORT: u16 = 9090;
const REDIS_PORT: u16 = 6379;
/// `[redis] slot_ttl` of the nodes: how soon a killed node's slot expires in Redis.
const REDIS_SLOT_TTL: Duration = Duration::from_secs(2);

/// What to run (saved as `spec.json` in the run's directory, for `--replay`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunSpec {
    /// `local-full`, `local-split`, `gossip`, `lease`, `redis`, `redis-lease`.
    pub mode: String,
    /// Nemeses ([`nemesis::NAMES`]); several overlap on one timeline.
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
    /// Tenants: one has L; several have 2L/T each, under an upstream limit of L.
    pub tenants: usize,
    /// `[cluster.lease] cut_off` (`share`, `fail-closed`, `fail-open`), if set.
    pub cut_off: Option<String>,
    /// `[cluster.lease] max_borrow`, if set.
    pub max_borrow: Option<f64>,
    /// `[cluster.lease] spillover` (lease mode only).
    #[serde(default)]
    pub spillover: bool,
    /// A deliberately broken limiter on every node (`skip-cluster-sync`), to
    /// prove the checker catches it.
    pub fault: Option<String>,
    /// Each tenant's concurrency limit, if any: with it, streams last longer and
    /// the ghost-slot check judges how soon a killed node's slots come back.
    #[serde(default)]
    pub concurrency: Option<u64>,
    /// How the clients' demand is spread (`mixed` unless benchmarking).
    #[serde(default)]
    pub pattern: workload::Pattern,
    /// Request loops per client (0 or 1: one; the benchmark uses more so that
    /// demand, not latency, bounds what clients send).
    #[serde(default)]
    pub loops: usize,
    /// Buckets per window (`[limits] buckets`): [`STRESS_BUCKETS`] unless a
    /// benchmark asks for more (`bench --buckets`).
    #[serde(default = "stress_buckets")]
    pub buckets: u32,
    /// Settings a benchmark varies away from the harness's (`bench --max-wait`,
    /// `--sync-interval`); none set in the harness's own runs.
    #[serde(default)]
    pub tuning: Tuning,
    /// The seed scenario's task workers instead of the request clients;
    /// the upstream then also grants `tpm` tokens per window.
    #[serde(default)]
    pub tasks: Option<TaskSpec>,
    /// Subnet index (10.77.K.0/24): distinct runs may overlap in time.
    pub subnet: u8,
    /// The harness binary (started as `node` and `mock` in the hosts).
    pub bin: PathBuf,
    /// Where the run's files go.
    pub dir: PathBuf,
}

/// Node settings a benchmark may vary (each `None`: the harness's choice).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tuning {
    /// Every tenant's `max_wait` (the harness's: 500 ms, 2 s with task workers
    /// or a concurrency limit).
    #[serde(default)]
    pub max_wait: Option<Duration>,
    /// `[cluster] sync_interval` (the product's default: 200 ms).
    #[serde(default)]
    pub sync_interval: Option<Duration>,
}

/// Buckets per window of the harness's runs (and of a saved run whose spec has no
/// such field). With a 5 s window a bucket is 500 ms: about the sync lag
/// (sync interval plus gossip), as a 1 s bucket of the default 60 s window is in
/// production, so the sync modes meet their lag as they would there. The cost:
/// a charge counts until its bucket's end leaves the window, up to 10% of W
/// more than an exact window (the default 60 buckets of a real window: 1.7%).
pub const STRESS_BUCKETS: u32 = 10;

fn stress_buckets() -> u32 {
    STRESS_BUCKETS
}

impl RunSpec {
    /// The spec a run saved in `dir` (to run the same seed again).
    pub fn load(dir: &Path) -> anyhow::Result<RunSpec> {
        let path = dir.join("spec.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (is it a run directory?)", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }
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
        // `direct`: the clients bypass the nodes, which are left idle.
        "local-full" | "direct" => ("local", "full"),
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
buckets = {buckets}

[cluster]
cluster_id = "jepsen"
node_id = "n{i}"
gossip_listen = "{ip}:{GOSSIP_PORT}"
rpc_listen = "{ip}:{RPC_PORT}"
secret = "jepsen-cluster-secret-0123"
seeds = [{seeds}]
mode = "{mode}"
local_share = "{share}"{sync_interval}

[[upstreams]]
id = "mock"
kind = "openai"
base_url = "http://{mock_ip}:{MOCK_PORT}/v1"{upstream_limit}

[[routes]]
models = ["*"]
upstreams = ["mock"]
{tenants}{lease}{redis}{estimation}"#,
        seeds = seeds.join(", "),
        sync_interval = (spec.tuning.sync_interval)
            .map_or(String::new(), |i| format!("\nsync_interval = \"{}ms\"", i.as_millis())),
        buckets = spec.buckets,
        upstream_limit = match (&spec.tasks, spec.tenants) {
            (Some(t), _) => format!("\nrpm = {}\ntpm = {}", spec.limit, t.tpm),
            (None, 0 | 1) => String::new(),
            (None, _) => format!("\nrpm = {}", spec.limit),
        },
        tenants = (0..spec.tenants)
            .map(|k| format!(
                "\n[[tenants]]\nid = \"t{k}\"\napi_key_hashes = [\"sha256:{}\"]\nrpm = {}\nmax_wait = \"{}\"\n{}",
                tollgate::config::hash_api_key(&workload::tenant_key(k)),
                tenant_limit(spec),
                // Task workers wait in the queue rather than retry (backpressure).
                // So do clients under a concurrency limit: in `gossip` a node with no
                // slot gets a freed one once its waiting shows in the demand its
                // peers see (2 x gossip + sync, then a round and the actor's 250 ms
                // re-check: ~0.85 s), and a 500 ms wait expires first about half the
                // time (a survivor may be refused three times in a row: 5.9 s).
                match spec.tuning.max_wait {
                    Some(wait) => format!("{}ms", wait.as_millis()),
                    None if spec.tasks.is_some() || spec.concurrency.is_some() => "2s".into(),
                    None => "500ms".into(),
                },
                spec.concurrency.map_or(String::new(), |c| format!("concurrency = {c}\n")),
            ))
            .collect::<String>(),
        lease = lease_toml(spec),
        redis = redis_ip.map_or(String::new(), |ip| format!(
            "\n[redis]\nurl = \"redis://{ip}:{REDIS_PORT}/\"\ntimeout = \"50ms\"\nslot_ttl = \"{}ms\"\n",
            REDIS_SLOT_TTL.as_millis()
        )),
        estimation = spec.tasks.as_ref().map_or(String::new(), |t| format!(
            "\n[estimation]\ncompletion = \"{}\"\n",
            t.estimate
        )),
    )
}

/// Each tenant's requests per window: L alone; 2L/T each when several share an
/// upstream limited to L (demand from the tenants together exceeds it).
pub fn tenant_limit(spec: &RunSpec) -> u64 {
    match spec.tenants {
        0 | 1 => spec.limit,
        t => (2 * spec.limit / t as u64).max(1),
    }
}

fn lease_toml(spec: &RunSpec) -> String {
    let mut out = String::new();
    if let Some(policy) = &spec.cut_off {
        out.push_str(&format!("cut_off = \"{policy}\"\n"));
    }
    if let Some(borrow) = spec.max_borrow {
        out.push_str(&format!("max_borrow = {borrow}\n"));
    }
    if spec.spillover {
        out.push_str("spillover = true\n");
    }
    if out.is_empty() {
        return out;
    }
    format!("\n[cluster.lease]\n{out}")
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

/// One nemesis event, for the report.
#[derive(Debug, Clone)]
struct Event {
    at_ms: u64,
    what: String,
    step: Step,
}

/// Runs `spec`: returns the checks and writes the run's files.
#[expect(
    clippy::too_many_lines,
    reason = "a run end to end: hosts, processes, nemeses, history, checks"
)]
pub async fn run(spec: RunSpec) -> anyhow::Result<Outcome> {
    // A fresh directory: an earlier run's Redis AOF or logs must not leak in.
    let _ = std::fs::remove_dir_all(&spec.dir);
    std::fs::create_dir_all(&spec.dir)?;
    std::fs::write(
        spec.dir.join("spec.json"),
        serde_json::to_string_pretty(&spec)?,
    )?;
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
    let (tpm, completion) = match &spec.tasks {
        Some(t) => (t.tpm, t.completion),
        None => (0, (3, 8)),
    };
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
            "--tpm",
            &tpm.to_string(),
            "--completion-min",
            &completion.0.to_string(),
            "--completion-max",
            &completion.1.to_string(),
            "--window-ms",
            &window_ms.to_string(),
            // Streams last 60-160 ms: a kill lands mid-stream now and then. With a
            // concurrency limit, 0.3-0.8 s: slots are held long enough to matter.
            "--inter-token-ms",
            match (&spec.tasks, spec.concurrency) {
                // Tasks: 200-600 tokens in 0.2-0.6 s, so 12 workers can ask for
                // more than the token budget (the limiter, not latency, binds).
                (Some(_), _) => "1",
                (None, Some(_)) => "100",
                (None, None) => "20",
            },
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
        let mut args = vec![
            "node".into(),
            "--config".into(),
            config.display().to_string(),
        ];
        if let Some(fault) = &spec.fault {
            args.extend(["--fault".into(), fault.clone()]);
        }
        if spec.mode == "lease" || spec.mode == "redis-lease" {
            let audit = spec.dir.join(format!("n{i}.lease.jsonl"));
            args.extend(["--lease-audit".into(), audit.display().to_string()]);
        }
        nodes.push(Proc::start(
            &format!("n{i}"),
            host,
            &spec.bin,
            args,
            spec.dir.join(format!("n{i}.log")),
        )?);
    }
    wait_ready(&ips, Duration::from_secs(30)).await?;
    let schedule = nemesis::schedule(&spec.nemesis, spec.nodes, spec.seed)?;
    let started = Instant::now();
    let t0_unix_ms = unix_ms();
    let end = started + spec.duration;
    let load = tokio::spawn(load(&spec, ips.clone(), &mock_host.ip, started, end));
    let monitor = tokio::spawn(monitor(ips.clone(), mock_host.ip.clone(), started, end));
    let mut events = Vec::new();
    let mut targets = Targets {
        net: &net,
        hosts: &node_hosts,
        nodes: &mut nodes,
        redis: redis.as_mut(),
        redis_host: uses_redis.then(|| &net.hosts[1]),
    };
    for step in &schedule {
        tokio::time::sleep_until(started + spec.duration.mul_f64(step.at)).await;
        let what = targets.apply(&step.action).await?;
        events.push(Event {
            at_ms: started.elapsed().as_millis() as u64,
            what,
            step: step.clone(),
        });
    }
    let (ops, task_log) = load.await.context("workload")?;
    let (samples, upstream) = monitor.await.context("monitor")?;
    let settlements = settlements(&ips, &spec.dir).await;
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
    if let Some(task_log) = &task_log {
        let mut text = String::new();
        for task in task_log {
            text.push_str(&serde_json::to_string(task)?);
            text.push('\n');
        }
        std::fs::write(spec.dir.join("tasks.jsonl"), text)?;
    }
    let mut text = String::new();
    for sample in &samples {
        text.push_str(&serde_json::to_string(sample)?);
        text.push('\n');
    }
    std::fs::write(spec.dir.join("views.jsonl"), text)?;
    let mut text = String::new();
    for sample in &upstream {
        text.push_str(&serde_json::to_string(sample)?);
        text.push('\n');
    }
    std::fs::write(spec.dir.join("upstream.jsonl"), text)?;
    let run_ms = spec.duration.as_millis() as u64;
    let faults = intervals(&events, spec.nodes, run_ms);
    let tenant_limits = vec![tenant_limit(&spec); spec.tenants.max(1)];
    let audit = read_lease_audit(&spec);
    let slots_back_within = slots_back_within(&spec)?;
    let case = checker::Case {
        mode: &spec.mode,
        nemeses: &spec.nemesis,
        nodes: spec.nodes as u64,
        limit: spec.limit,
        tenant_limits: &tenant_limits,
        window_ms,
        t0_unix_ms,
        faults: &faults,
        samples: &samples,
        // Two failure-detection times of these nodes' gossip settings.
        converge_within_ms: 2 * failure_detection_ms(&spec.dir.join("n0.toml"))?,
        settlements: &settlements,
        run_ms,
        audit: (spec.mode == "lease").then_some(&audit),
        clock_slack_ms: if spec.nemesis.iter().any(|n| n == "skew") {
            nemesis::SKEW_SECONDS.unsigned_abs() * 1_000
        } else {
            0
        },
        token_limit: spec.tasks.as_ref().map(|t| t.tpm),
        slots: spec.concurrency.map(|limit| checker::Slots {
            limit,
            back_within_ms: slots_back_within,
            upstream: &upstream,
        }),
    };
    let checks = checker::check(&case, &lines, &ops);
    // The clients' clock against the mock's, for later analysis (`refusals`).
    std::fs::write(
        spec.dir.join("clock.json"),
        serde_json::json!({ "t0_unix_ms": t0_unix_ms }).to_string(),
    )?;
    let report = spec.dir.join("report.md");
    std::fs::write(&report, render(&spec, &checks, &events, &ops))?;
    let rate = spec.limit as f64 / spec.window.as_secs_f64();
    let marks: Vec<crate::timeline::Mark> = (faults.iter())
        .map(|f| crate::timeline::Mark {
            from_ms: f.from_ms,
            to_ms: Some(f.to_ms),
            label: f.label.clone(),
        })
        .collect();
    let svg = crate::timeline::render(&ops, spec.nodes, run_ms, rate, &marks);
    std::fs::write(spec.dir.join("timeline.svg"), svg)?;
    Ok(Outcome { checks, report })
}

/// The clients: the seed scenario's task workers (which also return their
/// tasks), or the request clients.
fn load(
    spec: &RunSpec,
    ips: Vec<String>,
    mock_ip: &str,
    started: Instant,
    end: Instant,
) -> impl std::future::Future<Output = (Vec<Op>, Option<Vec<tasks::Task>>)> + use<> {
    let mock_url = format!("http://{mock_ip}:{MOCK_PORT}");
    let tasks = spec.tasks.clone();
    let shape = Shape {
        pattern: spec.pattern,
        tenants: spec.tenants.max(1),
        capacity_per_s: spec.limit as f64 / spec.window.as_secs_f64(),
        stream_share: 0.3,
        batch_share: 0.3,
        seed: spec.seed,
        loops: spec.loops,
    };
    async move {
        match tasks {
            Some(t) => {
                let (ops, done) = tasks::run(t, ips, mock_url, started, end).await;
                (ops, Some(done))
            }
            None => (workload::run(ips, shape, started, end).await, None),
        }
    }
}

/// Each node's permits once the workload is over, from its `/metrics` (`None`: it
/// does not answer). Settlement runs off the request path: waits up to 10 s for
/// each node's figures to agree before taking them as they are.
async fn settlements(ips: &[String], dir: &Path) -> Vec<Option<checker::Settlements>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap_or_default();
    let mut out = Vec::new();
    for (node, ip) in ips.iter().enumerate() {
        let url = format!("http://{ip}:{PROXY_PORT}/metrics");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut figures = None;
        loop {
            if let Ok(r) = client.get(&url).send().await
                && let Ok(text) = r.text().await
            {
                figures = Some(parse_settlements(&text));
                // Kept with the run (the benchmark reads sync bytes from it).
                let _ = std::fs::write(dir.join(format!("n{node}.metrics.txt")), &text);
            }
            let done = figures
                .is_none_or(|f: checker::Settlements| f.admitted == f.settled && f.in_flight == 0);
            if done || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        out.push(figures);
    }
    out
}

/// Every node's lease audit (`lease` and `redis-lease`): the grants of all, and each node's
/// spends. A line cut short by a kill -9 is skipped.
fn read_lease_audit(spec: &RunSpec) -> checker::LeaseAudit {
    let mut audit = checker::LeaseAudit::default();
    for node in 0..spec.nodes {
        let path = spec.dir.join(format!("n{node}.lease.jsonl"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<checker::LeaseEvent>(line) else {
                continue;
            };
            match event.ev.as_str() {
                "grant" => audit.grants.push(event),
                "spend" => audit.spends.push((node, event)),
                // `redis-lease` statements: for the analysis, not judged.
                _ => {}
            }
        }
    }
    audit
}

/// The figures of [`checker::Settlements`] in a Prometheus text exposition.
fn parse_settlements(text: &str) -> checker::Settlements {
    let mut f = checker::Settlements {
        admitted: 0,
        settled: 0,
        in_flight: 0,
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let value = value as u64;
        if name.starts_with("tollgate_decisions_total{") && name.contains(r#"outcome="admitted""#) {
            f.admitted += value;
        } else if name.starts_with("tollgate_settlements_total{") {
            f.settled += value;
        } else if name == "tollgate_in_flight_requests" {
            f.in_flight = value;
        }
    }
    f
}

/// Every node's `/admin/cluster` every 250 ms until `end`: how many members it
/// sees live (for the convergence check), `None` when it does not answer.
async fn monitor(
    ips: Vec<String>,
    mock_ip: String,
    started: Instant,
    end: Instant,
) -> (Vec<Sample>, Vec<UpstreamSample>) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap_or_default();
    let mut samples = Vec::new();
    let mut upstream = Vec::new();
    while Instant::now() < end {
        // The ground truth for slots: what the mock is serving right now.
        let url = format!("http://{mock_ip}:{MOCK_PORT}/stats");
        let in_flight = match client.get(&url).send().await {
            Ok(r) => (r.bytes().await.ok())
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|b| b["in_flight"].as_u64()),
            Err(_) => None,
        };
        upstream.push(UpstreamSample {
            at_ms: started.elapsed().as_millis() as u64,
            in_flight,
        });
        for (node, ip) in ips.iter().enumerate() {
            let url = format!("http://{ip}:{PROXY_PORT}/admin/cluster");
            let members = match client.get(&url).bearer_auth("jepsen-admin").send().await {
                Ok(r) if r.status().is_success() => (r.bytes().await.ok())
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|b| {
                        let members = b["cluster"]["members"].as_array()?.iter();
                        // `node/generation@address`: the node name.
                        (members.map(|m| {
                            m["id"]
                                .as_str()
                                .map(|id| id.split('/').next().unwrap_or(id).to_owned())
                        }))
                        .collect::<Option<Vec<String>>>()
                    }),
                _ => None,
            };
            samples.push(Sample {
                at_ms: started.elapsed().as_millis() as u64,
                node,
                members,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (samples, upstream)
}

/// How soon a killed node's slots must be usable again (the README's modes
/// table), plus what the harness adds: survivors' clients may be waiting out a
/// retry-after (<= 2 s) and sampling is every 250 ms.
fn slots_back_within(spec: &RunSpec) -> anyhow::Result<u64> {
    let config = tollgate::config::Config::load(&spec.dir.join("n0.toml"))?;
    let cluster = config.cluster.context("node configs have a [cluster]")?;
    let promise = match spec.mode.as_str() {
        // Declared dead: its in-flight count is dropped at once; the freed slots
        // are then shared by the survivors' demand, each reading its own as its
        // peers have it (2 x gossip interval + sync interval late,
        // docs/design/cluster.md, "Demand"). Both terms count: a CI run can take
        // 4,324 ms, of which detection itself is 0.5 s.
        "gossip" | "local-split" | "local-full" => {
            failure_detection_ms(&spec.dir.join("n0.toml"))?
                + (cluster.gossip_interval * 2 + cluster.sync_interval).as_millis() as u64
        }
        // Its credit (and the slots it held) lapse with the lease ttl.
        "lease" | "redis-lease" => cluster.lease.ttl.as_millis() as u64,
        // Its semaphore entries expire with the slot ttl.
        _ => REDIS_SLOT_TTL.as_millis() as u64,
    };
    Ok(promise + 2_500)
}

/// A node's failure-detection time, from the config the harness wrote for it.
fn failure_detection_ms(config: &Path) -> anyhow::Result<u64> {
    let config = tollgate::config::Config::load(config)?;
    let cluster = config.cluster.context("node configs have a [cluster]")?;
    Ok((cluster.gossip_interval)
        .mul_f64(2.0 * cluster.phi_threshold + 2.0)
        .as_millis() as u64)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The faults as intervals: each start paired with its nemesis's end (or the run's
/// end), with the groups that must keep serving through it.
fn intervals(events: &[Event], nodes: usize, run_ms: u64) -> Vec<Interval> {
    let everyone: Vec<usize> = (0..nodes).collect();
    let others = |n: usize| everyone.iter().copied().filter(|m| *m != n).collect();
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let sides = match &e.step.action {
            Action::Cut(_) => nemesis::sides(&e.step.action, nodes).unwrap_or_default(),
            // The island may rightly serve nothing: in `redis` a node that can
            // neither reach Redis nor hear its peers confirm they charge its loss
            // fails closed. The rest must keep serving.
            Action::Island(n) => vec![others(*n)],
            Action::Kill(n) | Action::Stop(n) => vec![others(*n)],
            Action::Skew(_) | Action::WallStep => vec![everyone.clone()],
            Action::Lossy(_) | Action::KillRedis | Action::Slow => vec![everyone.clone()],
            _ => continue,
        };
        let to_ms = (events[i + 1..].iter())
            .find(|later| later.step.nemesis == e.step.nemesis)
            .map_or(run_ms, |later| later.at_ms);
        let healed = matches!(e.step.action, Action::Cut(_) | Action::Island(_)) && to_ms < run_ms;
        let down = match e.step.action {
            Action::Kill(n) | Action::Stop(n) => Some(n),
            _ => None,
        };
        let slack_ms = match e.step.action {
            Action::Skew(_) => nemesis::SKEW_SECONDS.unsigned_abs() * 1_000,
            _ => 0,
        };
        out.push(Interval {
            from_ms: e.at_ms,
            to_ms,
            label: e.what.clone(),
            sides,
            healed,
            down,
            slack_ms,
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
        "# jepsen run: mode {}, nemesis {}, {} nodes, {:?}, seed {}\n\n\
         L = {} requests per {:?} at the upstream; {} tenant(s) of {} each{}{}\n\n\
         Replay: `cargo run -p tollgate-jepsen --release -- run --replay {}`\n\n",
        spec.mode,
        spec.nemesis.join(","),
        spec.nodes,
        spec.duration,
        spec.seed,
        spec.limit,
        spec.window,
        spec.tenants.max(1),
        tenant_limit(spec),
        spec.cut_off
            .as_ref()
            .map_or(String::new(), |p| format!("; cut_off {p}")),
        spec.fault
            .as_ref()
            .map_or(String::new(), |f| format!("; **fault injected: {f}**")),
        spec.dir.display(),
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
        "\n## Client outcomes per node\n\n| node | 200 | 429 | 503 | transport error | other | streamed | batch lane | tokens served |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for node in 0..spec.nodes {
        let mine: Vec<&Op> = ops.iter().filter(|o| o.node == node).collect();
        let count = |s: u16| mine.iter().filter(|o| o.status == Some(s)).count();
        let other = mine.len() - count(200) - count(429) - count(503) - count(0);
        let streamed = mine.iter().filter(|o| o.stream).count();
        let batch = mine.iter().filter(|o| o.batch).count();
        let tokens: u64 = mine.iter().filter_map(|o| o.tokens).sum();
        out.push_str(&format!(
            "| n{node} | {} | {} | {} | {} | {other} | {streamed} | {batch} | {tokens} |\n",
            count(200),
            count(429),
            count(503),
            count(0),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A saved spec without `buckets` (`--replay` of an old run).
    const OLD_SPEC: &str = r#"{"mode":"lease","nemesis":["none"],"nodes":3,
        "duration":{"secs":20,"nanos":0},"seed":7,"limit":40,
        "window":{"secs":5,"nanos":0},"tenants":1,"cut_off":null,"max_borrow":null,
        "fault":null,"subnet":100,"bin":"/x","dir":"/y"}"#;

    #[test]
    fn a_node_runs_the_specs_buckets_and_old_specs_the_harnesss() {
        let mut spec: RunSpec = serde_json::from_str(OLD_SPEC).expect("old spec");
        assert_eq!(spec.buckets, STRESS_BUCKETS);
        let ips = ["10.0.0.1".to_owned(), "10.0.0.2".to_owned()];
        let buckets_of = |spec: &RunSpec| {
            let text = node_toml(spec, 0, &ips, "10.0.0.9", None);
            let config = tollgate::config::Config::from_toml(&text, "n0.toml").expect("config");
            config.limits.buckets
        };
        assert_eq!(buckets_of(&spec), STRESS_BUCKETS);
        spec.buckets = 60;
        assert_eq!(buckets_of(&spec), 60);
    }

    #[test]
    fn settlements_are_read_from_the_metrics_text() {
        let text = r#"# HELP tollgate_decisions Limiter decisions by scope, outcome and reason.
# TYPE tollgate_decisions counter
tollgate_decisions_total{scope="tenant",outcome="admitted",reason=""} 12
tollgate_decisions_total{scope="upstream",outcome="admitted",reason=""} 11
tollgate_decisions_total{scope="tenant",outcome="refused",reason="requests"} 40
tollgate_settlements_total{scope="tenant",how="usage"} 10
tollgate_settlements_total{scope="tenant",how="cancel"} 2
tollgate_settlements_total{scope="upstream",how="usage"} 11
tollgate_in_flight_requests 0
"#;
        assert_eq!(
            parse_settlements(text),
            checker::Settlements {
                admitted: 23,
                settled: 23,
                in_flight: 0
            }
        );
    }
}
