//! Checks of what faults leave behind: convergence after a heal, ghost
//! concurrency slots after a kill, and clients starved while a fault lasts.

use super::*;

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

/// One look at the mock upstream's `/stats`: the requests it was serving.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct UpstreamSample {
    /// When (ms since the run started).
    pub at_ms: u64,
    /// Requests in flight at the upstream; `None`: it did not answer.
    pub in_flight: Option<u64>,
}

/// A concurrency limit under test: after a kill -9, the survivors must get every
/// slot back (the upstream serving `limit` at once again) within `back_within_ms`.
#[derive(Debug, Clone, Copy)]
pub struct Slots<'a> {
    /// The tenant's concurrency limit.
    pub limit: u64,
    /// The mode's promise for a dead node's slots, plus the harness's slack.
    pub back_within_ms: u64,
    /// The upstream's in-flight count through the run.
    pub upstream: &'a [UpstreamSample],
}

/// Ghost slots: after each kill -9, how long until the upstream served the full
/// concurrency limit again (the killed node's streams died with it; slots the
/// cluster still counted for it would keep the survivors below the limit). A kill
/// the run ends before the bound has passed is judged only if the slots came back.
pub fn ghost_slots(faults: &[Interval], slots: &Slots<'_>, run_ms: u64) -> Check {
    let mut worst = 0;
    let mut failed = Vec::new();
    let kills = faults
        .iter()
        .filter(|f| f.down.is_some() && f.label.starts_with("kill -9"));
    let mut judged = 0;
    for kill in kills {
        // From the first sample after the kill that shows the killed node's
        // streams gone (below the limit): before it, the upstream may still be
        // serving them and a full count proves nothing.
        let after = (slots.upstream.iter()).filter(|s| s.at_ms >= kill.from_ms);
        let back = (after.skip_while(|s| s.in_flight.is_none_or(|n| n >= slots.limit)))
            .find(|s| s.in_flight.is_some_and(|n| n >= slots.limit))
            .map(|s| s.at_ms - kill.from_ms);
        match back {
            Some(ms) if ms <= slots.back_within_ms => {
                judged += 1;
                worst = worst.max(ms);
            }
            Some(ms) => {
                judged += 1;
                failed.push(format!("{}: {ms} ms", kill.label));
            }
            None if kill.from_ms + slots.back_within_ms < run_ms => {
                judged += 1;
                failed.push(format!("{}: never within the run", kill.label));
            }
            None => {}
        }
    }
    Check {
        name: "a killed node's slots come back".into(),
        ok: failed.is_empty(),
        detail: if failed.is_empty() {
            format!(
                "{judged} kills judged; the upstream served all {} slots again within {worst} ms (bound {} ms)",
                slots.limit, slots.back_within_ms
            )
        } else {
            format!(
                "not back within {} ms: {}",
                slots.back_within_ms,
                failed.join("; ")
            )
        },
    }
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
