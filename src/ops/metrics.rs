//! Prometheus metrics (`prometheus-client`, the official Rust client: atomics, no
//! global registry). Names follow `tollgate_<thing>_<unit>`. Label sets are bounded:
//! scope kinds, lanes, dimensions, status codes and configured upstream ids; tenant
//! ids only when `server.metrics_tenant_labels` is on (tenants come from config, so
//! still bounded).
//!
//! Label sets are fixed-size arrays of `&'static str` (or an `Arc<String>` for
//! upstream ids), so recording on the hot path allocates nothing.

use crate::actor::metrics::ActorMetrics;
use crate::api::Api;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;

type Static<const N: usize> = [(&'static str, &'static str); N];
type ByUpstream = [(&'static str, Arc<str>); 1];
type ByUpstreamStatus = (ByUpstream, Static<1>);
type ByApiStatus = (Static<1>, [(&'static str, u16); 1]);
type ByTenant = ([(&'static str, Arc<str>); 1], [(&'static str, u16); 1]);
type HistogramFamily<S> = Family<S, Histogram, fn() -> Histogram>;

/// 1 ms .. ~33 s: queue waits and upstream latencies.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// 50 us .. ~0.8 s: Redis round trips.
fn micros_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 15))
}

/// Every metric of a node.
pub struct Metrics {
    registry: Registry,
    /// The limiter actors' metrics (registered here, recorded by `actor`).
    actors: Arc<ActorMetrics>,
    upstream_latency: HistogramFamily<ByUpstream>,
    upstream_responses: Family<ByUpstreamStatus, Counter>,
    requests: Family<ByApiStatus, Counter>,
    /// Each API's series of `requests` with status 200, made at start: nearly
    /// every request ends in one, and a family lookup hashes its labels under
    /// a lock.
    ok_requests: [Counter; Api::ALL.len()],
    tenant_requests: Family<ByTenant, Counter>,
    in_flight: Gauge,
    runtime_workers: Gauge,
    sync_bytes: Counter,
    sync_round: Histogram,
    gossip_refused: Counter,
    members: Gauge,
    degraded: Family<Static<2>, Gauge>,
    sync_received: Counter,
    convergence_lag_ms: Gauge,
    state_bytes: Gauge,
    lease_statements: Family<Static<2>, Counter>,
    lease_granted: Counter,
    lease_expired: Counter,
    rpc_refused: Family<Static<1>, Counter>,
    gossip_datagrams_refused: Family<Static<1>, Counter>,
    spilled: Family<Static<1>, Counter>,
    spill_received: Family<ByApiStatus, Counter>,
    prompt_count_memo: Family<Static<1>, Counter>,
    redis_latency: HistogramFamily<Static<1>>,
    redis_errors: Family<Static<2>, Counter>,
    redis_orphans_released: Counter,
    usage_clamped: Counter,
    connections: super::connections::ConnectionMetrics,
    tenant_labels: bool,
}

/// The value of one series in rendered exposition `text`: `series` is the name
/// with its labels as rendered, e.g.
/// `tollgate_redis_script_seconds_count{script="reserve"}` (benches, tests and
/// tools reading a node's `/metrics`).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    (text.lines()).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The `status` label of `tollgate_upstream_responses_total`, in
/// [`UpstreamMetrics`]' order.
const STATUS_CLASSES: [&str; 6] = ["2xx", "3xx", "429", "4xx", "5xx", "error"];

/// One upstream's response counters and latency histogram ([`Metrics::upstream`]).
#[derive(Clone, Debug)]
pub struct UpstreamMetrics {
    responses: [Counter; STATUS_CLASSES.len()],
    latency: Histogram,
}

impl UpstreamMetrics {
    /// The upstream answered with `status` (`None`: no answer) after `seconds`.
    pub fn response(&self, status: Option<u16>, seconds: f64) {
        let class = match status {
            Some(s) if s < 300 => 0,
            // A redirect is a misconfigured `base_url`, not the client's mistake.
            Some(s) if s < 400 => 1,
            Some(429) => 2,
            Some(s) if s < 500 => 3,
            Some(_) => 4,
            None => 5,
        };
        self.responses[class].inc();
        self.latency.observe(seconds);
    }
}

impl Metrics {
    /// The limiter actors' metrics, for the actor registry.
    pub fn actors(&self) -> Arc<ActorMetrics> {
        self.actors.clone()
    }

    /// A fresh registry; `tenant_labels` adds `tollgate_tenant_requests_total`.
    pub fn new(tenant_labels: bool) -> Metrics {
        let mut m = Metrics {
            registry: Registry::with_prefix("tollgate"),
            actors: Arc::new(ActorMetrics::default()),
            upstream_latency: Family::new_with_constructor(seconds_histogram),
            upstream_responses: Family::default(),
            requests: Family::default(),
            ok_requests: Default::default(),
            tenant_requests: Family::default(),
            in_flight: Gauge::default(),
            runtime_workers: Gauge::default(),
            sync_bytes: Counter::default(),
            sync_round: micros_histogram(),
            gossip_refused: Counter::default(),
            members: Gauge::default(),
            degraded: Family::default(),
            sync_received: Counter::default(),
            convergence_lag_ms: Gauge::default(),
            state_bytes: Gauge::default(),
            lease_statements: Family::default(),
            lease_granted: Counter::default(),
            lease_expired: Counter::default(),
            rpc_refused: Family::default(),
            gossip_datagrams_refused: Family::default(),
            spilled: Family::default(),
            spill_received: Family::default(),
            prompt_count_memo: Family::default(),
            redis_latency: Family::new_with_constructor(micros_histogram),
            redis_errors: Family::default(),
            redis_orphans_released: Counter::default(),
            usage_clamped: Counter::default(),
            connections: Default::default(),
            tenant_labels,
        };
        m.ok_requests = Api::ALL.map(|api| {
            (m.requests).get_or_create_owned(&([("api", api.as_str())], [("status", 200)]))
        });
        m.register_request_path();
        m.register_sync();
        m.register_lease_redis_spill();
        m.connections.register(&mut m.registry);
        m
    }

    /// The request path's families: the actors', upstreams', requests'.
    fn register_request_path(&mut self) {
        let r = &mut self.registry;
        self.actors.register(r);
        r.register(
            "upstream_latency_seconds",
            "Upstream time to response headers",
            self.upstream_latency.clone(),
        );
        r.register(
            "upstream_responses",
            "Upstream responses by upstream and status class",
            self.upstream_responses.clone(),
        );
        r.register(
            "requests",
            "Client requests by API and final status",
            self.requests.clone(),
        );
        if self.tenant_labels {
            r.register(
                "tenant_requests",
                "Client requests by tenant and final status",
                self.tenant_requests.clone(),
            );
        }
        r.register(
            "in_flight_requests",
            "Client requests being served",
            self.in_flight.clone(),
        );
        r.register(
            "runtime_worker_threads",
            "Tokio worker threads serving this node (server.worker_threads)",
            self.runtime_workers.clone(),
        );
    }

    /// Cluster sync's families: what a round publishes, reads and takes.
    fn register_sync(&mut self) {
        let r = &mut self.registry;
        r.register(
            "sync_published_bytes",
            "Usage bytes this node published to the cluster",
            self.sync_bytes.clone(),
        );
        r.register(
            "sync_round_seconds",
            "Time one sync round took (publish, read the cluster, recompute); above the sync interval, rounds fall behind",
            self.sync_round.clone(),
        );
        r.register(
            "gossip_values_refused",
            "Gossip values from peers that did not decode",
            self.gossip_refused.clone(),
        );
        r.register(
            "cluster_live_members",
            "Live cluster members, this node included",
            self.members.clone(),
        );
        r.register(
            "degraded",
            "1 while this node runs degraded, by scope and reason",
            self.degraded.clone(),
        );
        r.register(
            "sync_state_bytes",
            "Weight of this node's published cluster state against its cap (8 MiB, or the key cap); at the cap publishes are refused",
            self.state_bytes.clone(),
        );
        r.register(
            "sync_received_bytes",
            "Usage bytes this node read from live members' gossiped state",
            self.sync_received.clone(),
        );
        r.register(
            "sync_convergence_lag_ms",
            "Age of the stalest live member's last published round, as seen here (ms)",
            self.convergence_lag_ms.clone(),
        );
    }

    /// Lease, Redis, the internal RPC, spillover and the count memo.
    fn register_lease_redis_spill(&mut self) {
        let r = &mut self.registry;
        r.register(
            "lease_statements",
            "Lease statements by side (holder: sent, owner: received) and outcome",
            self.lease_statements.clone(),
        );
        r.register(
            "lease_granted_units",
            "Credit (requests, tokens or slots) this node granted as a key owner",
            self.lease_granted.clone(),
        );
        r.register(
            "lease_expiries",
            "Credits that ended at this owner without a new statement (silent holders)",
            self.lease_expired.clone(),
        );
        r.register(
            "redis_script_seconds",
            "Latency of Redis script calls, by script",
            self.redis_latency.clone(),
        );
        r.register(
            "redis_errors",
            "Redis script calls without an answer, by script and kind (timeout, error)",
            self.redis_errors.clone(),
        );
        r.register(
            "redis_orphaned_slots_released",
            "Concurrency slots in Redis that calls without an answer had taken or left held, released once Redis answered",
            self.redis_orphans_released.clone(),
        );
        r.register(
            "internal_rpc_refused",
            "Internal RPCs refused, by reason (authentication, other cluster, bad input)",
            self.rpc_refused.clone(),
        );
        r.register(
            "gossip_datagrams_refused",
            "Gossip datagrams dropped unread, by reason (no or a wrong tag under the cluster secret, stale, replayed)",
            self.gossip_datagrams_refused.clone(),
        );
        r.register(
            "spilled",
            "Requests this node would have refused and sent to a peer instead (spillover), by outcome: served (the peer answered other than 429), refused (the peer's 429), failed (no answer: the client got this node's own 429), no_peer (no peer had room by the gossiped figures)",
            self.spilled.clone(),
        );
        r.register(
            "spill_received",
            "Requests a peer spilled to this node, by API and status (counted here instead of tollgate_requests_total, which the sending node counts)",
            self.spill_received.clone(),
        );
        r.register(
            "usage_clamped",
            "Upstream answers whose usage figure exceeded what the request could have used (its max_tokens, twice its input estimate), clamped before settling",
            self.usage_clamped.clone(),
        );
        r.register(
            "prompt_count_memo",
            "Texts of an estimate the node's count memo takes (256 bytes and up, under a BPE encoding), by outcome: hit (counted lately for the same tenant, answered from the memo) or miss (counted)",
            self.prompt_count_memo.clone(),
        );
    }

    /// The counters of the node's token count memo: hits, misses.
    pub fn prompt_count_memo(&self) -> (Counter, Counter) {
        let counter = |outcome| {
            (self.prompt_count_memo)
                .get_or_create(&[("outcome", outcome)])
                .clone()
        };
        (counter("hit"), counter("miss"))
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        self.connections.refresh();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// An upstream's usage figure was clamped to its request's bound.
    pub fn usage_clamped(&self) {
        self.usage_clamped.inc();
    }

    /// The listeners' connection figures and the descriptor limit.
    pub fn connections(&self) -> &super::connections::ConnectionMetrics {
        &self.connections
    }

    /// Handles for one upstream's response metrics, made when the node starts:
    /// every response passes [`UpstreamMetrics::response`], and a family lookup
    /// would hash the labels under a lock each time. Its six status series
    /// start at zero.
    pub fn upstream(&self, upstream: &Arc<str>) -> UpstreamMetrics {
        UpstreamMetrics {
            responses: STATUS_CLASSES.map(|class| {
                self.upstream_responses
                    .get_or_create_owned(&([("upstream", upstream.clone())], [("status", class)]))
            }),
            latency: self
                .upstream_latency
                .get_or_create_owned(&[("upstream", upstream.clone())]),
        }
    }

    /// A client request finished with `status`.
    pub fn request_done(&self, api: Api, tenant: Option<&Arc<str>>, status: u16) {
        if status == 200 {
            self.ok_requests[api.index()].inc();
        } else {
            self.requests
                .get_or_create(&([("api", api.as_str())], [("status", status)]))
                .inc();
        }
        if self.tenant_labels
            && let Some(tenant) = tenant
        {
            self.tenant_requests
                .get_or_create(&([("tenant", tenant.clone())], [("status", status)]))
                .inc();
        }
    }

    /// The runtime serving this node has `workers` worker threads.
    pub fn runtime_workers(&self, workers: usize) {
        self.runtime_workers
            .set(i64::try_from(workers).unwrap_or(i64::MAX));
    }

    /// One cluster sync round finished.
    pub fn sync_round(&self, bytes_published: u64, refused_values: u64, live_members: i64) {
        self.sync_bytes.inc_by(bytes_published);
        self.gossip_refused.inc_by(refused_values);
        self.members.set(live_members);
    }

    /// How long one sync round took.
    pub fn sync_round_took(&self, took: std::time::Duration) {
        self.sync_round.observe(took.as_secs_f64());
    }

    /// The weight of this node's published state after a round's write.
    pub fn sync_state(&self, bytes: usize) {
        self.state_bytes.set(bytes as i64);
    }

    /// Bytes read from peers' gossiped state in one round, and the convergence lag.
    pub fn sync_received(&self, bytes: u64, lag_ms: i64) {
        self.sync_received.inc_by(bytes);
        self.convergence_lag_ms.set(lag_ms);
    }

    /// One lease statement by `side` (`holder`, `owner`) with `outcome`.
    pub fn lease_statement(&self, side: &'static str, outcome: &'static str) {
        self.lease_statements
            .get_or_create(&[("side", side), ("outcome", outcome)])
            .inc();
    }

    /// Credit granted and credits expired at this owner.
    pub fn lease_owner(&self, granted: u64, expired: u64) {
        self.lease_granted.inc_by(granted);
        self.lease_expired.inc_by(expired);
    }

    /// One Redis script call: its latency, and its failure kind if it failed.
    pub fn redis_call(&self, script: &'static str, seconds: f64, failed: Option<&'static str>) {
        self.redis_latency
            .get_or_create(&[("script", script)])
            .observe(seconds);
        if let Some(kind) = failed {
            self.redis_errors
                .get_or_create(&[("script", script), ("kind", kind)])
                .inc();
        }
    }

    /// Slots that calls without an answer had left held in Redis, now released.
    pub fn redis_orphans_released(&self, slots: u64) {
        self.redis_orphans_released.inc_by(slots);
    }

    /// An internal RPC refused for `reason`.
    pub fn rpc_refused(&self, reason: &'static str) {
        self.rpc_refused.get_or_create(&[("reason", reason)]).inc();
    }

    /// A gossip datagram dropped before chitchat read it, by `reason`.
    pub fn gossip_datagram_refused(&self, reason: &'static str) {
        (self.gossip_datagrams_refused)
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// A request spillover handled, by `outcome`.
    pub fn spilled(&self, outcome: &'static str) {
        self.spilled.get_or_create(&[("outcome", outcome)]).inc();
    }

    /// A request a peer spilled here ended with `status`.
    pub fn spill_received(&self, api: &'static str, status: u16) {
        self.spill_received
            .get_or_create(&([("api", api)], [("status", status)]))
            .inc();
    }

    /// Sets whether this node is degraded for `reason` (cluster scope).
    pub fn degraded(&self, reason: &'static str, on: bool) {
        self.degraded
            .get_or_create(&[("scope", "cluster"), ("reason", reason)])
            .set(i64::from(on));
    }

    /// Requests in flight moved by `delta`.
    pub fn in_flight(&self, delta: i64) {
        self.in_flight.inc_by(delta);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_requests_are_counted_by_api_and_status_200s_from_zero() {
        let metrics = Metrics::new(false);
        let series = |api: &str, status: u16| {
            format!("tollgate_requests_total{{api=\"{api}\",status=\"{status}\"}}")
        };
        for api in Api::ALL {
            assert_eq!(
                sample(&metrics.render(), &series(api.as_str(), 200)),
                Some(0.0)
            );
        }
        for (api, status) in [(Api::Chat, 200), (Api::Chat, 200), (Api::Chat, 429)] {
            metrics.request_done(api, None, status);
        }
        metrics.request_done(Api::Messages, None, 200);
        let text = metrics.render();
        assert_eq!(sample(&text, &series("chat", 200)), Some(2.0));
        assert_eq!(sample(&text, &series("chat", 429)), Some(1.0));
        assert_eq!(sample(&text, &series("messages", 200)), Some(1.0));
        assert_eq!(sample(&text, &series("embeddings", 200)), Some(0.0));
        assert_eq!(sample(&text, &series("embeddings", 429)), None);
    }

    #[test]
    fn an_upstreams_answers_are_counted_by_class_from_zero() {
        let metrics = Metrics::new(false);
        let mock = metrics.upstream(&Arc::from("mock"));
        let series = |class: &str| {
            format!("tollgate_upstream_responses_total{{upstream=\"mock\",status=\"{class}\"}}")
        };
        let text = metrics.render();
        for class in STATUS_CLASSES {
            assert_eq!(sample(&text, &series(class)), Some(0.0), "{class} from 0");
        }
        let answers = [
            Some(200),
            Some(204),
            Some(302),
            Some(429),
            Some(404),
            Some(503),
            None,
        ];
        for status in answers {
            mock.response(status, 0.01);
        }
        let text = metrics.render();
        for (class, count) in [
            ("2xx", 2.0),
            ("3xx", 1.0),
            ("429", 1.0),
            ("4xx", 1.0),
            ("5xx", 1.0),
            ("error", 1.0),
        ] {
            assert_eq!(sample(&text, &series(class)), Some(count), "{class}");
        }
        let latency = "tollgate_upstream_latency_seconds_count{upstream=\"mock\"}";
        assert_eq!(sample(&text, latency), Some(answers.len() as f64));
    }
}
