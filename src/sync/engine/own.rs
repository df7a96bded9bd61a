//! This node's own figures each round: what its actors exported, recorded
//! into the CRDT counters it publishes, and the keys it holds.

use super::*;

impl Engine {
    /// Feeds this node's exports into the counters; returns its own figures per key.
    pub(super) fn record_own(
        &mut self,
        exports: &[(ScopeId, ScopeExport)],
        now_ms: u64,
    ) -> HashMap<String, Own> {
        let mut own = HashMap::new();
        for (scope, export) in exports {
            let windows = (Dimension::WINDOWED.iter())
                .zip(&export.windows)
                .zip(export.requested);
            for ((&dimension, window), requested) in windows {
                let Some((_, buckets)) = window else { continue };
                let key = key_of(scope, dimension);
                let mut added = 0u64;
                for (bucket, cost) in buckets {
                    let before = self.counters.bucket_count(&key, *bucket);
                    // Bucket indices line up: both clocks count Unix time in buckets of
                    // the same width (validate() makes each window's a whole number of ms,
                    // the day's as the base one's).
                    match self.counters.set_bucket(&key, *bucket, *cost, now_ms) {
                        Ok(_) => added = added.saturating_add(cost.saturating_sub(before)),
                        Err(e) => tracing::warn!(%key, error = %e, "usage not published"),
                    }
                }
                self.echo.added(&key, added);
                let demand = self.demand.observe(&key, requested, now_ms);
                let _ = self.counters.set_demand(&key, demand);
                let used = buckets.iter().map(|(_, c)| c).sum();
                own.insert(
                    key.clone(),
                    Own {
                        used,
                        seen: self.echo.seen(&key, used, now_ms),
                        demand,
                    },
                );
            }
            let key = key_of(scope, Dimension::Concurrency);
            // Slots are shared by what waits for one now, not by request rate: the
            // headroom left beside the slots in use goes where requests queue. By
            // rate, a busy node whose clients run one request at a time would take
            // all of it and another node's queued request get none while a slot
            // stands free (the jepsen harness's ghost-slot check: 8 s at one of two
            // slots in use, in `gossip`).
            let demand = export.waiting;
            let _ = self.counters.set_in_flight(&key, export.in_flight);
            let _ = self.counters.set_demand(&key, demand);
            own.insert(
                key,
                Own {
                    used: export.in_flight,
                    seen: export.in_flight,
                    demand,
                },
            );
        }
        // Keys whose actor has retired: nothing of theirs is in flight here, and
        // what they asked for leaves the window with time. Their last exported
        // figures stayed published for good when an actor retired with demand
        // still in its window (an idle timeout equal to the window allows it):
        // a ghost demand that held peers' shares of the key down, and the key's
        // ring, replicas and demand records on every member, never collected
        // (docs/BENCHMARKS.md, "Used once, now idle: the census").
        // The demand trackers' keys too: a key the counters refused (at their
        // cap) still has one.
        let mut retired: Vec<String> = (self.counters.keys().chain(self.demand.keys()))
            .filter(|key| !own.contains_key(*key))
            .cloned()
            .collect();
        retired.sort_unstable();
        retired.dedup();
        for key in retired {
            let _ = self.counters.set_in_flight(&key, 0);
            let _ = self.counters.set_held(&key, 0);
            let _ = self
                .counters
                .set_demand(&key, self.demand.decay(&key, now_ms));
        }
        // `lease`: the cut-off share each used key's owner told this node, so that
        // an owner that forgot it (its line rebuilt while this node saw no move and
        // could not reach it) still charges it (docs/design/lease.md, "Double
        // fault"). After the retired keys' zeros: a credit not dropped yet may
        // still hold a figure its next actor could spend. Rounded up to a
        // sixteenth of L: it changes with the shares, not with every statement.
        if let Some(credits) = &self.node.credits {
            for (index, told) in credits.told_shares() {
                let Some(binding) = self.node.bindings.get(index as usize) else {
                    continue;
                };
                let held = held_figure(told, binding.capacity);
                let _ = self.counters.set_held(&binding.key, held);
            }
        }
        self.echo.forget_seen(now_ms);
        self.demand.forget_retired(now_ms);
        own
    }

    /// The per-key entries this node holds, structure by structure.
    pub(super) fn held_keys(&self) -> HeldKeys {
        let lease = self.lease.as_ref();
        let holder = |count: fn(&crate::sync::lease::holder::HolderHeld) -> &AtomicUsize| {
            lease.map_or(0, |f| count(&f.holder_held).load(Ordering::Relaxed))
        };
        // One lock at a time, each released before the next is taken: a guard
        // made inside the struct literal would live to its end, and the owner
        // book takes the usage lock inside its own (a deadlock the scale tests
        // hit when this held the usage lock while asking the book).
        let replicas = lock(&self.usage).key_count();
        let owner_lines = (lease.and_then(|f| f.book.as_ref())).map_or(0, |b| b.open_lines());
        let credits = (self.node.credits.as_ref()).map_or(0, |t| t.made_count());
        HeldKeys {
            counters: self.counters.len(),
            demand: self.demand.len(),
            history: self.history.len(),
            echo: self.echo.len(),
            replicas,
            credits,
            holder_keys: holder(|h| &h.active),
            reservations: holder(|h| &h.reservations),
            owner_lines,
            archived: self.archive.published(),
        }
    }
}

/// The figure published for a told cut-off share: rounded up to a sixteenth of
/// `capacity` (at least 1), never above it; 0 stays 0.
pub(super) fn held_figure(told: u64, capacity: u64) -> u64 {
    let step = (capacity / 16).max(1);
    told.div_ceil(step)
        .saturating_mul(step)
        .min(capacity.max(told))
}
