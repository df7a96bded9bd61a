//! The Redis strict modes when Redis dies, with 3 nodes in one process (real UDP
//! gossip) sharing one real redis-server started (and killed) by the test, in
//! front of one real mock upstream whose counters are the ground truth. Healthy
//! promises are in `tests/conformance.rs`.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

mod common;

use common::cluster::*;
use common::redis::RedisServer;
use common::*;
use std::sync::Arc;
use tokio::time::Instant;

fn redis_toml(i: usize, ports: &[u16], mode: &str, redis_url: &str, rpm: u64) -> String {
    format!(
        "{}\n[redis]\nurl = \"{redis_url}\"\ntimeout = \"50ms\"\n",
        cluster_toml(i, ports, mode, "full")
            .replace(&format!("rpm = {LIMIT}\n"), &format!("rpm = {rpm}\n"))
            .replace("max_wait = \"0s\"", "max_wait = \"300ms\""),
    )
}

/// Three nodes in `mode`, node i reaching Redis at `redis_url(i)`.
async fn redis_cluster(
    mode: &str,
    redis_url: impl Fn(usize) -> String,
    rpm: u64,
    upstream: &tollgate::mock::MockHandle,
) -> Vec<Arc<Node>> {
    let ports: Vec<u16> = (0..3).map(|_| free_udp_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let toml = redis_toml(i, &ports, mode, &redis_url(i), rpm);
        nodes.push(Arc::new(node(&toml, &[upstream]).await));
    }
    for n in &nodes {
        wait_members(n, 3).await;
    }
    nodes
}

/// Redis SIGKILLed mid-load, then restarted: every node keeps serving within its
/// share while it is down, says so, and recovers (within 5 s) once it is back.
async fn redis_dies(mode: &str) {
    const L: u64 = 300;
    let mut redis = RedisServer::start();
    let upstream = mock(|_| {}).await;
    let nodes = redis_cluster(mode, |_| redis.url(), L, &upstream).await;
    let before = load(urls(&nodes), &[10, 10, 10], 1.5).await;
    redis.kill();
    let during = load(urls(&nodes), &[30, 30, 30], 2.0).await;
    let body = admin(&nodes[0], "/admin/cluster").await;
    let degraded = body["cluster"]["degraded"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(degraded.starts_with("redis_unreachable"), "{body}");
    redis.restart();
    // Recovery: probed each sync round (`redis`: local spending reconciled first;
    // `redis-lease`: the next statement carries full usage).
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let body = admin(&nodes[0], "/admin/cluster").await;
        if body["cluster"]["degraded"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "never recovered: {body}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let after = load(urls(&nodes), &[10, 10, 10], 1.5).await;
    let truth = upstream.stats().admitted;
    println!(
        "{mode}, Redis killed then restarted empty: before {before:?}, during {during:?}, after {after:?}; upstream admitted {truth} of L = {L}"
    );
    assert!(
        during.iter().sum::<u64>() > 0,
        "nothing served while Redis was down"
    );
    // Each node spends at most its share (~L/3) of the window while cut off.
    for (i, n) in during.iter().enumerate() {
        assert!(
            before[i] + n <= L / 3 + 5,
            "node {i} spent {} > its share",
            before[i] + n
        );
    }
    assert!(
        after.iter().sum::<u64>() > 0,
        "nothing served after recovery"
    );
    assert!(truth <= L, "admitted {truth} > L = {L}");
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_nodes_keep_serving_their_share_when_redis_dies_and_recover() {
    redis_dies("redis-lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_mode_falls_back_to_shares_when_redis_dies_and_reconciles_after() {
    redis_dies("redis").await;
}

/// Node 3 reaches Redis through a relay the test cuts: only it loses Redis.
async fn partial_loss(mode: &str) {
    const L: u64 = 300;
    let redis = RedisServer::start();
    let relay = common::redis::TcpRelay::start(redis.port).await;
    let upstream = mock(|_| {}).await;
    let url = |i: usize| if i == 2 { relay.url() } else { redis.url() };
    let nodes = redis_cluster(mode, url, L, &upstream).await;
    let before = load(urls(&nodes), &[10, 10, 10], 1.5).await;
    relay.cut();
    let during = load(urls(&nodes), &[40, 40, 40], 3.0).await;
    let body = admin(&nodes[2], "/admin/cluster").await;
    let degraded = body["cluster"]["degraded"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let healthy = admin(&nodes[0], "/admin/cluster").await;
    relay.heal();
    let truth = upstream.stats().admitted;
    println!(
        "{mode}, node 3 cut off from Redis: before {before:?}, during {during:?}; upstream admitted {truth} of L = {L} (excess {})",
        truth.saturating_sub(L)
    );
    assert!(degraded.starts_with("redis_unreachable"), "{body}");
    assert!(
        healthy["cluster"]["degraded"].is_null(),
        "the others still reach Redis: {healthy}"
    );
    assert!(during[2] > 0, "the cut-off node stopped serving");
    // Its share (about L/3 here): `redis-lease` the reservation Redis confirmed,
    // per window in all; `redis` the equal share its peers charge it, beyond what
    // it had already reserved in Redis (that stays in Redis, within their cap).
    // Unbounded, it would have admitted all it was sent.
    let spent = if mode == "redis" {
        during[2]
    } else {
        before[2] + during[2]
    };
    assert!(
        spent <= L / 3 + 2,
        "the cut-off node exceeded its share: {spent}"
    );
    // The others were charged its share in Redis: together within L. `redis-lease`
    // because Redis keeps its reservation while its account is live, and then
    // because it is held; `redis` because the node spends nothing locally until
    // both peers have confirmed they charge its loss (src/sync/redis_loss.rs).
    assert!(truth <= L, "admitted {truth} > L = {L}");
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_by_one_node_only_its_share_is_charged_in_redis() {
    partial_loss("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_lost_by_one_node_only_its_share_is_charged_in_redis() {
    partial_loss("redis-lease").await;
}
