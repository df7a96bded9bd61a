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
