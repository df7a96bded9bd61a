//! Pure helpers of the round: a key's lease terms (shares, borrowing, floors
//! for the unreachable), spill room per peer, and the figures they start from.

use super::*;

/// What is known about a cut: the unreachable members and the key's demands
/// frozen when they became unreachable.
#[derive(Clone, Copy)]
pub(super) struct Cut<'a> {
    pub(super) dead: &'a [String],
    /// Every vector frozen while the cut goes on (empty: none).
    pub(super) frozen: &'a [&'a [(String, u64)]],
    /// The least the unreachable are charged in all (what peers that saw the
    /// cut begin charge, for a node that did not: `super::cut`).
    pub(super) at_least: u64,
}

/// The figure published for a told cut-off share: rounded up to a sixteenth of
/// `capacity` (at least 1), never above it; 0 stays 0.
pub(super) fn held_figure(told: u64, capacity: u64) -> u64 {
    let step = (capacity / 16).max(1);
    told.div_ceil(step)
        .saturating_mul(step)
        .min(capacity.max(told))
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
/// Concurrency has no floors: an unreachable member's
/// slots come back with its credit's ttl (a crashed node's streams died with it).
pub(super) fn lease_terms(
    usage: &ClusterUsage,
    cut: &Cut<'_>,
    demands: &[(String, u64)],
    held: BTreeMap<String, u64>,
    binding: &Binding,
    max_borrow: f64,
    now_ms: u64,
) -> Terms<String> {
    let Cut {
        dead,
        frozen,
        at_least,
    } = *cut;
    // Max-min fair, not proportional: near-equal demands jitter, and proportional
    // shares of a saturated key jittered with them (`fair_shares`' docs).
    use tollgate_cluster::share::fair_shares;
    let current: BTreeMap<String, u64> =
        fair_shares(binding.capacity, demands).into_iter().collect();
    let windowed = binding.dimension != Dimension::Concurrency;
    if dead.is_empty() || !windowed {
        let borrow = if dead.is_empty() {
            (binding.capacity as f64 * max_borrow) as u64
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
    let at_cut = if frozen.is_empty() {
        fair_shares(binding.capacity, demands).into_iter().collect()
    } else {
        most_share(binding.capacity, frozen, fair_shares)
    };
    let mut floors = BTreeMap::new();
    for node in dead {
        // +1: largest-remainder rounding of two sides' (nearly equal) vectors may
        // differ by one unit per member.
        let share = at_cut.get(node).map_or(0, |s| s.saturating_add(1));
        let published = usage.usage_of(node, &binding.key, now_ms).unwrap_or(0);
        floors.insert(node.clone(), share.max(published).min(binding.capacity));
    }
    raise_floors(&mut floors, at_least.min(binding.capacity));
    let charged: u64 = floors.values().sum();
    let live = fair_shares(binding.capacity.saturating_sub(charged), demands);
    Terms {
        shares: live.into_iter().collect(),
        borrow: 0,
        floors,
        held,
    }
}

/// Each peer's room on a leased key: its share plus borrowing, less what it
/// last published it used (requests in flight for concurrency).
pub(super) fn spill_room(
    usage: &ClusterUsage,
    terms: &Terms<String>,
    binding: &Binding,
    peers: &[MemberAddr],
    now_ms: u64,
) -> Vec<AtomicU64> {
    let in_flight = (binding.dimension == Dimension::Concurrency)
        .then(|| usage.in_flight_by_node(&binding.key));
    (peers.iter())
        .map(|peer| {
            let share = (terms.shares.get(&peer.id)).map_or(0, |s| s.saturating_add(terms.borrow));
            let used = match &in_flight {
                Some(by_node) => (by_node.iter())
                    .find(|(node, _)| *node == peer.id)
                    .map_or(0, |(_, n)| *n),
                None => usage.usage_of(&peer.id, &binding.key, now_ms).unwrap_or(0),
            };
            AtomicU64::new(share.saturating_sub(used))
        })
        .collect()
}

/// Each member's largest share of `capacity` by `rule` over the vectors frozen
/// during a cut. Sides of a cut froze (nearly) the same vectors at its start,
/// but a second member becoming unreachable freezes again on one side only, at
/// figures that moved since: the far side may still hold any earlier one, so a
/// member is charged the most any of them gives it (shares of one vector sum to
/// L; the most of several only charges the unreachable more).
pub(super) fn most_share(
    capacity: u64,
    frozen: &[&[(String, u64)]],
    rule: ShareRule,
) -> BTreeMap<String, u64> {
    let mut most = BTreeMap::new();
    for vector in frozen {
        for (node, share) in rule(capacity, vector) {
            let at = most.entry(node).or_insert(0);
            *at = share.max(*at);
        }
    }
    most
}

/// Raises `floors` to `at_least` in all, the shortfall spread as evenly as the
/// units allow (the first members in order take the remainder).
pub(super) fn raise_floors(floors: &mut BTreeMap<String, u64>, at_least: u64) {
    let total: u64 = floors.values().sum();
    let Some(short) = at_least.checked_sub(total).filter(|s| *s > 0) else {
        return;
    };
    let n = floors.len() as u64;
    if n == 0 {
        return;
    }
    for (i, floor) in floors.values_mut().enumerate() {
        let extra = short / n + u64::from((i as u64) < short % n);
        *floor = floor.saturating_add(extra);
    }
}

/// What unreachable members are charged for `binding`: each its share of the
/// capacity frozen at the demands last seen, or its last published usage if more.
pub(super) fn dead_charge(
    usage: &ClusterUsage,
    dead: &[String],
    frozen: &[&[(String, u64)]],
    binding: &Binding,
    now_ms: u64,
) -> u64 {
    if dead.is_empty() {
        return 0;
    }
    let shares = most_share(binding.capacity, frozen, tollgate_cluster::share::shares);
    dead.iter()
        .map(|node| {
            let share = shares.get(node).copied().unwrap_or(0);
            let published = usage.usage_of(node, &binding.key, now_ms).unwrap_or(0);
            share.max(published)
        })
        .sum()
}
