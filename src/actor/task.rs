//! The actor task: one tokio task per scope, serving the scope's waiting queue. A
//! request that finds nothing waiting is decided in its own task
//! ([`super::state::Core::decide_now`]); one that must wait is forwarded here on a
//! bounded mailbox, queued, and admitted as room comes: a permit's release or
//! arriving `lease` credit rings the task's bell, and a timer covers deadlines and
//! cluster allowances that grow without a local event. The task also retires the
//! scope when it is idle and at rest.

use super::Lane;
use super::scope::{Blocked, ScopeStatus};
use super::state::{Forwarded, Shared};
use crate::limiter::{Ceiling, Nanos};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::time::sleep_until;

/// What a request asks one scope for.
#[derive(Clone, Debug)]
pub struct AcquireRequest {
    /// Priority lane.
    pub lane: Lane,
    /// Prompt tokens (exact estimate).
    pub prompt_tokens: u64,
    /// Upper bound of completion tokens (the request's max_tokens or the default):
    /// what output-token windows charge at admission.
    pub max_completion_tokens: u64,
    /// The completion to reserve elsewhere, when another scope estimated it
    /// (an upstream reserves its tenant's adaptive estimate); `None`: this
    /// scope's own policy.
    pub completion_estimate: Option<u64>,
    /// Model, for adaptive statistics.
    pub model: Arc<str>,
    /// Estimate the completion adaptively (tenants with policy `adaptive`); else
    /// reserve `max_completion_tokens`.
    pub adaptive: bool,
    /// Longest time to wait in the queue, in ns (0 = fail fast).
    pub max_wait_ns: Nanos,
    /// Refuse when any dimension is at or above this fraction (routing's 90% rule).
    pub busy_above: Option<Ceiling>,
    /// A first try that a waiting one may follow (spillover's, `proxy::spill`):
    /// admitted only at once, never queued, and neither counted as demand nor
    /// as a refusal unless admitted (the waiting try counts it).
    pub probe: bool,
}

/// An admission.
#[derive(Debug)]
pub struct Grant {
    /// Id to settle with.
    pub permit_id: u64,
    /// Tokens reserved on this scope (0 when it limits no tokens).
    pub tokens_reserved: u64,
    /// What the request was costed at: its prompt and completion estimate.
    pub cost: super::scope::Cost,
    /// Figures after the charge, for response headers.
    pub status: ScopeStatus,
    /// Time spent queued, in ns.
    pub waited_ns: Nanos,
}

/// A refusal, with the figures for the 429's headers.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// What blocked and for how long.
    pub blocked: Blocked,
    /// Figures at the time of refusal.
    pub status: ScopeStatus,
}

/// How a permit ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleWith {
    /// Real usage reported by the upstream.
    Usage {
        /// Prompt tokens, cache reads apart.
        prompt: u64,
        /// Prompt tokens read from the provider's prompt cache (Anthropic's
        /// `cache_read_input_tokens`), counted as input only by scopes that say so.
        cache_read: u64,
        /// Completion tokens.
        completion: u64,
    },
    /// Usage unknown: keep what was reserved (client gone mid-stream, stream cut).
    KeepReserved,
    /// Sent, but the upstream did no work: refund tokens, keep the request.
    RefundTokens,
    /// Never sent: refund everything.
    Cancel,
}

/// What a permit tells its scope (applied under the lock, [`Shared::release`]).
#[derive(Debug)]
pub struct Release {
    /// The permit.
    pub permit_id: u64,
    /// How it ended; `None`: not yet, only `answered_at` is news.
    pub how: Option<SettleWith>,
    /// When the upstream answered: the charge moves there first
    /// ([`super::Permit::answered`]).
    pub answered_at: Option<tokio::time::Instant>,
}

/// Unregisters the scope from the registry when its actor retires. Called under
/// the scope's lock once it is idle: nothing is forwarded (`forwarded == 0`), so
/// the mailbox is empty and no request can race into it.
pub type RetireHook = Box<dyn Fn() + Send>;

/// Stops the scope however its task ends (retired, every handle gone, or a
/// panic): marks it retired and drops its waiters' answer channels, so a caller
/// waiting there asks the registry again instead of waiting on a task that is
/// gone (when the task owned the state, a panic dropped them with it).
pub(super) struct Stopping(pub(super) Arc<Shared>);

impl Drop for Stopping {
    fn drop(&mut self) {
        let mut core = self.0.lock();
        core.retire();
        core.abandon_queue();
    }
}

/// Serves `shared`'s queue until retired (idle at rest) or until every handle is
/// gone.
pub async fn run(shared: Arc<Shared>, mut commands: mpsc::Receiver<Forwarded>, retire: RetireHook) {
    let _stopping = Stopping(shared.clone());
    let (clock, idle_timeout_ns, last_active_ns) = {
        let core = shared.lock();
        (core.clock(), core.idle_timeout_ns(), core.last_active_ns())
    };
    // One idle timer for the actor's life, re-armed only when it fires: a new one
    // per message would be registered in the runtime's timer wheel each time the
    // actor parked and cancelled each time a message woke it.
    let idle = sleep_until(clock.instant_at(last_active_ns + idle_timeout_ns));
    tokio::pin!(idle);
    loop {
        let wake = shared.lock().next_wake_ns().map(|ns| clock.instant_at(ns));
        tokio::select! {
            biased;
            () = shared.rung() => {}
            command = commands.recv() => match command {
                Some(forwarded) => {
                    let mut core = shared.lock();
                    let now = clock.now_ns();
                    core.enqueue(now, forwarded);
                }
                None => return,
            },
            () = sleep_until(wake.unwrap_or_else(|| idle.deadline())), if wake.is_some() => {}
            () = &mut idle => {
                let mut core = shared.lock();
                let now = clock.now_ns();
                // Active since it was armed: not idle yet, wait out the rest.
                if now >= core.last_active_ns() + idle_timeout_ns {
                    // Under the scope's lock: no request can be decided here
                    // between the check and the mark.
                    if core.is_idle(now) {
                        debug_assert!(commands.is_empty(), "idle with a request in the mailbox");
                        retire();
                        core.retire();
                        return;
                    }
                    core.touch(now);
                }
                idle.as_mut().reset(clock.instant_at(core.last_active_ns() + idle_timeout_ns));
            }
        }
        let mut core = shared.lock();
        let now = clock.now_ns();
        core.serve(now);
    }
}
