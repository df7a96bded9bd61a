//! The seed scenario: an upstream granting 150,000 tokens and 500
//! requests per window, 12 workers running tasks (1,200-token prompts,
//! `max_tokens` 800, real completions of 200-600 tokens) until the run ends.
//! What a user sees: tasks completed per window and the upstream's 429s, for the
//! uncoordinated workers, per-node limits, and every mode with both estimates.

use super::{BenchSpec, SEED_NODES, promise_kept, quantile, read_jsonl};
use crate::checker::{self, MockLine, Op};
use crate::run::{self, RunSpec};
use crate::tasks::{self, Task, TaskSpec};
use anyhow::Context;

/// One cell of the seed scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedCell {
    /// `direct` (no gateway), or a mode as `run --mode`.
    pub mode: String,
    /// `max-tokens` or `adaptive`.
    pub estimate: String,
}

impl SeedCell {
    /// Every cell of the scenario: the uncoordinated workers, per-node limits
    /// (`local-full`: each node the provider's whole limit; `local-split`: a
    /// third each), and every synced mode with both estimates.
    pub fn all() -> Vec<SeedCell> {
        let cell = |mode: &str, estimate: &str| SeedCell {
            mode: mode.into(),
            estimate: estimate.into(),
        };
        let mut cells = vec![
            cell("direct", "max-tokens"),
            cell("local-full", "max-tokens"),
            cell("local-split", "max-tokens"),
        ];
        for mode in ["gossip", "lease", "redis", "redis-lease"] {
            cells.push(cell(mode, "max-tokens"));
            cells.push(cell(mode, "adaptive"));
        }
        cells
    }

    /// Its name in tables and directories.
    pub fn name(&self) -> String {
        match self.mode.as_str() {
            "direct" => "uncoordinated workers (no gateway)".into(),
            mode => format!("{mode}, {}", self.estimate),
        }
    }
}

/// One seed-scenario cell's figures.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SeedFigures {
    /// `direct` or the mode.
    pub mode: String,
    /// `max-tokens` or `adaptive`.
    pub estimate: String,
    /// Tasks completed per window (per minute at the provider's scale).
    pub tasks_per_window: f64,
    /// The same over the ideal when reserving `max_tokens` (tokens per window
    /// over prompt + max_tokens: 75).
    pub of_ideal: f64,
    /// Refusals by the upstream for its limits.
    pub upstream_429s: u64,
    /// Requests the gateway answered 429 (the workers retried them).
    pub gateway_429s: u64,
    /// Most tokens sent to the upstream in one window, over its limit, minus 1.
    pub token_overshoot: f64,
    /// Task latency, first attempt to success, ms (p50, p99).
    pub task_latency_ms: [u64; 2],
    /// Requests per completed task.
    pub attempts_per_task: f64,
    /// Whether the mode kept its promise (`None`: no gateway, nothing promised).
    pub promise_kept: Option<bool>,
}

/// Runs the spec's seed cells (subnets from `first_index` on); returns their
/// figures in order.
pub(super) async fn run(spec: &BenchSpec, first_index: u8) -> anyhow::Result<Vec<SeedFigures>> {
    let mut out = Vec::new();
    for (i, cell) in spec.seed_cells.iter().enumerate() {
        let dir_name = format!("seed-{}-{}", cell.mode, cell.estimate);
        let index = first_index.wrapping_add(i as u8);
        let run_spec = RunSpec {
            mode: cell.mode.clone(),
            nemesis: vec!["none".into()],
            nodes: SEED_NODES,
            duration: spec.seed_duration,
            seed: spec.seed,
            limit: 500,
            window: spec.seed_window,
            tenants: 1,
            cut_off: None,
            max_borrow: None,
            spillover: false,
            fault: None,
            concurrency: None,
            pattern: Default::default(),
            loops: 1,
            buckets: spec.buckets,
            tuning: spec.tuning,
            agents: false,
            daily: false,
            tasks: Some(TaskSpec::seed_scenario(
                &cell.estimate,
                cell.mode == "direct",
            )),
            subnet: spec.subnet.wrapping_add(index % 100).max(1),
            bin: spec.bin.clone(),
            dir: spec.dir.join(&dir_name),
        };
        if !(spec.resume && run_spec.dir.join("report.md").exists()) {
            run::run(run_spec.clone())
                .await
                .with_context(|| format!("seed scenario cell {dir_name}"))?;
        }
        let figures = figures(&run_spec)?;
        println!(
            "{}: {:.1} tasks per window ({:.2} of ideal), {} upstream 429s",
            cell.name(),
            figures.tasks_per_window,
            figures.of_ideal,
            figures.upstream_429s
        );
        out.push(figures);
    }
    Ok(out)
}

/// A seed cell's figures from its run directory.
fn figures(spec: &RunSpec) -> anyhow::Result<SeedFigures> {
    let scenario = spec.tasks.as_ref().context("a seed cell has tasks")?;
    let report = std::fs::read_to_string(spec.dir.join("report.md"))?;
    let lines: Vec<MockLine> = read_jsonl(&spec.dir.join("mock.jsonl"))?;
    let ops: Vec<Op> = read_jsonl(&spec.dir.join("history.jsonl"))?;
    let done: Vec<Task> = read_jsonl(&spec.dir.join("tasks.jsonl"))?;
    let window_ms = spec.window.as_millis() as u64;
    let run_ms = spec.duration.as_millis() as u64;
    let per_window = tasks::per_window(&done, run_ms, window_ms);
    let ideal = scenario.tpm as f64 / (scenario.prompt_tokens + scenario.max_tokens) as f64;
    let completed: Vec<&Task> = done.iter().filter(|t| t.done_ms.is_some()).collect();
    let mut latencies: Vec<u64> = (completed.iter())
        .filter_map(|t| t.done_ms.map(|d| d.saturating_sub(t.first_ms)))
        .collect();
    latencies.sort_unstable();
    let attempts: u64 = completed.iter().map(|t| u64::from(t.attempts)).sum();
    let peak = checker::window_peak(&lines, window_ms);
    Ok(SeedFigures {
        mode: spec.mode.clone(),
        estimate: scenario.estimate.clone(),
        tasks_per_window: per_window,
        of_ideal: per_window / ideal,
        upstream_429s: checker::upstream_429s(&lines),
        gateway_429s: if scenario.direct {
            0
        } else {
            ops.iter().filter(|o| o.status == Some(429)).count() as u64
        },
        token_overshoot: peak.tokens as f64 / scenario.tpm as f64 - 1.0,
        task_latency_ms: [0.5, 0.99].map(|q| quantile(&latencies, q)),
        attempts_per_task: attempts as f64 / completed.len().max(1) as f64,
        promise_kept: (!scenario.direct).then(|| promise_kept(&report) && tokens_kept(&report)),
    })
}

/// Whether the run's token check passed.
fn tokens_kept(report: &str) -> bool {
    (report.lines())
        .find(|l| l.starts_with("| tokens sent to the upstream per window"))
        .is_some_and(|l| l.contains("| pass |"))
}

/// The seed scenario's table (markdown).
pub(super) fn table(spec: &BenchSpec, cells: &[SeedFigures]) -> String {
    let scenario = TaskSpec::seed_scenario("max-tokens", false);
    let mut out = format!(
        "\n### Seed scenario\n\n{} workers over {SEED_NODES} nodes; the upstream grants {} tokens and 500 requests per {} s window (the provider's minute, compressed 10x: tasks per window read as tasks per minute); prompts of {} tokens, `max_tokens` {}, real completions {}-{} tokens; {} s per cell, seed {}. Ideal reserving `max_tokens`: {:.0} tasks per window.\n\n| workers | tasks / window | of ideal | upstream 429s | gateway 429s | token overshoot | task latency p50 / p99 (ms) | requests per task | promise kept |\n|---|---|---|---|---|---|---|---|---|\n",
        scenario.workers,
        scenario.tpm,
        spec.seed_window.as_secs(),
        scenario.prompt_tokens,
        scenario.max_tokens,
        scenario.completion.0,
        scenario.completion.1,
        spec.seed_duration.as_secs(),
        spec.seed,
        scenario.tpm as f64 / (scenario.prompt_tokens + scenario.max_tokens) as f64,
    );
    for c in cells {
        let cell = SeedCell {
            mode: c.mode.clone(),
            estimate: c.estimate.clone(),
        };
        out.push_str(&format!(
            "| {} | {:.1} | {:.2} | {} | {} | {:+.3} | {} / {} | {:.2} | {} |\n",
            cell.name(),
            c.tasks_per_window,
            c.of_ideal,
            c.upstream_429s,
            c.gateway_429s,
            c.token_overshoot,
            c.task_latency_ms[0],
            c.task_latency_ms[1],
            c.attempts_per_task,
            match c.promise_kept {
                None => "n/a",
                Some(true) => "yes",
                Some(false) => "**no**",
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_runs_with_both_estimates_after_the_baselines() {
        let cells = SeedCell::all();
        assert_eq!(cells.len(), 11);
        assert_eq!(cells[0].name(), "uncoordinated workers (no gateway)");
        assert!(cells.iter().any(|c| c.name() == "lease, adaptive"));
    }

    #[test]
    fn the_token_check_decides_with_the_request_checks() {
        let report = "| tokens sent to the upstream per window <= promise | pass | peak 1 |\n";
        assert!(tokens_kept(report));
        assert!(!tokens_kept(&report.replace("pass", "**FAIL**")));
        assert!(!tokens_kept("no token row"));
    }
}
