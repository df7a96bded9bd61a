//! The limits of one scope and the all-or-nothing admission across them: a request
//! is charged on every dimension or on none. Pure: takes `now`, touches no clock.

use super::{Dimension, Lane};
use crate::limiter::{Ceiling, Denial, Limiter, Nanos, Reservation, Settlement, Snapshot};
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tollgate_cluster::lease::budget::Spent;

/// Retry hint when only concurrency blocks: a slot frees when some request ends,
/// which no clock can predict. The waiter itself wakes on the release, not this.
pub const CONCURRENCY_RETRY_HINT_NS: Nanos = 1_000_000_000;

/// Retry hint when only a cluster allowance blocks: the allowance is recomputed
/// every sync interval, so that is when trying again can help.
pub const ALLOWANCE_RETRY_HINT_NS: Nanos = 250_000_000;

/// The most this node may count for one dimension, as set by the cluster's sync
/// mode: cost in the local window (requests, tokens) or requests in flight
/// (concurrency). Written by the sync engine each interval, read by the actor on every
/// decision: one atomic load, no message on the hot path.
#[derive(Clone, Debug)]
pub struct Allowance(Arc<AtomicU64>);

impl Allowance {
    /// An allowance starting at `value`.
    pub fn new(value: u64) -> Allowance {
        Allowance(Arc::new(AtomicU64::new(value)))
    }

    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Replaces the value (the sync engine); whether it rose, so that the caller
    /// can wake waiters that the old value held back.
    pub fn set(&self, value: u64) -> bool {
        self.0.swap(value, Ordering::Relaxed) < value
    }
}

/// Cluster bounds of a scope's dimensions; `None` = local limit only.
#[derive(Clone, Debug, Default)]
pub struct Allowances {
    /// `lease` mode: credit leased from each key's owner.
    pub credits: super::credit::Credits,
    /// Requests in the local window.
    pub requests: Option<Allowance>,
    /// Tokens in the local window.
    pub tokens: Option<Allowance>,
    /// Requests in flight on this node.
    pub concurrency: Option<Allowance>,
}

/// Why a request cannot be admitted now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocked {
    /// The dimension that blocks longest.
    pub dimension: Dimension,
    /// Earliest time worth retrying, from now (exact for window dimensions).
    pub retry_after_ns: Nanos,
    /// Waiting cannot help: the cost exceeds the lane's ceiling.
    pub never: bool,
}

/// The block that one check reports of all it meets: one waiting cannot help
/// beats any other, else the longest retry.
#[derive(Default)]
struct Worst(Option<Blocked>);

impl Worst {
    fn note(&mut self, b: Blocked) {
        self.0 = Some(match self.0 {
            Some(w) if w.never || (!b.never && w.retry_after_ns >= b.retry_after_ns) => w,
            _ => b,
        });
    }

    fn retry(&mut self, dimension: Dimension, retry_after_ns: Nanos) {
        self.note(Blocked {
            dimension,
            retry_after_ns,
            never: false,
        });
    }
}

/// What admission charged, needed to settle.
#[derive(Debug)]
pub struct Charge {
    requests: Option<Reservation>,
    tokens: Option<Reservation>,
    /// What each leased dimension spent `[requests, tokens, concurrency]`, with its cost.
    credit: [Option<(Spent, u64)>; 3],
    /// Tokens reserved (0 when the scope has no token limit).
    pub tokens_reserved: u64,
}

/// How a charge is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// The upstream reported usage: correct tokens to it.
    Actual(u64),
    /// Usage unknown (client gone mid-stream, upstream cut): keep the reservation.
    KeepReserved,
    /// The upstream did no work (refused, failed before generating): refund the
    /// tokens, keep the request (it was sent).
    RefundTokens,
    /// Never sent: refund everything, as if it had not been admitted.
    Cancel,
}

/// A scope's local usage, as the cluster counters publish it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeExport {
    /// Request window: bucket width and live `(bucket, cost)` pairs.
    pub requests: Option<(Nanos, Vec<(u64, u64)>)>,
    /// Token window: bucket width and live `(bucket, cost)` pairs.
    pub tokens: Option<(Nanos, Vec<(u64, u64)>)>,
    /// Requests in flight.
    pub in_flight: u64,
    /// Requests asked of this actor since it started, admitted or not (demand).
    pub requested_requests: u64,
    /// Tokens asked of this actor since it started, admitted or not (demand).
    pub requested_tokens: u64,
    /// Requests waiting in its queues now while it has no slot free (else 0): the
    /// concurrency dimension's demand.
    pub waiting: u64,
}

/// Settlement figures for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct Settled {
    /// Token correction.
    pub tokens: Settlement,
}

/// Limits and live state of one scope.
#[derive(Debug)]
pub struct ScopeLimits {
    requests: Option<Limiter>,
    tokens: Option<Limiter>,
    concurrency: Option<u64>,
    in_flight: u64,
    batch_ceiling: Ceiling,
    cooling_until_ns: Nanos,
    allowances: Allowances,
}

/// Point-in-time figures of a scope, for headers and the admin API.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ScopeStatus {
    /// Request window figures, if limited.
    pub requests: Option<WindowStatus>,
    /// Token window figures, if limited.
    pub tokens: Option<WindowStatus>,
    /// Requests in flight.
    pub in_flight: u64,
    /// Concurrency limit, if any.
    pub concurrency_limit: Option<u64>,
    /// Waiters per lane `[interactive, batch]`.
    pub queued: [usize; 2],
    /// Nanoseconds of cool-down left (upstreams after a 429).
    pub cooling_ns: Nanos,
}

/// One window dimension's figures.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct WindowStatus {
    /// Capacity per window.
    pub limit: u64,
    /// Used in the current window.
    pub used: u64,
    /// Left in the current window.
    pub remaining: u64,
    /// Nanoseconds until the window is empty again.
    pub reset_ns: Nanos,
}

impl From<Snapshot> for WindowStatus {
    fn from(s: Snapshot) -> Self {
        WindowStatus {
            limit: s.capacity,
            used: s.used,
            remaining: s.remaining,
            reset_ns: s.reset_after_ns,
        }
    }
}

impl ScopeLimits {
    /// A scope at rest.
    pub fn new(
        requests: Option<Limiter>,
        tokens: Option<Limiter>,
        concurrency: Option<u64>,
        batch_ceiling: Ceiling,
    ) -> ScopeLimits {
        ScopeLimits {
            requests,
            tokens,
            concurrency,
            in_flight: 0,
            batch_ceiling,
            cooling_until_ns: 0,
            allowances: Allowances::default(),
        }
    }

    /// The same scope, also bounded by cluster allowances.
    pub fn with_allowances(mut self, allowances: Allowances) -> ScopeLimits {
        self.allowances = allowances;
        self
    }

    /// What the cluster counters need: live buckets per window dimension and the
    /// requests in flight.
    pub fn export(&self, now: Nanos) -> ScopeExport {
        ScopeExport {
            requests: self.requests.as_ref().and_then(|l| l.export(now)),
            tokens: self.tokens.as_ref().and_then(|l| l.export(now)),
            in_flight: self.in_flight,
            requested_requests: 0,
            requested_tokens: 0,
            waiting: 0,
        }
    }

    fn ceiling(&self, lane: Lane) -> Ceiling {
        match lane {
            Lane::Interactive => Ceiling::FULL,
            Lane::Batch => self.batch_ceiling,
        }
    }

    fn concurrency_cap(&self, lane: Lane) -> Option<u64> {
        // A batch lane always gets at least one slot, or a concurrency of 1 would
        // make batch traffic impossible rather than merely lower-priority.
        self.concurrency.map(|c| self.ceiling(lane).of(c).max(1))
    }

    /// Would `tokens` be admitted now in `lane`? With `busy_above`, also refuse when
    /// any dimension is already at or above that fraction (routing skips busy
    /// upstreams while a fallback exists). All or nothing: every dimension is
    /// checked, and the one that blocks longest is reported.
    pub fn check(
        &self,
        now: Nanos,
        tokens: u64,
        lane: Lane,
        busy_above: Option<Ceiling>,
    ) -> Result<(), Blocked> {
        let mut worst = Worst::default();
        if self.cooling_until_ns > now {
            worst.retry(Dimension::Cooldown, self.cooling_until_ns - now);
        }
        self.check_windows(now, tokens, lane, busy_above, &mut worst);
        self.check_cluster_bounds(now, tokens, &mut worst);
        self.check_slots(lane, busy_above, &mut worst);
        worst.0.map_or(Ok(()), Err)
    }

    /// What the local windows (and a cooldown) alone keep `tokens` in `lane`
    /// out for, if they do. Exact while nothing admitted here is unsettled:
    /// only a settlement (a refund below the reservation, a charge re-dated to
    /// its answer) moves a window's contents other than time does.
    pub fn window_wait(&self, now: Nanos, tokens: u64, lane: Lane) -> Option<Blocked> {
        let mut worst = Worst::default();
        if self.cooling_until_ns > now {
            worst.retry(Dimension::Cooldown, self.cooling_until_ns - now);
        }
        self.check_windows(now, tokens, lane, None, &mut worst);
        worst.0
    }

    /// The local windows (requests, tokens) under the lane's ceiling, and how
    /// busy they are.
    fn check_windows(
        &self,
        now: Nanos,
        tokens: u64,
        lane: Lane,
        busy_above: Option<Ceiling>,
        worst: &mut Worst,
    ) {
        let ceiling = self.ceiling(lane);
        for (limiter, cost, dimension) in [
            (&self.requests, 1, Dimension::Requests),
            (&self.tokens, tokens, Dimension::Tokens),
        ] {
            let Some(limiter) = limiter else { continue };
            if let Some(busy) = busy_above {
                let snapshot = limiter.snapshot(now);
                if snapshot.used >= busy.of(snapshot.capacity) {
                    worst.retry(dimension, snapshot.reset_after_ns.max(1));
                }
            }
            match limiter.check(now, cost, ceiling) {
                Ok(()) => {}
                Err(Denial::RetryAfter(ns)) => worst.retry(dimension, ns),
                Err(Denial::Never) => worst.note(Blocked {
                    dimension,
                    retry_after_ns: 0,
                    never: true,
                }),
            }
        }
    }

    /// The cluster's bounds on the windows: allowances (`local split`,
    /// `gossip`) and credit (`lease`, `redis-lease`).
    fn check_cluster_bounds(&self, now: Nanos, tokens: u64, worst: &mut Worst) {
        for (limiter, allowance, cost, dimension) in [
            (
                &self.requests,
                &self.allowances.requests,
                1,
                Dimension::Requests,
            ),
            (
                &self.tokens,
                &self.allowances.tokens,
                tokens,
                Dimension::Tokens,
            ),
        ] {
            if let (Some(limiter), Some(allowance)) = (limiter, allowance)
                && limiter.snapshot(now).used.saturating_add(cost) > allowance.get()
            {
                worst.retry(dimension, ALLOWANCE_RETRY_HINT_NS);
            }
        }
        let now_ms = now / 1_000_000;
        let credits = &self.allowances.credits;
        for (credit, cost, dimension) in [
            (&credits.requests, 1, Dimension::Requests),
            (&credits.tokens, tokens, Dimension::Tokens),
            (&credits.concurrency, 1, Dimension::Concurrency),
        ] {
            if let Some(credit) = credit
                && !credit.can_spend(cost, now_ms)
            {
                // The engine is woken to renew; the actor is woken when credit comes.
                worst.retry(dimension, ALLOWANCE_RETRY_HINT_NS);
            }
        }
    }

    /// Concurrency: the cluster's allowance of slots, and the lane's cap.
    fn check_slots(&self, lane: Lane, busy_above: Option<Ceiling>, worst: &mut Worst) {
        if let Some(allowance) = &self.allowances.concurrency
            && self.in_flight + 1 > allowance.get()
        {
            // The allowance can grow without any local release (another node's
            // stream ended), so this one is retried on the sync interval.
            worst.retry(Dimension::Concurrency, ALLOWANCE_RETRY_HINT_NS);
        }
        if let Some(cap) = self.concurrency_cap(lane) {
            let busy = busy_above.is_some_and(|b| self.in_flight >= b.of(cap).max(1));
            if self.in_flight + 1 > cap || busy {
                worst.retry(Dimension::Concurrency, CONCURRENCY_RETRY_HINT_NS);
            }
        }
    }

    /// Whether one more request would find no slot here now (the local cap, the
    /// cluster allowance or the slot credit used up): what makes queued requests
    /// concurrency demand. Changes nothing (no credit is asked for).
    pub fn slots_exhausted(&self, now: Nanos) -> bool {
        let now_ms = now / 1_000_000;
        let credit = (self.allowances.credits.concurrency.as_ref())
            .is_some_and(|c| c.with(|b| !b.can_spend(1, now_ms)));
        let allowance =
            (self.allowances.concurrency.as_ref()).is_some_and(|a| self.in_flight + 1 > a.get());
        let cap = self.concurrency.is_some_and(|c| self.in_flight + 1 > c);
        credit || allowance || cap
    }

    /// Charges every dimension, or none.
    pub fn admit(
        &mut self,
        now: Nanos,
        tokens: u64,
        lane: Lane,
        busy_above: Option<Ceiling>,
    ) -> Result<Charge, Blocked> {
        self.check(now, tokens, lane, busy_above)?;
        let credit = self.spend_credits(now, tokens)?;
        let ceiling = self.ceiling(lane);
        // check() just proved each reservation fits; a failure here would be a bug in
        // the limiter's check/reserve agreement, so it is asserted, not handled.
        let requests = self
            .requests
            .as_mut()
            .and_then(|l| l.reserve(now, 1, ceiling).ok());
        let token_res = self
            .tokens
            .as_mut()
            .and_then(|l| l.reserve(now, tokens, ceiling).ok());
        debug_assert_eq!(requests.is_some(), self.requests.is_some());
        debug_assert_eq!(token_res.is_some(), self.tokens.is_some());
        self.in_flight += 1;
        let tokens_reserved = token_res.as_ref().map_or(0, |r| r.cost);
        Ok(Charge {
            requests,
            tokens: token_res,
            credit,
            tokens_reserved,
        })
    }

    /// Spends every leased dimension, or none: the engine may shrink a credit
    /// between `check` and here, so a failure rolls back what was spent.
    fn spend_credits(&self, now: Nanos, tokens: u64) -> Result<[Option<(Spent, u64)>; 3], Blocked> {
        let now_ms = now / 1_000_000;
        let credits = &self.allowances.credits;
        let dims = [
            (&credits.requests, 1, Dimension::Requests),
            (&credits.tokens, tokens, Dimension::Tokens),
            (&credits.concurrency, 1, Dimension::Concurrency),
        ];
        let mut spent: [Option<(Spent, u64)>; 3] = [None, None, None];
        for (i, (credit, cost, dimension)) in dims.iter().enumerate() {
            let Some(credit) = credit else { continue };
            match credit.try_spend(*cost, now_ms) {
                Some(s) => spent[i] = Some((s, *cost)),
                None => {
                    for (j, done) in spent.iter().enumerate() {
                        if let (Some(c), Some((s, cost))) = (dims[j].0, done) {
                            c.settle(*s, *cost, 0, now_ms);
                        }
                    }
                    return Err(Blocked {
                        dimension: *dimension,
                        retry_after_ns: ALLOWANCE_RETRY_HINT_NS,
                        never: false,
                    });
                }
            }
        }
        Ok(spent)
    }

    /// Moves a charge's windowed costs to the bucket of `now`, when the upstream
    /// answered: the provider counted the request on arrival, by then at the latest,
    /// so its cost must count here until a window after that (docs/design/limiter.md,
    /// "Charged when answered"). Slots are not windowed: unchanged.
    pub fn redate(&mut self, now: Nanos, charge: &mut Charge) {
        let now_ms = now / 1_000_000;
        let credits = &self.allowances.credits;
        let [requests_spent, tokens_spent, _] = &mut charge.credit;
        for (credit, entry) in [
            (&credits.requests, requests_spent),
            (&credits.tokens, tokens_spent),
        ] {
            if let (Some(credit), Some((spent, cost))) = (credit, entry.as_mut()) {
                *spent = credit.redate(*spent, *cost, now_ms);
            }
        }
        for (limiter, reservation) in [
            (self.requests.as_mut(), &mut charge.requests),
            (self.tokens.as_mut(), &mut charge.tokens),
        ] {
            if let (Some(limiter), Some(r)) = (limiter, reservation.take()) {
                *reservation = Some(limiter.redate(now, r));
            }
        }
    }

    /// Settles a charge and frees its concurrency slot. Consumes the charge, so each
    /// is settled once.
    pub fn settle(&mut self, now: Nanos, charge: Charge, how: Settle) -> Settled {
        // Every charge holds one in-flight slot, limited or not.
        debug_assert!(self.in_flight > 0);
        self.in_flight = self.in_flight.saturating_sub(1);
        let credits = &self.allowances.credits;
        let now_ms = now / 1_000_000;
        let [requests_credit, tokens_credit, slot_credit] = charge.credit;
        if let (Some(credit), Some((spent, cost))) = (&credits.requests, requests_credit) {
            credit.settle(
                spent,
                cost,
                if how == Settle::Cancel { 0 } else { cost },
                now_ms,
            );
        }
        if let (Some(credit), Some((spent, cost))) = (&credits.tokens, tokens_credit) {
            let actual = match how {
                Settle::Actual(tokens) => tokens,
                Settle::KeepReserved => cost,
                Settle::RefundTokens | Settle::Cancel => 0,
            };
            credit.settle(spent, cost, actual, now_ms);
        }
        if let (Some(credit), Some((spent, cost))) = (&credits.concurrency, slot_credit) {
            credit.settle(spent, cost, cost, now_ms);
        }
        if let (Some(limiter), Some(res)) = (self.requests.as_mut(), charge.requests) {
            let actual = if how == Settle::Cancel { 0 } else { res.cost };
            limiter.settle(now, res, actual);
        }
        let mut settled = Settled::default();
        if let (Some(limiter), Some(res)) = (self.tokens.as_mut(), charge.tokens) {
            let actual = match how {
                Settle::Actual(tokens) => tokens,
                Settle::KeepReserved => res.cost,
                Settle::RefundTokens | Settle::Cancel => 0,
            };
            settled.tokens = limiter.settle(now, res, actual);
        }
        settled
    }

    /// Starts (or extends) a cool-down until `until_ns`.
    pub fn cool_down(&mut self, until_ns: Nanos) {
        self.cooling_until_ns = self.cooling_until_ns.max(until_ns);
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// True when dropping this state loses nothing.
    pub fn is_at_rest(&self, now: Nanos) -> bool {
        self.in_flight == 0
            && self.cooling_until_ns <= now
            && self.requests.as_ref().is_none_or(|l| l.is_at_rest(now))
            && self.tokens.as_ref().is_none_or(|l| l.is_at_rest(now))
    }

    /// Figures for headers and the admin API (queue depths filled in by the actor).
    ///
    /// `remaining` is what this node may still admit: within its cluster
    /// allowance too (`gossip`, `local split`, `redis`'s fallback), not only
    /// within L by its own count (which would tell a refused request
    /// `x-ratelimit-remaining-requests: 2`, its node's share spent). `lease`
    /// credit is not read here: a node gets more of it as it spends, so what
    /// it holds is no bound on what it may admit.
    pub fn status(&self, now: Nanos) -> ScopeStatus {
        let window = |limiter: &Option<Limiter>, allowance: &Option<Allowance>| {
            limiter.as_ref().map(|l| {
                let mut status = WindowStatus::from(l.snapshot(now));
                if let Some(allowance) = allowance {
                    let left = allowance.get().saturating_sub(status.used);
                    status.remaining = status.remaining.min(left);
                }
                status
            })
        };
        ScopeStatus {
            requests: window(&self.requests, &self.allowances.requests),
            tokens: window(&self.tokens, &self.allowances.tokens),
            in_flight: self.in_flight,
            concurrency_limit: self.concurrency,
            queued: [0, 0],
            cooling_ns: self.cooling_until_ns.saturating_sub(now),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Algorithm, LimitSpec, NANOS_PER_SEC};

    fn scope(allowances: Allowances) -> ScopeLimits {
        let window = |capacity| {
            Limiter::try_new(LimitSpec::new(
                capacity,
                60 * NANOS_PER_SEC,
                Algorithm::SlidingWindow,
            ))
            .ok()
        };
        ScopeLimits::new(window(100), window(10_000), Some(10), Ceiling::FULL)
            .with_allowances(allowances)
    }

    #[test]
    fn reading_slot_demand_asks_for_no_credit() {
        use crate::actor::credit::{Credit, CreditRecipe, Credits};
        let recipe = Arc::new(CreditRecipe {
            window: tollgate_cluster::counter::Window::try_new(1_000, 10).expect("window"),
            policy: tollgate_cluster::lease::budget::CutOffPolicy::Share,
            wake: Arc::default(),
        });
        let slots = Credit::new("tenant:t:concurrency".into(), true, recipe);
        let s = scope(Allowances {
            credits: Credits {
                concurrency: Some(slots.clone()),
                ..Credits::default()
            },
            ..Allowances::default()
        });
        // The engine's export asks every round: no slot credit, so exhausted.
        assert!(s.slots_exhausted(1_000 * NANOS_PER_SEC));
        assert_eq!(slots.take_wanted(), (false, 0), "reading asks for nothing");
    }

    #[test]
    fn cluster_allowance_bounds_the_local_window_and_can_move() {
        let tokens = Allowance::new(500);
        let mut s = scope(Allowances {
            tokens: Some(tokens.clone()),
            ..Allowances::default()
        });
        let now = 1_000 * NANOS_PER_SEC;
        assert!(s.admit(now, 400, Lane::Interactive, None).is_ok());
        let blocked = s.admit(now, 200, Lane::Interactive, None).unwrap_err();
        assert_eq!(
            (blocked.dimension, blocked.never),
            (Dimension::Tokens, false)
        );
        assert_eq!(blocked.retry_after_ns, ALLOWANCE_RETRY_HINT_NS);
        // The sync engine raises this node's allowance: the same request fits.
        tokens.set(600);
        assert!(s.admit(now, 200, Lane::Interactive, None).is_ok());
    }

    #[test]
    fn concurrency_allowance_and_export() {
        let slots = Allowance::new(1);
        let mut s = scope(Allowances {
            concurrency: Some(slots),
            ..Allowances::default()
        });
        let now = 1_000 * NANOS_PER_SEC;
        let charge = s.admit(now, 10, Lane::Interactive, None).unwrap();
        assert_eq!(
            s.admit(now, 10, Lane::Interactive, None)
                .unwrap_err()
                .dimension,
            Dimension::Concurrency
        );
        let export = s.export(now);
        assert_eq!(export.in_flight, 1);
        let (width_ns, buckets) = export.tokens.unwrap();
        assert_eq!(width_ns, NANOS_PER_SEC);
        assert_eq!(buckets, vec![(1_000, 10)]);
        s.settle(now, charge, Settle::Actual(4));
        assert_eq!(s.export(now).tokens.unwrap().1, vec![(1_000, 4)]);
        assert_eq!(s.export(now).in_flight, 0);
    }
}
