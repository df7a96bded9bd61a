//! Each limit key's demand history on one node, for the shares a cut freezes.
//!
//! Per key: this node's own demand over the last few detection times (read
//! *lagged*, as every peer surely has it), the key's demand vector (every member's
//! figure) over the same time, and the vector as last seen live. When a member
//! becomes unreachable, every key's vector is frozen as it stood at the cut: both
//! sides of a cut freeze (nearly) the same figures, so the shares they charge each
//! other sum to L without talking (docs/design/cluster.md, "Unreachable members
//! and partitions").
//!
//! **Quiet keys cost nothing.** A key whose demand is 0 everywhere and whose records
//! say nothing a look-back could still read keeps no entry here: its lagged own
//! demand is 0 and its vector every member at 0 (`frozen_quiet` at a cut), exactly
//! what the records would say. Records start again from "0 before" when demand
//! returns. This is what lets a configured but idle tenant cost no per-round memory
//! (docs/design/scale.md); the property test below checks every lagged figure and
//! every frozen vector equals what a history that never forgets gives.

use std::collections::{BTreeSet, HashMap, VecDeque};
use tollgate_cluster::maps::shrink_if_sparse;

/// One key's demand vectors by time (ms), oldest first.
type VectorHistory = VecDeque<(u64, Vec<(String, u64)>)>;

/// Most demand vectors kept per key (a few detection times of changes).
const MAX_VECTORS: usize = 64;

/// Most freezes kept before the latest one during one cut (one per member that
/// became unreachable while others already were; beyond it a flapping member's
/// middle freezes are dropped, the first kept).
const MAX_EARLIER_FREEZES: usize = 16;

/// One freeze of every key's vector during a cut.
#[derive(Debug)]
struct Freeze {
    by_key: HashMap<String, Vec<(String, u64)>>,
    quiet: Vec<(String, u64)>,
}

/// The demand records of every key on this node.
#[derive(Debug)]
pub(crate) struct DemandHistory {
    /// Own demand per key, recorded on change.
    own: HashMap<String, VecDeque<(u64, u64)>>,
    /// Each key's demand vector (own figure lagged), recorded on change.
    vectors: HashMap<String, VectorHistory>,
    /// Each key's demand per member as last seen live (members live or awaiting
    /// GC only).
    last_seen: HashMap<String, HashMap<String, u64>>,
    /// Members live or awaiting GC as of this round: what every vector lists.
    members_seen: BTreeSet<String>,
    /// Each key's vector frozen at the cut, while anyone is unreachable.
    frozen: HashMap<String, Vec<(String, u64)>>,
    /// A quiet key's frozen vector: `members_seen` at the cut, each at 0.
    frozen_quiet: Vec<(String, u64)>,
    /// The freezes before the latest one while the cut goes on (a second member
    /// became unreachable before the first came back): each unreachable member
    /// is charged the most any of them gives it, since the far side may hold
    /// any of them (`frozen_all`). The first is always kept.
    earlier: Vec<Freeze>,
    /// The members live or awaiting GC at the cut's first freeze: what each
    /// side's part of L is counted over (`frozen_members`).
    first_members: Vec<String>,
    /// How far back records are kept: three look-backs (a detection time plus
    /// two gossip intervals each).
    keep_back_ms: u64,
    /// Whether quiet keys are forgotten (always, but in the test's reference).
    forget_quiet: bool,
}

impl DemandHistory {
    /// Records kept `3 x look_back_ms`.
    pub(crate) fn new(look_back_ms: u64) -> Self {
        Self {
            own: HashMap::new(),
            vectors: HashMap::new(),
            last_seen: HashMap::new(),
            members_seen: BTreeSet::new(),
            frozen: HashMap::new(),
            frozen_quiet: Vec::new(),
            earlier: Vec::new(),
            first_members: Vec::new(),
            keep_back_ms: look_back_ms.saturating_mul(3),
            forget_quiet: true,
        }
    }

    /// Keys with records (the largest of own, vector and last-seen records; every
    /// key that is not quiet has all three).
    pub(crate) fn len(&self) -> usize {
        (self.own.len())
            .max(self.vectors.len())
            .max(self.last_seen.len())
    }

    /// Once per round, before the keys: the members live (`live`, this node
    /// included) or awaiting GC (`dead`).
    pub(crate) fn set_members(&mut self, live: &[String], dead: &[String]) {
        (self.members_seen).retain(|n| live.contains(n) || dead.contains(n));
        self.members_seen.extend(live.iter().cloned());
    }

    /// One key's round. `demands`: each live member's published demand (this
    /// node's entry as peers have it, or none); on return this node's entry is its
    /// own demand as it stood at `horizon_ms`, the figure every share is computed
    /// with. `dead`: members awaiting GC (their last figures are kept).
    pub(crate) fn observe(
        &mut self,
        key: &str,
        own_demand: u64,
        demands: &mut Vec<(String, u64)>,
        self_id: &str,
        dead: &[String],
        (horizon_ms, now_ms): (u64, u64),
    ) {
        let keep_ms = now_ms.saturating_sub(self.keep_back_ms);
        let quiet = own_demand == 0
            && demands.iter().all(|(_, d)| *d == 0)
            && self.forget_if_quiet(key, keep_ms);
        let lagged = if quiet {
            0
        } else {
            let history = slot(&mut self.own, key);
            if history.is_empty() {
                // New, or quiet until now: it was 0 before.
                history.push_back((0, 0));
            }
            record_demand(history, now_ms, own_demand, keep_ms);
            demand_at(history, horizon_ms, own_demand)
        };
        match demands.iter_mut().find(|(node, _)| node == self_id) {
            Some(entry) => entry.1 = lagged,
            None => demands.push((self_id.to_owned(), lagged)),
        }
        if quiet {
            return;
        }
        self.record_vector(key, demands, now_ms, keep_ms);
        let seen = slot(&mut self.last_seen, key);
        if seen.is_empty() {
            // New, or quiet until now: every member live or awaiting GC was at 0,
            // the dead included (the frozen vector must still charge them).
            seen.extend(self.members_seen.iter().map(|n| (n.clone(), 0)));
        }
        seen.extend(demands.iter().cloned());
        // Forget members that are neither live nor awaiting GC (bounded memory,
        // and frozen shares are over the members that can still spend).
        seen.retain(|node, _| demands.iter().any(|(n, _)| n == node) || dead.contains(node));
    }

    /// Freezes every key's vector as it stood at `before_cut_ms` (the figures as
    /// last seen live where no record is that old).
    pub(crate) fn freeze(&mut self, before_cut_ms: u64) {
        if self.frozen_quiet.is_empty() {
            self.first_members = self.members_seen.iter().cloned().collect();
        } else {
            if self.earlier.len() >= MAX_EARLIER_FREEZES {
                // Flapping members: the first freeze and the latest ones are kept.
                self.earlier.remove(1);
            }
            self.earlier.push(Freeze {
                by_key: std::mem::take(&mut self.frozen),
                quiet: std::mem::take(&mut self.frozen_quiet),
            });
        }
        self.frozen_quiet = (self.members_seen.iter()).map(|n| (n.clone(), 0)).collect();
        // Every member's figure as of the cut, not only this node's: the others'
        // demands keep moving too between the cut and its detection, and the far
        // side holds them as they were at the cut.
        self.frozen = (self.last_seen.iter())
            .map(|(key, seen)| {
                let at_cut = (self.vectors.get(key))
                    .and_then(|h| h.iter().rev().find(|(t, _)| *t <= before_cut_ms))
                    .map(|(_, v)| v);
                let vector = (seen.iter())
                    .map(|(n, d)| {
                        let then = at_cut
                            .and_then(|v| v.iter().find(|(m, _)| m == n))
                            .map_or(*d, |(_, d)| *d);
                        (n.clone(), then)
                    })
                    .collect();
                (key.clone(), vector)
            })
            .collect();
    }

    /// Nobody is unreachable any more: nothing frozen, and the freeze's tables
    /// given back. `clear` would keep them: a freeze holds a vector for every
    /// key this node has seen, so one member seen dead for a moment (a late
    /// heartbeat) would leave that much allocated for good: ~0.3 MB at 301
    /// tenants (docs/BENCHMARKS.md, "Used once, now idle: the census").
    pub(crate) fn thaw(&mut self) {
        self.frozen = HashMap::new();
        self.frozen_quiet = Vec::new();
        self.earlier = Vec::new();
        self.first_members = Vec::new();
    }

    /// The members live or awaiting GC when the cut was first frozen (empty
    /// when nothing is frozen). Not a later freeze's: a member that joined
    /// during the cut would enlarge this side's part of L by its own count
    /// while the far side still counts its part over the first members.
    pub(crate) fn frozen_members(&self) -> Vec<String> {
        self.first_members.clone()
    }

    /// Every vector of `key` frozen while this cut goes on, the latest first
    /// (empty when nothing is frozen).
    pub(crate) fn frozen_all(&self, key: &str) -> Vec<&[(String, u64)]> {
        let latest = self.frozen(key).into_iter();
        let earlier = (self.earlier.iter().rev()).map(|f| match f.by_key.get(key) {
            Some(v) => v.as_slice(),
            None => f.quiet.as_slice(),
        });
        latest.chain(earlier).collect()
    }

    /// `key`'s vector frozen at the cut (`None` when nothing is frozen).
    pub(crate) fn frozen(&self, key: &str) -> Option<&[(String, u64)]> {
        match self.frozen.get(key) {
            Some(v) => Some(v),
            None if !self.frozen_quiet.is_empty() => Some(&self.frozen_quiet),
            None => None,
        }
    }

    /// Whether `key` is quiet: nothing recorded that a look-back could still read
    /// (no records, or only all-zero ones in effect since before `keep_ms`, which
    /// are dropped here).
    fn forget_if_quiet(&mut self, key: &str, keep_ms: u64) -> bool {
        if !self.forget_quiet {
            return false;
        }
        let own =
            (self.own.get(key)).is_none_or(|h| h.len() == 1 && h[0].0 <= keep_ms && h[0].1 == 0);
        let vector = self.vectors.get(key).is_none_or(|h| {
            h.len() == 1 && h[0].0 <= keep_ms && h[0].1.iter().all(|(_, d)| *d == 0)
        });
        let seen = (self.last_seen.get(key)).is_none_or(|s| s.values().all(|d| *d == 0));
        if own && vector && seen {
            self.own.remove(key);
            self.vectors.remove(key);
            self.last_seen.remove(key);
            shrink_if_sparse(&mut self.own);
            shrink_if_sparse(&mut self.vectors);
            shrink_if_sparse(&mut self.last_seen);
        }
        own && vector && seen
    }

    /// Records `key`'s demand vector when it changed; bounded per key.
    fn record_vector(&mut self, key: &str, demands: &[(String, u64)], now_ms: u64, keep_ms: u64) {
        let history = slot(&mut self.vectors, key);
        if history.is_empty() {
            // New, or quiet until now: every member was at 0.
            let zeros = demands.iter().map(|(n, _)| (n.clone(), 0)).collect();
            history.push_back((0, zeros));
        }
        if history.back().is_none_or(|(_, v)| v.as_slice() != demands) {
            history.push_back((now_ms, demands.to_vec()));
        }
        // Pruned every round, not only on a change: an unchanged idle vector must
        // become the only record, for its key to turn quiet.
        while history.len() > MAX_VECTORS
            || (history.len() > 1 && history.get(1).is_some_and(|(t, _)| *t <= keep_ms))
        {
            history.pop_front();
        }
    }
}

/// Records `demand` at `now_ms` if it changed, and forgets records older than
/// `keep_ms` except the one still in effect then. Changes only: the figure at a
/// time is the newest change at or before it, the same as with a record every
/// round (property-tested), and an idle key keeps one record instead of one per
/// round of the look-back.
fn record_demand(history: &mut VecDeque<(u64, u64)>, now_ms: u64, demand: u64, keep_ms: u64) {
    if history.back().is_none_or(|(_, d)| *d != demand) {
        history.push_back((now_ms, demand));
    }
    while history.len() > 1 && history.get(1).is_some_and(|(t, _)| *t <= keep_ms) {
        history.pop_front();
    }
}

/// The newest recorded demand at or before `at_ms` (the oldest one if none is that
/// old: a key younger than the look-back), or `fallback` with no record.
fn demand_at(history: &VecDeque<(u64, u64)>, at_ms: u64, fallback: u64) -> u64 {
    let mut value = history.front().map_or(fallback, |(_, d)| *d);
    for (t, d) in history {
        if *t <= at_ms {
            value = *d;
        } else {
            break;
        }
    }
    value
}

/// `map[key]`, inserted empty if missing, without allocating the key when it is
/// there (`entry` takes an owned key: one allocation per binding per round).
#[allow(clippy::map_entry)] // `entry` is what this avoids
fn slot<'m, V: Default>(map: &'m mut HashMap<String, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("inserted above when missing")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn history_with(members: &[&str], demands: &[(&str, u64)]) -> DemandHistory {
        let mut h = DemandHistory::new(1_000);
        let live: Vec<String> = members.iter().map(|m| m.to_string()).collect();
        h.set_members(&live, &[]);
        let mut v: Vec<(String, u64)> =
            (demands.iter()).map(|(n, d)| (n.to_string(), *d)).collect();
        let own = demands
            .iter()
            .find(|(n, _)| *n == "me")
            .map_or(0, |(_, d)| *d);
        h.observe("k", own, &mut v, "me", &[], (10_000, 10_000));
        h
    }

    #[test]
    fn a_second_freeze_during_a_cut_keeps_the_first_and_its_members() {
        let mut h = history_with(&["me", "b", "c"], &[("me", 2), ("b", 2), ("c", 12)]);
        h.freeze(10_000);
        assert_eq!(h.frozen_all("k").len(), 1);
        // Demand moves, a member joins, and a second member becomes unreachable.
        let live = ["me".to_owned(), "b".to_owned(), "d".to_owned()];
        h.set_members(&live, &["c".to_owned()]);
        let mut v = vec![("b".to_owned(), 40), ("d".to_owned(), 5)];
        h.observe("k", 40, &mut v, "me", &["c".to_owned()], (11_000, 11_000));
        h.freeze(11_000);
        let all = h.frozen_all("k");
        assert_eq!(all.len(), 2, "{all:?}");
        let c_in = |v: &[(String, u64)]| v.iter().find(|(n, _)| n == "c").map(|(_, d)| *d);
        assert_eq!(c_in(all[1]), Some(12), "the first freeze, as it was");
        assert_eq!(
            h.frozen_members(),
            ["b", "c", "me"],
            "the first freeze's members"
        );
        h.thaw();
        assert!(h.frozen_all("k").is_empty());
        assert!(h.frozen_members().is_empty());
        // The freeze's tables are given back, not only emptied.
        assert_eq!(h.frozen.capacity(), 0);
        assert_eq!(h.frozen_quiet.capacity(), 0);
        assert_eq!(h.earlier.capacity(), 0);
        assert_eq!(h.first_members.capacity(), 0);
    }

    proptest! {
        /// Recording a key's demand only when it changes answers every look-back
        /// the way a record every round would, with no more records.
        #[test]
        fn change_only_demand_records_answer_as_a_record_every_round_did(
            demands in proptest::collection::vec(0u64..4, 1..300),
            detection_rounds in 1u64..20,
            look_back_ms in 0u64..30_000,
        ) {
            let (mut every_round, mut changes) = (VecDeque::new(), VecDeque::new());
            for (round, demand) in demands.iter().enumerate() {
                let now = 10_000 + round as u64 * 200;
                let keep = now.saturating_sub(3 * detection_rounds * 200);
                every_round.push_back((now, *demand));
                while every_round.len() > 1 && every_round.get(1).is_some_and(|(t, _)| *t <= keep) {
                    every_round.pop_front();
                }
                record_demand(&mut changes, now, *demand, keep);
                let at = now.saturating_sub(look_back_ms);
                prop_assert_eq!(
                    demand_at(&changes, at, *demand),
                    demand_at(&every_round, at, *demand)
                );
                prop_assert!(changes.len() <= every_round.len());
            }
        }

        /// Forgetting quiet keys changes no figure: through bursts of demand and
        /// long idle stretches on three keys, members joining and dying, and cuts
        /// frozen at random rounds, every lagged own figure and every frozen vector
        /// equals what a history that never forgets gives, and a key idle for three
        /// look-backs keeps nothing.
        #[test]
        fn forgetting_quiet_keys_changes_no_figure(
            rounds in proptest::collection::vec(
                (
                    proptest::collection::vec((0u64..3, 0u64..3), 3),
                    0u8..20,
                    0u8..30,
                ),
                1..200,
            ),
        ) {
            const LOOK_BACK: u64 = 1_000;
            let mut pruned = DemandHistory::new(LOOK_BACK);
            let mut reference = DemandHistory::new(LOOK_BACK);
            reference.forget_quiet = false;
            let keys = ["k0", "k1", "k2"];
            let mut idle_since = [0u64; 3];
            let mut members = vec!["a".to_owned(), "me".to_owned()];
            let mut dead: Vec<String> = Vec::new();
            for (round, (load, event, cut)) in rounds.iter().enumerate() {
                let now = 1_000 + round as u64 * 200;
                // Membership: b joins, b dies, or nothing (mostly).
                match event {
                    0 if !members.contains(&"b".to_owned()) && dead.is_empty() => {
                        members.push("b".to_owned());
                    }
                    1 if members.contains(&"b".to_owned()) => {
                        members.retain(|m| m != "b");
                        dead.push("b".to_owned());
                    }
                    _ => {}
                }
                for h in [&mut pruned, &mut reference] {
                    h.set_members(&members, &dead);
                }
                let horizon = now.saturating_sub(300);
                for (k, key) in keys.iter().enumerate() {
                    // Idle is twice as likely; k2 goes idle for good after 60 rounds.
                    let (own, peer) = load[k];
                    let (own, peer) = if k == 2 && round >= 60 {
                        (0, 0)
                    } else {
                        (own.saturating_sub(1), peer.saturating_sub(1))
                    };
                    if own > 0 || peer > 0 {
                        idle_since[k] = now;
                    }
                    let published: Vec<(String, u64)> = (members.iter())
                        .filter(|m| *m != "me")
                        .map(|m| (m.clone(), if m == "a" { peer } else { 0 }))
                        .collect();
                    let (mut got, mut want) = (published.clone(), published);
                    pruned.observe(key, own, &mut got, "me", &dead, (horizon, now));
                    reference.observe(key, own, &mut want, "me", &dead, (horizon, now));
                    prop_assert_eq!(&got, &want, "round {} key {}", round, key);
                }
                if *cut == 0 {
                    let before_cut = now.saturating_sub(u64::from(*event) * 100);
                    pruned.freeze(before_cut);
                    reference.freeze(before_cut);
                    for key in keys {
                        let sorted = |v: Option<&[(String, u64)]>| {
                            v.map(|v| v.iter().cloned().collect::<BTreeMap<_, _>>())
                        };
                        prop_assert_eq!(
                            sorted(pruned.frozen(key)),
                            sorted(reference.frozen(key)),
                            "cut at {}", round
                        );
                    }
                } else if *cut == 1 {
                    pruned.thaw();
                    reference.thaw();
                }
                for (k, key) in keys.iter().enumerate() {
                    if now.saturating_sub(idle_since[k]) > 4 * 3 * LOOK_BACK {
                        prop_assert!(!pruned.own.contains_key(*key), "{} idle, still kept", key);
                    }
                }
            }
        }
    }
}
