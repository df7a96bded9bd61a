//! Exact sliding log: one entry per admitted reservation.
//!
//! An entry at time `u` counts at `t` iff `u` is in the window `(t-W, t]`. A cost is
//! admitted iff the entries in the window plus the cost fit the ceiling, so the promise
//! is the sliding window's without the bucket rounding. Costly (memory per admission),
//! kept for comparison. A running sum makes decisions amortised O(1); expired entries
//! are dropped lazily by `reserve`, and `check` subtracts them without mutating.
//!
//! Limit: at most [`MAX_LOG_ENTRIES`] entries in a window (an extra admission
//! condition, so cost-0 or fully refunded reservations cannot grow the log unbounded).

use std::collections::VecDeque;

use super::{
    Algorithm, Ceiling, Denial, LimitSpec, Nanos, Reservation, Settlement, Snapshot, SpecError,
};

/// Most entries a log holds within one window (24 bytes each: 1.5 MiB at most).
pub const MAX_LOG_ENTRIES: usize = 65_536;

/// One admitted reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    time_ns: Nanos,
    cost: u64,
    /// Strictly increasing and at least `time_ns`, so a dropped log's seqs cannot
    /// collide with a new one's (see `is_at_rest`).
    seq: u64,
}

/// An exact per-event sliding log; see the module docs for its promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingLog {
    spec: LimitSpec,
    /// Entries in time (and seq) order, possibly with an expired prefix.
    entries: VecDeque<Entry>,
    /// Sum of all entries' costs, the expired prefix included.
    sum: u64,
    /// Lower bound for the next entry's seq.
    next_seq: u64,
    /// Newest `now` a reservation was made at; earlier times are clamped to it.
    latest_ns: Nanos,
}

impl SlidingLog {
    /// Builds an empty log, or says why the spec is unusable.
    pub fn try_new(spec: LimitSpec) -> Result<Self, SpecError> {
        spec.validate_for(Algorithm::SlidingLog)?;
        let spec = LimitSpec {
            algorithm: Algorithm::SlidingLog,
            ..spec
        };
        Ok(Self {
            spec,
            entries: VecDeque::new(),
            sum: 0,
            next_seq: 0,
            latest_ns: 0,
        })
    }

    /// The validated spec.
    pub fn spec(&self) -> &LimitSpec {
        &self.spec
    }

    /// Would `cost` be admitted under `ceiling` at `now`? Changes nothing.
    pub fn check(&self, now: Nanos, cost: u64, ceiling: Ceiling) -> Result<(), Denial> {
        let now = now.max(self.latest_ns);
        let (used, live) = self.live_totals(now);
        self.decide(now, used, live, cost, ceiling)
    }

    /// Appends an entry for `cost` at `now` if it fits under `ceiling`; the slot is the
    /// entry's sequence number.
    pub fn reserve(
        &mut self,
        now: Nanos,
        cost: u64,
        ceiling: Ceiling,
    ) -> Result<Reservation, Denial> {
        let now = now.max(self.latest_ns);
        self.drop_expired(now);
        self.decide(now, self.sum, self.entries.len(), cost, ceiling)?;
        let seq = self.next_seq.max(now);
        self.next_seq = seq.saturating_add(1);
        self.entries.push_back(Entry {
            time_ns: now,
            cost,
            seq,
        });
        self.sum = self.sum.saturating_add(cost);
        self.latest_ns = now;
        Ok(Reservation { cost, slot: seq })
    }

    /// Moves `reservation` to `now`, when the upstream answered (see
    /// [`SlidingWindow::redate`](super::sliding_window::SlidingWindow::redate)): its
    /// entry gives up the cost and a new entry at `now` takes it (the log stays in
    /// time order); an entry that already left is charged again.
    pub fn redate(&mut self, now: Nanos, reservation: Reservation) -> Reservation {
        let now = now.max(self.latest_ns);
        self.drop_expired(now);
        let found = self
            .entries
            .binary_search_by_key(&reservation.slot, |e| e.seq);
        if let Ok(i) = found {
            let entry = &mut self.entries[i];
            if entry.time_ns >= now {
                return reservation;
            }
            let moved = reservation.cost.min(entry.cost);
            entry.cost -= moved;
            self.sum -= moved;
            // Moved whole: the entry goes, so the log keeps one entry per charge
            // (its entry cap holds).
            if entry.cost == 0 {
                self.entries.remove(i);
            }
        }
        let seq = self.next_seq.max(now);
        self.next_seq = seq.saturating_add(1);
        self.entries.push_back(Entry {
            time_ns: now,
            cost: reservation.cost,
            seq,
        });
        self.sum = self.sum.saturating_add(reservation.cost);
        self.latest_ns = now;
        Reservation {
            cost: reservation.cost,
            slot: seq,
        }
    }

    /// Corrects the reservation's own entry to `actual` if it is still in the window;
    /// otherwise reports the correction as expired and changes nothing.
    pub fn settle(&mut self, now: Nanos, reservation: Reservation, actual: u64) -> Settlement {
        let now = now.max(self.latest_ns);
        let found = self
            .entries
            .binary_search_by_key(&reservation.slot, |e| e.seq);
        let index = found
            .ok()
            .filter(|&i| self.leaves_at(&self.entries[i]) > now);
        let mut out = Settlement::default();
        let Some(entry) = index.and_then(|i| self.entries.get_mut(i)) else {
            out.expired = reservation.cost.abs_diff(actual);
            return out;
        };
        if actual <= reservation.cost {
            out.refunded = (reservation.cost - actual).min(entry.cost);
            entry.cost -= out.refunded;
            self.sum -= out.refunded;
        } else {
            out.debt = actual - reservation.cost;
            entry.cost = entry.cost.saturating_add(out.debt);
            self.sum = self.sum.saturating_add(out.debt);
        }
        out
    }

    /// Used and remaining cost at `now`, and the time until the newest non-empty entry
    /// leaves the window.
    pub fn snapshot(&self, now: Nanos) -> Snapshot {
        let now = now.max(self.latest_ns);
        let (used, live) = self.live_totals(now);
        let capacity = self.spec.capacity;
        let remaining = capacity.saturating_sub(used);
        debug_assert!(remaining <= capacity);
        let reset_after_ns = if used == 0 {
            0
        } else {
            let newest = self.entries.iter().rev().take(live).find(|e| e.cost > 0);
            newest.map_or(0, |e| self.leaves_at(e).saturating_sub(now))
        };
        Snapshot {
            capacity,
            used,
            remaining,
            reset_after_ns,
        }
    }

    /// True when no entry is left in the window at `now` and every seq handed out is
    /// below `now`, so a new log's seqs (at least its reservation times) can never
    /// match this one's.
    pub fn is_at_rest(&self, now: Nanos) -> bool {
        let now = now.max(self.latest_ns);
        self.next_seq <= now && self.entries.back().is_none_or(|e| self.leaves_at(e) <= now)
    }

    /// Admission decision given the cost `used` and entry count `live` in the window.
    fn decide(
        &self,
        now: Nanos,
        used: u64,
        live: usize,
        cost: u64,
        ceiling: Ceiling,
    ) -> Result<(), Denial> {
        let limit = ceiling.of(self.spec.capacity);
        if limit == 0 || cost > limit {
            return Err(Denial::Never);
        }
        let fits =
            |used: u64, live: usize| live < MAX_LOG_ENTRIES && used.saturating_add(cost) <= limit;
        if fits(used, live) {
            return Ok(());
        }
        // Entries leave oldest first, those of one instant together.
        let (mut left, mut count, mut wait) = (used, live, None);
        let mut window = self
            .entries
            .iter()
            .skip(self.entries.len() - live)
            .peekable();
        while let Some(entry) = window.next() {
            left = left.saturating_sub(entry.cost);
            count -= 1;
            let same_instant = window.peek().is_some_and(|n| n.time_ns == entry.time_ns);
            if !same_instant && fits(left, count) {
                wait = Some(self.leaves_at(entry).saturating_sub(now));
                break;
            }
        }
        debug_assert!(wait.is_some(), "used {used} not explained by live entries");
        Err(Denial::RetryAfter(
            wait.unwrap_or(self.spec.window_ns).max(1),
        ))
    }

    /// Cost and count of the entries still in the window at `now`, without mutating.
    fn live_totals(&self, now: Nanos) -> (u64, usize) {
        let expired = self.entries.iter().take_while(|e| self.leaves_at(e) <= now);
        let (gone, count) = expired.fold((0u64, 0usize), |(s, c), e| {
            (s.saturating_add(e.cost), c + 1)
        });
        debug_assert!(gone <= self.sum, "expired more than the sum");
        (self.sum - gone, self.entries.len() - count)
    }

    /// Drops the entries that left the window at `now`.
    fn drop_expired(&mut self, now: Nanos) {
        while let Some(front) = self.entries.front().copied() {
            if self.leaves_at(&front) > now {
                break;
            }
            self.sum -= front.cost;
            self.entries.pop_front();
        }
    }

    /// First instant at which `entry` is out of the window.
    fn leaves_at(&self, entry: &Entry) -> Nanos {
        entry.time_ns.saturating_add(self.spec.window_ns)
    }
}

#[cfg(test)]
mod tests;
