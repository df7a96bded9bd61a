//! Spillover (docs/design/spillover.md): a request this node would refuse for want
//! of its own share of a `lease` key goes, once, to a peer whose share has room by
//! the gossiped figures, over the internal RPC. The peer admits it on its own
//! credit, as if the client had called it, so every node still spends only what
//! its owners granted it and every promise of `lease` mode holds: what moves
//! between nodes is the request, not the capacity.
//!
//! - `sync::spill::Room`: each peer's room per key, written by the sync engine
//!   each round.
//! - [`pick`]: the peer with the most room for everything the request needs.
//! - [`spill_now`]: whether a request the tenant's probe refused spills early.
//! - [`or_refuse`]: spills a refused request (the hop itself is `forward`) and
//!   says whose answer the client gets.
//! - [`accept`]: the peer's side, behind the cluster secret.

use super::error::ApiError;
use super::handler::{InFlight, MAX_WAIT_HEADER};
use super::request::Api;
use super::state::{AppState, Upstream};
use crate::actor::scope::Cost;
use crate::actor::{Dimension, ScopeId};
use crate::sync::auth::AUTH_HEADER;
use crate::sync::lease::MemberAddr;
use crate::sync::spill::{
    Board, CLUSTER_HEADER, FROM_HEADER, PATH_PREFIX, Room, SERVED_BY_HEADER, TIME_LEFT_HEADER,
};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// What one request costs each of `scope`'s leased keys: binding index and cost
/// (empty for a scope with no cluster-wide limit).
fn scope_costs(state: &AppState, scope: &ScopeId, cost: Cost) -> Vec<(u32, u64)> {
    let Some(first) = state.registry.leased_from(scope) else {
        return Vec::new();
    };
    let same_scope = (state.bindings.iter().enumerate().skip(first as usize))
        .take_while(|(_, b)| b.scope == *scope && b.leased);
    same_scope
        .filter_map(|(i, b)| {
            let cost = match b.dimension {
                Dimension::Queue | Dimension::Cooldown => return None,
                dimension => cost.on(dimension),
            };
            Some((i as u32, cost))
        })
        .collect()
}

/// The least room left on `costs`' keys at `peer` after the request, as a
/// fraction of each key's capacity; `None` if any key lacks the room. A scope
/// with no leased key fits anywhere (1.0).
fn slack(state: &AppState, room: &Room, costs: &[(u32, u64)], peer: usize) -> Option<f64> {
    let mut least = 1.0f64;
    for &(binding, cost) in costs {
        let capacity = state.bindings[binding as usize].capacity.max(1);
        let left = room.at(binding, capacity, peer).checked_sub(cost)?;
        least = least.min(left as f64 / capacity as f64);
    }
    Some(least)
}

/// The peer with the most room, by the gossiped figures, for the tenant's keys
/// and for at least one of the candidate upstreams' keys, each charged the
/// request's cost (prompt and the most completion it may reserve), with the
/// costs its choice takes there; `None` if no peer has room for all of it.
pub fn pick(
    state: &AppState,
    room: &Room,
    tenant: &ScopeId,
    upstreams: &[Arc<Upstream>],
    cost: Cost,
) -> Option<(usize, Vec<(u32, u64)>)> {
    let tenant_costs = scope_costs(state, tenant, cost);
    let upstream_costs: Vec<_> = (upstreams.iter())
        .map(|u| scope_costs(state, &u.scope, cost))
        .collect();
    // (peer, its score, the upstream whose room decided it)
    let mut best: Option<(usize, f64, usize)> = None;
    for peer in 0..room.peers.len() {
        let Some(for_tenant) = slack(state, room, &tenant_costs, peer) else {
            continue;
        };
        let for_upstream = (upstream_costs.iter().enumerate())
            .filter_map(|(u, costs)| slack(state, room, costs, peer).map(|s| (u, s)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let Some((upstream, for_upstream)) = for_upstream else {
            continue;
        };
        let score = for_tenant.min(for_upstream);
        if best.is_none_or(|(_, b, _)| score > b) {
            best = Some((peer, score, upstream));
        }
    }
    let (peer, _, upstream) = best?;
    let mut costs = tenant_costs;
    costs.extend_from_slice(&upstream_costs[upstream]);
    Some((peer, costs))
}

/// Whether a request the tenant's admission could not admit at once should be
/// spilled now rather than wait here: spillover is on, this node's own share of
/// the tenant's keys has no room for it by the last round's figures (its credit
/// running low between statements is no reason: the owner would grant more
/// within its share), and [`pick`] finds a peer with room (nothing taken yet).
pub fn spill_now(
    state: &AppState,
    tenant: &ScopeId,
    upstreams: &[Arc<Upstream>],
    cost: Cost,
) -> bool {
    let Some(board) = state.spill.as_ref() else {
        return false;
    };
    let room = board.room();
    room.own_short(&scope_costs(state, tenant, cost))
        && pick(state, &room, tenant, upstreams, cost).is_some()
}

/// Client headers that are the connection's own or that spillover sets itself,
/// never copied onto the hop.
fn is_own_header(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "upgrade"
            | "proxy-connection"
            | AUTH_HEADER
            | CLUSTER_HEADER
            | FROM_HEADER
            | TIME_LEFT_HEADER
            | MAX_WAIT_HEADER
    )
}

/// How a hop ended (not [`super::handler::Hop`], where a request came from).
enum Delivery {
    /// The peer's answer to the client (it carries [`SERVED_BY_HEADER`]).
    Answered(Response),
    /// Surely never served there: no connection, or the peer's RPC itself
    /// refused the hop (another secret, no spill route: a peer with spillover
    /// off or an older build). This node may still serve or refuse it.
    NotDelivered,
    /// Perhaps served there (the connection failed or the deadline passed after
    /// the request went out): this node must not send it anywhere again.
    MaybeDelivered,
}

/// Sends a refused request to `peer` on `slot` (one of this node's in-flight
/// slots, held until the answer's body ends) and returns how it went.
async fn forward(
    state: &Arc<AppState>,
    board: &Board,
    peer: &MemberAddr,
    request: &Refused<'_>,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> Delivery {
    let guard = InFlight::new(state.clone(), slot);
    let path = format!("{PATH_PREFIX}{}", request.api.as_str());
    let url = format!("http://{}{path}", peer.rpc);
    let Some((headers, request_tag)) = hop_headers(board, &peer.rpc, &path, request) else {
        state.metrics.spilled("failed");
        return Delivery::NotDelivered;
    };
    let hop = (state.upstream_http.reqwest().post(url))
        .headers(headers)
        .body(request.body.clone());
    let answer = match tokio::time::timeout_at(request.deadline, hop.send()).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) if e.is_connect() => {
            tracing::debug!(peer = %peer.id, error = %e, "spillover: the peer could not be reached");
            state.metrics.spilled("failed");
            return Delivery::NotDelivered;
        }
        Ok(Err(e)) => {
            tracing::warn!(peer = %peer.id, error = %e, "spillover: no answer from the peer");
            state.metrics.spilled("failed");
            return Delivery::MaybeDelivered;
        }
        Err(_) => {
            tracing::warn!(peer = %peer.id, "spillover: no answer from the peer by the deadline");
            state.metrics.spilled("failed");
            return Delivery::MaybeDelivered;
        }
    };
    let status = answer.status();
    let tag = answer.headers().get(AUTH_HEADER);
    let tagged = crate::sync::auth::answered(&request_tag, tag, status.as_u16(), None);
    if !tagged && answer.headers().get(SERVED_BY_HEADER).is_some() {
        // Says it was served, without this hop's tag: something on the way
        // made or altered it. Not the client's answer, but the request may
        // have been served.
        tracing::warn!(peer = %peer.id, %status, "spillover: an answer without this hop's tag");
        state.metrics.spilled("failed");
        return Delivery::MaybeDelivered;
    }
    if answer.headers().get(SERVED_BY_HEADER).is_none() {
        // The peer's RPC answered, not its proxy: a refused secret, or no spill
        // route there (spillover off, an older build). Not the client's answer.
        tracing::warn!(peer = %peer.id, %status, "spillover: the peer's RPC refused the hop");
        state.metrics.spilled("failed");
        return Delivery::NotDelivered;
    }
    state
        .metrics
        .spilled(if status == StatusCode::TOO_MANY_REQUESTS {
            "refused"
        } else {
            "served"
        });
    let mut response = Response::builder().status(status);
    for (name, value) in answer.headers().iter().filter(|(n, _)| !is_own_header(n)) {
        response = response.header(name, value);
    }
    let idle = stream_idle_bound(state);
    let body = futures_util::stream::unfold(Some((answer, guard)), move |open| async move {
        let (mut answer, guard) = open?;
        match tokio::time::timeout(idle, answer.chunk()).await {
            Ok(Ok(Some(chunk))) => Some((Ok(chunk), Some((answer, guard)))),
            Ok(Ok(None)) => None,
            Ok(Err(e)) => Some((Err(std::io::Error::other(e)), None)),
            Err(_) => Some((Err(std::io::Error::other("spilled answer stalled")), None)),
        }
    });
    match response.body(Body::from_stream(body)) {
        Ok(response) => Delivery::Answered(response),
        // Only a header the peer sent that this side cannot rebuild: the
        // request was served there.
        Err(_) => Delivery::MaybeDelivered,
    }
}

/// The hop's headers: the client's (less the connection's own), the spill's,
/// and the tag over them and the body; `None` when a value cannot be a header.
fn hop_headers(
    board: &Board,
    to: &str,
    path: &str,
    request: &Refused<'_>,
) -> Option<(HeaderMap, tollgate_cluster::auth::rpc::RequestTag)> {
    let mut headers = HeaderMap::new();
    for (name, value) in (request.headers.iter()).filter(|(n, _)| !is_own_header(n)) {
        headers.append(name.clone(), value.clone());
    }
    // A client that asked to wait less (0: fail fast) is not made to wait more.
    let asked = (request.headers.get(MAX_WAIT_HEADER))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u128>().ok());
    let wait_ms = asked.map_or(board.wait.as_millis(), |ms| ms.min(board.wait.as_millis()));
    let value = |text: String| HeaderValue::from_str(&text).ok();
    headers.insert(CLUSTER_HEADER, value(board.cluster_id().to_owned())?);
    headers.insert(FROM_HEADER, value(board.node_id().to_owned())?);
    headers.insert(MAX_WAIT_HEADER, value(wait_ms.to_string())?);
    let time_left = time_left_ms(request.deadline).to_string();
    headers.insert(TIME_LEFT_HEADER, value(time_left)?);
    let tag = crate::sync::auth::sign_with(board.signer(), to, path, &mut headers, &request.body);
    Some((headers, tag))
}

/// What is left until `deadline`, in whole ms, at least 1 (a hop sent with no
/// time left times out at the peer at once).
fn time_left_ms(deadline: Instant) -> u128 {
    deadline
        .saturating_duration_since(Instant::now())
        .as_millis()
        .max(1)
}

/// How long a spilled answer's body may go silent: the longest upstream stream
/// idle timeout plus a margin (the peer ends a stalled upstream stream by then).
fn stream_idle_bound(state: &AppState) -> Duration {
    let longest = (state.routes.iter())
        .flat_map(|r| r.upstreams())
        .map(|u| u.stream_idle_timeout)
        .max()
        .unwrap_or(Duration::from_secs(60));
    longest + Duration::from_secs(5)
}

/// The peer's side: a request spilled here by a member of this cluster, served
/// as a client's would be, except that it is never spilled again and is counted
/// in `tollgate_spill_received_total`. The internal RPC checked its tag;
/// another cluster's id: 401.
async fn accept(state: Arc<AppState>, api: Api, headers: HeaderMap, body: Body) -> Response {
    let Some(board) = state.spill.as_ref() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if let Some(reason) = board.refuses(&headers) {
        state.metrics.rpc_refused(reason);
        tracing::warn!(reason, "internal RPC refused: a spilled request");
        let e = ApiError::unauthorized();
        return e.with_flavor(super::error::Flavor::of(api)).into_response();
    }
    if state.draining.load(Ordering::Relaxed) {
        // Shutting down: the sender answers its own refusal instead (a 503
        // here carries no served-by header, so it is not the client's answer).
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if state.in_flight.available_permits() == 0 {
        // At its in-flight limit: the request would get this node's 503 as
        // its answer, though its sender may still serve it or refuse it with
        // a 429 and a wait. Not delivered, as above. (A slot taken between
        // this look and the handler's still gets that 503: narrower, not gone.)
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    // Without the header (a hand-made call), the peer's own request_timeout.
    let within = (headers.get(TIME_LEFT_HEADER))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(state.config.server.request_timeout, Duration::from_millis);
    let spilled = super::handler::Hop::Spilled { within };
    let mut response = super::handler::handle(state.clone(), api, headers, body, spilled).await;
    if let Ok(node) = HeaderValue::from_str(board.node_id()) {
        response.headers_mut().insert(SERVED_BY_HEADER, node);
    }
    response
}

/// [`accept`] for the spill route's API named by its path segment (`chat`,
/// `messages`, ...): 404 for a name it does not know. The server wires this
/// into the internal RPC.
pub async fn accept_named(
    state: Arc<AppState>,
    api: String,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match api_named(&api) {
        Some(api) => accept(state, api, headers, body).await,
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The spill routes' API by path segment.
fn api_named(name: &str) -> Option<Api> {
    Api::ALL.into_iter().find(|a| a.as_str() == name)
}

/// Spills a request this node refused with `refusal`, if spillover is on, the
/// request came from a client (not a peer), the refusal is this node's own
/// (never sent upstream), a slot is free here and a peer has room. `Ok`: the
/// answer the client gets (the peer's, or `refusal` itself when the hop may
/// have been served there: it is sent nowhere again). `Err(refusal)`: not
/// spilled, nor delivered anywhere; this node may still wait and serve it.
pub async fn or_refuse(
    state: &Arc<AppState>,
    refusal: ApiError,
    request: Refused<'_>,
) -> Result<Response, ApiError> {
    let Some(board) = state.spill.as_ref() else {
        return Err(refusal);
    };
    if !refusal.spillable || matches!(request.hop, super::handler::Hop::Spilled { .. }) {
        return Err(refusal);
    }
    let room = board.room();
    let Some((peer, costs)) = pick(
        state,
        &room,
        request.tenant,
        request.upstreams,
        request.cost,
    ) else {
        state.metrics.spilled("no_peer");
        return Err(refusal);
    };
    let Ok(slot) = state.in_flight.clone().try_acquire_owned() else {
        state.metrics.spilled("failed");
        return Err(refusal);
    };
    room.take(&costs, peer);
    match forward(state, board, &room.peers[peer], &request, slot).await {
        Delivery::Answered(response) => Ok(response),
        Delivery::NotDelivered => Err(refusal),
        Delivery::MaybeDelivered => {
            let mut refusal = refusal;
            refusal.spillable = false;
            Ok(refusal
                .with_flavor(super::error::Flavor::of(request.api))
                .into_response())
        }
    }
}

/// A refused request, as [`or_refuse`] needs it.
pub struct Refused<'a> {
    /// API spoken.
    pub api: Api,
    /// Where it came from.
    pub hop: super::handler::Hop,
    /// The tenant's scope.
    pub tenant: &'a ScopeId,
    /// Upstreams that serve its model.
    pub upstreams: &'a [Arc<Upstream>],
    /// Its prompt and the most completion it may reserve.
    pub cost: Cost,
    /// The client's headers.
    pub headers: &'a HeaderMap,
    /// The client's body, as it came.
    pub body: Bytes,
    /// The request's overall deadline.
    pub deadline: Instant,
}
