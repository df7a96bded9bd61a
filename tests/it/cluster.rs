//! `gossip` and `local` under faults, with 3 nodes in one process over real UDP
//! loopback gossip (or chitchat's in-memory transport for partitions), in front of
//! one real mock upstream whose counters are the ground truth. The healthy
//! promises of every mode are in `tests/it/conformance.rs`.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::cluster::*;
use crate::common::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_nodes_concurrency_slots_come_back_at_detection_and_its_usage_stays_charged() {
    let upstream = mock(|m| {
        m.inter_token_ms = 100;
        m.completion_min_tokens = 100;
        m.completion_max_tokens = 100;
    })
    .await;
    let ports: Vec<u16> = (0..3).map(|_| free_udp_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        // Requests may queue: a node whose demand the cluster has not seen yet gets
        // its share on the next sync round.
        let toml = cluster_toml(i, &ports, "gossip", "full")
            .replace(
                &format!("rpm = {LIMIT}"),
                &format!("rpm = {LIMIT}\nconcurrency = 2"),
            )
            .replace("max_wait = \"0s\"", "max_wait = \"5s\"");
        nodes.push(node(&toml, &[&upstream]).await);
    }
    let crashed = nodes.pop().unwrap();
    let (n1, n2) = (&nodes[0], &nodes[1]);
    let formed = Instant::now() + Duration::from_secs(10);
    while admin(n1, "/admin/cluster").await["cluster"]["members"]
        .as_array()
        .is_none_or(|m| m.len() < 3)
    {
        assert!(Instant::now() < formed, "cluster did not form");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The status names the mode's promise, as its round states it.
    let promise = admin(n1, "/admin/cluster").await["cluster"]["promise"].clone();
    assert_eq!(
        promise.as_str(),
        Some("gossip: cluster total <= L x (1 + e), e from gossip lag, measured")
    );
    // The third node takes one of the cluster's two slots with a 10 s stream.
    let mut body = chat_body("long story", 100);
    body["stream"] = serde_json::json!(true);
    let mut stream = post(&crashed, "/chat/completions", body, &[]).await;
    if stream.status() != 200 {
        panic!("{}: {}", stream.status(), stream.text().await.unwrap());
    }
    assert!(stream.chunk().await.unwrap().is_some());
    let key = "tenant:t:concurrency";
    let seen = Instant::now() + Duration::from_secs(5);
    loop {
        let (a, b) = (
            admin(n1, "/admin/cluster").await,
            admin(n2, "/admin/cluster").await,
        );
        if allowance(&a, key) + allowance(&b, key) <= 1 {
            break;
        }
        assert!(Instant::now() < seen, "the slot in use was never seen: {a}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Crash it: no drain, no goodbye.
    let crashed_at = Instant::now();
    crashed.crash().await;
    drop(stream);
    let back = Instant::now() + Duration::from_secs(10);
    loop {
        let (a, b) = (
            admin(n1, "/admin/cluster").await,
            admin(n2, "/admin/cluster").await,
        );
        if allowance(&a, key) + allowance(&b, key) == 2 {
            // Its request stays charged in the window: the survivors' request
            // allowances leave room for it.
            let requests = allowance(&a, "tenant:t:requests") + allowance(&b, "tenant:t:requests");
            assert!(
                requests < LIMIT,
                "the crashed node's usage must stay charged: {a}"
            );
            break;
        }
        assert!(Instant::now() < back, "slots never came back: {a}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "crashed node's concurrency slot came back after {:?}",
        crashed_at.elapsed()
    );
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// A waiter held back only by its node's cluster allowance is admitted as the
/// engine raises the allowance, not at the actor's next re-check (up to
/// `ALLOWANCE_RETRY_HINT_NS`, 250 ms, later). Rounds are 1 s apart here so that
/// nothing else (the round's export) wakes the actor meanwhile. Measured: 0 ms
/// (admitted before the poll saw the rise) with the wake, 247-251 ms each
/// without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_admits_a_waiter_as_soon_as_its_allowance_rises() {
    let upstream = mock(|m| {
        m.inter_token_ms = 100;
        m.completion_min_tokens = 6;
        m.completion_max_tokens = 6;
    })
    .await;
    let ports: Vec<u16> = (0..2).map(|_| free_udp_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..2 {
        let toml = cluster_toml(i, &ports, "gossip", "full")
            .replace(
                &format!("rpm = {LIMIT}"),
                &format!("rpm = {LIMIT}\nconcurrency = 1"),
            )
            .replace("max_wait = \"0s\"", "max_wait = \"10s\"")
            .replace("sync_interval = \"100ms\"", "sync_interval = \"1s\"")
            .replace("ttl = \"1s\"", "ttl = \"4s\"");
        nodes.push(Arc::new(node(&toml, &[&upstream]).await));
    }
    let (holder, waiter) = (nodes[0].clone(), nodes[1].clone());
    let formed = Instant::now() + Duration::from_secs(10);
    while members_seen(&holder).await < 2 || members_seen(&waiter).await < 2 {
        assert!(Instant::now() < formed, "cluster did not form");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = "tenant:t:concurrency";
    let streaming = || {
        let mut body = chat_body("a short story", 6);
        body["stream"] = serde_json::json!(true);
        body
    };
    let mut lags = Vec::new();
    for _ in 0..4 {
        // The holder takes the one slot (waiting for it if the last round's
        // split still gives it to the waiter) and streams for ~0.6 s.
        let held = post(&holder, "/chat/completions", streaming(), &[]).await;
        assert_eq!(held.status(), 200);
        let seen = Instant::now() + Duration::from_secs(5);
        while allowance(&admin(&waiter, "/admin/cluster").await, key) > 0 {
            assert!(Instant::now() < seen, "the held slot was never seen");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let asking = waiter.clone();
        let admitted = tokio::spawn(async move {
            let response = post(&asking, "/chat/completions", streaming(), &[]).await;
            (Instant::now(), response)
        });
        let _ = held.bytes().await;
        // The moment the engine gives the waiter the freed slot.
        let given = Instant::now() + Duration::from_secs(8);
        while allowance(&admin(&waiter, "/admin/cluster").await, key) == 0 {
            assert!(Instant::now() < given, "the freed slot never came");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let rose = Instant::now();
        let (at, response) = admitted.await.unwrap();
        assert_eq!(response.status(), 200);
        lags.push(at.saturating_duration_since(rose));
        let _ = response.bytes().await;
    }
    println!("admitted after the allowance rose: {lags:?}");
    assert!(
        lags.iter().all(|lag| *lag < Duration::from_millis(80)),
        "a waiter waited for its re-check after its allowance rose: {lags:?}"
    );
    drop((holder, waiter));
    for n in nodes {
        Arc::into_inner(n).unwrap().stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// A bare membership (no gateway) as `node-1` on `ports[1]`, seeded by the node on
/// `ports[0]`, with valid metadata: a member the node trusts and reads.
async fn plain_member(ports: &[u16], version: &str) -> tollgate_cluster::membership::Membership {
    bare_member(ports, 1, gossip_metadata(version)).await
}

/// Valid metadata of a `gossip` member announcing `version`.
fn gossip_metadata(version: &str) -> tollgate_cluster::membership::NodeMetadata {
    tollgate_cluster::membership::NodeMetadata {
        proxy_addr: "127.0.0.1:1".into(),
        rpc_addr: "127.0.0.1:1".into(),
        version: version.into(),
        sync_mode: "gossip".into(),
        rpc_version: tollgate_cluster::membership::RPC_VERSION,
        spills: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_values_that_do_not_decode_are_refused_counted_and_change_nothing() {
    let upstream = mock(|_| {}).await;
    let ports: Vec<u16> = (0..2).map(|_| free_udp_port()).collect();
    let node = node(&cluster_toml(0, &ports, "gossip", "full"), &[&upstream]).await;
    // A member with valid metadata that publishes garbage counter values.
    let evil = plain_member(&ports, "evil").await;
    evil.set_many(vec![
        ("c:tenant:t:requests:0".into(), "not:a-number!".into()),
        ("d:tenant:t:requests".into(), "-5".into()),
    ])
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let body = admin(&node, "/admin/cluster").await;
        if body["cluster"]["decode_errors_total"].as_u64().unwrap_or(0) >= 2 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "garbage was never refused: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Nothing was charged for it: with no usage anywhere, the two members split the
    // whole limit between them.
    let requests = body["allowances"]["tenant:t:requests"]["allowance"]
        .as_u64()
        .unwrap();
    assert_eq!(requests, LIMIT / 2, "{body}");
    let metrics = metrics(&node).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tollgate_gossip_values_refused_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
    evil.shutdown().await.unwrap();
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// Gossip is sealed under the cluster secret: a process without it (chitchat's
/// own unsealed wire, another secret, or another secret under a member's
/// `node_id` and a newer generation) is never seen as a member, never owns or
/// supersedes anything, and the node counts what it dropped; a member holding
/// the secret is seen at once (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_without_the_cluster_secret_is_dropped_unread() {
    use tollgate_cluster::chitchat::transport::UdpTransport;
    let upstream = mock(|_| {}).await;
    let ports: Vec<u16> = (0..4).map(|_| free_udp_port()).collect();
    let node = node(
        &cluster_toml(0, &ports[..1], "gossip", "full"),
        &[&upstream],
    )
    .await;
    wait_members(&node, 1).await;
    let metadata = gossip_metadata;
    let cluster_id = format!("test-{}", ports[0]);
    let wrong = sealed_gossip(&cluster_id, "not-the-cluster-secret-0123");
    let on = |i: usize| [ports[0], ports[i]];
    let unsealed = bare_member_over(&on(1), "plain", 1, metadata("x"), &UdpTransport).await;
    let stranger = bare_member_over(&on(2), "stranger", 1, metadata("x"), &wrong).await;
    let impostor = bare_member_over(&on(3), "node-0", u64::MAX / 2, metadata("x"), &wrong).await;
    let refused = |text: &str, reason: &str| {
        let series = format!("tollgate_gossip_datagrams_refused_total{{reason=\"{reason}\"}} ");
        (text.lines())
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(&node).await;
        if refused(&text, "malformed") >= 3 && refused(&text, "wrong_secret") >= 6 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "intruders' gossip was not counted: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A second of gossip rounds later: still alone, still serving (not superseded).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(members_seen(&node).await, 1);
    let served = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(served.status(), 200, "{}", served.text().await.unwrap());
    for intruder in [unsealed, stranger, impostor] {
        assert_eq!(
            intruder.watch_live().borrow().members.len(),
            1,
            "an intruder learned the cluster"
        );
        intruder.shutdown().await.unwrap();
    }
    // The control: the same member with the secret joins.
    let member = bare_member(&on(1), 1, metadata(env!("CARGO_PKG_VERSION"))).await;
    wait_members(&node, 2).await;
    member.shutdown().await.unwrap();
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// A tenant used once and then quiet for a window has its counter ring deleted
/// from the cluster state (not only zeroed): the node's published state shrinks
/// back, a peer stops holding the ring, and using the tenant again publishes it
/// again. Without it every tenant ever used kept ~3 KB per windowed limit in every
/// member until the node restarted, and ~2,000 of them filled the state cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_gone_quiet_has_its_ring_deleted_and_comes_back_when_used() {
    let upstream = mock(|_| {}).await;
    let ports: Vec<u16> = (0..2).map(|_| free_udp_port()).collect();
    // A 2 s window, so that a quiet tenant's buckets and demand clear quickly.
    let toml =
        cluster_toml(0, &ports, "gossip", "full") + "\n[limits]\nwindow = \"2s\"\nbuckets = 4\n";
    let node = node(&toml, &[&upstream]).await;
    // A plain member that only watches what the node publishes.
    let observer = plain_member(&ports, "observer").await;
    let ring_at_observer = || async {
        (observer.live_values("").await.into_iter())
            .filter(|(id, _)| id.node_id == "node-0")
            .flat_map(|(_, kvs)| kvs)
            .filter(|(k, _)| k.starts_with("c:") || k.starts_with("d:") || k.starts_with("f:"))
            .count()
    };
    let state = |body: &serde_json::Value, field: &str| body["cluster"][field].as_u64().unwrap();
    let use_tenant = || async {
        let r = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    };

    let deadline = Instant::now() + Duration::from_secs(10);
    while ring_at_observer().await == 0 {
        use_tenant().await;
        assert!(Instant::now() < deadline, "the ring never reached the peer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let busy = admin(&node, "/admin/cluster").await;
    assert!(
        state(&busy, "state_keys") >= 2,
        "a slot and the demand: {busy}"
    );
    // Quiet: a window for the usage to leave, a window more, a few rounds, and
    // the ring is gone, here and there.
    let deadline = Instant::now() + Duration::from_secs(15);
    let quiet = loop {
        let body = admin(&node, "/admin/cluster").await;
        if ring_at_observer().await == 0 && state(&body, "state_keys") == 1 {
            break body;
        }
        assert!(Instant::now() < deadline, "the quiet ring stayed: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The request key (and the in-flight key too, if a round caught a request
    // in flight).
    assert!(state(&quiet, "keys_retired_total") >= 1, "{quiet}");
    assert_eq!(
        state(&quiet, "state_keys"),
        1,
        "only the round stamp: {quiet}"
    );
    assert!(state(&quiet, "state_bytes") < state(&busy, "state_bytes"));
    let metrics = metrics(&node).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tollgate_sync_state_bytes ")),
        "{metrics}"
    );
    // Used again: published again, and the peer sees it.
    use_tenant().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ring_at_observer().await == 0 {
        assert!(Instant::now() < deadline, "the ring did not come back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    observer.shutdown().await.unwrap();
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_through_a_partition_and_convergence_after_healing() {
    let upstream = mock(|_| {}).await;
    // Logical gossip ports in the in-memory transport (never bound on the host).
    let ports = [11_001u16, 11_002, 11_003];
    let addr = |i: usize| std::net::SocketAddr::from(([127, 0, 0, 1], ports[i]));
    let toml = |i: usize, ports: &[u16]| {
        cluster_toml(i, ports, "gossip", "full").replace("max_wait = \"0s\"", "max_wait = \"1s\"")
    };
    let (transport, nodes) = channel_cluster(ports, toml, &upstream).await;
    // Healthy: every node shows some demand.
    uneven_demand(&nodes, [4, 4, 4], 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    cut_off_third(&transport, ports, &nodes).await;
    let degraded = admin(&nodes[2], "/admin/cluster").await;
    assert!(
        degraded["cluster"]["degraded"]
            .as_str()
            .is_some_and(|r| r.starts_with("members_unreachable")),
        "{degraded}"
    );
    let metrics = metrics(&nodes[2]).await;
    assert!(
        metrics.contains("tollgate_degraded{scope=\"cluster\",reason=\"members_unreachable\"} 1"),
        "{metrics}"
    );
    // Both sides push well above the limit.
    uneven_demand(&nodes, [20, 10, 20], 2).await;
    let during = upstream.stats().admitted;
    let overshoot = during as f64 / LIMIT as f64 - 1.0;
    println!("partition: admitted {during} of L = {LIMIT} (overshoot e = {overshoot:.3})");
    assert!(during <= LIMIT + LIMIT / 2, "partition admitted {during}");
    // Heal, and time until every node's view of global usage is the truth.
    transport.add_link(addr(2), addr(0)).await;
    transport.add_link(addr(2), addr(1)).await;
    let healed = Instant::now();
    let nodes: Vec<Node> = nodes
        .into_iter()
        .map(|n| Arc::try_unwrap(n).ok().unwrap())
        .collect();
    let truth = upstream.stats().admitted;
    loop {
        let seen = views(&nodes, "tenant:t:requests").await;
        if seen.iter().all(|v| v.abs_diff(truth) * 100 <= truth) {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(10),
            "views {seen:?} never converged to {truth}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let convergence = healed.elapsed();
    println!(
        "convergence after healing: {convergence:?}; gossip bytes over the run: {}",
        transport.statistics().num_bytes_total
    );
    assert!(
        convergence < Duration::from_secs(1),
        "converged only after {convergence:?}"
    );
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// Node ids name one process at a time. A process that sees a newer generation
/// of its own id live (peers follow that one, docs/design/membership.md) stops
/// admitting for good: what it spent would be outside every peer's account, and
/// a crashed incarnation's floor ends a window after its successor appears on
/// the strength of this rule (`src/sync/partition/successor.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_superseded_under_its_node_id_refuses_every_request() {
    let upstream = mock(|_| {}).await;
    let ports: Vec<u16> = (0..2).map(|_| free_udp_port()).collect();
    // Requests may wait for the node's first credit.
    let toml = |i: usize, ports: &[u16]| {
        cluster_toml(i, ports, "lease", "full").replace("max_wait = \"0s\"", "max_wait = \"2s\"")
    };
    let first = node(&toml(0, &ports), &[&upstream]).await;
    let old = node(&toml(1, &ports), &[&upstream]).await;
    wait_members(&first, 2).await;
    wait_members(&old, 2).await;
    let chat = || chat_body("hi", 5);
    assert_eq!(
        post(&old, "/chat/completions", chat(), &[]).await.status(),
        200
    );
    // A second process under `node-1`, started later (a higher generation), on
    // another gossip port.
    let newer_ports = [ports[0], free_udp_port()];
    let newer = node(&toml(1, &newer_ports), &[&upstream]).await;
    let ready = |n: &Node| {
        reqwest::Client::new()
            .get(format!("http://{}/readyz", n.addr))
            .send()
    };
    let fenced = Instant::now() + Duration::from_secs(10);
    while ready(&old).await.unwrap().status() != 503 {
        assert!(Instant::now() < fenced, "the older process never noticed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = post(&old, "/chat/completions", chat(), &[]).await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body = json(refused).await;
    assert_eq!(body["error"]["code"], "service_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("node_id"), "{message}");
    let status = admin(&old, "/admin/cluster").await;
    let degraded = status["cluster"]["degraded"].as_str().unwrap_or_default();
    assert!(degraded.starts_with("superseded"), "{status}");
    assert!(
        metrics(&old)
            .await
            .contains(r#"tollgate_degraded{scope="cluster",reason="superseded"} 1"#)
    );
    // The newer process serves; the older one stays fenced.
    assert_eq!(ready(&newer).await.unwrap().status(), 200);
    assert_eq!(
        post(&newer, "/chat/completions", chat(), &[])
            .await
            .status(),
        200
    );
    assert_eq!(
        post(&old, "/chat/completions", chat(), &[]).await.status(),
        503
    );
    for n in [first, old, newer] {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// `x-ratelimit-remaining-*` is what the node may still admit: within its
/// cluster allowance, not only within L by its own count (a `local split`
/// node whose share is spent must not tell a refused request "2 remaining").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_headers_count_the_nodes_cluster_allowance() {
    let upstream = mock(|_| {}).await;
    let ports: Vec<u16> = (0..2).map(|_| free_udp_port()).collect();
    let toml = |i: usize| {
        let toml = cluster_toml(i, &ports, "local", "split")
            .replace(&format!("rpm = {LIMIT}\n"), "rpm = 4\n");
        assert!(toml.contains("rpm = 4\n"));
        toml
    };
    let a = node(&toml(0), &[&upstream]).await;
    let b = node(&toml(1), &[&upstream]).await;
    wait_members(&a, 2).await;
    wait_members(&b, 2).await;
    let split = Instant::now() + Duration::from_secs(10);
    while allowance(&admin(&a, "/admin/cluster").await, "tenant:t:requests") != 2 {
        assert!(Instant::now() < split, "the split never reached node a");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let remaining = |r: &reqwest::Response| {
        r.headers()["x-ratelimit-remaining-requests"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    let first = post(&a, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(
        (first.status().as_u16(), remaining(&first)),
        (200, "1".to_owned())
    );
    let second = post(&a, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(
        (second.status().as_u16(), remaining(&second)),
        (200, "0".to_owned())
    );
    let refused = post(&a, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(
        (refused.status().as_u16(), remaining(&refused)),
        (429, "0".to_owned())
    );
    for n in [a, b] {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// `local split` with a node joining during a cut: the side's part of L, by its
/// members at the cut (2 of 3: 20 of L = 30), is shared by the members live now,
/// the newcomer included. Before, every node divided L by all the members it
/// knew, the newcomer among them, so each joiner added a share: 3 x 30/4 = 22 on
/// a side whose far side kept its 10 (docs/design/cluster.md, "Joining during a
/// cut").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_split_shares_a_sides_part_of_l_with_a_node_that_joined_during_the_cut() {
    use tollgate_cluster::chitchat::transport::Transport;
    let upstream = mock(|_| {}).await;
    let ports = [12_051, 12_052, 12_053];
    let toml = |i: usize, ports: &[u16]| cluster_toml(i, ports, "local", "split");
    let (transport, mut nodes) = channel_cluster(ports, toml, &upstream).await;
    cut_off_third(&transport, ports, &nodes).await;
    // The newcomer joins the majority side, well after node 3 went silent.
    let newcomer_port = 12_054;
    let addr = |p: u16| std::net::SocketAddr::from(([127, 0, 0, 1], p));
    transport
        .remove_link(addr(newcomer_port), addr(ports[2]))
        .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let all = [ports[0], ports[1], ports[2], newcomer_port];
    let shared: Arc<dyn Transport> = Arc::new(transport.clone());
    nodes.push(Arc::new(
        node_with_transport(&toml(3, &all), &[&upstream], Some(shared)).await,
    ));
    let side = [&nodes[0], &nodes[1], &nodes[3]];
    for n in side {
        wait_members(n, 3).await;
    }
    let newcomer = admin(side[2], "/admin/cluster").await;
    assert_eq!(newcomer["cluster"]["cut_adopted"], true, "{newcomer}");
    // A few sync rounds (100 ms) for every allowance to follow the membership.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let key = "tenant:t:requests";
    let mut shares = Vec::new();
    let mut views = Vec::new();
    for n in side {
        let view = admin(n, "/admin/cluster").await;
        shares.push(allowance(&view, key));
        views.push(view);
    }
    assert!(
        shares.iter().all(|s| *s > 0),
        "each serves: {shares:?}\n{views:#?}"
    );
    println!(
        "a side of 2 of 3 at the cut, a newcomer joined: allowances {shares:?} of L = {LIMIT}"
    );
    assert!(shares.iter().sum::<u64>() <= LIMIT * 2 / 3, "{shares:?}");
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}
