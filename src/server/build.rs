//! Building a node's state from its config: the composition of the request
//! path's tables (tenants, upstreams, routes), the actors and their limits, the
//! keys the cluster bounds (an allowance each, or leased credit), the spill
//! board, the cluster status and the metrics.

use crate::actor::Binding;
use crate::actor::credit::CreditTable;
use crate::actor::estimate::AdaptivePolicy;
use crate::actor::registry::ActorDefaults;
use crate::actor::{Dimension, Registry, ScopeId, ScopeSpec};
use crate::api::Api;
use crate::clock::Clock;
use crate::config::{CompletionPolicy, Config, Quota, normalize_key_hash};
use crate::limiter::{Ceiling, LimitSpec};
use crate::ops::metrics::Metrics;
use crate::proxy::AppState;
use crate::proxy::error::ApiError;
use crate::proxy::state::{Credentials, ModelScopes, Route, Tenant, Upstream};
use crate::tokens::{CountMemo, Encoding};
use crate::upstream_http::{Endpoint, UpstreamHttp};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;
use tokio::sync::Semaphore;

/// One limit's spec: `capacity` per window (the day window's for daily
/// dimensions), `burst` (token-bucket) its own.
fn limit_spec(
    dimension: Dimension,
    capacity: Option<u64>,
    burst: Option<u64>,
    quota: &Quota,
    config: &Config,
) -> Option<LimitSpec> {
    let capacity = capacity?;
    let limits = &config.limits;
    let (window, buckets) = match dimension.is_daily() {
        true => (limits.day_window, limits.day_buckets),
        false => (limits.window, limits.buckets),
    };
    Some(LimitSpec {
        capacity,
        window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
        algorithm: quota.algorithm.unwrap_or(limits.algorithm),
        buckets,
        burst: burst.unwrap_or(capacity).min(capacity),
    })
}

fn scope_spec(quota: &Quota, config: &Config, adaptive: Option<AdaptivePolicy>) -> ScopeSpec {
    let spec = |dimension, capacity, burst| limit_spec(dimension, capacity, burst, quota, config);
    ScopeSpec {
        windows: [
            spec(Dimension::Requests, quota.rpm, quota.burst),
            spec(Dimension::Tokens, quota.tpm, quota.burst_tokens),
            spec(Dimension::InputTokens, quota.itpm, None),
            spec(Dimension::OutputTokens, quota.otpm, None),
            spec(Dimension::RequestsPerDay, quota.rpd, None),
            spec(Dimension::TokensPerDay, quota.tpd, None),
        ]
        .into(),
        counts_cache_reads: quota.input_counts_cache_reads,
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
    let windows = config.limits.cluster_windows();
    let policy = match cluster.lease.cut_off {
        CutOff::Share => CutOffPolicy::Share,
        CutOff::FailClosed => CutOffPolicy::FailClosed,
        CutOff::FailOpen => CutOffPolicy::FailOpen,
    };
    // validate() proved the window publishable; without one, keys stay on their
    // local limits only.
    let recipe = (windows.as_ref().ok()).map(|w| {
        Arc::new(CreditRecipe {
            windows: *w,
            policy,
            wake: wake.clone(),
        })
    });
    let mut bindings = Vec::new();
    for (scope, spec) in specs.iter_mut() {
        let windows = (Dimension::WINDOWED.into_iter())
            .zip(spec.windows.to_array().map(|l| l.map(|l| l.capacity)));
        let dims = windows.chain([(Dimension::Concurrency, spec.concurrency)]);
        for (dimension, capacity) in dims {
            let Some(capacity) = capacity else { continue };
            let key: Arc<str> = format!("{scope}:{}", dimension.as_str()).into();
            let mut binding = Binding {
                key,
                scope: scope.clone(),
                dimension,
                capacity,
                allowance: None,
                counts_cache_reads: spec.counts_cache_reads,
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
                    if let Some(slot) = spec.allowances.slot_mut(dimension) {
                        *slot = Some(allowance.clone());
                    }
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

/// An upstream's endpoint per API; validate() already proved the base URL parses.
fn endpoints(http: &UpstreamHttp, base_url: &str) -> Result<[Endpoint; Api::ALL.len()], ApiError> {
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
        parse(Api::Responses)?,
        parse(Api::CountTokens)?,
    ])
}

/// The upstreams (each one's limits added to `specs`) and the routes over
/// them, in config order.
fn routes(
    config: &Config,
    specs: &mut HashMap<ScopeId, ScopeSpec>,
    upstream_http: &UpstreamHttp,
    metrics: &Metrics,
) -> Result<Vec<Route>, ApiError> {
    let mut upstreams = HashMap::new();
    for u in &config.upstreams {
        let scope = ScopeId::upstream(&u.id);
        specs.insert(scope.clone(), scope_spec(&u.quota, config, None));
        for group in &u.model_limits {
            let group_scope = ScopeId::model_group(&scope, group.group_name());
            specs.insert(group_scope, scope_spec(&group.quota, config, None));
        }
        upstreams.insert(
            u.id.clone(),
            Arc::new(Upstream {
                id: scope.id.clone(),
                kind: u.kind,
                endpoints: endpoints(upstream_http, &u.base_url)?,
                base_url: Arc::from(u.base_url.trim_end_matches('/')),
                models: (upstream_http)
                    .endpoint(&format!("{}/models", u.base_url.trim_end_matches('/')))
                    .map_err(ApiError::bad_gateway)?,
                credentials: u.api_key.as_deref().map(Credentials::new).transpose()?,
                timeout: u.timeout,
                stream_idle_timeout: u.stream_idle_timeout,
                metrics: metrics.upstream(&scope.id),
                model_groups: ModelScopes::new(&scope, &u.model_limits),
                scope,
            }),
        );
    }
    let routes = config
        .routes
        .iter()
        .map(|r| {
            // validate() guarantees every id exists.
            let chosen = r
                .upstreams
                .iter()
                .filter_map(|id| upstreams.get(id))
                .cloned();
            let encoding = r.encoding.as_deref().and_then(|e| Encoding::parse(e).ok());
            let mut route = Route::new(r.models.clone(), chosen, encoding);
            route.passthrough.clone_from(&r.passthrough);
            route
        })
        .collect();
    Ok(routes)
}

/// The tenants by API key hash, each tenant's limits added to `specs`. The
/// tenant list is moved out of the config the state keeps: after this the
/// table is its only reader, and the parsed list (~280 B per tenant with its
/// key hashes) would be kept for nothing (see `AppState::config`).
fn tenant_table(
    config: &mut Config,
    specs: &mut HashMap<ScopeId, ScopeSpec>,
) -> HashMap<[u8; 32], Arc<Tenant>> {
    let adaptive =
        (config.estimation.completion == CompletionPolicy::Adaptive).then_some(AdaptivePolicy {
            headroom: config.estimation.adaptive_headroom,
            min_samples: config.estimation.adaptive_min_samples,
        });
    let mut tenants = HashMap::new();
    let tenant_configs = std::mem::take(&mut config.tenants);
    for t in &tenant_configs {
        let scope = ScopeId::tenant(&t.id);
        specs.insert(scope.clone(), scope_spec(&t.quota, config, adaptive));
        for group in &t.model_limits {
            let group_scope = ScopeId::model_group(&scope, group.group_name());
            specs.insert(group_scope, scope_spec(&group.quota, config, adaptive));
        }
        let tenant = Arc::new(Tenant {
            id: scope.id.clone(),
            model_groups: ModelScopes::new(&scope, &t.model_limits),
            scope,
            max_wait: t.max_wait.unwrap_or(crate::config::defaults::MAX_WAIT),
            input_budget: input_budget(&t.quota),
        });
        for hash in &t.api_key_hashes {
            // validate() proved each is 64 hex digits.
            let mut digest = [0u8; 32];
            if hex::decode_to_slice(normalize_key_hash(hash), &mut digest).is_ok() {
                tenants.insert(digest, tenant.clone());
            }
        }
    }
    tenants
}

/// The smallest of a quota's windows that charge a request's input: a prompt
/// with more tokens exceeds it alone. A token bucket's burst above its rate
/// raises what its window admits at once.
fn input_budget(quota: &crate::config::Quota) -> Option<u64> {
    let tokens = (quota.tpm).map(|tpm| tpm.max(quota.burst_tokens.unwrap_or(0)));
    [tokens, quota.itpm, quota.tpd].into_iter().flatten().min()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Builds the node's state from a validated config: tenants by key hash,
/// upstreams and routes, the actors and their limits, the cluster bounds
/// (allowances or leased credit), the spill board, the metrics.
pub fn node_state(mut config: Config) -> Result<AppState, ApiError> {
    let metrics = Arc::new(Metrics::new(config.server.metrics_tenant_labels));
    let mut specs = HashMap::new();
    let tenants = tenant_table(&mut config, &mut specs);
    let upstream_http =
        UpstreamHttp::new(config.server.upstream_idle_timeout).map_err(ApiError::bad_gateway)?;
    let routes = routes(&config, &mut specs, &upstream_http, &metrics)?;
    let credit_wake = Arc::new(tokio::sync::Notify::new());
    let (bindings, credits) = bind_allowances(&config, &mut specs, &credit_wake);
    let spill = (config.cluster.as_ref())
        .filter(|c| c.mode == crate::config::SyncMode::Lease && c.lease.spillover)
        .map(|c| {
            let keys = crate::sync::auth::keys(c, tollgate_cluster::auth::keys::Channel::Rpc)
                .map_err(|e| ApiError::unavailable(e, Duration::ZERO))?;
            Ok::<_, ApiError>(Arc::new(crate::sync::spill::Board::new(
                &c.node_id,
                &c.cluster_id,
                tollgate_cluster::auth::rpc::RpcSigner::new(keys),
                c.lease.spillover_wait,
            )))
        })
        .transpose()?;
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
    .map_err(|(scope, e)| ApiError::bad_gateway(format!("limit of {scope} is unusable: {e}")))?;
    let default_encoding =
        Encoding::parse(&config.estimation.default_encoding).unwrap_or(Encoding::Cl100kBase);
    Encoding::warm_up_every_bpe();
    let (memo_hits, memo_misses) = metrics.prompt_count_memo();
    let count_memo = CountMemo::new(config.estimation.count_memo_slots, memo_hits, memo_misses);
    let bucket = config.limits.window / config.limits.buckets.max(1);
    Ok(AppState {
        stall_watch: Arc::new(crate::proxy::stall::StallWatch::new(bucket)),
        in_flight: Arc::new(Semaphore::new(config.server.max_in_flight)),
        config,
        tenants,
        routes,
        registry: Arc::new(registry),
        upstream_http,
        metrics,
        default_encoding,
        count_memo,
        draining: Arc::new(AtomicBool::new(false)),
        superseded: Arc::new(AtomicBool::new(false)),
        rng_counter: AtomicU64::new(0),
        bindings,
        credits,
        credit_wake,
        lease_book: Arc::default(),
        redis_gate: Arc::default(),
        cluster_status,
        spill,
        model_lists: Default::default(),
    })
}
