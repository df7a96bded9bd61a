//! `lease`: each key's owner grants credit within the key's terms, which every
//! node computes from the same published figures: healthy, each member's
//! max-min fair share of L by demand, plus borrowing; while members are
//! unreachable, a floor for each (its share of L by the demands frozen at the
//! cut), the live sharing what is left. Holders spend only credit granted, so
//! the cluster stays within L however stale the figures (docs/design/lease.md).

use super::floors::{most_share, raise_floors};
use super::{KeyInput, Mode, Output, Round};
use crate::actor::Dimension;
use crate::sync::lease::MemberAddr;
use crate::sync::spill::Row;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tollgate_cluster::lease::line::Terms;
use tollgate_cluster::share::fair_shares;

/// `lease` mode: peers own the keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lease;

impl Mode for Lease {
    fn promise(&self) -> &'static str {
        "lease: cluster total <= L; in a partition <= L + borrowed credit"
    }

    fn key(&self, round: &Round<'_>, key: &KeyInput<'_>, out: &mut Output) {
        leased_key(round, key, out);
    }
}

/// One leased key's part of the round (`lease` and `redis-lease` alike: the
/// terms are the same; only who grants within them differs).
pub(crate) fn leased_key(round: &Round<'_>, key: &KeyInput<'_>, out: &mut Output) {
    let binding = key.binding;
    // The cut-off shares peers say they hold (an idle key has none).
    let held = round.usage.held_by_node(&binding.key);
    // Every idle key of one capacity has the same terms this round (no demand
    // anywhere, nobody cut off, the same members): one copy.
    let idle = round.dead.is_empty() && key.demands.iter().all(|(_, d)| *d == 0) && held.is_empty();
    if idle {
        (out.idle_terms.entry(binding.capacity))
            .or_insert_with(|| Arc::new(terms(round, key, held)));
    } else {
        let terms = Arc::new(terms(round, key, held));
        if let Some(peers) = round.spill_peers {
            out.spill_rows
                .insert(key.index, spill_row(round, key, &terms, peers));
        }
        out.charge_cut(round, key, terms.floors.values().sum());
        out.terms.insert(binding.key.to_string(), terms);
    }
    if key.own.demand > 0 {
        // Read as 0 when absent: an idle key costs no entry.
        out.demand.insert(binding.key.to_string(), key.own.demand);
    }
}

/// A key's lease terms.
///
/// Healthy: every member's max-min fair share of L by gossiped demand
/// (`share::fair_shares`); borrowing allowed.
/// While members are unreachable (windowed keys): each is charged a floor, its
/// share of L by the demands **frozen at the cut** (both sides froze the same
/// figures, so they agree without talking) or its last published usage if more;
/// the live members share what is left by their *current* demand (a member that
/// was idle at the cut can still get a share, and this side's total stays within
/// its frozen shares). A holder's cut-off share is not decided here but told by
/// its owner with each reply (`SyncReply::cut_off_share`), from these shares.
/// Concurrency has no floors: an unreachable member's slots come back with its
/// credit's ttl (a crashed node's streams died with it).
pub(crate) fn terms(
    round: &Round<'_>,
    key: &KeyInput<'_>,
    held: BTreeMap<String, u64>,
) -> Terms<String> {
    let binding = key.binding;
    let capacity = binding.capacity;
    // Max-min fair, not proportional: near-equal demands jitter, and proportional
    // shares of a saturated key jittered with them (`fair_shares`' docs).
    let current: BTreeMap<String, u64> = fair_shares(capacity, key.demands).into_iter().collect();
    let windowed = binding.dimension != Dimension::Concurrency;
    if round.dead.is_empty() || !windowed {
        let borrow = if round.dead.is_empty() {
            (capacity as f64 * round.borrow) as u64
        } else {
            0
        };
        return Terms {
            shares: current,
            borrow,
            floors: BTreeMap::new(),
            held,
        };
    }
    let at_cut = if key.frozen.is_empty() {
        current
    } else {
        most_share(capacity, key.frozen, fair_shares)
    };
    let mut floors = BTreeMap::new();
    for node in round.dead {
        // +1: largest-remainder rounding of two sides' (nearly equal) vectors may
        // differ by one unit per member.
        let share = at_cut.get(node).map_or(0, |s| s.saturating_add(1));
        let published = (round.usage)
            .usage_of(node, &binding.key, round.now_ms)
            .unwrap_or(0);
        floors.insert(node.clone(), share.max(published).min(capacity));
    }
    raise_floors(&mut floors, key.adopted.unwrap_or(0).min(capacity));
    let charged: u64 = floors.values().sum();
    let live = fair_shares(capacity.saturating_sub(charged), key.demands);
    Terms {
        shares: live.into_iter().collect(),
        borrow: 0,
        floors,
        held,
    }
}

/// One key's spill room: what the cluster has left of L, this node's own room,
/// and each peer's (its share plus borrowing, less what it last published it
/// used; requests in flight for concurrency).
fn spill_row(
    round: &Round<'_>,
    key: &KeyInput<'_>,
    terms: &Terms<String>,
    peers: &[MemberAddr],
) -> Row {
    let binding = key.binding;
    let concurrency = binding.dimension == Dimension::Concurrency;
    let free = if concurrency {
        u64::MAX
    } else {
        binding.capacity.saturating_sub(key.global())
    };
    let in_flight = concurrency.then(|| round.usage.in_flight_by_node(&binding.key));
    let peers = (peers.iter())
        .map(|peer| {
            let share = (terms.shares.get(&peer.id)).map_or(0, |s| s.saturating_add(terms.borrow));
            let used = match &in_flight {
                Some(by_node) => (by_node.iter())
                    .find(|(node, _)| *node == peer.id)
                    .map_or(0, |(_, n)| *n),
                None => (round.usage)
                    .usage_of(&peer.id, &binding.key, round.now_ms)
                    .unwrap_or(0),
            };
            AtomicU64::new(share.saturating_sub(used))
        })
        .collect();
    let own = (terms.shares.get(round.self_id))
        .map_or(0, |s| s.saturating_add(terms.borrow))
        .saturating_sub(key.own.used);
    Row {
        free: AtomicU64::new(free),
        own,
        peers,
    }
}

/// Each peer's share (plus borrowing) of an idle key, per capacity: the spill
/// room of every key nobody asks for.
pub(crate) fn idle_room(
    idle_terms: &HashMap<u64, Arc<Terms<String>>>,
    peers: &[MemberAddr],
) -> HashMap<u64, Vec<u64>> {
    (idle_terms.iter())
        .map(|(capacity, terms)| {
            let shares = (peers.iter())
                .map(|p| terms.shares.get(&p.id).map_or(0, |s| s + terms.borrow))
                .collect();
            (*capacity, shares)
        })
        .collect()
}
