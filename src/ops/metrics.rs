//! Prometheus metrics (`prometheus-client`, the official Rust client: atomics, no
//! global registry). Names follow `tollgate_<thing>_<unit>`. Label sets are bounded:
//! scope kinds, lanes, dimensions and configured upstream ids; tenant ids only when
//! `server.metrics_tenant_labels` is on (tenants come from config, so still bounded).

use crate::actor::task::SettleWith;
use crate::actor::{Dimension, Lane, ScopeKind};
use crate::limiter::{NANOS_PER_SEC, Nanos, Settlement};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs.into_iter().map(|(k, v)| (k, v.to_owned())).collect()
}

/// Every metric of a node.
pub struct Metrics {
    registry: Registry,
    decisions: Family<Labels, Counter>,
    queue_depth: Family<Labels, Gauge>,
    queue_wait: HistogramFamily,
    tokens_reserved: Family<Labels, Counter>,
    tokens_settled: Family<Labels, Counter>,
    tokens_refunded: Family<Labels, Counter>,
    tokens_debt: Family<Labels, Counter>,
    actors: Family<Labels, Counter>,
    upstream_latency: HistogramFamily,
    upstream_responses: Family<Labels, Counter>,
    requests: Family<Labels, Counter>,
    in_flight: Gauge,
    tenant_labels: bool,
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// 1 ms .. ~33 s: queue waits and upstream latencies.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Metrics {
    /// A fresh registry; `tenant_labels` adds tenant ids to request counters.
    pub fn new(tenant_labels: bool) -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("tollgate"),
            decisions: Family::default(),
            queue_depth: Family::default(),
            queue_wait: Family::new_with_constructor(seconds_histogram),
            tokens_reserved: Family::default(),
            tokens_settled: Family::default(),
            tokens_refunded: Family::default(),
            tokens_debt: Family::default(),
            actors: Family::default(),
            upstream_latency: Family::new_with_constructor(seconds_histogram),
            upstream_responses: Family::default(),
            requests: Family::default(),
            in_flight: Gauge::default(),
            tenant_labels,
        };
        let r = &mut m.registry;
        r.register(
            "decisions",
            "Limiter decisions by scope, outcome and reason",
            m.decisions.clone(),
        );
        r.register(
            "queue_depth",
            "Requests waiting in limiter queues",
            m.queue_depth.clone(),
        );
        r.register(
            "queue_wait_seconds",
            "Time admitted requests waited in a queue",
            m.queue_wait.clone(),
        );
        r.register(
            "tokens_reserved",
            "Tokens reserved at admission",
            m.tokens_reserved.clone(),
        );
        r.register(
            "tokens_settled",
            "Tokens charged after settlement",
            m.tokens_settled.clone(),
        );
        r.register(
            "tokens_refunded",
            "Tokens given back at settlement",
            m.tokens_refunded.clone(),
        );
        r.register(
            "tokens_debt",
            "Tokens charged beyond the reservation",
            m.tokens_debt.clone(),
        );
        r.register("actors_spawned", "Limiter actors started", m.actors.clone());
        r.register(
            "upstream_latency_seconds",
            "Upstream time to response headers",
            m.upstream_latency.clone(),
        );
        r.register(
            "upstream_responses",
            "Upstream responses by upstream and status class",
            m.upstream_responses.clone(),
        );
        r.register(
            "requests",
            "Client requests by API and final status",
            m.requests.clone(),
        );
        r.register(
            "in_flight_requests",
            "Client requests being served",
            m.in_flight.clone(),
        );
        m
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// An actor admitted a request.
    pub fn admitted(&self, kind: ScopeKind, lane: Lane, waited_ns: Nanos, tokens: u64) {
        let scope = kind.as_str();
        self.decisions
            .get_or_create(&labels([
                ("scope", scope),
                ("outcome", "admitted"),
                ("reason", ""),
            ]))
            .inc();
        self.queue_wait
            .get_or_create(&labels([("scope", scope), ("lane", lane.as_str())]))
            .observe(waited_ns as f64 / NANOS_PER_SEC as f64);
        self.tokens_reserved
            .get_or_create(&labels([("scope", scope)]))
            .inc_by(tokens);
    }

    /// An actor refused a request.
    pub fn refused(&self, kind: ScopeKind, dimension: Dimension) {
        let labels = labels([
            ("scope", kind.as_str()),
            ("outcome", "refused"),
            ("reason", dimension.as_str()),
        ]);
        self.decisions.get_or_create(&labels).inc();
    }

    /// A caller went away while queued or before its grant arrived.
    pub fn cancelled(&self, kind: ScopeKind) {
        let labels = labels([
            ("scope", kind.as_str()),
            ("outcome", "cancelled"),
            ("reason", ""),
        ]);
        self.decisions.get_or_create(&labels).inc();
    }

    /// Queue depth of one actor moved by `delta`.
    pub fn queue_moved(&self, kind: ScopeKind, delta: i64) {
        self.queue_depth
            .get_or_create(&labels([("scope", kind.as_str())]))
            .inc_by(delta);
    }

    /// A permit was settled.
    pub fn settled(
        &self,
        kind: ScopeKind,
        reserved: u64,
        settlement: &Settlement,
        how: SettleWith,
    ) {
        let scope = labels([("scope", kind.as_str())]);
        let charged = reserved
            .saturating_sub(settlement.refunded)
            .saturating_add(settlement.debt);
        self.tokens_settled.get_or_create(&scope).inc_by(charged);
        self.tokens_refunded
            .get_or_create(&scope)
            .inc_by(settlement.refunded);
        self.tokens_debt
            .get_or_create(&scope)
            .inc_by(settlement.debt);
        let _ = how;
    }

    /// An actor started.
    pub fn actor_spawned(&self, kind: ScopeKind) {
        self.actors
            .get_or_create(&labels([("scope", kind.as_str())]))
            .inc();
    }

    /// An upstream answered (or failed) after `seconds`.
    pub fn upstream_response(&self, upstream: &str, status: Option<u16>, seconds: f64) {
        let class = match status {
            Some(429) => "429",
            Some(s) if s < 300 => "2xx",
            Some(s) if s < 500 => "4xx",
            Some(_) => "5xx",
            None => "error",
        };
        self.upstream_responses
            .get_or_create(&labels([("upstream", upstream), ("status", class)]))
            .inc();
        self.upstream_latency
            .get_or_create(&labels([("upstream", upstream)]))
            .observe(seconds);
    }

    /// A client request finished with `status`.
    pub fn request_done(&self, api: &str, tenant: Option<&str>, status: u16) {
        let status = status.to_string();
        let mut set = labels([("api", api), ("status", &status)]);
        if self.tenant_labels {
            set.push(("tenant", tenant.unwrap_or("").to_owned()));
        }
        self.requests.get_or_create(&set).inc();
    }

    /// Requests in flight moved by `delta`.
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.inc_by(delta);
    }
}
