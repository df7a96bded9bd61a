//! What a cut charges the unreachable. Both sides of a cut froze (nearly) the
//! same demand vectors when it began, so the shares each side charges the other
//! are the same function of the same figures: the two sides' spending sums to at
//! most L without their talking (docs/design/cluster.md, "Partitions").

use super::{KeyInput, Round};
use std::collections::BTreeMap;

/// How a vector of demands divides a capacity (`share::shares`, `fair_shares`).
pub(crate) type ShareRule = fn(u64, &[(String, u64)]) -> Vec<(String, u64)>;

/// Each member's largest share of `capacity` by `rule` over the vectors frozen
/// during a cut. Sides of a cut froze (nearly) the same vectors at its start,
/// but a second member becoming unreachable freezes again on one side only, at
/// figures that moved since: the far side may still hold any earlier one, so a
/// member is charged the most any of them gives it (shares of one vector sum to
/// L; the most of several only charges the unreachable more).
pub(crate) fn most_share(
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
pub(crate) fn raise_floors(floors: &mut BTreeMap<String, u64>, at_least: u64) {
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

/// What the unreachable are charged for a key in `gossip`: each its share of
/// the capacity by the demands frozen at the cut (proportional, as gossip's
/// own shares are), or its last published usage if more.
pub(crate) fn dead_charge(round: &Round<'_>, key: &KeyInput<'_>) -> u64 {
    if round.dead.is_empty() {
        return 0;
    }
    let binding = key.binding;
    let shares = most_share(
        binding.capacity,
        key.frozen,
        tollgate_cluster::share::shares,
    );
    (round.dead.iter())
        .map(|node| {
            let share = shares.get(node).copied().unwrap_or(0);
            let published = (round.usage)
                .usage_of(node, &binding.key, round.now_ms)
                .unwrap_or(0);
            share.max(published)
        })
        .sum()
}
