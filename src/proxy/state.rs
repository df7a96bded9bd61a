//! Everything a request handler needs, built once from the config: tenants by key
//! hash, upstreams, routes, the actor registry, the HTTP client, metrics and bounds.

use super::error::ApiError;
use super::request::Api;
use crate::actor::Binding;
use crate::actor::credit::CreditTable;
use crate::actor::estimate::AdaptivePolicy;
use crate::actor::registry::ActorDefaults;
use crate::actor::{Registry, ScopeId, ScopeSpec};
use crate::clock::Clock;
use crate::config::{CompletionPolicy, Config, Quota, UpstreamKind, normalize_key_hash};
use crate::limiter::{Ceiling, LimitSpec};
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
    pub endpoints: [Endpoint; 4],
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
    /// `validate()` proved the key is a header value.
    fn new(key: &str) -> Result<Credentials, ApiError> {
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
}

fn kind_index(kind: UpstreamKind) -> usize {
    match kind {
        UpstreamKind::Openai => 0,
        UpstreamKind::Anthropic => 1,
    }
}

impl Route {
    /// The route's upstreams speaking `kind`, in preference order.
    pub fn upstreams_for(&self, kind: UpstreamKind) -> &[Arc<Upstream>] {
        &self.by_kind[kind_index(kind)]
    }

    /// Every upstream of the route.
    pub fn upstreams(&self) -> impl Iterator<Item = &Arc<Upstream>> {
        self.by_kind.iter().flatten()
    }

    fn matches(&self, model: &str) -> bool {
        self.patterns.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => model.starts_with(prefix),
            None => p == model,
        })
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
    pub draining: AtomicBool,
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
    /// `lease` mode with `cluster.lease.spillover`: the peers' room, which the
    /// sync engine writes each round (`super::spill`).
    pub spill: Option<Arc<crate::sync::spill::Board>>,
}

/// One limit's spec: `capacity` per window, `burst` (token-bucket) its own.
fn limit_spec(
    capacity: Option<u64>,
    burst: Option<u64>,
    quota: &Quota,
    config: &Config,
) -> Option<LimitSpec> {
    let capacity = capacity?;
    Some(LimitSpec {
        capacity,
        window_ns: u64::try_from(config.limits.window.as_nanos()).unwrap_or(u64::MAX),
        algorithm: quota.algorithm.unwrap_or(config.limits.algorithm),
        buckets: config.limits.buckets,
        burst: burst.unwrap_or(capacity).min(capacity),
    })
}

fn scope_spec(quota: &Quota, config: &Config, adaptive: Option<AdaptivePolicy>) -> ScopeSpec {
    ScopeSpec {
        requests: limit_spec(quota.rpm, quota.burst, quota, config),
        tokens: limit_spec(quota.tpm, quota.burst_tokens, quota, config),
        concurrency: quota.concurrency,
        adaptive,
        allowances: Default::default(),
        leased_from: None,
    }
}

/// In cluster modes that bound nodes, gives every limited dimension of every scope
/// its cluster bound: an allowance starting at 0 (`local split`, `gossip`), or in
/// `lease` mode an empty credit. Either way a node admits nothing until its first
/// sync round (which `sync::start` runs before the node serves) or its first grant.
fn bind_allowances(
    config: &Config,
    specs: &mut HashMap<ScopeId, ScopeSpec>,
    wake: &Arc<tokio::sync::Notify>,
) -> (Arc<[Binding]>, Option<Arc<CreditTable>>) {
    use crate::actor::Dimension;
    use crate::actor::credit::CreditRecipe;
    use crate::actor::scope::Allowance;
    use crate::config::{CutOff, LocalShare, SyncMode};
    use tollgate_cluster::lease::budget::CutOffPolicy;
    let Some(cluster) = &config.cluster else {
        return (Arc::from([]), None);
    };
    if cluster.mode == SyncMode::Local && cluster.local_share == LocalShare::Full {
        return (Arc::from([]), None);
    }
    let window = tollgate_cluster::counter::Window::try_new(
        config.limits.window.as_millis() as u64,
        config.limits.buckets,
    );
    let policy = match cluster.lease.cut_off {
        CutOff::Share => CutOffPolicy::Share,
        CutOff::FailClosed => CutOffPolicy::FailClosed,
        CutOff::FailOpen => CutOffPolicy::FailOpen,
    };
    // validate() proved the window publishable; without one, keys stay on their
    // local limits only.
    let recipe = (window.as_ref().ok()).map(|w| {
        Arc::new(CreditRecipe {
            window: *w,
            policy,
            wake: wake.clone(),
        })
    });
    let mut bindings = Vec::new();
    for (scope, spec) in specs.iter_mut() {
        let dims = [
            (Dimension::Requests, spec.requests.map(|l| l.capacity)),
            (Dimension::Tokens, spec.tokens.map(|l| l.capacity)),
            (Dimension::Concurrency, spec.concurrency),
        ];
        for (dimension, capacity) in dims {
            let Some(capacity) = capacity else { continue };
            let key: Arc<str> = format!("{scope}:{}", dimension.as_str()).into();
            let mut binding = Binding {
                key,
                scope: scope.clone(),
                dimension,
                capacity,
                allowance: None,
                leased: false,
            };
            match (cluster.mode, &recipe) {
                (mode, Some(_)) if mode.leases() => {
                    // A scope's credit bindings follow each other from its first.
                    let index = u32::try_from(bindings.len()).expect("under 2^32 keys");
                    spec.leased_from.get_or_insert(index);
                    binding.leased = true;
                }
                (mode, None) if mode.leases() => continue,
                _ => {
                    let allowance = Allowance::new(0);
                    let slot = match dimension {
                        Dimension::Requests => &mut spec.allowances.requests,
                        Dimension::Tokens => &mut spec.allowances.tokens,
                        _ => &mut spec.allowances.concurrency,
                    };
                    *slot = Some(allowance.clone());
                    binding.allowance = Some(allowance);
                }
            }
            bindings.push(binding);
        }
    }
    // Kept for the process's life, exactly sized (shared with the owner book).
    let bindings: Arc<[Binding]> = bindings.into();
    let credits = (recipe.filter(|_| cluster.mode.leases()))
        .map(|recipe| Arc::new(CreditTable::new(recipe, bindings.clone())));
    (bindings, credits)
}

/// The four endpoints of an upstream; validate() already proved the base URL parses.
fn endpoints(http: &UpstreamHttp, base_url: &str) -> Result<[Endpoint; 4], ApiError> {
    let base = base_url.trim_end_matches('/');
    let parse = |api: Api| {
        http.endpoint(&format!("{base}{}", api.path()))
            .map_err(ApiError::bad_gateway)
    };
    Ok([
        parse(Api::Chat)?,
        parse(Api::Completions)?,
        parse(Api::Embeddings)?,
        parse(Api::Messages)?,
    ])
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl AppState {
    /// Builds the state from a validated config.
    #[expect(clippy::too_many_lines, reason = "the node's assembly, in build order")]
    pub fn new(mut config: Config) -> Result<AppState, ApiError> {
        let metrics = Arc::new(Metrics::new(config.server.metrics_tenant_labels));
        let adaptive = (config.estimation.completion == CompletionPolicy::Adaptive).then_some(
            AdaptivePolicy {
                headroom: config.estimation.adaptive_headroom,
                min_samples: config.estimation.adaptive_min_samples,
            },
        );
        let mut specs = HashMap::new();
        let mut tenants = HashMap::new();
        // Moved out of the config the state keeps: after this loop the tenant
        // table is the only reader, and the parsed list (~280 B per tenant with its
        // key hashes) would be kept for nothing (see `AppState::config`).
        let tenant_configs = std::mem::take(&mut config.tenants);
        for t in &tenant_configs {
            let scope = ScopeId::tenant(&t.id);
            specs.insert(scope.clone(), scope_spec(&t.quota, &config, adaptive));
            let tenant = Arc::new(Tenant {
                id: scope.id.clone(),
                scope,
                max_wait: t.max_wait.unwrap_or(crate::config::defaults::MAX_WAIT),
            });
            for hash in &t.api_key_hashes {
                // validate() proved each is 64 hex digits.
                let mut digest = [0u8; 32];
                if hex::decode_to_slice(normalize_key_hash(hash), &mut digest).is_ok() {
                    tenants.insert(digest, tenant.clone());
                }
            }
        }
        let upstream_http = UpstreamHttp::new(config.server.upstream_idle_timeout)
            .map_err(ApiError::bad_gateway)?;
        let mut upstreams = HashMap::new();
        for u in &config.upstreams {
            let scope = ScopeId::upstream(&u.id);
            specs.insert(scope.clone(), scope_spec(&u.quota, &config, None));
            upstreams.insert(
                u.id.clone(),
                Arc::new(Upstream {
                    id: scope.id.clone(),
                    kind: u.kind,
                    endpoints: endpoints(&upstream_http, &u.base_url)?,
                    credentials: u.api_key.as_deref().map(Credentials::new).transpose()?,
                    timeout: u.timeout,
                    stream_idle_timeout: u.stream_idle_timeout,
                    metrics: metrics.upstream(&scope.id),
                    scope,
                }),
            );
        }
        let routes = config
            .routes
            .iter()
            .map(|r| {
                let mut by_kind: [Vec<Arc<Upstream>>; 2] = Default::default();
                // validate() guarantees every id exists.
                for upstream in r.upstreams.iter().filter_map(|id| upstreams.get(id)) {
                    by_kind[kind_index(upstream.kind)].push(upstream.clone());
                }
                Route {
                    patterns: r.models.clone(),
                    by_kind,
                    encoding: r.encoding.as_deref().and_then(|e| Encoding::parse(e).ok()),
                }
            })
            .collect();
        let credit_wake = Arc::new(tokio::sync::Notify::new());
        let (bindings, credits) = bind_allowances(&config, &mut specs, &credit_wake);
        let spill = (config.cluster.as_ref())
            .filter(|c| c.mode == crate::config::SyncMode::Lease && c.lease.spillover)
            .map(|c| {
                Arc::new(crate::sync::spill::Board::new(
                    &c.node_id,
                    &c.cluster_id,
                    c.secret.as_deref().unwrap_or_default(),
                    c.lease.spillover_wait,
                ))
            });
        let cluster_status = config.cluster.as_ref().map(|c| {
            let id = c.node_id.clone();
            Arc::new(parking_lot::Mutex::new(
                crate::sync::status::ClusterStatus::new(c, id),
            ))
        });
        let defaults = ActorDefaults {
            batch_ceiling: Ceiling::from_share(config.limits.batch_share),
            aging_ns: nanos(config.limits.batch_aging),
            max_queue: config.limits.max_queue,
            idle_timeout_ns: nanos(config.limits.idle_timeout),
        };
        let registry = Registry::new(
            specs,
            defaults,
            Clock::following_wall(),
            metrics.actors(),
            credits.clone(),
        )
        .map_err(|(scope, e)| {
            ApiError::bad_gateway(format!("limit of {scope} is unusable: {e}"))
        })?;
        let default_encoding =
            Encoding::parse(&config.estimation.default_encoding).unwrap_or(Encoding::Cl100kBase);
        Encoding::warm_up_every_bpe();
        let (memo_hits, memo_misses) = metrics.prompt_count_memo();
        let count_memo = CountMemo::new(config.estimation.count_memo_slots, memo_hits, memo_misses);
        let bucket = config.limits.window / config.limits.buckets.max(1);
        Ok(AppState {
            stall_watch: Arc::new(super::stall::StallWatch::new(bucket)),
            in_flight: Arc::new(Semaphore::new(config.server.max_in_flight)),
            config,
            tenants,
            routes,
            registry: Arc::new(registry),
            upstream_http,
            metrics,
            default_encoding,
            count_memo,
            draining: AtomicBool::new(false),
            superseded: Arc::new(AtomicBool::new(false)),
            rng_counter: AtomicU64::new(0),
            bindings,
            credits,
            credit_wake,
            lease_book: Arc::default(),
            redis_gate: Arc::default(),
            cluster_status,
            spill,
        })
    }

    /// The tenant owning `api_key`.
    pub fn tenant_for_key(&self, api_key: &str) -> Option<&Arc<Tenant>> {
        let digest: [u8; 32] = sha2::Sha256::digest(api_key.as_bytes()).into();
        self.tenants.get(&digest)
    }

    /// The first route serving `model`.
    pub fn route_for(&self, model: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.matches(model))
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
        let _state = AppState::new(config).expect("state");
        assert!(
            bpe.iter().all(|e| e.is_loaded()),
            "the state left one unloaded"
        );
    }
}
