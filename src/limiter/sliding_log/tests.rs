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
