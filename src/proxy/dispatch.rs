//! The attempt loop: choose and charge an upstream, forward, and act on the answer.
//! Success settles from the reported usage (at once, or when the stream ends). An
//! upstream 429 cools that upstream down for its `retry-after` and moves on to a
//! fallback (or waits for it within the deadline). A 5xx or transport error backs
//! off with full jitter and tries again. Every path settles every permit once.

use super::charges::Charges;
use super::error::ApiError;
use super::request::{Api, Parsed};
use super::select::{UpstreamDemand, choose};
use super::state::{AppState, Upstream};
use super::stream::{StreamLimits, metered};
use super::usage;
use crate::actor::scope::Cost;
use crate::actor::{Permit, SettleWith};
use crate::upstream_http::{UpstreamResponse, describe};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// Largest upstream (non-stream) response body read, in bytes.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
use super::provider_limits::{MAX_COOLDOWN, provider_exhausted_for, upstream_retry_after};

/// One client request, admitted by its tenant.
pub struct Admitted<'a> {
    /// API spoken.
    pub api: Api,
    /// Parsed request.
    pub parsed: &'a Parsed,
    /// Upstreams for the model, in preference order.
    pub candidates: &'a [Arc<Upstream>],
    /// What upstream actors are asked for.
    pub demand: UpstreamDemand,
    /// Overall deadline.
    pub deadline: Instant,
    /// Client headers (a few are forwarded).
    pub client_headers: &'a HeaderMap,
    /// When the tenant admitted it (after any queueing).
    pub admitted_at: Instant,
}

enum Attempt {
    Done(Response),
    /// Try again; the tenant permit and the guard come back for the next attempt.
    Retry {
        error: ApiError,
        backoff: bool,
        tenant: Permit,
        guard: Box<dyn Send + Sync>,
    },
    Fatal(ApiError),
}

/// Settles the upstream's permit and hands the tenant's back for another attempt.
fn retry(held: Charges, upstream: SettleWith, error: ApiError, backoff: bool) -> Attempt {
    let (tenant, guard) = held.for_retry(upstream);
    Attempt::Retry {
        error,
        backoff,
        tenant,
        guard,
    }
}

/// Runs attempts until one succeeds or the budget is spent. Owns the tenant permit
/// and the node's in-flight guard, which end up in the response (streams) or are
/// settled here.
pub async fn dispatch(
    state: &AppState,
    req: Admitted<'_>,
    tenant: Permit,
    guard: Box<dyn Send + Sync>,
) -> Result<Response, ApiError> {
    let retry = &state.config.retry;
    let mut rng = SmallRng::seed_from_u64(state.rng_counter.fetch_add(1, Ordering::Relaxed));
    let mut tenant = Some(tenant);
    let mut guard = Some(guard);
    let mut sent = false;
    let mut last_error = None;
    // When the tenant's charge was last dated: its admission, then each failed
    // attempt's answer (`None`: not sent yet).
    let mut tenant_dated: Option<Instant> = None;
    for attempt in 0..retry.max_attempts {
        // After an upstream's 429 there is no backoff: the deadline is checked
        // here, so no attempt starts that could only time out at once.
        if attempt > 0 && Instant::now() >= req.deadline {
            break;
        }
        let (upstream, permit) = match choose(state, req.candidates, &req.demand).await {
            Ok(chosen) => chosen,
            Err(error) => {
                last_error = Some(error);
                break;
            }
        };
        if Instant::now() >= req.deadline {
            // Never sent: the upstream's permit is cancelled (dropped before
            // `sending`), the tenant's settled below.
            drop(permit);
            last_error.get_or_insert_with(|| {
                ApiError::gateway_timeout("the request's deadline passed before it could be sent")
            });
            break;
        }
        sent = true;
        let (Some(tenant_permit), Some(held_guard)) = (tenant.take(), guard.take()) else {
            break;
        };
        let held = Charges {
            tenant: tenant_permit,
            upstream: permit,
            guard: held_guard,
            bound: req.parsed.usage_bound,
            metrics: Arc::clone(&state.metrics),
        };
        match attempt_once(state, &req, &upstream, held, tenant_dated).await {
            Attempt::Done(response) => return Ok(response),
            Attempt::Fatal(error) => return Err(error),
            Attempt::Retry {
                error,
                backoff,
                tenant: back,
                guard: back_guard,
            } => {
                // `retry` dated the tenant's charge at this answer.
                tenant_dated = Some(Instant::now());
                tenant = Some(back);
                guard = Some(back_guard);
                last_error = Some(error);
                if backoff {
                    let cap = retry
                        .backoff_max
                        .min(retry.backoff_base.saturating_mul(1 << attempt.min(16)));
                    let sleep = cap.mul_f64(rng.random::<f64>());
                    if Instant::now() + sleep >= req.deadline {
                        break;
                    }
                    tokio::time::sleep(sleep).await;
                }
            }
        }
    }
    if let Some(tenant) = tenant {
        tenant.settle(if sent {
            SettleWith::RefundTokens
        } else {
            SettleWith::Cancel
        });
    }
    let mut error =
        last_error.unwrap_or_else(|| ApiError::bad_gateway("no upstream attempt could be made"));
    // A request the upstream saw is this node's to answer: sent elsewhere, it
    // would be sent twice.
    error.spillable &= !sent;
    Err(error)
}

/// The request's headers to the upstream: its body's type, the provider key in
/// the header its API family reads, and Anthropic's version headers.
fn upstream_headers(req: &Admitted<'_>, upstream: &Upstream) -> HeaderMap {
    const ANTHROPIC_VERSION: HeaderName = HeaderName::from_static("anthropic-version");
    const ANTHROPIC_BETA: HeaderName = HeaderName::from_static("anthropic-beta");
    const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
    let mut headers = HeaderMap::with_capacity(5);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // As reqwest sent it: a provider sees the same request from either client.
    headers.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    let credentials = upstream.credentials.as_ref();
    match req.api {
        Api::Messages | Api::CountTokens => {
            let version = req
                .client_headers
                .get(&ANTHROPIC_VERSION)
                .cloned()
                .unwrap_or(HeaderValue::from_static("2023-06-01"));
            headers.insert(ANTHROPIC_VERSION, version);
            if let Some(beta) = req.client_headers.get(&ANTHROPIC_BETA) {
                headers.insert(ANTHROPIC_BETA, beta.clone());
            }
            if let Some(credentials) = credentials {
                headers.insert(X_API_KEY, credentials.key.clone());
            }
        }
        _ => {
            if let Some(credentials) = credentials {
                headers.insert(header::AUTHORIZATION, credentials.bearer.clone());
            }
        }
    }
    headers
}

/// Stops sending `model` to `upstream` for `wait`: the provider said a limit is
/// used up. A model in one of the upstream's groups cools its group down
/// alone: the provider's figures are per model (OpenAI) or model class
/// (Anthropic), and the group is what the config says shares them; the
/// account's other models keep their room.
fn cool_down(state: &AppState, upstream: &Upstream, model: &str, wait: Duration) {
    let clock = state.registry.clock();
    let scope = (upstream.model_groups.for_model(model)).unwrap_or(&upstream.scope);
    state
        .registry
        .cool_down(scope, clock.ns_at(Instant::now() + wait));
}

/// One attempt. `retried_at`: when an earlier attempt's answer dated the
/// tenant's charge (`None` on the first, dated at admission).
async fn attempt_once(
    state: &AppState,
    req: &Admitted<'_>,
    upstream: &Upstream,
    mut held: Charges,
    retried_at: Option<Instant>,
) -> Attempt {
    let started = Instant::now();
    // If this node stalled between admitting and sending (SIGSTOP, a frozen VM),
    // sending now would reach the provider in a window the cluster may no longer
    // charge it to: cancel instead (nothing is charged; the client is told to
    // retry). A request that only waited for an upstream is sent; its tenant's
    // charge moves to now first, so it counts a window from the send
    // (`super::stall` on telling the two apart). A retry's charge was dated at
    // the failed answer, and the backoff and the wait for an upstream since are
    // the same gap: checking the first attempt only would send a retry that
    // waited out a 4 s cool-down with a tenant charge that had left a 2 s window.
    let limits = &state.config.limits;
    let dated = retried_at.unwrap_or(req.admitted_at);
    if state.stall_watch.stalled_since(dated) {
        held.settle_expired(retried_at.is_some());
        return Attempt::Fatal(ApiError::unavailable(
            "This request's admission expired before it could be sent (the gateway was stalled); retry.",
            Duration::from_millis(1),
        ));
    }
    let bucket = limits.window / limits.buckets.max(1);
    if started.saturating_duration_since(dated) > bucket {
        held.tenant.redate_now();
    }
    held.sending();
    let sent = send_and_wait(state, req, upstream, &mut held, started).await;
    let seconds = started.elapsed().as_secs_f64();
    let response = match sent {
        None => {
            upstream.metrics.response(None, seconds);
            // The provider may have done the work: the upstream keeps its charge.
            let error = ApiError::gateway_timeout(format!(
                "upstream {} did not answer in time",
                upstream.id
            ));
            return retry(held, SettleWith::KeepReserved, error, true);
        }
        Some(Err(e)) => {
            upstream.metrics.response(None, seconds);
            let error = ApiError::bad_gateway(format!(
                "upstream {} failed: {}",
                upstream.id,
                describe(&*e)
            ));
            return retry(held, SettleWith::RefundTokens, error, true);
        }
        Some(Ok(response)) => response,
    };
    upstream
        .metrics
        .response(Some(response.status().as_u16()), seconds);
    on_answer(state, req, upstream, held, response).await
}

/// Sends the request and waits for the answer's headers, until the upstream's
/// timeout or the request's deadline (`None`: no headers by then). The
/// provider counts the request when it arrives, which the gateway only knows
/// happened by the answer: the charges count a window from there, not from the
/// admission (docs/design/limiter.md, "Charged when answered"). While no answer
/// comes, they are moved every half window so they keep counting. One timer
/// serves both that and the wait's end, so a request registers one, not two.
async fn send_and_wait(
    state: &AppState,
    req: &Admitted<'_>,
    upstream: &Upstream,
    held: &mut Charges,
    started: Instant,
) -> Option<Result<UpstreamResponse, crate::upstream_http::BoxError>> {
    let headers_by = req.deadline.min(started + upstream.timeout);
    let send = state.upstream_http.post(
        &upstream.endpoints[req.api.index()],
        upstream_headers(req, upstream),
        req.parsed.body.clone(),
    );
    tokio::pin!(send);
    let redate_every = state.config.limits.window / 2;
    // Checked: a configured window of ages would overflow an `Instant`.
    let redate_after = |from: Instant| from.checked_add(redate_every).unwrap_or(headers_by);
    let timer = tokio::time::sleep_until(headers_by.min(redate_after(started)));
    tokio::pin!(timer);
    let sent = loop {
        tokio::select! {
            biased;
            sent = &mut send => break Some(sent),
            () = &mut timer => {
                let now = Instant::now();
                if now >= headers_by {
                    break None;
                }
                held.redate_now();
                timer.as_mut().reset(headers_by.min(redate_after(now)));
            }
        }
    };
    // Whatever came back (headers, an error, nothing in time), the provider has
    // counted the request by now (bar one still on the wire after a timeout).
    held.answered();
    sent
}

/// Acts on the upstream's answer: the provider's own exhaustion headers pause
/// it; a 429 cools it down and moves on; a 5xx is retried with backoff; a
/// redirect is refused; a success streams or is read whole and settled.
/// An answer: taken as the client's, with the provider's request id, or
/// retried.
async fn on_answer(
    state: &AppState,
    req: &Admitted<'_>,
    upstream: &Upstream,
    held: Charges,
    response: UpstreamResponse,
) -> Attempt {
    let provider_id = super::request_id::of_upstream(response.headers());
    if let Some(id) = provider_id.as_ref().and_then(|id| id.to_str().ok()) {
        tracing::Span::current().record("upstream_request_id", id);
    }
    let mut attempt = take_answer(state, req, upstream, held, response).await;
    if let (Attempt::Done(out), Some(id)) = (&mut attempt, provider_id) {
        out.headers_mut()
            .insert(super::request_id::X_REQUEST_ID, id);
    }
    attempt
}

async fn take_answer(
    state: &AppState,
    req: &Admitted<'_>,
    upstream: &Upstream,
    mut held: Charges,
    response: UpstreamResponse,
) -> Attempt {
    let status = response.status();
    let cost = Cost {
        input: req.demand.prompt_tokens,
        output: req.demand.completion_tokens,
        output_cap: req.demand.max_completion_tokens,
    };
    if let Some(wait) = provider_exhausted_for(response.headers(), cost, SystemTime::now()) {
        // The provider is the ground truth: when it says a window is used up, stop
        // sending there until one request's worth is back, even if our own figures
        // disagree.
        cool_down(state, upstream, &req.demand.model, wait.min(MAX_COOLDOWN));
    }
    if status == StatusCode::TOO_MANY_REQUESTS {
        let wait = upstream_retry_after(response.headers())
            .unwrap_or(state.config.retry.cooldown)
            .min(MAX_COOLDOWN);
        cool_down(state, upstream, &req.demand.model, wait);
        let error = ApiError::rate_limited(
            format!("upstream {} is rate limited", upstream.id),
            wait.max(Duration::from_millis(1)),
            None,
        );
        return retry(held, SettleWith::RefundTokens, error, false);
    }
    if status.is_server_error() {
        let error = ApiError::bad_gateway(format!("upstream {} answered {status}", upstream.id));
        return retry(held, SettleWith::RefundTokens, error, true);
    }
    if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
        // Fatal, not retried: another attempt would meet the same key.
        held.settle(SettleWith::RefundTokens);
        return Attempt::Fatal(credentials_refused(upstream, status));
    }
    if status.is_redirection() {
        // Not followed (the client is built without redirects): the body and the key
        // would go to an address the config never named. The provider did no work.
        // Fatal on purpose, not moved on to a fallback: a redirecting `base_url` is a
        // configuration error, and every request failing loudly shows it at once.
        held.settle(SettleWith::RefundTokens);
        return Attempt::Fatal(ApiError::bad_gateway(format!(
            "upstream {} answered {status}, a redirect the gateway does not follow; set its base_url to the final address",
            upstream.id
        )));
    }
    if req.parsed.stream && status.is_success() {
        // A stream settles at its end, maybe more than a window later: the
        // charges move now.
        held.redate_now();
        return Attempt::Done(stream_response(response, held, req, upstream));
    }
    match read_body(response, upstream.timeout, req.deadline).await {
        Ok((status, content_type, body)) => finish_whole(status, content_type, body, held),
        Err(error) => {
            held.settle_unserved();
            Attempt::Fatal(error)
        }
    }
}

/// The provider refused the gateway's own key (401) or its account (403):
/// the tenant's key is not at fault, and the provider's body, which may echo
/// the key, never reaches the tenant nor the log.
fn credentials_refused(upstream: &Upstream, status: StatusCode) -> ApiError {
    tracing::error!(
        upstream = %upstream.id,
        %status,
        "the upstream refused the gateway's credentials: check the upstream's api_key"
    );
    let mut error = ApiError::bad_gateway(format!(
        "upstream {} refused the gateway's credentials ({}); the gateway's operator must check them",
        upstream.id,
        status.as_u16()
    ));
    error.code = "upstream_auth_failed";
    error
}

fn stream_response(
    response: UpstreamResponse,
    held: Charges,
    req: &Admitted<'_>,
    upstream: &Upstream,
) -> Response {
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let limits = StreamLimits {
        idle_timeout: upstream.stream_idle_timeout,
        deadline: req.deadline,
    };
    let body = metered(
        response.into_body(),
        held,
        req.api,
        req.parsed.strip_usage_chunk,
        limits,
    );
    let mut out = Response::new(Body::from_stream(body));
    *out.status_mut() = status;
    let headers = out.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        content_type.unwrap_or(HeaderValue::from_static("text/event-stream")),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    out
}

async fn read_body(
    response: UpstreamResponse,
    idle: Duration,
    deadline: Instant,
) -> Result<(StatusCode, Option<HeaderValue>, bytes::Bytes), ApiError> {
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let mut response = response.into_body();
    let mut body = bytes::BytesMut::new();
    loop {
        let by = deadline.min(Instant::now() + idle);
        match tokio::time::timeout_at(by, response.chunk()).await {
            Err(_) => {
                return Err(ApiError::gateway_timeout(
                    "upstream stopped sending its response",
                ));
            }
            Ok(Err(e)) => {
                return Err(ApiError::bad_gateway(format!(
                    "upstream response broke off: {}",
                    describe(&*e)
                )));
            }
            Ok(Ok(None)) => break,
            Ok(Ok(Some(chunk))) => {
                if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                    return Err(ApiError::bad_gateway("upstream response too large"));
                }
                body.extend_from_slice(&chunk);
            }
        }
    }
    Ok((status, content_type, body.freeze()))
}

fn finish_whole(
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: bytes::Bytes,
    held: Charges,
) -> Attempt {
    let how = if status.is_success() {
        match usage::from_body(&body) {
            Ok(Some(u)) => u.settle_with(),
            Ok(None) => SettleWith::KeepReserved,
            Err(_) => {
                held.settle_unserved();
                return Attempt::Fatal(ApiError::bad_gateway(
                    "upstream answered with a body that is not JSON",
                ));
            }
        }
    } else {
        // A 4xx from the upstream is about the request; it did no work.
        SettleWith::RefundTokens
    };
    held.settle(how);
    let mut out = Response::new(Body::from(body));
    *out.status_mut() = status;
    out.headers_mut().insert(
        header::CONTENT_TYPE,
        content_type.unwrap_or(HeaderValue::from_static("application/json")),
    );
    Attempt::Done(out)
}
