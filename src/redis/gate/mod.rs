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
use super::store::{Algorithm, DimSpec, RedisStore, Reservation, Reserved, StoreError};
use crate::actor::permit::RemoteCharge;
use crate::actor::scope::{Allowance, Blocked, ScopeStatus};
use crate::actor::task::Refusal;
use crate::actor::{Dimension, Permit, ScopeId, SettleWith};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// Most buckets of local spending kept per key while Redis is lost (bounded; older
/// buckets have left the window by then anyway).
const MAX_BACKLOG_BUCKETS: usize = 4096;

/// Most slots kept for release once Redis answers again (beyond it, their ttl
/// frees them).
const MAX_ORPHANED_SLOTS: usize = 4096;

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
    requests: Option<(String, u64)>,
    tokens: Option<(String, u64)>,
    /// The concurrency limit's key and slots (0: none).
    concurrency: (String, u64),
}

impl ScopeLimits {
    /// The name of the first dimension the scope limits (what a refusal of the
    /// whole request names).
    fn first_dimension(&self) -> &'static str {
        match (&self.requests, &self.tokens) {
            (Some(_), _) => "requests",
            (None, Some(_)) => "tokens",
            (None, None) => "concurrency",
        }
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
        let dimension = match self.dimension.as_str() {
            "requests" => Dimension::Requests,
            "tokens" => Dimension::Tokens,
            _ => Dimension::Concurrency,
        };
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

/// What one limit key falls back to while Redis is lost.
#[derive(Debug, Clone)]
pub struct Fallback {
    /// The key's local allowance (the actors' bound).
    pub allowance: Allowance,
    /// This node's fallback allowance: gossip mode's rule (its demand-weighted
    /// share of the headroom the counters show), or the policy's 0 / unbounded.
    pub own: u64,
    /// What the peers that still reach Redis charge this node while it is lost
    /// (its equal share of L, taken off the capacity they ask of Redis): local
    /// spending per window never exceeds it, so a node losing Redis alone keeps
    /// the cluster within L.
    pub charged: u64,
}

/// The `redis` mode's gate, shared by every request of the node.
pub struct RedisGate {
    store: RedisStore,
    window_ms: u64,
    bucket_ms: u64,
    slot_ttl_ms: u64,
    scopes: HashMap<ScopeId, ScopeLimits>,
    /// Effective capacity per limit key: L minus the shares of peers that lost Redis.
    caps: RwLock<HashMap<String, u64>>,
    /// Each key's fallback (set each sync round).
    fallback: Mutex<HashMap<String, Fallback>>,
    /// The current loss's epoch (the unix ms it began; 0 while Redis answers).
    lost_since: AtomicU64,
    /// The loss epoch every peer has confirmed charging (the engine, each round):
    /// local spending waits for it (`crate::sync::redis_loss`).
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
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RedisGate {
    /// A gate over `store` for the given limit keys `(scope, dimension, key,
    /// capacity)`, windows of `window_ms` in buckets of `bucket_ms`. `node`
    /// prefixes semaphore members (unique per process incarnation).
    pub fn new(
        store: RedisStore,
        prefix: &str,
        limits: &[(ScopeId, Dimension, String, u64)],
        window_ms: u64,
        bucket_ms: u64,
        slot_ttl: Duration,
        node: String,
    ) -> RedisGate {
        let mut scopes: HashMap<ScopeId, ScopeLimits> = HashMap::new();
        for (scope, dimension, key, capacity) in limits {
            let entry = scopes.entry(scope.clone()).or_insert_with(|| ScopeLimits {
                keys: ScopeKeys::new(prefix, &scope.to_string()),
                requests: None,
                tokens: None,
                concurrency: (String::new(), 0),
            });
            match dimension {
                Dimension::Requests => entry.requests = Some((key.clone(), *capacity)),
                Dimension::Tokens => entry.tokens = Some((key.clone(), *capacity)),
                _ => entry.concurrency = (key.clone(), *capacity),
            }
        }
        RedisGate {
            store,
            window_ms,
            bucket_ms,
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

    /// Whether Redis is currently lost (this node is degraded).
    pub fn is_lost(&self) -> bool {
        self.lost_since() > 0
    }

    /// The current loss's epoch (the unix ms it began), 0 while Redis answers: what
    /// the node announces as `redis:lost`.
    pub fn lost_since(&self) -> u64 {
        self.lost_since.load(Ordering::Relaxed)
    }

    /// The engine, each round: the loss epoch every peer confirmed charging (0:
    /// none), which local spending waits for.
    pub fn set_confirmed(&self, epoch: u64) {
        self.confirmed.store(epoch, Ordering::Relaxed);
    }

    /// The engine, each round: effective capacities per key (L minus the shares of
    /// peers that announced they lost Redis).
    pub fn set_caps(&self, caps: HashMap<String, u64>) {
        *self.caps.write().unwrap_or_else(|p| p.into_inner()) = caps;
    }

    /// The engine, each round: each key's fallback.
    pub fn set_fallback(&self, fallback: HashMap<String, Fallback>) {
        *lock(&self.fallback) = fallback;
    }

    /// Redis stopped answering: degrade at once (allowances to the shares).
    pub fn on_lost(&self, error: &str) {
        // Never an earlier loss's epoch again, even after a clock step back: a
        // confirmation of that loss must not count for this one.
        let epoch = unix_ms().max(self.last_epoch.load(Ordering::Relaxed) + 1);
        let began = (self.lost_since)
            .compare_exchange(0, epoch, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        if began {
            self.last_epoch.store(epoch, Ordering::Relaxed);
            tracing::warn!(%error, "redis lost: announcing it over gossip; admitting locally within this node's share once every peer confirms it charges that share");
            for fallback in lock(&self.fallback).values() {
                fallback.allowance.set(fallback.own);
            }
        }
    }

    /// The engine's probe when lost: if Redis answers, adds what was admitted
    /// locally meanwhile into Redis, then uses it again. Returns whether healthy.
    pub async fn probe(&self) -> bool {
        if !self.is_lost() {
            return true;
        }
        if self
            .store
            .command::<String>(&redis::cmd("PING"))
            .await
            .is_err()
        {
            return false;
        }
        // Reconcile a copy: requests admitted locally meanwhile stay in the
        // backlog (and under the cap) for the next pass; after a few passes under
        // steady traffic, the last few ms of it are added right after Redis is
        // used again.
        if let Err(e) = self.restore_fallback_slots().await {
            tracing::warn!(error = %e, "redis answers again but holding the fallback streams' slots failed; still degraded");
            return false;
        }
        for pass in 0..3 {
            let snapshot = lock(&self.backlog).clone();
            if let Err(e) = self.reconcile(&snapshot).await {
                tracing::warn!(error = %e, "redis answers again but reconciling failed; still degraded");
                return false;
            }
            let rest = {
                let mut backlog = lock(&self.backlog);
                if !(backlog.is_empty() || pass == 2) {
                    continue;
                }
                // Cleared under the backlog's lock: no local admission slips in
                // after it unrecorded.
                self.lost_since.store(0, Ordering::Relaxed);
                std::mem::take(&mut *backlog)
            };
            {
                if let Err(e) = self.reconcile(&rest).await {
                    tracing::warn!(error = %e, "adding the last local spending into redis failed");
                }
                tracing::info!("redis is back: local spending reconciled into Redis");
                return true;
            }
        }
        false
    }

    /// A request admitted on the fallback: under a concurrency limit, its slot
    /// is registered to be held in Redis once Redis is back, and heartbeaten
    /// from then on like any slot (a fallback stream that took none would let
    /// other nodes fill their slots after recovery: concurrency over C until it
    /// ended).
    fn fallback_slot(self: &Arc<Self>, limits: &ScopeLimits, permit: Permit) -> Permit {
        if limits.concurrency.1 == 0 {
            return permit;
        }
        let n = self.next_permit.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}:fallback:{n}", self.node);
        let key = limits.keys.concurrency.clone();
        lock(&self.fallback_slots).insert(id.clone(), key.clone());
        let stop = self.heartbeat(key.clone(), id.clone());
        permit.with_remote(Box::new(FallbackSlot {
            gate: Arc::clone(self),
            key,
            id,
            _heartbeat: stop,
        }))
    }

    /// Keeps slot `id` of `key` held while Redis answers, every third of the
    /// slot ttl, until the returned sender is dropped. A heartbeat that finds
    /// the slot gone (a stall past its ttl, a restart, or a fallback request's
    /// slot not held yet) holds it again, cap or not: its request still runs (a
    /// review found other nodes filling it, 16 in flight of C = 8).
    fn heartbeat(self: &Arc<Self>, key: String, id: String) -> oneshot::Sender<()> {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let gate = Arc::clone(self);
        tokio::spawn(async move {
            let every = Duration::from_millis((gate.slot_ttl_ms / 3).max(1));
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(every) => {
                        if gate.is_lost() {
                            continue;
                        }
                        let beat = gate.store.semaphore(&key, "heartbeat", &id, 0, gate.slot_ttl_ms).await;
                        if matches!(beat, Ok(0)) {
                            tracing::info!(%key, "a running request's slot was not held in Redis: held again");
                            let _ = gate.store.semaphore(&key, "restore", &id, 0, gate.slot_ttl_ms).await;
                        }
                    }
                }
            }
        });
        stop
    }

    /// Holds in Redis every running fallback request's slot (Redis is back and
    /// answers): called before the gate uses Redis again, so that no peer's
    /// admission takes a slot a running stream has.
    async fn restore_fallback_slots(&self) -> Result<(), super::store::StoreError> {
        let running: Vec<(String, String)> = (lock(&self.fallback_slots).iter())
            .map(|(id, key)| (id.clone(), key.clone()))
            .collect();
        for (id, key) in running {
            (self.store)
                .semaphore(&key, "restore", &id, 0, self.slot_ttl_ms)
                .await?;
        }
        Ok(())
    }

    /// Remembers a slot a call without an answer may have left held.
    fn orphan_slot(&self, key: &str, permit_id: &str) {
        let mut orphans = lock(&self.orphaned_slots);
        if orphans.len() < MAX_ORPHANED_SLOTS {
            orphans.push((key.to_owned(), permit_id.to_owned()));
        }
    }

    /// The engine, each round while Redis answers: releases the slots calls
    /// without an answer may have left held (idempotent: a slot never taken is
    /// not there). Stops at the first failure and keeps the rest for next round.
    pub async fn release_orphaned_slots(&self) {
        let mut orphans = std::mem::take(&mut *lock(&self.orphaned_slots)).into_iter();
        let mut held = 0;
        while let Some((key, id)) = orphans.next() {
            match self.store.semaphore(&key, "release", &id, 0, 0).await {
                Ok(released) => held += u64::from(released == 1),
                Err(_) => {
                    let mut kept = lock(&self.orphaned_slots);
                    let room = MAX_ORPHANED_SLOTS.saturating_sub(kept.len());
                    kept.extend([(key, id)].into_iter().chain(orphans).take(room));
                    break;
                }
            }
        }
        if held > 0 {
            if let Some(m) = self.store.metrics() {
                m.redis_orphans_released(held);
            }
            tracing::info!(
                held,
                "released slots that calls without an answer had left held in redis"
            );
        }
    }

    /// Adds `done` into Redis and takes it out of the backlog, key by key (a key
    /// added stays added if a later one fails).
    async fn reconcile(
        &self,
        done: &HashMap<String, BTreeMap<u64, u64>>,
    ) -> Result<(), super::store::StoreError> {
        for (key, buckets) in done {
            let pairs: Vec<(u64, u64)> = buckets.iter().map(|(b, c)| (*b, *c)).collect();
            (self.store)
                .charge(key, (self.window_ms, self.bucket_ms), unix_ms(), &pairs)
                .await?;
            let mut backlog = lock(&self.backlog);
            if let Some(live) = backlog.get_mut(key) {
                for (b, c) in buckets {
                    if let Some(left) = live.get_mut(b) {
                        *left = left.saturating_sub(*c);
                    }
                }
                live.retain(|_, c| *c > 0);
                if live.is_empty() {
                    backlog.remove(key);
                }
            }
        }
        Ok(())
    }

    /// A request's reservation at the configured capacities
    /// ([`RedisGate::at_current_caps`] lowers them before each attempt).
    fn reservation(&self, limits: &ScopeLimits, tokens: u64, permit_id: String) -> Reservation {
        Reservation {
            requests: self.dim(&limits.requests),
            tokens: self.dim(&limits.tokens),
            token_cost: tokens,
            concurrency: limits.concurrency.1,
            permit_id,
            slot_ttl_ms: self.slot_ttl_ms,
        }
    }

    /// Sets `reservation`'s capacities to what is asked of Redis now: each less
    /// the shares of peers that lost Redis (one read of the caps). `false` when
    /// the scope has a concurrency limit and every slot is charged to them (0
    /// slots would ask Redis for no concurrency limit at all).
    fn at_current_caps(&self, limits: &ScopeLimits, reservation: &mut Reservation) -> bool {
        let caps = self.caps.read().unwrap_or_else(|p| p.into_inner());
        let cap = |(key, capacity): &(String, u64)| {
            caps.get(key).copied().unwrap_or(*capacity).min(*capacity)
        };
        if let Some(limit) = &limits.requests {
            reservation.requests.capacity = cap(limit);
        }
        if let Some(limit) = &limits.tokens {
            reservation.tokens.capacity = cap(limit);
        }
        reservation.concurrency = cap(&limits.concurrency);
        limits.concurrency.1 == 0 || reservation.concurrency > 0
    }

    /// Whether `reservation` asks for less than the scope's configured capacities
    /// (peers' losses lowered a cap).
    fn lowered(limits: &ScopeLimits, reservation: &Reservation) -> bool {
        let below = |limit: &Option<(String, u64)>, asked: u64| {
            limit
                .as_ref()
                .is_some_and(|(_, capacity)| asked < *capacity)
        };
        below(&limits.requests, reservation.requests.capacity)
            || below(&limits.tokens, reservation.tokens.capacity)
            || reservation.concurrency < limits.concurrency.1
    }

    fn dim(&self, limit: &Option<(String, u64)>) -> DimSpec {
        match limit {
            None => DimSpec::NONE,
            Some((_, capacity)) => DimSpec {
                algorithm: Algorithm::Window {
                    bucket_ms: self.bucket_ms,
                },
                capacity: *capacity,
                window_ms: self.window_ms,
            },
        }
    }

    /// Records a request admitted locally while Redis is lost, unless it would
    /// take this node's local spending in the window past what the peers charge
    /// it: then the time until the oldest local spending leaves the window (none
    /// if the request alone is more). `Ok(false)`: Redis is back (checked under
    /// the backlog's lock, so nothing is recorded after reconciliation ended).
    fn record_local(&self, limits: &ScopeLimits, tokens: u64) -> Result<bool, RemoteRefusal> {
        let now = unix_ms();
        let bucket = now / self.bucket_ms;
        let oldest = (now.saturating_sub(self.window_ms)) / self.bucket_ms;
        let fallback = lock(&self.fallback);
        let mut backlog = lock(&self.backlog);
        let epoch = self.lost_since();
        if epoch == 0 {
            return Ok(false);
        }
        // Peers that have not heard of this loss still ask Redis for all of L:
        // nothing is spent here until every one of them charges this node's share.
        if self.confirmed.load(Ordering::Relaxed) != epoch {
            return Err(RemoteRefusal {
                dimension: limits.first_dimension().to_owned(),
                retry_after: Some(UNCONFIRMED_RETRY),
            });
        }
        let dims = [
            ("requests", &limits.requests, &limits.keys.requests, 1),
            ("tokens", &limits.tokens, &limits.keys.tokens, tokens),
        ];
        for (name, limit, redis_key, cost) in dims {
            let Some((key, capacity)) = limit else {
                continue;
            };
            let Some(charged) = fallback.get(key).map(|f| f.charged) else {
                continue;
            };
            let buckets = backlog.entry(redis_key.clone()).or_default();
            // Buckets that left the window count nowhere any more (reconciling
            // them adds nothing): dropped, so the map stays bounded and the cap
            // exact however long Redis is away.
            *buckets = buckets.split_off(&oldest);
            let in_window: u64 = buckets.values().sum();
            if in_window.saturating_add(cost) > charged {
                let first = buckets.keys().next().copied().unwrap_or(bucket);
                let leaves = (first + 1) * self.bucket_ms + self.window_ms;
                // Above this node's share but within the configured capacity,
                // the request fits again once Redis is back: not "never" (which
                // the client would be told as a 413).
                let retry_after = match cost {
                    _ if cost <= charged => {
                        Some(Duration::from_millis(leaves.saturating_sub(now).max(1)))
                    }
                    _ if cost <= *capacity => Some(LOWERED_RETRY),
                    _ => None,
                };
                return Err(RemoteRefusal {
                    dimension: name.to_owned(),
                    retry_after,
                });
            }
        }
        for (_, limit, redis_key, cost) in dims {
            if limit.is_some() {
                let buckets = backlog.entry(redis_key.clone()).or_default();
                if buckets.len() < MAX_BACKLOG_BUCKETS || buckets.contains_key(&bucket) {
                    *buckets.entry(bucket).or_insert(0) += cost;
                }
            }
        }
        Ok(true)
    }

    /// Reserves `permit`'s request on `scope` in Redis, waiting out refusals until
    /// `wait_until`. On refusal the local permit is cancelled (nothing charged
    /// anywhere). Redis lost: the permit stands on the local share.
    pub async fn admit(
        self: &Arc<Self>,
        scope: &ScopeId,
        permit: Permit,
        tokens: u64,
        wait_until: Instant,
    ) -> Result<Permit, RemoteRefusal> {
        let Some(limits) = self.scopes.get(scope) else {
            return Ok(permit);
        };
        while self.is_lost() {
            let refusal = match self.record_local(limits, tokens) {
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
        let mut reservation = self.reservation(limits, tokens, format!("{}:{id}", self.node));
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
                Ok(Reserved::Admitted {
                    requests_ref,
                    tokens_ref,
                    ..
                }) => {
                    let charge = self.charge(limits, reservation, requests_ref, tokens_ref);
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
            Ok(Reserved::Admitted {
                requests_ref,
                tokens_ref,
                ..
            }) => {
                let refs = (requests_ref.as_str(), tokens_ref.as_str());
                (self
                    .store
                    .settle(keys, reservation, refs, (0, 0), None)
                    .await)
                    .is_ok()
            }
            Err(_) => false,
        };
        if !cancelled && slot {
            self.orphan_slot(&keys.concurrency, &reservation.permit_id);
        }
    }

    fn charge(
        self: &Arc<Self>,
        limits: &ScopeLimits,
        reservation: Reservation,
        requests_ref: String,
        tokens_ref: String,
    ) -> Charge {
        // Long streams keep their slot; a crashed node's slot expires.
        let heartbeat = (reservation.concurrency > 0).then(|| {
            self.heartbeat(
                limits.keys.concurrency.clone(),
                reservation.permit_id.clone(),
            )
        });
        Charge {
            gate: self.clone(),
            keys: limits.keys.clone(),
            reservation,
            refs: (requests_ref, tokens_ref),
            heartbeat,
            answered: Mutex::new(None),
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

/// A request's reservation in Redis, settled with its local permit.
struct Charge {
    gate: Arc<RedisGate>,
    keys: ScopeKeys,
    reservation: Reservation,
    refs: (String, String),
    heartbeat: Option<oneshot::Sender<()>>,
    /// When the upstream last answered (the settlement moves the charge there).
    answered: Mutex<Option<tokio::time::Instant>>,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge")
            .field("keys", &self.keys)
            .field("refs", &self.refs)
            .finish()
    }
}

/// The Redis side of a request admitted on the fallback: its slot, once held.
struct FallbackSlot {
    gate: Arc<RedisGate>,
    key: String,
    id: String,
    /// Dropped with the slot: ends its heartbeat task.
    _heartbeat: oneshot::Sender<()>,
}

impl std::fmt::Debug for FallbackSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FallbackSlot")
            .field("key", &self.key)
            .field("id", &self.id)
            .finish()
    }
}

impl RemoteCharge for FallbackSlot {
    /// Its requests and tokens were reconciled from the backlog, dated by their
    /// bucket there; only the slot is Redis's.
    fn redate(&self) {}

    fn settle(self: Box<Self>, _how: SettleWith) {
        lock(&self.gate.fallback_slots).remove(&self.id);
        // Released by the engine's next round while Redis answers (a slot never
        // held is not there: idempotent).
        self.gate.orphan_slot(&self.key, &self.id);
    }
}

impl RemoteCharge for Charge {
    fn redate(&self) {
        *self.answered.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(tokio::time::Instant::now());
    }

    fn settle(self: Box<Self>, how: SettleWith) {
        let Charge {
            gate,
            keys,
            reservation,
            refs,
            heartbeat,
            answered,
        } = *self;
        drop(heartbeat);
        // Measured now, as the permit ends: the script subtracts it from Redis's
        // TIME when it runs, so the time the settlement spends in flight only
        // dates the charge later (the safe direction).
        let answered_ago_ms = (answered.into_inner().unwrap_or_else(|p| p.into_inner()))
            .map(|at| at.elapsed().as_millis() as u64);
        let reserved = reservation.token_cost;
        let actual = match how {
            SettleWith::Usage { prompt, completion } => (1, prompt.saturating_add(completion)),
            SettleWith::KeepReserved => (1, reserved),
            SettleWith::RefundTokens => (1, 0),
            SettleWith::Cancel => (0, 0),
        };
        tokio::spawn(async move {
            let settled = gate
                .store
                .settle(
                    &keys,
                    &reservation,
                    (&refs.0, &refs.1),
                    actual,
                    answered_ago_ms,
                )
                .await;
            if let Err(e) = settled {
                // The slot is released once Redis answers (or expires with its
                // ttl); a lost refund only makes Redis more conservative; a lost
                // debt is bounded by this request.
                tracing::warn!(error = %e, "settling a reservation in redis failed");
                if reservation.concurrency > 0 {
                    gate.orphan_slot(&keys.concurrency, &reservation.permit_id);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate over one tenant limiting requests (12 per window) and slots (3), its
    /// store pointing nowhere (lazy: nothing connects in these tests; it needs a
    /// runtime to exist).
    fn gate() -> (RedisGate, ScopeId) {
        gate_over(&[
            (Dimension::Requests, "t:r", 12),
            (Dimension::Concurrency, "t:c", 3),
        ])
    }

    /// A gate over tenant `acme` with `limits` (dimension, key, capacity).
    fn gate_over(limits: &[(Dimension, &str, u64)]) -> (RedisGate, ScopeId) {
        let store =
            RedisStore::single("redis://127.0.0.1:1/", Duration::from_millis(5), None).unwrap();
        let scope = ScopeId::tenant("acme");
        let limits: Vec<_> = (limits.iter())
            .map(|(dimension, key, capacity)| {
                (scope.clone(), *dimension, key.to_string(), *capacity)
            })
            .collect();
        let gate = RedisGate::new(
            store,
            "tg",
            &limits,
            60_000,
            1_000,
            Duration::from_secs(10),
            "n1".into(),
        );
        (gate, scope)
    }

    fn fallback(charged: u64) -> HashMap<String, Fallback> {
        let entry = |own| Fallback {
            allowance: Allowance::new(u64::MAX),
            own,
            charged,
        };
        [
            ("t:r".to_owned(), entry(charged)),
            ("t:c".to_owned(), entry(1)),
        ]
        .into()
    }

    #[tokio::test]
    async fn a_lost_node_spends_nothing_until_its_loss_is_confirmed_then_its_share() {
        let (gate, scope) = gate();
        let limits = &gate.scopes[&scope];
        gate.set_fallback(fallback(4));
        assert_eq!(
            gate.record_local(limits, 1),
            Ok(false),
            "healthy: not local"
        );
        gate.on_lost("test");
        let epoch = gate.lost_since();
        assert!(epoch > 0);
        let unconfirmed = gate.record_local(limits, 1).unwrap_err();
        assert_eq!(unconfirmed.retry_after, Some(UNCONFIRMED_RETRY));
        // A confirmation of another loss does not count.
        gate.set_confirmed(epoch - 1);
        assert!(gate.record_local(limits, 1).is_err());
        gate.set_confirmed(epoch);
        for _ in 0..4 {
            assert_eq!(gate.record_local(limits, 1), Ok(true));
        }
        let full = gate.record_local(limits, 1).unwrap_err();
        assert_eq!(full.dimension, "requests");
        assert!(
            full.retry_after.unwrap() > UNCONFIRMED_RETRY,
            "until it leaves the window"
        );
    }

    #[tokio::test]
    async fn a_request_above_the_lost_nodes_share_but_within_the_limit_is_told_to_retry() {
        let (gate, scope) = gate_over(&[(Dimension::Tokens, "t:t", 100)]);
        let limits = &gate.scopes[&scope];
        let share = Fallback {
            allowance: Allowance::new(u64::MAX),
            own: 30,
            charged: 30,
        };
        gate.set_fallback([("t:t".to_owned(), share)].into());
        gate.on_lost("test");
        gate.set_confirmed(gate.lost_since());
        // 50 tokens: more than the 30 this node may spend while Redis is lost,
        // within the tenant's 100 once it is back. (Told "never", the client got a
        // 413 for a request that fits.)
        let above_share = gate.record_local(limits, 50).unwrap_err();
        assert_eq!(above_share.retry_after, Some(LOWERED_RETRY));
        // 150: above the limit itself, never.
        assert_eq!(
            gate.record_local(limits, 150).unwrap_err().retry_after,
            None
        );
        assert_eq!(gate.record_local(limits, 30), Ok(true));
    }

    #[tokio::test]
    async fn a_new_loss_never_reuses_an_earlier_epoch() {
        let (gate, _) = gate();
        gate.on_lost("first");
        let first = gate.lost_since();
        gate.on_lost("again, same loss");
        assert_eq!(gate.lost_since(), first);
        // Back (as the probe does), then lost again within the same millisecond
        // or after a clock step back.
        gate.lost_since.store(0, Ordering::Relaxed);
        gate.last_epoch.store(u64::MAX / 2, Ordering::Relaxed);
        gate.on_lost("second");
        assert_eq!(gate.lost_since(), u64::MAX / 2 + 1);
    }

    #[tokio::test]
    async fn reservations_ask_for_the_caps_peers_losses_lowered() {
        let (gate, scope) = gate();
        let limits = &gate.scopes[&scope];
        let mut reservation = gate.reservation(limits, 10, "p".into());
        assert!(gate.at_current_caps(limits, &mut reservation));
        assert_eq!(
            (reservation.requests.capacity, reservation.concurrency),
            (12, 3)
        );
        assert!(!RedisGate::lowered(limits, &reservation));
        // The same reservation, asked again after peers' losses lowered the caps.
        gate.set_caps([("t:r".to_owned(), 8), ("t:c".to_owned(), 2)].into());
        assert!(gate.at_current_caps(limits, &mut reservation));
        assert_eq!(
            (reservation.requests.capacity, reservation.concurrency),
            (8, 2)
        );
        assert!(RedisGate::lowered(limits, &reservation));
        // Every slot charged to lost peers: not asked (0 would mean no limit).
        gate.set_caps([("t:c".to_owned(), 0)].into());
        assert!(!gate.at_current_caps(limits, &mut reservation));
        // A cap is never raised above the configured capacity; back to it.
        gate.set_caps([("t:r".to_owned(), 99)].into());
        assert!(gate.at_current_caps(limits, &mut reservation));
        assert_eq!(
            (reservation.requests.capacity, reservation.concurrency),
            (12, 3)
        );
    }
}
