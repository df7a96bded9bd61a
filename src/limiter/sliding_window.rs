//! Bucketed, conservative sliding window (the default algorithm).
//!
//! The window W is cut into buckets of width `w = W / buckets` (rounded down). Bucket
//! `b` covers `[b*w, (b+1)*w)` and counts **in full** at time `t` while it overlaps the
//! window `(t-W, t]`, i.e. while `b*w <= t < (b+1)*w + W`: until its *end* leaves the
//! window. So the used amount at `t` is never below what any exact window ending at `t`
//! holds, and no window of length W ever admits more than the ceiling.
//!
//! State is a fixed ring of `ceil(W/w) + 1` slots (`buckets + 1` when `buckets`
//! divides W), each tagged with its absolute bucket index so stale slots are detected;
//! a running total makes a decision amortised O(1). Proofs: `docs/design/limiter.md`.

use super::{
    Algorithm, Ceiling, Denial, LimitSpec, Nanos, Reservation, Settlement, Snapshot, SpecError,
};

/// Tag of a slot that has never been written (no real bucket index reaches it).
const EMPTY: u64 = u64::MAX;

/// One ring slot: an absolute bucket index and the cost charged to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    bucket: u64,
    used: u64,
}

/// A bucketed sliding window; see the module docs for its promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindow {
    spec: LimitSpec,
    /// Bucket width in nanoseconds (>= 1).
    width_ns: Nanos,
    /// The ring; bucket `b` lives in `slots[b % len]` while `slots[..].bucket == b`.
    slots: Box<[Slot]>,
    /// Sum of the slots whose bucket is in `tail..=newest`.
    total: u64,
    /// Every bucket below `tail` has been subtracted from `total` (retired).
    tail: u64,
    /// Newest bucket ever charged, if any.
    newest: Option<u64>,
    /// Newest `now` a reservation was made at; earlier times are clamped to it.
    latest_ns: Nanos,
}

impl SlidingWindow {
    /// Builds an empty window, or says why the spec is unusable.
    pub fn try_new(spec: LimitSpec) -> Result<Self, SpecError> {
        spec.validate_for(Algorithm::SlidingWindow)?;
        let width_ns = spec.window_ns / u64::from(spec.buckets);
        // At most ceil(W/w) + 1 buckets overlap a window; <= 2 * MAX_BUCKETS + 1.
        let len = spec.window_ns.div_ceil(width_ns) + 1;
        let slot = Slot {
            bucket: EMPTY,
            used: 0,
        };
        let slots = (0..len).map(|_| slot).collect();
        let spec = LimitSpec {
            algorithm: Algorithm::SlidingWindow,
            ..spec
        };
        Ok(Self {
            spec,
            width_ns,
            slots,
            total: 0,
            tail: 0,
            newest: None,
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
        self.decide(now, self.used_at(now), cost, ceiling)
    }

    /// Charges `cost` to the bucket of `now` if it fits under `ceiling`.
    pub fn reserve(
        &mut self,
        now: Nanos,
        cost: u64,
        ceiling: Ceiling,
    ) -> Result<Reservation, Denial> {
        let now = now.max(self.latest_ns);
        self.retire(now);
        self.decide(now, self.total, cost, ceiling)?;
        Ok(self.charge_now(now, cost))
    }

    /// Moves `reservation` to the bucket of `now`, when the upstream answered: the
    /// provider counts a request when it arrives, which the gateway only knows
    /// happened by then. Left in its admission bucket, the charge would leave this
    /// window before it leaves the provider's whenever the way there takes longer
    /// than what was left of that bucket (the jepsen harness measured 41 of 40
    /// over slow links). Cost still in the old bucket moves (the total is
    /// unchanged); cost whose bucket already left the window is charged again, as
    /// a debt (the provider still counts it). Never checked against a ceiling: the
    /// request is already out.
    pub fn redate(&mut self, now: Nanos, reservation: Reservation) -> Reservation {
        let now = now.max(self.latest_ns);
        let old = reservation.slot;
        if old >= now / self.width_ns {
            return reservation;
        }
        self.retire(now);
        let index = self.index(old);
        if old >= self.tail
            && self.newest.is_some_and(|n| old <= n)
            && self.slots[index].bucket == old
        {
            let moved = reservation.cost.min(self.slots[index].used);
            self.slots[index].used -= moved;
            self.total -= moved;
        }
        self.charge_now(now, reservation.cost)
    }

    /// Adds `cost` to the bucket of `now` (already retired to `now`).
    fn charge_now(&mut self, now: Nanos, cost: u64) -> Reservation {
        self.latest_ns = now;
        let bucket = now / self.width_ns;
        let index = self.index(bucket);
        let slot = &mut self.slots[index];
        if slot.bucket != bucket {
            debug_assert!(
                slot.bucket == EMPTY || slot.bucket < self.tail,
                "live slot reused"
            );
            *slot = Slot { bucket, used: 0 };
        }
        slot.used = slot.used.saturating_add(cost);
        self.total = self.total.saturating_add(cost);
        self.newest = Some(self.newest.map_or(bucket, |n| n.max(bucket)));
        debug_assert!(self.total >= self.slots[index].used, "total below a bucket");
        Reservation { cost, slot: bucket }
    }

    /// Corrects `reservation` to `actual` in the reservation's own bucket, if that bucket
    /// still counts at `now`; otherwise reports the correction as expired and changes
    /// nothing. A refund never takes a bucket below zero.
    pub fn settle(&mut self, now: Nanos, reservation: Reservation, actual: u64) -> Settlement {
        let now = now.max(self.latest_ns);
        let bucket = reservation.slot;
        let index = self.index(bucket);
        let live = bucket >= self.tail.max(self.oldest_at(now))
            && self.newest.is_some_and(|n| bucket <= n)
            && self.slots[index].bucket == bucket;
        let mut out = Settlement::default();
        if !live {
            out.expired = reservation.cost.abs_diff(actual);
            return out;
        }
        let slot = &mut self.slots[index];
        if actual <= reservation.cost {
            out.refunded = (reservation.cost - actual).min(slot.used);
            slot.used -= out.refunded;
            self.total -= out.refunded;
        } else {
            out.debt = actual - reservation.cost;
            slot.used = slot.used.saturating_add(out.debt);
            self.total = self.total.saturating_add(out.debt);
        }
        out
    }

    /// Used and remaining cost at `now`, and the time until the newest non-empty bucket
    /// leaves the window.
    pub fn snapshot(&self, now: Nanos) -> Snapshot {
        let now = now.max(self.latest_ns);
        let used = self.used_at(now);
        let capacity = self.spec.capacity;
        let remaining = capacity.saturating_sub(used);
        debug_assert!(remaining <= capacity);
        let reset_after_ns = if used == 0 {
            0
        } else {
            self.live_buckets(now)
                .rev()
                .find(|&(_, used)| used > 0)
                .map_or(0, |(b, _)| self.leaves_at(b).saturating_sub(now))
        };
        Snapshot {
            capacity,
            used,
            remaining,
            reset_after_ns,
        }
    }

    /// True when no bucket charged so far still counts at `now`.
    pub fn is_at_rest(&self, now: Nanos) -> bool {
        let now = now.max(self.latest_ns);
        self.newest.is_none_or(|n| self.leaves_at(n) <= now)
    }

    /// Admission decision given the amount `used` at `now`.
    fn decide(&self, now: Nanos, used: u64, cost: u64, ceiling: Ceiling) -> Result<(), Denial> {
        let limit = ceiling.of(self.spec.capacity);
        if limit == 0 || cost > limit {
            return Err(Denial::Never);
        }
        if used.saturating_add(cost) <= limit {
            return Ok(());
        }
        // Buckets leave oldest first; the wait ends when enough of them have left.
        let mut left = used;
        let wait = self.live_buckets(now).find_map(|(bucket, charged)| {
            left = left.saturating_sub(charged);
            (charged > 0 && left.saturating_add(cost) <= limit)
                .then(|| self.leaves_at(bucket).saturating_sub(now))
        });
        debug_assert!(wait.is_some(), "used {used} not explained by live buckets");
        let fallback = || {
            self.newest
                .map_or(0, |n| self.leaves_at(n).saturating_sub(now))
        };
        Err(Denial::RetryAfter(wait.unwrap_or_else(fallback).max(1)))
    }

    /// Buckets that count at `now`, oldest first, as `(absolute bucket index, cost)`,
    /// and the bucket width: what a node publishes as its share of a cluster-wide
    /// counter (docs/design/counters.md).
    pub fn export(&self, now: Nanos) -> (Nanos, Vec<(u64, u64)>) {
        (self.width_ns, self.live_buckets(now).collect())
    }

    /// Amount counted at `now` without mutating: the total minus buckets retired since.
    fn used_at(&self, now: Nanos) -> u64 {
        let gone: u64 = self.retiring(now).map(|(_, used)| used).sum();
        debug_assert!(gone <= self.total, "retiring more than the total");
        self.total - gone
    }

    /// Subtracts buckets that no longer count at `now` from the total.
    fn retire(&mut self, now: Nanos) {
        let gone: u64 = self.retiring(now).map(|(_, used)| used).sum();
        debug_assert!(gone <= self.total, "retiring more than the total");
        self.total -= gone;
        self.tail = self.tail.max(self.oldest_at(now));
    }

    /// Charged buckets in `tail..oldest_at(now)` (at most the ring length).
    fn retiring(&self, now: Nanos) -> impl Iterator<Item = (u64, u64)> + '_ {
        let end = self
            .oldest_at(now)
            .min(self.newest.map_or(0, |n| n.saturating_add(1)));
        self.charged(self.tail..end.max(self.tail))
    }

    /// Charged buckets that count at `now`, oldest first.
    fn live_buckets(&self, now: Nanos) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        let start = self.tail.max(self.oldest_at(now));
        let end = self
            .newest
            .map_or(start, |n| n.saturating_add(1))
            .max(start);
        self.charged(start..end)
    }

    /// The slots of `range` whose tag matches, as `(bucket, used)`.
    fn charged(
        &self,
        range: std::ops::Range<u64>,
    ) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        range.filter_map(move |b| {
            let slot = self.slots[self.index(b)];
            (slot.bucket == b).then_some((b, slot.used))
        })
    }

    /// Oldest bucket that still counts at `now`: the smallest `b` with
    /// `(b+1)*w + W > now`.
    fn oldest_at(&self, now: Nanos) -> u64 {
        now.checked_sub(self.spec.window_ns)
            .map_or(0, |t| t / self.width_ns)
    }

    /// First instant at which bucket `b` no longer counts: its end plus W.
    fn leaves_at(&self, bucket: u64) -> Nanos {
        bucket
            .saturating_add(1)
            .saturating_mul(self.width_ns)
            .saturating_add(self.spec.window_ns)
    }

    /// Ring position of bucket `b`.
    fn index(&self, bucket: u64) -> usize {
        // The ring length came from a usize, so the remainder fits.
        (bucket % self.slots.len() as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::limiter::Limiter;
    use crate::limiter::testkit::{self, batch};

    /// capacity 10 over W = 60 ns in 6 buckets of 10 ns.
    fn window() -> SlidingWindow {
        let spec = LimitSpec {
            buckets: 6,
            ..LimitSpec::new(10, 60, Algorithm::SlidingWindow)
        };
        SlidingWindow::try_new(spec).unwrap()
    }

    #[test]
    fn rejects_unusable_specs() {
        let ok = LimitSpec {
            buckets: 6,
            ..LimitSpec::new(10, 60, Algorithm::SlidingWindow)
        };
        let err = |spec| SlidingWindow::try_new(spec).unwrap_err();
        assert_eq!(
            err(LimitSpec { capacity: 0, ..ok }),
            SpecError::ZeroCapacity
        );
        assert_eq!(
            err(LimitSpec { window_ns: 0, ..ok }),
            SpecError::WindowTooShort
        );
        assert_eq!(
            err(LimitSpec { buckets: 0, ..ok }),
            SpecError::WindowTooShort
        );
        assert_eq!(
            err(LimitSpec { window_ns: 5, ..ok }),
            SpecError::WindowTooShort
        );
        let many = LimitSpec {
            buckets: LimitSpec::MAX_BUCKETS + 1,
            window_ns: 1 << 40,
            ..ok
        };
        assert_eq!(err(many), SpecError::TooManyBuckets);
        // Uneven widths are fine: W = 10 in 4 buckets of 2 ns, a ring of 6 slots.
        let uneven = SlidingWindow::try_new(LimitSpec {
            window_ns: 10,
            buckets: 4,
            ..ok
        })
        .unwrap();
        assert_eq!((uneven.width_ns, uneven.slots.len()), (2, 6));
        assert_eq!(window().slots.len(), 7);
    }

    #[test]
    fn admits_up_to_capacity_then_retry_after_is_exact() {
        let mut w = window();
        w.reserve(0, 4, Ceiling::FULL).unwrap();
        w.reserve(15, 6, Ceiling::FULL).unwrap();
        // Bucket 0 (4) leaves at its end (10) + W (60) = 70; bucket 1 (6) at 80.
        assert_eq!(w.reserve(20, 1, Ceiling::FULL), Err(Denial::RetryAfter(50)));
        assert_eq!(w.check(69, 4, Ceiling::FULL), Err(Denial::RetryAfter(1)));
        assert_eq!(w.check(70, 4, Ceiling::FULL), Ok(()));
        assert_eq!(w.check(70, 5, Ceiling::FULL), Err(Denial::RetryAfter(10)));
        assert_eq!(w.check(80, 10, Ceiling::FULL), Ok(()));
    }

    #[test]
    fn bucket_counts_in_full_until_its_end_leaves() {
        let mut w = window();
        w.reserve(0, 10, Ceiling::FULL).unwrap();
        // An exact window would release the event at 60; the bucket ends at 10.
        assert_eq!(w.check(60, 1, Ceiling::FULL), Err(Denial::RetryAfter(10)));
        assert_eq!(w.snapshot(60).used, 10);
        assert_eq!(w.snapshot(70).used, 0);
    }

    #[test]
    fn batch_ceiling_leaves_headroom_for_interactive() {
        let mut w = window();
        w.reserve(0, 6, batch()).unwrap();
        assert_eq!(w.check(0, 1, batch()), Err(Denial::RetryAfter(70)));
        assert_eq!(w.reserve(0, 4, Ceiling::FULL).map(|r| r.cost), Ok(4));
        assert_eq!(w.check(0, 1, Ceiling::FULL), Err(Denial::RetryAfter(70)));
    }

    #[test]
    fn never_when_cost_exceeds_the_ceiling() {
        let w = window();
        assert_eq!(w.check(0, 11, Ceiling::FULL), Err(Denial::Never));
        assert_eq!(w.check(0, 7, batch()), Err(Denial::Never));
        assert_eq!(w.check(0, 6, batch()), Ok(()));
        assert_eq!(w.check(0, 0, Ceiling::from_share(0.0)), Err(Denial::Never));
    }

    #[test]
    fn settle_refunds_and_debts_hit_the_reservation_bucket() {
        let mut w = window();
        let a = w.reserve(0, 8, Ceiling::FULL).unwrap();
        let b = w.reserve(12, 2, Ceiling::FULL).unwrap();
        assert_eq!((a.slot, b.slot), (0, 1));
        let out = w.settle(30, a, 3);
        assert_eq!(
            out,
            Settlement {
                refunded: 5,
                debt: 0,
                expired: 0
            }
        );
        assert_eq!(w.snapshot(30).used, 5);
        let out = w.settle(30, b, 4);
        assert_eq!(
            out,
            Settlement {
                refunded: 0,
                debt: 2,
                expired: 0
            }
        );
        // Bucket 0 (3) leaves at 70, bucket 1 (4) at 80: the debt went to bucket 1.
        assert_eq!(w.snapshot(70).used, 4);
        assert_eq!(w.snapshot(80).used, 0);
    }

    #[test]
    fn settle_after_the_bucket_left_is_expired_and_changes_nothing() {
        let mut w = window();
        let old = w.reserve(0, 5, Ceiling::FULL).unwrap();
        w.reserve(65, 3, Ceiling::FULL).unwrap();
        let before = w.clone();
        assert_eq!(
            w.settle(70, old, 1),
            Settlement {
                refunded: 0,
                debt: 0,
                expired: 4
            }
        );
        assert_eq!(w, before);
        let forged = Reservation { cost: 3, slot: 99 };
        assert_eq!(w.settle(70, forged, 0).expired, 3);
        assert_eq!(w, before);
    }

    #[test]
    fn redate_moves_the_charge_to_the_answer_and_recharges_what_had_left() {
        let mut w = window();
        let r = w.reserve(5, 4, Ceiling::FULL).unwrap();
        w.reserve(6, 3, Ceiling::FULL).unwrap();
        // Answered in the same bucket: nothing to move.
        let r = w.redate(8, r);
        assert_eq!(r, Reservation { cost: 4, slot: 0 });
        // Answered at 25: the 4 move from bucket 0 to bucket 2; the total stays 7.
        let moved = w.redate(25, r);
        assert_eq!(moved, Reservation { cost: 4, slot: 2 });
        assert_eq!(w.snapshot(25).used, 7);
        // Bucket 0 (the other 3) leaves at 70; the moved 4 count until 90.
        assert_eq!(w.snapshot(70).used, 4);
        assert_eq!(w.snapshot(89).used, 4);
        assert_eq!(w.snapshot(90).used, 0);
        // Settling the moved reservation corrects its new bucket.
        assert_eq!(w.settle(30, moved, 1).refunded, 3);
        assert_eq!(w.snapshot(70).used, 1);
        // A charge whose bucket already left is charged again (the provider may
        // still count it): a debt in the bucket of the answer.
        let mut w = window();
        let late = w.reserve(0, 5, Ceiling::FULL).unwrap();
        assert_eq!(w.snapshot(75).used, 0);
        let again = w.redate(75, late);
        assert_eq!(again, Reservation { cost: 5, slot: 7 });
        assert_eq!(w.snapshot(75).used, 5);
        assert_eq!(w.snapshot(139).used, 5);
    }

    #[test]
    fn rest_after_a_full_window() {
        let mut w = window();
        assert!(w.is_at_rest(0));
        let r = w.reserve(5, 2, Ceiling::FULL).unwrap();
        w.settle(6, r, 0);
        // Refunded to zero, but the bucket could still take a debt: not at rest.
        assert!(!w.is_at_rest(69));
        assert!(w.is_at_rest(70));
    }

    #[test]
    fn snapshot_reports_used_remaining_and_reset() {
        let mut w = window();
        w.reserve(3, 2, Ceiling::FULL).unwrap();
        w.reserve(25, 3, Ceiling::FULL).unwrap();
        let snap = w.snapshot(30);
        assert_eq!(
            snap,
            Snapshot {
                capacity: 10,
                used: 5,
                remaining: 5,
                reset_after_ns: 60
            }
        );
        let snap = w.snapshot(75);
        assert_eq!(
            snap,
            Snapshot {
                capacity: 10,
                used: 3,
                remaining: 7,
                reset_after_ns: 15
            }
        );
    }

    #[test]
    fn earlier_time_is_clamped_to_the_latest() {
        let mut w = window();
        w.reserve(50, 10, Ceiling::FULL).unwrap();
        // Evaluated at 50: bucket 5 leaves at 60 + 60 = 120.
        assert_eq!(w.check(0, 1, Ceiling::FULL), Err(Denial::RetryAfter(70)));
        let late = w.reserve(20, 0, Ceiling::FULL).unwrap();
        assert_eq!(late.slot, 5);
    }

    fn counts(spec: &LimitSpec) -> impl Fn(&testkit::Record, Nanos) -> bool {
        let width = spec.window_ns / u64::from(spec.buckets);
        let window = spec.window_ns;
        move |r, t| t < (r.time_ns / width + 1) * width + window
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Property 1: no window (s-W, s] ever holds more than the ceiling.
        #[test]
        fn prop_no_window_admits_more_than_the_ceiling(
            spec in testkit::spec(Algorithm::SlidingWindow),
            steps in testkit::schedule(),
        ) {
            let mut limiter = Limiter::try_new(spec).unwrap();
            let records = testkit::run(&mut limiter, &steps, false, |_, _, _| Ok(()))?;
            testkit::windows_within_ceiling(&records, &spec)?;
        }

        /// Re-dating: at every instant, what the window counts covers each request
        /// for a window after it was answered (the latest the provider can have
        /// counted it), and each unanswered one for a window after its admission,
        /// settled or not.
        #[test]
        fn prop_redated_charges_count_a_window_from_the_answer(
            spec in testkit::spec(Algorithm::SlidingWindow),
            steps in prop::collection::vec(
                (prop_oneof![3 => 0u64..=20, 1 => 0u64..=400], 0u64..=12, any::<bool>(), any::<usize>()),
                1..100,
            ),
        ) {
            let mut w = SlidingWindow::try_new(spec).unwrap();
            let window_ns = spec.window_ns;
            // (reservation, admitted at, answered at)
            let mut open: Vec<(Reservation, Nanos, Option<Nanos>)> = Vec::new();
            let mut now = 0;
            for (advance, cost, answer, pick) in steps {
                now += advance;
                if answer && !open.is_empty() {
                    let i = pick % open.len();
                    if open[i].2.is_none() {
                        let r = std::mem::replace(&mut open[i].0, Reservation { cost: 0, slot: 0 });
                        open[i].0 = w.redate(now, r);
                        open[i].2 = Some(now);
                    }
                } else if let Ok(r) = w.reserve(now, cost, Ceiling::FULL) {
                    open.push((r, now, None));
                }
                let owed: u64 = (open.iter())
                    .filter(|(_, admitted, answered)| now < answered.unwrap_or(*admitted) + window_ns)
                    .map(|(r, _, _)| r.cost)
                    .sum();
                prop_assert!(
                    w.snapshot(now).used >= owed,
                    "at {now}: counts {} < owed {owed}",
                    w.snapshot(now).used
                );
            }
        }

        /// Property 2 (and 3, checked by the runner): used never drops below the
        /// oracle's charges; expired settlements change nothing.
        #[test]
        fn prop_refunds_never_create_capacity(
            spec in testkit::spec(Algorithm::SlidingWindow),
            steps in testkit::schedule(),
        ) {
            let mut limiter = Limiter::try_new(spec).unwrap();
            let counts = counts(&spec);
            testkit::run(&mut limiter, &steps, true, |l, now, records| {
                testkit::used_matches_oracle(l, now, records, &counts)
            })?;
        }
    }
}
