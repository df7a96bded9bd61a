//! The sync modes as one trait: each turns the cluster's published figures for one
//! key into this node's allowance. Pure arithmetic, so one conformance suite checks
//! every mode's promise (docs/design/cluster.md).

use crate::config::{LocalShare, SyncMode};
use tollgate_cluster::share::{shares, shares_with_floor};

/// The figures one key's allowance is computed from.
#[derive(Debug, Clone)]
pub struct KeyFigures<'a> {
    /// The key's capacity L (per window, or concurrent for concurrency).
    pub capacity: u64,
    /// This node's id.
    pub self_id: &'a str,
    /// This node's own usage now (its local window, or its requests in flight).
    pub own_used: u64,
    /// `own_used` as every peer has surely seen it: less what this node added
    /// within one propagation bound (`super::echo`). What the peers charge it.
    pub own_seen: u64,
    /// What the other members are charged: live members' published usage, plus
    /// unreachable members' frozen shares.
    pub others_used: u64,
    /// Demand per member that takes part in the split (this node included).
    pub demands: &'a [(String, u64)],
}

/// A sync mode's rule for allowances.
pub trait SyncPolicy: Send + Sync {
    /// The promise the mode makes, for `/admin/cluster` and logs.
    fn promise(&self) -> &'static str;
    /// This node's allowance, or `None` when the mode sets none.
    fn allowance(&self, figures: &KeyFigures<'_>) -> Option<u64>;
}

/// `local`: every node counts alone.
pub struct LocalPolicy {
    /// `full`: L per node; `split`: an equal share of L.
    pub share: LocalShare,
}

impl SyncPolicy for LocalPolicy {
    fn promise(&self) -> &'static str {
        match self.share {
            LocalShare::Full => "local full: cluster total <= N x L (a baseline, not a limit)",
            LocalShare::Split => "local split: cluster total <= L (equal shares of the members)",
        }
    }

    fn allowance(&self, f: &KeyFigures<'_>) -> Option<u64> {
        match self.share {
            LocalShare::Full => None,
            LocalShare::Split => {
                let equal: Vec<(String, u64)> = f
                    .demands
                    .iter()
                    .map(|(node, _)| (node.clone(), 1))
                    .collect();
                Some(share_of(f.self_id, &shares(f.capacity, &equal)).unwrap_or(0))
            }
        }
    }
}

/// `gossip`: a demand-weighted share of the global headroom.
pub struct GossipPolicy;

impl SyncPolicy for GossipPolicy {
    fn promise(&self) -> &'static str {
        "gossip: cluster total <= L x (1 + e), e from gossip lag, measured"
    }

    /// Counts this node as its peers see it, so that it computes the allowance
    /// they compute for it: its share of the headroom is what its unpublished
    /// spending comes out of, not a fresh share on top of it (which each peer,
    /// blind to that spending, would also hand itself; `super::echo`). It may be
    /// below `own_used` then: nothing more until the others catch up.
    ///
    /// Half of the headroom is spread equally, as every member's floor, and the
    /// rest goes by demand. By demand alone a node whose demand its peers do not
    /// see yet would get none of it: every node reads its own demand as its peers
    /// have it, a failure-detection time late (`super::history`), so a tenant
    /// that begins on a second node would be refused there for up to 2 s while
    /// the first holds all the headroom (one tenant sent to 3 nodes at 1,000
    /// requests/s under limits it never nears: p99 455 ms, allowance 0, in
    /// `gossip`, against 6.5 ms in `lease`). The shares still sum to the headroom
    /// and are the same function of the same figures on every node, so the
    /// bound is unchanged. Where the headroom is under two units per member the
    /// floor is 0 and it all goes by demand: a freed slot must reach the node
    /// that queues for it (the jepsen ghost-slot check).
    fn allowance(&self, f: &KeyFigures<'_>) -> Option<u64> {
        let own = f.own_seen.min(f.own_used);
        let global = own.saturating_add(f.others_used);
        let headroom = f.capacity.saturating_sub(global);
        let floor = headroom / (2 * f.demands.len().max(1) as u64);
        let shares = shares_with_floor(headroom, f.demands, floor);
        let mine = share_of(f.self_id, &shares).unwrap_or(0);
        Some(own.saturating_add(mine))
    }
}

/// The allowance policy of a configured mode. Leased modes (`lease`,
/// `redis-lease`) bound keys with credit instead and never read an allowance;
/// `redis` uses allowances only as its fallback while Redis is lost (its share).
pub fn policy(mode: SyncMode, share: LocalShare) -> Box<dyn SyncPolicy> {
    match mode {
        SyncMode::Local => Box::new(LocalPolicy { share }),
        SyncMode::Gossip | SyncMode::Lease | SyncMode::Redis | SyncMode::RedisLease => {
            Box::new(GossipPolicy)
        }
    }
}

fn share_of(node: &str, shares: &[(String, u64)]) -> Option<u64> {
    shares.iter().find(|(n, _)| n == node).map(|(_, s)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn figures<'a>(
        own: u64,
        others: u64,
        self_id: &'a str,
        demands: &'a [(String, u64)],
    ) -> KeyFigures<'a> {
        KeyFigures {
            capacity: 100,
            self_id,
            own_used: own,
            own_seen: own,
            others_used: others,
            demands,
        }
    }

    #[test]
    fn gossip_hands_out_the_headroom_by_demand() {
        let d = vec![("a".to_owned(), 300), ("b".to_owned(), 100)];
        // 40 used cluster-wide (10 by b): 60 headroom, 15 each as floors, and b's
        // demand is a quarter: b's proportional 15 is at the floor, a has 45.
        assert_eq!(
            GossipPolicy.allowance(&figures(10, 30, "b", &d)),
            Some(10 + 15)
        );
        assert_eq!(
            GossipPolicy.allowance(&figures(30, 10, "a", &d)),
            Some(30 + 45)
        );
        // A node whose demand its peers do not see yet still has its floor.
        let late = vec![("a".to_owned(), 300), ("b".to_owned(), 0)];
        assert_eq!(
            GossipPolicy.allowance(&figures(10, 30, "b", &late)),
            Some(10 + 15)
        );
        // Two units left for two members: no floor, all by demand.
        assert_eq!(GossipPolicy.allowance(&figures(0, 98, "b", &late)), Some(0));
        // Over the limit already: nothing beyond what is used.
        assert_eq!(GossipPolicy.allowance(&figures(50, 80, "b", &d)), Some(50));
        assert_eq!(
            LocalPolicy {
                share: LocalShare::Full
            }
            .allowance(&figures(0, 0, "b", &d)),
            None
        );
    }

    /// The conformance suite every bounding mode passes: when all members see the
    /// same figures, what they may still add sums to at most the headroom (so the
    /// cluster stays <= L), and no allowance is below what a node already spent.
    fn conforms(
        policy: &dyn SyncPolicy,
        capacity: u64,
        used: &[u64],
        demand: &[u64],
    ) -> Result<(), TestCaseError> {
        let ids: Vec<String> = (0..used.len()).map(|i| format!("n{i}")).collect();
        let demands: Vec<(String, u64)> = ids.iter().cloned().zip(demand.iter().copied()).collect();
        let global: u64 = used.iter().sum();
        let mut added = 0u64;
        for (i, id) in ids.iter().enumerate() {
            let f = KeyFigures {
                capacity,
                self_id: id,
                own_used: used[i],
                own_seen: used[i],
                others_used: global - used[i],
                demands: &demands,
            };
            let Some(a) = policy.allowance(&f) else {
                return Ok(());
            };
            added += a.saturating_sub(used[i]);
            if policy.promise().starts_with("gossip") {
                prop_assert!(a >= used[i], "allowance {a} below own usage {}", used[i]);
            }
        }
        let bound = if policy.promise().starts_with("local split") {
            capacity
        } else {
            capacity.saturating_sub(global)
        };
        prop_assert!(
            added <= bound,
            "{}: members may add {added} > {bound}",
            policy.promise()
        );
        Ok(())
    }

    proptest! {
        #[test]
        fn every_mode_keeps_its_promise_under_consistent_views(
            capacity in 1u64..10_000,
            nodes in prop::collection::vec((0u64..5_000, 0u64..1_000), 1..8),
        ) {
            let used: Vec<u64> = nodes.iter().map(|(u, _)| *u).collect();
            let demand: Vec<u64> = nodes.iter().map(|(_, d)| *d).collect();
            for share in [LocalShare::Full, LocalShare::Split] {
                conforms(&LocalPolicy { share }, capacity, &used, &demand)?;
            }
            conforms(&GossipPolicy, capacity, &used, &demand)?;
        }

        /// Each member sees every other as that member's seen figure (its usage less
        /// what it added within the propagation bound). The allowances then sum to
        /// at most L (or to what is already seen, if more): nobody's unpublished
        /// spending is handed out a second time. Counting its fresh usage instead,
        /// each member would re-carve the headroom its peers are spending.
        #[test]
        fn gossip_hands_out_no_headroom_twice_under_lagged_views(
            capacity in 1u64..10_000,
            nodes in prop::collection::vec((0u64..3_000, 0u64..500, 0u64..1_000), 1..8),
        ) {
            let ids: Vec<String> = (0..nodes.len()).map(|i| format!("n{i}")).collect();
            let demands: Vec<(String, u64)> =
                ids.iter().cloned().zip(nodes.iter().map(|n| n.2)).collect();
            let seen_total: u64 = nodes.iter().map(|n| n.0).sum();
            let mut total = 0u64;
            for (i, (seen, unseen, _)) in nodes.iter().enumerate() {
                let f = KeyFigures {
                    capacity,
                    self_id: &ids[i],
                    own_used: seen + unseen,
                    own_seen: *seen,
                    others_used: seen_total - seen,
                    demands: &demands,
                };
                total += GossipPolicy.allowance(&f).unwrap_or(0);
            }
            prop_assert!(
                total <= capacity.max(seen_total),
                "allowances sum to {total} > max(L {capacity}, seen {seen_total})"
            );
        }
    }
}
