//! What each sync mode lets this node count for one key: pure arithmetic over the
//! cluster's published figures (docs/design/cluster.md has the promises).

use crate::config::{LocalShare, SyncMode};
use tollgate_cluster::share::shares;

/// The figures one key's allowance is computed from.
#[derive(Debug, Clone)]
pub struct KeyFigures<'a> {
    /// The key's capacity L (per window, or concurrent for concurrency).
    pub capacity: u64,
    /// This node's id.
    pub self_id: &'a str,
    /// This node's own usage now (its local window, or its requests in flight).
    pub own_used: u64,
    /// The other live members' published usage, summed.
    pub others_used: u64,
    /// Demand per live member (this node included), for demand-weighted shares.
    pub demands: &'a [(String, u64)],
}

/// The allowance of this node, or `None` when the mode sets none (`local full`).
pub fn allowance(mode: SyncMode, local_share: LocalShare, f: &KeyFigures<'_>) -> Option<u64> {
    match (mode, local_share) {
        (SyncMode::Local, LocalShare::Full) => None,
        (SyncMode::Local, LocalShare::Split) => {
            let equal: Vec<(String, u64)> = f
                .demands
                .iter()
                .map(|(node, _)| (node.clone(), 1))
                .collect();
            Some(share_of(f.self_id, &shares(f.capacity, &equal)).unwrap_or(f.capacity))
        }
        // Lease is refused by config validation until it is built; treat it as the
        // most conservative mode meanwhile (gossip arithmetic).
        (SyncMode::Gossip | SyncMode::Lease, _) => {
            let global = f.own_used.saturating_add(f.others_used);
            let headroom = f.capacity.saturating_sub(global);
            let mine = share_of(f.self_id, &shares(headroom, f.demands)).unwrap_or(0);
            Some(f.own_used.saturating_add(mine))
        }
    }
}

fn share_of(node: &str, shares: &[(String, u64)]) -> Option<u64> {
    shares.iter().find(|(n, _)| n == node).map(|(_, s)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demands(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(n, d)| ((*n).to_owned(), *d)).collect()
    }

    fn figures<'a>(own: u64, others: u64, demands: &'a [(String, u64)]) -> KeyFigures<'a> {
        KeyFigures {
            capacity: 100,
            self_id: "b",
            own_used: own,
            others_used: others,
            demands,
        }
    }

    #[test]
    fn local_full_sets_nothing_and_split_sums_to_capacity() {
        let d = demands(&[("a", 0), ("b", 0), ("c", 0)]);
        assert_eq!(
            allowance(SyncMode::Local, LocalShare::Full, &figures(0, 0, &d)),
            None
        );
        let total: u64 = ["a", "b", "c"]
            .iter()
            .map(|me| {
                let f = KeyFigures {
                    self_id: me,
                    ..figures(0, 0, &d)
                };
                allowance(SyncMode::Local, LocalShare::Split, &f).unwrap()
            })
            .sum();
        assert_eq!(total, 100);
    }

    #[test]
    fn gossip_hands_out_the_headroom_by_demand_and_never_more() {
        let d = demands(&[("a", 300), ("b", 100)]);
        // 40 used cluster-wide (10 here): 60 headroom, b's demand is a quarter.
        assert_eq!(
            allowance(SyncMode::Gossip, LocalShare::Full, &figures(10, 30, &d)),
            Some(10 + 15)
        );
        // Every node computing from the same figures hands out exactly the headroom.
        let a = KeyFigures {
            self_id: "a",
            own_used: 30,
            others_used: 10,
            ..figures(0, 0, &d)
        };
        let sum = allowance(SyncMode::Gossip, LocalShare::Full, &a).unwrap() - 30
            + allowance(SyncMode::Gossip, LocalShare::Full, &figures(10, 30, &d)).unwrap()
            - 10;
        assert_eq!(sum, 60);
        // Over the limit already: nothing more than what is used.
        assert_eq!(
            allowance(SyncMode::Gossip, LocalShare::Full, &figures(50, 80, &d)),
            Some(50)
        );
    }
}
