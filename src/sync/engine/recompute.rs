//! The round's arithmetic, run: every bound key's figures handed to the
//! configured mode (`super::super::mode`), and what it decided applied:
//! allowances, Redis caps and fallbacks, the lease view, the spill room.

use super::*;
use crate::sync::mode::{KeyInput, Output, RedisRound, Round, lease::idle_room};

impl Engine {
    /// Sets every bound key's bound for this round from the figures read.
    pub(super) fn recompute(
        &mut self,
        own: &HashMap<String, Own>,
        members: &[Member],
        now_ms: u64,
        settled: bool,
    ) {
        let node = Arc::clone(&self.node);
        let horizon_ms = self.horizon_ms(now_ms);
        let split_at_cut = self.split_at_cut();
        let usage_guard = Arc::clone(&self.usage);
        let usage = usage_guard.lock();
        let (addrs, spill_peers) = addresses(members, &self.self_id);
        // Every key's demand vector lists the same members (each live one, 0 when
        // it published nothing for the key).
        let mut live_nodes = usage.live_nodes();
        live_nodes.push(self.self_id.clone());
        self.history.set_members(&live_nodes, &self.dead);
        let charged: Vec<Loss> = self.redis_losses.charged().copied().collect();
        // `redis`: what this node divides each capacity by when it spends locally:
        // its loss's fixed divisor, or what a loss beginning now would use.
        let redis_divisor = (self.own_redis_loss())
            .map_or_else(|| self.redis_losses.known_members(), |l| l.divisor);
        let round = Round {
            self_id: &self.self_id,
            usage: &usage,
            now_ms,
            dead: &self.dead,
            borrow: (self.lease.as_ref())
                .filter(|feed| self.lag_ms <= feed.fresh_within_ms)
                .map_or(0.0, |feed| feed.max_borrow),
            spill_peers: node.spill.is_some().then_some(spill_peers.as_slice()),
            split_at_cut: split_at_cut.as_deref(),
            redis: RedisRound {
                lost: self.redis_gate.as_ref().is_some_and(|g| g.is_lost()),
                divisor: redis_divisor,
                charged: &charged,
            },
        };
        let mut out = Output::default();
        let mut views = BTreeMap::new();
        for (index, binding) in node.bindings.iter().enumerate() {
            let key = &*binding.key;
            let mine = own.get(key).copied().unwrap_or(Own {
                used: 0,
                seen: 0,
                demand: self.demand.current(key),
            });
            // This node's own figure in `demands` becomes its demand as it stood
            // one failure-detection time ago: what every peer has surely received.
            // The figures frozen at a cut use it: with the fresh own figure (which
            // keeps growing with refused demand during a cut) this side would grant
            // itself more than the other side charges it; the jepsen harness
            // measures that as a 2.5% overshoot of lease mode under partition.
            let mut demands = usage.demand_by_node(key);
            let span = (horizon_ms, now_ms);
            (self.history).observe(
                key,
                mine.demand,
                &mut demands,
                &self.self_id,
                &self.dead,
                span,
            );
            let frozen = if self.dead.is_empty() {
                Vec::new()
            } else {
                self.history.frozen_all(key)
            };
            // What a node that did not see the cut begin charges at least: the
            // most its peers charge, or all of L while none has told it.
            let adopted = (self.unwitnessed && binding.dimension != Dimension::Concurrency)
                .then(|| (self.cut.adopted_charge(key)).unwrap_or(binding.capacity));
            let input = KeyInput {
                index: index as u32,
                binding,
                own: mine,
                demands: &demands,
                frozen: &frozen,
                others_live: usage.global_usage_except(key, Some(&self.self_id), now_ms),
                adopted,
            };
            // This node's view of the key's global usage (admin). Keys nobody
            // used in the window are left out (read as 0): a copy of every
            // configured key's name each round would be ~160 B per idle tenant.
            if binding.dimension != Dimension::Concurrency && input.global() > 0 {
                views.insert(key.to_owned(), input.global());
            }
            self.mode.key(&round, &input, &mut out);
        }
        drop(usage);
        self.apply(out, addrs, spill_peers, settled);
        self.status.lock().global_usage = views;
    }

    /// Applies what the round decided.
    fn apply(
        &mut self,
        out: Output,
        members: Vec<MemberAddr>,
        spill_peers: Vec<MemberAddr>,
        settled: bool,
    ) {
        let bindings = &self.node.bindings;
        for (index, value) in out.allowances {
            let binding = &bindings[index as usize];
            if let Some(allowance) = &binding.allowance
                && allowance.set(value)
            {
                // Waiters held back by the old figure are admitted now rather than
                // at their next re-check (up to ALLOWANCE_RETRY_HINT_NS later): a
                // freed slot in `gossip` reached a waiting node ~0.25 s late.
                self.node.registry.wake(&binding.scope);
            }
        }
        for (key, charge) in &out.cut_charges {
            self.cut.record(key, *charge);
        }
        if let Some(gate) = &self.redis_gate {
            gate.set_caps(out.redis_caps);
            let fallback = (out.redis_fallback.iter())
                .filter_map(|f| {
                    let binding = &bindings[f.index as usize];
                    let fallback = Fallback {
                        allowance: binding.allowance.clone()?,
                        own: f.own,
                        charged: f.charged,
                    };
                    Some((binding.key.to_string(), fallback))
                })
                .collect();
            gate.set_fallback(fallback);
            let epoch = gate.lost_since();
            let alone_by_design = self.membership.seeds_configured() == 0;
            let confirmed = self.cut_off == CutOff::FailOpen
                || self.redis_losses.confirmed(epoch, alone_by_design);
            gate.set_confirmed(if confirmed { epoch } else { 0 });
        }
        if let Some(board) = &self.node.spill {
            board.set(Room {
                idle: idle_room(&out.idle_terms, &spill_peers),
                peers: spill_peers,
                by_binding: out.spill_rows,
            });
        }
        if let Some(feed) = &self.lease {
            let mut redis_held: Vec<String> =
                self.redis_lost.iter().chain(&self.dead).cloned().collect();
            redis_held.sort();
            redis_held.dedup();
            let view = View {
                self_id: self.self_id.clone(),
                members,
                terms: out.terms,
                idle_terms: out.idle_terms,
                demand: out.demand,
                settled,
                redis_held,
            };
            *feed.view.write() = Arc::new(view);
            if let Some(book) = &feed.book {
                let _nudged = book.on_round();
            }
        }
    }
}

/// The members' addresses, and those of the peers that accept spilled
/// requests (each peer's room per key this round: `crate::sync::spill`).
fn addresses(members: &[Member], self_id: &str) -> (Vec<MemberAddr>, Vec<MemberAddr>) {
    let addrs: Vec<MemberAddr> = (members.iter())
        .map(|m| MemberAddr {
            id: m.id.to_string(),
            rpc: m.metadata.rpc_addr.clone(),
            rpc_version: m.metadata.rpc_version,
        })
        .collect();
    let spill_peers = (members.iter().zip(&addrs))
        .filter(|(m, addr)| addr.id != self_id && m.metadata.spills)
        .map(|(_, addr)| addr.clone())
        .collect();
    (addrs, spill_peers)
}
