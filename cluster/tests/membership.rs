//! Membership over real UDP loopback and chitchat's in-memory transport: formation,
//! partitions, death and GC, restarts, cluster ids, duplicate ids, state limits and
//! untrusted metadata. Every wait polls with a deadline; measured times are printed
//! (`cargo test --test membership -- --nocapture`).
//!
//! Tests over the in-memory transport run on paused time (tokio's clock, which
//! chitchat's failure detector and gossip ticks read, advances whenever every
//! task waits): deterministic and fast, with the same measured intervals. Those
//! over UDP need real sockets and run on the real clock.
//!
//! Each test runs its own cluster id (its name): ports found free here are released
//! before chitchat binds them, so a parallel test may later bind a port a node of this
//! test used; distinct cluster ids keep such strays out (chitchat answers `BadCluster`).

use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use chitchat::transport::{ChannelTransport, Transport, UdpTransport};
use chitchat::{ChitchatConfig, ChitchatId, FailureDetectorConfig, ProtocolVersion};
use tokio::time::Instant;
use tollgate_cluster::membership::{
    MemberId, Membership, MembershipConfig, MembershipError, MetadataError, NodeMetadata,
    StateLimits,
};

const GOSSIP_INTERVAL: Duration = Duration::from_millis(100);
const POLL: Duration = Duration::from_millis(20);
const DEADLINE: Duration = Duration::from_secs(10);

/// A UDP port free right now (bind port 0, read it, release it).
fn free_udp_addr() -> SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind port 0");
    socket.local_addr().expect("local addr")
}

/// A logical address for the in-memory transport (no real socket).
fn mem_addr(i: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], 7000 + i))
}

fn metadata_for(node_id: &str) -> NodeMetadata {
    NodeMetadata {
        proxy_addr: format!("{node_id}.proxy:8080"),
        rpc_addr: format!("{node_id}.rpc:8081"),
        version: "0.1.0".to_string(),
        sync_mode: "lease".to_string(),
        rpc_version: tollgate_cluster::membership::RPC_VERSION,
        spills: false,
    }
}

fn config(
    cluster_id: &str,
    node_id: &str,
    generation: u64,
    addr: SocketAddr,
    seeds: &[String],
) -> MembershipConfig {
    let mut config =
        MembershipConfig::new(cluster_id, node_id, generation, addr, metadata_for(node_id));
    config.seeds = seeds.to_vec();
    config.gossip_interval = GOSSIP_INTERVAL;
    config.dead_node_grace = Duration::from_secs(60);
    config
}

async fn start(config: MembershipConfig, transport: &dyn Transport) -> Membership {
    Membership::start(config, transport)
        .await
        .expect("membership starts")
}

/// Polls `check` until it holds; panics after `timeout`. Returns the time it took.
async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

async fn live_ids(node: &Membership) -> BTreeSet<MemberId> {
    node.live_members()
        .await
        .into_iter()
        .map(|m| m.id)
        .collect()
}

/// `observer` lists exactly `expected`, with their metadata, and sees each one's
/// `c:owner` value (its node id) plus `c:round` == `round`.
async fn sees_exactly(observer: &Membership, expected: &[&MemberId], round: &str) -> bool {
    let members = observer.live_members().await;
    let ids: BTreeSet<&MemberId> = members.iter().map(|m| &m.id).collect();
    if ids != expected.iter().copied().collect() {
        return false;
    }
    if !members
        .iter()
        .all(|m| m.metadata == metadata_for(&m.id.node_id))
    {
        return false;
    }
    let values = observer.live_values("c:").await;
    expected.iter().all(|id| {
        let want = vec![
            ("c:owner".to_string(), id.node_id.clone()),
            ("c:round".to_string(), round.to_string()),
        ];
        values
            .iter()
            .any(|(member, kvs)| member == *id && *kvs == want)
    })
}

async fn publish(node: &Membership, round: &str) {
    let kvs = vec![
        ("c:owner".to_string(), node.self_id().node_id.clone()),
        ("c:round".to_string(), round.to_string()),
    ];
    node.set_many(kvs).await.expect("small batch fits");
}

/// Waits until every node sees exactly all `nodes` with their values for `round`.
async fn converge(nodes: &[&Membership], round: &str) -> Duration {
    let ids: Vec<&MemberId> = nodes.iter().map(|n| n.self_id()).collect();
    wait_for("convergence", DEADLINE, || async {
        for node in nodes {
            if !sees_exactly(node, &ids, round).await {
                return false;
            }
        }
        true
    })
    .await
}

/// Three nodes from one seed: n1 seeds nobody, n2 dials n1 by address, n3 by name.
async fn three_nodes_form_one_cluster(
    cluster_id: &str,
    transport: &dyn Transport,
    addrs: [SocketAddr; 3],
    seed_name: String,
) {
    let n1 = start(config(cluster_id, "node-1", 1, addrs[0], &[]), transport).await;
    let n2 = start(
        config(cluster_id, "node-2", 1, addrs[1], &[addrs[0].to_string()]),
        transport,
    )
    .await;
    let n3 = start(
        config(cluster_id, "node-3", 1, addrs[2], &[seed_name]),
        transport,
    )
    .await;
    for node in [&n1, &n2, &n3] {
        publish(node, "1").await;
    }
    let took = converge(&[&n1, &n2, &n3], "1").await;
    println!("formation of 3 nodes: {took:?}");
    for node in [n1, n2, n3] {
        node.shutdown().await.expect("clean shutdown");
    }
}

#[tokio::test]
async fn udp_three_nodes_form_one_cluster_from_one_seed() {
    const CL: &str = "udp_three_nodes_form_one_cluster_from_one_seed";
    let addrs = [free_udp_addr(), free_udp_addr(), free_udp_addr()];
    // n3's seed is a DNS name: chitchat resolves it at start (and every 60 s after).
    let seed_name = format!("localhost:{}", addrs[0].port());
    three_nodes_form_one_cluster(CL, &UdpTransport, addrs, seed_name).await;
}

#[tokio::test(start_paused = true)]
async fn channel_three_nodes_form_one_cluster_from_one_seed() {
    const CL: &str = "channel_three_nodes_form_one_cluster_from_one_seed";
    let addrs = [mem_addr(1), mem_addr(2), mem_addr(3)];
    three_nodes_form_one_cluster(
        CL,
        &ChannelTransport::default(),
        addrs,
        addrs[0].to_string(),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn channel_partition_marks_other_side_dead_then_heals() {
    const CL: &str = "channel_partition_marks_other_side_dead_then_heals";
    let transport = ChannelTransport::default();
    let addrs: Vec<SocketAddr> = (1..=4).map(mem_addr).collect();
    let seeds = vec![addrs[0].to_string()];
    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        nodes.push(
            start(
                config(CL, &format!("node-{}", i + 1), 1, *addr, &seeds),
                &transport,
            )
            .await,
        );
    }
    let all: Vec<&Membership> = nodes.iter().collect();
    for node in &all {
        publish(node, "before").await;
    }
    converge(&all, "before").await;

    let (left, right) = all.split_at(2);
    for a in left {
        for b in right {
            transport
                .remove_link(a.self_id().gossip_addr, b.self_id().gossip_addr)
                .await;
        }
    }
    let detection = wait_for("each side to drop the other", DEADLINE, || async {
        for (side, other) in [(left, right), (right, left)] {
            let want: BTreeSet<MemberId> = side.iter().map(|n| n.self_id().clone()).collect();
            for node in side {
                let dead = node.dead_members().await;
                if live_ids(node).await != want || !other.iter().all(|o| dead.contains(o.self_id()))
                {
                    return false;
                }
            }
        }
        true
    })
    .await;
    let bound = all[0].failure_detection_time();
    println!("partition detection: {detection:?} (bound {bound:?})");
    assert!(
        detection <= bound + GOSSIP_INTERVAL,
        "detection {detection:?} > bound {bound:?}"
    );

    for node in &all {
        publish(node, "during").await;
    }
    for a in left {
        for b in right {
            transport
                .add_link(a.self_id().gossip_addr, b.self_id().gossip_addr)
                .await;
        }
    }
    let healing = converge(&all, "during").await;
    println!("partition healing (all live, values converged): {healing:?}");
}

#[tokio::test]
async fn killed_node_leaves_live_set_at_once_and_is_collected_after_grace() {
    const CL: &str = "killed_node_leaves_live_set_at_once_and_is_collected_after_grace";
    let addrs = [free_udp_addr(), free_udp_addr(), free_udp_addr()];
    let grace = Duration::from_secs(3);
    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let mut config = config(
            CL,
            &format!("node-{}", i + 1),
            1,
            *addr,
            &[addrs[0].to_string()],
        );
        config.dead_node_grace = grace;
        nodes.push(start(config, &UdpTransport).await);
    }
    for node in &nodes {
        publish(node, "1").await;
    }
    converge(&nodes.iter().collect::<Vec<_>>(), "1").await;

    // Dropping the node (not `shutdown`) must be enough.
    let victim_node = nodes.pop().expect("three nodes");
    let victim = victim_node.self_id().clone();
    drop(victim_node);
    let killed_at = Instant::now();
    let dropped = victim.clone();
    let detection = wait_for("survivors to mark the victim dead", DEADLINE, || async {
        for node in &nodes {
            // Dead first, then live: once dead, it must already be gone from both reads.
            let dead = node.dead_members().await.contains(&dropped);
            let live = live_ids(node).await.contains(&dropped);
            let valued = node
                .live_values("c:")
                .await
                .iter()
                .any(|(id, _)| *id == dropped);
            assert!(!dead || (!live && !valued), "dead yet still listed");
            if !dead {
                return false;
            }
            // Its last values stay readable as departed (what it spent still counts).
            let departed = node.departed_values("c:round").await;
            assert_eq!(
                departed,
                vec![(
                    dropped.clone(),
                    vec![("c:round".to_owned(), "1".to_owned())]
                )]
            );
        }
        true
    })
    .await;
    let bound = nodes[0].failure_detection_time();
    println!("death detection over UDP: {detection:?} (bound {bound:?})");
    assert!(
        detection <= bound + GOSSIP_INTERVAL,
        "detection {detection:?} > bound {bound:?}"
    );

    wait_for("dead member GC", grace + DEADLINE, || async {
        for node in &nodes {
            if node.dead_members().await.contains(&victim) {
                return false;
            }
            assert!(node.departed_values("").await.is_empty(), "collected");
        }
        true
    })
    .await;
    let gc_after = killed_at.elapsed();
    println!("dead member GC after kill: {gc_after:?} (grace {grace:?})");
    assert!(gc_after >= grace, "collected before the grace period");
}

#[tokio::test]
async fn restarted_node_with_higher_generation_rejoins_cleanly() {
    const CL: &str = "restarted_node_with_higher_generation_rejoins_cleanly";
    let addrs = [free_udp_addr(), free_udp_addr(), free_udp_addr()];
    let seeds = vec![addrs[0].to_string()];
    let n1 = start(config(CL, "node-1", 1, addrs[0], &seeds), &UdpTransport).await;
    let n2 = start(config(CL, "node-2", 1, addrs[1], &seeds), &UdpTransport).await;
    let n3 = start(config(CL, "node-3", 1, addrs[2], &seeds), &UdpTransport).await;
    for node in [&n1, &n2, &n3] {
        publish(node, "1").await;
    }
    converge(&[&n1, &n2, &n3], "1").await;

    n3.shutdown().await.expect("clean shutdown");
    // Same name and address, newer generation, rebinding the port at once.
    let n3 = start(config(CL, "node-3", 2, addrs[2], &seeds), &UdpTransport).await;
    publish(&n3, "2").await;
    let took = wait_for(
        "the new incarnation to replace the old",
        DEADLINE,
        || async {
            let mut ok = true;
            for node in [&n1, &n2] {
                let members = node.live_members().await;
                let incarnations: Vec<u64> = members
                    .iter()
                    .filter(|m| m.id.node_id == "node-3")
                    .map(|m| m.id.generation)
                    .collect();
                assert!(incarnations.len() <= 1, "two live incarnations of node-3");
                let values = node.live_values("c:round").await;
                ok &= incarnations == [2]
                    && values.iter().any(|(id, kvs)| {
                        id == n3.self_id() && kvs[..] == [("c:round".to_string(), "2".to_string())]
                    });
            }
            ok && live_ids(&n3).await.len() == 3
        },
    )
    .await;
    println!("restart rejoin: {took:?}");
    for node in [&n1, &n2, &n3] {
        assert_eq!(node.duplicate_ids_seen(), 0, "a restart is not a duplicate");
    }
}

#[tokio::test(start_paused = true)]
async fn newer_generation_supersedes_a_live_incarnation_at_once() {
    const CL: &str = "newer_generation_supersedes_a_live_incarnation_at_once";
    let transport = ChannelTransport::default();
    let seeds = vec![mem_addr(1).to_string()];
    let n1 = start(config(CL, "node-1", 1, mem_addr(1), &seeds), &transport).await;
    let old = start(config(CL, "node-2", 1, mem_addr(2), &seeds), &transport).await;
    for node in [&n1, &old] {
        publish(node, "1").await;
    }
    converge(&[&n1, &old], "1").await;
    // The old process is still running: the new one (new address) must win anyway.
    let new = start(config(CL, "node-2", 2, mem_addr(3), &seeds), &transport).await;
    wait_for("n1 to follow the new incarnation", DEADLINE, || async {
        live_ids(&n1).await == [n1.self_id().clone(), new.self_id().clone()].into()
    })
    .await;
    // Superseded (not dead yet): its values are departed, not live.
    assert!(
        n1.live_values("c:")
            .await
            .iter()
            .all(|(id, _)| id != old.self_id())
    );
    let departed = n1.departed_values("c:round").await;
    assert_eq!(
        departed,
        vec![(
            old.self_id().clone(),
            vec![("c:round".to_owned(), "1".to_owned())]
        )]
    );
    wait_for(
        "the old incarnation to learn it is superseded",
        DEADLINE,
        || async { old.watch_live().borrow().self_superseded },
    )
    .await;
    assert_eq!(
        n1.duplicate_ids_seen(),
        0,
        "a newer generation is a restart, not a duplicate"
    );
}

#[tokio::test]
async fn different_cluster_id_never_joins() {
    const CL: &str = "different_cluster_id_never_joins";
    let addrs = [
        free_udp_addr(),
        free_udp_addr(),
        free_udp_addr(),
        free_udp_addr(),
    ];
    // Both clusters share the same seed list, which holds a node of each.
    let seeds = vec![addrs[0].to_string(), addrs[2].to_string()];
    let mut nodes = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let cluster = if i < 2 { "cluster-x" } else { "cluster-y" };
        let mut config = config(CL, &format!("{cluster}-{i}"), 1, *addr, &seeds);
        config.cluster_id = cluster.to_string();
        nodes.push(start(config, &UdpTransport).await);
    }
    let (x, y) = nodes.split_at(2);
    let expect = |side: &[Membership]| -> BTreeSet<MemberId> {
        side.iter().map(|n| n.self_id().clone()).collect()
    };
    // Positive control: each cluster forms.
    wait_for("both clusters to form", DEADLINE, || async {
        for (side, want) in [(x, expect(x)), (y, expect(y))] {
            for node in side {
                if live_ids(node).await != want {
                    return false;
                }
            }
        }
        true
    })
    .await;
    // Then, for 20 gossip rounds, no node ever learns of the other cluster.
    let until = Instant::now() + GOSSIP_INTERVAL * 20;
    while Instant::now() < until {
        for node in &nodes {
            let prefix = &node.self_id().node_id[..9];
            let known = live_ids(node)
                .await
                .into_iter()
                .chain(node.dead_members().await);
            for id in known {
                assert!(
                    id.node_id.starts_with(prefix),
                    "{} learned of {id}",
                    node.self_id()
                );
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(start_paused = true)]
async fn duplicate_node_id_is_refused_and_counted() {
    const CL: &str = "duplicate_node_id_is_refused_and_counted";
    let transport = ChannelTransport::default();
    let seeds = vec![mem_addr(1).to_string()];
    let a = start(config(CL, "node-a", 10, mem_addr(1), &seeds), &transport).await;
    let b = start(config(CL, "node-b", 10, mem_addr(2), &seeds), &transport).await;
    for node in [&a, &b] {
        publish(node, "1").await;
    }
    converge(&[&a, &b], "1").await;

    // Same generation, then a lower one, each from another address.
    let mut duplicates = Vec::new();
    for (expected_count, (generation, port)) in [(10, 3), (5, 4)].into_iter().enumerate() {
        let dup = start(
            config(CL, "node-b", generation, mem_addr(port), &seeds),
            &transport,
        )
        .await;
        publish(&dup, "dup").await;
        let dup_id = dup.self_id().clone();
        wait_for("a to refuse the duplicate", DEADLINE, || async {
            a.watch_live().borrow().refused.contains(&dup_id)
        })
        .await;
        assert_eq!(a.duplicate_ids_seen(), expected_count as u64 + 1);
        assert!(
            sees_exactly(&a, &[a.self_id(), b.self_id()], "1").await,
            "dup changed a's view"
        );
        assert!(a.live_values("").await.iter().all(|(id, _)| *id != dup_id));
        wait_for("b to refuse its duplicate too", DEADLINE, || async {
            b.watch_live().borrow().refused.contains(&dup_id)
        })
        .await;
        duplicates.push(dup); // stays live until the test ends
    }
    assert!(b.duplicate_ids_seen() >= 2);
}

#[tokio::test(start_paused = true)]
async fn a_state_many_datagrams_large_reaches_a_peer_over_several_exchanges() {
    // 600 KB of keys (about ten datagrams): the gateway's counters for a few hundred
    // busy tenants. chitchat cuts each delta to the datagram and the peer catches up
    // over the next exchanges; every key arrives.
    const CL: &str = "a_state_many_datagrams_large_reaches_a_peer_over_several_exchanges";
    let transport = ChannelTransport::with_mtu(65_507);
    let seeds = vec![mem_addr(1).to_string()];
    let mut big = config(CL, "node-1", 1, mem_addr(1), &[]);
    big.limits = StateLimits {
        max_keys: 131_072,
        max_bytes: tollgate_cluster::membership::MAX_STATE_BYTES_CEILING,
    };
    let a = start(big, &transport).await;
    let b = start(config(CL, "node-2", 1, mem_addr(2), &seeds), &transport).await;
    let keys: Vec<(String, String)> = (0..12_000)
        .map(|i| {
            (
                format!("c:tenant:t{i}:tokens:{}", i % 61),
                format!("tfrksg:{i:x}"),
            )
        })
        .collect();
    let bytes: usize = keys.iter().map(|(k, v)| k.len() + v.len() + 16).sum();
    assert!(bytes > 600_000, "{bytes} bytes");
    a.set_many(keys.clone()).await.expect("within the caps");
    let a_id = a.self_id().clone();
    wait_for(
        "b to hold every key of a",
        Duration::from_secs(30),
        || async {
            (b.live_values("c:").await.into_iter())
                .find(|(id, _)| *id == a_id)
                .is_some_and(|(_, kvs)| kvs.len() == keys.len())
        },
    )
    .await;
    let (_, got) = (b.live_values("c:").await.into_iter())
        .find(|(id, _)| *id == a_id)
        .expect("a is live at b");
    let mut want = keys;
    want.sort();
    assert_eq!(got, want);
}

#[tokio::test(start_paused = true)]
async fn oversize_or_reserved_set_many_is_refused_and_changes_nothing() {
    const CL: &str = "oversize_or_reserved_set_many_is_refused_and_changes_nothing";
    let transport = ChannelTransport::default();
    let mut config = config(CL, "node-1", 1, mem_addr(1), &[]);
    config.limits = StateLimits {
        max_keys: 4,
        max_bytes: 256,
    };
    let node = start(config, &transport).await;
    let kv = |k: &str, v: &str| (k.to_string(), v.to_string());
    node.set_many(vec![kv("c:a", "1"), kv("c:b", "2")])
        .await
        .expect("fits");
    let too_many: Vec<_> = (0..3).map(|i| kv(&format!("c:n{i}"), "x")).collect();
    assert_eq!(
        node.set_many(too_many).await,
        Err(MembershipError::TooManyKeys { keys: 5, max: 4 })
    );
    let too_big = vec![kv("c:a", &"x".repeat(300))];
    assert!(matches!(
        node.set_many(too_big).await,
        Err(MembershipError::TooManyBytes { .. })
    ));
    assert!(matches!(
        node.set_many(vec![kv("m:proxy_addr", "evil:1")]).await,
        Err(MembershipError::ReservedKey { .. })
    ));
    let values = node.live_values("").await;
    assert_eq!(
        values,
        vec![(node.self_id().clone(), vec![kv("c:a", "1"), kv("c:b", "2")])]
    );
    assert_eq!(
        node.live_members().await[0].metadata,
        metadata_for("node-1")
    );
}

#[tokio::test(start_paused = true)]
async fn deleted_keys_free_the_cap_and_vanish_at_peers() {
    const CL: &str = "deleted_keys_free_the_cap_and_vanish_at_peers";
    let transport = ChannelTransport::default();
    let seeds = vec![mem_addr(1).to_string()];
    let mut capped = config(CL, "node-1", 1, mem_addr(1), &[]);
    capped.limits = StateLimits {
        max_keys: 3,
        max_bytes: 1_024,
    };
    let a = start(capped, &transport).await;
    let b = start(config(CL, "node-2", 1, mem_addr(2), &seeds), &transport).await;
    let kv = |k: &str, v: &str| (k.to_string(), v.to_string());
    let size = (a.publish(
        &[],
        vec![kv("c:old:0", "1"), kv("c:old:1", "2"), kv("c:x", "3")],
    ))
    .await
    .expect("fits");
    assert_eq!(size.keys, 3);
    let a_id = a.self_id().clone();
    let held_at_b = || async {
        (b.live_values("c:").await.into_iter())
            .find(|(id, _)| *id == a_id)
            .map(|(_, kvs)| kvs)
            .unwrap_or_default()
    };
    wait_for("b to hold a's keys", Duration::from_secs(10), || async {
        held_at_b().await.len() == 3
    })
    .await;
    // Full: a new key is refused, unless the same write deletes old ones (a key it
    // never held among them: nothing happens to it).
    assert!(a.set_many(vec![kv("c:new", "4")]).await.is_err());
    let deletes = ["c:old:0", "c:old:1", "c:never"].map(String::from);
    let size = (a.publish(&deletes, vec![kv("c:new", "4")]))
        .await
        .expect("the deletions make room");
    assert_eq!(size.keys, 2);
    let own = (a.live_values("c:").await.into_iter()).find(|(id, _)| *id == a_id);
    assert_eq!(
        own,
        Some((a_id.clone(), vec![kv("c:new", "4"), kv("c:x", "3")]))
    );
    wait_for(
        "b to drop a's deleted keys",
        Duration::from_secs(10),
        || async { held_at_b().await == vec![kv("c:new", "4"), kv("c:x", "3")] },
    )
    .await;
    // A deleted key written again is back, at its new value.
    (a.publish(&[], vec![kv("c:old:0", "9")]))
        .await
        .expect("fits");
    wait_for("b to see it again", Duration::from_secs(10), || async {
        held_at_b().await.contains(&kv("c:old:0", "9"))
    })
    .await;
}

/// A raw chitchat node in our cluster, publishing `kvs` and no validated metadata.
async fn raw_node(
    cluster_id: &str,
    transport: &ChannelTransport,
    name: &str,
    port: u16,
    kvs: Vec<(String, String)>,
) -> chitchat::ChitchatHandle {
    let id = ChitchatId::new(name, 1, mem_addr(port));
    let config = ChitchatConfig {
        chitchat_id: id,
        cluster_id: cluster_id.to_string(),
        gossip_interval: GOSSIP_INTERVAL,
        listen_addr: mem_addr(port),
        seed_nodes: vec![mem_addr(1).to_string()],
        failure_detector_config: FailureDetectorConfig {
            initial_interval: GOSSIP_INTERVAL,
            ..Default::default()
        },
        marked_for_deletion_grace_period: Duration::from_secs(60),
        catchup_callback: None,
        extra_liveness_predicate: None,
        protocol_version: ProtocolVersion::V0,
    };
    chitchat::spawn_chitchat(config, kvs, transport)
        .await
        .expect("raw chitchat starts")
}

#[tokio::test]
async fn member_with_missing_or_invalid_metadata_is_reported_not_trusted() {
    const CL: &str = "member_with_missing_or_invalid_metadata_is_reported_not_trusted";
    let transport = ChannelTransport::default();
    let a = start(config(CL, "node-a", 1, mem_addr(1), &[]), &transport).await;
    let _bare = raw_node(CL, &transport, "bare", 2, vec![("c:x".into(), "1".into())]).await;
    let mut bad = metadata_for("bad").to_key_values();
    bad.retain(|(k, _)| k != "m:rpc_addr");
    bad.push(("m:rpc_addr".into(), "no-port".into()));
    let _bad = raw_node(CL, &transport, "bad", 3, bad).await;
    wait_for("both to be reported untrusted", DEADLINE, || async {
        let view = a.watch_live().borrow().clone();
        let reason = |name: &str| {
            view.untrusted
                .iter()
                .find(|u| u.id.node_id == name)
                .map(|u| u.reason.clone())
        };
        matches!(reason("bare"), Some(MetadataError::Missing { .. }))
            && matches!(
                reason("bad"),
                Some(MetadataError::Invalid {
                    key: "m:rpc_addr",
                    ..
                })
            )
    })
    .await;
    assert_eq!(live_ids(&a).await, [a.self_id().clone()].into());
    assert_eq!(a.live_values("c:").await.len(), 1, "only self's values");
}

#[tokio::test]
async fn start_refuses_bad_config_and_busy_port() {
    const CL: &str = "start_refuses_bad_config_and_busy_port";
    let addr = free_udp_addr();
    let mut bad = config(CL, "node-1", 1, addr, &[]);
    bad.phi_threshold = 0.5;
    assert!(matches!(
        Membership::start(bad, &UdpTransport).await,
        Err(MembershipError::InvalidConfig {
            field: "phi_threshold",
            ..
        })
    ));
    let first = start(config(CL, "node-1", 1, addr, &[]), &UdpTransport).await;
    assert!(matches!(
        Membership::start(config(CL, "node-2", 1, addr, &[]), &UdpTransport).await,
        Err(MembershipError::Start(_))
    ));
    first.shutdown().await.expect("clean shutdown");
}
