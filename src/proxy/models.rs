//! `GET /v1/models` and `GET /v1/models/{id}`: the models a tenant can call.
//!
//! A route's exact names are listed as configured. A route with patterns
//! (`*`, `gpt-*`) serves whatever its upstreams serve under them, which only
//! they know: each upstream of such a route is asked for its list (`GET
//! {base_url}/models`, with its key), the list is kept for [`LIST_TTL`], and
//! the names the route's patterns match are listed beside the exact ones. An
//! upstream that cannot answer keeps its last list (a stale list beats none),
//! or lists nothing until it answers. Clients of Anthropic's SDK (they send
//! `anthropic-version`) get Anthropic's shape.
//!
//! Bounded: one refresh at a time node-wide, each list at most
//! [`MAX_LIST_BYTES`] and [`MAX_MODELS`] names, each name at most
//! [`MAX_NAME_BYTES`].

use super::AppState;
use super::error::{ApiError, Flavor};
use super::handler;
use super::state::Upstream;
use crate::config::UpstreamKind;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How long an upstream's model list is kept.
pub const LIST_TTL: Duration = Duration::from_secs(300);
/// Largest model list read from an upstream.
pub const MAX_LIST_BYTES: usize = 4 * 1024 * 1024;
/// Most names kept of one upstream's list.
pub const MAX_MODELS: usize = 10_000;
/// Longest model name kept.
pub const MAX_NAME_BYTES: usize = 256;

/// Each upstream's model list, as last fetched.
#[derive(Default)]
pub struct ModelLists {
    lists: parking_lot::Mutex<HashMap<Arc<str>, Listed>>,
    /// One refresh at a time: a burst of listings asks each upstream once.
    refreshing: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Listed {
    at: Instant,
    ids: Arc<[String]>,
}

impl ModelLists {
    fn fresh(&self, upstream: &str) -> Option<Arc<[String]>> {
        let lists = self.lists.lock();
        (lists.get(upstream))
            .filter(|l| l.at.elapsed() < LIST_TTL)
            .map(|l| l.ids.clone())
    }

    fn last(&self, upstream: &str) -> Option<Arc<[String]>> {
        self.lists.lock().get(upstream).map(|l| l.ids.clone())
    }

    /// `upstream`'s list: kept if fresh, else asked for (and kept); the last
    /// one if it cannot answer.
    async fn of(&self, state: &AppState, upstream: &Upstream) -> Arc<[String]> {
        if let Some(ids) = self.fresh(&upstream.id) {
            return ids;
        }
        let _one_at_a_time = self.refreshing.lock().await;
        // Another listing may have refreshed it meanwhile.
        if let Some(ids) = self.fresh(&upstream.id) {
            return ids;
        }
        match fetch(state, upstream).await {
            Ok(ids) => {
                let ids: Arc<[String]> = ids.into();
                let listed = Listed {
                    at: Instant::now(),
                    ids: ids.clone(),
                };
                self.lists.lock().insert(upstream.id.clone(), listed);
                ids
            }
            Err(reason) => {
                tracing::warn!(upstream = %upstream.id, %reason, "cannot list the upstream's models");
                self.last(&upstream.id).unwrap_or_else(|| Arc::from([]))
            }
        }
    }
}

#[derive(Deserialize)]
struct ListBody {
    data: Vec<ListEntry>,
}

#[derive(Deserialize)]
struct ListEntry {
    id: String,
}

/// Asks `upstream` for its model list.
async fn fetch(state: &AppState, upstream: &Upstream) -> Result<Vec<String>, String> {
    let mut headers = HeaderMap::new();
    if let Some(credentials) = &upstream.credentials {
        match upstream.kind {
            UpstreamKind::Openai => {
                headers.insert(header::AUTHORIZATION, credentials.bearer.clone());
            }
            UpstreamKind::Anthropic => {
                headers.insert("x-api-key", credentials.key.clone());
            }
        }
    }
    if upstream.kind == UpstreamKind::Anthropic {
        headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
    }
    let deadline = Instant::now() + upstream.timeout;
    let asked = state.upstream_http.get(&upstream.models, headers);
    let response = (tokio::time::timeout_at(deadline, asked).await)
        .map_err(|_| "timed out".to_owned())?
        .map_err(|e| crate::upstream_http::describe(&*e))?;
    if !response.status().is_success() {
        return Err(format!("answered {}", response.status()));
    }
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    loop {
        let chunk = tokio::time::timeout_at(deadline, body.chunk()).await;
        match chunk.map_err(|_| "timed out".to_owned())? {
            Ok(Some(chunk)) if bytes.len() + chunk.len() <= MAX_LIST_BYTES => {
                bytes.extend_from_slice(&chunk);
            }
            Ok(Some(_)) => return Err(format!("list over {MAX_LIST_BYTES} bytes")),
            Ok(None) => break,
            Err(e) => return Err(crate::upstream_http::describe(&*e)),
        }
    }
    let list: ListBody = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    Ok((list.data.into_iter())
        .map(|entry| entry.id)
        .filter(|id| !id.is_empty() && id.len() <= MAX_NAME_BYTES)
        .take(MAX_MODELS)
        .collect())
}

/// Every model the routes serve, each with the upstream that listed it
/// (`None`: a configured name), sorted.
async fn served(state: &AppState) -> BTreeMap<String, Option<Arc<str>>> {
    let mut models = BTreeMap::new();
    for route in &state.routes {
        for name in route.exact_models() {
            models.entry(name.to_owned()).or_insert(None);
        }
        if !route.has_patterns() {
            continue;
        }
        for upstream in route.upstreams() {
            let ids = state.model_lists.of(state, upstream).await;
            for id in ids.iter().filter(|id| route.pattern_matches(id)) {
                models
                    .entry(id.clone())
                    .or_insert(Some(upstream.id.clone()));
            }
        }
    }
    models
}

/// The caller's API (Anthropic's SDK sends `anthropic-version`), once it is
/// authenticated; its refusal, in its shape, otherwise.
fn caller(state: &AppState, headers: &HeaderMap) -> Result<Flavor, Box<ApiError>> {
    let flavor = if headers.contains_key("anthropic-version") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    };
    match handler::authenticate(state, headers) {
        Ok(_) => Ok(flavor),
        Err(e) => Err(Box::new(e.with_flavor(flavor))),
    }
}

fn entry(id: &str, owner: Option<&Arc<str>>, anthropic: bool) -> Value {
    if anthropic {
        json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"})
    } else {
        let owned_by = owner.map_or("tollgate", |o| &**o);
        json!({"id": id, "object": "model", "created": 0, "owned_by": owned_by})
    }
}

/// `GET /v1/models`.
pub async fn list(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let flavor = match caller(&state, &headers) {
        Ok(flavor) => flavor,
        Err(refused) => return refused.into_response(),
    };
    let models = served(&state).await;
    let anthropic = flavor == Flavor::Anthropic;
    let data: Vec<Value> = (models.iter())
        .map(|(id, owner)| entry(id, owner.as_ref(), anthropic))
        .collect();
    let body = if anthropic {
        let (first, last) = (models.keys().next(), models.keys().next_back());
        json!({"data": data, "has_more": false, "first_id": first, "last_id": last})
    } else {
        json!({"object": "list", "data": data})
    };
    axum::Json(body).into_response()
}

/// `GET /v1/models/{id}`: the model if a route serves it, else 404.
pub async fn one(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let flavor = match caller(&state, &headers) {
        Ok(flavor) => flavor,
        Err(refused) => return refused.into_response(),
    };
    let models = served(&state).await;
    match models.get_key_value(&id) {
        Some((id, owner)) => {
            let anthropic = flavor == Flavor::Anthropic;
            axum::Json(entry(id, owner.as_ref(), anthropic)).into_response()
        }
        None => {
            let mut e = ApiError::bad_request(
                format!("The model `{id}` does not exist or you do not have access to it."),
                None,
            );
            e.status = StatusCode::NOT_FOUND;
            e.code = "model_not_found";
            e.with_flavor(flavor).into_response()
        }
    }
}
