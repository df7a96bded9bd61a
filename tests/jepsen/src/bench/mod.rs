//! `bench`: accuracy against throughput. Every cell of a matrix (mode x
//! nodes x workload pattern) is one harness run without faults (real processes
//! in network namespaces, the mock upstream as ground truth); this module turns
//! each run's files into the figures a user chooses a mode by, and the table.
//!
//! Figures per cell, all from the run's own records: overshoot (the most the
//! upstream was sent in any window, over L, minus 1), utilisation (what the
//! upstream accepted over L per window across the run), upstream 429s, gateway
//! 429s (what clients were refused), client latency of served requests
//! (p50/p99/p999, end to end through the gateway and the mock), requests and
//! tokens served per second, and gossip bytes published per second per node.

mod plot;
pub mod refusals;
mod seed;

pub use seed::{SeedCell, SeedFigures};

use crate::checker::{self, MockLine, Op};
use crate::run::{self, RunSpec};
use crate::workload::Pattern;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `max_borrow` of the `lease-borrow` cells.
pub const BORROW: f64 = 0.2;
/// Request loops in the whole cluster: with one per client, a client asking 4x
/// its share is bounded by its own latency once the gateway queues it, and a
/// single node's few loops all sit out the same retry-after at once.
pub const LOOPS: usize = 12;
/// The seed scenario's window: the provider's minute, compressed ten times so a
/// cell takes seconds (every limit is per window, so tasks per window read as
/// tasks per minute).
pub const SEED_WINDOW: Duration = Duration::from_secs(6);
/// The seed scenario's run: six windows.
pub const SEED_DURATION: Duration = Duration::from_secs(36);
/// Nodes in the seed scenario (its 12 workers spread over them).
pub const SEED_NODES: usize = 3;
/// The matrix and how each cell runs.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    /// Modes (as `run --mode`).
    pub modes: Vec<String>,
    /// Cluster sizes.
    pub nodes: Vec<usize>,
    /// Workload patterns.
    pub patterns: Vec<Pattern>,
    /// Request loops in the whole cluster (each client runs its share, at least
    /// one), so that demand rather than latency bounds what the clients send, and
    /// every cluster size meets the same client population.
    pub loops: usize,
    /// The seed scenario's cells (mode, estimate), run after the matrix; empty:
    /// not run.
    pub seed_cells: Vec<SeedCell>,
    /// The seed scenario's run length and window.
    pub seed_duration: Duration,
    /// The seed scenario's window (the "minute", compressed).
    pub seed_window: Duration,
    /// Each cell's length.
    pub duration: Duration,
    /// The window W.
    pub window: Duration,
    /// L per window.
    pub limit: u64,
    /// Buckets per window (`[limits] buckets`) of every cell.
    pub buckets: u32,
    /// Node settings varied away from the harness's (every cell, the seed
    /// scenario's included).
    pub tuning: run::Tuning,
    /// Seeds every cell's clients.
    pub seed: u64,
    /// The harness binary (`node`, `mock`).
    pub bin: PathBuf,
    /// Where the cells' run directories and the results go.
    pub dir: PathBuf,
    /// Keep the cells whose run directory already holds a report (to resume an
    /// interrupted matrix, or to tabulate it again) instead of running them.
    pub resume: bool,
    /// Subnet of the first cell; each cell takes the next (cycling over 100), so
    /// a cell never meets the previous one's links while the kernel removes them.
    pub subnet: u8,
}

impl BenchSpec {
    /// The small matrix for CI (`--quick`): three nodes, two patterns, every mode
    /// the README promises <= L or <= L x 1.2 for, and the `local full` baseline;
    /// then the seed scenario for the uncoordinated workers and lease mode with
    /// both estimates, two windows each.
    pub fn quick(bin: PathBuf, dir: PathBuf, subnet: u8) -> BenchSpec {
        BenchSpec {
            modes: [
                "local-full",
                "local-split",
                "gossip",
                "lease",
                "redis",
                "redis-lease",
            ]
            .map(String::from)
            .to_vec(),
            nodes: vec![3],
            // Uneven demand across nodes is proven for every mode by the
            // conformance suite; here one pattern is enough to run the pipeline.
            patterns: vec![Pattern::Uniform],
            loops: LOOPS,
            seed_cells: [
                ("direct", "max-tokens"),
                ("lease", "max-tokens"),
                ("lease", "adaptive"),
            ]
            .map(|(mode, estimate)| SeedCell {
                mode: mode.into(),
                estimate: estimate.into(),
            })
            .to_vec(),
            // Two windows: enough to judge, short for CI.
            seed_duration: Duration::from_secs(12),
            seed_window: SEED_WINDOW,
            duration: Duration::from_secs(10),
            window: Duration::from_secs(5),
            limit: 40,
            buckets: crate::run::STRESS_BUCKETS,
            tuning: run::Tuning::default(),
            seed: 7,
            bin,
            dir,
            subnet,
            resume: false,
        }
    }
}

/// One cell's figures.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Cell {
    /// Mode.
    pub mode: String,
    /// Nodes.
    pub nodes: usize,
    /// Workload pattern.
    pub pattern: String,
    /// Most sent to the upstream in one window, over L, minus 1.
    pub overshoot: f64,
    /// Accepted by the upstream over L per window, across the run.
    pub utilisation: f64,
    /// How full the upstream's window was kept after the first window
    /// ([`steady_fill`]); 0 in saved results without it.
    #[serde(default)]
    pub steady_fill: f64,
    /// Refusals by the upstream for its limits.
    pub upstream_429s: u64,
    /// Client requests refused by the gateway (429).
    pub gateway_429s: u64,
    /// Served requests' latency, ms (p50, p99, p999).
    pub latency_ms: [u64; 3],
    /// Requests served per second.
    pub requests_per_s: f64,
    /// Tokens served per second.
    pub tokens_per_s: f64,
    /// Gossip bytes published per second per node.
    pub sync_bytes_per_s: f64,
    /// Whether the accuracy checks passed: the mode kept its promise.
    pub promise_kept: bool,
}

/// Runs every cell (one at a time: each run's timing is the subject) and writes
/// `results.json` and `results.md` into the spec's directory.
pub async fn run(spec: &BenchSpec) -> anyhow::Result<Results> {
    std::fs::create_dir_all(&spec.dir)?;
    let mut cells = Vec::new();
    let mut index: u8 = 0;
    for pattern in &spec.patterns {
        for &nodes in &spec.nodes {
            for mode in &spec.modes {
                let name = format!("{mode}-{nodes}n-{}", pattern.name());
                let tenants = if *pattern == Pattern::HotTenant { 3 } else { 1 };
                // `lease-borrow`: lease mode with borrowing on; `lease-spill`:
                // with spillover on.
                let (run_mode, max_borrow, spillover) = match mode.as_str() {
                    "lease-borrow" => ("lease", Some(BORROW), false),
                    "lease-spill" => ("lease", None, true),
                    other => (other, None, false),
                };
                let cell_spec = RunSpec {
                    mode: run_mode.into(),
                    nemesis: vec!["none".into()],
                    nodes,
                    duration: spec.duration,
                    seed: spec.seed,
                    limit: spec.limit,
                    window: spec.window,
                    tenants,
                    cut_off: None,
                    max_borrow,
                    spillover,
                    fault: None,
                    concurrency: None,
                    pattern: *pattern,
                    loops: spec.loops.div_ceil(nodes * tenants).max(1),
                    buckets: spec.buckets,
                    tuning: spec.tuning,
                    tasks: None,
                    agents: false,
                    daily: false,
                    subnet: spec.subnet.wrapping_add(index % 100).max(1),
                    bin: spec.bin.clone(),
                    dir: spec.dir.join(&name),
                };
                index = index.wrapping_add(1);
                if !(spec.resume && cell_spec.dir.join("report.md").exists()) {
                    run::run(cell_spec.clone())
                        .await
                        .with_context(|| format!("bench cell {name}"))?;
                }
                let mut cell = figures(&cell_spec)?;
                cell.mode = mode.clone();
                println!(
                    "{name}: overshoot {:+.3}, utilisation {:.2}, {} upstream 429s",
                    cell.overshoot, cell.utilisation, cell.upstream_429s
                );
                cells.push(cell);
            }
        }
    }
    let seeds = seed::run(spec, index).await?;
    std::fs::write(
        spec.dir.join("results.json"),
        serde_json::to_string_pretty(&serde_json::json!({"matrix": cells, "seed": seeds}))?,
    )?;
    let mut md = table(spec, &cells);
    if !seeds.is_empty() {
        md.push_str(&seed::table(spec, &seeds));
    }
    std::fs::write(spec.dir.join("results.md"), md)?;
    plot::write_all(spec, &cells)?;
    Ok(Results {
        matrix: cells,
        seed: seeds,
    })
}

/// Every cell's figures.
#[derive(Debug, Clone)]
pub struct Results {
    /// The matrix, in order.
    pub matrix: Vec<Cell>,
    /// The seed scenario, in order.
    pub seed: Vec<SeedFigures>,
}

/// Whether the run's accuracy checks passed (its report): the upstream's and
/// every tenant's peak against the promise, and the upstream's 429s. Liveness and
/// utilisation are left out: with few clients or bursty ones, they measure the
/// workload rather than the mode.
pub(crate) fn promise_kept(report: &str) -> bool {
    let accuracy = [
        "| sent to the upstream per window",
        "| tenant t",
        "| upstream 429s",
    ];
    let rows: Vec<&str> = (report.lines())
        .filter(|l| accuracy.iter().any(|a| l.starts_with(a)))
        .collect();
    !rows.is_empty() && rows.iter().all(|l| l.contains("| pass |"))
}

/// A cell's figures from its run directory.
fn figures(spec: &RunSpec) -> anyhow::Result<Cell> {
    let report = std::fs::read_to_string(spec.dir.join("report.md"))?;
    let promise_kept = promise_kept(&report);
    let lines: Vec<MockLine> = read_jsonl(&spec.dir.join("mock.jsonl"))?;
    let ops: Vec<Op> = read_jsonl(&spec.dir.join("history.jsonl"))?;
    let window_ms = spec.window.as_millis() as u64;
    let run_ms = spec.duration.as_millis() as u64;
    let seconds = spec.duration.as_secs_f64();
    let peak = checker::window_peak(&lines, window_ms);
    let accepted = lines.iter().filter(|l| l.outcome == "admitted").count() as f64;
    let admitted_ms: Vec<u64> = (lines.iter())
        .filter(|l| l.outcome == "admitted")
        .map(|l| l.ts_ms)
        .collect();
    // The clients' start (runs without a clock.json: the first admission).
    let started_ms = std::fs::read_to_string(spec.dir.join("clock.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["t0_unix_ms"].as_u64())
        .or_else(|| admitted_ms.iter().min().copied())
        .unwrap_or(0);
    let served: Vec<&Op> = ops.iter().filter(|o| o.status == Some(200)).collect();
    let mut latencies: Vec<u64> = (served.iter())
        .filter_map(|o| o.complete_ms.map(|c| c.saturating_sub(o.invoke_ms)))
        .collect();
    latencies.sort_unstable();
    let mut sync_bytes = 0.0;
    for node in 0..spec.nodes {
        if let Ok(text) = std::fs::read_to_string(spec.dir.join(format!("n{node}.metrics.txt"))) {
            sync_bytes += metric(&text, "tollgate_sync_published_bytes_total");
        }
    }
    Ok(Cell {
        mode: spec.mode.clone(),
        nodes: spec.nodes,
        pattern: spec.pattern.name().into(),
        overshoot: peak.requests as f64 / spec.limit as f64 - 1.0,
        utilisation: accepted / (spec.limit as f64 * run_ms as f64 / window_ms as f64),
        steady_fill: steady_fill(admitted_ms, started_ms, run_ms, window_ms, spec.limit),
        upstream_429s: checker::upstream_429s(&lines),
        gateway_429s: ops.iter().filter(|o| o.status == Some(429)).count() as u64,
        latency_ms: [0.5, 0.99, 0.999].map(|q| quantile(&latencies, q)),
        requests_per_s: served.len() as f64 / seconds,
        tokens_per_s: served.iter().filter_map(|o| o.tokens).sum::<u64>() as f64 / seconds,
        sync_bytes_per_s: sync_bytes / spec.nodes.max(1) as f64 / seconds,
        promise_kept,
    })
}

/// How full the upstream's window was kept once the first window had passed:
/// the mean, over samples every W/100 from `started_ms + W` to the run's end, of
/// what was admitted in the W before each sample (the mock's exact window), over
/// L. Utilisation counts the first window too, which every mode fills at once
/// from empty, and admissions late in a window that would leave it only after the
/// run ends; this reads what a mode keeps up in steady state. 0 for a run shorter
/// than two windows.
pub fn steady_fill(
    mut admitted_ms: Vec<u64>,
    started_ms: u64,
    run_ms: u64,
    window_ms: u64,
    limit: u64,
) -> f64 {
    admitted_ms.sort_unstable();
    let step = (window_ms / 100).max(1);
    let (from, to) = (started_ms + window_ms, started_ms + run_ms);
    if to < from + window_ms || limit == 0 {
        return 0.0;
    }
    let in_window = |t: u64| {
        // Admitted in (t - W, t].
        admitted_ms.partition_point(|&a| a <= t)
            - admitted_ms.partition_point(|&a| a + window_ms <= t)
    };
    let samples: Vec<usize> = (from..=to).step_by(step as usize).map(in_window).collect();
    samples.iter().sum::<usize>() as f64 / samples.len() as f64 / limit as f64
}

/// The `q` quantile of sorted `values` (nearest rank; 0 when empty).
pub(crate) fn quantile(values: &[u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// The sum of a metric's samples (every label set) in a Prometheus text
/// exposition.
pub(crate) fn metric(text: &str, name: &str) -> f64 {
    (text.lines())
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

pub(crate) fn read_jsonl<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Vec<T>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// The results as markdown: one table per workload pattern.
pub fn table(spec: &BenchSpec, cells: &[Cell]) -> String {
    let mut out = format!(
        "L = {} requests per {} s window ({} buckets) at the upstream, {} s per cell, seed {}, max wait {} ms, sync interval {}, no faults.\n",
        spec.limit,
        spec.window.as_secs(),
        spec.buckets,
        spec.duration.as_secs(),
        spec.seed,
        spec.tuning.max_wait.map_or(500, |w| w.as_millis()),
        spec.tuning
            .sync_interval
            .map_or("200 ms (default)".into(), |i| format!(
                "{} ms",
                i.as_millis()
            )),
    );
    for pattern in &spec.patterns {
        out.push_str(&format!(
            "\n### Workload `{}`\n\n| mode | nodes | overshoot | utilisation | steady fill | upstream 429s | gateway 429s | latency p50 / p99 / p999 (ms) | req/s | tokens/s | gossip B/s per node | promise kept |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            pattern.name()
        ));
        for c in cells.iter().filter(|c| c.pattern == pattern.name()) {
            out.push_str(&format!(
                "| {} | {} | {:+.3} | {:.2} | {:.2} | {} | {} | {} / {} / {} | {:.1} | {:.0} | {:.0} | {} |\n",
                c.mode,
                c.nodes,
                c.overshoot,
                c.utilisation,
                c.steady_fill,
                c.upstream_429s,
                c.gateway_429s,
                c.latency_ms[0],
                c.latency_ms[1],
                c.latency_ms[2],
                c.requests_per_s,
                c.tokens_per_s,
                c.sync_bytes_per_s,
                if c.promise_kept { "yes" } else { "**no**" }
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_promise_is_the_accuracy_rows_only() {
        let report = "| check | result | detail |\n| sent to the upstream per window <= promise | pass | peak 40 |\n| upstream 429s | pass | 0 |\n| utilisation when healthy | **FAIL** | 0.42 |\n";
        assert!(promise_kept(report), "utilisation is the workload's");
        assert!(!promise_kept(
            &report.replace("| pass | peak", "| **FAIL** | peak")
        ));
        assert!(!promise_kept("no rows"));
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(quantile(&v, 0.5), 500);
        assert_eq!(quantile(&v, 0.99), 990);
        assert_eq!(quantile(&v, 0.999), 999);
        assert_eq!(quantile(&[7], 0.999), 7);
        assert_eq!(quantile(&[], 0.5), 0);
    }

    #[test]
    fn metrics_sum_every_label_set_of_one_name_only() {
        let text = "# TYPE tollgate_sync_published_bytes counter\ntollgate_sync_published_bytes_total 1200\ntollgate_sync_published_bytes_total_other 5\ntollgate_decisions_total{scope=\"tenant\"} 3\ntollgate_decisions_total{scope=\"upstream\"} 4\n";
        assert_eq!(metric(text, "tollgate_sync_published_bytes_total"), 1200.0);
        assert_eq!(metric(text, "tollgate_decisions_total"), 7.0);
    }

    #[test]
    fn steady_fill_leaves_out_the_first_window() {
        // W = 1 s, L = 4, a 3 s run from t = 10,000: the first window takes all 4
        // at once, then one request every 500 ms keeps 2 of 4 in the window.
        let mut admitted = vec![10_000, 10_000, 10_000, 10_000];
        admitted.extend((0..5).map(|k| 10_500 + 500 * k));
        let fill = steady_fill(admitted, 10_000, 3_000, 1_000, 4);
        assert!((fill - 0.5).abs() < 0.02, "{fill}");
        // Shorter than two windows: nothing to judge.
        assert_eq!(steady_fill(vec![10_000], 10_000, 1_500, 1_000, 4), 0.0);
    }

    #[test]
    fn the_table_has_a_row_per_cell_under_its_pattern() {
        let mut spec = BenchSpec::quick(PathBuf::from("x"), PathBuf::from("y"), 1);
        spec.patterns = vec![Pattern::Uniform, Pattern::SkewedNodes];
        let cell = Cell {
            mode: "lease".into(),
            nodes: 3,
            pattern: "uniform".into(),
            overshoot: 0.0,
            utilisation: 0.97,
            steady_fill: 0.91,
            upstream_429s: 0,
            gateway_429s: 12,
            latency_ms: [20, 150, 300],
            requests_per_s: 7.9,
            tokens_per_s: 95.0,
            sync_bytes_per_s: 410.0,
            promise_kept: true,
        };
        let md = table(&spec, &[cell]);
        assert!(md.contains("### Workload `uniform`"), "{md}");
        assert!(
            md.contains(
                "| lease | 3 | +0.000 | 0.97 | 0.91 | 0 | 12 | 20 / 150 / 300 | 7.9 | 95 | 410 | yes |"
            ),
            "{md}"
        );
        assert!(md.contains("### Workload `skewed-nodes`"), "{md}");
    }
}
