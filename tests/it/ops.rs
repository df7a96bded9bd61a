//! Operations surface: metrics, admin auth, readiness, and graceful shutdown that
//! drains in-flight requests.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::*;
use std::time::Duration;

#[tokio::test]
async fn metrics_health_and_admin_auth() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("rpm = 1\nmax_wait = \"0s\""), &[&upstream]).await;
    assert_eq!(
        post(&node, "/chat/completions", chat_body("a", 5), &[])
            .await
            .status(),
        200
    );
    assert_eq!(
        post(&node, "/chat/completions", chat_body("b", 5), &[])
            .await
            .status(),
        429
    );
    let client = reqwest::Client::new();
    let base = format!("http://{}", node.addr);
    assert_eq!(
        client
            .get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "tollgate_decisions_total{scope=\"tenant\",outcome=\"admitted\",reason=\"\"} 1",
        "tollgate_decisions_total{scope=\"tenant\",outcome=\"refused\",reason=\"requests\"} 1",
        "tollgate_upstream_latency_seconds_count{upstream=\"mock\"} 1",
        "tollgate_tokens_reserved_total",
        "tollgate_queue_wait_seconds",
    ] {
        assert!(metrics.contains(needle), "missing {needle} in\n{metrics}");
    }
    let admin = |token: &'static str| {
        client
            .get(format!("{base}/admin/keys/tenant:t:requests"))
            .bearer_auth(token)
            .send()
    };
    assert_eq!(admin("wrong-token").await.unwrap().status(), 401);
    let body: serde_json::Value =
        serde_json::from_slice(&admin(ADMIN).await.unwrap().bytes().await.unwrap()).unwrap();
    assert_eq!(body["usage"]["limit"], 1);
    assert_eq!(body["usage"]["used"], 1);
    assert_eq!(body["usage"]["remaining"], 0);
    assert_eq!(body["queue"]["interactive"], 0);
    let missing = client
        .get(format!("{base}/admin/keys/tenant:nobody"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_drains_in_flight_requests() {
    let upstream = mock(|m| m.latency_ms = 400).await;
    let node = node(&single("rpm = 100"), &[&upstream]).await;
    let url = node.url();
    let in_flight = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{url}/chat/completions"))
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&chat_body("slow", 5)).unwrap())
            .send()
            .await
            .unwrap()
            .status()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let addr = node.addr;
    node.stop().await;
    assert_eq!(
        in_flight.await.unwrap(),
        200,
        "the request in flight at shutdown completes"
    );
    // After the drain the listener is gone.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    upstream.shutdown().await.unwrap();
}

/// Kills the served binary however the test ends.
/// `tollgate serve` on a config whose `[server]` section has `server_lines`, with
/// `TOKIO_WORKER_THREADS=1` in its environment; returns the worker threads its
/// `/metrics` reports.
async fn served_workers(server_lines: &str) -> i64 {
    let toml = single("rpm = 10")
        .replace("{MOCK}", "http://127.0.0.1:1/v1")
        .replace("{HASH}", &key_hash());
    let node = crate::common::served::serve(&format!("{server_lines}\n{toml}"), |c| {
        c.env("TOKIO_WORKER_THREADS", "1");
    })
    .await;
    let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", node.port))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = (text.lines())
        .find_map(|l| l.strip_prefix("tollgate_runtime_worker_threads "))
        .unwrap_or_else(|| panic!("no worker gauge in\n{text}"));
    line.trim().parse().unwrap()
}

#[tokio::test]
async fn worker_threads_in_the_config_size_the_served_nodes_runtime() {
    // The file wins over the environment, which still applies when the file is silent.
    assert_eq!(served_workers("worker_threads = 3").await, 3);
    assert_eq!(served_workers("").await, 1);
}

/// A long text a tenant sends again is counted once: the second estimate comes
/// from the node's memo (`tokens::CountMemo`), and another tenant sending the
/// same text counts it itself (the memo is scoped per tenant, so a hit's speed
/// tells nobody what another tenant sent). With `count_memo_slots = 0` every
/// text is counted.
#[tokio::test]
async fn a_long_prompt_sent_again_is_counted_from_the_memo_of_its_tenant_only() {
    let seen = memo_after_three_requests("").await;
    assert_eq!(
        seen,
        [(0, 1), (1, 1), (1, 2)],
        "(hits, misses) after each request: counted, from the memo, counted for the other tenant"
    );
    let off = "[estimation]\ncount_memo_slots = 0\n";
    assert_eq!(
        memo_after_three_requests(off).await,
        [(0, 0); 3],
        "memo off"
    );
}

/// The memo's (hits, misses) after each of three requests with one long
/// prompt, sent by tenant `t` twice, then by tenant `u`, on a node whose
/// config ends with `tail`.
async fn memo_after_three_requests(tail: &str) -> Vec<(u64, u64)> {
    const OTHER: &str = "sk-other";
    let upstream = mock(|_| {}).await;
    let other = format!(
        "[[tenants]]\nid = \"u\"\napi_key_hashes = [\"sha256:{}\"]\n",
        tollgate::config::hash_api_key(OTHER)
    );
    let node = node(&format!("{}{other}{tail}", single("")), &[&upstream]).await;
    let prompt = "Summarise the following notes for the team. ".repeat(40);
    let memo = |text: &str, outcome: &str| {
        let series = format!("tollgate_prompt_count_memo_total{{outcome=\"{outcome}\"}}");
        tollgate::ops::metrics::sample(text, &series).unwrap_or(0.0) as u64
    };
    let mut seen = Vec::new();
    for key in [KEY, KEY, OTHER] {
        let r = reqwest::Client::new()
            .post(format!("{}/chat/completions", node.url()))
            .bearer_auth(key)
            .json(&chat_body(&prompt, 5))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let text = metrics(&node).await;
        seen.push((memo(&text, "hit"), memo(&text, "miss")));
    }
    node.stop().await;
    upstream.shutdown().await.unwrap();
    seen
}
