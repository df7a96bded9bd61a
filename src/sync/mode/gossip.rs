//! `gossip`: each node's allowance is what it used plus a demand-weighted share
//! of the headroom its figures show (L less everyone's usage, the unreachable
//! charged their frozen share). Every node computes every share from the same
//! published figures, so the allowances sum to L up to what gossip has not yet
//! carried: the overshoot is bounded by the lag, and measured.

use super::floors::dead_charge;
use super::{KeyInput, Mode, Output, Round, share_of};
use crate::actor::Dimension;
use tollgate_cluster::share::shares_with_floor;

/// `gossip` mode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gossip;

impl Mode for Gossip {
    fn promise(&self) -> &'static str {
        "gossip: cluster total <= L x (1 + e), e from gossip lag, measured"
    }

    fn key(&self, round: &Round<'_>, key: &KeyInput<'_>, out: &mut Output) {
        let binding = key.binding;
        let others_used = if binding.dimension == Dimension::Concurrency {
            // A crashed node's requests died with it: its slots come back as
            // soon as it is declared dead.
            (round.usage.in_flight_by_node(&binding.key).iter())
                .filter(|(node, _)| *node != round.self_id)
                .map(|(_, n)| n)
                .sum()
        } else {
            // Unreachable members are charged their frozen share (or what they
            // last published, if more) until collected; other departed members
            // (a restarted node's previous incarnation, before it is declared
            // dead) what they last published.
            let dead = dead_charge(round, key).max(key.adopted.unwrap_or(0));
            out.charge_cut(round, key, dead);
            let departed =
                (round.usage).departed_usage_except(&binding.key, round.dead, round.now_ms);
            key.others_live
                .saturating_add(dead)
                .saturating_add(departed)
        };
        let figures = Figures {
            capacity: binding.capacity,
            self_id: round.self_id,
            own_used: key.own.used,
            own_seen: key.own.seen,
            others_used,
            demands: key.demands,
        };
        out.allow(key, allowance(&figures));
    }
}

/// The figures one key's gossip allowance is computed from.
#[derive(Debug, Clone)]
pub(crate) struct Figures<'a> {
    /// The key's capacity L (per window, or concurrent for concurrency).
    pub capacity: u64,
    /// This node's id.
    pub self_id: &'a str,
    /// This node's own usage now (its local window, or its requests in flight).
    pub own_used: u64,
    /// `own_used` as every peer has surely seen it: less what this node added
    /// within one propagation bound (`partition::echo`). What the peers charge it.
    pub own_seen: u64,
    /// What the other members are charged: live members' published usage, plus
    /// unreachable members' frozen shares.
    pub others_used: u64,
    /// Demand per member that takes part in the split (this node included).
    pub demands: &'a [(String, u64)],
}

/// This node's gossip allowance.
///
/// Counts this node as its peers see it, so that it computes the allowance
/// they compute for it: its share of the headroom is what its unpublished
/// spending comes out of, not a fresh share on top of it (which each peer,
/// blind to that spending, would also hand itself; `partition::echo`). It may be
/// below `own_used` then: nothing more until the others catch up.
///
/// Half of the headroom is spread equally, as every member's floor, and the
/// rest goes by demand. By demand alone a node whose demand its peers do not
/// see yet would get none of it: every node reads its own demand as its peers
/// have it, a failure-detection time late (`partition::history`), so a tenant
/// that begins on a second node would be refused there for up to 2 s while
/// the first holds all the headroom (one tenant sent to 3 nodes at 1,000
/// requests/s under limits it never nears: p99 455 ms, allowance 0, in
/// `gossip`, against 6.5 ms in `lease`). The shares still sum to the headroom
/// and are the same function of the same figures on every node, so the
/// bound is unchanged. Where the headroom is under two units per member the
/// floor is 0 and it all goes by demand: a freed slot must reach the node
/// that queues for it (the jepsen ghost-slot check).
pub(crate) fn allowance(f: &Figures<'_>) -> u64 {
    let own = f.own_seen.min(f.own_used);
    let global = own.saturating_add(f.others_used);
    let headroom = f.capacity.saturating_sub(global);
    let floor = headroom / (2 * f.demands.len().max(1) as u64);
    let shares = shares_with_floor(headroom, f.demands, floor);
    let mine = share_of(f.self_id, &shares).unwrap_or(0);
    own.saturating_add(mine)
}
