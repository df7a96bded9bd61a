//! `redis` mode: every request is reserved in Redis after its local admission (one
//! atomic `reserve.lua` call per scope: requests, tokens and a concurrency slot,
//! all or nothing) and settled there when its permit ends (`settle.lua`, off the
//! request path). Redis refusals wait out their retry-after within the request's
//! wait budget (backpressure, not instant 429s).
//!
//! When Redis does not answer within the timeout, the node is **degraded**: it
//! stops calling Redis, admits locally within its share of each limit (the sync
//! engine lowers the allowances at once, [`RedisGate::on_lost`]), announces
//! `redis:lost` over gossip so peers that still reach Redis charge its share there
//! (lower effective capacities, [`RedisGate::set_caps`]), records what it admits
//! per bucket, and once Redis answers again adds that spending into Redis
//! (`charge.lua`) before using it again. Recovery is probed every sync round.

use super::keys::ScopeKeys;
use super::store::{Algorithm, DimSpec, RedisStore, Reservation, Reserved, Settled, StoreError};
use crate::actor::permit::RemoteCharge;
use crate::actor::scope::{Allowance, Blocked, Cost, ScopeStatus};
use crate::actor::task::Refusal;
use crate::actor::{Binding, Dimension, Permit, ScopeId, SettleWith, WINDOWS};
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tollgate_cluster::counter::Windows;

/// How soon a request held back because not every peer has confirmed it charges
/// this node's loss looks again (confirmations come with the peers' sync rounds).
const UNCONFIRMED_RETRY: Duration = Duration::from_millis(50);

/// How soon a request refused for good under caps lowered by peers' losses looks
/// again (it fits the configured capacity; the peers may be back by then).
const LOWERED_RETRY: Duration = Duration::from_secs(1);

/// Sleeps out `refusal`'s retry-after if it ends before `wait_until`; else hands
/// the refusal back (the caller cancels its permit).
async fn wait_out(refusal: RemoteRefusal, wait_until: Instant) -> Result<(), RemoteRefusal> {
    match refusal.retry_after {
        Some(wait) if Instant::now() + wait <= wait_until => {
            tokio::time::sleep(wait).await;
            Ok(())
        }
        _ => Err(refusal),
    }
}

/// One scope's limits as Redis enforces them.
#[derive(Debug, Clone)]
struct ScopeLimits {
    keys: ScopeKeys,
    /// Per window dimension ([`Dimension::WINDOWED`] order): the limit key and
    /// its capacity.
    windows: [Option<(String, u64)>; WINDOWS],
    /// The concurrency limit's key and slots (0: none).
    concurrency: (String, u64),
    /// Cache-read input tokens count as input here.
    counts_cache_reads: bool,
}

impl ScopeLimits {
    /// The name of the first dimension the scope limits (what a refusal of the
    /// whole request names).
    fn first_dimension(&self) -> &'static str {
        (self.windows.iter().zip(Dimension::WINDOWED))
            .find_map(|(w, d)| w.as_ref().map(|_| d.as_str()))
            .unwrap_or("concurrency")
    }
}

/// Why Redis refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRefusal {
    /// `requests`, `tokens` or `concurrency`.
    pub dimension: String,
    /// When trying again can help; `None`: never.
    pub retry_after: Option<Duration>,
}

/// The refusal's dimension when the call found Redis lost: the request is to be
/// admitted again locally, under the fallback allowance the loss just set.
pub const REDIS_LOST: &str = "redis-lost";

impl RemoteRefusal {
    /// Whether this request found Redis lost (re-admit it locally, once).
    pub fn is_redis_lost(&self) -> bool {
        self.dimension == REDIS_LOST
    }

    /// As the actors' refusal (for the same 429 and headers), with `status`.
    pub fn into_refusal(self, status: ScopeStatus) -> Refusal {
        let dimension = (Dimension::WINDOWED.into_iter())
            .find(|d| d.as_str() == self.dimension)
            .unwrap_or(Dimension::Concurrency);
        Refusal {
            blocked: Blocked {
                dimension,
                retry_after_ns: self
                    .retry_after
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
                never: self.retry_after.is_none(),
            },
            status,
        }
    }
}

/// The `redis` mode's gate, shared by every request of the node.
pub struct RedisGate {
    store: RedisStore,
    /// The cluster's windows: each limit key's and Redis key's by its name.
    windows: Windows,
    slot_ttl_ms: u64,
    scopes: HashMap<ScopeId, ScopeLimits>,
    /// Effective capacity per limit key: L minus the shares of peers that lost Redis.
    caps: RwLock<HashMap<String, u64>>,
    /// Each key's fallback (set each sync round).
    fallback: Mutex<HashMap<String, Fallback>>,
    /// The current loss's epoch (the unix ms it began; 0 while Redis answers).
    lost_since: AtomicU64,
    /// The loss epoch every peer has confirmed charging (the engine, each round):
    /// local spending waits for it (`crate::sync::partition::redis_loss`).
    confirmed: AtomicU64,
    /// The latest loss's epoch (kept after it ends).
    last_epoch: AtomicU64,
    /// Slots a call that got no answer may have taken or left held (a reserve that
    /// timed out, a settlement that failed): `(semaphore key, permit id)`, released
    /// once Redis answers, instead of staying ghosts for a slot ttl (the harness
    /// saw a survivor's slots back 6.4 s after a kill, ttl 2 s, held by its own
    /// timed-out calls).
    orphaned_slots: Mutex<Vec<(String, String)>>,
    /// Slots of requests admitted on the fallback while Redis was lost that
    /// still run: permit id -> semaphore key. Held in Redis when it is back,
    /// before any peer can fill them (`restore_fallback_slots`).
    fallback_slots: Mutex<HashMap<String, String>>,
    /// What was admitted locally while Redis was lost: Redis window key -> bucket
    /// -> cost.
    backlog: Mutex<HashMap<String, BTreeMap<u64, u64>>>,
    node: String,
    next_permit: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock()
}

impl RedisGate {
    /// A gate over `store` for the given limit keys, counted over `windows`.
    /// `node` prefixes semaphore members (unique per process incarnation).
    pub fn new(
        store: RedisStore,
        prefix: &str,
        limits: &[Binding],
        windows: Windows,
        slot_ttl: Duration,
        node: String,
    ) -> RedisGate {
        let mut scopes: HashMap<ScopeId, ScopeLimits> = HashMap::new();
        for limit in limits {
            let scope = &limit.scope;
            let entry = scopes.entry(scope.clone()).or_insert_with(|| ScopeLimits {
                keys: ScopeKeys::new(prefix, &scope.to_string()),
                windows: Default::default(),
                concurrency: (String::new(), 0),
                counts_cache_reads: limit.counts_cache_reads,
            });
            let key = (limit.key.to_string(), limit.capacity);
            match limit.dimension.window_index() {
                Some(i) => entry.windows[i] = Some(key),
                None => entry.concurrency = key,
            }
        }
        RedisGate {
            store,
            windows,
            slot_ttl_ms: slot_ttl.as_millis() as u64,
            scopes,
            caps: RwLock::new(HashMap::new()),
            fallback: Mutex::new(HashMap::new()),
            lost_since: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
            last_epoch: AtomicU64::new(0),
            orphaned_slots: Mutex::new(Vec::new()),
            fallback_slots: Mutex::new(HashMap::new()),
            backlog: Mutex::new(HashMap::new()),
            node,
            next_permit: AtomicU64::new(1),
        }
    }

    /// The engine, each round: effective capacities per key (L minus the shares of
    /// peers that announced they lost Redis).
    pub fn set_caps(&self, caps: HashMap<String, u64>) {
        *self.caps.write() = caps;
    }

    /// Reserves `permit`'s request on `scope` in Redis, waiting out refusals until
    /// `wait_until`. On refusal the local permit is cancelled (nothing charged
    /// anywhere). Redis lost: the permit stands on the local share.
    pub async fn admit(
        self: &Arc<Self>,
        scope: &ScopeId,
        permit: Permit,
        cost: Cost,
        wait_until: Instant,
    ) -> Result<Permit, RemoteRefusal> {
        let Some(limits) = self.scopes.get(scope) else {
            return Ok(permit);
        };
        while self.is_lost() {
            let refusal = match self.record_local(limits, cost) {
                Ok(true) => return Ok(self.fallback_slot(limits, permit)),
                Ok(false) => break,
                Err(refusal) => refusal,
            };
            if let Err(refusal) = wait_out(refusal, wait_until).await {
                permit.settle(SettleWith::Cancel);
                return Err(refusal);
            }
        }
        let id = self.next_permit.fetch_add(1, Ordering::Relaxed);
        let mut reservation = self.reservation(limits, cost, format!("{}:{id}", self.node));
        loop {
            // At the caps of each attempt: a peer's loss lowers them within a sync
            // round, and a request waiting out a refusal must ask for the lowered
            // figures (the lost node spends its share once its peers confirm).
            if !self.at_current_caps(limits, &mut reservation) {
                let refusal = RemoteRefusal {
                    dimension: "concurrency".to_owned(),
                    retry_after: Some(UNCONFIRMED_RETRY),
                };
                if let Err(refusal) = wait_out(refusal, wait_until).await {
                    permit.settle(SettleWith::Cancel);
                    return Err(refusal);
                }
                continue;
            }
            match self.reserve_to_the_end(&limits.keys, &reservation).await {
                Ok(Reserved::Admitted { refs, .. }) => {
                    let charge = self.charge(limits, reservation, refs);
                    return Ok(permit.with_remote(Box::new(charge)));
                }
                Ok(Reserved::Refused {
                    dimension,
                    retry_after_ms,
                }) => {
                    // "Never" (the request alone is above a cap) holds only for the
                    // configured capacities: under caps lowered by peers' losses it
                    // fits again once they are back.
                    let retry = match retry_after_ms {
                        Some(ms) => Some(Duration::from_millis(ms)),
                        None => Self::lowered(limits, &reservation).then_some(LOWERED_RETRY),
                    };
                    let refusal = RemoteRefusal {
                        dimension,
                        retry_after: retry,
                    };
                    if let Err(refusal) = wait_out(refusal, wait_until).await {
                        permit.settle(SettleWith::Cancel);
                        return Err(refusal);
                    }
                }
                Err(e) => {
                    // Admitted locally under the healthy allowance, which no longer
                    // holds: cancel and let the caller admit it again under the
                    // fallback (a request admitted on both would be an overshoot).
                    // Redis may have taken the slot all the same.
                    if reservation.concurrency > 0 {
                        self.orphan_slot(&limits.keys.concurrency, &reservation.permit_id);
                    }
                    self.on_lost(&e.to_string());
                    permit.settle(SettleWith::Cancel);
                    return Err(RemoteRefusal {
                        dimension: REDIS_LOST.to_owned(),
                        retry_after: Some(Duration::ZERO),
                    });
                }
            }
        }
    }

    /// `store.reserve`, carried to its end even if the caller goes away (a client
    /// that disconnects drops its request's future mid-call): Redis may then
    /// admit a reservation nobody waits for any more, and nobody would settle it
    /// (its requests, tokens and slot charged for a window, or a slot ttl). The
    /// call runs in a task of its own; an answer its caller did not take, sent
    /// too late or left in the channel, is [`Self::abandoned`].
    async fn reserve_to_the_end(
        self: &Arc<Self>,
        keys: &ScopeKeys,
        reservation: &Reservation,
    ) -> Result<Reserved, StoreError> {
        let (reply, answer) = oneshot::channel();
        let call = Arc::new((keys.clone(), reservation.clone()));
        let (gate, task_call) = (Arc::clone(self), Arc::clone(&call));
        tokio::spawn(async move {
            let (keys, reservation) = &*task_call;
            let answered = gate.store.reserve(keys, reservation).await;
            if let Err(answered) = reply.send(answered) {
                gate.abandoned(keys, reservation, answered).await;
            }
        });
        let mut waiting = Waiting {
            answer,
            taken: false,
            gate: Arc::clone(self),
            call,
        };
        let answered = (&mut waiting.answer).await;
        waiting.taken = true;
        answered.unwrap_or_else(|_| {
            Err(StoreError::Unexpected {
                script: "reserve",
                detail: "the reservation's task ended unanswered".to_owned(),
            })
        })
    }

    /// Undoes what a reservation whose caller went away may have taken: an
    /// admission is cancelled (requests, tokens and slot given back); a call
    /// without an answer, or a cancellation that failed, leaves its slot to be
    /// released once Redis answers.
    async fn abandoned(
        &self,
        keys: &ScopeKeys,
        reservation: &Reservation,
        answered: Result<Reserved, StoreError>,
    ) {
        let slot = reservation.concurrency > 0;
        let cancelled = match answered {
            Ok(Reserved::Refused { .. }) => return,
            Ok(Reserved::Admitted { refs, .. }) => {
                let nothing = Settled {
                    requests: 0,
                    tokens: Cost::default(),
                };
                (self
                    .store
                    .settle(keys, reservation, &refs, nothing, None)
                    .await)
                    .is_ok()
            }
            Err(_) => false,
        };
        if !cancelled && slot {
            self.orphan_slot(&keys.concurrency, &reservation.permit_id);
        }
    }
}

/// A caller waiting for its reservation's answer. Dropped while waiting (the
/// client went away), it takes an answer already sent and hands it to
/// [`RedisGate::abandoned`]: the task sees the caller gone only if it answers
/// after this.
struct Waiting {
    answer: oneshot::Receiver<Result<Reserved, StoreError>>,
    /// The caller took the answer.
    taken: bool,
    gate: Arc<RedisGate>,
    call: Arc<(ScopeKeys, Reservation)>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let Ok(answered) = self.answer.try_recv() else {
            return;
        };
        // Outside a runtime (only while one shuts down) the slot expires with
        // its ttl and the charge with its window.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (gate, call) = (Arc::clone(&self.gate), Arc::clone(&self.call));
            runtime.spawn(async move {
                let (keys, reservation) = &*call;
                gate.abandoned(keys, reservation, answered).await;
            });
        }
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

mod charge;
mod loss;
mod slots;
#[cfg(test)]
mod tests;

pub use loss::Fallback;
