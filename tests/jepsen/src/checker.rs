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
    /// The model asked for (the workload names each tenant's model after it).
    #[serde(default)]
    pub model: Option<String>,
}

/// One client operation.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Op {
    /// Which node it was sent to (index).
    pub node: usize,
    /// Which tenant sent it (index).
    #[serde(default)]
    pub tenant: usize,
    /// Streamed?
    #[serde(default)]
    pub stream: bool,
    /// In the batch lane?
    #[serde(default)]
    pub batch: bool,
    /// When it was sent (ms since the run started).
    pub invoke_ms: u64,
    /// When it ended (ms since the run started); `None`: never ended.
    pub complete_ms: Option<u64>,
    /// HTTP status (0: transport error, a terminal outcome too).
    pub status: Option<u16>,
    /// Total tokens the response reported (its `usage`).
    #[serde(default)]
    pub tokens: Option<u64>,
    /// The `retry-after` it was given, in ms (429, 503).
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
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

/// A fault's interval (run-relative ms) and the groups of nodes that should each
/// keep serving through it (the sides of a cut; the survivors of a kill or pause).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    /// Start.
    pub from_ms: u64,
    /// End (the run's end for a kill that is never undone).
    pub to_ms: u64,
    /// What it was.
    pub label: String,
    /// Each group must serve at least one request during the interval.
    pub sides: Vec<Vec<usize>>,
    /// A cut that was healed at `to_ms` (the views must converge after it).
    pub healed: bool,
    /// The node a kill or pause took down for the interval (its requests then
    /// are not a side's starvation).
    pub down: Option<usize>,
    /// How much longer than one window a side may rightly go unserved while this
    /// fault lasts (and one window after): a clock running behind by this much,
    /// on a lease owner or a holder, keeps usage counting that much longer (the
    /// conservative direction).
    pub slack_ms: u64,
}

/// One look at a node's `/admin/cluster` during the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    /// When (ms since the run started).
    pub at_ms: u64,
    /// Which node.
    pub node: usize,
    /// The node names of the live members it sees (itself included); `None`: it
    /// did not answer.
    pub members: Option<Vec<String>>,
}

/// The longest time after a healed cut until every node up saw every node up
/// live again (a killed or paused node is neither waited for nor counted), or the
/// cut and node that never got there (before the run ended).
pub fn convergence(faults: &[Interval], samples: &[Sample], nodes: usize) -> Result<u64, String> {
    let mut worst = 0;
    for fault in faults.iter().filter(|f| f.healed) {
        let healed = fault.to_ms;
        let down: Vec<usize> = (faults.iter())
            .filter(|f| f.from_ms <= healed && healed <= f.to_ms)
            .filter_map(|f| f.down)
            .collect();
        let up: Vec<String> = (0..nodes)
            .filter(|n| !down.contains(n))
            .map(|n| format!("n{n}"))
            .collect();
        for node in (0..nodes).filter(|n| !down.contains(n)) {
            // Every node that is up, seen live (a restarted one may join too).
            let back = (samples.iter())
                .filter(|s| s.node == node && s.at_ms >= healed)
                .find(|s| (s.members.as_ref()).is_some_and(|m| up.iter().all(|u| m.contains(u))));
            match back {
                Some(s) => worst = worst.max(s.at_ms - healed),
                None => {
                    return Err(format!(
                        "n{node} never saw all {} members up after {} healed at {healed} ms",
                        up.len(),
                        fault.label
                    ));
                }
            }
        }
    }
    Ok(worst)
}

/// What a run is held to: the mode, the faults it met, the cluster and the limits.
#[derive(Debug, Clone, Copy)]
pub struct Case<'a> {
    /// The sync mode.
    pub mode: &'a str,
    /// The nemeses of the run.
    pub nemeses: &'a [String],
    /// Nodes.
    pub nodes: u64,
    /// L per window: the upstream's (requests).
    pub limit: u64,
    /// Each tenant's requests per window (one tenant: L).
    pub tenant_limits: &'a [u64],
    /// The window W.
    pub window_ms: u64,
    /// The Unix ms at the run's start (mock times minus this are run times).
    pub t0_unix_ms: u64,
    /// The faults, for liveness and for the context of a failure.
    pub faults: &'a [Interval],
    /// The nodes' views sampled through the run (convergence after a heal).
    pub samples: &'a [Sample],
    /// How soon after a heal every node must see every member again.
    pub converge_within_ms: u64,
}

/// A mode's promise for a total of `limit` per window, under the run's faults
/// (the README's modes table).
pub fn promised_max(case: &Case<'_>, limit: u64) -> u64 {
    let Case {
        mode,
        nemeses,
        nodes,
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
    let mut checks = Vec::new();
    let max = promised_max(case, limit);
    let peak = window_peak(lines, window_ms);
    checks.push(Check {
        name: "sent to the upstream per window <= promise".into(),
        ok: peak.requests <= max,
        detail: format!(
            "peak {} requests ({} tokens) in a {window_ms} ms window (promise {max}, L = {limit}, overshoot {:.3}){}",
            peak.requests,
            peak.tokens,
            peak.requests as f64 / limit as f64 - 1.0,
            context(case, ops, peak.requests_at_ms, peak.requests > max),
        ),
    });
    if case.tenant_limits.len() > 1 {
        for (tenant, &tenant_limit) in case.tenant_limits.iter().enumerate() {
            let mine: Vec<MockLine> = (lines.iter())
                .filter(|l| {
                    l.model
                        .as_deref()
                        .and_then(crate::workload::tenant_of_model)
                        == Some(tenant)
                })
                .cloned()
                .collect();
            let peak = window_peak(&mine, window_ms);
            let max = promised_max(case, tenant_limit);
            checks.push(Check {
                name: format!("tenant t{tenant} per window <= promise"),
                ok: peak.requests <= max,
                detail: format!(
                    "peak {} requests (promise {max}, its L = {tenant_limit}){}",
                    peak.requests,
                    context(case, ops, peak.requests_at_ms, peak.requests > max),
                ),
            });
        }
    }
    let strict = max == limit;
    let refusals = upstream_429s(lines);
    checks.push(Check {
        name: "upstream 429s".into(),
        ok: !strict || refusals == 0,
        detail: format!("{refusals} (must be 0 where the promise is <= L)"),
    });
    let lost = lost(ops);
    checks.push(Check {
        name: "nothing lost".into(),
        ok: lost == 0,
        detail: format!(
            "{lost} of {} operations without a terminal outcome",
            ops.len()
        ),
    });
    let healed = case.faults.iter().filter(|f| f.healed).count();
    let converged = convergence(case.faults, case.samples, case.nodes as usize);
    checks.push(Check {
        name: "views converge after each heal".into(),
        ok: converged
            .as_ref()
            .is_ok_and(|worst| *worst <= case.converge_within_ms),
        detail: match &converged {
            Ok(worst) => format!(
                "{healed} heals; every node up saw every node up again within {worst} ms (bound {} ms)",
                case.converge_within_ms
            ),
            Err(e) => e.clone(),
        },
    });
    let starved = starved(case.faults, ops, window_ms);
    checks.push(Check {
        name: "every side keeps serving through each fault".into(),
        ok: starved.is_empty(),
        detail: if starved.is_empty() {
            format!(
                "{} fault intervals, every side asking in a fault was served in every window of it",
                case.faults.len()
            )
        } else {
            format!("served nothing: {}", starved.join("; "))
        },
    });
    checks
}

/// Groups that went a whole window without service while asking, inside a
/// fault: a request of theirs refused at time t (at least one window into the
/// fault) with no success of theirs in the window before t. A side with a share
/// and demand is served at least once per window; only from one window in, since
/// what it spent before the fault still counts against its share until then.
pub fn starved(faults: &[Interval], ops: &[Op], window_ms: u64) -> Vec<String> {
    // A node down (killed, paused), and for one window after it is back (it
    // rejoins and is granted again), has no say in a side's liveness.
    let is_down = |o: &Op| {
        (faults.iter()).any(|f| {
            f.down == Some(o.node)
                && o.invoke_ms >= f.from_ms
                && o.invoke_ms < f.to_ms.saturating_add(window_ms)
        })
    };
    let ops: Vec<Op> = ops.iter().filter(|o| !is_down(o)).cloned().collect();
    let ops = &ops[..];
    // One window, plus the slack of any fault in force (or a window over) at `t`.
    let span_at = |t: u64| {
        let slack = (faults.iter())
            .filter(|f| f.from_ms <= t && t < f.to_ms.saturating_add(window_ms))
            .map(|f| f.slack_ms)
            .max()
            .unwrap_or(0);
        window_ms.saturating_add(slack)
    };
    let mut out = Vec::new();
    for fault in faults {
        let from = fault.from_ms.saturating_add(window_ms + fault.slack_ms);
        for side in &fault.sides {
            let mine: Vec<&Op> = ops.iter().filter(|o| side.contains(&o.node)).collect();
            let served_within = |t: u64| {
                (mine.iter()).any(|o| {
                    o.status == Some(200) && o.invoke_ms + span_at(t) >= t && o.invoke_ms <= t
                })
            };
            let unserved = (mine.iter())
                .filter(|o| o.invoke_ms >= from && o.invoke_ms < fault.to_ms)
                .find(|o| o.status != Some(200) && !served_within(o.invoke_ms));
            if let Some(o) = unserved {
                let names: Vec<String> = side.iter().map(|n| format!("n{n}")).collect();
                out.push(format!(
                    "{{{}}} during {} ({}-{} ms): refused at {} ms with nothing served in the window before",
                    names.join(", "),
                    fault.label,
                    fault.from_ms,
                    fault.to_ms,
                    o.invoke_ms
                ));
            }
        }
    }
    out
}

/// Where a failed peak happened: the window in run time, what each node served in
/// it, and the faults around it.
fn context(case: &Case<'_>, ops: &[Op], end_unix_ms: u64, failed: bool) -> String {
    if !failed {
        return String::new();
    }
    let end = end_unix_ms.saturating_sub(case.t0_unix_ms);
    let start = end.saturating_sub(case.window_ms);
    let mut per_node = vec![0u64; case.nodes as usize];
    for op in ops {
        if op.status == Some(200)
            && let Some(done) = op.complete_ms
            && done >= start
            && op.invoke_ms <= end
            && let Some(n) = per_node.get_mut(op.node)
        {
            *n += 1;
        }
    }
    let served: Vec<String> = (per_node.iter().enumerate())
        .map(|(n, c)| format!("n{n} {c}"))
        .collect();
    let near: Vec<String> = (case.faults.iter())
        .filter(|f| f.from_ms <= end + case.window_ms && f.to_ms + case.window_ms >= start)
        .map(|f| format!("{} ({}-{} ms)", f.label, f.from_ms, f.to_ms))
        .collect();
    format!(
        "; window {start}-{end} ms of the run; served in it: {}; faults around it: {}",
        served.join(", "),
        if near.is_empty() {
            "none".to_owned()
        } else {
            near.join(", ")
        }
    )
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
            model: None,
        }
    }

    fn op(node: usize, invoke_ms: u64, status: Option<u16>) -> Op {
        Op {
            node,
            invoke_ms,
            complete_ms: status.map(|_| invoke_ms + 5),
            status,
            ..Op::default()
        }
    }

    fn case<'a>(mode: &'a str, faults: &'a [Interval]) -> Case<'a> {
        Case {
            mode,
            nemeses: &[],
            nodes: 3,
            limit: 10,
            tenant_limits: &[10],
            window_ms: 1_000,
            t0_unix_ms: 0,
            faults,
            samples: &[],
            converge_within_ms: 1_000,
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
    fn checks_fail_on_overshoot_429s_lost_operations_and_starved_sides() {
        let lines: Vec<MockLine> = (0..12).map(|i| admitted(i * 10)).collect();
        let mut refused = admitted(500);
        refused.outcome = "refused".into();
        refused.reason = Some("requests".into());
        // n2 asked during the cut and got nothing; n0 was served.
        let ops = vec![op(0, 0, Some(200)), op(1, 0, None), op(2, 1_150, Some(429))];
        let cut = [Interval {
            from_ms: 100,
            to_ms: 2_000,
            label: "cut n0-n2".into(),
            sides: vec![vec![0, 1], vec![2]],
            healed: false,
            down: None,
            slack_ms: 0,
        }];
        let mut all = lines.clone();
        all.push(refused);
        let checks = check(&case("lease", &cut), &all, &ops);
        let failed: Vec<&str> = (checks.iter())
            .filter(|c| !c.ok)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            failed,
            [
                "sent to the upstream per window <= promise",
                "upstream 429s",
                "nothing lost",
                "every side keeps serving through each fault"
            ],
            "{checks:?}"
        );
        assert!(
            checks[0].detail.contains("served in it: n0 1, n1 0, n2 0"),
            "{checks:?}"
        );
        assert!(
            checks[0].detail.contains("cut n0-n2 (100-2000 ms)"),
            "{checks:?}"
        );
        assert!(
            checks[4]
                .detail
                .contains("{n2} during cut n0-n2 (100-2000 ms): refused at 1150"),
            "{checks:?}"
        );
        // local full promises N x L: 12 <= 30, and upstream 429s are expected there.
        let checks = check(&case("local-full", &[]), &all, &ops[..1]);
        assert!(checks.iter().all(|c| c.ok), "{checks:?}");
        // Less than a window into the fault, nothing is judged.
        assert!(starved(&cut, &[op(2, 900, Some(429))], 1_000).is_empty());
        assert_eq!(starved(&cut, &[op(2, 1_100, Some(429))], 1_000).len(), 1);
        assert!(starved(&cut, &[op(2, 1_100, Some(200))], 1_000).is_empty());
        // Served within the window before the refusal: alive.
        let spent_early = [op(2, 400, Some(200)), op(2, 1_300, Some(429))];
        assert!(starved(&cut, &spent_early, 1_000).is_empty());
        let long_ago = [op(2, 200, Some(200)), op(2, 1_300, Some(429))];
        assert_eq!(starved(&cut, &long_ago, 1_000).len(), 1);
        // A node that was down is not starved by the cut: it was not there.
        let killed = [
            cut[0].clone(),
            Interval {
                from_ms: 500,
                to_ms: 1_200,
                label: "kill -9 n2".into(),
                sides: vec![vec![0, 1]],
                healed: false,
                down: Some(2),
                slack_ms: 0,
            },
        ];
        assert!(starved(&killed, &long_ago, 1_000).is_empty());
        // A clock 500 ms behind keeps usage counting 500 ms longer: judged from a
        // window and the slack in, against a window and the slack before.
        let mut skewed = cut.clone();
        skewed[0].slack_ms = 500;
        assert!(starved(&skewed, &[op(2, 1_300, Some(429))], 1_000).is_empty());
        assert!(starved(&skewed, &long_ago, 1_000).is_empty());
        let longer_ago = [op(2, 200, Some(200)), op(2, 1_800, Some(429))];
        assert_eq!(starved(&skewed, &longer_ago, 1_000).len(), 1);
    }

    #[test]
    fn convergence_is_the_slowest_node_to_see_everyone_after_a_heal() {
        let cut = [Interval {
            from_ms: 0,
            to_ms: 1_000,
            label: "cut".into(),
            sides: vec![vec![0], vec![1]],
            healed: true,
            down: None,
            slack_ms: 0,
        }];
        let sample = |at_ms, node, members: Option<usize>| Sample {
            at_ms,
            node,
            members: members.map(|n| (0..n).map(|i| format!("n{i}")).collect()),
        };
        let samples = [
            sample(900, 0, Some(2)),
            sample(1_100, 0, Some(1)),
            sample(1_300, 0, Some(2)),
            sample(1_200, 1, None),
            sample(1_700, 1, Some(2)),
        ];
        assert_eq!(convergence(&cut, &samples, 2), Ok(700));
        let err = convergence(&cut, &samples[..3], 2).unwrap_err();
        assert!(err.contains("n1 never saw all 2 members up"), "{err}");
        // A node killed before the heal is not waited for.
        let killed = [
            cut[0].clone(),
            Interval {
                from_ms: 500,
                to_ms: 5_000,
                label: "kill -9 n1".into(),
                sides: vec![vec![0]],
                healed: false,
                down: Some(1),
                slack_ms: 0,
            },
        ];
        let alone = [sample(1_200, 0, Some(1))];
        assert_eq!(convergence(&killed, &alone, 2), Ok(200));
        let mut c = case("lease", &cut);
        c.nodes = 2;
        c.samples = &samples;
        let views = |c: &Case<'_>| {
            let checks = check(c, &[], &[]);
            checks
                .into_iter()
                .find(|c| c.name.starts_with("views"))
                .unwrap()
        };
        assert!(views(&c).ok, "700 ms within 1000 ms");
        c.converge_within_ms = 500;
        assert!(!views(&c).ok, "700 ms beyond 500 ms");
    }

    #[test]
    fn each_tenant_is_held_to_its_own_limit() {
        let mut lines: Vec<MockLine> = Vec::new();
        for i in 0..6 {
            let mut l = admitted(i * 10);
            l.model = Some(crate::workload::tenant_model(usize::from(i % 2 == 0)));
            lines.push(l);
        }
        let limits = [3, 2];
        let mut two = case("lease", &[]);
        two.tenant_limits = &limits;
        let checks = check(&two, &lines, &[]);
        let by_name = |n: &str| checks.iter().find(|c| c.name.starts_with(n)).unwrap().ok;
        assert!(by_name("sent to the upstream"), "6 <= 10: {checks:?}");
        assert!(by_name("tenant t0"), "3 <= 3: {checks:?}");
        assert!(!by_name("tenant t1"), "3 > 2: {checks:?}");
    }
}
