//! The request path for every proxied API: bound, authenticate, read hints, parse
//! and estimate, route, admit on the tenant, dispatch, add rate-limit headers.

use super::dispatch::{Admitted, dispatch};
use super::error::ApiError;
use super::headers::RateHeaders;
use super::request::{Api, ParseSettings, parse};
use super::request_id;
use super::select::UpstreamDemand;
use super::spill::{self, Refused};
use super::state::{AppState, Route, Tenant};
use crate::actor::scope::Cost;
use crate::actor::task::{AcquireRequest, Grant, Refusal};
use crate::actor::{Lane, Permit};
use crate::tokens::{CountBudget, TokenCounter};
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
    use tracing::Instrument;
    let mut outcome = Outcome {
        state: &state,
        api,
        hop,
        tenant: None,
        status: None,
    };
    // The node's id of the request, in every line logged while it is served,
    // with the provider's beside it once an answer carries one. At the error
    // level, so that no filter that lets a line through drops the span.
    let id = request_id::new();
    let span = tracing::error_span!(
        "request",
        request_id = id.to_str().unwrap_or_default(),
        upstream_request_id = tracing::field::Empty
    );
    let served = serve(&state, api, hop, &headers, body, &mut outcome.tenant);
    let mut response = match served.instrument(span.clone()).await {
        Ok(response) => response,
        Err(error) => {
            if error.status.is_server_error() {
                let _in_request = span.enter();
                tracing::warn!(api = api.as_str(), status = error.status.as_u16(), message = %error.message, "request failed");
            }
            (error.with_flavor(super::error::Flavor::of(api))).into_response()
        }
    };
    // The provider's id where its answer carried one, else the node's own.
    request_id::stamp_with(&mut response, id);
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

pub(super) fn tenant_refusal(refusal: &Refusal) -> ApiError {
    let headers = Some(RateHeaders::from_status(&refusal.status));
    let dimension = refusal.blocked.dimension.as_str();
    if refusal.blocked.never {
        let mut e = ApiError::too_large(format!(
            "The request's estimated cost exceeds a {dimension} limit per window of the tenant (or of its quota for this model); lower max_tokens or the prompt."
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

/// What one request asked of the limiter, read from its headers and body once.
struct Asked<'a> {
    api: Api,
    tenant: &'a Arc<Tenant>,
    route: &'a Route,
    parsed: super::request::Parsed,
    lane: Lane,
    /// When the request's time ends (`server.request_timeout`, or what a
    /// spilled request's sender had left).
    deadline: Instant,
    /// How long it may wait for admission: its max wait, within the deadline.
    wait_until: Instant,
}

impl Asked<'_> {
    /// What the request costs a peer's room: its prompt and the most completion.
    fn spill_cost(&self) -> Cost {
        Cost {
            input: self.parsed.prompt_tokens,
            output: self.parsed.max_completion_tokens,
            output_cap: 0,
        }
    }
}

/// How the tenant's actor answered.
#[expect(
    clippy::large_enum_variant,
    reason = "the large variant is every admitted request's; boxing it would allocate on each, for the rare spilled one"
)]
enum TenantAnswer {
    /// Admitted: the grant and its permit (held in Redis too in `redis` mode).
    Admitted(Grant, Permit),
    /// Refused at once and spilled to a peer, whose answer this is.
    Spilled(Response),
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
    let guard = take_a_slot(state)?;
    let tenant = authenticate(state, headers)?;
    *tenant_id = Some(tenant.id.clone());
    let deadline = started
        + match hop {
            Hop::Client => state.config.server.request_timeout,
            Hop::Spilled { within } => within.min(state.config.server.request_timeout),
        };
    let lane = lane(headers)?;
    let wait_until = (started + max_wait(headers, tenant.max_wait)?).min(deadline);
    let bytes = read_body(state, headers, body, deadline).await?;
    // What a refusal spills to a peer (`spill`): the body as the client sent it.
    let as_sent = bytes.clone();
    let (parsed, route) = parse_and_route(state, api, tenant, bytes)?;
    let asked = Asked {
        api,
        tenant,
        route,
        parsed,
        lane,
        deadline,
        wait_until,
    };
    // The request as spillover sends it on, should this node refuse it.
    let refused = || Refused {
        api,
        hop,
        tenant: &tenant.scope,
        upstreams: asked.route.upstreams_for(api.upstream_kind()),
        cost: asked.spill_cost(),
        headers,
        body: as_sent.clone(),
        deadline,
    };
    let served = async {
        let probe = state.spill.is_some() && hop == Hop::Client;
        match admit_on_tenant(state, &asked, probe, &refused).await? {
            TenantAnswer::Spilled(response) => Ok(response),
            TenantAnswer::Admitted(grant, permit) => {
                forward(state, &asked, headers, grant, permit, guard).await
            }
        }
    };
    match served.await {
        Err(refusal) if refusal.spillable => spill::or_refuse(state, refusal, refused()).await,
        served => served,
    }
}

/// A slot of the node's in-flight bound, unless the node no longer serves.
pub(super) fn take_a_slot(state: &Arc<AppState>) -> Result<InFlight, ApiError> {
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
    Ok(InFlight::new(state.clone(), slot))
}

/// Parses the body, counting the prompt with the encoding of the route that
/// serves its model (the tenant's count memo for long texts).
fn parse_and_route<'s>(
    state: &'s AppState,
    api: Api,
    tenant: &Tenant,
    bytes: bytes::Bytes,
) -> Result<(super::request::Parsed, &'s Route), ApiError> {
    let route_cell: Cell<Option<&Route>> = Cell::new(None);
    let settings = ParseSettings {
        default_max_tokens: state.config.estimation.default_max_tokens,
    };
    // Counting stops being worth it once the prompt alone exceeds a limit of
    // the tenant: the request is refused whatever the rest holds.
    let budget = tenant.input_budget.map(CountBudget::new);
    let parsed = parse(api, bytes, settings, |model| {
        let route = state
            .route_for(model)
            .filter(|r| !r.upstreams_for(api.upstream_kind()).is_empty())
            .ok_or_else(|| ApiError::unknown_model(model))?;
        route_cell.set(Some(route));
        let encoding = state.encoding_for(route, model);
        let counter = TokenCounter::memoized(encoding, &state.count_memo, &tenant.id)
            .with_images(crate::tokens::ImageRule::for_model(model));
        Ok(match &budget {
            Some(budget) => counter.with_budget(budget),
            None => counter,
        })
    })?;
    let route = route_cell
        .get()
        .ok_or_else(|| ApiError::unknown_model(&parsed.model))?;
    Ok((parsed, route))
}

/// Admits the request on its tenant's actor (its model group's first, when
/// its model is in one; and in `redis` mode in Redis, see [`super::admit`]).
/// With `probe` (spillover), a first try at once, so that a request that would
/// wait here goes to a peer with room now rather than after its wait.
async fn admit_on_tenant<'r>(
    state: &Arc<AppState>,
    asked: &Asked<'_>,
    mut probe: bool,
    refused: impl Fn() -> Refused<'r>,
) -> Result<TenantAnswer, ApiError> {
    let scope = &asked.tenant.scope;
    let group = asked.tenant.model_groups.for_model(&asked.parsed.model);
    loop {
        let request = AcquireRequest {
            lane: asked.lane,
            prompt_tokens: asked.parsed.prompt_tokens,
            max_completion_tokens: asked.parsed.max_completion_tokens,
            completion_estimate: None,
            model: asked.parsed.model.clone(),
            adaptive: state.adaptive(),
            max_wait_ns: 0,
            busy_above: None,
            probe,
        };
        let answer = super::admit::admit(state, group, scope, request, asked.wait_until).await?;
        let (grant, permit) = match answer {
            Ok(admitted) => admitted,
            Err(refusal) if probe => {
                probe = false;
                let error = tenant_refusal(&refusal);
                let upstreams = asked.route.upstreams_for(asked.api.upstream_kind());
                if error.spillable
                    && spill::spill_now(state, scope, upstreams, asked.spill_cost())
                    && let Ok(response) = spill::or_refuse(state, error, refused()).await
                {
                    return Ok(TenantAnswer::Spilled(response));
                }
                continue;
            }
            Err(refusal) => return Err(tenant_refusal(&refusal)),
        };
        return Ok(TenantAnswer::Admitted(grant, permit));
    }
}

/// Admits the request on an upstream and forwards it there ([`dispatch`]); the
/// answer carries the tenant's `x-ratelimit-*` headers as of its grant.
async fn forward(
    state: &Arc<AppState>,
    asked: &Asked<'_>,
    client_headers: &HeaderMap,
    grant: Grant,
    permit: Permit,
    guard: InFlight,
) -> Result<Response, ApiError> {
    let rate_headers = RateHeaders::from_status(&grant.status);
    let parsed = &asked.parsed;
    // The upstream reserves the completion the tenant estimated (the adaptive
    // estimate, if any); its output windows charge max_tokens, as the
    // provider does.
    let demand = UpstreamDemand {
        lane: asked.lane,
        prompt_tokens: parsed.prompt_tokens,
        completion_tokens: grant.cost.output,
        max_completion_tokens: parsed.max_completion_tokens,
        model: parsed.model.clone(),
        wait_until: asked.wait_until,
    };
    let admitted = Admitted {
        api: asked.api,
        parsed,
        candidates: asked.route.upstreams_for(asked.api.upstream_kind()),
        demand,
        deadline: asked.deadline,
        client_headers,
        admitted_at: Instant::now(),
    };
    match dispatch(state, admitted, permit, Box::new(guard)).await {
        Ok(mut response) => {
            let flavor = super::error::Flavor::of(asked.api);
            rate_headers.apply_for(flavor, response.headers_mut());
            Ok(response)
        }
        Err(mut error) => {
            error.rate_headers = Some(Box::new(rate_headers));
            Err(error)
        }
    }
}
