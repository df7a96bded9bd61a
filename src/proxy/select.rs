//! Choosing an upstream for one attempt: skip upstreams at >= 90% of any limit or
//! cooling down while a fallback exists; else take any that admits now; else wait
//! for the one that frees first, within the request's wait budget. Each step is an
//! admission on the upstream's actor, so a chosen upstream is already charged.

use super::error::ApiError;
use super::headers::RateHeaders;
use super::state::{AppState, Upstream};
use crate::actor::task::{AcquireRequest, Refusal};
use crate::actor::{Lane, Permit};
use crate::limiter::Ceiling;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Usage at or above this fraction of any limit makes an upstream "busy".
pub const BUSY_SHARE: f64 = 0.9;

/// What the upstream actors are asked for.
#[derive(Clone, Debug)]
pub struct UpstreamDemand {
    /// Lane of the request.
    pub lane: Lane,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens to reserve (the tenant's estimate).
    pub completion_tokens: u64,
    /// The request's `max_tokens`: what output-token windows charge.
    pub max_completion_tokens: u64,
    /// Model.
    pub model: Arc<str>,
    /// Stop waiting at this instant.
    pub wait_until: Instant,
}

/// Asks `upstream`'s actors (its model group's first, when the model is in
/// one) and, in `redis` mode, Redis for a permit, waiting until `wait_until`
/// at most (now: not at all; see [`super::admit`]).
async fn try_one(
    state: &AppState,
    upstream: &Upstream,
    demand: &UpstreamDemand,
    wait_until: Instant,
    busy_above: Option<Ceiling>,
) -> Result<Result<Permit, Refusal>, ApiError> {
    let request = AcquireRequest {
        lane: demand.lane,
        prompt_tokens: demand.prompt_tokens,
        max_completion_tokens: demand.max_completion_tokens,
        completion_estimate: Some(demand.completion_tokens),
        model: demand.model.clone(),
        adaptive: false,
        max_wait_ns: 0,
        busy_above,
        probe: false,
    };
    let group = upstream.model_groups.for_model(&demand.model);
    let admitted = super::admit::admit(state, group, &upstream.scope, request, wait_until).await?;
    Ok(admitted.map(|(_, permit)| permit))
}

/// Picks and charges an upstream among `candidates` (in preference order).
pub async fn choose(
    state: &AppState,
    candidates: &[Arc<Upstream>],
    demand: &UpstreamDemand,
) -> Result<(Arc<Upstream>, Permit), ApiError> {
    if candidates.len() > 1 {
        let busy = Some(Ceiling::from_share(BUSY_SHARE));
        for upstream in candidates {
            if let Ok(permit) = try_one(state, upstream, demand, Instant::now(), busy).await? {
                return Ok((upstream.clone(), permit));
            }
        }
    }
    let mut soonest: Option<(&Arc<Upstream>, Refusal)> = None;
    for upstream in candidates {
        match try_one(state, upstream, demand, Instant::now(), None).await? {
            Ok(permit) => return Ok((upstream.clone(), permit)),
            Err(refusal) if refusal.blocked.never => {}
            Err(refusal) => {
                if soonest
                    .as_ref()
                    .is_none_or(|(_, s)| refusal.blocked.retry_after_ns < s.blocked.retry_after_ns)
                {
                    soonest = Some((upstream, refusal));
                }
            }
        }
    }
    let Some((upstream, refusal)) = soonest else {
        return Err(ApiError::too_large(format!(
            "The request needs {} tokens, more than any upstream for this model admits per window.",
            demand.prompt_tokens + demand.completion_tokens
        )));
    };
    let retry = Duration::from_nanos(refusal.blocked.retry_after_ns);
    if demand.wait_until <= Instant::now() {
        return Err(upstream_busy(&refusal, retry));
    }
    match try_one(state, upstream, demand, demand.wait_until, None).await? {
        Ok(permit) => Ok((upstream.clone(), permit)),
        Err(refusal) => Err(upstream_busy(
            &refusal,
            Duration::from_nanos(refusal.blocked.retry_after_ns),
        )),
    }
}

fn upstream_busy(refusal: &Refusal, retry: Duration) -> ApiError {
    let mut error = ApiError::rate_limited(
        format!(
            "Upstream capacity for this model is exhausted ({} limit). Retry after {} ms.",
            refusal.blocked.dimension.as_str(),
            retry.as_millis().max(1)
        ),
        retry.max(Duration::from_millis(1)),
        Some(RateHeaders::from_status(&refusal.status)),
    );
    // A cooling-down upstream is the provider's word, not this node's share.
    error.spillable = refusal.blocked.dimension != crate::actor::Dimension::Cooldown;
    error
}
