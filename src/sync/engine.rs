//! The sync engine: every `sync_interval` it publishes this node's usage, reads the
//! cluster's, and recomputes every key's allowance. Off the request path: actors only
//! ever read an atomic.

use super::allowance::{KeyFigures, SyncPolicy, policy};
use super::demand::Demand;
use super::status::{ClusterStatus, MemberStatus};
use crate::actor::scope::{Allowance, ScopeExport};
use crate::actor::{Dimension, ScopeId};
use crate::config::{ClusterConfig, SyncMode};
use crate::proxy::AppState;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tollgate_cluster::counter::{ClusterUsage, LocalCounters, Window};
use tollgate_cluster::membership::Membership;

/// One limit key whose allowance the engine maintains.
#[derive(Debug, Clone)]
pub struct Binding {
    /// Cluster-wide key, e.g. `tenant:acme:tokens`.
    pub key: String,
    /// The actor owning it.
    pub scope: ScopeId,
    /// Which dimension.
    pub dimension: Dimension,
    /// Capacity L (per window, or concurrent).
    pub capacity: u64,
    /// The handle the actor reads.
    pub allowance: Allowance,
}

/// This node's own figures for one key, from its actors.
#[derive(Debug, Default, Clone, Copy)]
struct Own {
    used: u64,
    demand: u64,
}

/// The engine's state.
pub struct Engine {
    state: Arc<AppState>,
    membership: Membership,
    mode: SyncMode,
    policy: Box<dyn SyncPolicy>,
    self_id: String,
    counters: LocalCounters,
    usage: ClusterUsage,
    demand: Demand,
    /// Each key's demand per every member, frozen when a member becomes unreachable:
    /// while anyone is unreachable, the unreachable are charged their share of these
    /// frozen demands. Both sides of a cut freeze (nearly) the same figures, so their
    /// shares sum to L without talking (design.md, "Shares, borrowing and partitions").
    frozen: HashMap<String, Vec<(String, u64)>>,
    /// Each key's demand per node as last seen live: shares of members that became
    /// unreachable are frozen at these values (both sides of a cut agree on them).
    last_demands: HashMap<String, HashMap<String, u64>>,
    /// Members declared dead and not yet garbage-collected, as counter node ids.
    dead: Vec<String>,
    status: Arc<Mutex<ClusterStatus>>,
}

fn key_of(scope: &ScopeId, dimension: Dimension) -> String {
    format!("{scope}:{}", dimension.as_str())
}

impl Engine {
    /// An engine over a started membership.
    pub fn new(
        state: Arc<AppState>,
        membership: Membership,
        config: &ClusterConfig,
        window: Window,
        status: Arc<Mutex<ClusterStatus>>,
    ) -> Engine {
        let self_id = membership.self_id().to_string();
        Engine {
            state,
            membership,
            mode: config.mode,
            policy: policy(config.mode, config.local_share),
            self_id,
            counters: LocalCounters::new(window),
            usage: ClusterUsage::new(window),
            demand: Demand::new(window.window_ms()),
            last_demands: HashMap::new(),
            frozen: HashMap::new(),
            dead: Vec::new(),
            status,
        }
    }

    /// The membership (for shutdown).
    pub fn into_membership(self) -> Membership {
        self.membership
    }

    /// One round: publish, read, recompute.
    pub async fn tick(&mut self) {
        let now_ms = self.state.registry.clock().now_ns() / 1_000_000;
        let exports = self.state.registry.export_live().await;
        let own = self.record_own(&exports, now_ms);
        let published = self.counters.publish(now_ms);
        let bytes: usize = published.iter().map(|(k, v)| k.len() + v.len()).sum();
        let publish_error = match self.membership.set_many(published).await {
            Ok(()) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot publish usage: peers see stale figures from this node");
                Some(e.to_string())
            }
        };
        let decode_errors = self.read_cluster().await;
        let dead = self.membership.dead_members().await;
        let dead_now: Vec<String> = dead.iter().map(ToString::to_string).collect();
        if dead_now.iter().any(|d| !self.dead.contains(d)) {
            // Someone just became unreachable: freeze every member's demand as last
            // seen (the newly dead are still in `last_demands` from their last round).
            self.frozen = self
                .last_demands
                .iter()
                .map(|(key, seen)| {
                    (
                        key.clone(),
                        seen.iter().map(|(n, d)| (n.clone(), *d)).collect(),
                    )
                })
                .collect();
        }
        if dead_now.is_empty() {
            self.frozen.clear();
        }
        self.dead = dead_now;
        self.recompute(&own, now_ms);
        let members = self.membership.live_members().await;
        let metrics = &self.state.metrics;
        metrics.sync_round(bytes as u64, decode_errors, members.len() as i64);
        metrics.degraded("members_unreachable", !self.dead.is_empty());
        metrics.degraded("publish_failed", publish_error.is_some());
        let degraded = match (&publish_error, self.dead.is_empty()) {
            (Some(e), _) => Some(format!("publish_failed: {e}")),
            (None, false) => Some(format!(
                "members_unreachable: {} charged their frozen share until they return or are collected",
                self.dead.join(", ")
            )),
            (None, true) => None,
        };
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        status.members = members.iter().map(MemberStatus::from).collect();
        status.dead = dead.iter().map(ToString::to_string).collect();
        status.last_sync_ms = now_ms;
        status.bytes_published_total += bytes as u64;
        status.decode_errors_total += decode_errors;
        status.duplicate_ids_seen = self.membership.duplicate_ids_seen();
        if status.degraded.is_none() != degraded.is_none() {
            match &degraded {
                Some(reason) => tracing::warn!(%reason, "cluster sync degraded"),
                None => tracing::info!("cluster sync healthy again"),
            }
        }
        status.degraded = degraded;
    }

    /// Feeds this node's exports into the counters; returns its own figures per key.
    fn record_own(
        &mut self,
        exports: &[(ScopeId, ScopeExport)],
        now_ms: u64,
    ) -> HashMap<String, Own> {
        let mut own = HashMap::new();
        for (scope, export) in exports {
            for (dimension, window, requested) in [
                (
                    Dimension::Requests,
                    &export.requests,
                    export.requested_requests,
                ),
                (Dimension::Tokens, &export.tokens, export.requested_tokens),
            ] {
                let Some((_, buckets)) = window else { continue };
                let key = key_of(scope, dimension);
                for (bucket, cost) in buckets {
                    // Bucket indices line up: both clocks count Unix time in buckets of
                    // the same width (validate() pins one window for every limit).
                    if let Err(e) = self.counters.set_bucket(&key, *bucket, *cost, now_ms) {
                        tracing::warn!(%key, error = %e, "usage not published");
                    }
                }
                let demand = self.demand.observe(&key, requested, now_ms);
                let _ = self.counters.set_demand(&key, demand);
                own.insert(
                    key,
                    Own {
                        used: buckets.iter().map(|(_, c)| c).sum(),
                        demand,
                    },
                );
            }
            let key = key_of(scope, Dimension::Concurrency);
            let demand = self.demand.observe(&key, export.requested_requests, now_ms);
            let _ = self.counters.set_in_flight(&key, export.in_flight);
            let _ = self.counters.set_demand(&key, demand);
            own.insert(
                key,
                Own {
                    used: export.in_flight,
                    demand,
                },
            );
        }
        own
    }

    /// Applies every live member's published values; returns how many were refused.
    async fn read_cluster(&mut self) -> u64 {
        let mut refused = 0;
        let mut live = HashSet::new();
        for (member, values) in self.membership.live_values("").await {
            let node = member.to_string();
            for (key, value) in &values {
                if let Err(e) = self.usage.apply(&node, key, value) {
                    refused += 1;
                    tracing::warn!(%node, %key, error = %e, "refused a gossip value");
                }
            }
            live.insert(node);
        }
        live.insert(self.self_id.clone());
        self.usage.retain_nodes(&live);
        refused
    }

    fn recompute(&mut self, own: &HashMap<String, Own>, now_ms: u64) {
        let mut views = std::collections::BTreeMap::new();
        for binding in &self.state.bindings {
            let mine = own.get(&binding.key).copied().unwrap_or(Own {
                used: 0,
                demand: self.demand.current(&binding.key),
            });
            let mut demands = self.usage.demand_by_node(&binding.key);
            match demands.iter_mut().find(|(node, _)| *node == self.self_id) {
                Some(entry) => entry.1 = mine.demand,
                None => demands.push((self.self_id.clone(), mine.demand)),
            }
            let seen = self.last_demands.entry(binding.key.clone()).or_default();
            seen.extend(demands.iter().cloned());
            // Forget members that are neither live nor awaiting GC (bounded memory,
            // and frozen shares are over the members that can still spend).
            seen.retain(|node, _| {
                demands.iter().any(|(n, _)| n == node) || self.dead.contains(node)
            });
            let (others_used, demands) = match (binding.dimension, self.mode) {
                // A crashed node's requests died with it: its slots come back as soon
                // as it is declared dead.
                (Dimension::Concurrency, _) => {
                    let live: u64 = self
                        .usage
                        .in_flight_by_node(&binding.key)
                        .iter()
                        .filter(|(node, _)| *node != self.self_id)
                        .map(|(_, n)| n)
                        .sum();
                    (live, demands)
                }
                // Split: unreachable members keep their equal share until GC, so two
                // sides of a cut never hand out more than L between them.
                (_, SyncMode::Local) => {
                    let mut all = demands;
                    all.extend(self.dead.iter().map(|d| (d.clone(), 0)));
                    (0, all)
                }
                // Gossip: unreachable members are charged their frozen share (or
                // what they last published, if more) until GC.
                _ => {
                    let live =
                        self.usage
                            .global_usage_except(&binding.key, Some(&self.self_id), now_ms);
                    let frozen = self.frozen.get(&binding.key).map_or(&[][..], Vec::as_slice);
                    let dead = dead_charge(&self.usage, &self.dead, frozen, binding, now_ms);
                    views.insert(binding.key.clone(), mine.used.saturating_add(live));
                    (live.saturating_add(dead), demands)
                }
            };
            let figures = KeyFigures {
                capacity: binding.capacity,
                self_id: &self.self_id,
                own_used: mine.used,
                others_used,
                demands: &demands,
            };
            let value = self.policy.allowance(&figures).unwrap_or(u64::MAX);
            binding.allowance.set(value);
        }
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .global_usage = views;
    }
}

/// What unreachable members are charged for `binding`: each its share of the
/// capacity frozen at the demands last seen, or its last published usage if more.
fn dead_charge(
    usage: &ClusterUsage,
    dead: &[String],
    frozen: &[(String, u64)],
    binding: &Binding,
    now_ms: u64,
) -> u64 {
    if dead.is_empty() {
        return 0;
    }
    let shares = tollgate_cluster::share::shares(binding.capacity, frozen);
    dead.iter()
        .map(|node| {
            let share = shares
                .iter()
                .find(|(n, _)| n == node)
                .map_or(0, |(_, s)| *s);
            let published = usage.usage_of(node, &binding.key, now_ms).unwrap_or(0);
            share.max(published)
        })
        .sum()
}
