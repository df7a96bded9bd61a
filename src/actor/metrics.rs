//! The limiter actors' metrics: families by scope kind, lane, dimension and
//! settlement, and the handles one actor resolves once at spawn so recording a
//! decision is a few atomic adds. `ops::metrics` registers them with the node's
//! other metrics; this module owns what they mean.

use super::task::SettleWith;
use super::{Dimension, Lane, ScopeKind};
use crate::limiter::{NANOS_PER_SEC, Nanos, Settlement};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Static<const N: usize> = [(&'static str, &'static str); N];
type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

/// 1 ms .. ~33 s: queue waits.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Every actor metric family of a node.
#[derive(Debug)]
pub struct ActorMetrics {
    decisions: Family<Static<3>, Counter>,
    queue_depth: Family<Static<1>, Gauge>,
    queue_wait: HistogramFamily<Static<2>>,
    tokens_reserved: Family<Static<1>, Counter>,
    tokens_settled: Family<Static<1>, Counter>,
    tokens_refunded: Family<Static<1>, Counter>,
    tokens_debt: Family<Static<1>, Counter>,
    settlements: Family<Static<2>, Counter>,
    actors: Family<Static<1>, Counter>,
}

impl Default for ActorMetrics {
    fn default() -> ActorMetrics {
        ActorMetrics {
            decisions: Family::default(),
            queue_depth: Family::default(),
            queue_wait: Family::new_with_constructor(seconds_histogram),
            tokens_reserved: Family::default(),
            tokens_settled: Family::default(),
            tokens_refunded: Family::default(),
            tokens_debt: Family::default(),
            settlements: Family::default(),
            actors: Family::default(),
        }
    }
}

impl ActorMetrics {
    /// Adds every family to `registry` (which the node exposes at `/metrics`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "decisions",
            "Limiter decisions by scope, outcome and reason",
            self.decisions.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting in limiter queues",
            self.queue_depth.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time admitted requests waited in a queue",
            self.queue_wait.clone(),
        );
        registry.register(
            "tokens_reserved",
            "Tokens reserved at admission",
            self.tokens_reserved.clone(),
        );
        registry.register(
            "tokens_settled",
            "Tokens charged after settlement",
            self.tokens_settled.clone(),
        );
        registry.register(
            "tokens_refunded",
            "Tokens given back at settlement",
            self.tokens_refunded.clone(),
        );
        registry.register(
            "tokens_debt",
            "Tokens charged beyond the reservation",
            self.tokens_debt.clone(),
        );
        registry.register(
            "settlements",
            "Permits settled, by how they ended",
            self.settlements.clone(),
        );
        registry.register(
            "actors_spawned",
            "Limiter actors started",
            self.actors.clone(),
        );
    }

    /// Handles for one actor of `kind`.
    pub fn scope(&self, kind: ScopeKind) -> ScopeMetrics {
        let scope = kind.as_str();
        let decision = |outcome, reason| {
            self.decisions.get_or_create_owned(&[
                ("scope", scope),
                ("outcome", outcome),
                ("reason", reason),
            ])
        };
        let one =
            |family: &Family<Static<1>, Counter>| family.get_or_create_owned(&[("scope", scope)]);
        let how = |h| {
            self.settlements
                .get_or_create_owned(&[("scope", scope), ("how", h)])
        };
        ScopeMetrics {
            admitted: decision("admitted", ""),
            refused: DIMENSIONS.map(|d| decision("refused", d.as_str())),
            cancelled: decision("cancelled", ""),
            queue_wait: [Lane::Interactive, Lane::Batch].map(|lane| {
                self.queue_wait
                    .get_or_create_owned(&[("scope", scope), ("lane", lane.as_str())])
            }),
            queue_depth: self.queue_depth.get_or_create_owned(&[("scope", scope)]),
            tokens_reserved: one(&self.tokens_reserved),
            tokens_settled: one(&self.tokens_settled),
            tokens_refunded: one(&self.tokens_refunded),
            tokens_debt: one(&self.tokens_debt),
            settlements: ["usage", "keep_reserved", "refund_tokens", "cancel"].map(how),
        }
    }

    /// An actor started.
    pub fn actor_spawned(&self, kind: ScopeKind) {
        self.actors.get_or_create(&[("scope", kind.as_str())]).inc();
    }
}

/// One actor's metric handles, resolved once at spawn so recording a decision is a
/// few atomic adds (no label lookup per message).
pub struct ScopeMetrics {
    admitted: Counter,
    refused: [Counter; DIMENSIONS.len()],
    cancelled: Counter,
    queue_wait: [Histogram; 2],
    queue_depth: Gauge,
    tokens_reserved: Counter,
    tokens_settled: Counter,
    tokens_refunded: Counter,
    tokens_debt: Counter,
    settlements: [Counter; 4],
}

const DIMENSIONS: [Dimension; 9] = [
    Dimension::Requests,
    Dimension::Tokens,
    Dimension::InputTokens,
    Dimension::OutputTokens,
    Dimension::RequestsPerDay,
    Dimension::TokensPerDay,
    Dimension::Concurrency,
    Dimension::Cooldown,
    Dimension::Queue,
];

/// `d`'s place in [`DIMENSIONS`]; a match, so a new dimension cannot compile
/// without a place of its own (a search with a default counted it as another).
fn dimension_index(d: Dimension) -> usize {
    match d {
        Dimension::Requests => 0,
        Dimension::Tokens => 1,
        Dimension::InputTokens => 2,
        Dimension::OutputTokens => 3,
        Dimension::RequestsPerDay => 4,
        Dimension::TokensPerDay => 5,
        Dimension::Concurrency => 6,
        Dimension::Cooldown => 7,
        Dimension::Queue => 8,
    }
}

impl ScopeMetrics {
    /// An actor admitted a request.
    pub fn admitted(&self, lane: Lane, waited_ns: Nanos, tokens: u64) {
        self.admitted.inc();
        let lane = usize::from(lane == Lane::Batch);
        self.queue_wait[lane].observe(waited_ns as f64 / NANOS_PER_SEC as f64);
        self.tokens_reserved.inc_by(tokens);
    }

    /// An actor refused a request.
    pub fn refused(&self, dimension: Dimension) {
        self.refused[dimension_index(dimension)].inc();
    }

    /// A caller went away while queued or before its grant arrived.
    pub fn cancelled(&self) {
        self.cancelled.inc();
    }

    /// Queue depth of this actor moved by `delta`.
    pub fn queue_moved(&self, delta: i64) {
        self.queue_depth.inc_by(delta);
    }

    /// A permit was settled.
    pub fn settled(&self, reserved: u64, settlement: &Settlement, how: SettleWith) {
        let charged = reserved
            .saturating_sub(settlement.refunded)
            .saturating_add(settlement.debt);
        self.tokens_settled.inc_by(charged);
        self.tokens_refunded.inc_by(settlement.refunded);
        self.tokens_debt.inc_by(settlement.debt);
        let index = match how {
            SettleWith::Usage { .. } => 0,
            SettleWith::KeepReserved => 1,
            SettleWith::RefundTokens => 2,
            SettleWith::Cancel => 3,
        };
        self.settlements[index].inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dimension_has_its_own_refusal_counter() {
        for d in DIMENSIONS {
            assert_eq!(DIMENSIONS[dimension_index(d)], d);
        }
    }
}
