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
    /// Window limits, in [`super::Dimension::WINDOWED`] order.
    pub windows: WindowSpecs,
    /// Cache-read input tokens count as input here.
    pub counts_cache_reads: bool,
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

/// A scope's window limits: only those it sets, each with its place in
/// [`super::Dimension::WINDOWED`]. Sparse because a configured tenant holds its
/// spec for the node's life: a scope sets two of the six windows as a rule,
/// and six inline specs would be 192 B of a tenant's ~1 KB at rest.
#[derive(Clone, Debug, Default)]
pub struct WindowSpecs(Box<[(u8, LimitSpec)]>);

impl WindowSpecs {
    /// Every window's spec, `None` where the scope sets none.
    pub fn to_array(&self) -> [Option<LimitSpec>; super::WINDOWS] {
        let mut out = [None; super::WINDOWS];
        for (i, spec) in self.0.iter() {
            out[usize::from(*i)] = Some(*spec);
        }
        out
    }

    /// The specs the scope sets.
    pub fn iter(&self) -> impl Iterator<Item = &LimitSpec> {
        self.0.iter().map(|(_, spec)| spec)
    }
}

impl From<[Option<LimitSpec>; super::WINDOWS]> for WindowSpecs {
    fn from(windows: [Option<LimitSpec>; super::WINDOWS]) -> WindowSpecs {
        let set = (windows.into_iter().enumerate())
            .filter_map(|(i, spec)| Some((u8::try_from(i).ok()?, spec?)));
        WindowSpecs(set.collect())
    }
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
/// charge itself) and cancels a grant that arrived before; a caller still
/// queued wakes the actor, which drops it from its queue at once rather than
/// when room comes (a queue of callers long gone would refuse new ones).
struct Unclaimed {
    rx: Option<oneshot::Receiver<Result<Grant, Refusal>>>,
    shared: Arc<Shared>,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            match rx.try_recv() {
                Ok(Ok(grant)) => self.shared.release(Release {
                    permit_id: grant.permit_id,
                    how: Some(super::SettleWith::Cancel),
                    answered_at: None,
                }),
                Ok(Err(_)) => {}
                Err(_) => self.shared.ring(),
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
            for limit in spec.windows.iter() {
                Limiter::try_new(*limit).map_err(|e| (scope.clone(), e))?;
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
            spec.windows.to_array().map(build),
            spec.concurrency,
            self.defaults.batch_ceiling,
        )
        .counting_cache_reads(spec.counts_cache_reads)
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
            let cost = match decision {
                Decision::Granted(grant) => return Ok((Ok(grant), handle)),
                Decision::Refused(refusal) => return Ok((Err(refusal), handle)),
                Decision::Retired => {
                    self.forget(scope, &handle);
                    continue;
                }
                Decision::Forward(cost) => cost,
            };
            let (tx, rx) = oneshot::channel();
            let mut unsent = Unsent {
                shared: Some(handle.shared()),
            };
            let forwarded = Forwarded {
                request: request.clone(),
                cost,
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
mod tests;
