//! Losing Redis and getting it back: the loss's epoch, the fallback each key
//! spends on meanwhile, what is admitted locally per bucket, and the probe
//! that charges that spending into Redis before the gate uses it again.

use super::*;

/// Most buckets of local spending kept per key while Redis is lost (bounded; older
/// buckets have left the window by then anyway).
pub(super) const MAX_BACKLOG_BUCKETS: usize = 4096;

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

impl RedisGate {
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

    /// Adds `done` into Redis and takes it out of the backlog, key by key (a key
    /// added stays added if a later one fails).
    pub(super) async fn reconcile(
        &self,
        done: &HashMap<String, BTreeMap<u64, u64>>,
    ) -> Result<(), crate::redis::store::StoreError> {
        for (key, buckets) in done {
            let pairs: Vec<(u64, u64)> = buckets.iter().map(|(b, c)| (*b, *c)).collect();
            let window = self.windows.of(key);
            let window = (window.window_ms(), window.bucket_ms());
            (self.store).charge(key, window, unix_ms(), &pairs).await?;
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

    /// Records a request admitted locally while Redis is lost, unless it would
    /// take this node's local spending in the window past what the peers charge
    /// it: then the time until the oldest local spending leaves the window (none
    /// if the request alone is more). `Ok(false)`: Redis is back (checked under
    /// the backlog's lock, so nothing is recorded after reconciliation ended).
    pub(super) fn record_local(
        &self,
        limits: &ScopeLimits,
        cost: Cost,
    ) -> Result<bool, RemoteRefusal> {
        let now = unix_ms();
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
        let dims: [_; WINDOWS] = std::array::from_fn(|i| {
            let dimension = Dimension::WINDOWED[i];
            let (limit, redis_key) = (&limits.windows[i], &limits.keys.windows[i]);
            (dimension.as_str(), limit, redis_key, cost.on(dimension))
        });
        for &(name, limit, redis_key, cost) in &dims {
            let Some((key, capacity)) = limit else {
                continue;
            };
            let Some(charged) = fallback.get(key).map(|f| f.charged) else {
                continue;
            };
            let window = self.windows.of(key);
            let (bucket, bucket_ms) = (window.bucket_index(now), window.bucket_ms());
            let oldest = (now.saturating_sub(window.window_ms())) / bucket_ms;
            let buckets = backlog.entry(redis_key.clone()).or_default();
            // Buckets that left the window count nowhere any more (reconciling
            // them adds nothing): dropped, so the map stays bounded and the cap
            // exact however long Redis is away.
            *buckets = buckets.split_off(&oldest);
            let in_window: u64 = buckets.values().sum();
            if in_window.saturating_add(cost) > charged {
                let first = buckets.keys().next().copied().unwrap_or(bucket);
                let leaves = (first + 1) * bucket_ms + window.window_ms();
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
        for &(_, limit, redis_key, cost) in &dims {
            if let Some((key, _)) = limit {
                let bucket = self.windows.of(key).bucket_index(now);
                let buckets = backlog.entry(redis_key.clone()).or_default();
                if buckets.len() < MAX_BACKLOG_BUCKETS || buckets.contains_key(&bucket) {
                    *buckets.entry(bucket).or_insert(0) += cost;
                }
            }
        }
        Ok(true)
    }
}
