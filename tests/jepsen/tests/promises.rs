//! The CI suite (first slice): real processes in network namespaces, short runs.
//! `lease` keeps <= L (0 upstream 429s) through a partition into halves and a
//! SIGSTOP (after the late-send guard); `gossip` keeps <= L x 1.2 through a
//! partition; `local full`, the baseline without cluster sync, is caught
//! overshooting by the checker (the test asserts the checker reports it).
//! `redis-lease` keeps <= L through Redis killed and restarted (its reservations);
//! `redis` keeps gossip's promise through it (<= L x 1.2).
//! `lease` keeps <= L through a kill -9 of a node (41 of 40 intermittently in an
//! earlier session, not reproduced since: docs/jepsen.md).
//!
//! Needs root (CAP_NET_ADMIN), iproute2 and iptables; without them it fails with a
//! message saying so (never a silent skip).

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use std::path::PathBuf;
use std::time::Duration;
use tollgate_jepsen::run::{Outcome, RunSpec};

/// One run at a time: each run is 4-5 processes whose timing is the subject;
/// several at once on a 2-core machine measure CPU contention, not the gateway.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run(spec: RunSpec) -> anyhow::Result<Outcome> {
    let _turn = ONE_AT_A_TIME.lock().await;
    tollgate_jepsen::run::run(spec).await
}

fn spec(mode: &str, nemesis: &str, subnet: u8) -> RunSpec {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("jepsen-{mode}-{nemesis}"));
    RunSpec {
        mode: mode.into(),
        nemesis: vec![nemesis.into()],
        nodes: 3,
        duration: Duration::from_secs(16),
        seed: 7,
        limit: 40,
        window: Duration::from_secs(8),
        subnet,
        bin: PathBuf::from(env!("CARGO_BIN_EXE_tollgate-jepsen")),
        dir,
    }
}

fn report(outcome: &Outcome) -> String {
    std::fs::read_to_string(&outcome.report).unwrap()
}

/// One run of `mode` under `nemesis` on its own subnet; every check must pass.
async fn keeps_its_promise(mode: &str, nemesis: &str, subnet: u8) {
    let outcome = run(spec(mode, nemesis, subnet)).await.unwrap();
    let report = report(&outcome);
    println!("{report}");
    assert!(outcome.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keeps_its_promise_through_a_partition() {
    keeps_its_promise("lease", "partition", 31).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_a_cluster_without_sync() {
    // `local full` is every node limiting alone: what a gateway without cluster
    // sync does. Held to lease's promise (<= L), the checker must fail it.
    let mut broken = spec("local-full", "none", 33);
    broken.duration = Duration::from_secs(10);
    let outcome = run(broken).await.unwrap();
    let report = report(&outcome);
    println!("{report}");
    let lease = tollgate_jepsen::checker::Case {
        mode: "lease",
        nemeses: &[],
        nodes: 3,
        limit: 40,
        window_ms: 8_000,
    };
    let peak = tollgate_jepsen::checker::check(&lease, &read_mock(&outcome), &[]);
    assert!(
        !peak[0].ok && !peak[1].ok,
        "overshoot and upstream 429s must be reported: {peak:?}"
    );
    // Against its own promise (N x L) it passes: the checker is not just strict.
    assert!(outcome.passed(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keeps_its_promise_when_a_node_is_killed() {
    keeps_its_promise("lease", "kill", 38).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_keeps_its_promise_when_redis_is_killed_and_restarted() {
    keeps_its_promise("redis-lease", "redis-kill", 36).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_keeps_its_promise_when_redis_is_killed_and_restarted() {
    keeps_its_promise("redis", "redis-kill", 37).await;
}

fn read_mock(outcome: &Outcome) -> Vec<tollgate_jepsen::checker::MockLine> {
    let dir = outcome.report.parent().unwrap();
    let text = std::fs::read_to_string(dir.join("mock.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_keeps_its_promise_through_a_partition() {
    keeps_its_promise("gossip", "partition", 35).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keeps_its_promise_through_a_pause() {
    keeps_its_promise("lease", "pause", 34).await;
}
