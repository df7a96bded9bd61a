//! Redis as every key's owner (`redis-lease`): one `lease.lua` call per key,
//! with this node's reservation, so a node that loses Redis spends what Redis
//! keeps charging it.

use super::owners::{Owners, Sender};
use super::plan::max_credit;
use super::{Answered, Items, REDIS_OWNER, Round};
use crate::actor::Dimension;
use crate::actor::credit::Credit;
use crate::redis::{LeaseAsk, LeaseLine, RedisStore, Reserve, ScopeKeys};
use crate::sync::lease::reservations::Reservations;
use crate::sync::lease::rpc::CallError;
use crate::sync::lease::{MemberAddr, View};
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use tollgate_cluster::counter::Windows;
use tollgate_cluster::membership::RPC_VERSION;

/// Redis as every key's owner (`redis-lease`; no RPC address).
pub(super) static REDIS: std::sync::LazyLock<MemberAddr> =
    std::sync::LazyLock::new(|| MemberAddr {
        id: REDIS_OWNER.to_owned(),
        rpc: String::new(),
        rpc_version: RPC_VERSION,
    });

/// One key's `redis-lease` ask: its reservation, and the held members with floors.
type RedisAsk = (Option<Reserve>, Vec<(String, u64)>);

/// `redis-lease`: Redis owns every key (`lease.lua`).
pub(crate) struct RedisOwner {
    store: RedisStore,
    /// Key prefix.
    prefix: String,
    /// The cluster's windows (each key's by its name).
    windows: Windows,
    /// The reservation Redis last confirmed per key: the cut-off share.
    reserved: Mutex<Reservations>,
}

impl RedisOwner {
    /// Redis as the owner, through `store`, under `prefix`.
    pub(crate) fn new(store: RedisStore, prefix: String, windows: Windows) -> RedisOwner {
        RedisOwner {
            store,
            prefix,
            windows,
            reserved: Mutex::default(),
        }
    }

    /// One `lease.lua` call per key, all concurrently on the multiplexed
    /// connection. Each asks Redis to reserve this node's share of L (by
    /// gossiped demand) and to keep the reservations of members that lost Redis
    /// or gossip; the reservation confirmed is what this node spends per window
    /// if Redis is lost, and Redis keeps every holder's charge at least its
    /// reservation, so the cluster stays within L (docs/design/redis.md).
    async fn state(
        &self,
        sender: Sender<'_>,
        items: &Items,
        view: &View,
        round: Round,
    ) -> Answered {
        let ttl_ms = sender.settings.ttl.as_millis() as u64;
        let asks = asks(&sender, items, view, round);
        let sent_ms = sender.now_ms();
        {
            // Until Redis confirms, the cut-off share is at most what this statement
            // asks: if the answer is lost, Redis may already hold the smaller figure.
            let mut reserved = self.reserved.lock();
            for ((i, _), (reserve, _)) in items.iter().zip(&asks) {
                let ask = reserve.map_or(0, |r| r.share);
                reserved.lower_to(&sender.node.bindings[*i].key, ask);
            }
        }
        let calls = items
            .iter()
            .zip(&asks)
            .map(|((i, snapshot), (reserve, held))| {
                let binding = &sender.node.bindings[*i];
                let dimension = binding.dimension;
                let window = self.windows.of(&binding.key);
                let line = LeaseLine {
                    windowed: dimension != Dimension::Concurrency,
                    capacity: binding.capacity,
                    window_ms: window.window_ms(),
                    bucket_ms: window.bucket_ms(),
                    max_credit: max_credit(binding.capacity, sender.settings.max_credit),
                    ttl_ms,
                };
                let key =
                    ScopeKeys::lease(&self.prefix, &binding.scope.to_string(), dimension.as_str());
                let reserve = *reserve;
                async move {
                    let ask = LeaseAsk { reserve, held };
                    let leased = self
                        .store
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
                            answered_ms: sender.now_ms(),
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
        reserved.drop_lapsed(sender.now_ms());
        // Every confirmed reservation is recorded, even when another key's call
        // failed (its figure may be smaller than the one held here).
        for (key, result) in results {
            match result {
                Ok(Ok(leased)) => {
                    let until = sent_ms.saturating_add(ttl_ms);
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
}

/// Each key's ask: this node's share of L (nothing on a graceful stop), and
/// the held members, each with the floor Redis charges it if it has no
/// account of it: its share (or frozen floor) in this view.
fn asks(sender: &Sender<'_>, items: &Items, view: &View, round: Round) -> Vec<RedisAsk> {
    (items.iter())
        .map(|(i, _)| {
            let binding = &sender.node.bindings[*i];
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
            let held = (view.redis_held.iter())
                .filter(|m| **m != view.self_id)
                .map(|m| {
                    let floor = terms.and_then(|t| t.floors.get(m).or(t.shares.get(m)));
                    (m.clone(), floor.copied().unwrap_or(0))
                })
                .collect();
            (reserve, held)
        })
        .collect()
}

impl Owners for RedisOwner {
    fn owner_of<'v>(&self, _view: &'v View, _key: &str) -> Option<&'v MemberAddr> {
        Some(&REDIS)
    }

    fn are_members(&self) -> bool {
        false
    }

    fn reservation(&self, key: &str, now_ms: u64) -> u64 {
        self.reserved.lock().at(key, now_ms)
    }

    fn reservations_kept(&self, now_ms: u64) -> usize {
        let mut reserved = self.reserved.lock();
        reserved.drop_lapsed(now_ms);
        reserved.len()
    }

    /// The reservation Redis still keeps for it (none once lapsed).
    fn cut_off(&self, credit: &Credit, key: &str, now_ms: u64) {
        let share = self.reservation(key, now_ms);
        credit.with(|b| b.set_cut_off(Some(share)));
    }

    fn send<'a>(
        &'a self,
        sender: Sender<'a>,
        _owner: &'a MemberAddr,
        items: Items,
        view: &'a View,
        round: Round,
    ) -> BoxFuture<'a, Vec<(Items, Answered)>> {
        Box::pin(async move {
            let answered = self.state(sender, &items, view, round).await;
            vec![(items, answered)]
        })
    }
}
