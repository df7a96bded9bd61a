//! Admission on one request's scopes: a scope's actor, then in `redis` mode
//! Redis, and a model group's scope before its owner's, all or nothing. The
//! tenant's path, the upstream's and pass-through's share it.

use super::error::ApiError;
use super::state::AppState;
use crate::actor::task::{AcquireRequest, Grant, Refusal};
use crate::actor::{Permit, ScopeId};
use std::time::Duration;
use tokio::time::Instant;

/// Admitted (the grant of the owner's scope, and a permit holding every
/// scope's charge), or refused by one scope (nothing charged anywhere).
pub(super) type Admission = Result<(Grant, Permit), Refusal>;

/// Admits `request` on `group` (a model group's scope, when the request's model
/// is in one) and then on `scope`, waiting until `wait_until` at most (a probe:
/// not at all). A refusal on `scope` cancels what `group` charged: its permit
/// is dropped before anything was sent.
pub(super) async fn admit(
    state: &AppState,
    group: Option<&ScopeId>,
    scope: &ScopeId,
    mut request: AcquireRequest,
    wait_until: Instant,
) -> Result<Admission, ApiError> {
    let inner = match group {
        Some(group) => match admit_one(state, group, &mut request, wait_until).await? {
            Ok((_, permit)) => Some(permit),
            Err(refusal) => return Ok(Err(refusal)),
        },
        None => None,
    };
    let admitted = admit_one(state, scope, &mut request, wait_until).await?;
    Ok(admitted.map(|(grant, permit)| match inner {
        Some(inner) => (grant, permit.holding(inner)),
        None => (grant, permit),
    }))
}

/// Times a request that found Redis lost is admitted again under the
/// fallback allowance the loss just set (never on the old one): Redis
/// flapping between tries would otherwise re-admit it without end.
const REDIS_LOST_RETRIES: u32 = 1;

/// Admits `request` on one scope's actor and, in `redis` mode, in Redis, within
/// what is left of the wait (set into `request` before each try).
async fn admit_one(
    state: &AppState,
    scope: &ScopeId,
    request: &mut AcquireRequest,
    wait_until: Instant,
) -> Result<Admission, ApiError> {
    let mut lost = 0;
    loop {
        if !request.probe {
            let left = wait_until.saturating_duration_since(Instant::now());
            request.max_wait_ns = u64::try_from(left.as_nanos()).unwrap_or(u64::MAX);
        }
        let (answer, handle) = (state.registry.acquire(scope, request).await)
            .map_err(|e| ApiError::unavailable(e.to_string(), Duration::from_secs(1)))?;
        let grant = match answer {
            Ok(grant) => grant,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let permit = Permit::new(&handle, &grant);
        let Some(gate) = state.redis_gate.get() else {
            return Ok(Ok((grant, permit)));
        };
        match gate.admit(scope, permit, grant.cost, wait_until).await {
            Ok(permit) => return Ok(Ok((grant, permit))),
            Err(r) if r.is_redis_lost() && lost < REDIS_LOST_RETRIES => lost += 1,
            Err(r) => return Ok(Err(r.into_refusal(grant.status))),
        }
    }
}
