//! Demand per key: cost asked of this node in the last window, admitted or not. The
//! actors export cumulative counters (which restart from 0 when an actor retires);
//! this keeps their positive increments in a time-bounded history so the demand over
//! the last window is a subtraction.

use std::collections::{HashMap, VecDeque};
use tollgate_cluster::maps::shrink_if_sparse;

#[derive(Debug, Default)]
struct Track {
    last_cumulative: u64,
    total: u64,
    history: VecDeque<(u64, u64)>,
}

impl Track {
    /// Drops the records that left the window starting at `cutoff_ms`, all but
    /// the last one before it (the baseline), and returns the demand since that
    /// baseline: 0 once every record has left, the last one holding the total.
    fn within(&mut self, cutoff_ms: u64) -> u64 {
        while self.history.len() > 1 && self.history.get(1).is_some_and(|(t, _)| *t < cutoff_ms) {
            self.history.pop_front();
        }
        let oldest = (self.history.front()).map_or(self.total, |(_, total)| *total);
        self.total - oldest
    }
}

/// Demand trackers for every key.
#[derive(Debug)]
pub(crate) struct Demand {
    window_ms: u64,
    keys: HashMap<String, Track>,
}

impl Demand {
    /// Trackers over windows of `window_ms`.
    pub(crate) fn new(window_ms: u64) -> Demand {
        Demand {
            window_ms,
            keys: HashMap::new(),
        }
    }

    /// Records the actor's cumulative figure for `key` at `now_ms` and returns the
    /// demand over the last window.
    pub(crate) fn observe(&mut self, key: &str, cumulative: u64, now_ms: u64) -> u64 {
        let track = self.keys.entry(key.to_owned()).or_default();
        if track.history.is_empty() {
            // The baseline: everything observed from now on is demand.
            track.history.push_back((now_ms, track.total));
        }
        // A smaller figure means the actor restarted from 0.
        let increment = cumulative
            .checked_sub(track.last_cumulative)
            .unwrap_or(cumulative);
        track.last_cumulative = cumulative;
        track.total = track.total.saturating_add(increment);
        track.history.push_back((now_ms, track.total));
        track.within(now_ms.saturating_sub(self.window_ms))
    }

    /// The last window's demand for `key` at `now_ms` when its actor has
    /// retired (nothing to observe): what it asked for leaves the window as time
    /// passes, as if it were observed asking for nothing more. 0 if unseen. A
    /// successor actor's cumulative figure starts from 0 and counts whole, even
    /// at or above its predecessor's last figure (read as a restart only below
    /// it, it would be under-counted by that figure for a window).
    pub(crate) fn decay(&mut self, key: &str, now_ms: u64) -> u64 {
        (self.keys.get_mut(key)).map_or(0, |t| {
            t.last_cumulative = 0;
            t.within(now_ms.saturating_sub(self.window_ms))
        })
    }

    /// The keys tracked, in no order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &String> {
        self.keys.keys()
    }

    /// Forgets the keys last observed more than a window before `now_ms`: their
    /// actor retired (the engine observes every live actor's keys each round) and
    /// everything they recorded has left the window, so their demand reads 0
    /// either way. A successor actor's counter starts from 0, which a fresh
    /// tracker counts from 0 too. Without this every key ever used kept up to
    /// W / S history entries (~5 KB at 60 s / 200 ms).
    pub(crate) fn forget_retired(&mut self, now_ms: u64) {
        let cutoff = now_ms.saturating_sub(self.window_ms);
        (self.keys).retain(|_, t| t.history.back().is_some_and(|(at, _)| *at >= cutoff));
        shrink_if_sparse(&mut self.keys);
    }

    /// How many keys are tracked.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// The last window's demand for `key` without a new observation (0 if unseen).
    pub(crate) fn current(&self, key: &str) -> u64 {
        self.keys.get(key).map_or(0, |t| {
            let oldest = t.history.front().map_or(t.total, |(_, total)| *total);
            t.total - oldest
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_is_the_increase_over_the_last_window_across_restarts() {
        let mut d = Demand::new(1_000);
        // The first figure already counts: an actor's first requests are demand.
        assert_eq!(d.observe("first", 3, 0), 3);
        assert_eq!(d.observe("k", 0, 0), 0);
        assert_eq!(d.observe("k", 10, 200), 10);
        assert_eq!(d.observe("k", 30, 400), 30);
        // The actor retired and restarted: its counter began again at 0.
        assert_eq!(d.observe("k", 5, 600), 35);
        // At 1300 the observations up to 300 have left the window: 35 - 10.
        assert_eq!(d.observe("k", 5, 1_300), 25);
        assert_eq!(d.current("k"), 25);
        assert_eq!(d.current("unseen"), 0);
    }

    #[test]
    fn a_retired_actors_demand_leaves_the_window_as_time_passes() {
        let mut d = Demand::new(1_000);
        assert_eq!(d.observe("k", 10, 0), 10);
        assert_eq!(d.observe("k", 30, 400), 30);
        // Retired: nothing more is observed, and the figure decays by time alone.
        assert_eq!(d.decay("k", 900), 30);
        assert_eq!(d.decay("k", 1_200), 20, "the first 10 left at 1,000");
        assert_eq!(d.current("k"), 20);
        assert_eq!(d.decay("k", 1_500), 0, "the rest left at 1,400");
        assert_eq!(d.decay("unseen", 1_500), 0);
        // A successor actor within the window counts from 0, whatever its
        // predecessor's last figure (30).
        assert_eq!(d.observe("k", 40, 1_600), 40);
        // Decaying is not observing: the key is still forgotten a window after
        // its last observation.
        d.decay("k", 2_700);
        d.forget_retired(2_700);
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn a_retired_actors_key_is_forgotten_once_its_window_holds_no_demand() {
        let mut d = Demand::new(1_000);
        assert_eq!(d.observe("live", 4, 0), 4);
        assert_eq!(d.observe("gone", 7, 0), 7);
        // Only "live" is exported from 500 on: "gone" still has demand in its
        // window until its last observation leaves it.
        d.observe("live", 4, 500);
        d.forget_retired(1_000);
        assert_eq!((d.len(), d.current("gone")), (2, 7));
        // At 1,600 its demand has left the window: forgotten. "live" is observed
        // (an idle live actor keeps its tracker: its counter does not restart).
        d.observe("live", 4, 1_600);
        d.forget_retired(1_600);
        assert_eq!((d.len(), d.current("gone")), (1, 0));
        // A successor actor for "gone" starts from 0 and counts from there.
        assert_eq!(d.observe("gone", 2, 1_800), 2);
        // The live one's idle figure is no new demand.
        assert_eq!(d.observe("live", 4, 1_800), 0);
    }
}
