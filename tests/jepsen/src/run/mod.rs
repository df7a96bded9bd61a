//! One run: hosts, the mock upstream, N nodes, the workload, the nemesis schedule,
//! then the checks and the report in `target/jepsen/<run>/`.

use crate::checker::{self, Check, Interval, MockLine, Op, Sample, UpstreamSample};
use crate::hosts::{Host, Net};
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
    /// Half the clients' requests are agents' traffic: tool definitions and
    /// calls, an image, a list of prompts, a Responses call
    /// ([`crate::workload::agent_request`]).
    #[serde(default)]
    pub agents: bool,
    /// The upstream account also has a daily request quota, [`DAY_QUOTA_PER_L`]
    /// x L per day window of [`DAY_WINDOWS`] x W (`rpd`, counted by the mock
    /// over its own day window, for every model): judged per day window beside
    /// the per-window checks. The nodes hold it where L is held: on the one
    /// tenant, else on the upstream.
    #[serde(default)]
    pub daily: bool,
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

/// A daily run's day window, in windows W: long enough that the day's quota
/// binds before the window's (2 L per 4 W), short enough that a 20 s run sees
/// usage leave it.
pub const DAY_WINDOWS: u32 = 4;

/// A daily run's quota per day window, in L.
pub const DAY_QUOTA_PER_L: u64 = 2;

impl RunSpec {
    /// Whether half the clients' requests are agents' traffic (`--agents`, or
    /// the `agents` pattern): the nodes then also route `claude-*` to the
    /// mock's Anthropic account.
    pub fn sends_agents(&self) -> bool {
        self.agents || self.pattern == workload::Pattern::Agents
    }

    /// The daily quota and its window in ms, in a daily run.
    pub fn day(&self) -> Option<checker::Day> {
        self.daily.then(|| checker::Day {
            limit: DAY_QUOTA_PER_L * self.limit,
            window_ms: u64::from(DAY_WINDOWS) * self.window.as_millis() as u64,
        })
    }
}

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

/// One nemesis event, for the report.
#[derive(Debug, Clone)]
struct Event {
    at_ms: u64,
    what: String,
    step: Step,
}

/// Runs `spec`: returns the checks and writes the run's files.
pub async fn run(spec: RunSpec) -> anyhow::Result<Outcome> {
    if spec.daily && spec.sends_agents() && spec.tenants > 1 {
        // The mock counts its daily quota over both accounts; the nodes could
        // hold it only where one tenant carries it for both.
        bail!("--daily with agents' traffic takes one tenant");
    }
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
    let redis_host = uses_redis.then(|| &net.hosts[1]);
    let mut redis = redis_host.map(|h| start::redis(&spec, h)).transpose()?;
    let ips: Vec<String> = node_hosts.iter().map(|h| h.ip.clone()).collect();
    let mock_log = spec.dir.join("mock.jsonl");
    let mut mock = start::mock(&spec, &mock_host, &mock_log)?;
    let redis_ip = redis_host.map(|h| h.ip.as_str());
    let mut nodes = start::nodes(&spec, &node_hosts, &ips, &mock_host.ip, redis_ip)?;
    wait_ready(&ips, Duration::from_secs(30)).await?;
    let schedule = nemesis::schedule(&spec.nemesis, spec.nodes, spec.seed)?;
    let started = Instant::now();
    let t0_unix_ms = unix_ms();
    let end = started + spec.duration;
    let load = tokio::spawn(load(&spec, ips.clone(), &mock_host.ip, started, end));
    let monitor = tokio::spawn(monitor(ips.clone(), mock_host.ip.clone(), started, end));
    let targets = Targets {
        net: &net,
        hosts: &node_hosts,
        nodes: &mut nodes,
        redis: redis.as_mut(),
        redis_host,
        dir: &spec.dir,
        bin: &spec.bin,
        ports: crate::intruder::Ports {
            proxy: PROXY_PORT,
            gossip: GOSSIP_PORT,
            rpc: RPC_PORT,
        },
        intrusion: None,
        checks: Vec::new(),
    };
    let (events, nemesis_checks) = play(&spec, &schedule, targets, started).await?;
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
    report::write_observations(&spec.dir, &ops, task_log.as_deref(), &samples, &upstream)?;
    let run_ms = spec.duration.as_millis() as u64;
    let faults = intervals(&events, spec.nodes, run_ms);
    let observed = Observed {
        t0_unix_ms,
        faults: &faults,
        samples: &samples,
        upstream: &upstream,
        settlements: &settlements,
    };
    let mut checks = check(&spec, &observed, &lines, &ops)?;
    checks.extend(nemesis_checks);
    // The clients' clock against the mock's, for later analysis (`refusals`).
    std::fs::write(
        spec.dir.join("clock.json"),
        serde_json::json!({ "t0_unix_ms": t0_unix_ms }).to_string(),
    )?;
    let report = spec.dir.join("report.md");
    std::fs::write(&report, render(&spec, &checks, &events, &ops))?;
    report::write_timeline(&spec, &ops, &faults)?;
    Ok(Outcome { checks, report })
}

/// Applies each step of `schedule` at its time; returns what was done and the
/// checks the nemeses made (the intruders', also when the run ends first).
async fn play(
    spec: &RunSpec,
    schedule: &[Step],
    mut targets: Targets<'_>,
    started: Instant,
) -> anyhow::Result<(Vec<Event>, Vec<Check>)> {
    let mut events = Vec::new();
    for step in schedule {
        tokio::time::sleep_until(started + spec.duration.mul_f64(step.at)).await;
        let what = targets.apply(&step.action).await?;
        events.push(Event {
            at_ms: started.elapsed().as_millis() as u64,
            what,
            step: step.clone(),
        });
    }
    let mut checks = std::mem::take(&mut targets.checks);
    if let Some(intrusion) = targets.intrusion.take() {
        let ips: Vec<String> = targets.hosts.iter().map(|h| h.ip.clone()).collect();
        checks.push(intrusion.end(&ips, targets.ports).await);
    }
    Ok((events, checks))
}

/// What a run observed besides the clients' history and the mock's log.
struct Observed<'a> {
    t0_unix_ms: u64,
    faults: &'a [Interval],
    samples: &'a [Sample],
    upstream: &'a [UpstreamSample],
    settlements: &'a [Option<checker::Settlements>],
}

/// The run's checks against the mode's promise.
fn check(
    spec: &RunSpec,
    observed: &Observed<'_>,
    lines: &[MockLine],
    ops: &[Op],
) -> anyhow::Result<Vec<Check>> {
    let tenant_limits = vec![tenant_limit(spec); spec.tenants.max(1)];
    let audit = read_lease_audit(spec);
    let slots_back_within = slots_back_within(spec)?;
    let case = checker::Case {
        mode: &spec.mode,
        nemeses: &spec.nemesis,
        nodes: spec.nodes as u64,
        limit: spec.limit,
        tenant_limits: &tenant_limits,
        window_ms: spec.window.as_millis() as u64,
        t0_unix_ms: observed.t0_unix_ms,
        faults: observed.faults,
        samples: observed.samples,
        // Two failure-detection times of these nodes' gossip settings.
        converge_within_ms: 2 * failure_detection_ms(&spec.dir.join("n0.toml"))?,
        settlements: observed.settlements,
        run_ms: spec.duration.as_millis() as u64,
        audit: (spec.mode == "lease").then_some(&audit),
        clock_slack_ms: if spec.nemesis.iter().any(|n| n == "skew") {
            nemesis::SKEW_SECONDS.unsigned_abs() * 1_000
        } else {
            0
        },
        token_limit: spec.tasks.as_ref().map(|t| t.tpm),
        day: spec.day(),
        slots: spec.concurrency.map(|limit| checker::Slots {
            limit,
            back_within_ms: slots_back_within,
            upstream: observed.upstream,
        }),
    };
    Ok(checker::check(&case, lines, ops))
}

mod configs;
mod observe;
mod report;
mod start;
#[cfg(test)]
mod tests;

pub use configs::tenant_limit;
use configs::*;
use observe::*;
use report::render;
