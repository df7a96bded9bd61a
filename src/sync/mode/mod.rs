//! One sync round's arithmetic, one file per mode, behind one trait.
//!
//! Each round the engine (`super::engine`, the async shell) reads the cluster's
//! counters, the members and what it knows about cuts, and hands every bound key
//! to the configured [`Mode`] as plain figures ([`Round`], [`KeyInput`]). The
//! mode writes what the key's bound is this round into an [`Output`]; the engine
//! then applies it (allowances, Redis caps and fallbacks, the lease view, the
//! spill room). Nothing here locks, awaits or reads a clock, so one conformance
//! suite (`conformance`) runs every mode's round over simulated members, cuts
//! and time, beside the real-UDP suite and the jepsen harness.
//!
//! - [`local`]: `local full` (no bound) and `local split` (equal shares of L).
//! - [`gossip`]: a demand-weighted share of the headroom the counters show.
//! - [`lease`]: each key's terms (shares, borrowing, floors) for its owner.
//! - [`redis_lease`]: `lease`'s terms, with Redis as every key's owner.
//! - [`redis`]: the capacity asked of Redis, and the fallback while it is lost.
//! - [`floors`]: what a cut charges the unreachable, shared by the modes.
//!
//! Promises and arguments: docs/design/cluster.md.

pub(crate) mod floors;
pub(crate) mod gossip;
pub(crate) mod lease;
pub(crate) mod local;
pub(crate) mod redis;
pub(crate) mod redis_lease;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod tests;

use super::lease::MemberAddr;
use super::partition::redis_loss::Loss;
use super::spill::Row;
use crate::actor::{Binding, Dimension};
use crate::config::{ClusterConfig, SyncMode};
use std::collections::HashMap;
use std::sync::Arc;
use tollgate_cluster::counter::ClusterUsage;
use tollgate_cluster::lease::line::Terms;

/// A sync mode's round: one key at a time, from figures to bounds.
pub(crate) trait Mode: Send + Sync {
    /// The promise the mode makes (docs/design/cluster.md has the argument).
    fn promise(&self) -> &'static str;

    /// Writes `key`'s bound this round into `out`.
    fn key(&self, round: &Round<'_>, key: &KeyInput<'_>, out: &mut Output);
}

/// The configured mode's round.
pub(crate) fn of(config: &ClusterConfig) -> Box<dyn Mode> {
    match config.mode {
        SyncMode::Local => Box::new(local::Local {
            share: config.local_share,
        }),
        SyncMode::Gossip => Box::new(gossip::Gossip),
        SyncMode::Lease => Box::new(lease::Lease),
        SyncMode::Redis => Box::new(redis::Redis {
            cut_off: config.lease.cut_off,
        }),
        SyncMode::RedisLease => Box::new(redis_lease::RedisLease),
    }
}

/// What one round knows of the whole cluster, the same for every key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Round<'a> {
    /// This node's member id (its counter node id).
    pub self_id: &'a str,
    /// The cluster's counters as read this round.
    pub usage: &'a ClusterUsage,
    /// The round's time (unix ms).
    pub now_ms: u64,
    /// Members declared dead and not yet collected, that may still be spending
    /// on the far side of a cut (departed and superseded ones left out).
    pub dead: &'a [String],
    /// `lease`: borrowing beyond shares as a fraction of L, 0 while some
    /// member's last round is too old here to prove the lenders live.
    pub borrow: f64,
    /// Peers that accept spilled requests, when this node spills (`lease`).
    pub spill_peers: Option<&'a [MemberAddr]>,
    /// `local split` during a cut: the members at the cut this side divides L
    /// by (`partition::cut::split_members`); `None` while nobody is unreachable.
    pub split_at_cut: Option<&'a [String]>,
    /// `redis`: what a loss of Redis means this round.
    pub redis: RedisRound<'a>,
}

/// `redis` mode's figures for a round.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RedisRound<'a> {
    /// Whether this node has lost Redis now.
    pub lost: bool,
    /// What this node divides each capacity by when it spends locally: its
    /// loss's divisor, fixed when the loss began, or what one beginning now
    /// would use.
    pub divisor: u64,
    /// The peers' losses this node charges in Redis.
    pub charged: &'a [Loss],
}

/// This node's own figures for one key, from its actors.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Own {
    /// Its usage now: the local window, or requests in flight.
    pub used: u64,
    /// `used` as every peer has surely seen it (`partition::echo`); `used`
    /// for concurrency, which is not re-carved (a slot is taken or not).
    pub seen: u64,
    /// What was asked of this node over the last window, admitted or not.
    pub demand: u64,
}

/// One bound key's figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyInput<'a> {
    /// The key's binding index on this node (the spill room is by index).
    pub index: u32,
    /// The key, its actor, its dimension and its capacity L.
    pub binding: &'a Binding,
    /// This node's own figures.
    pub own: Own,
    /// Demand per member taking part in the split, this node's own read as its
    /// peers have it (`partition::history`).
    pub demands: &'a [(String, u64)],
    /// Every demand vector frozen while the cut goes on (empty: no cut).
    pub frozen: &'a [&'a [(String, u64)]],
    /// What the live peers published they use.
    pub others_live: u64,
    /// What a node that did not see the cut begin charges the unreachable at
    /// least: the most its peers charge (`partition::cut`); `None` otherwise.
    pub adopted: Option<u64>,
}

impl KeyInput<'_> {
    /// The key's cluster-wide usage by this node's figures.
    pub(crate) fn global(&self) -> u64 {
        self.own.used.saturating_add(self.others_live)
    }

    fn windowed(&self) -> bool {
        self.binding.dimension != Dimension::Concurrency
    }
}

/// What a round decided, for the engine to apply.
#[derive(Debug, Default)]
pub(crate) struct Output {
    /// New allowances by binding index (`local split`, `gossip`; `redis`'s
    /// fallback): `u64::MAX` for none.
    pub allowances: Vec<(u32, u64)>,
    /// What this node charges the unreachable per key, for nodes that join the
    /// cut later (`partition::cut`).
    pub cut_charges: Vec<(Arc<str>, u64)>,
    /// `redis`: the capacity asked of Redis per key.
    pub redis_caps: HashMap<String, u64>,
    /// `redis`: each key's fallback while Redis is lost.
    pub redis_fallback: Vec<RedisFallback>,
    /// Leased modes: the terms of each key with demand or a cut.
    pub terms: HashMap<String, Arc<Terms<String>>>,
    /// Leased modes: per capacity, the terms every idle key of it shares.
    pub idle_terms: HashMap<u64, Arc<Terms<String>>>,
    /// Leased modes: this node's demand per key (absent when 0).
    pub demand: HashMap<String, u64>,
    /// Spillover: each peer's room per binding index of a key with demand.
    pub spill_rows: HashMap<u32, Row>,
}

/// `redis`: one key's fallback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RedisFallback {
    /// The binding index.
    pub index: u32,
    /// What this node may spend while Redis is lost (the cut-off policy's).
    pub own: u64,
    /// What its peers charge it in Redis meanwhile.
    pub charged: u64,
}

impl Output {
    fn allow(&mut self, key: &KeyInput<'_>, allowance: u64) {
        if key.binding.allowance.is_some() {
            self.allowances.push((key.index, allowance));
        }
    }

    /// Records a charge of the unreachable worth telling a later joiner: above
    /// one unit per unreachable member (what a quiet key is charged anyway).
    fn charge_cut(&mut self, round: &Round<'_>, key: &KeyInput<'_>, charge: u64) {
        if !round.dead.is_empty() && charge > round.dead.len() as u64 {
            self.cut_charges
                .push((Arc::clone(&key.binding.key), charge));
        }
    }
}

fn share_of(node: &str, shares: &[(String, u64)]) -> Option<u64> {
    shares.iter().find(|(n, _)| n == node).map(|(_, s)| *s)
}
