//! The sync modes as one trait: each turns the cluster's published figures for one
//! key into this node's allowance. Pure arithmetic, so one conformance suite checks
//! every mode's promise (docs/design/cluster.md).

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

    fn allowance(&self, f: &KeyFigures<'_>) -> Option<u64> {
        let global = f.own_used.saturating_add(f.others_used);
        let headroom = f.capacity.saturating_sub(global);
        let mine = share_of(f.self_id, &shares(headroom, f.demands)).unwrap_or(0);
        Some(f.own_used.saturating_add(mine))
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
            others_used: others,
            demands,
        }
    }

    #[test]
    fn gossip_hands_out_the_headroom_by_demand() {
        let d = vec![("a".to_owned(), 300), ("b".to_owned(), 100)];
        // 40 used cluster-wide (10 by b): 60 headroom, b's demand is a quarter.
        assert_eq!(
            GossipPolicy.allowance(&figures(10, 30, "b", &d)),
            Some(10 + 15)
        );
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
    }
}
