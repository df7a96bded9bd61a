//! What every peer has surely seen of this node's own usage (`gossip` mode).
//!
//! A node knows its own usage fresh but sees its peers' a propagation time late.
//! Computing its allowance from its fresh usage and its peers' stale usage, it
//! hands itself a share of headroom that its own unpublished spending has already
//! taken, while every peer, not yet seeing that spending, hands itself a share of
//! the same headroom: round after round each node re-carves the headroom the
//! others are spending. Left alone, that is gossip mode's whole overshoot in the
//! benchmark (+0.8% to +2.0% of L at 3-5 nodes, against +0.000 with what follows:
//! docs/BENCHMARKS.md, "At a glance"). A node that counts
//! itself as its peers see it, its usage less what it added within one
//! propagation bound, computes the allowance they compute for it: while every
//! member computes from the views the others hold of it, the allowances sum to L
//! (docs/design/cluster.md, "Why `gossip` is <= L x (1 + e)").
//!
//! Only what was *added* counts as unseen: a refund peers have not seen yet makes
//! them charge this node more than it uses, which is on the safe side, and a
//! bucket leaving the window leaves it for every reader at the same time (buckets
//! are dated, docs/design/counters.md). Additions are dated when the write that
//! carries them succeeds (until then they are unseen whatever their age: a
//! refused publish delays them), and the bound follows the measured convergence
//! lag where that is longer (large clusters take more gossip rounds). Keys that
//! added nothing within the bound keep no entry.

use std::collections::{HashMap, VecDeque};
use tollgate_cluster::maps::{shrink_if_sparse, shrink_to_need};

/// At most this many additions are kept per key; older ones merge into the next
/// (dated later, so counted unseen longer: the safe side). Rounds come every
/// `sync_interval` and the bound is a few of them, so this is only reached when
/// rounds run far faster than the bound.
const MAX_ENTRIES_PER_KEY: usize = 16;

/// Each key's own additions within the propagation bound.
#[derive(Debug)]
pub(crate) struct OwnEcho {
    /// How old an own addition must be for every peer to have it (ms).
    bound_ms: u64,
    /// Per key: units added since the last successful publish.
    pending: HashMap<String, u64>,
    /// Per key: `(publish ms, units it carried)`, oldest first, each > 0.
    added: HashMap<String, VecDeque<(u64, u64)>>,
}

impl OwnEcho {
    /// Additions older than `bound_ms` count as seen by every peer.
    pub(crate) fn new(bound_ms: u64) -> OwnEcho {
        OwnEcho {
            bound_ms,
            pending: HashMap::new(),
            added: HashMap::new(),
        }
    }

    /// Sets the bound: additions older than `bound_ms` count as seen.
    pub(crate) fn set_bound(&mut self, bound_ms: u64) {
        self.bound_ms = bound_ms;
    }

    /// Notes that this node added `units` to `key` (unseen by every peer until
    /// the write carrying it succeeded and the bound has passed since).
    pub(crate) fn added(&mut self, key: &str, units: u64) {
        if units == 0 {
            return;
        }
        let pending = match self.pending.get_mut(key) {
            Some(pending) => pending,
            None => self.pending.entry(key.to_owned()).or_default(),
        };
        *pending = pending.saturating_add(units);
    }

    /// The write carrying every pending addition succeeded at `now_ms`.
    pub(crate) fn published(&mut self, now_ms: u64) {
        let drained = self.pending.len();
        for (key, units) in self.pending.drain() {
            let entries = self.added.entry(key).or_default();
            match entries.back_mut() {
                Some((at, sum)) if *at == now_ms => *sum = sum.saturating_add(units),
                _ => entries.push_back((now_ms, units)),
            }
            if entries.len() > MAX_ENTRIES_PER_KEY
                && let Some((_, oldest)) = entries.pop_front()
                && let Some((_, next)) = entries.front_mut()
            {
                *next = next.saturating_add(oldest);
            }
        }
        // Emptied every round: kept at this round's size (freeing it each time
        // would make the next round grow it again from nothing), and shrunk only
        // once far larger than a round needs.
        shrink_to_need(&mut self.pending, drained);
    }

    /// What this node added to `key` that some peer may not have seen at `now_ms`.
    pub(crate) fn unseen(&self, key: &str, now_ms: u64) -> u64 {
        let seen_before = now_ms.saturating_sub(self.bound_ms);
        let pending = self.pending.get(key).copied().unwrap_or(0);
        self.added.get(key).map_or(pending, |entries| {
            (entries.iter())
                .filter(|(at, _)| *at > seen_before)
                .fold(pending, |sum, (_, units)| sum.saturating_add(*units))
        })
    }

    /// `used` as every peer has surely seen it at `now_ms`.
    pub(crate) fn seen(&self, key: &str, used: u64, now_ms: u64) -> u64 {
        used.saturating_sub(self.unseen(key, now_ms))
    }

    /// Forgets additions every peer has by now, and keys left with none.
    pub(crate) fn forget_seen(&mut self, now_ms: u64) {
        let seen_before = now_ms.saturating_sub(self.bound_ms);
        self.added.retain(|_, entries| {
            while entries.front().is_some_and(|(at, _)| *at <= seen_before) {
                entries.pop_front();
            }
            !entries.is_empty()
        });
        shrink_if_sparse(&mut self.added);
    }

    /// How many keys hold additions (bounded by the keys active within the bound).
    pub(crate) fn len(&self) -> usize {
        let pending_only = (self.pending.keys()).filter(|k| !self.added.contains_key(*k));
        self.added.len() + pending_only.count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_keeps_a_rounds_table_and_gives_back_a_far_larger_one() {
        let mut echo = OwnEcho::new(1_000);
        for k in 0..1_000 {
            echo.added(&format!("k{k}"), 1);
        }
        echo.published(1);
        let busy = echo.pending.capacity();
        assert!(busy >= 1_000, "kept for the next round: {busy}");
        for k in 0..10 {
            echo.added(&format!("k{k}"), 1);
        }
        echo.published(2);
        assert!(
            echo.pending.capacity() < busy / 8,
            "{}",
            echo.pending.capacity()
        );
    }

    #[test]
    fn an_addition_whose_write_failed_stays_unseen_until_one_succeeds() {
        let mut echo = OwnEcho::new(400);
        echo.added("k", 5);
        // The round's write was refused: nothing is dated; still unseen long after.
        assert_eq!(echo.unseen("k", 10_000), 5);
        echo.forget_seen(10_000);
        assert_eq!(echo.len(), 1);
        echo.added("k", 2);
        echo.published(10_200);
        assert_eq!(echo.unseen("k", 10_599), 7);
        assert_eq!(echo.unseen("k", 10_600), 0);
        // A longer bound (a slow cluster) keeps additions unseen longer.
        echo.set_bound(1_000);
        assert_eq!(echo.unseen("k", 10_600), 7);
    }

    #[test]
    fn what_was_added_within_the_bound_is_unseen_and_older_additions_are_seen() {
        let mut echo = OwnEcho::new(400);
        echo.added("k", 5);
        echo.published(1_000);
        echo.added("k", 3);
        echo.published(1_200);
        assert_eq!(echo.unseen("k", 1_200), 8);
        assert_eq!(echo.seen("k", 20, 1_200), 12);
        // At 1,400 the first addition is 400 ms old: every peer has it.
        assert_eq!(echo.unseen("k", 1_400), 3);
        assert_eq!(echo.unseen("k", 1_600), 0);
        assert_eq!(echo.unseen("other", 1_200), 0);
        // Refunds since can leave less used than was added: never below 0.
        assert_eq!(echo.seen("k", 2, 1_200), 0);
    }

    #[test]
    fn keys_with_nothing_unseen_keep_no_entry() {
        let mut echo = OwnEcho::new(400);
        echo.added("k", 0);
        assert_eq!(echo.len(), 0);
        echo.added("k", 1);
        echo.published(1_000);
        echo.added("j", 1);
        echo.published(1_300);
        echo.forget_seen(1_399);
        assert_eq!(echo.len(), 2);
        echo.forget_seen(1_400);
        assert_eq!(echo.len(), 1);
        assert_eq!(echo.unseen("j", 1_400), 1);
        echo.forget_seen(1_700);
        assert_eq!(echo.len(), 0);
    }

    #[test]
    fn a_full_key_merges_its_oldest_addition_forward_never_losing_units() {
        let mut echo = OwnEcho::new(1_000_000);
        for round in 0..100u64 {
            echo.added("k", 1);
            echo.published(round);
        }
        assert_eq!(echo.added["k"].len(), MAX_ENTRIES_PER_KEY);
        assert_eq!(echo.unseen("k", 100), 100);
        // Merged forward: an old unit now counts unseen as long as a newer one.
        let bounded = OwnEcho {
            bound_ms: 50,
            pending: HashMap::new(),
            added: echo.added.clone(),
        };
        assert!(bounded.unseen("k", 100) >= 50);
    }
}
