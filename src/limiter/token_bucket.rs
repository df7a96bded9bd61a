//! GCRA token bucket with a burst, in exact integer arithmetic.
//!
//! Rate `capacity / W`, emission interval `T = W / capacity`. Time is kept *scaled by
//! capacity* (`ns * capacity`, in u128), so one unit of cost is exactly `W` scaled units
//! and every comparison and retry-after is exact to the nanosecond, with no float drift.
//!
//! A cost `n` at `now` is admitted iff `max(TAT, now) + n*T - now <= B'*T`, where
//! `B' = ceiling.of(burst)`. Promise: for admitted costs settled at or below their
//! reservation, any closed interval of length `d` holds `W * admitted <= W * B +
//! capacity * d`, i.e. `admitted <= B + floor(capacity * d / W)`; no other rounding.
//! Proofs and the settlement floor: `docs/design/limiter.md`.

use super::{
    Algorithm, Ceiling, Denial, LimitSpec, Nanos, Reservation, Settlement, Snapshot, SpecError,
};

/// A GCRA limiter; see the module docs for its promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    spec: LimitSpec,
    /// Theoretical arrival time, scaled by capacity (`ns * capacity`).
    tat: u128,
    /// Newest `now` a reservation was made at; earlier times are clamped to it.
    last_arrival_ns: Nanos,
    /// Cost charged so far (reservations and debts, never reduced by refunds),
    /// re-anchored to at least `now` in ns whenever the bucket restarts from rest, so
    /// slots are time-anchored (see `is_at_rest`).
    charged: u64,
    /// `charged` when the bucket last restarted from rest: older slots are expired.
    epoch: u64,
}

impl TokenBucket {
    /// Builds a full bucket (at rest), or says why the spec is unusable.
    pub fn try_new(spec: LimitSpec) -> Result<Self, SpecError> {
        spec.validate_for(Algorithm::TokenBucket)?;
        let spec = LimitSpec {
            algorithm: Algorithm::TokenBucket,
            ..spec
        };
        Ok(Self {
            spec,
            tat: 0,
            last_arrival_ns: 0,
            charged: 0,
            epoch: 0,
        })
    }

    /// The validated spec.
    pub fn spec(&self) -> &LimitSpec {
        &self.spec
    }

    /// Would `cost` be admitted under `ceiling` at `now`? Changes nothing.
    pub fn check(&self, now: Nanos, cost: u64, ceiling: Ceiling) -> Result<(), Denial> {
        self.decide(now.max(self.last_arrival_ns), cost, ceiling)
            .map(|_| ())
    }

    /// Moves the TAT forward by `cost` emission intervals if the result stays within
    /// the burst allowed by `ceiling`. The slot is the charge counter after this cost.
    pub fn reserve(
        &mut self,
        now: Nanos,
        cost: u64,
        ceiling: Ceiling,
    ) -> Result<Reservation, Denial> {
        let now = now.max(self.last_arrival_ns);
        let tat = self.decide(now, cost, ceiling)?;
        if self.tat <= self.scaled(now) {
            // Restart from rest: everything charged before has drained. Anchoring to `now`
            // keeps slots of an instance dropped at rest below this one's.
            self.charged = self.charged.saturating_add(1).max(now);
            self.epoch = self.charged;
        }
        self.tat = tat;
        self.charged = self.charged.saturating_add(cost);
        self.last_arrival_ns = now;
        Ok(Reservation {
            cost,
            slot: self.charged,
        })
    }

    /// Re-dating to the upstream's answer changes nothing here: GCRA spaces
    /// admissions at the rate, with no window for a charge to leave early (and
    /// cluster modes require `sliding-window`).
    pub fn redate(&mut self, _now: Nanos, reservation: Reservation) -> Reservation {
        reservation
    }

    /// Moves the TAT back by the refund or forward by the debt. A refund never takes
    /// the TAT below `last arrival + everything charged after this reservation`, the
    /// least the later reservations imply on their own. A reservation made before the
    /// bucket last restarted from rest, or settled while it is at rest, has expired:
    /// the correction is reported in `expired` and nothing changes.
    pub fn settle(&mut self, now: Nanos, reservation: Reservation, actual: u64) -> Settlement {
        let now = now.max(self.last_arrival_ns);
        let slot = reservation.slot;
        let live = self.tat > self.scaled(now) && self.epoch <= slot && slot <= self.charged;
        let mut out = Settlement::default();
        if !live {
            out.expired = reservation.cost.abs_diff(actual);
            return out;
        }
        if actual <= reservation.cost {
            out.refunded = reservation.cost - actual;
            let later = self.charged - slot;
            let floor = self
                .scaled(self.last_arrival_ns)
                .saturating_add(self.units(later));
            let floor = floor.min(self.tat);
            self.tat = self.tat.saturating_sub(self.units(out.refunded)).max(floor);
        } else {
            out.debt = actual - reservation.cost;
            self.tat = self.tat.saturating_add(self.units(out.debt));
            self.charged = self.charged.saturating_add(out.debt);
        }
        out
    }

    /// Burst-relative figures: `capacity` is the burst, `used` the burst consumed
    /// (rounded up), `remaining` the largest cost admissible now, `reset_after_ns` the
    /// time until the bucket is full again.
    pub fn snapshot(&self, now: Nanos) -> Snapshot {
        let now = now.max(self.last_arrival_ns);
        let consumed = self.tat.saturating_sub(self.scaled(now));
        let capacity = self.spec.burst;
        let used = saturate(consumed.div_ceil(u128::from(self.spec.window_ns)));
        let remaining = capacity.saturating_sub(used);
        debug_assert!(remaining <= capacity);
        let reset_after_ns = saturate(consumed.div_ceil(u128::from(self.spec.capacity)));
        Snapshot {
            capacity,
            used,
            remaining,
            reset_after_ns,
        }
    }

    /// True when the bucket is full (TAT not after `now`) and every slot handed out is
    /// below `now` in ns, so a new instance's slots (anchored at or after its first
    /// reservation time) can never collide with this one's.
    pub fn is_at_rest(&self, now: Nanos) -> bool {
        let now = now.max(self.last_arrival_ns);
        self.tat <= self.scaled(now) && (self.charged == 0 || self.charged < now)
    }

    /// The TAT after admitting `cost` at `now`, or why not.
    fn decide(&self, now: Nanos, cost: u64, ceiling: Ceiling) -> Result<u128, Denial> {
        let burst = ceiling.of(self.spec.burst);
        if burst == 0 || cost > burst {
            return Err(Denial::Never);
        }
        let now_scaled = self.scaled(now);
        let tat = self.tat.max(now_scaled).saturating_add(self.units(cost));
        let allowance = self.units(burst);
        if tat - now_scaled <= allowance {
            return Ok(tat);
        }
        // Denied, so self.tat > now: the cost fits from the first t with
        // t * capacity >= tat - allowance, and not one nanosecond before.
        let fits_at = (tat - allowance).div_ceil(u128::from(self.spec.capacity));
        debug_assert!(fits_at > u128::from(now), "denied but fits now");
        Err(Denial::RetryAfter(saturate(fits_at - u128::from(now))))
    }

    /// `t` in scaled units (`ns * capacity`).
    fn scaled(&self, t: Nanos) -> u128 {
        u128::from(t) * u128::from(self.spec.capacity)
    }

    /// `cost` in scaled units (`cost * W`: one emission interval per unit of cost).
    fn units(&self, cost: u64) -> u128 {
        u128::from(cost) * u128::from(self.spec.window_ns)
    }
}

/// `x` as u64, saturating.
fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

#[cfg(test)]
impl TokenBucket {
    /// The TAT in scaled units, for the oracles.
    pub(crate) fn tat_scaled(&self) -> u128 {
        self.tat
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::limiter::Limiter;
    use crate::limiter::testkit::{self, Outcome, Record, batch};

    /// 10 per 100 ns (emission interval 10 ns), burst 4.
    fn bucket() -> TokenBucket {
        let spec = LimitSpec {
            burst: 4,
            ..LimitSpec::new(10, 100, Algorithm::TokenBucket)
        };
        TokenBucket::try_new(spec).unwrap()
    }

    #[test]
    fn rejects_unusable_specs() {
        let ok = LimitSpec::new(10, 100, Algorithm::TokenBucket);
        let err = |spec| TokenBucket::try_new(spec).unwrap_err();
        assert_eq!(
            err(LimitSpec { capacity: 0, ..ok }),
            SpecError::ZeroCapacity
        );
        assert_eq!(
            err(LimitSpec { window_ns: 0, ..ok }),
            SpecError::WindowTooShort
        );
        assert_eq!(err(LimitSpec { burst: 0, ..ok }), SpecError::BadBurst);
        assert_eq!(err(LimitSpec { burst: 11, ..ok }), SpecError::BadBurst);
        // Bucket count is ignored here.
        assert!(TokenBucket::try_new(LimitSpec { buckets: 0, ..ok }).is_ok());
    }

    #[test]
    fn admits_the_burst_then_one_per_emission_interval() {
        let mut b = bucket();
        b.reserve(0, 4, Ceiling::FULL).unwrap();
        assert_eq!(b.reserve(0, 1, Ceiling::FULL), Err(Denial::RetryAfter(10)));
        assert_eq!(b.check(9, 1, Ceiling::FULL), Err(Denial::RetryAfter(1)));
        assert_eq!(b.check(10, 1, Ceiling::FULL), Ok(()));
        assert_eq!(b.check(10, 2, Ceiling::FULL), Err(Denial::RetryAfter(10)));
    }

    #[test]
    fn retry_after_is_exact_without_drift() {
        // 3 per 10 ns: emission interval 10/3 ns, not a whole number of ns.
        let spec = LimitSpec {
            burst: 2,
            ..LimitSpec::new(3, 10, Algorithm::TokenBucket)
        };
        let mut b = TokenBucket::try_new(spec).unwrap();
        b.reserve(0, 2, Ceiling::FULL).unwrap();
        let mut now = 0;
        for k in 1..=30_000u64 {
            match b.check(now, 1, Ceiling::FULL) {
                Err(Denial::RetryAfter(d)) => now += d,
                other => panic!("expected a wait, got {other:?}"),
            }
            // The k-th unit after the burst is due at exactly k * 10/3 ns, rounded up.
            assert_eq!(now, (k * 10).div_ceil(3), "admission {k} drifted");
            b.reserve(now, 1, Ceiling::FULL).unwrap();
        }
    }

    #[test]
    fn batch_ceiling_limits_the_burst_fill() {
        let mut b = bucket();
        // ceiling.of(4) at 60% = 2.
        b.reserve(0, 2, batch()).unwrap();
        assert_eq!(b.check(0, 1, batch()), Err(Denial::RetryAfter(10)));
        assert_eq!(b.reserve(0, 2, Ceiling::FULL).map(|r| r.cost), Ok(2));
    }

    #[test]
    fn never_when_cost_exceeds_the_ceiling_of_the_burst() {
        let b = bucket();
        assert_eq!(b.check(0, 5, Ceiling::FULL), Err(Denial::Never));
        assert_eq!(b.check(0, 3, batch()), Err(Denial::Never));
        assert_eq!(b.check(0, 0, Ceiling::from_share(0.1)), Err(Denial::Never));
    }

    #[test]
    fn settle_moves_the_tat_back_or_forward() {
        let mut b = bucket();
        let r = b.reserve(0, 4, Ceiling::FULL).unwrap();
        assert_eq!(
            b.settle(5, r, 1),
            Settlement {
                refunded: 3,
                debt: 0,
                expired: 0
            }
        );
        assert_eq!(b.tat, 10 * 10);
        let r = b.reserve(5, 2, Ceiling::FULL).unwrap();
        assert_eq!(
            b.settle(6, r, 3),
            Settlement {
                refunded: 0,
                debt: 1,
                expired: 0
            }
        );
        assert_eq!(b.tat, 40 * 10);
    }

    #[test]
    fn refund_never_goes_below_what_later_reservations_imply() {
        let mut b = bucket();
        let first = b.reserve(0, 4, Ceiling::FULL).unwrap();
        b.reserve(20, 2, Ceiling::FULL).unwrap();
        assert_eq!(b.tat, 60 * 10);
        b.settle(20, first, 0);
        // As if the first had cost 0: the second alone, from 20, ends at 40.
        assert_eq!(b.tat, 40 * 10);
    }

    #[test]
    fn settle_after_drain_or_restart_is_expired_and_changes_nothing() {
        let mut b = bucket();
        let drained = b.reserve(0, 1, Ceiling::FULL).unwrap();
        let before = b.clone();
        assert_eq!(b.settle(10, drained, 3).expired, 2);
        assert_eq!(b, before);
        let old = b.reserve(10, 1, Ceiling::FULL).unwrap();
        b.reserve(50, 3, Ceiling::FULL).unwrap();
        let before = b.clone();
        assert_eq!(
            b.settle(50, old, 0),
            Settlement {
                refunded: 0,
                debt: 0,
                expired: 1
            }
        );
        assert_eq!(b, before);
    }

    #[test]
    fn slots_of_a_dropped_instance_expire_in_a_new_one() {
        let mut b = bucket();
        let open = b.reserve(0, 1, Ceiling::FULL).unwrap();
        // Refunds let the charge counter run ahead of the clock...
        for _ in 0..20 {
            let r = b.reserve(0, 3, Ceiling::FULL).unwrap();
            b.settle(0, r, 0);
        }
        assert!(b.tat <= 10 * 10 && b.charged > 60);
        // ...so rest waits until the clock has passed every slot handed out.
        assert!(!b.is_at_rest(b.charged));
        let dropped_at = b.charged + 1;
        assert!(b.is_at_rest(dropped_at));
        let mut fresh = bucket();
        fresh.reserve(dropped_at, 4, Ceiling::FULL).unwrap();
        let before = fresh.clone();
        assert_eq!(fresh.settle(dropped_at, open, 0).expired, 1);
        assert_eq!(fresh, before);
    }

    #[test]
    fn snapshot_is_relative_to_the_burst() {
        let mut b = bucket();
        b.reserve(0, 3, Ceiling::FULL).unwrap();
        let snap = b.snapshot(5);
        assert_eq!(
            snap,
            Snapshot {
                capacity: 4,
                used: 3,
                remaining: 1,
                reset_after_ns: 25
            }
        );
        assert!(!b.is_at_rest(29));
        assert!(b.is_at_rest(30));
        assert_eq!(b.snapshot(30).used, 0);
    }

    /// The GCRA state with every record at its current charge: settled refunds at the
    /// actual cost (applied or not), debts only where applied.
    fn ideal_tat(spec: &LimitSpec, records: &[Record]) -> u128 {
        let (c, w) = (u128::from(spec.capacity), u128::from(spec.window_ns));
        records.iter().fold(0u128, |tat, r| {
            let cost = match r.outcome {
                Outcome::Open => r.reserved,
                Outcome::Applied(actual) => actual,
                Outcome::Expired(actual) => actual.min(r.reserved),
            };
            tat.max(u128::from(r.time_ns) * c) + u128::from(cost) * w
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Property 1: any closed interval of length d holds
        /// W * admitted <= W * ceiling.of(burst) + capacity * d.
        #[test]
        fn prop_no_interval_admits_more_than_burst_plus_rate(
            spec in testkit::spec(Algorithm::TokenBucket),
            steps in testkit::schedule(),
        ) {
            let mut limiter = Limiter::try_new(spec).unwrap();
            let records = testkit::run(&mut limiter, &steps, false, |_, _, _| Ok(()))?;
            let (c, w) = (u128::from(spec.capacity), u128::from(spec.window_ns));
            for (k, last) in records.iter().enumerate() {
                let mut admitted = 0u128;
                for first in records[..=k].iter().rev() {
                    admitted += u128::from(first.real());
                    let d = u128::from(last.time_ns - first.time_ns);
                    let bound = w * u128::from(last.ceiling.of(spec.burst)) + c * d;
                    prop_assert!(w * admitted <= bound, "interval [{}, {}]", first.time_ns, last.time_ns);
                }
            }
        }

        /// Property 2 (and 3, checked by the runner): the TAT never falls below the
        /// ideal GCRA state of the charges that remain.
        #[test]
        fn prop_refunds_never_create_capacity(
            spec in testkit::spec(Algorithm::TokenBucket),
            steps in testkit::schedule(),
        ) {
            let mut limiter = Limiter::try_new(spec).unwrap();
            testkit::run(&mut limiter, &steps, true, |l, now, records| {
                let Limiter::TokenBucket(b) = l else { unreachable!() };
                let now_scaled = u128::from(now) * u128::from(spec.capacity);
                let ideal = ideal_tat(&spec, records).max(now_scaled);
                prop_assert!(b.tat_scaled().max(now_scaled) >= ideal, "TAT below the ideal");
                Ok(())
            })?;
        }
    }
}
