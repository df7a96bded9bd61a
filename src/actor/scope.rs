//! The limits of one scope and the all-or-nothing admission across them: a request
//! is charged on every dimension or on none. Pure: takes `now`, touches no clock.

use super::{Dimension, Lane, WINDOWS};
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

/// What one request costs a scope: its input (prompt) tokens and its output
/// (completion) tokens, estimated at admission and real at settlement. Each
/// window dimension reads its own part ([`Cost::on`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Input tokens: the prompt (with cache reads where the scope counts them).
    pub input: u64,
    /// Output tokens: the completion (its estimate until settled).
    pub output: u64,
    /// The most output the request may produce (its `max_tokens`), what an
    /// output-token window charges at admission, as Anthropic charges OTPM
    /// (0: `output`). The real output replaces it at settlement.
    pub output_cap: u64,
}

impl Cost {
    /// What a request that used `prompt` input tokens (cache reads apart),
    /// `cache_read` cache-read ones and `completion` output tokens costs a
    /// scope that counts cache reads as input or not.
    pub fn of_usage(
        prompt: u64,
        cache_read: u64,
        completion: u64,
        counts_cache_reads: bool,
    ) -> Cost {
        let cached = if counts_cache_reads { cache_read } else { 0 };
        Cost {
            input: prompt.saturating_add(cached),
            output: completion,
            output_cap: 0,
        }
    }

    /// Input and output together.
    pub fn tokens(self) -> u64 {
        self.input.saturating_add(self.output)
    }

    /// What `dimension` counts of this request: one request, one slot, or its
    /// tokens (all, input or output).
    pub fn on(self, dimension: Dimension) -> u64 {
        match dimension {
            Dimension::Requests | Dimension::RequestsPerDay | Dimension::Concurrency => 1,
            Dimension::Tokens | Dimension::TokensPerDay => self.tokens(),
            Dimension::InputTokens => self.input,
            Dimension::OutputTokens => self.output.max(self.output_cap),
            Dimension::Cooldown | Dimension::Queue => 0,
        }
    }
}

/// Cluster bounds of a scope's dimensions; `None` = local limit only.
#[derive(Clone, Debug, Default)]
pub struct Allowances {
    /// `lease` mode: credit leased from each key's owner.
    pub credits: super::credit::Credits,
    /// Cost in the local window, per window dimension ([`Dimension::WINDOWED`]).
    pub windows: [Option<Allowance>; WINDOWS],
    /// Requests in flight on this node.
    pub concurrency: Option<Allowance>,
}

impl Allowances {
    /// The allowance of `dimension`, for the sync engine to write.
    pub fn slot_mut(&mut self, dimension: Dimension) -> Option<&mut Option<Allowance>> {
        match dimension.window_index() {
            Some(i) => Some(&mut self.windows[i]),
            None if dimension == Dimension::Concurrency => Some(&mut self.concurrency),
            None => None,
        }
    }
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

/// What each leased dimension spent, with its cost: the window dimensions in
/// [`Dimension::WINDOWED`] order, then the slot.
type Spending = [Option<(Spent, u64)>; WINDOWS + 1];

/// What admission charged, needed to settle.
#[derive(Debug)]
pub struct Charge {
    /// Per window dimension, in [`Dimension::WINDOWED`] order.
    reservations: [Option<Reservation>; WINDOWS],
    credit: Spending,
    /// Tokens reserved: all of them where the tokens window is limited, else
    /// what the input and output windows charge (0 when none is).
    pub tokens_reserved: u64,
    /// What the request was costed at.
    pub cost: Cost,
}

/// How a charge is settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// The upstream reported usage: correct tokens to it.
    Actual(Cost),
    /// Usage unknown (client gone mid-stream, upstream cut): keep the reservation.
    KeepReserved,
    /// The upstream did no work (refused, failed before generating): refund the
    /// tokens, keep the request (it was sent).
    RefundTokens,
    /// Never sent: refund everything, as if it had not been admitted.
    Cancel,
}

impl Settle {
    /// What `dimension`'s charge of `reserved` comes to.
    fn actual(self, dimension: Dimension, reserved: u64) -> u64 {
        match (self, dimension) {
            // A slot is given back whole, however the request ended.
            (_, Dimension::Concurrency) => reserved,
            (Settle::Cancel, _) => 0,
            (_, Dimension::Requests | Dimension::RequestsPerDay) => reserved,
            (Settle::Actual(cost), dimension) => cost.on(dimension),
            (Settle::KeepReserved, _) => reserved,
            (Settle::RefundTokens, _) => 0,
        }
    }
}

/// One window's live usage: bucket width and `(bucket, cost)` pairs.
pub type WindowExport = (Nanos, Vec<(u64, u64)>);

/// A scope's local usage, as the cluster counters publish it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeExport {
    /// Per window dimension ([`Dimension::WINDOWED`] order): bucket width and
    /// live `(bucket, cost)` pairs.
    pub windows: [Option<WindowExport>; WINDOWS],
    /// Requests in flight.
    pub in_flight: u64,
    /// Cost asked of this actor since it started, admitted or not (demand), per
    /// window dimension.
    pub requested: [u64; WINDOWS],
    /// Requests waiting in its queues now while it has no slot free (else 0): the
    /// concurrency dimension's demand.
    pub waiting: u64,
}

/// Settlement figures for metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct Settled {
    /// Token correction: the token window's, else input's and output's together.
    pub tokens: Settlement,
}

/// Limits and live state of one scope.
#[derive(Debug)]
pub struct ScopeLimits {
    /// Per window dimension, in [`Dimension::WINDOWED`] order.
    windows: [Option<Limiter>; WINDOWS],
    concurrency: Option<u64>,
    in_flight: u64,
    batch_ceiling: Ceiling,
    cooling_until_ns: Nanos,
    allowances: Allowances,
    /// Cache-read input tokens count as input (some providers' older models).
    counts_cache_reads: bool,
}

/// Point-in-time figures of a scope, for headers and the admin API.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ScopeStatus {
    /// Request window figures, if limited.
    pub requests: Option<WindowStatus>,
    /// Token window figures, if limited.
    pub tokens: Option<WindowStatus>,
    /// Input token window figures, if limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<WindowStatus>,
    /// Output token window figures, if limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<WindowStatus>,
    /// Requests per day window figures, if limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_day: Option<WindowStatus>,
    /// Tokens per day window figures, if limited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<WindowStatus>,
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
    /// A scope at rest, limiting the window dimensions given (in
    /// [`Dimension::WINDOWED`] order) and requests in flight.
    pub fn new(
        windows: [Option<Limiter>; WINDOWS],
        concurrency: Option<u64>,
        batch_ceiling: Ceiling,
    ) -> ScopeLimits {
        ScopeLimits {
            windows,
            concurrency,
            in_flight: 0,
            batch_ceiling,
            cooling_until_ns: 0,
            allowances: Allowances::default(),
            counts_cache_reads: false,
        }
    }

    /// The same scope, also bounded by cluster allowances.
    pub fn with_allowances(mut self, allowances: Allowances) -> ScopeLimits {
        self.allowances = allowances;
        self
    }

    /// The same scope, counting cache-read input tokens as input.
    pub fn counting_cache_reads(mut self, counts: bool) -> ScopeLimits {
        self.counts_cache_reads = counts;
        self
    }

    /// What a request that used `prompt` input tokens (cache reads apart),
    /// `cache_read` cache-read ones and `completion` output tokens costs here.
    pub fn usage_cost(&self, prompt: u64, cache_read: u64, completion: u64) -> Cost {
        Cost::of_usage(prompt, cache_read, completion, self.counts_cache_reads)
    }

    /// The window holding all tokens, per window or else per day, if limited.
    fn all_tokens_window(&self) -> Option<usize> {
        [1, 5].into_iter().find(|i| self.windows[*i].is_some())
    }

    /// The tokens `cost` reserves here: all of them where a tokens window (per
    /// window or per day) is limited, else what the input and output windows
    /// charge (0 when none is).
    fn tokens_reserved(&self, cost: Cost) -> u64 {
        if self.all_tokens_window().is_some() {
            return cost.tokens();
        }
        let part = |i: usize| match &self.windows[i] {
            Some(_) => cost.on(Dimension::WINDOWED[i]),
            None => 0,
        };
        part(2).saturating_add(part(3))
    }

    /// The window dimensions this scope limits, with their limiters.
    fn limited(&self) -> impl Iterator<Item = (usize, Dimension, &Limiter)> {
        (self.windows.iter().enumerate())
            .filter_map(|(i, l)| l.as_ref().map(|l| (i, Dimension::WINDOWED[i], l)))
    }

    /// What the cluster counters need: live buckets per window dimension and the
    /// requests in flight.
    pub fn export(&self, now: Nanos) -> ScopeExport {
        ScopeExport {
            windows: std::array::from_fn(|i| self.windows[i].as_ref().and_then(|l| l.export(now))),
            in_flight: self.in_flight,
            requested: [0; WINDOWS],
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

    /// Would `cost` be admitted now in `lane`? With `busy_above`, also refuse when
    /// any dimension is already at or above that fraction (routing skips busy
    /// upstreams while a fallback exists). All or nothing: every dimension is
    /// checked, and the one that blocks longest is reported.
    pub fn check(
        &self,
        now: Nanos,
        cost: Cost,
        lane: Lane,
        busy_above: Option<Ceiling>,
    ) -> Result<(), Blocked> {
        let mut worst = Worst::default();
        if self.cooling_until_ns > now {
            worst.retry(Dimension::Cooldown, self.cooling_until_ns - now);
        }
        self.check_windows(now, cost, lane, busy_above, &mut worst);
        self.check_cluster_bounds(now, cost, &mut worst);
        self.check_slots(lane, busy_above, &mut worst);
        worst.0.map_or(Ok(()), Err)
    }

    /// What the local windows (and a cooldown) alone keep `cost` in `lane`
    /// out for, if they do. Exact while nothing admitted here is unsettled:
    /// only a settlement (a refund below the reservation, a charge re-dated to
    /// its answer) moves a window's contents other than time does.
    pub fn window_wait(&self, now: Nanos, cost: Cost, lane: Lane) -> Option<Blocked> {
        let mut worst = Worst::default();
        if self.cooling_until_ns > now {
            worst.retry(Dimension::Cooldown, self.cooling_until_ns - now);
        }
        self.check_windows(now, cost, lane, None, &mut worst);
        worst.0
    }

    /// The local windows under the lane's ceiling, and how busy they are.
    fn check_windows(
        &self,
        now: Nanos,
        cost: Cost,
        lane: Lane,
        busy_above: Option<Ceiling>,
        worst: &mut Worst,
    ) {
        let ceiling = self.ceiling(lane);
        for (_, dimension, limiter) in self.limited() {
            if let Some(busy) = busy_above {
                let snapshot = limiter.snapshot(now);
                if snapshot.used >= busy.of(snapshot.capacity) {
                    worst.retry(dimension, snapshot.reset_after_ns.max(1));
                }
            }
            match limiter.check(now, cost.on(dimension), ceiling) {
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
    fn check_cluster_bounds(&self, now: Nanos, cost: Cost, worst: &mut Worst) {
        for (i, dimension, limiter) in self.limited() {
            if let Some(allowance) = &self.allowances.windows[i]
                && limiter
                    .snapshot(now)
                    .used
                    .saturating_add(cost.on(dimension))
                    > allowance.get()
            {
                worst.retry(dimension, ALLOWANCE_RETRY_HINT_NS);
            }
        }
        let now_ms = now / 1_000_000;
        for (credit, dimension) in self.allowances.credits.each() {
            if let Some(credit) = credit
                && !credit.can_spend(cost.on(dimension), now_ms)
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
        cost: Cost,
        lane: Lane,
        busy_above: Option<Ceiling>,
    ) -> Result<Charge, Blocked> {
        self.check(now, cost, lane, busy_above)?;
        let credit = self.spend_credits(now, cost)?;
        let ceiling = self.ceiling(lane);
        // check() just proved each reservation fits; a failure here would be a bug in
        // the limiter's check/reserve agreement, so it is asserted, not handled.
        let reservations = std::array::from_fn(|i| {
            let limiter = self.windows[i].as_mut()?;
            let reserved = limiter.reserve(now, cost.on(Dimension::WINDOWED[i]), ceiling);
            debug_assert!(reserved.is_ok(), "check and reserve disagree");
            reserved.ok()
        });
        self.in_flight += 1;
        let tokens_reserved = self.tokens_reserved(cost);
        Ok(Charge {
            reservations,
            credit,
            tokens_reserved,
            cost,
        })
    }

    /// Spends every leased dimension, or none: the engine may shrink a credit
    /// between `check` and here, so a failure rolls back what was spent.
    fn spend_credits(&self, now: Nanos, cost: Cost) -> Result<Spending, Blocked> {
        let now_ms = now / 1_000_000;
        let credits = self.allowances.credits.each();
        let mut spent: Spending = Default::default();
        for (i, (credit, dimension)) in credits.iter().enumerate() {
            let Some(credit) = credit else { continue };
            let dimension_cost = cost.on(*dimension);
            match credit.try_spend(dimension_cost, now_ms) {
                Some(s) => spent[i] = Some((s, dimension_cost)),
                None => {
                    for (j, done) in spent.iter().enumerate() {
                        if let (Some(c), Some((s, cost))) = (credits[j].0, done) {
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
        let credits = self.allowances.credits.each();
        for (i, entry) in charge.credit[..WINDOWS].iter_mut().enumerate() {
            if let (Some(credit), Some((spent, cost))) = (credits[i].0, entry.as_mut()) {
                *spent = credit.redate(*spent, *cost, now_ms);
            }
        }
        for (limiter, reservation) in self.windows.iter_mut().zip(&mut charge.reservations) {
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
        let now_ms = now / 1_000_000;
        for ((credit, dimension), spent) in self
            .allowances
            .credits
            .each()
            .into_iter()
            .zip(charge.credit)
        {
            if let (Some(credit), Some((spent, cost))) = (credit, spent) {
                credit.settle(spent, cost, how.actual(dimension, cost), now_ms);
            }
        }
        let mut corrections = [Settlement::default(); WINDOWS];
        for (i, reservation) in charge.reservations.into_iter().enumerate() {
            if let (Some(limiter), Some(res)) = (self.windows[i].as_mut(), reservation) {
                let actual = how.actual(Dimension::WINDOWED[i], res.cost);
                corrections[i] = limiter.settle(now, res, actual);
            }
        }
        let tokens = if let Some(i) = self.all_tokens_window() {
            corrections[i]
        } else {
            let [_, _, input, output, ..] = corrections;
            Settlement {
                refunded: input.refunded + output.refunded,
                debt: input.debt + output.debt,
                expired: input.expired + output.expired,
            }
        };
        Settled { tokens }
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
            && self.limited().all(|(_, _, l)| l.is_at_rest(now))
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
        let window = |i: usize| {
            self.windows[i].as_ref().map(|l| {
                let mut status = WindowStatus::from(l.snapshot(now));
                if let Some(allowance) = &self.allowances.windows[i] {
                    let left = allowance.get().saturating_sub(status.used);
                    status.remaining = status.remaining.min(left);
                }
                status
            })
        };
        ScopeStatus {
            requests: window(0),
            tokens: window(1),
            input_tokens: window(2),
            output_tokens: window(3),
            requests_per_day: window(4),
            tokens_per_day: window(5),
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

    fn window(capacity: u64) -> Option<Limiter> {
        Limiter::try_new(LimitSpec::new(
            capacity,
            60 * NANOS_PER_SEC,
            Algorithm::SlidingWindow,
        ))
        .ok()
    }

    fn scope(allowances: Allowances) -> ScopeLimits {
        ScopeLimits::new(
            [window(100), window(10_000), None, None, None, None],
            Some(10),
            Ceiling::FULL,
        )
        .with_allowances(allowances)
    }

    /// A request of `n` prompt tokens and no completion.
    fn tokens(n: u64) -> Cost {
        Cost {
            input: n,
            output: 0,
            output_cap: 0,
        }
    }

    #[test]
    fn reading_slot_demand_asks_for_no_credit() {
        use crate::actor::credit::{Credit, CreditRecipe, Credits};
        let recipe = Arc::new(CreditRecipe {
            windows: tollgate_cluster::counter::Window::try_new(1_000, 10)
                .expect("window")
                .into(),
            policy: tollgate_cluster::lease::budget::CutOffPolicy::Share,
            wake: Arc::default(),
        });
        let slots = Credit::new("tenant:t:concurrency".into(), true, recipe);
        let s = scope(Allowances {
            credits: Credits::new(Default::default(), Some(slots.clone())),
            ..Allowances::default()
        });
        // The engine's export asks every round: no slot credit, so exhausted.
        assert!(s.slots_exhausted(1_000 * NANOS_PER_SEC));
        assert_eq!(slots.take_wanted(), (false, 0), "reading asks for nothing");
    }

    #[test]
    fn cluster_allowance_bounds_the_local_window_and_can_move() {
        let allowance = Allowance::new(500);
        let mut s = scope(Allowances {
            windows: [None, Some(allowance.clone()), None, None, None, None],
            ..Allowances::default()
        });
        let now = 1_000 * NANOS_PER_SEC;
        assert!(s.admit(now, tokens(400), Lane::Interactive, None).is_ok());
        let blocked = s
            .admit(now, tokens(200), Lane::Interactive, None)
            .unwrap_err();
        assert_eq!(
            (blocked.dimension, blocked.never),
            (Dimension::Tokens, false)
        );
        assert_eq!(blocked.retry_after_ns, ALLOWANCE_RETRY_HINT_NS);
        // The sync engine raises this node's allowance: the same request fits.
        allowance.set(600);
        assert!(s.admit(now, tokens(200), Lane::Interactive, None).is_ok());
    }

    #[test]
    fn concurrency_allowance_and_export() {
        let slots = Allowance::new(1);
        let mut s = scope(Allowances {
            concurrency: Some(slots),
            ..Allowances::default()
        });
        let now = 1_000 * NANOS_PER_SEC;
        let charge = s.admit(now, tokens(10), Lane::Interactive, None).unwrap();
        assert_eq!(
            s.admit(now, tokens(10), Lane::Interactive, None)
                .unwrap_err()
                .dimension,
            Dimension::Concurrency
        );
        let export = s.export(now);
        assert_eq!(export.in_flight, 1);
        let (width_ns, buckets) = export.windows[1].clone().unwrap();
        assert_eq!(width_ns, NANOS_PER_SEC);
        assert_eq!(buckets, vec![(1_000, 10)]);
        s.settle(now, charge, Settle::Actual(tokens(4)));
        assert_eq!(
            s.export(now).windows[1].clone().unwrap().1,
            vec![(1_000, 4)]
        );
        assert_eq!(s.export(now).in_flight, 0);
    }

    #[test]
    fn input_and_output_tokens_are_limited_apart_and_settled_apart() {
        // An Anthropic-shaped scope: 1,000 input and 100 output tokens a window.
        let mut s = ScopeLimits::new(
            [None, None, window(1_000), window(100), None, None],
            None,
            Ceiling::FULL,
        );
        let now = 1_000 * NANOS_PER_SEC;
        let first = Cost {
            input: 600,
            output: 80,
            output_cap: 0,
        };
        let charge = s.admit(now, first, Lane::Interactive, None).unwrap();
        assert_eq!(charge.tokens_reserved, 680, "input and output together");
        // Input has room for 300 more; output (max_tokens 40) does not.
        let second = Cost {
            input: 300,
            output: 40,
            output_cap: 0,
        };
        let blocked = s.admit(now, second, Lane::Interactive, None).unwrap_err();
        assert_eq!(blocked.dimension, Dimension::OutputTokens);
        assert!(!blocked.never && blocked.retry_after_ns > 0);
        // The answer used 5 output tokens: the other 75 come back, and the
        // second request fits.
        let used = Cost {
            input: 600,
            output: 5,
            output_cap: 0,
        };
        let settled = s.settle(now, charge, Settle::Actual(used));
        assert_eq!(settled.tokens.refunded, 75, "input's and output's refunds");
        assert!(s.admit(now, second, Lane::Interactive, None).is_ok());
        let status = s.status(now);
        assert_eq!(status.input_tokens.unwrap().used, 900);
        assert_eq!(status.output_tokens.unwrap().used, 45);
        assert_eq!(status.tokens, None);
        // More output than the window holds can never be admitted.
        let huge = Cost {
            input: 1,
            output: 101,
            output_cap: 0,
        };
        let never = s.check(now, huge, Lane::Interactive, None).unwrap_err();
        assert_eq!(
            (never.dimension, never.never),
            (Dimension::OutputTokens, true)
        );
    }

    #[test]
    fn cache_reads_count_as_input_only_where_the_scope_says_so() {
        let s = scope(Allowances::default());
        assert_eq!(s.usage_cost(10, 900, 5).input, 10);
        let counting = scope(Allowances::default()).counting_cache_reads(true);
        assert_eq!(
            counting.usage_cost(10, 900, 5),
            Cost {
                input: 910,
                output: 5,
                output_cap: 0,
            }
        );
    }

    #[test]
    fn a_day_window_refuses_what_the_minute_still_allows_until_its_own_bucket_leaves() {
        // 10 requests a minute, 12 a day (in hourly buckets).
        let day = Limiter::try_new(LimitSpec {
            buckets: 24,
            ..LimitSpec::new(12, 86_400 * NANOS_PER_SEC, Algorithm::SlidingWindow)
        })
        .ok();
        let mut s = ScopeLimits::new(
            [window(10), None, None, None, day, None],
            None,
            Ceiling::FULL,
        );
        let start = 3_600 * NANOS_PER_SEC;
        for _ in 0..10 {
            s.admit(start, tokens(1), Lane::Interactive, None).unwrap();
        }
        // A minute later the minute window is empty; the day holds 2 more.
        let later = start + 61 * NANOS_PER_SEC;
        for _ in 0..2 {
            s.admit(later, tokens(1), Lane::Interactive, None).unwrap();
        }
        let blocked = s
            .admit(later, tokens(1), Lane::Interactive, None)
            .unwrap_err();
        assert_eq!(blocked.dimension, Dimension::RequestsPerDay);
        // Not before the first hour's bucket has left the day window.
        let leaves = 2 * 3_600 * NANOS_PER_SEC + 86_400 * NANOS_PER_SEC;
        assert_eq!(blocked.retry_after_ns, leaves - later);
        let status = s.status(later);
        assert_eq!(status.requests_per_day.unwrap().used, 12);
        assert_eq!(status.requests.unwrap().used, 2);
        assert!(s.admit(leaves, tokens(1), Lane::Interactive, None).is_ok());
    }
}
