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
    Run {
        /// local-full, local-split, gossip, lease.
        #[arg(long, default_value = "lease")]
        mode: String,
        /// none, partition, kill, pause (comma-separated).
        #[arg(long, default_value = "partition")]
        nemesis: String,
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Workload length in seconds.
        #[arg(long, default_value_t = 20)]
        duration: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// L: requests per window for the tenant and the upstream.
        #[arg(long, default_value_t = 40)]
        limit: u64,
        /// Window in seconds.
        #[arg(long, default_value_t = 10)]
        window: u64,
    },
    /// (inside a host) A tollgate node from a config file.
    Node {
        #[arg(long)]
        config: PathBuf,
    },
    /// (inside a host) The mock upstream with a JSONL log.
    Mock {
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        rpm: u64,
        #[arg(long)]
        window_ms: u64,
        #[arg(long)]
        log: PathBuf,
    },
}

async fn terminated() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::Run {
            mode,
            nemesis,
            nodes,
            duration,
            seed,
            limit,
            window,
        } => {
            let dir = PathBuf::from("target/jepsen").join(format!("{mode}-{nemesis}-{seed}"));
            let spec = tollgate_jepsen::run::RunSpec {
                mode,
                nemesis: nemesis.split(',').map(str::to_owned).collect(),
                nodes,
                duration: Duration::from_secs(duration),
                seed,
                limit,
                window: Duration::from_secs(window),
                subnet: (std::process::id() % 200) as u8 + 20,
                bin: std::env::current_exe()?,
                dir,
            };
            let outcome = tollgate_jepsen::run::run(spec).await?;
            let report = std::fs::read_to_string(&outcome.report)?;
            println!("{report}");
            if !outcome.passed() {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Node { config } => {
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
        Cmd::Mock {
            listen,
            rpm,
            window_ms,
            log,
        } => {
            let config = tollgate::mock::MockConfig {
                rpm,
                window_ms,
                log_path: Some(log),
                ..tollgate::mock::MockConfig::default()
            };
            let listener = tokio::net::TcpListener::bind(listen).await?;
            tollgate::mock::serve(listener, config, terminated()).await?;
            Ok(())
        }
    }
}
