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
