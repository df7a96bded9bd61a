//! One admission's reservation in Redis: what it asks of each limit at the
//! current caps, and its charge, which settles (`settle.lua`) off the request
//! path when its permit ends.

use super::*;

/// A request's reservation in Redis, settled with its local permit.
pub(super) struct Charge {
    pub(super) gate: Arc<RedisGate>,
    pub(super) keys: ScopeKeys,
    pub(super) reservation: Reservation,
    pub(super) refs: [String; WINDOWS],
    /// Cache-read input tokens count as input in this scope.
    pub(super) counts_cache_reads: bool,
    pub(super) heartbeat: Option<oneshot::Sender<()>>,
    /// When the upstream last answered (the settlement moves the charge there).
    pub(super) answered: Mutex<Option<tokio::time::Instant>>,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Charge")
            .field("keys", &self.keys)
            .field("refs", &self.refs)
            .finish()
    }
}

impl RemoteCharge for Charge {
    fn redate(&self) {
        *self.answered.lock() = Some(tokio::time::Instant::now());
    }

    fn settle(self: Box<Self>, how: SettleWith) {
        let Charge {
            gate,
            keys,
            reservation,
            refs,
            counts_cache_reads,
            heartbeat,
            answered,
        } = *self;
        drop(heartbeat);
        // Measured now, as the permit ends: the script subtracts it from Redis's
        // TIME when it runs, so the time the settlement spends in flight only
        // dates the charge later (the safe direction).
        let answered_ago_ms = (answered.into_inner()).map(|at| at.elapsed().as_millis() as u64);
        let actual = settled(how, reservation.cost, counts_cache_reads);
        tokio::spawn(async move {
            let settled = gate
                .store
                .settle(&keys, &reservation, &refs, actual, answered_ago_ms)
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

/// What a reservation of `reserved` comes to in Redis when its permit ends
/// `how`: the same figures the local settlement takes (`Cost::of_usage`).
pub(super) fn settled(how: SettleWith, reserved: Cost, counts_cache_reads: bool) -> Settled {
    let (requests, tokens) = match how {
        SettleWith::Usage {
            prompt,
            cache_read,
            completion,
        } => (
            1,
            Cost::of_usage(prompt, cache_read, completion, counts_cache_reads),
        ),
        SettleWith::KeepReserved => (1, reserved),
        SettleWith::RefundTokens => (1, Cost::default()),
        SettleWith::Cancel => (0, Cost::default()),
    };
    Settled { requests, tokens }
}

impl RedisGate {
    /// A request's reservation at the configured capacities
    /// ([`RedisGate::at_current_caps`] lowers them before each attempt).
    pub(super) fn reservation(
        &self,
        limits: &ScopeLimits,
        cost: Cost,
        permit_id: String,
    ) -> Reservation {
        Reservation {
            windows: std::array::from_fn(|i| self.dim(&limits.windows[i])),
            cost,
            concurrency: limits.concurrency.1,
            permit_id,
            slot_ttl_ms: self.slot_ttl_ms,
        }
    }

    /// Sets `reservation`'s capacities to what is asked of Redis now: each less
    /// the shares of peers that lost Redis (one read of the caps). `false` when
    /// the scope has a concurrency limit and every slot is charged to them (0
    /// slots would ask Redis for no concurrency limit at all).
    pub(super) fn at_current_caps(
        &self,
        limits: &ScopeLimits,
        reservation: &mut Reservation,
    ) -> bool {
        let caps = self.caps.read();
        let cap = |(key, capacity): &(String, u64)| {
            caps.get(key).copied().unwrap_or(*capacity).min(*capacity)
        };
        for (asked, limit) in reservation.windows.iter_mut().zip(&limits.windows) {
            if let Some(limit) = limit {
                asked.capacity = cap(limit);
            }
        }
        reservation.concurrency = cap(&limits.concurrency);
        limits.concurrency.1 == 0 || reservation.concurrency > 0
    }

    /// Whether `reservation` asks for less than the scope's configured capacities
    /// (peers' losses lowered a cap).
    pub(super) fn lowered(limits: &ScopeLimits, reservation: &Reservation) -> bool {
        let below = |limit: &Option<(String, u64)>, asked: u64| {
            limit
                .as_ref()
                .is_some_and(|(_, capacity)| asked < *capacity)
        };
        let windows = limits.windows.iter().zip(&reservation.windows);
        windows
            .into_iter()
            .any(|(limit, asked)| below(limit, asked.capacity))
            || reservation.concurrency < limits.concurrency.1
    }

    pub(super) fn dim(&self, limit: &Option<(String, u64)>) -> DimSpec {
        match limit {
            None => DimSpec::NONE,
            Some((key, capacity)) => {
                let window = self.windows.of(key);
                DimSpec {
                    algorithm: Algorithm::Window {
                        bucket_ms: window.bucket_ms(),
                    },
                    capacity: *capacity,
                    window_ms: window.window_ms(),
                }
            }
        }
    }

    pub(super) fn charge(
        self: &Arc<Self>,
        limits: &ScopeLimits,
        reservation: Reservation,
        refs: [String; WINDOWS],
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
            refs,
            counts_cache_reads: limits.counts_cache_reads,
            heartbeat,
            answered: Mutex::new(None),
        }
    }
}
