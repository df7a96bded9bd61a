//! Redis as every key's owner (`redis-lease`): one `lease.lua` call per key,
//! with this node's reservation, so a node that loses Redis spends what Redis
//! keeps charging it.

use super::*;

/// Redis as every key's owner (`redis-lease`; no RPC address).
pub(super) static REDIS: std::sync::LazyLock<MemberAddr> =
    std::sync::LazyLock::new(|| MemberAddr {
        id: REDIS_OWNER.to_owned(),
        rpc: String::new(),
        rpc_version: RPC_VERSION,
    });

/// One key's `redis-lease` ask: its reservation, and the held members with floors.
pub(super) type RedisAsk = (Option<Reserve>, Vec<(String, u64)>);

impl Holder {
    /// `redis-lease`: one `lease.lua` call per key, all concurrently on the
    /// multiplexed connection. Each asks Redis to reserve this node's share of L
    /// (by gossiped demand) and to keep the reservations of members that lost
    /// Redis or gossip; the reservation confirmed is what this node spends per
    /// window if Redis is lost, and Redis keeps every holder's charge at least its
    /// reservation, so the cluster stays within L (docs/design/redis.md).
    #[expect(
        clippy::too_many_lines,
        reason = "one lease.lua exchange per key, built and read in one place"
    )]
    pub(super) async fn send_redis(
        &self,
        store: &RedisStore,
        prefix: &str,
        bucket_ms: u64,
        items: &Items,
        view: &View,
        round: Round,
    ) -> Answered {
        let sent_ms = self.now_ms();
        let asks: Vec<RedisAsk> = (items.iter())
            .map(|(i, _)| {
                let binding = &self.node.bindings[*i];
                let terms = view.terms_for(&binding.key, binding.capacity);
                let reserve = terms.map(|t| match round {
                    Round::ReturnAll => Reserve {
                        share: 0,
                        borrow: 0,
                    },
                    Round::Normal | Round::Woken => Reserve {
                        share: t.shares.get(&view.self_id).copied().unwrap_or(0),
                        borrow: t.borrow,
                    },
                });
                // Held members, each with the floor Redis charges it if it has no
                // account of it: its share (or frozen floor) in this view.
                let held = (view.redis_held.iter())
                    .filter(|m| **m != view.self_id)
                    .map(|m| {
                        let floor = terms.and_then(|t| t.floors.get(m).or(t.shares.get(m)));
                        (m.clone(), floor.copied().unwrap_or(0))
                    })
                    .collect();
                (reserve, held)
            })
            .collect();
        {
            // Until Redis confirms, the cut-off share is at most what this statement
            // asks: if the answer is lost, Redis may already hold the smaller figure.
            let mut reserved = self.reserved.lock();
            for ((i, _), (reserve, _)) in items.iter().zip(&asks) {
                let ask = reserve.map_or(0, |r| r.share);
                reserved.lower_to(&self.node.bindings[*i].key, ask);
            }
        }
        let calls = items
            .iter()
            .zip(&asks)
            .map(|((i, snapshot), (reserve, held))| {
                let binding = &self.node.bindings[*i];
                let dimension = binding.dimension;
                let line = LeaseLine {
                    windowed: dimension != Dimension::Concurrency,
                    capacity: binding.capacity,
                    window_ms: self.settings.window_ms,
                    bucket_ms,
                    max_credit: max_credit(binding.capacity, self.settings.max_credit),
                    ttl_ms: self.ttl_ms(),
                };
                let key = ScopeKeys::lease(prefix, &binding.scope.to_string(), dimension.as_str());
                let reserve = *reserve;
                async move {
                    let ask = LeaseAsk { reserve, held };
                    let leased = store
                        .lease(&key, &view.self_id, &line, &snapshot.request, &ask)
                        .await;
                    if crate::audit::enabled()
                        && let Ok(Ok(leased)) = &leased
                    {
                        let r = &snapshot.request;
                        crate::audit::record(&crate::audit::Event::Stated {
                            key: &binding.key,
                            seq: r.seq,
                            sent_ms,
                            answered_ms: self.now_ms(),
                            redis_ms: leased.redis_ms,
                            usage: &r.usage,
                            remaining: r.remaining,
                            want: r.want,
                            credit: leased.reply.credit,
                            granted: leased.reply.granted,
                            reserved: leased.reserved,
                        });
                    }
                    (binding.key.clone(), leased)
                }
            });
        let results = futures_util::future::join_all(calls).await;
        let mut out = Vec::with_capacity(items.len());
        let mut unreachable = None;
        let mut reserved = self.reserved.lock();
        reserved.drop_lapsed(self.now_ms());
        // Every confirmed reservation is recorded, even when another key's call
        // failed (its figure may be smaller than the one held here).
        for (key, result) in results {
            match result {
                Ok(Ok(leased)) => {
                    let until = sent_ms.saturating_add(self.ttl_ms());
                    reserved.confirm(&key, leased.reserved, until);
                    out.push(Ok(leased.reply));
                }
                Ok(Err(code)) => out.push(Err(code)),
                Err(e) => unreachable = Some(CallError::Unreachable(e.to_string())),
            }
        }
        match unreachable {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The reservation Redis keeps for this node on `key` now (`redis-lease`).
    pub(super) fn reservation(&self, key: &str) -> u64 {
        let reserved = self.reserved.lock();
        reserved.at(key, self.now_ms())
    }
}
