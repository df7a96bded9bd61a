//! One conformance suite for every sync mode: 3 nodes in one process (real UDP
//! gossip; real internal RPC for `lease`; one real redis-server for the Redis
//! modes) in front of one real mock upstream whose counters are the ground truth,
//! demand ~4.5 x L spread unevenly over the nodes (20/10/4 requests/s for 4 s,
//! L = 30 requests per window), clients that wait up to 300 ms. Each mode must
//! keep the promise of the README's modes table.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::cluster::*;
use crate::common::redis::RedisServer;
use crate::common::*;
use std::sync::Arc;

/// What a mode promises for the cluster total, as (at most, at least).
fn promise(mode: &str, share: &str) -> (u64, u64) {
    match (mode, share) {
        // The baseline the cluster fixes: every node enforces L alone.
        ("local", "full") => (3 * LIMIT, LIMIT + 1),
        ("local", _) => (LIMIT, LIMIT * 8 / 10),
        // <= L x (1 + e); e is measured (printed), held under 0.2 here.
        ("gossip", _) => (LIMIT + LIMIT / 5, LIMIT * 9 / 10),
        // <= L, and at least 95% of it.
        _ => (LIMIT, LIMIT * 95 / 100),
    }
}

async fn conformance(mode: &str, share: &str) {
    let redis = mode.starts_with("redis").then(RedisServer::start);
    let upstream = mock(|_| {}).await;
    let ports: Vec<u16> = (0..3).map(|_| free_udp_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let mut toml = cluster_toml(i, &ports, mode, share)
            .replace("max_wait = \"0s\"", "max_wait = \"300ms\"");
        if let Some(redis) = &redis {
            toml.push_str(&format!(
                "\n[redis]\nurl = \"{}\"\ntimeout = \"50ms\"\n",
                redis.url()
            ));
        }
        nodes.push(Arc::new(node(&toml, &[&upstream]).await));
    }
    for n in &nodes {
        wait_members(n, 3).await;
    }
    let admitted = load(urls(&nodes), &[20, 10, 4], 4.0).await;
    let truth = upstream.stats().admitted;
    let (at_most, at_least) = promise(mode, share);
    println!(
        "{mode} {share}: demand ~136 over 4 s vs L = {LIMIT}: upstream admitted {truth} {admitted:?}; overshoot {:.3}, utilisation {:.2}",
        truth as f64 / LIMIT as f64 - 1.0,
        truth as f64 / LIMIT as f64
    );
    assert_eq!(
        admitted.iter().sum::<u64>(),
        truth,
        "every 200 reached the upstream once"
    );
    assert!(
        truth <= at_most,
        "{mode} {share} admitted {truth} > {at_most}"
    );
    assert!(
        truth >= at_least,
        "{mode} {share} used only {truth} (< {at_least})"
    );
    let metrics = metrics(&nodes[0]).await;
    let expected: &[&str] = match mode {
        "lease" | "redis-lease" => &[
            "tollgate_lease_statements_total{side=\"holder\",outcome=\"granted\"}",
            "tollgate_sync_received_bytes_total",
            "tollgate_sync_convergence_lag_ms",
        ],
        "redis" => &["tollgate_redis_script_seconds_count{script=\"reserve\"}"],
        _ => &["tollgate_sync_published_bytes_total"],
    };
    for family in expected {
        assert!(metrics.contains(family), "{family} missing:\n{metrics}");
    }
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_full_is_the_n_times_baseline() {
    conformance("local", "full").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_split_stays_within_l() {
    conformance("local", "split").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_stays_within_l_times_one_plus_e() {
    conformance("gossip", "full").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_stays_within_l_and_uses_95_percent() {
    conformance("lease", "full").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stays_within_l_and_uses_95_percent() {
    conformance("redis", "full").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_stays_within_l_and_uses_95_percent() {
    conformance("redis-lease", "full").await;
}
