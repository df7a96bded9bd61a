//! The request path for every proxied API: bound, authenticate, read hints, parse
//! and estimate, route, admit on the tenant, dispatch, add rate-limit headers.

use super::dispatch::{Admitted, dispatch};
use super::error::ApiError;
use super::headers::RateHeaders;
use super::request::{Api, ParseSettings, parse};
use super::select::UpstreamDemand;
use super::spill::{self, Refused};
use super::state::{AppState, Route, Tenant};
use crate::actor::task::{AcquireRequest, Refusal};
use crate::actor::{Lane, Permit};
use crate::tokens::TokenCounter;
use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Header selecting the priority lane.
pub const PRIORITY_HEADER: &str = "x-tollgate-priority";
/// Header bounding the queue wait, in milliseconds (0 = fail fast).
pub const MAX_WAIT_HEADER: &str = "x-tollgate-max-wait-ms";

/// Status recorded for a request whose client went away before its answer
/// (nginx's convention; never sent: nobody is left to read it).
pub const CLIENT_CLOSED: u16 = 499;

/// Where a request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    /// A client called this node.
    Client,
    /// A peer spilled it here (`super::spill`): never spilled again, counted as
    /// received, not as a client's request (the peer counted that), and served
    /// only `within` the time its sender had left for it (the sender answers its
    /// client by then, so work after it would reach nobody).
    Spilled {
        /// What was left of the request's time at the sender.
        within: Duration,
    },
}

/// Records a request's outcome once: its answer's status, or, when the client
/// leaves first (the server drops the request's future, and with it this),
/// [`CLIENT_CLOSED`]. Its permits settle on their own drop.
struct Outcome<'a> {
    state: &'a AppState,
    api: Api,
    hop: Hop,
    tenant: Option<Arc<str>>,
    status: Option<u16>,
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        let status = self.status.unwrap_or(CLIENT_CLOSED);
        if status == CLIENT_CLOSED {
            tracing::debug!(api = self.api.as_str(), "client left before the answer");
        }
        let metrics = &self.state.metrics;
        match self.hop {
            Hop::Client => metrics.request_done(self.api, self.tenant.as_ref(), status),
            Hop::Spilled { .. } => metrics.spill_received(self.api.as_str(), status),
        }
    }
}

/// Serves one proxied request and records its outcome.
pub async fn handle(
    state: Arc<AppState>,
    api: Api,
    headers: HeaderMap,
    body: Body,
    hop: Hop,
) -> Response {
    let mut outcome = Outcome {
        state: &state,
        api,
        hop,
        tenant: None,
        status: None,
    };
    let response = match serve(&state, api, hop, &headers, body, &mut outcome.tenant).await {
        Ok(response) => response,
        Err(error) => {
            if error.status.is_server_error() {
                tracing::warn!(api = api.as_str(), status = error.status.as_u16(), message = %error.message, "request failed");
            }
            error
                .with_flavor(super::error::Flavor::of(api))
                .into_response()
        }
    };
    outcome.status = Some(response.status().as_u16());
    response
}

/// Decrements the in-flight gauge and frees the node slot when the response ends.
pub(super) struct InFlight {
    state: Arc<AppState>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl InFlight {
    /// Counts `slot` in the in-flight gauge until dropped.
    pub(super) fn new(state: Arc<AppState>, slot: tokio::sync::OwnedSemaphorePermit) -> InFlight {
        state.metrics.in_flight(1);
        InFlight { state, _slot: slot }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.state.metrics.in_flight(-1);
    }
}

/// The tenant whose key the request carries (`Authorization: Bearer` or `x-api-key`).
pub fn authenticate<'a>(
    state: &'a AppState,
    headers: &HeaderMap,
) -> Result<&'a Arc<Tenant>, ApiError> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let key = bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
    key.and_then(|k| state.tenant_for_key(k.trim()))
        .ok_or_else(ApiError::unauthorized)
}

fn lane(headers: &HeaderMap) -> Result<Lane, ApiError> {
    match headers.get(PRIORITY_HEADER) {
        None => Ok(Lane::Interactive),
        Some(v) => v.to_str().ok().and_then(Lane::parse).ok_or_else(|| {
            ApiError::bad_request(
                format!("{PRIORITY_HEADER} must be `interactive` or `batch`"),
                Some(PRIORITY_HEADER),
            )
        }),
    }
}

fn max_wait(headers: &HeaderMap, cap: Duration) -> Result<Duration, ApiError> {
    match headers.get(MAX_WAIT_HEADER) {
        None => Ok(cap),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|ms| Duration::from_millis(ms).min(cap))
            .ok_or_else(|| {
                ApiError::bad_request(
                    format!("{MAX_WAIT_HEADER} must be a whole number of milliseconds"),
                    Some(MAX_WAIT_HEADER),
                )
            }),
    }
}

/// Reads the body, within `max_body_bytes` and by `deadline`: a client trickling
/// its body would otherwise hold one of the node's in-flight slots for as long
/// as it liked.
async fn read_body(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    deadline: Instant,
) -> Result<bytes::Bytes, ApiError> {
    let limit = state.config.server.max_body_bytes;
    let too_large =
        || ApiError::too_large(format!("Request body exceeds the limit of {limit} bytes."));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(too_large());
    }
    // The only ways to fail here are the limit and a client that went away; the
    // latter never reads this answer.
    match tokio::time::timeout_at(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(read) => read.map_err(|_| too_large()),
        Err(_) => Err(ApiError::request_timeout(format!(
            "The request body did not arrive within {} s (server.request_timeout).",
            state.config.server.request_timeout.as_secs_f64()
        ))),
    }
}

fn tenant_refusal(refusal: &Refusal) -> ApiError {
    let headers = Some(RateHeaders::from_status(&refusal.status));
    let dimension = refusal.blocked.dimension.as_str();
    if refusal.blocked.never {
        let mut e = ApiError::too_large(format!(
            "The request's estimated cost exceeds the tenant's {dimension} limit per window; lower max_tokens or the prompt."
        ));
        e.rate_headers = headers.map(Box::new);
        return e;
    }
    let retry = Duration::from_nanos(refusal.blocked.retry_after_ns).max(Duration::from_millis(1));
    let mut error = ApiError::rate_limited(
        format!(
            "Rate limit reached for {dimension}. Retry after {} ms.",
            retry.as_millis()
        ),
        retry,
        headers,
    );
    error.spillable = refusal.blocked.dimension != crate::actor::Dimension::Cooldown;
    error
}

async fn serve(
    state: &Arc<AppState>,
    api: Api,
    hop: Hop,
    headers: &HeaderMap,
    body: Body,
    tenant_id: &mut Option<Arc<str>>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    if state.superseded.load(std::sync::atomic::Ordering::Relaxed) {
        // Its peers follow the newer process: spending here would go uncounted.
        return Err(ApiError::unavailable(
            "This node no longer serves: a newer process runs under its cluster node_id. Send requests to another node.",
            Duration::from_secs(1),
        ));
    }
    let slot = state.in_flight.clone().try_acquire_owned().map_err(|_| {
        ApiError::unavailable(
            "This node is at its in-flight request limit.",
            Duration::from_secs(1),
        )
    })?;
    let guard = InFlight::new(state.clone(), slot);
    let tenant = authenticate(state, headers)?;
    *tenant_id = Some(tenant.id.clone());
    let lane = lane(headers)?;
    let max_wait = max_wait(headers, tenant.max_wait)?;
    let time = match hop {
        Hop::Client => state.config.server.request_timeout,
        Hop::Spilled { within } => within.min(state.config.server.request_timeout),
    };
    let deadline = started + time;
    let bytes = read_body(state, headers, body, deadline).await?;
    // What a refusal spills to a peer (`spill`): the body as the client sent it.
    let as_sent = bytes.clone();
    let route_cell: Cell<Option<&Route>> = Cell::new(None);
    let settings = ParseSettings {
        default_max_tokens: state.config.estimation.default_max_tokens,
    };
    let parsed = parse(api, bytes, settings, |model| {
        let route = state
            .route_for(model)
            .filter(|r| !r.upstreams_for(api.upstream_kind()).is_empty())
            .ok_or_else(|| ApiError::unknown_model(model))?;
        route_cell.set(Some(route));
        let encoding = state.encoding_for(route, model);
        Ok(TokenCounter::memoized(
            encoding,
            &state.count_memo,
            &tenant.id,
        ))
    })?;
    let route = route_cell
        .get()
        .ok_or_else(|| ApiError::unknown_model(&parsed.model))?;
    let candidates = route.upstreams_for(api.upstream_kind());
    let model = parsed.model.clone();
    let wait_until = (started + max_wait).min(deadline);
    // What the request costs a peer's room: prompt plus the most completion.
    let spill_tokens = (parsed.prompt_tokens).saturating_add(parsed.max_completion_tokens);
    // The request as spillover sends it on, should this node refuse it.
    let refused = || Refused {
        api,
        hop,
        tenant: &tenant.scope,
        upstreams: candidates,
        tokens: spill_tokens,
        headers,
        body: as_sent.clone(),
        deadline,
    };
    let served = async {
        // At most twice: a request whose Redis call found Redis lost is re-admitted
        // under the fallback allowance the loss just set (never on the old one),
        // within what is left of the same wait.
        let mut attempts = 0;
        // Spillover: a first try at once, so that a request that would wait here
        // goes to a peer with room now rather than after its wait.
        let mut probe = state.spill.is_some() && hop == Hop::Client;
        let (grant, permit) = loop {
            attempts += u32::from(!probe);
            let max_wait_ns = if probe {
                0
            } else {
                u64::try_from(
                    wait_until
                        .saturating_duration_since(Instant::now())
                        .as_nanos(),
                )
                .unwrap_or(0)
            };
            let (answer, handle) = state
                .registry
                .acquire(
                    &tenant.scope,
                    &AcquireRequest {
                        lane,
                        prompt_tokens: parsed.prompt_tokens,
                        max_completion_tokens: parsed.max_completion_tokens,
                        model: model.clone(),
                        adaptive: state.adaptive(),
                        max_wait_ns,
                        busy_above: None,
                        probe,
                    },
                )
                .await
                .map_err(|e| ApiError::unavailable(e.to_string(), Duration::from_secs(1)))?;
            let grant = match answer {
                Ok(grant) => grant,
                Err(refusal) if probe => {
                    probe = false;
                    let error = tenant_refusal(&refusal);
                    if error.spillable
                        && spill::spill_now(state, &tenant.scope, candidates, spill_tokens)
                        && let Ok(response) = spill::or_refuse(state, error, refused()).await
                    {
                        return Ok(response);
                    }
                    continue;
                }
                Err(refusal) => return Err(tenant_refusal(&refusal)),
            };
            let permit = Permit::new(&handle, &grant);
            let Some(gate) = state.redis_gate.get() else {
                break (grant, permit);
            };
            match gate
                .admit(&tenant.scope, permit, grant.tokens_reserved, wait_until)
                .await
            {
                Ok(permit) => break (grant, permit),
                Err(r) if r.is_redis_lost() && attempts < 2 => continue,
                Err(r) => return Err(tenant_refusal(&r.into_refusal(grant.status.clone()))),
            }
        };
        let rate_headers = RateHeaders::from_status(&grant.status);
        // The upstream reserves what the tenant reserved (the adaptive estimate, if any).
        let completion_tokens = if grant.tokens_reserved > 0 {
            grant.tokens_reserved.saturating_sub(parsed.prompt_tokens)
        } else {
            parsed.max_completion_tokens
        };
        let demand = UpstreamDemand {
            lane,
            prompt_tokens: parsed.prompt_tokens,
            completion_tokens,
            model,
            wait_until,
        };
        let admitted = Admitted {
            api,
            parsed: &parsed,
            candidates,
            demand,
            deadline,
            client_headers: headers,
            admitted_at: Instant::now(),
        };
        match dispatch(state, admitted, permit, Box::new(guard)).await {
            Ok(mut response) => {
                rate_headers.apply(response.headers_mut());
                Ok(response)
            }
            Err(mut error) => {
                error.rate_headers = Some(Box::new(rate_headers));
                Err(error)
            }
        }
    };
    match served.await {
        Err(refusal) if refusal.spillable => spill::or_refuse(state, refusal, refused()).await,
        served => served,
    }
}
