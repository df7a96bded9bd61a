//! # `tollgate load`: an LLM-aware load generator
//!
//! Sends OpenAI- or Anthropic-shaped requests at a gateway (or any compatible API) in a
//! closed loop (`--concurrency N` workers back to back) or an open loop (`--rate R`
//! requests per second, slots that cannot be sent in time counted as `dropped`),
//! honours retry-after, and reports outcomes, latency percentiles, time to first byte,
//! and request and token throughput. User guide: `docs/load.md`.
//!
//! ## Layout
//!
//! - [`args`]: flags ([`LoadArgs`]) and their validation into a [`Plan`].
//! - [`request`]: pre-serialized request bodies and headers per API.
//! - `send`: one request, its answer read into a sample.
//! - [`usage`]: token usage from JSON bodies and SSE streams.
//! - [`retry`]: `retry-after-ms` / `retry-after` parsing, capped.
//! - `closed`, `open`: the two pacing loops.
//! - [`record`]: outcomes, histograms, live counters.
//! - `stop`: ending a run early (Ctrl-C) without losing its summary.
//! - `progress`: the progress bar.
//! - [`report`]: the [`Summary`], its table and JSON.
//!
//! ## Cost per request
//!
//! One pooled client (`TCP_NODELAY`, idle pool sized to the concurrency), a body that
//! is a shared [`bytes::Bytes`], a header map clone, one uncontended lock to record,
//! and a few relaxed atomics for the progress bar. Nothing is serialized per request.

pub mod args;
mod closed;
mod open;
mod progress;
pub mod record;
pub mod report;
pub mod request;
pub mod retry;
mod send;
mod stop;
pub mod usage;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;

pub use args::{Api, LoadArgs, Plan, Priority};
pub use record::Outcome;
pub use report::{Summary, render_table, write_json};

use crate::upstream_http::UpstreamHttp;
use args::Mode;
use progress::{Goal, Progress};
use record::{Live, Shards};
use request::Target;

/// Longest a connection attempt may take (shorter if `--timeout` is shorter).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What every sending task shares.
#[derive(Debug)]
struct Ctx {
    client: UpstreamHttp,
    target: Target,
    stream: bool,
    /// `--timeout`: from a send to its answer's last byte.
    timeout: Duration,
    honour_retry_after: bool,
    seed: u64,
    shards: Shards,
    live: Arc<Live>,
    stop: stop::Stop,
    /// When sending began; rates and the open-loop schedule count from here.
    start: Instant,
}

/// Runs the load described by `args`, drawing a progress bar on stderr (unless off),
/// and returns the summary. Printing the table ([`render_table`]) and writing JSON
/// ([`write_json`]) are left to the caller.
pub async fn run(args: LoadArgs) -> anyhow::Result<Summary> {
    run_until(args, std::future::pending()).await
}

/// Like [`run`], but when `shutdown` completes (e.g. `tokio::signal::ctrl_c()`), stops
/// sending, lets requests in flight finish (bounded by `--timeout`) and returns the
/// summary of what was sent, marked [`Summary::interrupted`].
pub async fn run_until(
    args: LoadArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<Summary> {
    let plan = args.validate()?;
    let target = Target::new(&args)?;
    let (users, pool) = match plan.mode {
        Mode::Closed { workers } => (workers, workers),
        Mode::Open { max_in_flight, .. } => (max_in_flight, max_in_flight),
    };
    let client = client(&plan, pool)?;
    tracing::debug!(url = %args.url, api = args.api.as_str(), ?plan, "load starting");
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        client,
        target,
        stream: args.stream,
        timeout: plan.timeout,
        honour_retry_after: plan.honour_retry_after,
        seed: args.seed,
        shards: Shards::new(users),
        live: Arc::new(Live::default()),
        stop: stop::Stop::default(),
        start,
    });
    let goal = match (plan.duration, plan.requests) {
        (Some(d), _) => Goal::Duration(d),
        (None, n) => Goal::Requests(n.unwrap_or(0)),
    };
    let progress = Progress::start(!args.no_progress, goal, ctx.live.clone(), start);
    let load = drive(ctx.clone(), &plan);
    tokio::pin!(load);
    tokio::select! {
        () = &mut load => {}
        () = shutdown => {
            tracing::info!("stopping: waiting for requests in flight");
            ctx.stop.stop();
            load.await;
        }
    }
    let elapsed = start.elapsed();
    progress.finish();
    let recorded = ctx.shards.merged();
    let mut summary = Summary::new(&args, &plan, &recorded, elapsed);
    summary.interrupted = ctx.stop.is_stopped();
    Ok(summary)
}

/// Runs the plan's pacing loop to its end.
async fn drive(ctx: Arc<Ctx>, plan: &Plan) {
    let deadline = plan.duration.map(|d| ctx.start + d);
    match plan.mode {
        Mode::Closed { workers } => {
            let budget = closed::Budget::new(deadline, plan.requests);
            closed::run(ctx, workers, budget).await;
        }
        Mode::Open {
            rate_per_s,
            max_in_flight,
        } => {
            let schedule = open::Schedule {
                rate_per_s,
                max_in_flight,
                deadline,
                slots: plan.requests,
            };
            open::run(ctx, schedule).await;
        }
    }
}

/// Measures the target itself, never an HTTP(S)_PROXY from the environment.
fn client(plan: &Plan, pool: usize) -> anyhow::Result<UpstreamHttp> {
    UpstreamHttp::without_proxies(pool, plan.timeout.min(CONNECT_TIMEOUT))
        .map_err(anyhow::Error::msg)
        .context("building the HTTP client")
}

impl Ctx {
    /// How this run's requests go out.
    fn via(&self) -> send::Via<'_> {
        send::Via {
            client: &self.client,
            endpoint: self.target.endpoint(),
            stream: self.stream,
            timeout: self.timeout,
        }
    }
}
