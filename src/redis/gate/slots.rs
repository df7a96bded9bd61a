//! Concurrency slots while Redis is lost and after: slots of streams admitted
//! on the fallback are held in Redis once it is back, heartbeaten like any
//! slot, and slots a call without an answer may have left held are released
//! once Redis answers.

use super::*;

/// Most slots kept for release once Redis answers again (beyond it, their ttl
/// frees them).
pub(super) const MAX_ORPHANED_SLOTS: usize = 4096;

/// The Redis side of a request admitted on the fallback: its slot, once held.
pub(super) struct FallbackSlot {
    pub(super) gate: Arc<RedisGate>,
    pub(super) key: String,
    pub(super) id: String,
    /// Dropped with the slot: ends its heartbeat task.
    pub(super) _heartbeat: oneshot::Sender<()>,
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

impl RedisGate {
    /// A request admitted on the fallback: under a concurrency limit, its slot
    /// is registered to be held in Redis once Redis is back, and heartbeaten
    /// from then on like any slot (a fallback stream that took none would let
    /// other nodes fill their slots after recovery: concurrency over C until it
    /// ended).
    pub(super) fn fallback_slot(self: &Arc<Self>, limits: &ScopeLimits, permit: Permit) -> Permit {
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
    pub(super) fn heartbeat(self: &Arc<Self>, key: String, id: String) -> oneshot::Sender<()> {
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
    pub(super) async fn restore_fallback_slots(
        &self,
    ) -> Result<(), crate::redis::store::StoreError> {
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
    pub(super) fn orphan_slot(&self, key: &str, permit_id: &str) {
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
}
