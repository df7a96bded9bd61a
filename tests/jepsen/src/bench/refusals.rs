//! `refusals`: what each gateway 429 of a run refused, judged against the mock
//! upstream's own log. A refusal is *stranded* when, at the moment the client got
//! it, the upstream's window and the tenant's window both still had room: a
//! global counter could have admitted it. Room is judged by two rules, because
//! they bracket what a gateway can know: the provider's exact sliding window
//! (a request counts for W from its arrival), and the gateway's bucket rule (a
//! charge counts until its bucket's end has left the window, the safe reading of
//! a provider that may count on arrival). The gap between modes in the second
//! column is what their partitioning and their sync lag cost
//! (docs/BENCHMARKS.md, "what the compressed window costs").

use crate::checker::{MockLine, Op};
use crate::run::{self, RunSpec};
use crate::workload::tenant_of_model;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::Path;

/// One tenant's refusals in a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantRefusals {
    /// Gateway 429s the tenant's clients got.
    pub refused: u64,
    /// Of those, with room at the upstream and for the tenant by the exact
    /// sliding window.
    pub room_exact: u64,
    /// Of those, with room by the gateway's bucket rule.
    pub room_buckets: u64,
}

/// What [`judge`] needs of a run.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// L at the upstream per window.
    pub upstream: u64,
    /// Each tenant's limit per window.
    pub tenant: u64,
    /// W, ms.
    pub window_ms: u64,
    /// Bucket width, ms.
    pub bucket_ms: u64,
}

/// Judges every 429 in `ops` (ms since `t0_unix_ms`) against the admissions in
/// `lines` (Unix ms), per tenant.
pub fn judge(
    ops: &[Op],
    lines: &[MockLine],
    t0_unix_ms: u64,
    limits: Limits,
) -> BTreeMap<usize, TenantRefusals> {
    // (ms since t0, tenant) of every admission, oldest first.
    let mut admitted: Vec<(i64, Option<usize>)> = (lines.iter())
        .filter(|l| l.outcome == "admitted")
        .map(|l| {
            let at = l.ts_ms as i64 - t0_unix_ms as i64;
            (at, l.model.as_deref().and_then(tenant_of_model))
        })
        .collect();
    admitted.sort_unstable();
    let (w, b) = (limits.window_ms as i64, limits.bucket_ms.max(1) as i64);
    let exact = |x: i64, t: i64| t - w < x && x <= t;
    // The gateway's buckets are aligned to Unix time, not to the run's start.
    let t0 = t0_unix_ms as i64;
    let bucket_end = |x: i64| ((x + t0).div_euclid(b) + 1) * b - t0;
    let buckets = |x: i64, t: i64| x <= t && bucket_end(x) + w > t;
    let mut out: BTreeMap<usize, TenantRefusals> = BTreeMap::new();
    for op in ops.iter().filter(|o| o.status == Some(429)) {
        let Some(t) = op.complete_ms.map(|c| c as i64) else {
            continue;
        };
        let has_room = |counts: &dyn Fn(i64, i64) -> bool| {
            // Only admissions within two windows before t can count.
            let from = admitted.partition_point(|(x, _)| *x < t - 2 * w - b);
            let (mut all, mut own) = (0, 0);
            for (x, tenant) in &admitted[from..] {
                if *x > t {
                    break;
                }
                if counts(*x, t) {
                    all += 1;
                    own += u64::from(*tenant == Some(op.tenant));
                }
            }
            all < limits.upstream && own < limits.tenant
        };
        let entry = out.entry(op.tenant).or_default();
        entry.refused += 1;
        entry.room_exact += u64::from(has_room(&exact));
        entry.room_buckets += u64::from(has_room(&buckets));
    }
    out
}

/// [`judge`] on a run directory (its `spec.json`, `history.jsonl`, `mock.jsonl`
/// and `clock.json`), as a markdown table.
pub fn report(dir: &Path) -> anyhow::Result<String> {
    let spec = RunSpec::load(dir)?;
    let clock: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("clock.json"))
            .with_context(|| format!("reading {}/clock.json", dir.display()))?,
    )?;
    let t0 = clock["t0_unix_ms"]
        .as_u64()
        .context("clock.json: no t0_unix_ms")?;
    let ops: Vec<Op> = super::read_jsonl(&dir.join("history.jsonl"))?;
    let lines: Vec<MockLine> = super::read_jsonl(&dir.join("mock.jsonl"))?;
    let window_ms = spec.window.as_millis() as u64;
    let limits = Limits {
        upstream: spec.limit,
        tenant: run::tenant_limit(&spec),
        window_ms,
        bucket_ms: window_ms / u64::from(spec.buckets.max(1)),
    };
    let admitted = lines.iter().filter(|l| l.outcome == "admitted").count();
    let mut md = format!(
        "{}: {} admitted by the upstream; gateway 429s with room at the upstream and for the tenant\n\n\
         | tenant | 429s | room (exact window) | room (bucket rule) |\n|---|---|---|---|\n",
        dir.display(),
        admitted
    );
    for (tenant, r) in judge(&ops, &lines, t0, limits) {
        md.push_str(&format!(
            "| t{tenant} | {} | {} | {} |\n",
            r.refused, r.room_exact, r.room_buckets
        ));
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(ts_ms: u64, tenant: usize) -> MockLine {
        MockLine {
            ts_ms,
            outcome: "admitted".into(),
            reason: None,
            prompt_tokens: 1,
            completion_tokens: 1,
            model: Some(crate::workload::tenant_model(tenant)),
        }
    }

    fn refused(tenant: usize, complete_ms: u64) -> Op {
        Op {
            tenant,
            complete_ms: Some(complete_ms),
            status: Some(429),
            ..Op::default()
        }
    }

    #[test]
    fn room_is_judged_by_both_rules_at_the_refusal() {
        // L = 2 per 1 s window, 250 ms buckets; the tenant's limit 2.
        let limits = Limits {
            upstream: 2,
            tenant: 2,
            window_ms: 1_000,
            bucket_ms: 250,
        };
        let t0 = 10_000;
        // Admitted at 100 and 600 (run time): the window is full until 1,100
        // (exact), and until 1,250 by the bucket rule (100's bucket ends at 250).
        let lines = [admitted(t0 + 100, 0), admitted(t0 + 600, 1)];
        let ops = [
            refused(0, 900),   // full by both rules
            refused(0, 1_150), // room exact, full by buckets
            refused(1, 1_300), // room by both
            Op {
                status: Some(200),
                ..refused(0, 1_400)
            },
        ];
        let got = judge(&ops, &lines, t0, limits);
        assert_eq!(
            got[&0],
            TenantRefusals {
                refused: 2,
                room_exact: 1,
                room_buckets: 0
            }
        );
        assert_eq!(
            got[&1],
            TenantRefusals {
                refused: 1,
                room_exact: 1,
                room_buckets: 1
            }
        );
    }

    #[test]
    fn buckets_are_aligned_to_unix_time_not_to_the_runs_start() {
        let limits = Limits {
            upstream: 1,
            tenant: 1,
            window_ms: 1_000,
            bucket_ms: 250,
        };
        // The run starts 150 ms before a Unix bucket boundary: an admission at
        // run time 100 (Unix 10,000) is in the Unix bucket [10,000, 10,250),
        // run time [100, 350), and counts until 1,350 by the bucket rule;
        // buckets counted from the run's start would have let it go at 1,250.
        let t0 = 9_900;
        let lines = [admitted(t0 + 100, 0)];
        let got = judge(&[refused(0, 1_300)], &lines, t0, limits);
        assert_eq!((got[&0].room_exact, got[&0].room_buckets), (1, 0));
    }

    #[test]
    fn a_tenant_at_its_own_limit_has_no_room_though_the_upstream_has() {
        let limits = Limits {
            upstream: 10,
            tenant: 1,
            window_ms: 1_000,
            bucket_ms: 1_000,
        };
        let lines = [admitted(500, 0)];
        let got = judge(&[refused(0, 700), refused(1, 700)], &lines, 0, limits);
        assert_eq!((got[&0].room_exact, got[&0].room_buckets), (0, 0));
        assert_eq!((got[&1].room_exact, got[&1].room_buckets), (1, 1));
    }
}
