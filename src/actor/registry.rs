//! The sharded registry of live actors. An actor is spawned on first use and retires
//! itself when idle *and at rest* (nothing queued, nothing in flight, every window
//! empty), so retiring loses no limit state (only the adaptive estimate's samples,
//! which rebuild from the next completions; until then `max_tokens` is reserved,
//! the safe side). In a cluster the sync engine's exports do not count as activity.
//! Shards are `parking_lot::Mutex<HashMap>`s held only to look up or insert a handle,
//! never across an await.
//!
//! Race with retirement: a caller may hold a handle whose actor has just retired.
//! The scope's lock tells it so ([`Decision::Retired`]: the actor marks itself
//! retired under that lock, and cannot retire while a forwarded request is on its
//! way). A forwarded request's reply channel closes unanswered only if the actor
//! task stops otherwise (shutdown, a panic). In both cases nothing was charged, so
//! [`Registry::acquire`] drops the stale handle and asks again.

use super::ScopeId;
use super::credit::CreditTable;
use super::estimate::AdaptivePolicy;
use super::metrics::ActorMetrics;
use super::scope::{Allowances, ScopeExport, ScopeLimits, ScopeStatus};
use super::state::{ActorSettings, Core, Decision, Forwarded, Shared};
use super::task::{AcquireRequest, Grant, Refusal, Release};
use crate::clock::Clock;
use crate::limiter::{Ceiling, LimitSpec, Limiter, Nanos, SpecError};
use parking_lot::{Mutex, MutexGuard};
use rustc_hash::FxBuildHasher;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tollgate_cluster::maps::shrink_if_sparse;

/// Mailbox capacity per actor (requests on their way to its queue); senders wait
/// (backpressure) when it is full.
pub const MAILBOX: usize = 1024;
/// Live scopes exported between two yields to the runtime (`export_live`).
const EXPORT_BATCH: usize = 256;
/// Shards of the registry map.
pub const SHARDS: usize = 16;
/// Attempts to reach an actor that keeps retiring under the caller (practically
/// never more than one retry).
const ATTEMPTS: usize = 4;

/// What an actor enforces, derived from config once.
#[derive(Clone, Debug)]
pub struct ScopeSpec {
    /// Request limit.
    pub requests: Option<LimitSpec>,
    /// Token limit.
    pub tokens: Option<LimitSpec>,
    /// Concurrency limit.
    pub concurrency: Option<u64>,
    /// Adaptive completion estimation (tenants only).
    pub adaptive: Option<AdaptivePolicy>,
    /// Cluster allowances (shared with the sync engine; empty on a single node).
    pub allowances: Allowances,
    /// `lease` modes: the index of the scope's first credit binding; its credits
    /// are made from the node's [`CreditTable`] when its actor first starts.
    pub leased_from: Option<u32>,
}

/// Settings shared by every actor.
#[derive(Clone, Debug)]
pub struct ActorDefaults {
    /// Batch lane ceiling.
    pub batch_ceiling: Ceiling,
    /// Interactive head start over batch, in ns.
    pub aging_ns: Nanos,
    /// Waiters per scope.
    pub max_queue: usize,
    /// Idle time before retiring, in ns.
    pub idle_timeout_ns: Nanos,
}

/// Handle to one live actor.
#[derive(Clone, Debug)]
pub struct ActorHandle {
    commands: mpsc::Sender<Forwarded>,
    shared: Arc<Shared>,
    generation: u64,
}

impl ActorHandle {
    /// The scope's shared state, which permits settle on.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}

/// Scope ids come from the config, never from a client, so the maps keyed by
/// them hash with Fx (a multiply per word) rather than SipHash, whose keys
/// resist crafted collisions nobody here can craft: every request looks up two
/// scopes (~900 instructions with SipHash, callgrind).
type ScopeMap<V> = HashMap<ScopeId, V, FxBuildHasher>;

type Shard = Mutex<ScopeMap<ActorHandle>>;

/// Why an acquire did not produce an answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RegistryError {
    /// The scope is not configured.
    #[error("unknown scope {0}")]
    UnknownScope(String),
    /// The actor could not be reached (shutting down).
    #[error("limiter for {0} unavailable")]
    Unavailable(String),
}

/// All actors of a node.
pub struct Registry {
    shards: Arc<[Shard]>,
    /// Boxed, in a table sized to the scopes: a hash table keeps up to half its
    /// slots empty, and at 152 B a spec slot that would be ~360 B per configured
    /// tenant; boxed it is ~220 B (the scale simulation's live heap).
    specs: ScopeMap<Box<ScopeSpec>>,
    defaults: ActorDefaults,
    clock: Clock,
    metrics: Arc<ActorMetrics>,
    generation: std::sync::atomic::AtomicU64,
    /// `lease` modes: where actors find their scope's credits.
    credits: Option<Arc<CreditTable>>,
}

fn lock(shard: &Shard) -> MutexGuard<'_, ScopeMap<ActorHandle>> {
    // Each critical section is one lookup, insert or remove: a panic inside one
    // cannot leave the map inconsistent.
    shard.lock()
}

/// The answer channel of an acquire whose caller may go away. The actor's `send`
/// of a grant can succeed just as the caller's future is dropped; the grant is then
/// dropped in the channel, nobody turns it into a [`super::Permit`], and the actor
/// keeps its charge (a slot, a reservation) for good: an admission never settled,
/// as the jepsen harness shows (`gossip`, `pause`, a client gone mid-pause). On
/// drop this closes the channel (a later send fails, and the actor undoes the
/// charge itself) and cancels a grant that arrived before.
struct Unclaimed {
    rx: Option<oneshot::Receiver<Result<Grant, Refusal>>>,
    shared: Arc<Shared>,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if let Ok(Ok(grant)) = rx.try_recv() {
                self.shared.release(Release {
                    permit_id: grant.permit_id,
                    how: Some(super::SettleWith::Cancel),
                    answered_at: None,
                });
            }
        }
    }
}

/// A forward counted in the scope ([`Core::forwarded`]) until the mailbox took it:
/// a caller that goes away while the mailbox is full takes it back, or the scope
/// would count it as waiting for good (never deciding in the caller's task again,
/// never retiring).
struct Unsent {
    shared: Option<Arc<Shared>>,
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.lock().unforward();
        }
    }
}

impl Registry {
    /// A registry for the configured scopes; validates every limit spec. Leased
    /// scopes' actors spend credits from `credits` (`lease` modes).
    ///
    /// # Panics
    ///
    /// If a spec is leased and `credits` is `None`: its actors would spend no
    /// credit and enforce only local limits, silently exceeding L.
    pub fn new(
        specs: HashMap<ScopeId, ScopeSpec>,
        defaults: ActorDefaults,
        clock: Clock,
        metrics: Arc<ActorMetrics>,
        credits: Option<Arc<CreditTable>>,
    ) -> Result<Registry, (ScopeId, SpecError)> {
        assert!(
            credits.is_some() || specs.values().all(|s| s.leased_from.is_none()),
            "leased scopes need the node's credit table"
        );
        for (scope, spec) in &specs {
            for limit in [spec.requests, spec.tokens].into_iter().flatten() {
                Limiter::try_new(limit).map_err(|e| (scope.clone(), e))?;
            }
        }
        Ok(Registry {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(ScopeMap::default()))
                .collect(),
            specs: (specs.into_iter())
                .map(|(scope, spec)| (scope, Box::new(spec)))
                .collect(),
            defaults,
            clock,
            metrics,
            generation: std::sync::atomic::AtomicU64::new(0),
            credits,
        })
    }

    /// The shared clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Is this scope configured?
    pub fn knows(&self, scope: &ScopeId) -> bool {
        self.specs.contains_key(scope)
    }

    /// `lease` modes: the index of `scope`'s first credit binding (its others
    /// follow it); `None` for a scope with no cluster-wide limit.
    pub fn leased_from(&self, scope: &ScopeId) -> Option<u32> {
        self.specs.get(scope).and_then(|s| s.leased_from)
    }

    fn shard_index(&self, scope: &ScopeId) -> usize {
        // High bits: the shard's map picks a slot from the low bits and its tag
        // from the top seven, so sharding by either would crowd each shard's
        // keys into a fraction of its slots.
        ((FxBuildHasher.hash_one(scope) >> 32) as usize) % SHARDS
    }

    /// Live actors (for tests and the admin API).
    pub fn live_actors(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    fn handle(&self, scope: &ScopeId) -> Result<ActorHandle, RegistryError> {
        let index = self.shard_index(scope);
        let mut shard = lock(&self.shards[index]);
        if let Some(handle) = shard.get(scope) {
            return Ok(handle.clone());
        }
        let spec = self
            .specs
            .get(scope)
            .ok_or_else(|| RegistryError::UnknownScope(scope.to_string()))?;
        let handle = self.spawn(scope, spec, index);
        shard.insert(scope.clone(), handle.clone());
        Ok(handle)
    }

    fn spawn(&self, scope: &ScopeId, spec: &ScopeSpec, shard_index: usize) -> ActorHandle {
        // Specs were validated in `new`, so building limiters cannot fail here.
        let build = |s: Option<LimitSpec>| s.and_then(|s| Limiter::try_new(s).ok());
        let limits = ScopeLimits::new(
            build(spec.requests),
            build(spec.tokens),
            spec.concurrency,
            self.defaults.batch_ceiling,
        )
        .with_allowances(if crate::faults::skip_cluster_sync() {
            Allowances::default()
        } else {
            let mut allowances = spec.allowances.clone();
            if let (Some(table), Some(first)) = (&self.credits, spec.leased_from) {
                allowances.credits = table.credits_for(first);
            }
            allowances
        });
        let settings = ActorSettings {
            scope: scope.clone(),
            adaptive: spec.adaptive,
            idle_timeout_ns: self.defaults.idle_timeout_ns,
            clock: self.clock,
            metrics: self.metrics.clone(),
        };
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (commands_tx, commands_rx) = mpsc::channel(MAILBOX);
        let shards = self.shards.clone();
        let key = scope.clone();
        let retire = Box::new(move || {
            let mut shard = lock(&shards[shard_index]);
            if shard.get(&key).is_some_and(|h| h.generation == generation) {
                shard.remove(&key);
                shrink_if_sparse(&mut shard);
            }
        });
        let core = Core::new(
            settings,
            limits,
            self.defaults.aging_ns,
            self.defaults.max_queue,
        );
        let shared = Arc::new(Shared::new(core));
        self.metrics.actor_spawned(scope.kind);
        tokio::spawn(super::task::run(shared.clone(), commands_rx, retire));
        ActorHandle {
            commands: commands_tx,
            shared,
            generation,
        }
    }

    fn forget(&self, scope: &ScopeId, stale: &ActorHandle) {
        let mut shard = lock(&self.shards[self.shard_index(scope)]);
        if shard
            .get(scope)
            .is_some_and(|h| h.generation == stale.generation)
        {
            shard.remove(scope);
        }
    }

    /// Asks `scope` to admit a request: decided in the caller's task when nothing
    /// waits there, else queued by its actor. Returns the answer and the handle the
    /// resulting permit must release to.
    pub async fn acquire(
        &self,
        scope: &ScopeId,
        request: &AcquireRequest,
    ) -> Result<(Result<Grant, Refusal>, ActorHandle), RegistryError> {
        for _ in 0..ATTEMPTS {
            let handle = self.handle(scope)?;
            let (decision, arrived_ns) = {
                let mut core = handle.shared.lock();
                let now = core.clock().now_ns();
                (core.decide_now(now, request), now)
            };
            let tokens = match decision {
                Decision::Granted(grant) => return Ok((Ok(grant), handle)),
                Decision::Refused(refusal) => return Ok((Err(refusal), handle)),
                Decision::Retired => {
                    self.forget(scope, &handle);
                    continue;
                }
                Decision::Forward(tokens) => tokens,
            };
            let (tx, rx) = oneshot::channel();
            let mut unsent = Unsent {
                shared: Some(handle.shared()),
            };
            let forwarded = Forwarded {
                request: request.clone(),
                tokens,
                arrived_ns,
                reply: tx,
            };
            if handle.commands.send(forwarded).await.is_err() {
                // Only when the runtime shuts down: the actor cannot retire while
                // a forward is counted.
                self.forget(scope, &handle);
                continue;
            }
            unsent.shared = None;
            let mut waiting = Unclaimed {
                rx: Some(rx),
                shared: handle.shared(),
            };
            let answer = waiting.rx.as_mut().expect("set just above").await;
            // Answered (or dropped by a stopping actor): nothing left to cancel.
            waiting.rx = None;
            match answer {
                Ok(answer) => return Ok((answer, handle)),
                // Dropped unanswered by a stopping actor: nothing was charged.
                Err(_) => self.forget(scope, &handle),
            }
        }
        Err(RegistryError::Unavailable(scope.to_string()))
    }

    /// Runs `f` on `scope`'s live state (spawning its actor if needed).
    fn with_core<T>(
        &self,
        scope: &ScopeId,
        f: impl Fn(&mut Core, Nanos) -> T,
    ) -> Result<T, RegistryError> {
        for _ in 0..ATTEMPTS {
            let handle = self.handle(scope)?;
            let mut core = handle.shared.lock();
            if core.is_retired() {
                drop(core);
                self.forget(scope, &handle);
                continue;
            }
            let now = core.clock().now_ns();
            return Ok(f(&mut core, now));
        }
        Err(RegistryError::Unavailable(scope.to_string()))
    }

    /// Current figures of `scope` (spawning its actor if needed).
    pub async fn status(&self, scope: &ScopeId) -> Result<ScopeStatus, RegistryError> {
        self.with_core(scope, |core, now| core.status(now))
    }

    /// Local usage of every live actor, for the cluster counters. Actors not running
    /// are at rest: they have nothing in their windows.
    pub async fn export_live(&self) -> Vec<(ScopeId, ScopeExport)> {
        let live: Vec<(ScopeId, Arc<Shared>)> = self
            .shards
            .iter()
            .flat_map(|s| {
                lock(s)
                    .iter()
                    .map(|(k, h)| (k.clone(), h.shared()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut out = Vec::with_capacity(live.len());
        for (i, (scope, shared)) in live.into_iter().enumerate() {
            // Lets the worker's other tasks run between batches of scopes (each
            // a lock and a copy, ~0.5 us): with many live scopes the loop would
            // otherwise hold the worker for all of them.
            if i > 0 && i % EXPORT_BATCH == 0 {
                tokio::task::yield_now().await;
            }
            let core = shared.lock();
            if !core.is_retired() {
                let now = core.clock().now_ns();
                out.push((scope, core.export(now)));
            }
        }
        out
    }

    /// Makes `scope`'s actor re-check its waiters, if it is running (`lease` mode:
    /// credit arrived).
    pub fn wake(&self, scope: &ScopeId) {
        let shard = &self.shards[self.shard_index(scope)];
        let handle = lock(shard).get(scope).cloned();
        if let Some(handle) = handle {
            handle.shared.ring();
        }
    }

    /// Starts a cool-down of `scope` until `until_ns`.
    pub fn cool_down(&self, scope: &ScopeId, until_ns: Nanos) {
        let _ = self.with_core(scope, |core, _| core.cool_down(until_ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::Lane;
    use crate::actor::permit::{Permit, SettleWith};
    use crate::limiter::{Algorithm, NANOS_PER_SEC};

    fn registry(idle_secs: u64) -> (Registry, ScopeId) {
        registry_with(5, 1000, 2, 4, idle_secs)
    }

    /// A registry of one tenant scope: `requests` and `tokens` per 10 s, `slots`
    /// in flight, queues of `max_queue`.
    fn registry_with(
        requests: u64,
        tokens: u64,
        slots: u64,
        max_queue: usize,
        idle_secs: u64,
    ) -> (Registry, ScopeId) {
        let scope = ScopeId::tenant("t");
        let window = |capacity| {
            Some(LimitSpec::new(
                capacity,
                10 * NANOS_PER_SEC,
                Algorithm::SlidingWindow,
            ))
        };
        let spec = ScopeSpec {
            requests: window(requests),
            tokens: window(tokens),
            concurrency: Some(slots),
            adaptive: None,
            allowances: Allowances::default(),
            leased_from: None,
        };
        let defaults = ActorDefaults {
            batch_ceiling: Ceiling::from_share(0.5),
            aging_ns: NANOS_PER_SEC,
            max_queue,
            idle_timeout_ns: idle_secs * NANOS_PER_SEC,
        };
        let registry = Registry::new(
            HashMap::from([(scope.clone(), spec)]),
            defaults,
            Clock::start(),
            Arc::new(ActorMetrics::default()),
            None,
        )
        .unwrap();
        (registry, scope)
    }

    async fn acquire(registry: &Registry, scope: &ScopeId) -> Result<Permit, Refusal> {
        acquire_waiting(registry, scope, 0).await
    }

    async fn acquire_waiting(
        registry: &Registry,
        scope: &ScopeId,
        max_wait_ns: Nanos,
    ) -> Result<Permit, Refusal> {
        let (answer, handle) = registry
            .acquire(scope, &request(max_wait_ns))
            .await
            .unwrap();
        answer.map(|grant| Permit::new(&handle, &grant))
    }

    /// A request that waits up to 30 s, in a task of its own.
    fn waiting_in_background(
        registry: &Arc<Registry>,
        scope: &ScopeId,
    ) -> tokio::task::JoinHandle<Result<Permit, Refusal>> {
        let (registry, scope) = (registry.clone(), scope.clone());
        tokio::spawn(async move { acquire_waiting(&registry, &scope, 30 * NANOS_PER_SEC).await })
    }

    /// Both slots taken (the permits returned) and a third request queued.
    async fn full_with_one_waiting(
        idle_secs: u64,
    ) -> (
        Arc<Registry>,
        ScopeId,
        [Permit; 2],
        tokio::task::JoinHandle<Result<Permit, Refusal>>,
    ) {
        let (registry, scope) = registry(idle_secs);
        let registry = Arc::new(registry);
        let a = acquire(&registry, &scope).await.unwrap();
        let b = acquire(&registry, &scope).await.unwrap();
        let waiting = waiting_in_background(&registry, &scope);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(registry.status(&scope).await.unwrap().queued, [1, 0]);
        (registry, scope, [a, b], waiting)
    }

    fn request(max_wait_ns: Nanos) -> AcquireRequest {
        AcquireRequest {
            lane: Lane::Interactive,
            prompt_tokens: 10,
            max_completion_tokens: 10,
            model: "m".into(),
            adaptive: false,
            max_wait_ns,
            busy_above: None,
            probe: false,
        }
    }

    /// The scope's demand so far: requests asked, admitted or not.
    async fn requested(registry: &Registry) -> u64 {
        let live = registry.export_live().await;
        live.first()
            .map_or(0, |(_, export)| export.requested_requests)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_probe_is_admitted_only_at_once_and_counted_only_when_admitted() {
        let (registry, scope) = registry(20);
        let registry = Arc::new(registry);
        let probe = AcquireRequest {
            probe: true,
            ..request(30 * NANOS_PER_SEC)
        };
        // Admitted at once: counted as demand like any request.
        let (answer, handle) = registry.acquire(&scope, &probe).await.unwrap();
        let first = Permit::new(&handle, &answer.unwrap());
        assert_eq!(requested(&registry).await, 1);
        let _second = acquire(&registry, &scope).await.unwrap();
        assert_eq!(requested(&registry).await, 2);
        // Full: refused at once despite its 30 s wait, and not counted (the
        // waiting try that may follow counts it).
        let (answer, _) = registry.acquire(&scope, &probe).await.unwrap();
        assert!(answer.is_err());
        assert_eq!(requested(&registry).await, 2);
        // Others waiting ahead: never queued behind them.
        let waiting = waiting_in_background(&registry, &scope);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let (answer, _) = registry.acquire(&scope, &probe).await.unwrap();
        assert_eq!(
            answer.unwrap_err().blocked.dimension,
            crate::actor::Dimension::Queue
        );
        assert_eq!(registry.status(&scope).await.unwrap().queued, [1, 0]);
        assert_eq!(
            requested(&registry).await,
            3,
            "the waiter counts, the probe not"
        );
        drop(first);
        waiting.await.unwrap().unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_request_that_finds_nothing_waiting_is_decided_without_the_actor_task() {
        use futures_util::FutureExt;
        let (registry, scope) = registry(20);
        // Ready at its first poll: no message to the actor task, no wake-up of
        // another task (on this one-thread runtime the actor never ran).
        let (answer, handle) = (registry.acquire(&scope, &request(0)).now_or_never())
            .expect("decided in the caller's task")
            .unwrap();
        let grant = answer.unwrap();
        let _b = acquire(&registry, &scope).await.unwrap();
        // A refusal too, when the caller will not wait.
        let (refused, _) = (registry.acquire(&scope, &request(0)).now_or_never())
            .expect("decided in the caller's task")
            .unwrap();
        assert_eq!(
            refused.unwrap_err().blocked.dimension,
            crate::actor::Dimension::Concurrency
        );
        Permit::new(&handle, &grant).settle(SettleWith::Cancel);
        assert_eq!(registry.status(&scope).await.unwrap().in_flight, 1);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_newcomer_never_takes_room_ahead_of_a_request_already_waiting() {
        // Both slots taken: c waits in the queue.
        let (registry, scope, [a, _b], c) = full_with_one_waiting(60).await;
        // A slot frees, and before the actor task has served its queue a newcomer
        // that would fit arrives: it must not take the slot c waits for.
        a.settle(SettleWith::Cancel);
        let newcomer = acquire(&registry, &scope).await;
        assert_eq!(
            newcomer.unwrap_err().blocked.dimension,
            crate::actor::Dimension::Concurrency,
            "the newcomer took the waiting request's slot"
        );
        c.await.unwrap().expect("the waiting request got the slot");
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_retired_scope_decides_nothing_and_the_caller_gets_a_fresh_actor() {
        let (registry, scope) = registry(20);
        acquire(&registry, &scope)
            .await
            .unwrap()
            .settle(SettleWith::Cancel);
        let stale = registry.handle(&scope).unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(45)).await;
        assert_eq!(registry.live_actors(), 0, "retired");
        // A caller that took the handle just before: told so, charged nothing.
        let decision = {
            let mut core = stale.shared.lock();
            let now = core.clock().now_ns();
            core.decide_now(now, &request(0))
        };
        assert!(matches!(decision, Decision::Retired));
        let fresh = acquire(&registry, &scope).await.unwrap();
        assert_eq!(registry.live_actors(), 1);
        assert_eq!(registry.status(&scope).await.unwrap().in_flight, 1);
        drop(fresh);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_forward_taken_back_unsent_leaves_the_scope_deciding_and_able_to_retire() {
        let (registry, scope) = registry(20);
        let a = acquire(&registry, &scope).await.unwrap();
        let b = acquire(&registry, &scope).await.unwrap();
        let handle = registry.handle(&scope).unwrap();
        // Told to wait, then the caller goes away before the mailbox took it.
        let forward = {
            let mut core = handle.shared.lock();
            let now = core.clock().now_ns();
            core.decide_now(now, &request(NANOS_PER_SEC))
        };
        assert!(matches!(forward, Decision::Forward(_)));
        drop(Unsent {
            shared: Some(handle.shared()),
        });
        drop(handle);
        a.settle(SettleWith::Cancel);
        b.settle(SettleWith::Cancel);
        // Decided in the caller's task again (nothing counted as on its way) ...
        use futures_util::FutureExt;
        let (answer, handle) = (registry.acquire(&scope, &request(0)).now_or_never())
            .expect("nothing waits")
            .unwrap();
        Permit::new(&handle, &answer.unwrap()).settle(SettleWith::Cancel);
        drop(handle);
        // ... and the scope retires once idle.
        tokio::time::sleep(std::time::Duration::from_secs(45)).await;
        assert_eq!(registry.live_actors(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_racing_on_both_paths_never_exceed_a_limit_and_leave_the_scope_at_rest() {
        use std::sync::atomic::{AtomicU64, Ordering};
        // 400 callers on two workers for 3 slots: the decision in the caller's
        // task, the actor task's queue and releases from every thread race. Two
        // in three wait (up to 5 s, far more than the ~0.2 s all of them need),
        // the rest will not wait at all.
        let (registry, scope) = registry_with(10_000, 1_000_000, 3, 512, 20);
        let registry = Arc::new(registry);
        let held = Arc::new(AtomicU64::new(0));
        let most = Arc::new(AtomicU64::new(0));
        let mut callers = tokio::task::JoinSet::new();
        for i in 0..400u64 {
            let (registry, scope) = (registry.clone(), scope.clone());
            let (held, most) = (held.clone(), most.clone());
            callers.spawn(async move {
                let max_wait_ns = if i % 3 == 0 { 0 } else { 5 * NANOS_PER_SEC };
                let Ok(permit) = acquire_waiting(&registry, &scope, max_wait_ns).await else {
                    return (max_wait_ns, false, false);
                };
                most.fetch_max(held.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_micros(300 * (i % 4))).await;
                held.fetch_sub(1, Ordering::SeqCst);
                // Half settle with usage; half are dropped before being sent,
                // which cancels them (their request is not counted).
                if i % 2 == 0 {
                    permit.settle(SettleWith::Usage {
                        prompt: 10,
                        completion: 3,
                    });
                } else {
                    drop(permit);
                }
                (max_wait_ns, i % 2 == 0, true)
            });
        }
        let (mut waiters, mut waiters_served, mut served, mut charged) = (0, 0, 0, 0);
        while let Some(joined) = callers.join_next().await {
            let (max_wait_ns, settled, admitted) = joined.unwrap();
            served += u64::from(admitted);
            charged += u64::from(admitted && settled);
            if max_wait_ns > 0 {
                waiters += 1;
                waiters_served += u64::from(admitted);
            }
        }
        assert!(most.load(Ordering::SeqCst) <= 3, "more than 3 held at once");
        assert_eq!(waiters_served, waiters, "a waiting caller was never served");
        assert!(served > waiters, "no caller that would not wait was served");
        let status = registry.status(&scope).await.unwrap();
        assert_eq!((status.in_flight, status.queued), (0, [0, 0]));
        assert_eq!(
            status.requests.unwrap().used,
            charged,
            "one request per admission settled with usage"
        );
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn callers_waiting_on_an_actor_task_that_stops_ask_again() {
        let (registry, scope, _held, waiting) = full_with_one_waiting(20).await;
        // What the task's guard does however the task ends, a panic included.
        let stale = registry.handle(&scope).unwrap();
        drop(super::super::task::Stopping(stale.shared()));
        // The waiter is not left waiting for its 30 s: it asks again and is
        // served by a fresh actor (which knows nothing of the stopped one's
        // permits, as when the task owned the state and a panic dropped it).
        let served = tokio::time::timeout(std::time::Duration::from_secs(1), waiting).await;
        served.expect("still waiting").unwrap().unwrap();
        let fresh = registry.handle(&scope).unwrap();
        assert!(!Arc::ptr_eq(&fresh.shared, &stale.shared), "a fresh actor");
    }

    #[tokio::test]
    async fn a_grant_whose_caller_went_away_before_taking_it_is_cancelled() {
        let (registry, scope) = registry(20);
        let (answer, handle) = registry.acquire(&scope, &request(0)).await.unwrap();
        let grant = answer.unwrap();
        assert_eq!(registry.status(&scope).await.unwrap().in_flight, 1);
        // The race: the actor's send succeeded, then the caller's future is
        // dropped with the grant still in the channel.
        let (tx, rx) = oneshot::channel();
        tx.send(Ok(grant)).unwrap();
        drop(Unclaimed {
            rx: Some(rx),
            shared: handle.shared(),
        });
        let mut in_flight = 1;
        for _ in 0..200 {
            in_flight = registry.status(&scope).await.unwrap().in_flight;
            if in_flight == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(in_flight, 0, "the charge was undone");
    }

    #[tokio::test(start_paused = true)]
    async fn actors_spawn_lazily_and_retire_only_when_idle_and_at_rest() {
        let (registry, scope) = registry(20);
        assert_eq!(
            registry.live_actors(),
            0,
            "nothing spawned before first use"
        );
        let permit = acquire(&registry, &scope).await.unwrap();
        assert_eq!(registry.live_actors(), 1);
        // Idle time passes while a permit is in flight: the actor must stay.
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert_eq!(registry.live_actors(), 1);
        permit.settle(SettleWith::Usage {
            prompt: 10,
            completion: 5,
        });
        // The window (10 s) empties and the idle timeout (20 s) passes: it retires.
        tokio::time::sleep(std::time::Duration::from_secs(45)).await;
        assert_eq!(registry.live_actors(), 0);
        // And comes back fresh, with nothing lost (the state it dropped was at rest).
        let again = acquire(&registry, &scope).await.unwrap();
        let status = registry.status(&scope).await.unwrap();
        assert_eq!(status.requests.unwrap().used, 1);
        drop(again);
    }

    #[tokio::test(start_paused = true)]
    async fn the_sync_rounds_exports_do_not_keep_an_idle_actor_alive() {
        let (registry, scope) = registry(20);
        let permit = acquire(&registry, &scope).await.unwrap();
        permit.settle(SettleWith::Usage {
            prompt: 10,
            completion: 5,
        });
        // The cluster's sync engine exports every live actor each round.
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(45);
        while tokio::time::Instant::now() < until && registry.live_actors() > 0 {
            let _ = registry.export_live().await;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert_eq!(registry.live_actors(), 0, "retired though exported");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_permit_counts_a_window_from_its_answer() {
        let (registry, scope) = registry(60);
        let mut permit = acquire(&registry, &scope).await.unwrap();
        // The upstream answers 8 s after admission (a slow way there): the provider
        // counted the request by then, so the charge moves there (with the
        // settlement's message), and the settlement corrects it where it now is.
        tokio::time::sleep(std::time::Duration::from_secs(8)).await;
        permit.answered();
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        permit.settle(SettleWith::Usage {
            prompt: 10,
            completion: 5,
        });
        // Past admission + W (10 s): still counted.
        tokio::time::sleep(std::time::Duration::from_secs(4)).await;
        let status = registry.status(&scope).await.unwrap();
        assert_eq!(status.requests.unwrap().used, 1);
        assert_eq!(status.tokens.unwrap().used, 15);
        // A window after the answer (and its bucket): gone.
        tokio::time::sleep(std::time::Duration::from_secs(7)).await;
        let status = registry.status(&scope).await.unwrap();
        assert_eq!(status.requests.unwrap().used, 0);
        assert_eq!(status.tokens.unwrap().used, 0);
        // `redate_now` moves a held charge at once (a stream that settles late).
        let permit = acquire(&registry, &scope).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(8)).await;
        permit.redate_now();
        tokio::time::sleep(std::time::Duration::from_secs(4)).await;
        let status = registry.status(&scope).await.unwrap();
        assert_eq!(
            status.requests.unwrap().used,
            1,
            "past admission + W: moved"
        );
        drop(permit);
    }

    #[tokio::test(start_paused = true)]
    async fn only_requests_waiting_for_a_slot_are_concurrency_demand() {
        let (registry, scope) = registry(60);
        let registry = Arc::new(registry);
        let waiting = |r: &Arc<Registry>| {
            let r = r.clone();
            async move { r.export_live().await[0].1.waiting }
        };
        // Both slots taken: a third request queues for a slot.
        let a = acquire(&registry, &scope).await.unwrap();
        let b = acquire(&registry, &scope).await.unwrap();
        let queued = waiting_in_background(&registry, &scope);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(waiting(&registry).await, 1);
        a.settle(SettleWith::Cancel);
        let c = queued.await.unwrap().unwrap();
        assert_eq!(waiting(&registry).await, 0, "served");
        // Now the request window (5) is what holds a queued request back: not
        // slot demand, though a slot is free.
        b.settle(SettleWith::KeepReserved);
        c.settle(SettleWith::KeepReserved);
        for _ in 0..3 {
            acquire(&registry, &scope)
                .await
                .unwrap()
                .settle(SettleWith::KeepReserved);
        }
        let queued = waiting_in_background(&registry, &scope);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(registry.status(&scope).await.unwrap().in_flight, 0);
        assert_eq!(
            waiting(&registry).await,
            0,
            "blocked on the window, not a slot"
        );
        queued.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_permits_settle_once_and_free_their_slot() {
        let (registry, scope) = registry(20);
        let a = acquire(&registry, &scope).await.unwrap();
        let b = acquire(&registry, &scope).await.unwrap();
        let refused = acquire(&registry, &scope).await.unwrap_err();
        assert_eq!(
            refused.blocked.dimension,
            crate::actor::Dimension::Concurrency
        );
        let mut a = a;
        a.sending();
        drop(a); // e.g. the client went away mid-stream
        b.settle(SettleWith::Cancel);
        let status = registry.status(&scope).await.unwrap();
        assert_eq!(status.in_flight, 0);
        // The dropped permit, sent, kept its reservation (1 request, 20 tokens);
        // the cancelled one gave everything back, including its request.
        assert_eq!(status.tokens.unwrap().used, 20);
        assert_eq!(status.requests.unwrap().used, 1);
        // Dropped before it was sent (the client left while it queued): nothing.
        drop(acquire(&registry, &scope).await.unwrap());
        let status = registry.status(&scope).await.unwrap();
        assert_eq!(status.in_flight, 0);
        assert_eq!(status.requests.unwrap().used, 1);
        // Sent and answered with no work done, then dropped between attempts:
        // the request counts, its tokens do not.
        let mut c = acquire(&registry, &scope).await.unwrap();
        c.sending();
        c.drop_as(SettleWith::RefundTokens);
        drop(c);
        let status = registry.status(&scope).await.unwrap();
        assert_eq!(status.tokens.unwrap().used, 20);
        assert_eq!(status.requests.unwrap().used, 2);
    }
}
