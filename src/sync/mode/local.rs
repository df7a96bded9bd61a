//! `local`: every node counts alone. `full` bounds nothing beyond each node's
//! own limiter (the cluster may reach N x L: a baseline, not a limit); `split`
//! gives every live member an equal share of L, and during a cut each side
//! divides only its part of L (`partition::cut::side_budget`), so the two sides
//! never hand out more than L between them.
//!
//! Shares are per node id, not per incarnation: a restarted node's share is what
//! is left of its node id's share after what its earlier incarnations spent in
//! the window (read from their published counters, carried past chitchat's
//! memory by `super::super::engine::archive`), and a node id that left the
//! cluster keeps its share while its spending counts. So the incarnations of one
//! node id never spend more than one share together, and a departed node's
//! spending is never handed out again before it has left the window.

use super::{KeyInput, Mode, Output, Round, share_of};
use crate::config::LocalShare;
use crate::sync::partition::cut::side_budget;
use std::collections::BTreeSet;
use tollgate_cluster::membership::MemberId;
use tollgate_cluster::share::shares;

/// `local full` or `local split`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Local {
    /// `full`: L per node; `split`: an equal share of L.
    pub share: LocalShare,
}

impl Mode for Local {
    fn promise(&self) -> &'static str {
        match self.share {
            LocalShare::Full => "local full: cluster total <= N x L (a baseline, not a limit)",
            LocalShare::Split => "local split: cluster total <= L (equal shares of the members)",
        }
    }

    fn key(&self, round: &Round<'_>, key: &KeyInput<'_>, out: &mut Output) {
        let allowance = match self.share {
            LocalShare::Full => u64::MAX,
            LocalShare::Split => {
                // Concurrency is not split by side: a crashed node's slots come
                // back as soon as it is declared dead.
                let capacity = match round.split_at_cut {
                    Some(at_cut) if key.windowed() => {
                        side_budget(key.binding.capacity, at_cut, round.dead)
                    }
                    _ => key.binding.capacity,
                };
                if key.windowed() {
                    let departed =
                        (round.usage).departed_usage_by_node(&key.binding.key, round.now_ms);
                    let departed: Vec<(String, u64)> = (departed.into_iter())
                        .filter(|(member, _)| !round.dead.contains(member))
                        .collect();
                    node_share(capacity, round.self_id, key.demands, &departed)
                } else {
                    node_share(capacity, round.self_id, key.demands, &[])
                }
            }
        };
        out.allow(key, allowance);
    }
}

/// This node's part of `capacity` split equally among the node ids of the
/// members listed in `demands` and of the departed members in `departed`
/// (member, what it spent in the window), less what departed incarnations of
/// its own node id spent (largest remainder: the parts sum to `capacity`).
fn node_share(
    capacity: u64,
    self_id: &str,
    demands: &[(String, u64)],
    departed: &[(String, u64)],
) -> u64 {
    let own_id = MemberId::node_id_of(self_id);
    let mut ids: BTreeSet<&str> = (demands.iter())
        .map(|(member, _)| MemberId::node_id_of(member))
        .collect();
    let mut predecessors = 0u64;
    for (member, spent) in departed {
        let id = MemberId::node_id_of(member);
        ids.insert(id);
        if id == own_id && member != self_id {
            predecessors = predecessors.saturating_add(*spent);
        }
    }
    let equal: Vec<(String, u64)> = ids.into_iter().map(|id| (id.to_owned(), 1)).collect();
    let share = share_of(own_id, &shares(capacity, &equal)).unwrap_or(0);
    share.saturating_sub(predecessors)
}

#[cfg(test)]
mod tests {
    use super::node_share;

    fn members(ids: &[&str]) -> Vec<(String, u64)> {
        ids.iter().map(|m| ((*m).to_owned(), 0)).collect()
    }

    #[test]
    fn a_restarted_node_gets_what_its_earlier_incarnations_left_of_its_share() {
        let live = members(&["a/2@x:1", "b/1@x:2", "c/1@x:3"]);
        assert_eq!(node_share(30, "a/2@x:1", &live, &[]), 10);
        // a's first incarnation spent 7 of its 10 before it restarted.
        let departed = vec![("a/1@x:1".to_owned(), 7)];
        assert_eq!(node_share(30, "a/2@x:1", &live, &departed), 3);
        assert_eq!(node_share(30, "b/1@x:2", &live, &departed), 10);
        // All of it: nothing left.
        let departed = vec![("a/1@x:1".to_owned(), 12)];
        assert_eq!(node_share(30, "a/2@x:1", &live, &departed), 0);
    }

    #[test]
    fn a_node_that_left_keeps_its_share_while_its_spending_counts() {
        // c left with 10 spent: a and b keep a third each, not half.
        let live = members(&["a/1@x:1", "b/1@x:2"]);
        let departed = vec![("c/1@x:3".to_owned(), 10)];
        assert_eq!(node_share(30, "a/1@x:1", &live, &departed), 10);
        assert_eq!(node_share(30, "b/1@x:2", &live, &departed), 10);
        // Once it has left the window, the halves.
        assert_eq!(node_share(30, "a/1@x:1", &live, &[]), 15);
    }
}
