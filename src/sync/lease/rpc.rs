//! The internal RPC: an axum server on `cluster.rpc_listen` (never the proxy port)
//! taking statement batches, and a pooled reqwest client sending them. Every
//! request carries a tag under the cluster secret (`super::super::auth`),
//! checked before anything reads it, and every answer a tag binding it to its
//! request; an untagged, forged, stale or replayed request, another cluster's
//! id, a malformed or oversized batch is refused with a status, a log line and
//! `tollgate_internal_rpc_refused_total{reason}`, and changes nothing.

use super::owner::OwnerBook;
use super::wire::{self, Answer, Answers, Batch, Nudge};
use crate::ops::metrics::Metrics;
use crate::sync::auth::{self, AUTH_HEADER, RpcAuth};
use crate::sync::parts::SpilledRequests;
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// What the server needs.
pub(crate) struct RpcState {
    /// The lines this node owns.
    pub book: Arc<OwnerBook>,
    /// Checks requests' tags and tags answers.
    pub auth: Arc<RpcAuth>,
    /// Largest spilled request body (the proxy's own bound).
    pub spill_body_limit: usize,
    /// This cluster's id.
    pub cluster_id: String,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Longest time to read a request body.
    pub read_timeout: Duration,
    /// Serves requests peers spill here, when spillover is on (the proxy's
    /// side, wired in by the server).
    pub spilled: Option<SpilledRequests>,
}

/// The router (also used by tests on their own listener).
pub(crate) fn app(state: Arc<RpcState>) -> Router {
    Router::new()
        .route(wire::SYNC_PATH, post(sync))
        .route(wire::NUDGE_PATH, post(nudge))
        .route(SPILL_ROUTE, post(spilled))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// Every route's gate: reads the body (bounded, within the read timeout),
/// refuses a request whose tag is missing, forged, stale or seen before, and
/// tags the answer: over its body for statements and nudges, over its status
/// alone for a spilled request's answer, which streams.
async fn authenticate(
    State(state): State<Arc<RpcState>>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    // A request its header alone refuses costs no body buffered.
    if let Err(refusal) = state.auth.precheck(&parts.headers) {
        return refuse_unauthenticated(&state, refusal);
    }
    let path = parts.uri.path().to_owned();
    let spill = path.starts_with(crate::sync::spill::PATH_PREFIX);
    let limit = if spill {
        state.spill_body_limit
    } else {
        wire::MAX_BODY_BYTES
    };
    let read = axum::body::to_bytes(body, limit);
    let bytes = match tokio::time::timeout(state.read_timeout, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => {
            return refuse(&state, StatusCode::PAYLOAD_TOO_LARGE, "body", e.to_string());
        }
        Err(_) => {
            return refuse(
                &state,
                StatusCode::REQUEST_TIMEOUT,
                "body",
                "body too slow".into(),
            );
        }
    };
    let request_tag = match state.auth.verify(&path, &parts.headers, &bytes) {
        Ok(tag) => tag,
        Err(refusal) => return refuse_unauthenticated(&state, refusal),
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let status = response.status().as_u16();
    if spill {
        let mut response = response;
        let tag = request_tag.answer(status, None);
        if let Ok(value) = HeaderValue::from_str(&tag) {
            response.headers_mut().insert(AUTH_HEADER, value);
        }
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // This node's own answers: as large as the batch at most.
    let Ok(body) = axum::body::to_bytes(body, 2 * wire::MAX_BODY_BYTES).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    if let Ok(value) = HeaderValue::from_str(&request_tag.answer(status, Some(&body))) {
        parts.headers.insert(AUTH_HEADER, value);
    }
    Response::from_parts(parts, Body::from(body))
}

/// A 401 for a request that failed its tag.
fn refuse_unauthenticated(state: &RpcState, refusal: tollgate_cluster::auth::Refusal) -> Response {
    let detail = format!("cluster authentication failed: {refusal}");
    let label = auth::refusal_label(refusal);
    refuse(state, StatusCode::UNAUTHORIZED, label, detail)
}

/// [`PATH_PREFIX`](crate::sync::spill::PATH_PREFIX) with the API's name.
const SPILL_ROUTE: &str = "/internal/v1/spill/{api}";

/// A request a peer spilled here: served by the proxy (404 with spillover off
/// here, or for an API it does not know).
async fn spilled(
    State(state): State<Arc<RpcState>>,
    Path(api): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match &state.spilled {
        Some(serve) => serve(api, headers, body).await,
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The internal RPC listener's bounds: peers' statement clients keep idle
/// connections for 5 s, well within the header timeout, so a connection the
/// listener closes for idling is never one a peer is about to reuse.
const LIMITS: crate::listen::Limits = crate::listen::Limits {
    header_timeout: Duration::from_secs(30),
    body_idle_timeout: Duration::from_secs(10),
    max_connections: 1_024,
    max_per_ip: None,
};

/// Serves until `shutdown` resolves (within [`LIMITS`]).
pub(crate) async fn serve(
    listener: TcpListener,
    state: Arc<RpcState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let stats = Arc::new(crate::listen::Stats::default());
    state.metrics.connections().watch("rpc", Arc::clone(&stats));
    crate::listen::serve(listener, app(state), LIMITS, stats, None, shutdown).await;
}

fn refuse(state: &RpcState, status: StatusCode, reason: &'static str, detail: String) -> Response {
    state.metrics.rpc_refused(reason);
    tracing::warn!(reason, %detail, "internal RPC refused");
    let body = serde_json::json!({ "error": { "code": reason, "message": detail } });
    (status, axum::Json(body)).into_response()
}

/// A message between nodes: which cluster it is for, and how many entries.
trait Envelope: serde::de::DeserializeOwned {
    fn cluster_id(&self) -> &str;
    fn entries(&self) -> usize;
}

impl Envelope for Batch {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }
    fn entries(&self) -> usize {
        self.entries.len()
    }
}

impl Envelope for Nudge {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }
    fn entries(&self) -> usize {
        self.keys.len()
    }
}

/// The body of an authenticated request for this cluster with at most
/// [`wire::MAX_ENTRIES`] entries, or the refusal to send.
async fn read_message<T: Envelope>(state: &RpcState, body: Body) -> Result<T, Response> {
    let message: T = read_json(state, body).await?;
    if message.cluster_id() != state.cluster_id {
        let detail = format!(
            "cluster id {:?} is not this cluster's",
            message.cluster_id()
        );
        return Err(refuse(state, StatusCode::FORBIDDEN, "cluster_id", detail));
    }
    if message.entries() > wire::MAX_ENTRIES {
        let detail = format!("{} entries (max {})", message.entries(), wire::MAX_ENTRIES);
        let status = StatusCode::PAYLOAD_TOO_LARGE;
        return Err(refuse(state, status, "too_many_entries", detail));
    }
    Ok(message)
}

/// The body of an authenticated request (read whole by [`authenticate`]) as
/// `T`, or the refusal to send.
async fn read_json<T: serde::de::DeserializeOwned>(
    state: &RpcState,
    body: Body,
) -> Result<T, Response> {
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|e| refuse(state, StatusCode::BAD_REQUEST, "body", e.to_string()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| refuse(state, StatusCode::BAD_REQUEST, "malformed", e.to_string()))
}

/// An owner waiting for this holder's statements: the named keys are stated at
/// the holder's next round (unknown keys are ignored: ownership may differ).
async fn nudge(State(state): State<Arc<RpcState>>, body: Body) -> Response {
    let nudge: Nudge = match read_message(&state, body).await {
        Ok(nudge) => nudge,
        Err(refused) => return refused,
    };
    let known = state.book.restate(&nudge.keys);
    tracing::debug!(from = %nudge.from, keys = nudge.keys.len(), known, "asked to state keys");
    axum::Json(serde_json::json!({ "keys": known })).into_response()
}

async fn sync(State(state): State<Arc<RpcState>>, body: Body) -> Response {
    let batch: Batch = match read_message(&state, body).await {
        Ok(batch) => batch,
        Err(refused) => return refused,
    };
    let entries = (batch.entries.iter())
        .map(|entry| {
            let result = state.book.sync(&batch.from, &entry.key, &entry.request());
            if let Err(refusal) = &result {
                let code = wire::refusal_code(refusal);
                // Ownership races and retransmissions are normal; the rest is bad input.
                if !matches!(code, "not_owner" | "stale") {
                    state.metrics.rpc_refused(code);
                    tracing::warn!(from = %batch.from, key = %entry.key, %refusal, "lease statement refused");
                }
            }
            Answer::from_result(&result)
        })
        .collect();
    state.book.send_asks_again();
    axum::Json(Answers { entries }).into_response()
}

/// Why a batch got no answers.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// Connect, timeout or transport failure: the owner is unreachable.
    #[error("owner unreachable: {0}")]
    Unreachable(String),
    /// The owner answered with an error status (authentication, cluster id,
    /// malformed).
    #[error("owner refused the batch: {status} {body}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Its body.
        body: String,
    },
    /// The answer did not parse or did not match the batch.
    #[error("bad answer: {0}")]
    BadAnswer(String),
}

/// Posts `batch` to the owner at `rpc_addr`; the client carries the timeouts.
/// An answer without its tag is a bad one: nothing in it is believed.
pub(crate) async fn call(
    client: &reqwest::Client,
    rpc_addr: &str,
    auth: &RpcAuth,
    batch: &Batch,
) -> Result<Vec<Answer>, CallError> {
    let body = serde_json::to_vec(batch).map_err(|e| CallError::BadAnswer(e.to_string()))?;
    let (response, request_tag) = post_json(client, rpc_addr, wire::SYNC_PATH, auth, body)
        .await
        .map_err(|e| CallError::Unreachable(e.to_string()))?;
    let status = response.status();
    let tag = response.headers().get(AUTH_HEADER).cloned();
    let bytes = read_capped(response).await?;
    if status.is_success()
        && !auth::answered(&request_tag, tag.as_ref(), status.as_u16(), Some(&bytes))
    {
        return Err(CallError::BadAnswer(
            "an answer without this request's tag".into(),
        ));
    }
    if !status.is_success() {
        let body = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned();
        return Err(CallError::Refused {
            status: status.as_u16(),
            body,
        });
    }
    let answers: Answers =
        serde_json::from_slice(&bytes).map_err(|e| CallError::BadAnswer(e.to_string()))?;
    if answers.entries.len() != batch.entries.len() {
        return Err(CallError::BadAnswer(format!(
            "{} answers to {} statements",
            answers.entries.len(),
            batch.entries.len()
        )));
    }
    Ok(answers.entries)
}

/// Reads an owner's answer, at most `wire::MAX_BODY_BYTES`, as much as a
/// statement may be: a peer holds the secret, but a bug in one must not make
/// this node buffer without bound.
async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, CallError> {
    let mut bytes = Vec::new();
    while let Some(chunk) =
        (response.chunk().await).map_err(|e| CallError::Unreachable(e.to_string()))?
    {
        if bytes.len() + chunk.len() > wire::MAX_BODY_BYTES {
            return Err(CallError::BadAnswer(format!(
                "an answer over {} bytes",
                wire::MAX_BODY_BYTES
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// POSTs a JSON `body` to `path` on the node at `rpc_addr`, tagged; returns
/// the answer and the tag it must carry.
async fn post_json(
    client: &reqwest::Client,
    rpc_addr: &str,
    path: &str,
    auth: &RpcAuth,
    body: Vec<u8>,
) -> Result<(reqwest::Response, tollgate_cluster::auth::rpc::RequestTag), reqwest::Error> {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let tag = auth.sign(rpc_addr, path, &mut headers, &body);
    let response = (client.post(format!("http://{rpc_addr}{path}")))
        .headers(headers)
        .body(body)
        .send()
        .await?;
    Ok((response, tag))
}

/// Asks the holder at `rpc_addr` to state `nudge.keys` (best effort: a lost
/// nudge leaves the line to its ttl, as before nudges existed).
pub(crate) async fn send_nudge(
    client: &reqwest::Client,
    rpc_addr: &str,
    auth: &RpcAuth,
    nudge: &Nudge,
) {
    let Ok(body) = serde_json::to_vec(nudge) else {
        return;
    };
    match post_json(client, rpc_addr, wire::NUDGE_PATH, auth, body).await {
        Ok((r, _)) if r.status().is_success() => {}
        Ok((r, _)) => tracing::warn!(to = %rpc_addr, status = %r.status(), "lease nudge refused"),
        Err(e) => tracing::debug!(to = %rpc_addr, error = %e, "lease nudge not delivered"),
    }
}

/// The pooled client for statements: every call bounded by `timeout`.
pub(crate) fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        // Idle connections close soon: each keeps read and write buffers grown to
        // its largest batch (the start statements of every key an owner owns),
        // ~0.4 KB per configured tenant per node at 1,000 tenants (massif). A
        // busy key is stated every round, which keeps its
        // owner's connection warm.
        .pool_idle_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(4)
        .no_proxy()
        .build()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU8, Ordering};
    use tollgate_cluster::auth::keys::Channel;
    use tollgate_cluster::auth::rpc::{Request as Tagged, RpcVerifier};

    const SECRET: &str = "rpc-test-secret-0123456789";

    /// How the test owner tags its answers.
    const UNTAGGED: u8 = 0;
    const TAGGED_OVER_ANOTHER_BODY: u8 = 1;
    const TAGGED: u8 = 2;

    fn cluster(rpc: &str) -> crate::config::ClusterConfig {
        let text = format!(
            "[cluster]\ncluster_id = \"t\"\nnode_id = \"a\"\ngossip_listen = \"127.0.0.1:1\"\n\
             rpc_listen = \"{rpc}\"\nsecret = \"{SECRET}\"\nmode = \"lease\"\n\n\
             [[upstreams]]\nid = \"u\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\n\n\
             [[routes]]\nmodels = [\"*\"]\nupstreams = [\"u\"]\n"
        );
        let config = crate::config::Config::from_toml(&text, "test.toml").expect("config");
        config.cluster.expect("[cluster]")
    }

    /// An owner on `listener` granting every statement, its answers tagged as
    /// `mode` says.
    fn owner(listener: TcpListener, mode: Arc<AtomicU8>) {
        let to = listener.local_addr().expect("addr").to_string();
        let keys = crate::sync::auth::keys(&cluster(&to), Channel::Rpc).expect("keys");
        let verifier = Arc::new(RpcVerifier::new(keys));
        let answer = move |headers: HeaderMap, body: axum::body::Bytes| {
            let (verifier, mode, to) = (verifier.clone(), mode.clone(), to.clone());
            async move {
                let pairs: Vec<(&str, &[u8])> = (headers.iter())
                    .map(|(n, v)| (n.as_str(), v.as_bytes()))
                    .collect();
                let request = Tagged {
                    to: &to,
                    path: wire::SYNC_PATH,
                    headers: &pairs,
                    body: &body,
                };
                let auth = headers.get(AUTH_HEADER).map(HeaderValue::as_bytes);
                let now = tollgate_cluster::auth::unix_ms();
                let tag = verifier
                    .verify(auth, &request, now)
                    .expect("a tagged statement");
                let granted = r#"{"entries":[{"credit":{"credit":5,"granted":5,"ttl_ms":1000}}]}"#;
                let tagged_over = match mode.load(Ordering::Relaxed) {
                    UNTAGGED => None,
                    TAGGED_OVER_ANOTHER_BODY => Some(r#"{"entries":[]}"#),
                    _ => Some(granted),
                };
                let mut response = granted.into_response();
                if let Some(over) = tagged_over {
                    let value = tag.answer(200, Some(over.as_bytes()));
                    let value = HeaderValue::from_str(&value).expect("hex");
                    response.headers_mut().insert(AUTH_HEADER, value);
                }
                response
            }
        };
        let app = Router::new().route(wire::SYNC_PATH, post(answer));
        tokio::spawn(async move { axum::serve(listener, app).await });
    }

    /// A holder believes no grant whose answer does not carry the tag of its
    /// own request over that very answer.
    #[tokio::test]
    async fn a_grant_without_this_requests_tag_is_not_believed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let to = listener.local_addr().expect("addr").to_string();
        let mode = Arc::new(AtomicU8::new(UNTAGGED));
        owner(listener, mode.clone());
        let holder = RpcAuth::new(&cluster("127.0.0.1:2")).expect("keys");
        let batch = Batch {
            cluster_id: "t".into(),
            from: "a/1@127.0.0.1:1".into(),
            entries: vec![wire::Entry {
                key: "tenant:t:requests".into(),
                seq: 1,
                usage: Vec::new(),
                remaining: 0,
                want: 5,
                adopted: 0,
                held: 0,
            }],
        };
        let client = client(Duration::from_secs(2));
        for (how, believed) in [
            (UNTAGGED, false),
            (TAGGED_OVER_ANOTHER_BODY, false),
            (TAGGED, true),
        ] {
            mode.store(how, Ordering::Relaxed);
            let called = call(&client, &to, &holder, &batch).await;
            match (called, believed) {
                (Err(CallError::BadAnswer(why)), false) if why.contains("tag") => {}
                (Ok(answers), true) => assert_eq!(answers.len(), 1),
                (other, _) => panic!("answer tagged as {how}: {other:?}"),
            }
        }
    }
}
