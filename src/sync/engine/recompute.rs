//! The round's arithmetic: every bound key's allowance (`local split`,
//! `gossip`), Redis caps and fallbacks (`redis`), lease terms and views
//! (`lease`, `redis-lease`) and spill room, from the figures the round read.

use super::*;

impl Engine {
    /// Sets every bound key's bound for this round from the figures read.
    #[expect(
        clippy::too_many_lines,
        reason = "the sync round; one core per mode is an open gap (docs/design/architecture.md)"
    )]
    pub(super) fn recompute(
        &mut self,
        own: &HashMap<String, Own>,
        members: &[Member],
        now_ms: u64,
        settled: bool,
    ) {
        let node = Arc::clone(&self.node);
        let horizon_ms = self.horizon_ms(now_ms);
        // `redis`: what this node divides each capacity by when it spends locally:
        // its loss's fixed divisor, or what a loss beginning now would use.
        let redis_divisor = (self.own_redis_loss())
            .map_or_else(|| self.redis_losses.known_members(), |l| l.divisor);
        let mut views = std::collections::BTreeMap::new();
        let usage_guard = Arc::clone(&self.usage);
        let usage = lock(&usage_guard);
        let mut redis_caps = HashMap::new();
        // Per capacity: the terms every idle key of that capacity shares this round.
        let mut idle_terms: HashMap<u64, Arc<Terms<String>>> = HashMap::new();
        let mut redis_fallback = HashMap::new();
        let mut lease_view = View {
            self_id: self.self_id.clone(),
            members: (members.iter())
                .map(|m| MemberAddr {
                    id: m.id.to_string(),
                    rpc: m.metadata.rpc_addr.clone(),
                    rpc_version: m.metadata.rpc_version,
                })
                .collect(),
            settled,
            redis_held: {
                let mut held: Vec<String> =
                    self.redis_lost.iter().chain(&self.dead).cloned().collect();
                held.sort();
                held.dedup();
                held
            },
            ..View::default()
        };
        // Every key's demand vector lists the same members (each live one, 0 when
        // it published nothing for the key).
        let mut live_nodes = usage.live_nodes();
        live_nodes.push(self.self_id.clone());
        self.history.set_members(&live_nodes, &self.dead);
        // Spillover: each peer's room per key this round (`super::spill`),
        // for the peers that accept spilled requests.
        let spill_peers: Vec<MemberAddr> = (members.iter().zip(&lease_view.members))
            .filter(|(m, addr)| addr.id != self.self_id && m.metadata.spills)
            .map(|(_, addr)| addr.clone())
            .collect();
        let mut spill_rows = HashMap::new();
        for (index, binding) in node.bindings.iter().enumerate() {
            let mine = own.get(&*binding.key).copied().unwrap_or(Own {
                used: 0,
                seen: 0,
                demand: self.demand.current(&binding.key),
            });
            // This node's own figure in `demands` becomes its demand as it stood
            // one failure-detection time ago: what every peer has surely received.
            // The figures frozen at a cut use it: with the fresh own figure (which
            // keeps growing with refused demand during a cut) this side would grant
            // itself more than the other side charges it; the jepsen harness
            // measures that as a 2.5% overshoot of lease mode under partition.
            let mut demands = usage.demand_by_node(&binding.key);
            self.history.observe(
                &binding.key,
                mine.demand,
                &mut demands,
                &self.self_id,
                &self.dead,
                (horizon_ms, now_ms),
            );
            // This node's view of the key's global usage (admin), one read for
            // every mode.
            let others_live = usage.global_usage_except(&binding.key, Some(&self.self_id), now_ms);
            // Keys nobody used in the window are left out (read as 0): a copy of
            // every configured key's name each round would be ~160 B per idle
            // tenant.
            let global = mine.used.saturating_add(others_live);
            if binding.dimension != Dimension::Concurrency && global > 0 {
                views.insert(binding.key.to_string(), global);
            }
            if let (Some(gate), Some(allowance)) = (&self.redis_gate, &binding.allowance) {
                // `redis`: Redis is the bound; the allowance is only the fallback
                // while Redis is lost. Peers that lost Redis are charged what each
                // announced it may spend, `capacity / its divisor`, by lowering the
                // capacity asked of Redis (`super::redis_loss`).
                // The fallback (policy `share`): windows fall back to gossip mode's
                // rule, this node's demand-weighted share of the headroom the
                // counters show (what others already spent through Redis counts:
                // a plain share of L would add to it; the harness measures 5%);
                // concurrency to an equal share of the slots.
                let share = match binding.dimension {
                    Dimension::Concurrency => binding.capacity / redis_divisor,
                    _ => {
                        let figures = KeyFigures {
                            capacity: binding.capacity,
                            self_id: &self.self_id,
                            own_used: mine.used,
                            own_seen: mine.seen,
                            others_used: others_live,
                            demands: &demands,
                        };
                        crate::sync::allowance::GossipPolicy
                            .allowance(&figures)
                            .unwrap_or(0)
                    }
                };
                let own = match self.cut_off {
                    CutOff::Share => share,
                    CutOff::FailClosed => 0,
                    CutOff::FailOpen => u64::MAX,
                };
                let lost: u64 = (self.redis_losses.charged())
                    .map(|loss| loss.share_of(binding.capacity))
                    .sum();
                redis_caps.insert(
                    binding.key.to_string(),
                    binding.capacity.saturating_sub(lost),
                );
                redis_fallback.insert(
                    binding.key.to_string(),
                    Fallback {
                        allowance: allowance.clone(),
                        own,
                        charged: match self.cut_off {
                            CutOff::FailOpen => u64::MAX,
                            _ => binding.capacity / redis_divisor,
                        },
                    },
                );
                if allowance.set(if gate.is_lost() { own } else { u64::MAX }) {
                    self.node.registry.wake(&binding.scope);
                }
                continue;
            }
            // What a node that did not see the cut begin charges at least: the
            // most its peers charge, or all of L while none has told it.
            let adopted = (self.unwitnessed && binding.dimension != Dimension::Concurrency)
                .then(|| (self.cut.adopted_charge(&binding.key)).unwrap_or(binding.capacity));
            if let Some(feed) = &self.lease {
                let frozen = self.history.frozen_all(&binding.key);
                let cut = Cut {
                    dead: &self.dead,
                    frozen: &frozen,
                    at_least: adopted.unwrap_or(0),
                };
                let borrow = if self.lag_ms <= feed.fresh_within_ms {
                    feed.max_borrow
                } else {
                    0.0
                };
                // Every idle key of one capacity has the same terms this round (no
                // demand anywhere, nobody cut off, the same members): one copy.
                // The cut-off shares peers say they hold (an idle key has none).
                let held = usage.held_by_node(&binding.key);
                let idle =
                    self.dead.is_empty() && demands.iter().all(|(_, d)| *d == 0) && held.is_empty();
                let make = || {
                    Arc::new(lease_terms(
                        &usage,
                        &cut,
                        &demands,
                        held.clone(),
                        binding,
                        borrow,
                        now_ms,
                    ))
                };
                if idle {
                    idle_terms.entry(binding.capacity).or_insert_with(&make);
                } else {
                    let terms = make();
                    if node.spill.is_some() {
                        let free = match binding.dimension {
                            Dimension::Concurrency => u64::MAX,
                            _ => binding.capacity.saturating_sub(global),
                        };
                        let peers = spill_room(&usage, &terms, binding, &spill_peers, now_ms);
                        let free = AtomicU64::new(free);
                        let own = (terms.shares.get(&self.self_id))
                            .map_or(0, |s| s.saturating_add(terms.borrow))
                            .saturating_sub(mine.used);
                        spill_rows.insert(index as u32, Row { free, own, peers });
                    }
                    self.record_cut_charge(&binding.key, terms.floors.values().sum());
                    lease_view.terms.insert(binding.key.to_string(), terms);
                }
                if mine.demand > 0 {
                    // Read as 0 when absent: an idle key costs no entry.
                    lease_view
                        .demand
                        .insert(binding.key.to_string(), mine.demand);
                }
                continue;
            }
            let mut capacity = binding.capacity;
            let (others_used, demands) = match (binding.dimension, self.mode) {
                // A crashed node's requests died with it: its slots come back as soon
                // as it is declared dead.
                (Dimension::Concurrency, _) => {
                    let live: u64 = usage
                        .in_flight_by_node(&binding.key)
                        .iter()
                        .filter(|(node, _)| *node != self.self_id)
                        .map(|(_, n)| n)
                        .sum();
                    (live, demands)
                }
                // Split: during a cut, this side's part of L, by its members at the
                // cut, goes equally to those live now (a node that joined since
                // shares it), so two sides never hand out more than L between them.
                (_, SyncMode::Local) if !self.dead.is_empty() => {
                    capacity = self.split_budget(binding.capacity);
                    (0, demands)
                }
                (_, SyncMode::Local) => (0, demands),
                // Gossip: unreachable members are charged their frozen share (or
                // what they last published, if more) until GC; other departed
                // members (a restarted node's previous incarnation, before it is
                // declared dead) what they last published.
                _ => {
                    let frozen = self.history.frozen_all(&binding.key);
                    let dead = dead_charge(&usage, &self.dead, &frozen, binding, now_ms)
                        .max(adopted.unwrap_or(0));
                    self.record_cut_charge(&binding.key, dead);
                    let departed = usage.departed_usage_except(&binding.key, &self.dead, now_ms);
                    let others = others_live.saturating_add(dead).saturating_add(departed);
                    (others, demands)
                }
            };
            let figures = KeyFigures {
                capacity,
                self_id: &self.self_id,
                own_used: mine.used,
                own_seen: mine.seen,
                others_used,
                demands: &demands,
            };
            if let Some(allowance) = &binding.allowance
                && allowance.set(self.policy.allowance(&figures).unwrap_or(u64::MAX))
            {
                // Waiters held back by the old figure are admitted now rather than
                // at their next re-check (up to ALLOWANCE_RETRY_HINT_NS later): a
                // freed slot in `gossip` reached a waiting node ~0.25 s late.
                self.node.registry.wake(&binding.scope);
            }
        }
        drop(usage);
        if let Some(gate) = &self.redis_gate {
            gate.set_caps(redis_caps);
            gate.set_fallback(redis_fallback);
            let epoch = gate.lost_since();
            let alone_by_design = self.membership.seeds_configured() == 0;
            let confirmed = self.cut_off == CutOff::FailOpen
                || self.redis_losses.confirmed(epoch, alone_by_design);
            gate.set_confirmed(if confirmed { epoch } else { 0 });
        }
        if let Some(board) = &node.spill {
            let idle = (idle_terms.iter())
                .map(|(capacity, terms)| {
                    let shares = (spill_peers.iter())
                        .map(|p| terms.shares.get(&p.id).map_or(0, |s| s + terms.borrow))
                        .collect();
                    (*capacity, shares)
                })
                .collect();
            board.set(Room {
                peers: spill_peers,
                by_binding: spill_rows,
                idle,
            });
        }
        if let Some(feed) = &self.lease {
            lease_view.idle_terms = idle_terms;
            *feed.view.write() = Arc::new(lease_view);
            if let Some(book) = &feed.book {
                let _nudged = book.on_round();
            }
        }
        self.status.lock().global_usage = views;
    }
}
