//! The checker: pure functions over the mock upstream's log (the ground truth) and
//! the client history. Unit-tested on hand-made histories.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// What the checker needs of one mock log line.
#[derive(Debug, Clone, Deserialize)]
pub struct MockLine {
    /// Decision time (Unix ms).
    pub ts_ms: u64,
    /// `admitted` or `refused`.
    pub outcome: String,
    /// Why refused (`requests`, `tokens`, `concurrency`, `invalid`, ...).
    #[serde(default)]
    pub reason: Option<String>,
    /// Prompt tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    pub completion_tokens: u64,
}

/// One client operation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Op {
    /// Which node it was sent to (index).
    pub node: usize,
    /// When it was sent (ms since the run started).
    pub invoke_ms: u64,
    /// When it ended (ms since the run started); `None`: never ended.
    pub complete_ms: Option<u64>,
    /// HTTP status (0: transport error, a terminal outcome too).
    pub status: Option<u16>,
}

/// The most admitted in any sliding window of `window_ms` (a window ending at each
/// admission): requests and tokens, with when the worst window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WindowPeak {
    /// Most requests admitted in one window.
    pub requests: u64,
    /// When that window ended (Unix ms).
    pub requests_at_ms: u64,
    /// Most tokens admitted in one window.
    pub tokens: u64,
}

/// Whether the gateway let this request through to the upstream: admitted by the
/// mock, or refused by it for its limits (the gateway sent it: its own overshoot).
fn sent(l: &MockLine) -> bool {
    l.outcome == "admitted"
        || matches!(
            l.reason.as_deref(),
            Some("requests" | "tokens" | "concurrency")
        )
}

/// Peak requests and tokens the gateway sent to the upstream per sliding window
/// (the mock's own limit refusals count: they are the gateway's overshoot).
pub fn window_peak(lines: &[MockLine], window_ms: u64) -> WindowPeak {
    let mut admitted: Vec<(u64, u64)> = (lines.iter())
        .filter(|l| sent(l))
        .map(|l| (l.ts_ms, l.prompt_tokens + l.completion_tokens))
        .collect();
    admitted.sort_unstable();
    let mut window: VecDeque<(u64, u64)> = VecDeque::new();
    let (mut tokens, mut peak) = (
        0u64,
        WindowPeak {
            requests: 0,
            requests_at_ms: 0,
            tokens: 0,
        },
    );
    for (t, cost) in admitted {
        window.push_back((t, cost));
        tokens += cost;
        // Entries at or before t - W have left the window (t, the newest, counts).
        while let Some(&(t0, c0)) = window.front() {
            if t0 + window_ms <= t {
                window.pop_front();
                tokens -= c0;
            } else {
                break;
            }
        }
        if window.len() as u64 > peak.requests {
            peak.requests = window.len() as u64;
            peak.requests_at_ms = t;
        }
        peak.tokens = peak.tokens.max(tokens);
    }
    peak
}

/// Refusals by the upstream for its limits (429s): 0 wherever the promise is <= L.
pub fn upstream_429s(lines: &[MockLine]) -> u64 {
    (lines.iter())
        .filter(|l| l.outcome == "refused")
        .filter(|l| {
            matches!(
                l.reason.as_deref(),
                Some("requests" | "tokens" | "concurrency")
            )
        })
        .count() as u64
}

/// Operations without a terminal outcome (lost).
pub fn lost(ops: &[Op]) -> usize {
    ops.iter().filter(|o| o.status.is_none()).count()
}

/// One check's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Passed?
    pub ok: bool,
    /// The figures.
    pub detail: String,
}

/// What a run is held to: the mode, the faults it met, the cluster and the limit.
#[derive(Debug, Clone, Copy)]
pub struct Case<'a> {
    /// The sync mode.
    pub mode: &'a str,
    /// The nemeses of the run.
    pub nemeses: &'a [String],
    /// Nodes.
    pub nodes: u64,
    /// L per window.
    pub limit: u64,
    /// The window W.
    pub window_ms: u64,
}

/// A mode's promise for the cluster total per window, under the run's faults
/// (the README's modes table).
pub fn promised_max(case: &Case<'_>) -> u64 {
    let Case {
        mode,
        nemeses,
        nodes,
        limit,
        ..
    } = *case;
    // <= L x (1 + e): e measured; the harness holds it to 20%.
    let gossip = limit + limit / 5;
    match mode {
        // The baseline: every node enforces L alone.
        "local-full" => nodes * limit,
        "gossip" => gossip,
        // `redis` has no per-node reservations: when every node loses Redis they
        // fall back to gossip mode's rule (a node losing it alone stays <= L).
        "redis" if nemeses.iter().any(|n| n == "redis-kill") => gossip,
        _ => limit,
    }
}

/// Every check of a run.
pub fn check(case: &Case<'_>, lines: &[MockLine], ops: &[Op]) -> Vec<Check> {
    let Case {
        limit, window_ms, ..
    } = *case;
    let peak = window_peak(lines, window_ms);
    let max = promised_max(case);
    let strict = max == limit;
    let refusals = upstream_429s(lines);
    let lost = lost(ops);
    vec![
        Check {
            name: "sent to the upstream per window <= promise".into(),
            ok: peak.requests <= max,
            detail: format!(
                "peak {} requests in a {window_ms} ms window ending at {} (promise {max}, L = {limit}, overshoot {:.3})",
                peak.requests,
                peak.requests_at_ms,
                peak.requests as f64 / limit as f64 - 1.0
            ),
        },
        Check {
            name: "upstream 429s".into(),
            ok: !strict || refusals == 0,
            detail: format!("{refusals} (must be 0 where the promise is <= L)"),
        },
        Check {
            name: "nothing lost".into(),
            ok: lost == 0,
            detail: format!(
                "{lost} of {} operations without a terminal outcome",
                ops.len()
            ),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(ts_ms: u64) -> MockLine {
        MockLine {
            ts_ms,
            outcome: "admitted".into(),
            reason: None,
            prompt_tokens: 10,
            completion_tokens: 5,
        }
    }

    #[test]
    fn the_peak_is_over_any_window_not_fixed_ones() {
        // 3 at the end of one fixed window and 3 at the start of the next: 6 in
        // one sliding window of 1000 ms.
        let lines: Vec<MockLine> = [900, 950, 990, 1000, 1010, 1050].map(admitted).to_vec();
        let peak = window_peak(&lines, 1_000);
        assert_eq!(peak.requests, 6);
        assert_eq!(peak.tokens, 90);
        // An entry exactly W older has left the window.
        let lines: Vec<MockLine> = [0, 1_000].map(admitted).to_vec();
        assert_eq!(window_peak(&lines, 1_000).requests, 1);
    }

    #[test]
    fn checks_fail_on_overshoot_429s_and_lost_operations() {
        let lines: Vec<MockLine> = (0..12).map(|i| admitted(i * 10)).collect();
        let mut refused = admitted(500);
        refused.outcome = "refused".into();
        refused.reason = Some("requests".into());
        let ops = vec![
            Op {
                node: 0,
                invoke_ms: 0,
                complete_ms: Some(5),
                status: Some(200),
            },
            Op {
                node: 1,
                invoke_ms: 0,
                complete_ms: None,
                status: None,
            },
        ];
        let mut all = lines.clone();
        all.push(refused);
        let case = |mode| Case {
            mode,
            nemeses: &[],
            nodes: 3,
            limit: 10,
            window_ms: 1_000,
        };
        let checks = check(&case("lease"), &all, &ops);
        assert!(checks.iter().all(|c| !c.ok), "{checks:?}");
        // local full promises N x L: 12 <= 30, and upstream 429s are expected there.
        let checks = check(&case("local-full"), &all, &ops[..1]);
        assert!(checks.iter().all(|c| c.ok), "{checks:?}");
    }
}
