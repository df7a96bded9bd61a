//! Test support shared by the three algorithms: random schedules, a runner that checks
//! the contract every limiter must keep (one suite, every implementation), and the
//! records the per-algorithm oracles replay.
//!
//! Checked at every step by [`run`]: `check` agrees with `reserve`; a `RetryAfter(d)` is
//! exact (`check(now+d-1)` is `RetryAfter(1)`, `check(now+d)` is Ok); a settlement
//! reporting `expired` left the state unchanged; snapshot figures agree with
//! admissibility and `reset_after_ns` is exact; a limiter at rest decides like a fresh
//! one.

use proptest::prelude::*;

use super::{Algorithm, Ceiling, Denial, LimitSpec, Limiter, Nanos, Reservation, Settlement};

/// The batch lane's share used by the schedules.
pub(crate) fn batch() -> Ceiling {
    Ceiling::from_share(0.6)
}

/// One step of a schedule, after advancing the clock by `advance_ns`.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    pub advance_ns: Nanos,
    pub action: Action,
}

/// What a step does.
#[derive(Clone, Debug)]
pub(crate) enum Action {
    /// Reserve `cost` in the interactive (`batch == false`) or batch lane.
    Reserve { cost: u64, batch: bool },
    /// Settle the `pick % open`-th open reservation with `actual = raw % (limit + 1)`,
    /// where the limit is the reserved cost (or twice it when debts are allowed).
    Settle { pick: usize, raw: u64 },
}

/// A small random spec for `algorithm`.
pub(crate) fn spec(algorithm: Algorithm) -> impl Strategy<Value = LimitSpec> {
    (1u64..=40, 1u32..=8, 0u64..=300).prop_flat_map(move |(capacity, buckets, extra)| {
        let window_ns = u64::from(buckets) + extra;
        (1..=capacity).prop_map(move |burst| LimitSpec {
            capacity,
            window_ns,
            algorithm,
            buckets,
            burst,
        })
    })
}

/// A random schedule of up to 120 steps; costs up to 45 (some above any capacity).
pub(crate) fn schedule() -> impl Strategy<Value = Vec<Step>> {
    let advance = prop_oneof![4 => Just(0u64), 4 => 1u64..=20, 1 => 0u64..=700];
    let action = prop_oneof![
        3 => (0u64..=45, any::<bool>()).prop_map(|(cost, batch)| Action::Reserve { cost, batch }),
        2 => (any::<usize>(), any::<u64>()).prop_map(|(pick, raw)| Action::Settle { pick, raw }),
    ];
    prop::collection::vec((advance, action), 1..120).prop_map(|steps| {
        steps
            .into_iter()
            .map(|(advance_ns, action)| Step { advance_ns, action })
            .collect()
    })
}

/// How an admitted reservation ended up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Not settled yet.
    Open,
    /// Settled to `actual` and the limiter applied it (or it needed no change).
    Applied(u64),
    /// Settled to `actual`, reported as expired: nothing changed.
    Expired(u64),
}

/// One admitted reservation, as the oracles replay it.
#[derive(Debug)]
pub(crate) struct Record {
    pub time_ns: Nanos,
    pub reserved: u64,
    pub ceiling: Ceiling,
    pub outcome: Outcome,
    pub settled_ns: Nanos,
    reservation: Option<Reservation>,
}

impl Record {
    /// The real cost: the settled amount, or the reservation while open.
    pub(super) fn real(&self) -> u64 {
        match self.outcome {
            Outcome::Open => self.reserved,
            Outcome::Applied(actual) | Outcome::Expired(actual) => actual,
        }
    }
}

/// Plays `steps` against `limiter`, checking the shared contract at every step and
/// calling `oracle(limiter, now, records)` after each one. Debts only if `debts`.
pub(crate) fn run(
    limiter: &mut Limiter,
    steps: &[Step],
    debts: bool,
    mut oracle: impl FnMut(&Limiter, Nanos, &[Record]) -> Result<(), TestCaseError>,
) -> Result<Vec<Record>, TestCaseError> {
    let mut records: Vec<Record> = Vec::new();
    let mut now: Nanos = 0;
    for step in steps {
        now += step.advance_ns;
        match step.action {
            Action::Reserve { cost, batch: lane } => {
                let ceiling = if lane { batch() } else { Ceiling::FULL };
                if let Some(reservation) = reserve(limiter, now, cost, ceiling)? {
                    records.push(Record {
                        time_ns: now,
                        reserved: cost,
                        ceiling,
                        outcome: Outcome::Open,
                        settled_ns: 0,
                        reservation: Some(reservation),
                    });
                }
            }
            Action::Settle { pick, raw } => {
                let open: Vec<usize> = (0..records.len())
                    .filter(|&i| records[i].outcome == Outcome::Open)
                    .collect();
                if open.is_empty() {
                    continue;
                }
                let record = &mut records[open[pick % open.len()]];
                let most = if debts {
                    record.reserved * 2
                } else {
                    record.reserved
                };
                settle(limiter, now, record, raw % (most + 1))?;
            }
        }
        check_snapshot(limiter, now)?;
        check_rest(limiter, now, &records)?;
        oracle(limiter, now, &records)?;
    }
    Ok(records)
}

/// Reserves, checking that `check` agrees and that a denial's retry-after is exact.
fn reserve(
    limiter: &mut Limiter,
    now: Nanos,
    cost: u64,
    ceiling: Ceiling,
) -> Result<Option<Reservation>, TestCaseError> {
    let checked = limiter.check(now, cost, ceiling);
    let reserved = limiter.reserve(now, cost, ceiling);
    prop_assert_eq!(checked, reserved.as_ref().map(|_| ()).map_err(|d| *d));
    if let Err(Denial::RetryAfter(d)) = reserved {
        prop_assert!(d >= 1, "zero retry-after");
        prop_assert_eq!(
            limiter.check(now + d - 1, cost, ceiling),
            Err(Denial::RetryAfter(1))
        );
        prop_assert_eq!(limiter.check(now + d, cost, ceiling), Ok(()));
        let half = d / 2;
        prop_assert_eq!(
            limiter.check(now + half, cost, ceiling),
            Err(Denial::RetryAfter(d - half))
        );
    }
    let spec = limiter.spec();
    let bound = if spec.algorithm == Algorithm::TokenBucket {
        spec.burst
    } else {
        spec.capacity
    };
    let limit = ceiling.of(bound);
    let never = reserved.as_ref().err() == Some(&Denial::Never);
    prop_assert_eq!(
        never,
        limit == 0 || cost > limit,
        "Never iff the cost exceeds the ceiling"
    );
    Ok(reserved.ok())
}

/// Settles `record` to `actual`; an expired settlement must leave the state unchanged.
fn settle(
    limiter: &mut Limiter,
    now: Nanos,
    record: &mut Record,
    actual: u64,
) -> Result<(), TestCaseError> {
    let Some(reservation) = record.reservation.take() else {
        return Ok(());
    };
    let before = limiter.clone();
    let out: Settlement = limiter.settle(now, reservation, actual);
    prop_assert_eq!(
        out.refunded + out.debt + out.expired,
        record.reserved.abs_diff(actual)
    );
    prop_assert!(out.debt == 0 || out.refunded == 0);
    record.settled_ns = now;
    record.outcome = if out.expired > 0 {
        prop_assert_eq!(out.refunded + out.debt, 0);
        prop_assert_eq!(&before, &*limiter, "expired settlement changed the state");
        Outcome::Expired(actual)
    } else {
        Outcome::Applied(actual)
    };
    Ok(())
}

/// At rest, every open reservation settles as expired, both here and in a new
/// instance that has since admitted traffic (so the owner may drop this one).
fn check_rest(limiter: &Limiter, now: Nanos, records: &[Record]) -> Result<(), TestCaseError> {
    if !limiter.is_at_rest(now) {
        return Ok(());
    }
    let mut fresh =
        Limiter::try_new(*limiter.spec()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let _ = fresh.reserve(now, 1, Ceiling::FULL);
    for r in records.iter().filter(|r| r.outcome == Outcome::Open) {
        let slot = r.reservation.as_ref().map_or(0, |res| res.slot);
        for target in [&mut limiter.clone(), &mut fresh.clone()] {
            let forged = Reservation {
                cost: r.reserved,
                slot,
            };
            let out = target.settle(now, forged, r.reserved * 2 + 1);
            prop_assert_eq!(
                out.expired,
                r.reserved + 1,
                "open reservation live after rest"
            );
        }
    }
    Ok(())
}

/// Snapshot figures agree with admissibility; reset is exact; rest means fresh.
fn check_snapshot(limiter: &Limiter, now: Nanos) -> Result<(), TestCaseError> {
    let snap = limiter.snapshot(now);
    prop_assert!(snap.remaining <= snap.capacity);
    prop_assert_eq!(snap.remaining, snap.capacity.saturating_sub(snap.used));
    if snap.remaining > 0 {
        prop_assert_eq!(limiter.check(now, snap.remaining, Ceiling::FULL), Ok(()));
    }
    prop_assert!(
        limiter
            .check(now, snap.remaining + 1, Ceiling::FULL)
            .is_err()
    );
    prop_assert_eq!(snap.used == 0, snap.reset_after_ns == 0);
    if snap.reset_after_ns > 0 {
        prop_assert_eq!(limiter.snapshot(now + snap.reset_after_ns).used, 0);
        prop_assert!(limiter.snapshot(now + snap.reset_after_ns - 1).used > 0);
    }
    if limiter.is_at_rest(now) {
        prop_assert_eq!(snap.used, 0);
        let fresh =
            Limiter::try_new(*limiter.spec()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for cost in 0..=snap.capacity + 1 {
            for ceiling in [Ceiling::FULL, batch()] {
                prop_assert_eq!(
                    limiter.check(now, cost, ceiling),
                    fresh.check(now, cost, ceiling)
                );
            }
        }
    }
    Ok(())
}

/// Property 1 for the windowed algorithms: every window `(s-W, s]` ending at an
/// admission holds at most that admission's ceiling of real (settled) cost.
pub(crate) fn windows_within_ceiling(
    records: &[Record],
    spec: &LimitSpec,
) -> Result<(), TestCaseError> {
    for (k, last) in records.iter().enumerate() {
        let in_window: u64 = records[..=k]
            .iter()
            .filter(|r| r.time_ns + spec.window_ns > last.time_ns)
            .map(Record::real)
            .sum();
        let limit = last.ceiling.of(spec.capacity);
        prop_assert!(
            in_window <= limit,
            "window ending at {} holds {in_window} > {limit}",
            last.time_ns
        );
    }
    Ok(())
}

/// Property 2 for the windowed algorithms: `used` equals (so is never below) the
/// oracle's sum of current charges whose slot still counts (`counts(record, t)`), and
/// settlements were applied exactly when the slot still counted.
pub(crate) fn used_matches_oracle(
    limiter: &Limiter,
    now: Nanos,
    records: &[Record],
    counts: impl Fn(&Record, Nanos) -> bool,
) -> Result<(), TestCaseError> {
    let mut expected = 0u64;
    for r in records {
        let current = match r.outcome {
            Outcome::Open => r.reserved,
            Outcome::Applied(actual) => {
                prop_assert!(
                    actual == r.reserved || counts(r, r.settled_ns),
                    "applied late"
                );
                actual
            }
            Outcome::Expired(_) => {
                prop_assert!(!counts(r, r.settled_ns), "expired while its slot counted");
                0
            }
        };
        if counts(r, now) {
            expected += current;
        }
    }
    let used = limiter.snapshot(now).used;
    prop_assert!(
        used >= expected,
        "capacity created: used {used} < oracle {expected}"
    );
    prop_assert_eq!(used, expected, "bookkeeping drifted from the oracle");
    Ok(())
}
