//! The `tollgate` command line. With no arguments it serves the embedded demo
//! config; see `tollgate --help`.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use tollgate::config::{Config, LogFormat, hash_api_key};
use tollgate::server::{self, Bound};

/// mimalloc instead of glibc's malloc: the proxy path allocates per request (hyper's
/// buffers, header maps, JSON), and under two busy workers glibc's arena locks
/// and chunk consolidation take ~17% of a lease node's CPU (perf, 64
/// connections); docs/design/architecture.md ("Why these crates") and
/// docs/BENCHMARKS.md ("Measured choices on the request path") have the
/// measurement.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A clustered gateway for LLM APIs: shared RPM/TPM/concurrency limits with written promises."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the proxy (with no --config: the embedded demo config).
    Serve {
        /// TOML config file (reference: docs/config.md).
        #[arg(long, short)]
        config: Option<PathBuf>,
    },
    /// Run the mock upstream: a strict OpenAI/Anthropic-compatible provider stand-in.
    MockUpstream(tollgate::mock::MockArgs),
    /// Validate a config file; prints the reason and exits 1 if it is refused.
    CheckConfig {
        /// TOML config file.
        file: PathBuf,
    },
    /// Print the SHA-256 hash of an API key for `api_key_hashes` (reads stdin if no key given).
    HashKey {
        /// The key; omit to read it from stdin (keeps it out of shell history).
        key: Option<String>,
    },
    /// Start a local cluster on 127.0.0.1: N nodes (proxy ports 8081..8080+N), one
    /// built-in mock upstream on 9090, the demo tenant sk-demo shared cluster-wide.
    Up {
        /// Number of nodes (1-99).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=99))]
        nodes: u16,
        /// Sync mode: lease (the cluster default, <= L), gossip, local, or the Redis
        /// strict modes redis and redis-lease (need --redis-url).
        #[arg(long, default_value = "lease", value_parser = ["lease", "gossip", "local", "redis", "redis-lease"])]
        mode: String,
        /// Redis for --mode redis|redis-lease, e.g. redis://127.0.0.1:6379/
        #[arg(long)]
        redis_url: Option<String>,
        /// For --mode local: full (each node enforces L) or split (L/N each).
        #[arg(long, default_value = "full", value_parser = ["full", "split"])]
        share: String,
    },
    /// Generate LLM-shaped load against a gateway or provider and summarise it.
    Load(tollgate::load::LoadArgs),
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}

fn demo_banner(config: &Config, bound: Bound) {
    let tenant = &config.tenants[0];
    let limit = |v: Option<u64>| v.map_or("unlimited".to_owned(), |v| v.to_string());
    let url = format!("http://{}/v1", bound.proxy);
    println!("tollgate demo node is up");
    println!("  proxy         {url}   (OpenAI- and Anthropic-compatible)");
    if let Some(mock) = bound.mock {
        println!("  mock upstream http://{mock}/v1   (stats: http://{mock}/stats)");
    }
    println!("  tenant        {} with API key sk-demo", tenant.id);
    println!(
        "  limits        {} requests/min, {} tokens/min, {} concurrent, queue wait up to {:?}",
        limit(tenant.quota.rpm),
        limit(tenant.quota.tpm),
        limit(tenant.quota.concurrency),
        tenant
            .max_wait
            .unwrap_or(tollgate::config::defaults::MAX_WAIT),
    );
    println!(
        "  admin token   admin-demo   (curl -H 'Authorization: Bearer admin-demo' http://{}/admin/keys/tenant:demo)",
        bound.proxy
    );
    println!("  metrics       http://{}/metrics", bound.proxy);
    println!();
    println!("Try it:");
    println!(
        "  curl {url}/chat/completions -H 'Authorization: Bearer sk-demo' -H 'Content-Type: application/json' \\"
    );
    println!(
        "    -d '{{\"model\":\"gpt-4o-mini\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}],\"max_tokens\":50}}'"
    );
    println!(
        "  tollgate load --url {url} --api-key sk-demo --concurrency 4 --duration 70s   # see queueing, then 429s"
    );
    println!("Ctrl-C stops it.");
}

/// Reads the node's config: the file given, or the embedded demo (`true`).
fn serve_config(config_path: Option<PathBuf>) -> anyhow::Result<(Config, bool)> {
    Ok(match &config_path {
        Some(path) => (Config::load(path)?, false),
        None => (Config::demo()?, true),
    })
}

async fn serve(config: Config, demo: bool) -> anyhow::Result<()> {
    init_logging(config.server.log_format);
    let (listener, mock) = server::bind(&config).await?;
    let banner_config = config.clone();
    server::run(config, listener, mock, shutdown_signal(), move |bound| {
        if demo {
            demo_banner(&banner_config, bound);
        } else {
            tracing::info!(proxy = %bound.proxy, mock = ?bound.mock, "tollgate serving");
        }
    })
    .await?;
    Ok(())
}

async fn up(nodes: u16, mode: &str, share: &str, redis_url: Option<String>) -> anyhow::Result<()> {
    use tollgate::config::{LocalShare, SyncMode};
    init_logging(LogFormat::Text);
    let mode = match mode {
        "local" => SyncMode::Local,
        "gossip" => SyncMode::Gossip,
        "redis" => SyncMode::Redis,
        "redis-lease" => SyncMode::RedisLease,
        _ => SyncMode::Lease,
    };
    if mode.uses_redis() && redis_url.is_none() {
        anyhow::bail!("--mode {mode:?} needs --redis-url (e.g. redis://127.0.0.1:6379/)");
    }
    let share = if share == "split" {
        LocalShare::Split
    } else {
        LocalShare::Full
    };
    println!("tollgate local cluster: {nodes} nodes, mode {mode:?}, share {share:?}");
    println!(
        "  mock upstream http://127.0.0.1:{}/v1   (its /stats shows what the cluster admitted in total)",
        tollgate::up::MOCK_PORT
    );
    tollgate::up::up(nodes, mode, share, redis_url, shutdown_signal(), move |i, bound| {
        println!(
            "  node-{i}        http://{}/v1   gossip 127.0.0.1:{}   rpc 127.0.0.1:{}",
            bound.proxy,
            tollgate::up::GOSSIP_BASE + i,
            tollgate::up::RPC_BASE + i
        );
        if i == nodes {
            println!("  tenant        sk-demo, limits shared cluster-wide; admin token admin-demo");
            println!("  cluster secret {} (a local demo; real clusters read it from the environment)", tollgate::up::DEMO_SECRET);
            println!("Try: curl -H 'Authorization: Bearer admin-demo' 'http://{}/admin/cluster?keys=true'", bound.proxy);
            println!("     tollgate load --url http://127.0.0.1:8081/v1 --api-key sk-demo --concurrency 4 --duration 30s");
            println!("Ctrl-C stops everything.");
        }
    })
    .await?;
    Ok(())
}

fn hash_key(key: Option<String>) -> anyhow::Result<()> {
    let key = match key {
        Some(key) => key,
        None => {
            if std::io::stdin().is_terminal() {
                eprintln!("API key (then Enter, Ctrl-D):");
            }
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading the key from stdin")?;
            text.trim().to_owned()
        }
    };
    anyhow::ensure!(!key.is_empty(), "the key is empty");
    println!("sha256:{}", hash_api_key(&key));
    Ok(())
}

/// The runtime of the commands that do I/O (`check-config` and `hash-key` need
/// none): tokio's multi-threaded one, whose worker count comes from
/// `TOKIO_WORKER_THREADS` or the cores unless a served config sets
/// `server.worker_threads` (the config file is read before the runtime exists, so
/// that it can size it).
fn runtime(worker_threads: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = worker_threads {
        builder.worker_threads(n);
    }
    builder
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Serve { config: None }) {
        Command::Serve { config } => {
            let (config, demo) = serve_config(config)?;
            runtime(config.server.worker_threads)?.block_on(serve(config, demo))
        }
        Command::MockUpstream(args) => runtime(None)?.block_on(mock_upstream(args)),
        Command::CheckConfig { file } => check_config(&file),
        Command::HashKey { key } => hash_key(key),
        Command::Up {
            nodes,
            mode,
            share,
            redis_url,
        } => runtime(None)?.block_on(up(nodes, &mode, &share, redis_url)),
        Command::Load(args) => runtime(None)?.block_on(load(args)),
    }
}

async fn mock_upstream(args: tollgate::mock::MockArgs) -> anyhow::Result<()> {
    init_logging(LogFormat::Text);
    let listen = args.listen;
    let config = args.into_config().context("mock-upstream options")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    println!(
        "mock upstream on http://{}/v1 (stats at /stats)",
        listener.local_addr()?
    );
    tollgate::mock::serve(listener, config, shutdown_signal()).await?;
    Ok(())
}

fn check_config(file: &std::path::Path) -> anyhow::Result<()> {
    match Config::load(file) {
        Ok(config) => {
            println!(
                "{}: ok ({} tenants, {} upstreams, {} routes)",
                file.display(),
                config.tenants.len(),
                config.upstreams.len(),
                config.routes.len()
            );
            Ok(())
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}

async fn load(args: tollgate::load::LoadArgs) -> anyhow::Result<()> {
    let json = args.json.clone();
    // Ctrl-C stops sending and still prints what was measured.
    let summary = tollgate::load::run_until(args, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    println!("{}", tollgate::load::render_table(&summary));
    if let Some(path) = json {
        tollgate::load::write_json(&summary, &path)?;
    }
    Ok(())
}
