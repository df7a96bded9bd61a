//! Health, readiness, metrics and the admin API.
//!
//! - `GET /healthz`: the process serves HTTP.
//! - `GET /readyz`: 200 while accepting traffic, 503 once draining for shutdown or
//!   superseded (a newer process runs under this node's `node_id`).
//! - `GET /metrics`: Prometheus text.
//! - `GET /admin/cluster`: members, liveness, addresses, mode, degraded state, and
//!   every cluster-bound key's current allowance (admin token).
//! - `GET /admin/keys/{key}`: a key's figures (`tenant:acme:tokens`, or a whole
//!   scope `upstream:openai-main`), behind `Authorization: Bearer <admin_token>`.

use crate::actor::credit::CreditTable;
use crate::actor::{Binding, Registry, ScopeId, ScopeKind};
use crate::ops::metrics::Metrics;
use crate::proxy::AppState;
use crate::proxy::error::ApiError;
use crate::sync::lease::owner::OwnerBook;
use crate::sync::status::ClusterStatus;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// What the operations routes read of the node: its flags, metrics, actors
/// and cluster figures, not the request path's state.
pub struct AdminParts {
    /// `server.admin_token`: the bearer token of `/admin/*` (none: refused).
    pub admin_token: Option<String>,
    /// Set when shutdown starts.
    pub draining: Arc<AtomicBool>,
    /// Set once a newer process runs under this node's id.
    pub superseded: Arc<AtomicBool>,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// The limiter actors.
    pub registry: Arc<Registry>,
    /// `lease` modes: the credits of the keys used here.
    pub credits: Option<Arc<CreditTable>>,
    /// The cluster as this node sees it (`[cluster]` configured only).
    pub cluster_status: Option<Arc<parking_lot::Mutex<ClusterStatus>>>,
    /// `lease`: the lines this node owns (set when the cluster starts).
    pub lease_book: Arc<OnceLock<Arc<OwnerBook>>>,
    /// The keys the cluster bounds.
    pub bindings: Arc<[Binding]>,
}

impl AdminParts {
    /// The handles of `state` the operations routes read.
    pub fn of(state: &AppState) -> AdminParts {
        AdminParts {
            admin_token: state.config.server.admin_token.clone(),
            draining: Arc::clone(&state.draining),
            superseded: Arc::clone(&state.superseded),
            metrics: Arc::clone(&state.metrics),
            registry: Arc::clone(&state.registry),
            credits: state.credits.clone(),
            cluster_status: state.cluster_status.clone(),
            lease_book: Arc::clone(&state.lease_book),
            bindings: Arc::clone(&state.bindings),
        }
    }
}

/// Operations routes: merged into the proxy app, or served on
/// `server.admin_listen`.
pub fn routes(parts: Arc<AdminParts>) -> Router {
    probes(Arc::clone(&parts)).merge(
        Router::new()
            .route("/metrics", get(metrics))
            .route("/admin/keys/{key}", get(key_status))
            .route("/admin/cluster", get(cluster_status))
            .with_state(parts),
    )
}

/// `/healthz` and `/readyz`: on the proxy listener always (a load balancer
/// probes the port it sends to), and on the admin listener too.
pub fn probes(parts: Arc<AdminParts>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(parts)
}

async fn readyz(State(state): State<Arc<AdminParts>>) -> Response {
    if state.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response()
    } else if state.superseded.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "superseded").into_response()
    } else {
        "ready".into_response()
    }
}

async fn metrics(State(state): State<Arc<AdminParts>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

fn admin_authorized(state: &AdminParts, headers: &HeaderMap) -> bool {
    let Some(token) = state.admin_token.as_deref() else {
        return false;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Constant-time comparison: the token guards operational data.
    given.is_some_and(|g| {
        g.len() == token.len()
            && g.bytes()
                .zip(token.bytes())
                .fold(0, |acc, (a, b)| acc | (a ^ b))
                == 0
    })
}

fn parse_key(key: &str) -> Option<(ScopeId, Option<&str>)> {
    let mut parts = key.splitn(3, ':');
    let kind = match parts.next()? {
        "tenant" => ScopeKind::Tenant,
        "upstream" => ScopeKind::Upstream,
        "tenant-model" => ScopeKind::TenantModel,
        "upstream-model" => ScopeKind::UpstreamModel,
        _ => return None,
    };
    let id = parts.next().filter(|id| !id.is_empty())?;
    let dimension = parts.next();
    let scope = ScopeId {
        kind,
        id: id.into(),
    };
    Some((scope, dimension))
}

async fn key_status(
    State(state): State<Arc<AdminParts>>,
    headers: HeaderMap,
    Path(key): Path<String>,
) -> Response {
    if !admin_authorized(&state, &headers) {
        let mut e = ApiError::unauthorized();
        e.message = "Admin API: send `Authorization: Bearer <server.admin_token>`.".into();
        return e.into_response();
    }
    let not_found = || {
        let mut e = ApiError::bad_request(
            format!(
                "No key {key:?}. Keys look like tenant:<id>:<requests|tokens|input_tokens|output_tokens|requests_per_day|tokens_per_day|concurrency>, upstream:<id>, or upstream-model:<id>@<group>."
            ),
            Some("key"),
        );
        e.status = StatusCode::NOT_FOUND;
        e.code = "key_not_found";
        e.into_response()
    };
    let Some((scope, dimension)) = parse_key(&key) else {
        return not_found();
    };
    if !state.registry.knows(&scope) {
        return not_found();
    }
    let status = match state.registry.status(&scope).await {
        Ok(status) => status,
        Err(e) => {
            return ApiError::unavailable(e.to_string(), std::time::Duration::from_secs(1))
                .into_response();
        }
    };
    let queue = json!({"interactive": status.queued[0], "batch": status.queued[1]});
    let window = |w: Option<crate::actor::scope::WindowStatus>| {
        w.map(|w| json!({"limit": w.limit, "used": w.used, "remaining": w.remaining, "reset_ms": w.reset_ns.div_ceil(1_000_000)}))
    };
    let body = match dimension {
        None => json!({
            "key": key, "requests": window(status.requests), "tokens": window(status.tokens),
            "input_tokens": window(status.input_tokens), "output_tokens": window(status.output_tokens),
            "requests_per_day": window(status.requests_per_day), "tokens_per_day": window(status.tokens_per_day),
            "concurrency": {"limit": status.concurrency_limit, "in_flight": status.in_flight},
            "queue": queue, "cooling_ms": status.cooling_ns.div_ceil(1_000_000),
        }),
        Some("requests") => json!({"key": key, "usage": window(status.requests), "queue": queue}),
        Some("tokens") => json!({"key": key, "usage": window(status.tokens), "queue": queue}),
        Some("input_tokens") => {
            json!({"key": key, "usage": window(status.input_tokens), "queue": queue})
        }
        Some("output_tokens") => {
            json!({"key": key, "usage": window(status.output_tokens), "queue": queue})
        }
        Some("requests_per_day") => {
            json!({"key": key, "usage": window(status.requests_per_day), "queue": queue})
        }
        Some("tokens_per_day") => {
            json!({"key": key, "usage": window(status.tokens_per_day), "queue": queue})
        }
        Some("concurrency") => json!({
            "key": key, "usage": {"limit": status.concurrency_limit, "used": status.in_flight,
            "remaining": status.concurrency_limit.map(|l| l.saturating_sub(status.in_flight))}, "queue": queue,
        }),
        Some(_) => return not_found(),
    };
    axum::Json(body).into_response()
}

async fn cluster_status(
    State(state): State<Arc<AdminParts>>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    if !admin_authorized(&state, &headers) {
        return ApiError::unauthorized().into_response();
    }
    let Some(status) = &state.cluster_status else {
        let mut e = ApiError::bad_request(
            "This node is not in a cluster (no [cluster] section).",
            None,
        );
        e.status = StatusCode::NOT_FOUND;
        e.code = "not_clustered";
        return e.into_response();
    };
    let snapshot = status.lock().clone();
    let now_ms = state.registry.clock().now_ns() / 1_000_000;
    let allowances: serde_json::Map<String, serde_json::Value> = state
        .bindings
        .iter()
        .enumerate()
        .map(|(i, b)| {
            // A credit never used here holds nothing (and is not made by reading it).
            let credit = (b.leased).then(|| {
                let made = state.credits.as_ref().and_then(|t| t.get(i as u32));
                made.map_or_else(
                    || json!({"credit": 0, "used": 0, "cut_off": false}),
                    |c| {
                        c.with(|budget| {
                            json!({
                                "credit": budget.credit(now_ms),
                                "used": budget.used(now_ms),
                                "cut_off": budget.is_cut_off(),
                            })
                        })
                    },
                )
            });
            (
                b.key.to_string(),
                json!({
                    "capacity": b.capacity,
                    "allowance": b.allowance.as_ref().map(|a| a.get()),
                    "credit": credit,
                }),
            )
        })
        .collect();
    let mut body = json!({"cluster": snapshot, "allowances": allowances});
    // `?keys=true`: each key's owner (lease mode) and the lines this node owns.
    let wants_keys = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "keys=true"));
    if wants_keys && let Some(book) = state.lease_book.get() {
        let owners: serde_json::Map<String, serde_json::Value> = (state.bindings.iter())
            .filter(|b| b.leased)
            .map(|b| (b.key.to_string(), json!(book.owner_of(&b.key))))
            .collect();
        body["owners"] = json!(owners);
        body["owned"] = json!(book.owned());
    }
    axum::Json(body).into_response()
}
