//! The partition arithmetic the round applies: the horizon of this node's own
//! figure, a cut this node did not see begin, the charges it records for
//! nodes that join later, `local split`'s part of L, and the freeze.

use super::*;

impl Engine {
    /// The time this node's own demand figure is read at: what every peer has
    /// surely received. Healthy: a sync interval and two gossip intervals ago. When
    /// a peer goes silent (a cut, before it is declared dead), its last round stops
    /// advancing and so does this horizon: this node's figure stays what the far
    /// side last saw, however its refused demand grows meanwhile.
    pub(super) fn horizon_ms(&self, now_ms: u64) -> u64 {
        let healthy = now_ms.saturating_sub(self.cutoff_lag_ms);
        let quietest = (self.sightings.fresh())
            .filter(|(n, _)| !self.dead.contains(*n))
            .map(|(_, t)| t.saturating_sub(self.propagation_ms))
            .min();
        quietest.map_or(healthy, |q| q.min(healthy))
    }

    /// Whether some unreachable member went silent before this node joined (its
    /// last round known here is more than a detection time older than the
    /// join): this node has no figures from that moment, so the ones it would
    /// freeze are not the ones the far side froze. A member with no round at all
    /// (a bare membership) has spent nothing. A member still joining, dead to
    /// chitchat until its first heartbeats arrive, publishes rounds as it goes:
    /// its last round is recent, so a cluster forming does not look like an
    /// unseen cut (with "older than this node's records" as the test it would:
    /// every node of a forming 3-node cluster would charge all of L and publish a
    /// charge for each of 900 keys, as `tests/scale.rs` shows).
    pub(super) fn unwitnessed_cut(&self) -> bool {
        let Some(joined) = self.joined_ms else {
            return false;
        };
        (self.dead.iter()).any(|d| {
            (self.sightings.round(d))
                .is_some_and(|at| at.saturating_add(self.demand_lag_ms) < joined)
        })
    }

    /// `local split` during a cut: the members at the cut this side divides L
    /// by (`partition::cut::split_members`), as this node froze them unless it
    /// did not see the cut begin; recorded for nodes that join later. `None`
    /// while nobody is unreachable, and in other modes.
    pub(super) fn split_at_cut(&mut self) -> Option<Vec<String>> {
        if self.sync_mode != SyncMode::Local || self.dead.is_empty() {
            return None;
        }
        let own = if self.unwitnessed {
            Vec::new()
        } else {
            self.history.frozen_members()
        };
        let at_cut = split_members(&own, self.cut.adopted_members(), &self.dead);
        self.cut.record_members(&at_cut);
        Some(at_cut)
    }

    /// Freezes every key's demands as last seen, this node's own as it stood
    /// before the cut (when the newly unreachable were last heard from, less the
    /// time a value takes to reach them): the figure the other side holds.
    pub(super) fn freeze(&mut self, newly_dead: &[String], now_ms: u64) {
        let cut_ms = (newly_dead.iter())
            .filter_map(|d| self.sightings.last_fresh(d))
            .min()
            .unwrap_or(now_ms.saturating_sub(self.demand_lag_ms));
        self.history
            .freeze(cut_ms.saturating_sub(self.propagation_ms));
    }
}
