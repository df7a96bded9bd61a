//! `local`: every node counts alone. `full` bounds nothing beyond each node's
//! own limiter (the cluster may reach N x L: a baseline, not a limit); `split`
//! gives every live member an equal share of L, and during a cut each side
//! divides only its part of L (`partition::cut::side_budget`), so the two sides
//! never hand out more than L between them.

use super::{KeyInput, Mode, Output, Round, share_of};
use crate::config::LocalShare;
use crate::sync::partition::cut::side_budget;
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
                equal_share(capacity, round.self_id, key.demands)
            }
        };
        out.allow(key, allowance);
    }
}

/// This node's part of `capacity` split equally among the members listed in
/// `demands` (largest remainder: the parts sum to `capacity`).
fn equal_share(capacity: u64, self_id: &str, demands: &[(String, u64)]) -> u64 {
    let equal: Vec<(String, u64)> = (demands.iter())
        .map(|(node, _)| (node.clone(), 1))
        .collect();
    share_of(self_id, &shares(capacity, &equal)).unwrap_or(0)
}
