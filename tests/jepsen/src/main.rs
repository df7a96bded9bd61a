//! `tollgate-jepsen run ...` runs the harness; `node` and `mock` are what it starts
//! inside the test hosts (the same gateway and mock code as `tollgate`).

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "tollgate-jepsen",
    about = "Partition-testing harness for tollgate"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One run: hosts, nodes, workload, nemeses, checks; exit 0 only if every check passes.
    Run(RunArgs),
    /// Accuracy against throughput: every mode x nodes x workload
    /// pattern, one run each without faults; results in `target/jepsen/bench/`.
    Bench(BenchArgs),
    /// What each gateway 429 of a run refused, against the mock's log: per tenant,
    /// how many came while the upstream's and the tenant's windows had room (by
    /// the exact window and by the gateway's bucket rule).
    Refusals {
        /// Run directories (e.g. `target/jepsen/bench/lease-3n-hot-tenant`).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
    /// (inside a host) A tollgate node from a config file.
    Node(NodeArgs),
    /// (inside a host) The mock upstream with a JSONL log.
    Mock(MockArgs),
    /// (inside a host) The `intruder` nemesis's interceptor: sends the gossip
    /// and RPCs the host receives again, as they were and altered.
    Intercept(tollgate_jepsen::intruder::InterceptArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// local-full, local-split, gossip, lease, redis, redis-lease.
    #[arg(long, default_value = "lease")]
    mode: String,
    /// Comma-separated, overlapping on one timeline: none, partition, isolate,
    /// bridge, kill, pause, restart, loss, slow, skew, wall-step, redis-kill.
    #[arg(long, default_value = "partition")]
    nemesis: String,
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Workload length (`20s`, `1m`).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// L: requests per window at the upstream (and for a single tenant).
    #[arg(long, default_value_t = 40)]
    limit: u64,
    /// The window (`10s`).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// Tenants (several: 2L/T each under an upstream limit of L).
    #[arg(long, default_value_t = 1)]
    tenants: usize,
    /// `[cluster.lease] cut_off`: share, fail-closed, fail-open.
    #[arg(long)]
    policy: Option<String>,
    /// `[cluster.lease] max_borrow` (0-1).
    #[arg(long)]
    max_borrow: Option<f64>,
    /// `[cluster.lease] spillover = true`.
    #[arg(long)]
    spillover: bool,
    /// Break every node's limiter on purpose (`skip-cluster-sync`): the checks
    /// must fail.
    #[arg(long)]
    fault: Option<String>,
    /// Each tenant's concurrency limit: streams last longer, and the checker
    /// judges how soon a killed node's slots come back.
    #[arg(long)]
    concurrency: Option<u64>,
    /// Half the requests agents' traffic: tool definitions and calls, an image,
    /// a list of prompts, a Responses call.
    #[arg(long)]
    agents: bool,
    /// The upstream account also has a daily request quota (2 L per 4 W),
    /// checked per day window.
    #[arg(long)]
    daily: bool,
    /// Run again what an earlier run did (its directory's spec.json: the same
    /// seed, schedule and settings); every other option is ignored.
    #[arg(long)]
    replay: Option<PathBuf>,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// The small matrix for CI: 3 nodes, `uniform` and `skewed-nodes`, 10 s
    /// cells (every other option is ignored).
    #[arg(long)]
    quick: bool,
    /// Modes, comma-separated (`lease-borrow`: lease with `max_borrow` 0.2;
    /// `lease-spill`: lease with spillover on).
    #[arg(
        long,
        default_value = "local-full,local-split,gossip,lease,lease-borrow,redis,redis-lease"
    )]
    modes: String,
    /// Cluster sizes, comma-separated.
    #[arg(long, default_value = "1,3,5")]
    nodes: String,
    /// Workloads, comma-separated: patterns (mixed, uniform, hot-tenant,
    /// skewed-nodes, bursty, agents: uniform with half the requests agents'
    /// calls) and `seed` (the seed scenario: every cell of it, after the
    /// matrix).
    #[arg(
        long,
        default_value = "uniform,hot-tenant,skewed-nodes,bursty,mixed,agents,seed"
    )]
    workloads: String,
    /// Request loops in the whole cluster, shared by the clients (at least one
    /// each): more, and demand rather than latency bounds what they send.
    #[arg(long, default_value_t = tollgate_jepsen::bench::LOOPS)]
    loops: usize,
    /// Each cell's length.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The window W.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// L per window.
    #[arg(long, default_value_t = 40)]
    limit: u64,
    /// Buckets per window: finer buckets hold each charge less past its
    /// window, and leave the sync modes less margin for their lag.
    #[arg(long, default_value_t = tollgate_jepsen::run::STRESS_BUCKETS)]
    buckets: u32,
    /// Every tenant's `max_wait`, the longest a request waits in a node's
    /// queue (the harness's: 500 ms).
    #[arg(long, value_parser = humantime::parse_duration)]
    max_wait: Option<Duration>,
    /// `[cluster] sync_interval` of every node (the product's default: 200 ms).
    #[arg(long, value_parser = humantime::parse_duration)]
    sync_interval: Option<Duration>,
    /// Seeds every cell's clients.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Keep cells already run (their directory has a report): resume an
    /// interrupted matrix, or tabulate it again.
    #[arg(long)]
    resume: bool,
}

#[derive(clap::Args)]
struct NodeArgs {
    #[arg(long)]
    config: PathBuf,
    /// A deliberate fault (test builds only): `skip-cluster-sync`.
    #[arg(long)]
    fault: Option<String>,
    /// Append the node's lease events (grants, spends) to this JSONL file.
    #[arg(long)]
    lease_audit: Option<PathBuf>,
}

#[derive(clap::Args)]
struct MockArgs {
    #[arg(long)]
    listen: std::net::SocketAddr,
    #[arg(long)]
    rpm: u64,
    /// Tokens per window (0: unlimited).
    #[arg(long, default_value_t = 0)]
    tpm: u64,
    /// Shortest completion drawn, in tokens.
    #[arg(long, default_value_t = 3)]
    completion_min: u64,
    /// Longest completion drawn, in tokens.
    #[arg(long, default_value_t = 8)]
    completion_max: u64,
    #[arg(long)]
    window_ms: u64,
    /// Requests per day window (0: unlimited).
    #[arg(long, default_value_t = 0)]
    rpd: u64,
    /// The day window (ms).
    #[arg(long, default_value_t = 86_400_000)]
    day_window_ms: u64,
    /// A model group's limits, as the mock's own flag takes them.
    #[arg(long = "model-limit")]
    model_limits: Vec<tollgate::mock::ModelLimits>,
    /// Delay per streamed token (ms).
    #[arg(long, default_value_t = 0)]
    inter_token_ms: u64,
    #[arg(long)]
    log: PathBuf,
}

async fn terminated() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Runs `work` unless Ctrl-C or SIGTERM comes first: then `work` is dropped, and
/// with it the run's processes (killed) and hosts (namespaces, links, bridge and
/// iptables rules removed) before the harness exits.
async fn until_interrupted<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::select! {
        result = work => result,
        () = terminated() => anyhow::bail!("interrupted: the run's processes and hosts were torn down"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Run(args) => run(args).await,
        Cmd::Bench(args) => bench(args).await,
        Cmd::Refusals { dirs } => {
            for dir in dirs {
                println!("{}", tollgate_jepsen::bench::refusals::report(&dir)?);
            }
            Ok(())
        }
        Cmd::Node(args) => node(args).await,
        Cmd::Mock(args) => mock(args).await,
        Cmd::Intercept(args) => tollgate_jepsen::intruder::intercept(args).await,
    }
}

/// One run; exits 1 unless every check passed.
async fn run(args: RunArgs) -> anyhow::Result<()> {
    let RunArgs {
        mode,
        nemesis,
        nodes,
        duration,
        seed,
        limit,
        window,
        tenants,
        policy,
        max_borrow,
        spillover,
        fault,
        concurrency,
        agents,
        daily,
        replay,
    } = args;
    let spec = match replay {
        Some(dir) => {
            let mut spec = tollgate_jepsen::run::RunSpec::load(&dir)?;
            spec.dir = dir.with_extension("replay");
            spec.bin = std::env::current_exe()?;
            spec
        }
        None => tollgate_jepsen::run::RunSpec {
            dir: PathBuf::from("target/jepsen").join(format!("{mode}-{nemesis}-{seed}")),
            mode,
            nemesis: nemesis.split(',').map(str::to_owned).collect(),
            nodes,
            duration,
            seed,
            limit,
            window,
            tenants,
            cut_off: policy,
            max_borrow,
            spillover,
            fault,
            concurrency,
            pattern: tollgate_jepsen::workload::Pattern::default(),
            loops: 1,
            buckets: tollgate_jepsen::run::STRESS_BUCKETS,
            tuning: Default::default(),
            tasks: None,
            agents,
            daily,
            // Away from the CI suite's subnets (31-79).
            subnet: (std::process::id() % 150) as u8 + 100,
            bin: std::env::current_exe()?,
        },
    };
    let outcome = until_interrupted(tollgate_jepsen::run::run(spec)).await?;
    let report = std::fs::read_to_string(&outcome.report)?;
    println!("{report}");
    if !outcome.passed() {
        std::process::exit(1);
    }
    Ok(())
}

/// The accuracy-against-throughput matrix, its table printed.
async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let BenchArgs {
        quick,
        modes,
        nodes,
        workloads,
        loops,
        duration,
        window,
        limit,
        buckets,
        max_wait,
        sync_interval,
        seed,
        resume,
    } = args;
    let bin = std::env::current_exe()?;
    // Away from the CI suite's subnets (31-79): cells take 100 in turn.
    let subnet = (std::process::id() % 50) as u8 + 100;
    let mut spec = if quick {
        tollgate_jepsen::bench::BenchSpec::quick(
            bin,
            PathBuf::from("target/jepsen/bench-quick"),
            subnet,
        )
    } else {
        let list = |s: &str| {
            s.split(',')
                .map(str::trim)
                .map(String::from)
                .collect::<Vec<_>>()
        };
        tollgate_jepsen::bench::BenchSpec {
            modes: list(&modes),
            nodes: (list(&nodes).iter())
                .map(|n| {
                    n.parse::<usize>()
                        .context("--nodes: numbers, comma-separated")
                })
                .collect::<anyhow::Result<_>>()?,
            patterns: (list(&workloads).iter())
                .filter(|w| *w != "seed")
                .map(|w| tollgate_jepsen::workload::Pattern::parse(w))
                .collect::<anyhow::Result<_>>()?,
            loops,
            seed_cells: if list(&workloads).iter().any(|w| w == "seed") {
                tollgate_jepsen::bench::SeedCell::all()
            } else {
                Vec::new()
            },
            seed_duration: tollgate_jepsen::bench::SEED_DURATION,
            seed_window: tollgate_jepsen::bench::SEED_WINDOW,
            duration,
            window,
            limit,
            buckets,
            tuning: tollgate_jepsen::run::Tuning {
                max_wait,
                sync_interval,
            },
            seed,
            bin,
            dir: PathBuf::from("target/jepsen/bench"),
            subnet,
            resume: false,
        }
    };
    spec.resume = resume;
    until_interrupted(tollgate_jepsen::bench::run(&spec)).await?;
    let table = std::fs::read_to_string(spec.dir.join("results.md"))?;
    println!("{table}");
    Ok(())
}

/// A node inside a host.
async fn node(args: NodeArgs) -> anyhow::Result<()> {
    let NodeArgs {
        config,
        fault,
        lease_audit,
    } = args;
    if let Some(path) = &lease_audit {
        tollgate::audit::install(path)
            .with_context(|| format!("opening the lease audit {}", path.display()))?;
    }
    match fault.as_deref() {
        None => {}
        Some("skip-cluster-sync") => tollgate::faults::skip_cluster_sync_on(),
        Some(other) => anyhow::bail!("unknown fault {other:?} (skip-cluster-sync)"),
    }
    // Node logs go to the run's directory (the harness redirects stdout).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .init();
    let config = tollgate::config::Config::load(&config)?;
    let listener = tokio::net::TcpListener::bind(config.server.listen)
        .await
        .context("binding the proxy")?;
    tollgate::server::run(config, listener, None, terminated(), |_| {}).await?;
    Ok(())
}

/// The mock upstream inside a host.
async fn mock(args: MockArgs) -> anyhow::Result<()> {
    let MockArgs {
        listen,
        rpm,
        tpm,
        completion_min,
        completion_max,
        window_ms,
        rpd,
        day_window_ms,
        model_limits,
        inter_token_ms,
        log,
    } = args;
    let config = tollgate::mock::MockConfig {
        rpm,
        tpm,
        window_ms,
        rpd,
        day_window_ms,
        model_limits,
        inter_token_ms,
        completion_min_tokens: completion_min,
        completion_max_tokens: completion_max,
        log_path: Some(log),
        ..tollgate::mock::MockConfig::default()
    };
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tollgate::mock::serve(listener, config, terminated()).await?;
    Ok(())
}
