//! Demand-weighted shares of a capacity that always sum to it (docs/design/lease.md,
//! "Shares, borrowing and partitions").
//!
//! Every live member `j` gets a share `s_j` of a key's capacity `L`, proportional to
//! its recent demand as gossiped (the `d:{limit_key}` values of
//! [`crate::counter::ClusterUsage::demand_by_node`]), an equal split when every demand
//! is 0, and optionally at least `min_share` each when the capacity allows, so a quiet
//! node can start. Rounding is **largest remainder**: the shares sum to `L` exactly,
//! never `L + 1`, and ties go to the smaller node id. The result depends only on the
//! *set* of `(node, demand)` pairs, not their order, so every node that holds the same
//! gossiped demands computes the same shares, bit for bit, without talking.
//!
//! **Partitions.** Demand values are gossiped registers: across a cut no new value
//! reaches the other side, so each side keeps the last value it received from every
//! unreachable member. Each side freezes its share table at the cut (the integrator
//! snapshots the demand vector it had when the cut was detected; with converged gossip
//! both sides hold the same vector) and, this function being deterministic, both sides
//! derive the same `s_j` for every member. Each side then charges every unreachable
//! member its `s_j` per window and spends at most its own shares: since the shares sum
//! to `L`, the sides together stay within `L` (plus borrowed leases outstanding at the
//! cut) without exchanging a message. Pure: no clock, no IO.

/// Shares of `capacity` proportional to each member's demand (equal split when all
/// demands are 0), summing exactly to `capacity`, sorted by node id. Duplicate ids are
/// merged (demands added). No members: no shares.
pub fn shares<N: Ord + Clone>(capacity: u64, demands: &[(N, u64)]) -> Vec<(N, u64)> {
    shares_with_floor(capacity, demands, 0)
}

/// [`shares`], where every member gets at least `min(min_share, capacity / members)`
/// (the floor is lowered when the capacity cannot give everyone `min_share`). Members
/// whose proportional share is below the floor get the floor; the rest is shared by
/// the others in proportion to their demand (water-filling), so it stays proportional
/// wherever the floor does not bind.
pub fn shares_with_floor<N: Ord + Clone>(
    capacity: u64,
    demands: &[(N, u64)],
    min_share: u64,
) -> Vec<(N, u64)> {
    let members = merged(demands);
    if members.is_empty() {
        return Vec::new();
    }
    let idle = members.iter().all(|(_, d)| *d == 0);
    let weights: Vec<u128> = (members.iter())
        .map(|(_, d)| if idle { 1 } else { u128::from(*d) })
        .collect();
    let count = members.len() as u64;
    let floor = min_share.min(capacity / count);
    let (fixed, rest_capacity) = water_fill(capacity, &weights, floor);
    let out = apportion(rest_capacity, &weights, &fixed);
    debug_assert_eq!(
        out.iter().map(|&s| u128::from(s)).sum::<u128>(),
        u128::from(capacity)
    );
    debug_assert!(out.iter().all(|&s| s >= floor));
    members
        .into_iter()
        .zip(out)
        .map(|((node, _), s)| (node, s))
        .collect()
}

/// How far above its demand a member's fair share may reach before the others'
/// equal level binds: a node may double its rate within a window before its share
/// holds it back (at 1, a node just under the level would get exactly what it
/// asked in the last window, no room at all, and such nodes' demands would cross
/// the level and back from round to round: the jitter `fair_shares` exists to
/// remove).
pub const FAIR_GROWTH: u64 = 2;

/// Max-min fair shares of `capacity` by demand (`lease` mode's shares), each
/// member's claim being its demand x [`FAIR_GROWTH`]: while the claims together
/// exceed the capacity, every member claiming less than the fair level gets its
/// claim and the others the level, equal among them (so members that all claim
/// more than an equal split get an equal split, whatever their demands say);
/// when every claim fits, each member gets its claim and what is left is split
/// equally among all of them. Integer,
/// summing exactly to `capacity`, ties to the smaller node id, and a function of
/// the set of `(node, demand)` pairs only, like [`shares`], so both sides of a cut
/// compute the same shares from the same frozen demands.
///
/// Why not [`shares`] for lease: demand is cost asked over the last window,
/// refused asks included, so near-equal demands jitter by a few requests from one
/// sync round to the next, and proportional shares of a saturated key jitter
/// with them. A node whose share falls below what it has spent in the window can
/// spend nothing until its spending ages out, while the node whose share rose has
/// no request waiting: under `hot-tenant` at 3 nodes, proportional shares give
/// lease 0.92-0.94 of L against 0.96-0.98 for a static equal split
/// (docs/BENCHMARKS.md). A client's retries also raise its node's demand, and
/// with it the share: max-min caps what asking more can win at the fair level.
///
/// Why the rest equally, not by demand, when every claim fits: every node
/// reads its own demand as its peers have it, a sync interval and two gossip
/// intervals late, so a node where a tenant has just begun has a demand of 0
/// in every share table for that long. By demand it would get a share of 0 and
/// its first requests would wait for the next rounds (in the jepsen harness's
/// `hot-tenant` cells, two of three nodes serve nothing for their first 750 ms
/// while the third holds all of L); equally, it gets `(L - claims) / n` at once. The
/// busiest member still gets at least twice its demand, so no member's share
/// falls below what it spends while its rate at most doubles per window.
pub fn fair_shares<N: Ord + Clone>(capacity: u64, demands: &[(N, u64)]) -> Vec<(N, u64)> {
    let members = merged(demands);
    let asked: u128 = members.iter().map(|(_, d)| u128::from(*d)).sum();
    if asked.saturating_mul(u128::from(FAIR_GROWTH)) <= u128::from(capacity) {
        return claims_and_an_equal_rest(capacity, members);
    }
    // Each member's claim: its demand with room to grow.
    let members: Vec<(N, u64)> = (members.into_iter())
        .map(|(node, d)| (node, d.saturating_mul(FAIR_GROWTH)))
        .collect();
    // Smallest claim first: each that fits under an equal split of what is left
    // is met in full; the rest share what is left equally.
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by_key(|&i| members[i].1);
    let mut fixed = vec![None; members.len()];
    let (mut left, mut count) = (capacity, members.len() as u64);
    for i in order {
        let claim = members[i].1;
        if u128::from(claim) * u128::from(count) > u128::from(left) {
            break;
        }
        fixed[i] = Some(claim);
        left -= claim;
        count -= 1;
    }
    let weights = vec![1u128; members.len()];
    let out = apportion(left, &weights, &fixed);
    debug_assert_eq!(
        out.iter().map(|&s| u128::from(s)).sum::<u128>(),
        u128::from(capacity)
    );
    members
        .into_iter()
        .zip(out)
        .map(|((node, _), s)| (node, s))
        .collect()
}

/// Every member its claim (demand x [`FAIR_GROWTH`], which together fit in
/// `capacity`), and the rest in equal parts (largest remainder, ties to the
/// smaller node id).
fn claims_and_an_equal_rest<N>(capacity: u64, members: Vec<(N, u64)>) -> Vec<(N, u64)> {
    // The claims fit, so none of these saturate.
    let claims: Vec<u64> = (members.iter())
        .map(|(_, d)| d.saturating_mul(FAIR_GROWTH))
        .collect();
    let rest = capacity - claims.iter().sum::<u64>();
    let equal = vec![1u128; members.len()];
    let parts = apportion(rest, &equal, &vec![None; members.len()]);
    members
        .into_iter()
        .zip(claims.into_iter().zip(parts))
        .map(|((node, _), (claim, part))| (node, claim + part))
        .collect()
}

/// Sorted by node id, duplicates merged: the input's order cannot matter.
fn merged<N: Ord + Clone>(demands: &[(N, u64)]) -> Vec<(N, u64)> {
    let mut members = demands.to_vec();
    members.sort_by(|a, b| a.0.cmp(&b.0));
    members.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = kept.1.saturating_add(later.1);
        }
        same
    });
    members
}

/// Gives `floor` to every member whose proportional share of what is left would be
/// below it, smallest weight first, until none is. Returns each member's fixed share
/// (if any) and the capacity left for the others. Requires `floor * n <= capacity`.
fn water_fill(capacity: u64, weights: &[u128], floor: u64) -> (Vec<Option<u64>>, u64) {
    let mut fixed = vec![None; weights.len()];
    let (mut rest_capacity, mut rest_weight) = (capacity, weights.iter().sum::<u128>());
    if floor == 0 {
        return (fixed, rest_capacity);
    }
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| weights[i]);
    for i in order {
        // Proportional share below the floor: weight * cap / total < floor.
        if u128::from(rest_capacity) * weights[i] >= u128::from(floor) * rest_weight {
            break;
        }
        fixed[i] = Some(floor);
        rest_capacity -= floor;
        rest_weight -= weights[i];
    }
    (fixed, rest_capacity)
}

/// Largest remainder: `capacity` shared among the members not `fixed`, in proportion
/// to `weights`; leftover units go to the largest remainders, ties to the smaller
/// index (node id). Fixed members keep their share.
fn apportion(capacity: u64, weights: &[u128], fixed: &[Option<u64>]) -> Vec<u64> {
    let free: Vec<usize> = (0..weights.len()).filter(|&i| fixed[i].is_none()).collect();
    let total: u128 = free.iter().map(|&i| weights[i]).sum();
    let mut out: Vec<u64> = fixed.iter().map(|f| f.unwrap_or(0)).collect();
    if total == 0 {
        return out;
    }
    let cap = u128::from(capacity);
    let mut given = 0u64;
    let mut remainders = Vec::with_capacity(free.len());
    for &i in &free {
        // weights[i] <= total, so the quotient is <= capacity and fits a u64.
        let base = (cap * weights[i] / total) as u64;
        out[i] = base;
        given += base;
        remainders.push((cap * weights[i] % total, i));
    }
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let leftover = (capacity - given) as usize;
    debug_assert!(leftover < free.len().max(1));
    for &(_, i) in remainders.iter().take(leftover) {
        out[i] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn named(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
        pairs.iter().map(|&(n, d)| (n.to_owned(), d)).collect()
    }

    #[test]
    fn proportional_to_demand() {
        let got = shares(100, &named(&[("b", 1), ("a", 3)]));
        assert_eq!(got, named(&[("a", 75), ("b", 25)]));
    }

    #[test]
    fn equal_when_idle_remainder_to_smaller_ids() {
        let got = shares(10, &named(&[("c", 0), ("a", 0), ("b", 0)]));
        assert_eq!(got, named(&[("a", 4), ("b", 3), ("c", 3)]));
    }

    #[test]
    fn largest_remainder_wins_the_leftover() {
        // Exact: 100 * (1, 2, 4) / 7 = 14.29, 28.57, 57.14: the leftover unit goes to b.
        let got = shares(100, &named(&[("a", 1), ("b", 2), ("c", 4)]));
        assert_eq!(got, named(&[("a", 14), ("b", 29), ("c", 57)]));
    }

    #[test]
    fn floor_lets_a_quiet_node_start() {
        let demands = named(&[("busy", 1_000), ("quiet", 0), ("small", 5)]);
        let got = shares_with_floor(100, &demands, 10);
        assert_eq!(got, named(&[("busy", 80), ("quiet", 10), ("small", 10)]));
        // The floor shrinks to what the capacity allows.
        let got = shares_with_floor(5, &named(&[("a", 9), ("b", 0), ("c", 0)]), 10);
        assert_eq!(got, named(&[("a", 3), ("b", 1), ("c", 1)]));
    }

    #[test]
    fn edge_cases() {
        assert!(shares::<String>(100, &[]).is_empty());
        assert_eq!(
            shares(0, &named(&[("a", 5), ("b", 1)])),
            named(&[("a", 0), ("b", 0)])
        );
        assert_eq!(
            shares(7, &named(&[("a", 1), ("a", 1)])),
            named(&[("a", 7)]),
            "merged"
        );
        let huge = shares(u64::MAX, &named(&[("a", u64::MAX), ("b", u64::MAX)]));
        assert_eq!(huge, named(&[("a", u64::MAX / 2 + 1), ("b", u64::MAX / 2)]));
    }

    #[test]
    fn fair_shares_are_equal_among_those_asking_more() {
        // Three nodes all asking more than a third: an equal split, however
        // their demands differ (proportional gave 15 / 13 / 12).
        let got = fair_shares(40, &named(&[("a", 61), ("b", 52), ("c", 48)]));
        assert_eq!(got, named(&[("a", 14), ("b", 13), ("c", 13)]));
        // ... and a node a little under the level still gets the level (its
        // claim is twice its demand), so jitter around it changes nothing.
        let got = fair_shares(40, &named(&[("a", 61), ("b", 12), ("c", 48)]));
        assert_eq!(got, named(&[("a", 14), ("b", 13), ("c", 13)]));
        // One asks well under the level: it gets its claim, the rest is equal.
        let got = fair_shares(40, &named(&[("a", 100), ("b", 3), ("c", 30)]));
        assert_eq!(got, named(&[("a", 17), ("b", 6), ("c", 17)]));
        // Two small ones, met in turn as the level rises.
        let got = fair_shares(100, &named(&[("a", 5), ("b", 15), ("c", 500), ("d", 400)]));
        assert_eq!(got, named(&[("a", 10), ("b", 30), ("c", 30), ("d", 30)]));
        // Every claim fits: each its claim (60, 20), the rest equally.
        let got = fair_shares(100, &named(&[("a", 30), ("b", 10)]));
        assert_eq!(got, named(&[("a", 70), ("b", 30)]));
        // A node whose demand its peers do not see yet starts with a part of
        // the rest (by demand it would get 0 and wait for the next rounds).
        let got = fair_shares(40, &named(&[("a", 0), ("b", 0), ("c", 11)]));
        assert_eq!(got, named(&[("a", 6), ("b", 6), ("c", 28)]));
        assert_eq!(
            fair_shares(10, &named(&[("a", 0), ("b", 0)])),
            named(&[("a", 5), ("b", 5)])
        );
        assert!(fair_shares::<String>(10, &[]).is_empty());
        let huge = fair_shares(u64::MAX, &named(&[("a", u64::MAX), ("b", u64::MAX)]));
        assert_eq!(huge, named(&[("a", u64::MAX / 2 + 1), ("b", u64::MAX / 2)]));
    }

    fn demands() -> impl Strategy<Value = Vec<(u8, u64)>> {
        prop::collection::vec(
            (0u8..20, prop_oneof![Just(0u64), 0u64..1_000, any::<u64>()]),
            0..12,
        )
    }

    proptest! {
        #[test]
        fn shares_sum_to_capacity_and_are_proportional(capacity in any::<u64>(), demands in demands()) {
            let got = shares(capacity, &demands);
            let members = merged(&demands);
            prop_assert_eq!(got.len(), members.len());
            if members.is_empty() {
                return Ok(());
            }
            prop_assert_eq!(got.iter().map(|&(_, s)| u128::from(s)).sum::<u128>(), u128::from(capacity));
            let idle = members.iter().all(|(_, d)| *d == 0);
            let total: u128 = members.iter().map(|(_, d)| if idle { 1 } else { u128::from(*d) }).sum();
            for ((node, share), (id, d)) in got.iter().zip(&members) {
                prop_assert_eq!(node, id);
                let weight = if idle { 1 } else { u128::from(*d) };
                // share is the exact quota rounded down or up: |share * total - cap * w| < total.
                let (lhs, rhs) = (u128::from(*share) * total, u128::from(capacity) * weight);
                prop_assert!(lhs.abs_diff(rhs) < total, "{} got {} of {}", node, share, capacity);
            }
            if idle {
                let (lo, hi) = (got.iter().map(|s| s.1).min(), got.iter().map(|s| s.1).max());
                prop_assert!(hi.zip(lo).is_some_and(|(h, l)| h - l <= 1), "equal when idle");
            }
        }

        #[test]
        fn shares_are_deterministic_monotone_and_floored(
            capacity in 0u64..1_000_000,
            demands in demands(),
            min_share in 0u64..1_000,
            seed in any::<u64>(),
        ) {
            let got = shares_with_floor(capacity, &demands, min_share);
            let mut shuffled = demands.clone();
            let len = shuffled.len().max(1);
            shuffled.rotate_left((seed as usize) % len);
            shuffled.reverse();
            prop_assert_eq!(&got, &shares_with_floor(capacity, &shuffled, min_share), "order-free");
            if got.is_empty() {
                return Ok(());
            }
            prop_assert_eq!(got.iter().map(|s| s.1).sum::<u64>(), capacity);
            let floor = min_share.min(capacity / got.len() as u64);
            prop_assert!(got.iter().all(|s| s.1 >= floor), "floor {}", floor);
            let members = merged(&demands);
            for (i, j) in (0..got.len()).flat_map(|i| (0..got.len()).map(move |j| (i, j))) {
                if members[i].1 > members[j].1 {
                    prop_assert!(got[i].1 >= got[j].1, "more demand never gets less");
                }
            }
        }

        #[test]
        fn fair_shares_sum_to_capacity_and_are_max_min_fair(
            capacity in prop_oneof![0u64..1_000, any::<u64>()],
            demands in demands(),
            seed in any::<u64>(),
        ) {
            let got = fair_shares(capacity, &demands);
            let mut shuffled = demands.clone();
            let len = shuffled.len().max(1);
            shuffled.rotate_left((seed as usize) % len);
            shuffled.reverse();
            prop_assert_eq!(&got, &fair_shares(capacity, &shuffled), "order-free");
            let members = merged(&demands);
            prop_assert_eq!(got.len(), members.len());
            if members.is_empty() {
                return Ok(());
            }
            prop_assert_eq!(got.iter().map(|&(_, s)| u128::from(s)).sum::<u128>(), u128::from(capacity));
            let claim = |d: u64| d.saturating_mul(FAIR_GROWTH);
            let claimed: u128 = members.iter().map(|(_, d)| u128::from(*d) * u128::from(FAIR_GROWTH)).sum();
            if claimed <= u128::from(capacity) {
                prop_assert!(got.iter().zip(&members).all(|(s, m)| s.1 >= claim(m.1)), "each gets its claim");
                // The rest equally: parts differ by at most one unit.
                let parts: Vec<u64> = got.iter().zip(&members).map(|(s, m)| s.1 - claim(m.1)).collect();
                let (low, high) = (parts.iter().min().unwrap(), parts.iter().max().unwrap());
                prop_assert!(high - low <= 1, "unequal parts of the rest {:?}", parts);
                for (i, j) in (0..got.len()).flat_map(|i| (0..got.len()).map(move |j| (i, j))) {
                    if members[i].1 > members[j].1 {
                        prop_assert!(got[i].1 >= got[j].1, "more demand never gets less");
                    }
                }
                return Ok(());
            }
            // Overloaded: nobody gets more than it claims, and a member short of its
            // claim gets at least every other member's share, less one (rounding).
            for ((_, share), (_, d)) in got.iter().zip(&members) {
                prop_assert!(*share <= claim(*d), "{} above the claim of demand {}", share, d);
            }
            let top = got.iter().map(|s| s.1).max().unwrap_or(0);
            for ((_, share), (_, d)) in got.iter().zip(&members) {
                if *share < claim(*d) {
                    prop_assert!(share.saturating_add(1) >= top, "short {} below the level {}", share, top);
                }
            }
        }
    }
}
