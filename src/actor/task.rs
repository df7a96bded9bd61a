//! The actor loop: one tokio task per scope. It owns the scope's limits, its waiting
//! queues, its in-flight permits and (for tenants) adaptive completion statistics.
//! Commands arrive on a bounded mailbox; releases on their own channel, which is
//! bounded by the permits outstanding (each sends one release, and before it at
//! most one re-date per stream start, retried attempt and half window of waiting
//! for an answer, all bounded), so a release can never be refused or lost.

use super::clock::Clock;
use super::estimate::{AdaptivePolicy, CompletionStats};
use super::queue::{WaitQueue, Waiter};
use super::scope::{Blocked, Charge, ScopeLimits, ScopeStatus, Settle};
use super::{Dimension, Lane, ScopeId};
use crate::limiter::{Ceiling, Nanos};
use crate::ops::metrics::Metrics;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio::time::sleep_until;

/// What a request asks one scope for.
#[derive(Debug)]
pub struct AcquireRequest {
    /// Priority lane.
    pub lane: Lane,
    /// Prompt tokens (exact estimate).
    pub prompt_tokens: u64,
    /// Upper bound of completion tokens (the request's max_tokens or the default).
    pub max_completion_tokens: u64,
    /// Model, for adaptive statistics.
    pub model: Arc<str>,
    /// Estimate the completion adaptively (tenants with policy `adaptive`); else
    /// reserve `max_completion_tokens`.
    pub adaptive: bool,
    /// Longest time to wait in the queue, in ns (0 = fail fast).
    pub max_wait_ns: Nanos,
    /// Refuse when any dimension is at or above this fraction (routing's 90% rule).
    pub busy_above: Option<Ceiling>,
    /// Where the answer goes.
    pub reply: oneshot::Sender<Result<Grant, Refusal>>,
}

/// An admission.
#[derive(Debug)]
pub struct Grant {
    /// Id to settle with.
    pub permit_id: u64,
    /// Tokens reserved on this scope (prompt + completion estimate).
    pub tokens_reserved: u64,
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

/// Messages on the bounded mailbox.
#[derive(Debug)]
pub enum Command {
    /// Admit a request (maybe after queueing).
    Acquire(AcquireRequest),
    /// Report current figures.
    Status(oneshot::Sender<ScopeStatus>),
    /// Report local usage for the cluster counters.
    Export(oneshot::Sender<super::scope::ScopeExport>),
    /// Refuse everything until `until_ns` (the upstream answered 429).
    CoolDown {
        /// End of the cool-down.
        until_ns: Nanos,
    },
    /// Re-check the waiters now (`lease` mode: credit arrived).
    Wake,
}

/// How a permit ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleWith {
    /// Real usage reported by the upstream.
    Usage {
        /// Prompt tokens.
        prompt: u64,
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

/// A message from a permit.
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

#[derive(Debug)]
struct Pending {
    prompt_tokens: u64,
    model: Arc<str>,
    busy_above: Option<Ceiling>,
    reply: oneshot::Sender<Result<Grant, Refusal>>,
}

#[derive(Debug)]
struct Held {
    charge: Charge,
    model: Arc<str>,
}

/// Called when the actor wants to retire; returns true if it was unregistered (the
/// registry checks, under its lock, that no message raced in).
pub type RetireHook =
    Box<dyn Fn(&mpsc::Receiver<Command>, &mpsc::UnboundedReceiver<Release>) -> bool + Send>;

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
    pub metrics: Arc<Metrics>,
}

/// The actor's state.
pub struct Actor {
    settings: ActorSettings,
    limits: ScopeLimits,
    queue: WaitQueue<Pending>,
    permits: HashMap<u64, Held>,
    next_permit: u64,
    completions: CompletionStats,
    blocked_until_ns: Option<Nanos>,
    last_active_ns: Nanos,
    reported_depth: usize,
    /// Metric handles resolved at spawn.
    m: crate::ops::metrics::ScopeMetrics,
    /// Requests and tokens asked of this actor, admitted or not: the demand the
    /// cluster's shares are weighted by.
    requested: (u64, u64),
}

impl Actor {
    /// A fresh actor with queues of at most `max_queue` waiters.
    pub fn new(
        settings: ActorSettings,
        limits: ScopeLimits,
        aging_ns: Nanos,
        max_queue: usize,
    ) -> Actor {
        let now = settings.clock.now_ns();
        Actor {
            limits,
            queue: WaitQueue::new(aging_ns, max_queue),
            permits: HashMap::new(),
            next_permit: 0,
            completions: CompletionStats::default(),
            blocked_until_ns: None,
            last_active_ns: now,
            reported_depth: 0,
            m: settings.metrics.scope(settings.scope.kind),
            requested: (0, 0),
            settings,
        }
    }

    /// Runs until retired (idle at rest) or until every handle is gone.
    pub async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut releases: mpsc::UnboundedReceiver<Release>,
        retire: RetireHook,
    ) {
        let clock = self.settings.clock;
        let idle_timeout_ns = self.settings.idle_timeout_ns;
        // One idle timer for the actor's life, re-armed only when it fires: a new
        // one per message was registered in the runtime's timer wheel each time
        // the actor parked and cancelled each time a message woke it.
        let idle = sleep_until(clock.instant_at(self.last_active_ns + idle_timeout_ns));
        tokio::pin!(idle);
        loop {
            let wake = self.next_wake_ns().map(|ns| clock.instant_at(ns));
            tokio::select! {
                biased;
                Some(release) = releases.recv() => self.on_release(release),
                command = commands.recv() => match command {
                    Some(command) => self.on_command(command),
                    None => return,
                },
                () = sleep_until(wake.unwrap_or_else(|| idle.deadline())), if wake.is_some() => {}
                () = &mut idle => {
                    let now = clock.now_ns();
                    // Active since it was armed: not idle yet, wait out the rest.
                    if now >= self.last_active_ns + idle_timeout_ns {
                        if self.is_idle(now) && retire(&commands, &releases) {
                            return;
                        }
                        self.last_active_ns = now;
                    }
                    idle.as_mut().reset(clock.instant_at(self.last_active_ns + idle_timeout_ns));
                }
            }
            self.serve(clock.now_ns());
        }
    }

    fn is_idle(&self, now: Nanos) -> bool {
        self.queue.is_empty() && self.permits.is_empty() && self.limits.is_at_rest(now)
    }

    fn next_wake_ns(&self) -> Option<Nanos> {
        let deadline = self.queue.earliest_deadline()?;
        Some(self.blocked_until_ns.map_or(deadline, |b| b.min(deadline)))
    }

    fn on_command(&mut self, command: Command) {
        let now = self.settings.clock.now_ns();
        // Only a request is activity (and its releases, below): the sync engine's
        // export every round and status reads must not keep an idle actor alive
        // (in a cluster they did, so no actor ever retired; docs/design/scale.md).
        // Retiring drops the adaptive estimate's samples: the next requests
        // reserve max_tokens until it has seen enough again.
        if matches!(command, Command::Acquire(_)) {
            self.last_active_ns = now;
        }
        match command {
            Command::Acquire(request) => self.on_acquire(now, request),
            Command::Status(reply) => {
                let _ = reply.send(self.status(now));
            }
            Command::CoolDown { until_ns } => self.limits.cool_down(until_ns),
            Command::Wake => {}
            Command::Export(reply) => {
                let mut export = self.limits.export(now);
                (export.requested_requests, export.requested_tokens) = self.requested;
                // Waiting for a slot: a queue while this scope has no slot free
                // (a queue held back only by a window or request credit, with a
                // slot free, is no slot demand).
                export.waiting = if self.limits.slots_exhausted(now) {
                    self.queue.len() as u64
                } else {
                    0
                };
                let _ = reply.send(export);
            }
        }
    }

    fn status(&self, now: Nanos) -> ScopeStatus {
        let mut status = self.limits.status(now);
        status.queued = self.queue.depths();
        status
    }

    fn on_acquire(&mut self, now: Nanos, request: AcquireRequest) {
        let completion = match self.settings.adaptive {
            Some(policy) if request.adaptive => {
                self.completions
                    .estimate(&request.model, request.max_completion_tokens, policy)
            }
            _ => request.max_completion_tokens,
        };
        let tokens = request.prompt_tokens.saturating_add(completion);
        self.requested.0 += 1;
        self.requested.1 = self.requested.1.saturating_add(tokens);
        // Refuse at once what waiting can never fix (cost above the ceiling).
        if let Err(blocked) = self.limits.check(now, tokens, request.lane, None)
            && blocked.never
        {
            return self.refuse(now, request.reply, blocked);
        }
        let waiter = Waiter {
            lane: request.lane,
            enqueued_ns: now,
            deadline_ns: now.saturating_add(request.max_wait_ns),
            tokens,
            payload: Pending {
                prompt_tokens: request.prompt_tokens,
                model: request.model,
                busy_above: request.busy_above,
                reply: request.reply,
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
            return self.refuse(now, waiter.payload.reply, blocked);
        }
        self.report_depth();
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
            // Permits send exactly one release; an unknown id would be a bug.
            debug_assert!(false, "release of unknown permit {}", release.permit_id);
            return;
        };
        if let Some(at) = answered_ns {
            self.limits.redate(at, &mut held.charge);
        }
        let how = match ended {
            SettleWith::Usage { prompt, completion } => {
                if self.settings.adaptive.is_some() {
                    self.completions.record(&held.model, completion);
                }
                Settle::Actual(prompt.saturating_add(completion))
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
    fn serve(&mut self, now: Nanos) {
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
            .admit(now, head.tokens, lane, head.payload.busy_above)?;
        let Some(waiter) = self.queue.pop(lane) else {
            return Ok(());
        };
        self.grant(now, waiter, charge);
        Ok(())
    }

    fn grant(&mut self, now: Nanos, waiter: Waiter<Pending>, charge: Charge) {
        let waited_ns = now.saturating_sub(waiter.enqueued_ns);
        self.m
            .admitted(waiter.lane, waited_ns, charge.tokens_reserved);
        let permit_id = self.next_permit;
        self.next_permit += 1;
        let grant = Grant {
            permit_id,
            tokens_reserved: charge.tokens_reserved,
            status: self.status(now),
            waited_ns,
        };
        debug_assert!(
            grant.tokens_reserved == 0 || grant.tokens_reserved >= waiter.payload.prompt_tokens
        );
        self.permits.insert(
            permit_id,
            Held {
                charge,
                model: waiter.payload.model,
            },
        );
        if waiter.payload.reply.send(Ok(grant)).is_err() {
            // The caller went away between asking and the answer: nothing was sent
            // upstream, so the charge is undone.
            self.m.cancelled();
            self.on_release(Release {
                permit_id,
                how: Some(SettleWith::Cancel),
                answered_at: None,
            });
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
                .check(now, waiter.tokens, waiter.lane, waiter.payload.busy_above)
                .err()
                .unwrap_or(Blocked {
                    // Blocked only by the waiters ahead of it.
                    dimension: Dimension::Queue,
                    retry_after_ns: self
                        .blocked_until_ns
                        .map_or(1_000_000, |b| b.saturating_sub(now).max(1)),
                    never: false,
                });
            self.refuse(now, waiter.payload.reply, blocked);
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

    fn refuse(&self, now: Nanos, reply: oneshot::Sender<Result<Grant, Refusal>>, blocked: Blocked) {
        self.m.refused(blocked.dimension);
        let _ = reply.send(Err(Refusal {
            blocked,
            status: self.status(now),
        }));
    }
}
