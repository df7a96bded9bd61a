//! Operations surface: metrics, admin auth, readiness, and graceful shutdown that
//! drains in-flight requests.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

mod common;

use common::*;
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
