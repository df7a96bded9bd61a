//! Everything a request handler needs, built once from the config by the server
//! (`server::build`): tenants by key hash, upstreams, routes, the actor
//! registry, the HTTP client, metrics and bounds.

use super::error::ApiError;
use crate::actor::Binding;
use crate::actor::credit::CreditTable;
use crate::actor::{Registry, ScopeId};
use crate::config::{CompletionPolicy, Config, UpstreamKind};
use crate::ops::metrics::{Metrics, UpstreamMetrics};
use crate::tokens::{CountMemo, Encoding};
use crate::upstream_http::{Endpoint, UpstreamHttp};
use axum::http::HeaderValue;
use sha2::Digest;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;
use tokio::sync::Semaphore;

/// A tenant as the request path sees it.
#[derive(Debug)]
pub struct Tenant {
    /// Configured id (also its metric label; one allocation shared with `scope`).
    pub id: Arc<str>,
    /// Its actor's scope.
    pub scope: ScopeId,
    /// Queue wait cap (and default).
    pub max_wait: Duration,
    /// Its quotas for some models.
    pub model_groups: ModelScopes,
    /// The most prompt tokens worth counting for one of its requests: its
    /// smallest window that charges input (`tpm`, `itpm`, `tpd`), which a
    /// prompt with more tokens exceeds alone (`tokens::CountBudget`).
    pub input_budget: Option<u64>,
}

/// A tenant's or an upstream's model groups in config order: each one's
/// patterns and its scope.
#[derive(Debug, Default)]
pub struct ModelScopes(Vec<(Vec<String>, ScopeId)>);

impl ModelScopes {
    /// The groups of `owner` as configured.
    pub fn new(owner: &ScopeId, groups: &[crate::config::ModelLimitConfig]) -> ModelScopes {
        ModelScopes(
            (groups.iter())
                .map(|g| {
                    let scope = ScopeId::model_group(owner, g.group_name());
                    (g.models.clone(), scope)
                })
                .collect(),
        )
    }

    /// The scope of the first group whose patterns match `model`.
    pub fn for_model(&self, model: &str) -> Option<&ScopeId> {
        (self.0.iter())
            .find(|(patterns, _)| {
                patterns
                    .iter()
                    .any(|p| crate::config::model_matches(p, model))
            })
            .map(|(_, scope)| scope)
    }
}

/// An upstream as the request path sees it.
#[derive(Debug)]
pub struct Upstream {
    /// Configured id (also its metric label: shared, so labelling allocates
    /// nothing).
    pub id: Arc<str>,
    /// API flavour.
    pub kind: UpstreamKind,
    /// Endpoint per API, parsed once (`base_url` + the API's path), indexed by
    /// [`Api::index`].
    pub endpoints: [Endpoint; crate::api::Api::ALL.len()],
    /// Its model list, `base_url` + `/models` (`GET /v1/models` for routes
    /// with patterns).
    pub models: Endpoint,
    /// Its `base_url`, without a trailing `/`: where passed-through paths go.
    pub base_url: Arc<str>,
    /// The provider key as the header each API family sends it in, made once
    /// (marked sensitive: never logged): `authorization: Bearer <key>` and
    /// `x-api-key: <key>`. `None` without a key.
    pub credentials: Option<Credentials>,
    /// Time to response headers.
    pub timeout: Duration,
    /// Longest silence inside a stream.
    pub stream_idle_timeout: Duration,
    /// Its actor's scope.
    pub scope: ScopeId,
    /// The provider's limits for some of its models.
    pub model_groups: ModelScopes,
    /// Its response metrics.
    pub metrics: UpstreamMetrics,
}

/// An upstream's key, ready to send.
#[derive(Debug)]
pub struct Credentials {
    /// `Bearer <key>` (OpenAI-style APIs).
    pub bearer: HeaderValue,
    /// The key alone (Anthropic's `x-api-key`).
    pub key: HeaderValue,
}

impl Credentials {
    /// The key as both headers carry it; `validate()` proved it is a header value.
    pub fn new(key: &str) -> Result<Credentials, ApiError> {
        let value = |text: &str| {
            let mut value = HeaderValue::from_str(text)
                .map_err(|_| ApiError::bad_gateway("an upstream api_key is not a header value"))?;
            value.set_sensitive(true);
            Ok::<_, ApiError>(value)
        };
        Ok(Credentials {
            bearer: value(&format!("Bearer {key}"))?,
            key: value(key)?,
        })
    }
}

/// A model route.
#[derive(Debug)]
pub struct Route {
    patterns: Vec<String>,
    /// Upstreams in preference order, apart by the API they speak (indexed by
    /// [`kind_index`]): worked out once here, not on every request.
    by_kind: [Vec<Arc<Upstream>>; 2],
    /// Encoding override.
    pub encoding: Option<Encoding>,
    /// The endpoint families passed through to its first OpenAI upstream.
    pub passthrough: Vec<crate::config::Passthrough>,
}

fn kind_index(kind: UpstreamKind) -> usize {
    match kind {
        UpstreamKind::Openai => 0,
        UpstreamKind::Anthropic => 1,
    }
}

impl Route {
    /// A route for `patterns` (exact names or `prefix*`) over `upstreams` in
    /// preference order, counting with `encoding` where given.
    pub fn new(
        patterns: Vec<String>,
        upstreams: impl IntoIterator<Item = Arc<Upstream>>,
        encoding: Option<Encoding>,
    ) -> Route {
        let mut by_kind: [Vec<Arc<Upstream>>; 2] = Default::default();
        for upstream in upstreams {
            by_kind[kind_index(upstream.kind)].push(upstream);
        }
        Route {
            patterns,
            by_kind,
            encoding,
            passthrough: Vec::new(),
        }
    }

    /// The route's upstreams speaking `kind`, in preference order.
    pub fn upstreams_for(&self, kind: UpstreamKind) -> &[Arc<Upstream>] {
        &self.by_kind[kind_index(kind)]
    }

    /// Every upstream of the route.
    pub fn upstreams(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.by_kind.iter().flatten()
    }

    fn matches(&self, model: &str) -> bool {
        (self.patterns.iter()).any(|p| crate::config::model_matches(p, model))
    }

    /// Whether the route has patterns (`*`, `prefix*`), whose models only its
    /// upstreams can list.
    pub fn has_patterns(&self) -> bool {
        self.patterns.iter().any(|p| p.ends_with('*'))
    }

    /// Whether `model` is one of the route's patterns' (not its exact names).
    pub fn pattern_matches(&self, model: &str) -> bool {
        (self.patterns.iter())
            .filter_map(|p| p.strip_suffix('*'))
            .any(|prefix| model.starts_with(prefix))
    }

    /// Exact model names (for `/v1/models`).
    pub fn exact_models(&self) -> impl Iterator<Item = &str> {
        self.patterns
            .iter()
            .filter(|p| !p.ends_with('*'))
            .map(String::as_str)
    }
}

/// Shared state of the proxy.
pub struct AppState {
    /// The validated config, without its tenants: `tenants` holds them (built
    /// once; the parsed list would otherwise be most of a configured tenant's
    /// memory).
    pub config: Config,
    /// Tenants by SHA-256 of their API keys (raw digest: no hex on the hot path).
    pub tenants: HashMap<[u8; 32], Arc<Tenant>>,
    /// Routes in config order.
    pub routes: Vec<Route>,
    /// Limiter actors.
    pub registry: Arc<Registry>,
    /// The client upstream requests go out through; its reqwest client also
    /// carries spilled requests to peers (`UpstreamHttp::reqwest`).
    pub upstream_http: UpstreamHttp,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Node-wide bound on requests in flight.
    pub in_flight: Arc<Semaphore>,
    /// Encoding for models tiktoken does not know.
    pub default_encoding: Encoding,
    /// Token counts of long texts counted lately, per tenant (`tokens::CountMemo`).
    pub count_memo: CountMemo,
    /// Set when shutdown starts (readyz turns 503).
    pub draining: Arc<AtomicBool>,
    /// Set for good once a newer process runs under this node's `node_id`
    /// (`sync::engine`): peers follow that one, so this one admits nothing more.
    pub superseded: Arc<AtomicBool>,
    /// Seeds per-request RNGs (backoff jitter) from one configured stream.
    pub rng_counter: AtomicU64,
    /// Keys whose cluster allowance the sync engine maintains (empty on one node
    /// and in `local full` mode).
    pub bindings: Arc<[Binding]>,
    /// `redis` mode: the Redis gate every admission goes through (set when the
    /// cluster starts).
    pub redis_gate: Arc<std::sync::OnceLock<Arc<crate::redis::gate::RedisGate>>>,
    /// `lease` mode: the lines this node owns (set when the cluster starts).
    pub lease_book: Arc<std::sync::OnceLock<Arc<crate::sync::lease::owner::OwnerBook>>>,
    /// `lease` modes: the credits of the keys used here, made at first use.
    pub credits: Option<Arc<CreditTable>>,
    /// Wakes the sync engine's lease holder loop when an actor runs low on credit.
    pub credit_wake: Arc<tokio::sync::Notify>,
    /// The cluster as this node sees it (`[cluster]` configured only).
    pub cluster_status: Option<Arc<parking_lot::Mutex<crate::sync::status::ClusterStatus>>>,
    /// Whether this process stalled since a request was admitted (its ticker is
    /// started with the server).
    pub stall_watch: Arc<super::stall::StallWatch>,
    /// Each upstream's model list, for routes with patterns (`super::models`).
    pub model_lists: super::models::ModelLists,
    /// `lease` mode with `cluster.lease.spillover`: the peers' room, which the
    /// sync engine writes each round (`super::spill`).
    pub spill: Option<Arc<crate::sync::spill::Board>>,
}

impl AppState {
    /// The tenant owning `api_key`.
    pub fn tenant_for_key(&self, api_key: &str) -> Option<&Arc<Tenant>> {
        let digest: [u8; 32] = sha2::Sha256::digest(api_key.as_bytes()).into();
        self.tenants.get(&digest)
    }

    /// The first route serving `model`.
    pub fn route_for(&self, model: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.matches(model))
    }

    /// Where `family` is passed through: the first OpenAI upstream of the
    /// first route that lists it.
    pub fn passthrough_to(&self, family: crate::config::Passthrough) -> Option<&Arc<Upstream>> {
        (self.routes.iter())
            .find(|r| r.passthrough.contains(&family))
            .and_then(|r| r.upstreams_for(UpstreamKind::Openai).first())
    }

    /// Encoding for `model` on `route`.
    pub fn encoding_for(&self, route: &Route, model: &str) -> Encoding {
        route
            .encoding
            .or_else(|| Encoding::for_openai_model(model))
            .unwrap_or(self.default_encoding)
    }

    /// The handles cluster sync works on: the same registry, bindings, flags
    /// and boards as the request path's. `spilled` serves requests peers spill
    /// here (spillover on).
    pub fn sync_parts(
        &self,
        spilled: Option<crate::sync::parts::SpilledRequests>,
    ) -> crate::sync::parts::NodeParts {
        crate::sync::parts::NodeParts {
            registry: self.registry.clone(),
            bindings: self.bindings.clone(),
            metrics: self.metrics.clone(),
            limits: self.config.limits.clone(),
            redis: self.config.redis.clone(),
            credits: self.credits.clone(),
            credit_wake: self.credit_wake.clone(),
            superseded: self.superseded.clone(),
            spill: self.spill.clone(),
            spilled,
            max_body_bytes: self.config.server.max_body_bytes,
            cluster_status: self.cluster_status.clone(),
            lease_book: self.lease_book.clone(),
            redis_gate: self.redis_gate.clone(),
        }
    }

    /// Is the completion policy adaptive?
    pub fn adaptive(&self) -> bool {
        self.config.estimation.completion == CompletionPolicy::Adaptive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH_PROCESS: &str = "TOLLGATE_TEST_FRESH_PROCESS";

    /// A new state has loaded every BPE encoding, not just its default one, so
    /// no request loads tables on its worker. The tables are process-wide and
    /// other tests load them, so the check runs in a process of its own: this
    /// test binary again, running only the test below.
    #[test]
    fn a_new_state_has_loaded_every_bpe_encoding() {
        let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "proxy::state::tests::in_fresh_process_state_loads_every_bpe",
            ])
            .args(["--ignored", "--test-threads=1", "--nocapture"])
            .env(FRESH_PROCESS, "1")
            .output()
            .expect("run the test binary");
        let stdout = String::from_utf8_lossy(&child.stdout);
        assert!(
            child.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&child.stderr)
        );
    }

    /// The half of the test above that runs in the fresh process.
    #[test]
    #[ignore = "run in a fresh process by a_new_state_has_loaded_every_bpe_encoding"]
    fn in_fresh_process_state_loads_every_bpe() {
        assert_eq!(
            std::env::var(FRESH_PROCESS).as_deref(),
            Ok("1"),
            "run alone"
        );
        let bpe = [Encoding::Cl100kBase, Encoding::O200kBase];
        assert!(
            bpe.iter().all(|e| !e.is_loaded()),
            "loaded before the state"
        );
        let config = Config::demo().expect("demo config");
        assert_eq!(config.estimation.default_encoding, "cl100k_base");
        let _state = crate::server::build::node_state(config).expect("state");
        assert!(
            bpe.iter().all(|e| e.is_loaded()),
            "the state left one unloaded"
        );
    }
}
