//! The modes' arithmetic, figure by figure.

use super::floors::most_share;
use super::gossip::{Figures, allowance};
use proptest::prelude::*;
use tollgate_cluster::share::fair_shares;

fn figures<'a>(
    own: u64,
    others: u64,
    self_id: &'a str,
    demands: &'a [(String, u64)],
) -> Figures<'a> {
    Figures {
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
    assert_eq!(allowance(&figures(10, 30, "b", &d)), 10 + 15);
    assert_eq!(allowance(&figures(30, 10, "a", &d)), 30 + 45);
    // A node whose demand its peers do not see yet still has its floor.
    let late = vec![("a".to_owned(), 300), ("b".to_owned(), 0)];
    assert_eq!(allowance(&figures(10, 30, "b", &late)), 10 + 15);
    // Two units left for two members: no floor, all by demand.
    assert_eq!(allowance(&figures(0, 98, "b", &late)), 0);
    // Over the limit already: nothing beyond what is used.
    assert_eq!(allowance(&figures(50, 80, "b", &d)), 50);
}

#[test]
fn a_member_is_charged_the_most_any_freeze_of_the_cut_gives_it() {
    let v = |d: &[(&str, u64)]| -> Vec<(String, u64)> {
        d.iter().map(|(n, x)| (n.to_string(), *x)).collect()
    };
    let first = v(&[("a", 2), ("b", 2), ("c", 12)]);
    let second = v(&[("a", 47), ("b", 47), ("c", 12)]);
    // Claims 4, 4, 24 fit: each its claim, the rest (88) equally.
    let one = most_share(120, &[&first], fair_shares);
    assert_eq!((one["a"], one["b"], one["c"]), (34, 33, 53));
    // Claims 94, 94, 24 do not: max-min gives 48, 48, 24.
    let both = most_share(120, &[&second, &first], fair_shares);
    assert_eq!(both["c"], 53, "the first freeze's share, not the second's");
    assert_eq!(both["a"], 48, "the second freeze's, larger for a");
    assert!(most_share(120, &[], fair_shares).is_empty());
}

proptest! {
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
            let f = Figures {
                capacity,
                self_id: &ids[i],
                own_used: seen + unseen,
                own_seen: *seen,
                others_used: seen_total - seen,
                demands: &demands,
            };
            total += allowance(&f);
        }
        prop_assert!(
            total <= capacity.max(seen_total),
            "allowances sum to {total} > max(L {capacity}, seen {seen_total})"
        );
    }
}
