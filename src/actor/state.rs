//! An actor's state and its decisions: the scope's limits, waiting queues, in-flight
//! permits and adaptive statistics, behind one lock ([`Shared`]).
//!
//! Two paths decide on it:
//!
//! - **Nothing waits**: a request is decided in its own task, under the lock
//!   ([`Core::decide_now`]). No message, no wake-up of another task: the decision
//!   costs a lock and a few limiter operations.
//! - **It must wait**: the request is forwarded to the actor task
//!   ([`super::task`]), which queues it and serves the queue as room comes.
//!
//! Permits settle under the lock from wherever they end and ring the actor's bell
//! only when someone waits. The lock is a `parking_lot::Mutex` held for a few
//! limiter operations, never across an await. Why not a message per decision:
//! docs/design/architecture.md, "Decided in the caller's task".
//!
//! Order: a request is decided in its own task only while the queue is empty *and*
//! no request is on its way to the queue ([`Core::forwarded`]), so no newcomer takes
//! room ahead of one that was already told to wait.

use super::estimate::{AdaptivePolicy, CompletionStats};
use super::metrics::{ActorMetrics, ScopeMetrics};
use super::queue::{WaitQueue, Waiter};
use super::scope::{Blocked, Charge, Cost, ScopeExport, ScopeLimits, ScopeStatus, Settle};
use super::task::{AcquireRequest, Grant, Refusal, Release, SettleWith};
use super::{Dimension, Lane, ScopeId};
use crate::clock::Clock;
use crate::limiter::Nanos;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{Notify, oneshot};

/// What an actor's callers, its permits and its task share.
pub struct Shared {
    core: Mutex<Core>,
    /// Rung when waiters may now fit (a release, credit arrived).
    bell: Notify,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    /// Shares `core`.
    pub fn new(core: Core) -> Shared {
        Shared {
            core: Mutex::new(core),
            bell: Notify::new(),
        }
    }

    /// The state, locked. Every critical section is a few limiter operations. A
    /// panic inside one (a bug) can leave at most the charge it was changing
    /// half-applied (a slot still counted); the lock is used on rather than
    /// failing every later request of the scope.
    pub fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock()
    }

    /// Tells the actor task to serve its queue (a stored permit if it is busy, so a
    /// ring is never lost).
    pub fn ring(&self) {
        self.bell.notify_one();
    }

    /// Waits for a ring.
    pub async fn rung(&self) {
        self.bell.notified().await;
    }

    /// Applies a permit's message; rings the actor when the release may let a
    /// waiter in. Never fails and never waits on another task, so a release
    /// cannot be refused or lost.
    pub fn release(&self, release: Release) {
        let mut core = self.lock();
        let frees = release.how.is_some();
        core.on_release(release);
        let someone_waits = !core.queue.is_empty();
        drop(core);
        if frees && someone_waits {
            self.ring();
        }
    }
}

/// What [`Core::decide_now`] decided.
#[derive(Debug)]
pub enum Decision {
    /// Admitted now.
    Granted(Grant),
    /// Refused now.
    Refused(Refusal),
    /// Must wait: forward to the actor task, with the cost it was costed at
    /// (counted in [`Core::forwarded`] until the task takes it).
    Forward(Cost),
    /// The actor retired: ask the registry for a fresh one.
    Retired,
}

/// A request on its way to the actor task's queue.
#[derive(Debug)]
pub struct Forwarded {
    /// What it asks for.
    pub request: AcquireRequest,
    /// Its cost (prompt and completion estimate), fixed when it arrived.
    pub cost: Cost,
    /// When it arrived: its wait and its deadline count from here.
    pub arrived_ns: Nanos,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Result<Grant, Refusal>>,
}

#[derive(Debug)]
struct Pending {
    prompt_tokens: u64,
    model: Arc<str>,
    busy_above: Option<crate::limiter::Ceiling>,
    reply: oneshot::Sender<Result<Grant, Refusal>>,
}

#[derive(Debug)]
struct Held {
    charge: Charge,
    model: Arc<str>,
}

/// Settings fixed at spawn.
pub struct ActorSettings {
    /// Scope identity.
    pub scope: ScopeId,
    /// Adaptive estimation (tenants with policy `adaptive`).
    pub adaptive: Option<AdaptivePolicy>,
    /// Idle time before retiring at rest, in ns.
    pub idle_timeout_ns: Nanos,
    /// Shared clock.
    pub clock: Clock,
    /// Metrics sink.
    pub metrics: Arc<ActorMetrics>,
}

/// One scope's state.
pub struct Core {
    settings: ActorSettings,
    limits: ScopeLimits,
    queue: WaitQueue<Pending>,
    /// By permit id, a counter of this node's (Fx: no client picks the keys,
    /// and every grant and release hashes one).
    permits: HashMap<u64, Held, rustc_hash::FxBuildHasher>,
    next_permit: u64,
    completions: CompletionStats,
    blocked_until_ns: Option<Nanos>,
    last_active_ns: Nanos,
    reported_depth: usize,
    /// Requests told to wait and not yet in the queue (in the mailbox).
    forwarded: usize,
    /// Set once, under the lock, when the actor task stops: nothing may be charged
    /// here any more (a newer actor owns the scope).
    retired: bool,
    /// Metric handles resolved at spawn.
    m: ScopeMetrics,
    /// Requests and tokens asked of this scope, admitted or not: the demand the
    /// cluster's shares are weighted by.
    requested: [u64; super::WINDOWS],
}

impl Core {
    /// A fresh scope with queues of at most `max_queue` waiters.
    pub fn new(
        settings: ActorSettings,
        limits: ScopeLimits,
        aging_ns: Nanos,
        max_queue: usize,
    ) -> Core {
        let now = settings.clock.now_ns();
        Core {
            limits,
            queue: WaitQueue::new(aging_ns, max_queue),
            permits: HashMap::default(),
            next_permit: 0,
            completions: CompletionStats::default(),
            blocked_until_ns: None,
            last_active_ns: now,
            reported_depth: 0,
            forwarded: 0,
            retired: false,
            m: settings.metrics.scope(settings.scope.kind),
            requested: [0; super::WINDOWS],
            settings,
        }
    }

    /// The node's clock (read under the lock, so decisions see time in order).
    pub fn clock(&self) -> Clock {
        self.settings.clock
    }

    /// When the scope was last asked for something or released, in ns.
    pub fn last_active_ns(&self) -> Nanos {
        self.last_active_ns
    }

    /// Idle time before retiring at rest, in ns.
    pub fn idle_timeout_ns(&self) -> Nanos {
        self.settings.idle_timeout_ns
    }

    /// Counts `now` as activity (the idle timer found the scope busy).
    pub fn touch(&mut self, now: Nanos) {
        self.last_active_ns = now;
    }

    /// Nothing queued, forwarded or in flight, and every window empty: stopping
    /// loses nothing.
    pub fn is_idle(&self, now: Nanos) -> bool {
        self.queue.is_empty()
            && self.forwarded == 0
            && self.permits.is_empty()
            && self.limits.is_at_rest(now)
    }

    /// Marks the scope retired (the actor task stops).
    pub fn retire(&mut self) {
        self.retired = true;
    }

    /// Drops every waiter unanswered (the actor task is stopping): their callers
    /// find their answer channel closed, nothing charged, and ask again.
    pub fn abandon_queue(&mut self) {
        drop(self.queue.remove_where(|_| true));
        self.report_depth();
    }

    /// The earliest time the actor task must look at its queue again.
    pub fn next_wake_ns(&self) -> Option<Nanos> {
        let deadline = self.queue.earliest_deadline()?;
        Some(self.blocked_until_ns.map_or(deadline, |b| b.min(deadline)))
    }

    /// Decides `request` in the caller's task if nothing waits; else says to
    /// forward it to the actor task.
    pub fn decide_now(&mut self, now: Nanos, request: &AcquireRequest) -> Decision {
        if self.retired {
            return Decision::Retired;
        }
        self.last_active_ns = now;
        let cost = self.cost(request);
        if !request.probe {
            self.count_demand(cost);
        }
        if self.queue.is_empty() && self.forwarded == 0 {
            match self
                .limits
                .admit(now, cost, request.lane, request.busy_above)
            {
                Ok(charge) => {
                    if request.probe {
                        self.count_demand(cost);
                    }
                    let (prompt, model) = (request.prompt_tokens, request.model.clone());
                    let grant = self.grant(now, request.lane, now, charge, prompt, model);
                    return Decision::Granted(grant);
                }
                // The try before a wait: the wait decides and counts.
                Err(blocked) if request.probe => {
                    return Decision::Refused(self.unrecorded(now, blocked));
                }
                // Waiting cannot help, or the caller will not wait.
                Err(blocked) if blocked.never || request.max_wait_ns == 0 => {
                    return Decision::Refused(self.refusal(now, blocked));
                }
                Err(_) => {}
            }
            if let Some(blocked) = self.outlasts_deadline(now, cost, request) {
                return Decision::Refused(self.refusal(now, blocked));
            }
        } else if let Err(blocked) = self.limits.check(now, cost, request.lane, None)
            && blocked.never
        {
            return Decision::Refused(if request.probe {
                self.unrecorded(now, blocked)
            } else {
                self.refusal(now, blocked)
            });
        } else if request.probe {
            // Others wait ahead of it: never admitted at once.
            let behind = Blocked {
                dimension: Dimension::Queue,
                retry_after_ns: 0,
                never: false,
            };
            return Decision::Refused(self.unrecorded(now, behind));
        } else if let Some(blocked) = self.outlasts_deadline(now, cost, request) {
            return Decision::Refused(self.refusal(now, blocked));
        }
        self.forwarded += 1;
        Decision::Forward(cost)
    }

    /// The local windows' block, when it is known to last past the request's
    /// deadline: they keep it out for longer than it may wait, and nothing
    /// admitted here is unsettled (a settlement below its reservation could
    /// free room sooner). Such a request is answered at once, with the exact
    /// retry-after, instead of after its whole wait; however the queue moves,
    /// it could not have been admitted in time.
    fn outlasts_deadline(
        &self,
        now: Nanos,
        cost: Cost,
        request: &AcquireRequest,
    ) -> Option<Blocked> {
        if self.limits.in_flight() > 0 {
            return None;
        }
        (self.limits.window_wait(now, cost, request.lane))
            .filter(|b| b.never || b.retry_after_ns > request.max_wait_ns)
    }

    /// The request's cost: its prompt and its completion estimate.
    fn cost(&self, request: &AcquireRequest) -> Cost {
        let completion = match (request.completion_estimate, self.settings.adaptive) {
            (Some(estimate), _) => estimate.min(request.max_completion_tokens),
            (None, Some(policy)) if request.adaptive => {
                self.completions
                    .estimate(&request.model, request.max_completion_tokens, policy)
            }
            _ => request.max_completion_tokens,
        };
        Cost {
            input: request.prompt_tokens,
            output: completion,
            output_cap: request.max_completion_tokens,
        }
    }

    /// Counts a request of `cost` as demand (asked, admitted or not).
    fn count_demand(&mut self, cost: Cost) {
        for (asked, dimension) in self.requested.iter_mut().zip(Dimension::WINDOWED) {
            *asked = asked.saturating_add(cost.on(dimension));
        }
    }

    /// A probe's refusal: the figures for it, no decision recorded.
    fn unrecorded(&self, now: Nanos, blocked: Blocked) -> Refusal {
        Refusal {
            blocked,
            status: self.status(now),
        }
    }

    /// Takes back a forward that never reached the mailbox (its caller went away
    /// while the mailbox was full).
    pub fn unforward(&mut self) {
        debug_assert!(self.forwarded > 0, "unforward without a forward");
        self.forwarded = self.forwarded.saturating_sub(1);
    }

    /// Queues a forwarded request (the actor task); it is served by the next
    /// [`Self::serve`].
    pub fn enqueue(&mut self, now: Nanos, forwarded: Forwarded) {
        debug_assert!(self.forwarded > 0, "enqueue without a forward");
        self.forwarded = self.forwarded.saturating_sub(1);
        self.last_active_ns = now;
        let Forwarded {
            request,
            cost,
            arrived_ns,
            reply,
        } = forwarded;
        let waiter = Waiter {
            lane: request.lane,
            enqueued_ns: arrived_ns,
            deadline_ns: arrived_ns.saturating_add(request.max_wait_ns),
            cost,
            payload: Pending {
                prompt_tokens: request.prompt_tokens,
                model: request.model,
                busy_above: request.busy_above,
                reply,
            },
        };
        if let Err(waiter) = self.queue.push(waiter) {
            let blocked = Blocked {
                dimension: Dimension::Queue,
                retry_after_ns: self
                    .blocked_until_ns
                    .map_or(super::scope::CONCURRENCY_RETRY_HINT_NS, |b| {
                        b.saturating_sub(now).max(1)
                    }),
                never: false,
            };
            let _ = waiter.payload.reply.send(Err(self.refusal(now, blocked)));
        }
        self.report_depth();
    }

    /// Current figures, with queue depths.
    pub fn status(&self, now: Nanos) -> ScopeStatus {
        let mut status = self.limits.status(now);
        status.queued = self.queue.depths();
        status
    }

    /// Local usage and demand for the cluster counters. Not activity: the sync
    /// engine's export every round must not keep an idle actor alive (otherwise
    /// no actor in a cluster would ever retire; docs/design/scale.md).
    pub fn export(&self, now: Nanos) -> ScopeExport {
        let mut export = self.limits.export(now);
        export.requested = self.requested;
        // Waiting for a slot: a queue while this scope has no slot free (a queue
        // held back only by a window or request credit, with a slot free, is no
        // slot demand).
        export.waiting = if self.limits.slots_exhausted(now) {
            self.queue.len() as u64
        } else {
            0
        };
        export
    }

    /// Refuses everything until `until_ns` (the upstream answered 429).
    pub fn cool_down(&mut self, until_ns: Nanos) {
        self.limits.cool_down(until_ns);
    }

    /// Whether this scope's actor has retired.
    pub fn is_retired(&self) -> bool {
        self.retired
    }

    fn on_release(&mut self, release: Release) {
        let now = self.settings.clock.now_ns();
        self.last_active_ns = now;
        // The provider counted the request by the upstream's answer: its charge
        // counts for a window from there (`ScopeLimits::redate`).
        let answered_ns = release.answered_at.map(|at| self.settings.clock.ns_at(at));
        let Some(ended) = release.how else {
            match (self.permits.get_mut(&release.permit_id), answered_ns) {
                (Some(held), Some(at)) => self.limits.redate(at, &mut held.charge),
                (None, _) => {
                    debug_assert!(false, "re-date of unknown permit {}", release.permit_id)
                }
                (Some(_), None) => {}
            }
            return;
        };
        let Some(mut held) = self.permits.remove(&release.permit_id) else {
            // Permits release exactly once; an unknown id would be a bug.
            debug_assert!(false, "release of unknown permit {}", release.permit_id);
            return;
        };
        if let Some(at) = answered_ns {
            self.limits.redate(at, &mut held.charge);
        }
        let how = match ended {
            SettleWith::Usage {
                prompt,
                cache_read,
                completion,
            } => {
                if self.settings.adaptive.is_some() {
                    self.completions.record(&held.model, completion);
                }
                Settle::Actual(self.limits.usage_cost(prompt, cache_read, completion))
            }
            SettleWith::KeepReserved => Settle::KeepReserved,
            SettleWith::RefundTokens => Settle::RefundTokens,
            SettleWith::Cancel => Settle::Cancel,
        };
        let reserved = held.charge.tokens_reserved;
        let settled = self.limits.settle(now, held.charge, how);
        self.m.settled(reserved, &settled.tokens, ended);
    }

    /// Admits queued waiters in order while they fit, then expires the rest whose
    /// deadline has come or whose caller went away.
    pub fn serve(&mut self, now: Nanos) {
        self.blocked_until_ns = None;
        loop {
            let [first, second] = self.queue.order();
            let Some(first) = first else { break };
            let blocked = match self.try_head(now, first) {
                Ok(()) => continue,
                Err(blocked) => blocked,
            };
            // A batch head held back (e.g. by the batch ceiling) must not hold back
            // the interactive waiter behind it in serving order.
            if first == Lane::Batch
                && let Some(second) = second
                && self.try_head(now, second).is_ok()
            {
                continue;
            }
            // Re-check at the retry hint. A local concurrency block is also woken by
            // the release that frees the slot; the timer covers cluster allowances,
            // which grow without any local event.
            self.blocked_until_ns = Some(now.saturating_add(blocked.retry_after_ns.max(1)));
            break;
        }
        self.expire(now);
        self.report_depth();
    }

    fn try_head(&mut self, now: Nanos, lane: Lane) -> Result<(), Blocked> {
        let Some(head) = self.queue.head(lane) else {
            return Ok(());
        };
        let charge = self
            .limits
            .admit(now, head.cost, lane, head.payload.busy_above)?;
        let Some(waiter) = self.queue.pop(lane) else {
            return Ok(());
        };
        let Pending {
            prompt_tokens,
            model,
            reply,
            ..
        } = waiter.payload;
        let grant = self.grant(now, lane, waiter.enqueued_ns, charge, prompt_tokens, model);
        let permit_id = grant.permit_id;
        if reply.send(Ok(grant)).is_err() {
            // The caller went away between asking and the answer: nothing was sent
            // upstream, so the charge is undone.
            self.m.cancelled();
            self.on_release(Release {
                permit_id,
                how: Some(SettleWith::Cancel),
                answered_at: None,
            });
        }
        Ok(())
    }

    fn grant(
        &mut self,
        now: Nanos,
        lane: Lane,
        arrived_ns: Nanos,
        charge: Charge,
        prompt_tokens: u64,
        model: Arc<str>,
    ) -> Grant {
        let waited_ns = now.saturating_sub(arrived_ns);
        self.m.admitted(lane, waited_ns, charge.tokens_reserved);
        let permit_id = self.next_permit;
        self.next_permit += 1;
        let (tokens_reserved, cost) = (charge.tokens_reserved, charge.cost);
        debug_assert!(cost.input == prompt_tokens);
        self.permits.insert(permit_id, Held { charge, model });
        Grant {
            permit_id,
            tokens_reserved,
            cost,
            status: self.status(now),
            waited_ns,
        }
    }

    fn expire(&mut self, now: Nanos) {
        let gone = self
            .queue
            .remove_where(|w| w.deadline_ns <= now || w.payload.reply.is_closed());
        if gone.is_empty() {
            return;
        }
        for waiter in gone {
            if waiter.payload.reply.is_closed() {
                self.m.cancelled();
                continue;
            }
            let blocked = self
                .limits
                .check(now, waiter.cost, waiter.lane, waiter.payload.busy_above)
                .err()
                .unwrap_or(Blocked {
                    // Blocked only by the waiters ahead of it.
                    dimension: Dimension::Queue,
                    retry_after_ns: self
                        .blocked_until_ns
                        .map_or(1_000_000, |b| b.saturating_sub(now).max(1)),
                    never: false,
                });
            let _ = waiter.payload.reply.send(Err(self.refusal(now, blocked)));
        }
        self.report_depth();
    }

    fn report_depth(&mut self) {
        let depth = self.queue.len();
        if depth != self.reported_depth {
            let delta = depth as i64 - self.reported_depth as i64;
            self.m.queue_moved(delta);
            self.reported_depth = depth;
        }
    }

    fn refusal(&self, now: Nanos, blocked: Blocked) -> Refusal {
        self.m.refused(blocked.dimension);
        Refusal {
            blocked,
            status: self.status(now),
        }
    }
}
