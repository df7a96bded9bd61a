//! The run's files: the history and observations as JSON lines, the report
//! and the timeline.

use super::*;

pub(super) fn render(spec: &RunSpec, checks: &[Check], events: &[Event], ops: &[Op]) -> String {
    let mut out = format!(
        "# jepsen run: mode {}, nemesis {}, {} nodes, {:?}, seed {}\n\n\
         L = {} requests per {:?} at the upstream{}; {} tenant(s) of {} each{}{}\n\n\
         Replay: `cargo run -p tollgate-jepsen --release -- run --replay {}`\n\n",
        spec.mode,
        spec.nemesis.join(","),
        spec.nodes,
        spec.duration,
        spec.seed,
        spec.limit,
        spec.window,
        spec.day().map_or(String::new(), |day| format!(
            " and {} per {} ms day window",
            day.limit, day.window_ms
        )),
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

/// The history (`history.jsonl`), the task workers' tasks (`tasks.jsonl`),
/// the members' views (`views.jsonl`) and the upstream's slots
/// (`upstream.jsonl`), one JSON object per line.
pub(super) fn write_observations(
    dir: &Path,
    ops: &[Op],
    tasks: Option<&[tasks::Task]>,
    samples: &[Sample],
    upstream: &[UpstreamSample],
) -> anyhow::Result<()> {
    write_lines(&dir.join("history.jsonl"), ops)?;
    if let Some(tasks) = tasks {
        write_lines(&dir.join("tasks.jsonl"), tasks)?;
    }
    write_lines(&dir.join("views.jsonl"), samples)?;
    write_lines(&dir.join("upstream.jsonl"), upstream)
}

fn write_lines<T: serde::Serialize>(path: &Path, items: &[T]) -> anyhow::Result<()> {
    let mut text = String::new();
    for item in items {
        text.push_str(&serde_json::to_string(item)?);
        text.push('\n');
    }
    std::fs::write(path, text)?;
    Ok(())
}

/// The run's timeline (`timeline.svg`): admissions per node over time, with
/// the faults marked.
pub(super) fn write_timeline(
    spec: &RunSpec,
    ops: &[Op],
    faults: &[Interval],
) -> anyhow::Result<()> {
    let rate = spec.limit as f64 / spec.window.as_secs_f64();
    let marks: Vec<crate::timeline::Mark> = (faults.iter())
        .map(|f| crate::timeline::Mark {
            from_ms: f.from_ms,
            to_ms: Some(f.to_ms),
            label: f.label.clone(),
        })
        .collect();
    let run_ms = spec.duration.as_millis() as u64;
    let svg = crate::timeline::render(ops, spec.nodes, run_ms, rate, &marks);
    std::fs::write(spec.dir.join("timeline.svg"), svg)?;
    Ok(())
}
