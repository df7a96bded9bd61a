//! Demand per key: cost asked of this node in the last window, admitted or not. The
//! actors export cumulative counters (which restart from 0 when an actor retires);
//! this keeps their positive increments in a time-bounded history so the demand over
//! the last window is a subtraction.

use std::collections::{HashMap, VecDeque};

#[derive(Debug, Default)]
struct Track {
    last_cumulative: u64,
    total: u64,
    history: VecDeque<(u64, u64)>,
}

/// Demand trackers for every key.
#[derive(Debug)]
pub struct Demand {
    window_ms: u64,
    keys: HashMap<String, Track>,
}

impl Demand {
    /// Trackers over windows of `window_ms`.
    pub fn new(window_ms: u64) -> Demand {
        Demand {
            window_ms,
            keys: HashMap::new(),
        }
    }

    /// Records the actor's cumulative figure for `key` at `now_ms` and returns the
    /// demand over the last window.
    pub fn observe(&mut self, key: &str, cumulative: u64, now_ms: u64) -> u64 {
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
        let cutoff = now_ms.saturating_sub(self.window_ms);
        while track.history.len() > 1 && track.history.get(1).is_some_and(|(t, _)| *t < cutoff) {
            track.history.pop_front();
        }
        let oldest = track
            .history
            .front()
            .map_or(track.total, |(_, total)| *total);
        track.total - oldest
    }

    /// The last window's demand for `key` without a new observation (0 if unseen).
    pub fn current(&self, key: &str) -> u64 {
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
}
