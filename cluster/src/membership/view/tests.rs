//! Unit and property tests of the [`Arbiter`] rules.

use std::net::SocketAddr;

use proptest::prelude::*;

use super::*;

fn id(node_id: &str, generation: u64, port: u16) -> MemberId {
    MemberId {
        node_id: node_id.to_string(),
        generation,
        gossip_addr: SocketAddr::from(([127, 0, 0, 1], port)),
    }
}

fn metadata() -> NodeMetadata {
    NodeMetadata {
        proxy_addr: "127.0.0.1:8080".to_string(),
        rpc_addr: "127.0.0.1:8081".to_string(),
        version: "0.1.0".to_string(),
        sync_mode: "lease".to_string(),
        rpc_version: crate::membership::RPC_VERSION,
        spills: false,
    }
}

fn ok(id: &MemberId) -> Candidate {
    Candidate {
        id: id.clone(),
        metadata: Ok(metadata()),
    }
}

fn member_ids(view: &LiveView) -> Vec<MemberId> {
    view.members.iter().map(|m| m.id.clone()).collect()
}

#[test]
fn self_and_peers_are_members() {
    let me = id("a", 1, 1);
    let peer = id("b", 1, 2);
    let mut arbiter = Arbiter::new(me.clone());
    let (view, events) = arbiter.update(vec![ok(&me), ok(&peer)]);
    assert_eq!(member_ids(&view), vec![me, peer]);
    assert!(view.members[0].is_self && !view.members[1].is_self);
    assert!(events.is_empty());
}

#[test]
fn newer_generation_replaces_incumbent_without_counting() {
    let me = id("a", 1, 1);
    let old = id("b", 1, 2);
    let new = id("b", 2, 3);
    let mut arbiter = Arbiter::new(me.clone());
    arbiter.update(vec![ok(&me), ok(&old)]);
    let (view, events) = arbiter.update(vec![ok(&me), ok(&old), ok(&new)]);
    assert_eq!(member_ids(&view), vec![me, new.clone()]);
    assert!(view.refused.is_empty());
    assert_eq!(arbiter.duplicates_seen(), 0);
    assert_eq!(events, vec![Event::Superseded { old, new }]);
}

#[test]
fn same_or_lower_generation_newcomer_is_refused_and_counted_once() {
    let me = id("a", 1, 1);
    let incumbent = id("b", 5, 2);
    let mut arbiter = Arbiter::new(me.clone());
    arbiter.update(vec![ok(&me), ok(&incumbent)]);
    for (round, dup) in [id("b", 5, 9), id("b", 4, 8)].into_iter().enumerate() {
        for _ in 0..3 {
            let (view, _) = arbiter.update(vec![ok(&me), ok(&incumbent), ok(&dup)]);
            assert_eq!(member_ids(&view), vec![me.clone(), incumbent.clone()]);
            assert_eq!(view.refused, vec![dup.clone()]);
        }
        assert_eq!(arbiter.duplicates_seen(), round as u64 + 1);
    }
}

#[test]
fn duplicate_of_self_is_refused_and_newer_self_supersedes() {
    let me = id("a", 5, 1);
    let mut arbiter = Arbiter::new(me.clone());
    let (view, events) = arbiter.update(vec![ok(&me), ok(&id("a", 5, 0))]);
    assert_eq!(
        member_ids(&view),
        vec![me.clone()],
        "tie: self is incumbent"
    );
    assert!(matches!(events[..], [Event::DuplicateRefused { .. }]));
    let newer = id("a", 6, 2);
    let (view, events) = arbiter.update(vec![ok(&me), ok(&newer)]);
    assert!(view.self_superseded);
    assert_eq!(member_ids(&view), vec![newer.clone()]);
    assert!(events.contains(&Event::SelfSuperseded { by: newer }));
}

#[test]
fn fresh_observer_breaks_ties_by_lowest_address_and_skips_old_generations() {
    let me = id("z", 1, 1);
    let mut arbiter = Arbiter::new(me.clone());
    let (view, _) = arbiter.update(vec![
        ok(&me),
        ok(&id("b", 3, 7)),
        ok(&id("b", 3, 5)),
        ok(&id("b", 2, 4)),
    ]);
    assert_eq!(member_ids(&view), vec![id("b", 3, 5), me]);
    assert_eq!(
        view.refused,
        vec![id("b", 3, 7)],
        "the older generation is not a duplicate"
    );
}

#[test]
fn old_incarnation_on_same_address_is_never_a_duplicate() {
    let me = id("a", 10, 1);
    let mut arbiter = Arbiter::new(me.clone());
    let (view, _) = arbiter.update(vec![ok(&me), ok(&id("a", 9, 1))]);
    assert_eq!(member_ids(&view), vec![me]);
    assert!(view.refused.is_empty());
    assert_eq!(arbiter.duplicates_seen(), 0);
}

#[test]
fn untrusted_winner_is_reported_once_and_not_a_member() {
    let me = id("a", 1, 1);
    let peer = id("b", 1, 2);
    let bad = Candidate {
        id: peer.clone(),
        metadata: Err(MetadataError::Missing { key: "m:v" }),
    };
    let mut arbiter = Arbiter::new(me.clone());
    let (view, events) = arbiter.update(vec![ok(&me), bad.clone()]);
    assert_eq!(member_ids(&view), vec![me.clone()]);
    assert_eq!(view.untrusted.len(), 1);
    assert_eq!(events.len(), 1);
    let (_, events) = arbiter.update(vec![ok(&me), bad]);
    assert!(events.is_empty(), "reported once");
    let (view, _) = arbiter.update(vec![ok(&me), ok(&peer)]);
    assert_eq!(member_ids(&view), vec![me, peer]);
}

#[test]
fn refused_duplicate_takes_over_when_incumbent_dies() {
    let me = id("a", 1, 1);
    let incumbent = id("b", 5, 2);
    let dup = id("b", 5, 3);
    let mut arbiter = Arbiter::new(me.clone());
    arbiter.update(vec![ok(&me), ok(&incumbent)]);
    arbiter.update(vec![ok(&me), ok(&incumbent), ok(&dup)]);
    let (view, _) = arbiter.update(vec![ok(&me), ok(&dup)]);
    assert_eq!(member_ids(&view), vec![me, dup]);
}

fn candidates_strategy() -> impl Strategy<Value = Vec<Vec<(u8, u64, u16)>>> {
    // Rounds of (node_id in 0..4, generation in 0..4, port in 1..6) triples.
    prop::collection::vec(
        prop::collection::vec((0u8..4, 0u64..4, 1u16..6), 0..8),
        1..12,
    )
}

proptest! {
    /// Whatever the sequence of live sets: node ids are unique among members, members
    /// and refused ids are live candidates, each member has the top generation of its
    /// node id, and the duplicate counter never decreases.
    #[test]
    fn arbiter_invariants(rounds in candidates_strategy()) {
        let me = id("n0", 1, 1);
        let mut arbiter = Arbiter::new(me.clone());
        let mut last_count = 0;
        for round in rounds {
            let mut live: Vec<MemberId> =
                round.iter().map(|&(n, g, p)| id(&format!("n{n}"), g, p)).collect();
            live.push(me.clone());
            live.sort();
            live.dedup();
            let (view, _) = arbiter.update(live.iter().map(ok).collect());
            let mut node_ids: Vec<&str> =
                view.members.iter().map(|m| m.id.node_id.as_str()).collect();
            let before = node_ids.len();
            node_ids.dedup();
            prop_assert_eq!(before, node_ids.len(), "one member per node id");
            for member in &view.members {
                prop_assert!(live.contains(&member.id));
                let top = live.iter().filter(|c| c.node_id == member.id.node_id)
                    .map(|c| c.generation).max();
                prop_assert_eq!(Some(member.id.generation), top);
                prop_assert!(!view.refused.contains(&member.id));
            }
            prop_assert!(view.refused.iter().all(|r| live.contains(r)));
            prop_assert!(arbiter.duplicates_seen() >= last_count);
            last_count = arbiter.duplicates_seen();
        }
    }
}

#[test]
fn a_member_ids_text_gives_back_its_node_id() {
    for member in [id("node-1", 1_733_000_000_000, 7946), id("a/b@c", 7, 1)] {
        assert_eq!(MemberId::node_id_of(&member.to_string()), member.node_id);
    }
    let v6 = MemberId {
        gossip_addr: "[::1]:7946".parse().unwrap(),
        ..id("node-2", 3, 1)
    };
    assert_eq!(MemberId::node_id_of(&v6.to_string()), "node-2");
    for other in ["n1", "n1@x", "n1/x@a", "/5@a"] {
        assert_eq!(MemberId::node_id_of(other), other);
    }
}
