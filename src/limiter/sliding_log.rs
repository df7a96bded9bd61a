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
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::limiter::Limiter;
    use crate::limiter::testkit::{self, batch};

    /// capacity 10 over W = 60 ns.
    fn log() -> SlidingLog {
        SlidingLog::try_new(LimitSpec::new(10, 60, Algorithm::SlidingLog)).unwrap()
    }

    #[test]
    fn rejects_unusable_specs() {
        let ok = LimitSpec::new(10, 60, Algorithm::SlidingLog);
        let err = |spec| SlidingLog::try_new(spec).unwrap_err();
        assert_eq!(
            err(LimitSpec { capacity: 0, ..ok }),
            SpecError::ZeroCapacity
        );
        assert_eq!(
            err(LimitSpec { window_ns: 0, ..ok }),
            SpecError::WindowTooShort
        );
        assert!(
            SlidingLog::try_new(LimitSpec {
                buckets: 0,
                burst: 0,
                ..ok
            })
            .is_ok()
        );
    }

    #[test]
    fn admits_up_to_capacity_then_retry_after_is_exact() {
        let mut l = log();
        l.reserve(0, 4, Ceiling::FULL).unwrap();
        l.reserve(15, 6, Ceiling::FULL).unwrap();
        assert_eq!(l.reserve(20, 1, Ceiling::FULL), Err(Denial::RetryAfter(40)));
        assert_eq!(l.check(59, 4, Ceiling::FULL), Err(Denial::RetryAfter(1)));
        assert_eq!(l.check(60, 4, Ceiling::FULL), Ok(()));
        assert_eq!(l.check(60, 5, Ceiling::FULL), Err(Denial::RetryAfter(15)));
    }

    #[test]
    fn entries_of_one_instant_leave_together() {
        let mut l = log();
        for cost in [3, 3, 4] {
            l.reserve(0, cost, Ceiling::FULL).unwrap();
        }
        assert_eq!(l.check(10, 1, Ceiling::FULL), Err(Denial::RetryAfter(50)));
    }

    #[test]
    fn batch_ceiling_and_never() {
        let mut l = log();
        l.reserve(0, 6, batch()).unwrap();
        assert_eq!(l.check(0, 1, batch()), Err(Denial::RetryAfter(60)));
        assert_eq!(l.check(0, 4, Ceiling::FULL), Ok(()));
        assert_eq!(l.check(0, 11, Ceiling::FULL), Err(Denial::Never));
        assert_eq!(l.check(0, 7, batch()), Err(Denial::Never));
    }

    #[test]
    fn redate_moves_the_entry_to_the_answer_and_recharges_what_had_left() {
        let mut l = log();
        let a = l.reserve(0, 4, Ceiling::FULL).unwrap();
        l.reserve(5, 3, Ceiling::FULL).unwrap();
        let a = l.redate(30, a);
        assert_eq!(a.cost, 4);
        assert_eq!(l.snapshot(30).used, 7);
        assert_eq!(
            l.snapshot(65).used,
            4,
            "the other 3 left at 65, the 4 count from 30"
        );
        assert_eq!(l.snapshot(89).used, 4);
        assert_eq!(l.snapshot(90).used, 0);
        // Settling the moved reservation corrects its new entry.
        assert_eq!(l.settle(40, a, 1).refunded, 3);
        assert_eq!(l.snapshot(40).used, 4);
        // One that already left is charged again.
        let mut l = log();
        let late = l.reserve(0, 5, Ceiling::FULL).unwrap();
        l.redate(70, late);
        assert_eq!(l.snapshot(129).used, 5);
        assert_eq!(l.snapshot(130).used, 0);
    }

    #[test]
    fn settle_refund_debt_and_expired() {
        let mut l = log();
        let a = l.reserve(0, 8, Ceiling::FULL).unwrap();
        let b = l.reserve(10, 2, Ceiling::FULL).unwrap();
        let c = l.reserve(10, 0, Ceiling::FULL).unwrap();
        assert_eq!(
            l.settle(20, a, 3),
            Settlement {
                refunded: 5,
                debt: 0,
                expired: 0
            }
        );
        assert_eq!(
            l.settle(20, b, 5),
            Settlement {
                refunded: 0,
                debt: 3,
                expired: 0
            }
        );
        assert_eq!(l.snapshot(20).used, 8);
        assert_eq!(l.snapshot(60).used, 5);
        let before = l.clone();
        assert_eq!(
            l.settle(70, c, 2),
            Settlement {
                refunded: 0,
                debt: 0,
                expired: 2
            }
        );
        assert_eq!(l, before);
        assert_eq!(
            l.settle(
                20,
                Reservation {
                    cost: 1,
                    slot: 12_345
                },
                0
            )
            .expired,
            1
        );
        assert_eq!(l, before);
    }

    #[test]
    fn seq_is_time_anchored_and_increasing() {
        let mut l = log();
        let a = l.reserve(1_000, 1, Ceiling::FULL).unwrap();
        let b = l.reserve(1_000, 1, Ceiling::FULL).unwrap();
        let c = l.reserve(5_000, 1, Ceiling::FULL).unwrap();
        assert_eq!((a.slot, b.slot, c.slot), (1_000, 1_001, 5_000));
    }

    #[test]
    fn seqs_of_a_dropped_log_never_match_a_new_one() {
        let mut l = SlidingLog::try_new(LimitSpec::new(10, 2, Algorithm::SlidingLog)).unwrap();
        let open: Vec<_> = (0..3)
            .map(|_| l.reserve(0, 1, Ceiling::FULL).unwrap())
            .collect();
        // The entries left at 2, but seq 2 was handed out: not at rest before 3.
        assert!(!l.is_at_rest(2));
        assert!(l.is_at_rest(3));
        let mut fresh = SlidingLog::try_new(*l.spec()).unwrap();
        fresh.reserve(3, 1, Ceiling::FULL).unwrap();
        let before = fresh.clone();
        for r in open {
            assert_eq!(fresh.settle(3, r, 0).expired, 1);
        }
        assert_eq!(fresh, before);
    }

    #[test]
    fn rest_after_a_full_window_and_snapshot() {
        let mut l = log();
        l.reserve(3, 2, Ceiling::FULL).unwrap();
        l.reserve(25, 3, Ceiling::FULL).unwrap();
        let snap = l.snapshot(30);
        assert_eq!(
            snap,
            Snapshot {
                capacity: 10,
                used: 5,
                remaining: 5,
                reset_after_ns: 55
            }
        );
        assert!(!l.is_at_rest(84));
        assert!(l.is_at_rest(85));
    }

    #[test]
    fn entry_count_is_bounded() {
        let mut l = SlidingLog::try_new(LimitSpec::new(10, 100, Algorithm::SlidingLog)).unwrap();
        for _ in 0..MAX_LOG_ENTRIES {
            l.reserve(0, 0, Ceiling::FULL).unwrap();
        }
        assert_eq!(l.reserve(0, 0, Ceiling::FULL), Err(Denial::RetryAfter(100)));
        assert_eq!(l.check(99, 1, Ceiling::FULL), Err(Denial::RetryAfter(1)));
        assert_eq!(l.check(100, 1, Ceiling::FULL), Ok(()));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Property 1: no window (s-W, s] ever holds more than the ceiling.
        #[test]
        fn prop_no_window_admits_more_than_the_ceiling(
            spec in testkit::spec(Algorithm::SlidingLog),
            steps in testkit::schedule(),
        ) {
            let mut limiter = Limiter::try_new(spec).unwrap();
            let records = testkit::run(&mut limiter, &steps, false, |_, _, _| Ok(()))?;
            testkit::windows_within_ceiling(&records, &spec)?;
        }

        /// Property 2 (and 3, checked by the runner): used equals the oracle's charges
        /// still in the window; expired settlements change nothing.
        #[test]
        fn prop_refunds_never_create_capacity(
            spec in testkit::spec(Algorithm::SlidingLog),
            steps in testkit::schedule(),
        ) {
            let mut limiter = Limiter::try_new(spec).unwrap();
            let window = spec.window_ns;
            testkit::run(&mut limiter, &steps, true, |l, now, records| {
                testkit::used_matches_oracle(l, now, records, |r, t| t < r.time_ns + window)
            })?;
        }
    }
}
