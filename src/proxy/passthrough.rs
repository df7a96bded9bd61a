//! Provider endpoints passed through as they are (`[[routes]] passthrough`):
//! the Responses API beside its metered `POST`, files, uploads, batches,
//! images, audio and moderations. A client needs one base URL for all of its
//! calls, and these still answer to the tenant's limits.
//!
//! A passed-through request is authenticated as any other, takes a slot of
//! the node's in-flight bound, and is admitted on the tenant as one request
//! with no tokens (its request limit and concurrency bind; nothing is
//! estimated, since these endpoints bill by other measures). It goes to the
//! first OpenAI upstream of the first route that lists its family, with that
//! upstream's key instead of the tenant's, method, path below `/v1` and query
//! unchanged. Bodies stream both ways, never held whole: an upload at most
//! `server.max_passthrough_body_bytes` (413 beyond, before anything is sent
//! when its length is declared), a download with the upstream's
//! `stream_idle_timeout` between chunks. The permit is held until the answer
//! ends, then settled as the one request it was.

use super::AppState;
use super::error::ApiError;
use super::handler::{self, InFlight};
use super::headers::RateHeaders;
use super::request_id;
use super::state::{Tenant, Upstream};
use crate::actor::task::{AcquireRequest, Grant};
use crate::actor::{Lane, Permit, SettleWith};
use crate::config::Passthrough;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The model name a passed-through request is admitted under (none is read).
const PASSTHROUGH_MODEL: &str = "passthrough";

/// Client headers a passed-through request carries on (its key is replaced
/// by the upstream's; everything else stays at the node).
const FORWARDED_REQUEST_HEADERS: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::ACCEPT,
    HeaderName::from_static("openai-beta"),
];

/// Upstream headers the client gets back.
const FORWARDED_RESPONSE_HEADERS: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_DISPOSITION,
    header::CACHE_CONTROL,
];

/// Every passed-through path.
pub async fn handle(State(state): State<Arc<AppState>>, request: Request) -> Response {
    match pass(&state, request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn pass(state: &Arc<AppState>, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let family = Passthrough::of_path(path).ok_or_else(|| not_passed(path))?;
    let tenant = handler::authenticate(state, &parts.headers)?.clone();
    let upstream = state
        .passthrough_to(family)
        .ok_or_else(|| not_passed(path))?
        .clone();
    let limit = state.config.server.max_passthrough_body_bytes;
    let declared = (parts.headers.get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large(limit));
    }
    let slot = handler::take_a_slot(state)?;
    let deadline = Instant::now() + state.config.server.request_timeout;
    let wait_until = (Instant::now() + tenant.max_wait).min(deadline);
    let (grant, mut permit) = admit(state, &tenant, wait_until).await?;
    let tail = path.strip_prefix("/v1").unwrap_or(path);
    let query = parts.uri.query().map_or(String::new(), |q| format!("?{q}"));
    let url = format!("{}{tail}{query}", upstream.base_url);
    let over = Arc::new(AtomicBool::new(false));
    let upload = limited(body.into_data_stream(), limit, over.clone());
    let sent = (state.upstream_http.reqwest())
        .request(parts.method, url)
        .headers(upstream_headers(&parts.headers, &upstream))
        .body(reqwest::Body::wrap_stream(upload))
        .send();
    let answered = tokio::time::timeout_at(deadline.min(Instant::now() + upstream.timeout), sent);
    let response = match answered.await {
        Ok(Ok(response)) => response,
        Ok(Err(_)) if over.load(Ordering::Relaxed) => {
            permit.settle(SettleWith::Cancel);
            return Err(too_large(limit));
        }
        Ok(Err(e)) => {
            return Err(ApiError::bad_gateway(format!(
                "upstream {} failed: {}",
                upstream.id,
                crate::upstream_http::describe(&e)
            )));
        }
        Err(_) => {
            return Err(ApiError::gateway_timeout(format!(
                "upstream {} did not answer in time",
                upstream.id
            )));
        }
    };
    permit.answered();
    // The provider did the work: however the answer ends (hyper drops a body
    // once it sent its declared length, a client may leave), the one request
    // stays charged.
    permit.drop_as(SettleWith::Usage {
        cache_read: 0,
        prompt: 0,
        completion: 0,
    });
    Ok(answer(response, &grant, permit, slot, &upstream))
}

/// Admits one request with no tokens on the tenant (and in `redis` mode in
/// Redis; see [`super::admit`]).
async fn admit(
    state: &Arc<AppState>,
    tenant: &Tenant,
    wait_until: Instant,
) -> Result<(Grant, Permit), ApiError> {
    let request = AcquireRequest {
        lane: Lane::Interactive,
        prompt_tokens: 0,
        max_completion_tokens: 0,
        completion_estimate: None,
        model: Arc::from(PASSTHROUGH_MODEL),
        adaptive: false,
        max_wait_ns: 0,
        busy_above: None,
        probe: false,
    };
    let admitted = super::admit::admit(state, None, &tenant.scope, request, wait_until).await?;
    admitted.map_err(|refusal| handler::tenant_refusal(&refusal))
}

/// The client's headers that go on, and the upstream's key.
fn upstream_headers(client: &HeaderMap, upstream: &Upstream) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for name in FORWARDED_REQUEST_HEADERS {
        if let Some(value) = client.get(&name) {
            headers.insert(name, value.clone());
        }
    }
    if let Some(credentials) = &upstream.credentials {
        headers.insert(header::AUTHORIZATION, credentials.bearer.clone());
    }
    headers
}

/// The upstream's answer, streamed to the client; the permit and the node's
/// slot are held until its last byte.
fn answer(
    response: reqwest::Response,
    grant: &Grant,
    permit: Permit,
    slot: InFlight,
    upstream: &Upstream,
) -> Response {
    let status = response.status();
    let mut headers = HeaderMap::new();
    for name in FORWARDED_RESPONSE_HEADERS {
        if let Some(value) = response.headers().get(&name) {
            headers.insert(name, value.clone());
        }
    }
    if let Some(id) = request_id::of_upstream(response.headers()) {
        headers.insert(request_id::X_REQUEST_ID, id);
    }
    RateHeaders::from_status(&grant.status).apply(&mut headers);
    let idle = upstream.stream_idle_timeout;
    let body = streamed(
        response.bytes_stream(),
        idle,
        Held {
            _permit: permit,
            _slot: slot,
        },
    );
    let mut out = Response::new(Body::from_stream(body));
    *out.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    *out.headers_mut() = headers;
    out
}

/// What a streamed answer holds until it ends: the request's permit (settled
/// as the one request it was, on its drop) and the node's slot.
struct Held {
    _permit: Permit,
    _slot: InFlight,
}

/// The upstream's body, each chunk within `idle` of the last; ended with an
/// error on a silence or a break.
fn streamed(
    body: impl Stream<Item = Result<Bytes, reqwest::Error>> + Send + Unpin + 'static,
    idle: Duration,
    held: Held,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send {
    futures_util::stream::unfold(Some((body, held)), move |state| async move {
        let (mut body, held) = state?;
        match tokio::time::timeout(idle, body.next()).await {
            Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some((body, held)))),
            Ok(None) => None,
            Ok(Some(Err(e))) => Some((Err(std::io::Error::other(e)), None)),
            Err(_) => Some((
                Err(std::io::Error::other("upstream went silent mid-body")),
                None,
            )),
        }
    })
}

/// The client's body, refused (the stream fails, `over` set) past `limit`.
fn limited(
    body: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
    limit: u64,
    over: Arc<AtomicBool>,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let mut seen = 0u64;
    body.map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        seen = seen.saturating_add(chunk.len() as u64);
        if seen > limit {
            over.store(true, Ordering::Relaxed);
            return Err(std::io::Error::other("body over the pass-through limit"));
        }
        Ok(chunk)
    })
}

fn not_passed(path: &str) -> ApiError {
    let mut e = ApiError::bad_request(
        format!("{path} is not passed through: no route lists its family under `passthrough`."),
        None,
    );
    e.status = StatusCode::NOT_FOUND;
    e.code = "not_found";
    e
}

fn too_large(limit: u64) -> ApiError {
    ApiError::too_large(format!(
        "The body exceeds {limit} bytes (server.max_passthrough_body_bytes)."
    ))
}
