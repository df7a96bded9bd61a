//! When a crashed member's partition floor may end: a window after its successor.
//!
//! An unreachable member is charged a floor (its frozen share) because it may be
//! cut off and still spending. Without more, that lasts until chitchat collects it
//! (`dead_node_grace`), which is also the longest cut the partition promises cover
//! (docs/design/cluster.md, "A cut longer than `dead_node_grace`"). Raising the
//! grace to cover long cuts would then make every restart cost its share for the
//! whole grace.
//!
//! A restart is told apart: the node comes back under its `node_id` with a later
//! generation. Node ids name one process at a time (docs/config.md, `node_id`), so
//! once a successor is live the old incarnation has stopped, and everything it
//! spent lies before the successor started, which is before this node first saw
//! the successor. That spending counts (by the counters' conservative rule) until
//! its bucket's end has left the window, up to the clock skew the counters
//! tolerate; so the floor ends `window + bucket + skew` after the first round that
//! saw the successor live, not when it appears. Ending it at once would be wrong:
//! an incarnation cut off before it crashed spent a share that only its floor
//! covers (nobody on this side saw that spending), and that share could be
//! granted again within the same window.
//!
//! Once ended, a floor stays ended while chitchat holds the incarnation, whatever
//! becomes of the successor: the old spending is out of the window either way, and
//! putting it back would re-freeze every member's demand in the middle of a cut.

use std::collections::BTreeMap;
use tollgate_cluster::membership::MemberId;

/// Dead incarnations with a live successor, and when this node first saw one.
#[derive(Debug)]
pub(crate) struct Successors {
    /// How long after the first sighting the floor ends (ms).
    hold_ms: u64,
    /// Dead incarnation (its `MemberId` as text) -> first round that saw a later
    /// generation of its node id live (ms). Bounded by chitchat's dead members.
    seen: BTreeMap<String, u64>,
}

impl Successors {
    /// Floors end `hold_ms` after a successor is first seen.
    pub(crate) fn new(hold_ms: u64) -> Successors {
        Successors {
            hold_ms,
            seen: BTreeMap::new(),
        }
    }

    /// The hold for a window of `window_ms` in buckets of `bucket_ms`: everything
    /// the old incarnation spent has left the window by then, on any clock within
    /// the counters' skew tolerance.
    pub(crate) fn hold_for(window_ms: u64, bucket_ms: u64) -> u64 {
        use tollgate_cluster::counter::SKEW_TOLERANCE_MS;
        window_ms
            .saturating_add(bucket_ms)
            .saturating_add(SKEW_TOLERANCE_MS)
    }

    /// One round: notes each dead incarnation that now has a live successor (a
    /// later generation of its node id among `live`), and forgets incarnations
    /// that are no longer dead (collected by chitchat, or back after a cut).
    pub(crate) fn observe(&mut self, dead: &[MemberId], live: &[MemberId], now_ms: u64) {
        self.seen
            .retain(|id, _| dead.iter().any(|d| d.to_string() == *id));
        for d in dead {
            let succeeded =
                (live.iter()).any(|m| m.node_id == d.node_id && m.generation > d.generation);
            if succeeded {
                self.seen.entry(d.to_string()).or_insert(now_ms);
            }
        }
    }

    /// Whether the floor of `dead` (a `MemberId` as text) has ended.
    pub(crate) fn ended(&self, dead: &str, now_ms: u64) -> bool {
        (self.seen.get(dead)).is_some_and(|seen| now_ms.saturating_sub(*seen) >= self.hold_ms)
    }

    /// Dead incarnations whose successor was seen, floors ended or not.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(node: &str, generation: u64) -> MemberId {
        MemberId {
            node_id: node.to_owned(),
            generation,
            gossip_addr: ([127, 0, 0, 1], 7000).into(),
        }
    }

    #[test]
    fn a_floor_ends_one_hold_after_the_successor_is_first_seen_not_when_it_appears() {
        let mut s = Successors::new(61_100);
        let old = id("node-2", 1);
        s.observe(std::slice::from_ref(&old), &[id("node-0", 5)], 1_000);
        assert!(!s.ended(&old.to_string(), 500_000), "no successor yet");
        s.observe(std::slice::from_ref(&old), &[id("node-2", 2)], 10_000);
        assert!(!s.ended(&old.to_string(), 10_000), "not when it appears");
        s.observe(std::slice::from_ref(&old), &[id("node-2", 2)], 70_000);
        assert!(
            !s.ended(&old.to_string(), 71_099),
            "dated from the first sighting"
        );
        assert!(s.ended(&old.to_string(), 71_100));
    }

    #[test]
    fn only_a_later_generation_of_the_same_node_id_is_a_successor() {
        let mut s = Successors::new(0);
        let old = id("node-2", 7);
        let dead = std::slice::from_ref(&old);
        s.observe(
            dead,
            &[id("node-2", 7), id("node-2", 6), id("node-3", 9)],
            0,
        );
        assert!(!s.ended(&old.to_string(), 1_000_000));
        assert_eq!(s.tracked(), 0);
    }

    #[test]
    fn an_ended_floor_stays_ended_while_the_incarnation_is_held_whatever_the_successor_does() {
        let mut s = Successors::new(100);
        let old = id("node-2", 1);
        let dead = std::slice::from_ref(&old);
        s.observe(dead, &[id("node-2", 2)], 0);
        // The successor dies too: the old floor's end is not undone.
        s.observe(&[old.clone(), id("node-2", 2)], &[], 50);
        assert!(s.ended(&old.to_string(), 100));
    }

    #[test]
    fn incarnations_no_longer_dead_are_forgotten() {
        let mut s = Successors::new(100);
        let old = id("node-2", 1);
        s.observe(std::slice::from_ref(&old), &[id("node-2", 2)], 0);
        assert_eq!(s.tracked(), 1);
        // Collected by chitchat (or back after a cut): nothing to remember.
        s.observe(&[], &[id("node-2", 2)], 10);
        assert_eq!(s.tracked(), 0);
        assert!(!s.ended(&old.to_string(), 1_000));
    }

    #[test]
    fn the_hold_covers_a_window_a_bucket_and_the_skew_tolerance() {
        assert_eq!(Successors::hold_for(60_000, 1_000), 61_100);
    }
}
