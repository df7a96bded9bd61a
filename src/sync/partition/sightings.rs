//! When this node last heard from each member: its last round's stamp, and when
//! this node last saw it live with a round it had not seen live before.
//!
//! `last_fresh` is what marks a member this node saw live. Only such a member
//! starts a cut's freeze when it goes silent (`Engine::round`): one never seen
//! live (still joining, or a crashed incarnation from before this node started)
//! went silent at no moment this node saw. It also dates the cut (`freeze`) and
//! holds back the horizon own figures are read at (`Engine::horizon_ms`).
//!
//! A member is seen live for the first time with a round this node may already
//! hold: chitchat lists a newcomer as dead until its heartbeats arrive, and its
//! values, read then as a departed member's, include its round. Counting only
//! a *changed* round as fresh would miss that sighting when the member's next
//! round does not arrive before a cut: it would never be fresh, its cut would
//! freeze nothing, and a `local split` node with nothing frozen would read its
//! side's part of L as 0 (allowances `[0, 7, 6]` in
//! `local_split_shares_a_sides_part_of_l_with_a_node_that_joined_during_the_cut`).
//! The first live sighting is fresh whatever its round.

use std::collections::{HashMap, HashSet};

/// Per member: its last round's stamp, and the last time it was fresh here.
#[derive(Debug, Default)]
pub(crate) struct Sightings {
    /// Each member's last `sync:at` value (its clock, ms), live or departed.
    round: HashMap<String, u64>,
    /// When (this node's clock, ms) each member was last seen live with a round
    /// not seen live before; absent for a member never seen live.
    fresh: HashMap<String, u64>,
}

impl Sightings {
    /// `node` is live with round `at`, read at `now_ms`.
    pub(crate) fn live_round(&mut self, node: &str, at: u64, now_ms: u64) {
        let first_live = !self.fresh.contains_key(node);
        if first_live || self.round.get(node) != Some(&at) {
            self.round.insert(node.to_owned(), at);
            self.fresh.insert(node.to_owned(), now_ms);
        }
    }

    /// `node` is departed (dead, or an earlier incarnation) with last round `at`:
    /// recorded for [`Self::round`], not a sign of life.
    pub(crate) fn departed_round(&mut self, node: &str, at: u64) {
        self.round.insert(node.to_owned(), at);
    }

    /// `node`'s last round's stamp, if any came.
    pub(crate) fn round(&self, node: &str) -> Option<u64> {
        self.round.get(node).copied()
    }

    /// When `node` was last fresh here, `None` if never seen live.
    pub(crate) fn last_fresh(&self, node: &str) -> Option<u64> {
        self.fresh.get(node).copied()
    }

    /// Every member ever seen live, with when it was last fresh.
    pub(crate) fn fresh(&self) -> impl Iterator<Item = (&String, u64)> {
        self.fresh.iter().map(|(n, t)| (n, *t))
    }

    /// Forgets members chitchat no longer holds (bounded memory). A member that
    /// just went silent is kept: its last fresh round dates the cut.
    pub(crate) fn retain(&mut self, known: &HashSet<String>) {
        self.round.retain(|n, _| known.contains(n));
        self.fresh.retain(|n, _| known.contains(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_first_seen_live_with_a_round_read_while_departed_is_fresh() {
        let mut s = Sightings::default();
        // Joining: dead to chitchat, its values read as a departed member's.
        s.departed_round("n2", 100);
        assert_eq!(s.last_fresh("n2"), None, "not a sign of life");
        // Live now, its next round not here yet: this sighting is fresh.
        s.live_round("n2", 100, 5_000);
        assert_eq!(s.last_fresh("n2"), Some(5_000));
        // The same round read live again is not news.
        s.live_round("n2", 100, 5_100);
        assert_eq!(s.last_fresh("n2"), Some(5_000));
        // A new round is.
        s.live_round("n2", 200, 5_200);
        assert_eq!(
            (s.round("n2"), s.last_fresh("n2")),
            (Some(200), Some(5_200))
        );
        // Silent and declared dead: its last round stays, its freshness too.
        s.departed_round("n2", 200);
        assert_eq!(s.last_fresh("n2"), Some(5_200));
    }

    #[test]
    fn members_chitchat_forgot_are_forgotten() {
        let mut s = Sightings::default();
        s.live_round("a", 1, 10);
        s.live_round("b", 1, 10);
        s.retain(&HashSet::from(["a".to_owned()]));
        assert_eq!(s.fresh().count(), 1);
        assert_eq!((s.round("b"), s.last_fresh("b")), (None, None));
    }
}
