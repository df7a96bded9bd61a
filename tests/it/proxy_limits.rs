//! Limits, queues, settlement and routing, judged by the node's answers, its admin
//! figures and the mock upstream's own counters.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::*;
use serde_json::json;
use std::time::Duration;
use tokio::time::Instant;

#[tokio::test]
async fn tenant_429_has_retry_headers_and_openai_body() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("rpm = 2\nmax_wait = \"0s\""), &[&upstream]).await;
    for _ in 0..2 {
        let ok = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
        assert_eq!(ok.status(), 200);
        assert_eq!(ok.headers()["x-ratelimit-limit-requests"], "2");
        assert!(ok.headers().contains_key("x-ratelimit-reset-requests"));
        // The provider's request id, passed on.
        let id = ok.headers()["x-request-id"].to_str().unwrap();
        assert!(id.starts_with("req_mock"), "{id}");
    }
    let refused = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(refused.status(), 429);
    // The node's own id on its own answer.
    let id = refused.headers()["x-request-id"].to_str().unwrap();
    assert!(
        id.starts_with("req_") && id.len() == 36 && !id.starts_with("req_mock"),
        "{id}"
    );
    let retry_ms: u64 = refused.headers()["retry-after-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let retry_s: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // A sliding-window bucket (1 s) counts until its end leaves the window: <= W + 1 s.
    assert!(retry_ms > 0 && retry_ms <= 61_000 && retry_s * 1000 >= retry_ms);
    assert_eq!(refused.headers()["x-ratelimit-remaining-requests"], "0");
    let body = json(refused).await;
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("requests")
    );
    // Refusals never reached the upstream.
    assert_eq!(upstream.stats().admitted, 2);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn batch_lane_is_capped_at_its_share_and_interactive_keeps_the_rest() {
    let upstream = mock(|_| {}).await;
    let node = node(
        &format!(
            "{}\n[limits]\nbatch_share = 0.5\n",
            single("rpm = 10\nmax_wait = \"0s\"")
        ),
        &[&upstream],
    )
    .await;
    let batch = [("x-tollgate-priority", "batch")];
    for _ in 0..5 {
        assert_eq!(
            post(&node, "/chat/completions", chat_body("b", 5), &batch)
                .await
                .status(),
            200
        );
    }
    assert_eq!(
        post(&node, "/chat/completions", chat_body("b", 5), &batch)
            .await
            .status(),
        429
    );
    for _ in 0..5 {
        assert_eq!(
            post(&node, "/chat/completions", chat_body("i", 5), &[])
                .await
                .status(),
            200
        );
    }
    assert_eq!(
        post(&node, "/chat/completions", chat_body("i", 5), &[])
            .await
            .status(),
        429
    );
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn queued_interactive_is_served_before_queued_batch() {
    let upstream = mock(|m| m.latency_ms = 300).await;
    let node = node(&single("concurrency = 1\nmax_wait = \"10s\""), &[&upstream]).await;
    let node = std::sync::Arc::new(node);
    let send = |lane: &'static str, delay_ms: u64| {
        let node = node.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            let response = post(
                &node,
                "/chat/completions",
                chat_body(lane, 5),
                &[("x-tollgate-priority", lane)],
            )
            .await;
            assert_eq!(response.status(), 200);
            Instant::now()
        })
    };
    let first = send("interactive", 0);
    let batch = send("batch", 50);
    let interactive = send("interactive", 100);
    let (_first, batch_done, interactive_done) = (
        first.await.unwrap(),
        batch.await.unwrap(),
        interactive.await.unwrap(),
    );
    assert!(
        interactive_done < batch_done,
        "interactive arrived later but must be served first"
    );
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn settlement_refunds_the_unused_estimate_and_matches_the_mock() {
    let upstream = mock(|m| {
        m.completion_min_tokens = 3;
        m.completion_max_tokens = 10;
    })
    .await;
    let node = node(&single("tpm = 5000"), &[&upstream]).await;
    let response = post(
        &node,
        "/chat/completions",
        chat_body("Count to three.", 1000),
        &[],
    )
    .await;
    // At admission the whole max_tokens estimate was reserved ...
    let remaining_at_admission: u64 = response.headers()["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = json(response).await;
    let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
    let completion = body["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(remaining_at_admission, 5000 - prompt - 1000);
    // ... and settlement refunded what the completion did not use.
    let status = node.wait_idle("t").await;
    assert_eq!(status["tokens"]["used"], prompt + completion);
    let stats = upstream.stats();
    assert_eq!(
        stats.prompt_tokens + stats.completion_tokens,
        prompt + completion
    );
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn adaptive_policy_reserves_less_than_max_tokens_once_it_has_seen_completions() {
    let upstream = mock(|m| {
        m.completion_min_tokens = 10;
        m.completion_max_tokens = 10;
    })
    .await;
    let toml = format!(
        "{}\n[estimation]\ncompletion = \"adaptive\"\nadaptive_min_samples = 5\n",
        single("tpm = 1000000")
    );
    let node = node(&toml, &[&upstream]).await;
    let reserved = |r: &reqwest::Response, used_before: u64| {
        let remaining: u64 = r.headers()["x-ratelimit-remaining-tokens"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        1_000_000 - remaining - used_before
    };
    let mut used = 0;
    for i in 0..6 {
        let response = post(&node, "/chat/completions", chat_body("hello", 2000), &[]).await;
        let this = reserved(&response, used);
        let body = json(response).await;
        let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
        if i < 5 {
            assert_eq!(this, prompt + 2000, "max_tokens until 5 samples");
        } else {
            // p95 of 10-token completions x 1.2 = 12.
            assert_eq!(this, prompt + 12, "adaptive estimate after 5 samples");
        }
        used = node.wait_idle("t").await["tokens"]["used"]
            .as_u64()
            .unwrap();
    }
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn token_estimates_equal_the_mock_counts_for_openai_models() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("tpm = 1000000"), &[&upstream]).await;
    let bodies = [
        json!({"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Explain GCRA in one line."}], "max_tokens": 5}),
        json!({"model": "gpt-4", "messages": [{"role": "user", "name": "ann", "content": [{"type": "text", "text": "Ünïcode and emoji 🚦 too"}]}], "max_tokens": 5}),
        json!({"model": "gpt-3.5-turbo", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], "max_tokens": 5}),
    ];
    for body in bodies {
        let bytes = bytes::Bytes::from(serde_json::to_vec(&body).unwrap());
        let settings = tollgate::proxy::request::ParseSettings {
            default_max_tokens: 10,
        };
        let model = body["model"].as_str().unwrap();
        let encoding = tollgate::tokens::Encoding::for_openai_model(model).unwrap();
        let parsed = tollgate::proxy::request::parse(
            tollgate::proxy::request::Api::Chat,
            bytes,
            settings,
            |_| Ok(encoding.into()),
        )
        .unwrap();
        let response = json(post(&node, "/chat/completions", body.clone(), &[]).await).await;
        assert_eq!(
            parsed.prompt_tokens,
            response["usage"]["prompt_tokens"].as_u64().unwrap(),
            "{body}"
        );
    }
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// Tools, tool calls, images, the Responses API and Anthropic's tools: the
/// gateway's estimate is its own rule, the mock's count another
/// (`mock::count`, from the providers' documentation), and the estimate
/// never falls short of the count, so a reservation covers what the
/// provider bills.
const TWO_UPSTREAMS: &str = r#"
[[upstreams]]
id = "primary"
kind = "openai"
base_url = "{MOCK}"

[[upstreams]]
id = "fallback"
kind = "openai"
base_url = "{MOCK2}"

[[routes]]
models = ["*"]
upstreams = ["primary", "fallback"]

[[tenants]]
id = "t"
api_key_hashes = ["{HASH}"]
"#;

#[tokio::test]
async fn upstream_429_cools_it_down_and_falls_back() {
    // The primary's real quota (1 request/window) is unknown to the gateway, and
    // someone else already used it.
    let primary = mock(|m| m.rpm = 1).await;
    let fallback = mock(|_| {}).await;
    let direct = reqwest::Client::new()
        .post(format!("{}/chat/completions", primary.base_url()))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&chat_body("elsewhere", 5)).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 200);
    let node = node(TWO_UPSTREAMS, &[&primary, &fallback]).await;
    for _ in 0..3 {
        assert_eq!(
            post(&node, "/chat/completions", chat_body("hi", 5), &[])
                .await
                .status(),
            200
        );
    }
    // One 429 from the primary; it then cools down for its retry-after, so the
    // client never sees it and the rest go straight to the fallback.
    assert_eq!(
        (primary.stats().admitted, primary.stats().refused.requests),
        (1, 1)
    );
    assert_eq!(fallback.stats().admitted, 3);
    let status = node.key("upstream:primary").await;
    assert!(status["cooling_ms"].as_u64().unwrap() > 50_000, "{status}");
    node.stop().await;
    primary.shutdown().await.unwrap();
    fallback.shutdown().await.unwrap();
}

#[tokio::test]
async fn provider_remaining_zero_cools_the_upstream_before_any_429() {
    let primary = mock(|m| m.rpm = 1).await;
    let fallback = mock(|_| {}).await;
    let node = node(TWO_UPSTREAMS, &[&primary, &fallback]).await;
    for _ in 0..3 {
        assert_eq!(
            post(&node, "/chat/completions", chat_body("hi", 5), &[])
                .await
                .status(),
            200
        );
    }
    // The primary's answer said x-ratelimit-remaining-requests: 0; the gateway
    // believed it, so the primary never had to refuse anything.
    assert_eq!(
        (primary.stats().admitted, primary.stats().refused.requests),
        (1, 0)
    );
    assert_eq!(fallback.stats().admitted, 2);
    node.stop().await;
    primary.shutdown().await.unwrap();
    fallback.shutdown().await.unwrap();
}

/// A retry's tenant charge counts from its send. The provider (1 request per 4 s)
/// is used up by a direct call, so the node's first attempt gets a 429 and a
/// retry-after of a few seconds; the retry waits it out and then takes 1.5 s to
/// answer. Were the charge dated at the 429 and not again (only at the first
/// attempt), it would leave the node's 2 s window while the provider was
/// serving the retry, and the tenant would read 0 used.
#[tokio::test]
async fn a_retry_that_waited_out_a_cool_down_is_charged_from_its_send() {
    let upstream = mock(|m| {
        m.rpm = 1;
        m.window_ms = 4_000;
        m.latency_ms = 1_500;
    })
    .await;
    let direct = reqwest::Client::new()
        .post(format!("{}/chat/completions", upstream.base_url()))
        .json(&chat_body("first", 5))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 200);
    let config = format!(
        "{}\n[limits]\nwindow = \"2s\"\nbuckets = 4\n",
        single("rpm = 5\nmax_wait = \"10s\"")
    );
    let node = node(&config, &[&upstream]).await;
    let request = tokio::spawn({
        let url = node.url();
        async move {
            post_url(&url, "/chat/completions", chat_body("hi", 5))
                .await
                .status()
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen_in_flight = 0;
    while !request.is_finished() {
        assert!(Instant::now() < deadline, "the request never ended");
        let used = node.key("tenant:t").await["requests"]["used"].as_u64();
        // The retry has reached the provider and is being served.
        if upstream.stats().admitted == 2 && !request.is_finished() {
            assert_eq!(
                used,
                Some(1),
                "the provider serves it, the tenant counts none"
            );
            seen_in_flight += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(request.await.unwrap(), 200);
    assert!(
        seen_in_flight >= 10,
        "observed the retry in flight {seen_in_flight} times"
    );
    assert_eq!(
        upstream.stats().refused.requests,
        1,
        "the first attempt's 429"
    );
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn remaining_zero_pauses_until_one_request_is_back_not_until_the_window_empties() {
    // The provider's window (2 s, 4 requests) and the node's agree. Two requests
    // at 0 s, two at 1 s: the fourth answer says remaining 0, reset 2 s (when the
    // window is empty again, at 3 s). The first two leave at 2 s: from then on the
    // provider has room, and the node must use it. Pausing for the whole reset
    // would refuse the request at 2.6 s.
    let upstream = mock(|m| {
        m.rpm = 4;
        m.window_ms = 2_000;
    })
    .await;
    let config = format!(
        "{}\n[limits]\nwindow = \"2s\"\nbuckets = 20\n",
        single("rpm = 4\nmax_wait = \"0s\"")
    );
    let node = node(&config, &[&upstream]).await;
    let started = Instant::now();
    let send = || post(&node, "/chat/completions", chat_body("hi", 5), &[]);
    for at_ms in [0, 0, 1_000, 1_000] {
        tokio::time::sleep_until(started + Duration::from_millis(at_ms)).await;
        assert_eq!(send().await.status(), 200);
    }
    tokio::time::sleep_until(started + Duration::from_millis(2_600)).await;
    let later = send().await;
    assert_eq!(later.status(), 200, "{:?}", later.headers());
    assert_eq!(upstream.stats().refused.requests, 0);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn client_disconnect_mid_stream_frees_the_slot() {
    let upstream = mock(|m| {
        m.inter_token_ms = 50;
        m.completion_min_tokens = 100;
        m.completion_max_tokens = 100;
    })
    .await;
    let node = node(&single("concurrency = 1\nmax_wait = \"0s\""), &[&upstream]).await;
    let mut body = chat_body("stream please", 100);
    body["stream"] = json!(true);
    let mut response = post(&node, "/chat/completions", body.clone(), &[]).await;
    assert_eq!(response.status(), 200);
    assert!(response.chunk().await.unwrap().is_some());
    // The only slot is taken: a second request fails fast.
    assert_eq!(
        post(&node, "/chat/completions", chat_body("x", 5), &[])
            .await
            .status(),
        429
    );
    drop(response);
    let status = node.wait_idle("t").await;
    assert_eq!(status["concurrency"]["in_flight"], 0);
    assert_eq!(
        post(&node, "/chat/completions", chat_body("x", 5), &[])
            .await
            .status(),
        200
    );
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// A client that leaves before its answer is recorded as such (status 499 in
/// `tollgate_requests_total`), and its reservation is kept (the provider may
/// have counted the request): nothing is lost from the books.
#[tokio::test]
async fn a_client_that_leaves_before_its_answer_is_recorded() {
    let upstream = mock(|m| m.latency_ms = 1_500).await;
    let node = node(&single("rpm = 10\nmax_wait = \"0s\""), &[&upstream]).await;
    let gone = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap()
        .post(format!("{}/chat/completions", node.url()))
        .bearer_auth(KEY)
        .json(&chat_body("hi", 5))
        .send()
        .await;
    assert!(gone.is_err(), "the client gave up first");
    let status = node.wait_idle("t").await;
    assert_eq!(status["requests"]["used"], 1, "sent: its reservation kept");
    let recorded = |text: &str| {
        text.lines().any(|l| {
            l.starts_with("tollgate_requests_total{")
                && l.contains("status=\"499\"")
                && l.ends_with(" 1")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !recorded(&metrics(&node).await) {
        assert!(
            Instant::now() < deadline,
            "no 499 recorded:\n{}",
            metrics(&node).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// An upstream whose streamed completion never ends: 16 KB events, as fast as
/// they are taken.
async fn endless_stream_upstream() -> String {
    use axum::routing::post as axum_post;
    let event = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "x".repeat(16 * 1024)
    );
    let event = bytes::Bytes::from(event);
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum_post(move || {
            let event = event.clone();
            async move {
                let events = futures_util::stream::repeat_with(move || {
                    Ok::<_, std::io::Error>(event.clone())
                });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(axum::body::Body::from_stream(events))
                    .unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

/// A client that stops reading a stream but keeps its connection open: once it
/// has taken nothing for the upstream's `stream_idle_timeout` (1 s here), the
/// stream is cut and its slot released (hyper no longer polls a body nobody
/// reads, so without the cut the slot would be held for as long as the client
/// liked).
#[tokio::test]
async fn a_stream_the_client_stopped_reading_is_cut_after_the_idle_timeout() {
    let upstream = mock(|_| {}).await;
    let toml = single("concurrency = 1\nmax_wait = \"0s\"")
        .replace(
            "kind = \"openai\"\nbase_url = \"{MOCK}\"",
            "kind = \"openai\"\nbase_url = \"{MOCK}\"\nstream_idle_timeout = \"1s\"",
        )
        .replace("{MOCK}", &endless_stream_upstream().await);
    let node = node(&toml, &[&upstream]).await;
    let mut body = chat_body("stream please", 100);
    body["stream"] = json!(true);
    let mut response = post(&node, "/chat/completions", body, &[]).await;
    assert_eq!(response.status(), 200);
    assert!(response.chunk().await.unwrap().is_some());
    // No end to come: the sockets' buffers fill and the node's writes stall.
    let stalled = Instant::now();
    let status = node.wait_idle("t").await;
    assert_eq!(status["concurrency"]["in_flight"], 0);
    println!(
        "slot released {:?} after the client stopped reading",
        stalled.elapsed()
    );
    // What the client still reads ends in an error, not as if complete.
    let mut ended = None;
    while ended.is_none() {
        match response.chunk().await {
            Ok(Some(_)) => {}
            Ok(None) => ended = Some(Ok(())),
            Err(e) => ended = Some(Err(e)),
        }
    }
    assert!(ended.unwrap().is_err(), "a cut stream read as complete");
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// A stream still running at the request's deadline (`server.request_timeout`,
/// 2 s here) is cut there, with an error, and its slot released.
#[tokio::test]
async fn a_stream_is_cut_at_the_requests_deadline() {
    let upstream = mock(|m| {
        m.inter_token_ms = 50;
        m.completion_min_tokens = 100;
        m.completion_max_tokens = 100;
    })
    .await;
    // Lines before the first table land in the helper's `[server]`.
    let toml = format!(
        "request_timeout = \"2s\"\n{}",
        single("concurrency = 1\nmax_wait = \"0s\"")
    );
    let node = node(&toml, &[&upstream]).await;
    let mut body = chat_body("stream please", 100);
    body["stream"] = json!(true);
    let started = Instant::now();
    let response = post(&node, "/chat/completions", body, &[]).await;
    assert_eq!(response.status(), 200);
    assert!(response.bytes().await.is_err(), "5 s of stream read whole");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1_900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    let status = node.wait_idle("t").await;
    assert_eq!(status["concurrency"]["in_flight"], 0);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn anthropic_messages_stream_and_not_settle_from_reported_usage() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("tpm = 100000"), &[&upstream]).await;
    for stream in [false, true] {
        let body = json!({"model": "claude-3-5-haiku", "max_tokens": 20, "stream": stream,
            "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]});
        let response = post(
            &node,
            "/messages",
            body,
            &[("anthropic-version", "2023-06-01")],
        )
        .await;
        assert_eq!(response.status(), 200);
        let text = String::from_utf8(response.bytes().await.unwrap().to_vec()).unwrap();
        if stream {
            assert!(text.contains("event: message_start") && text.contains("event: message_stop"));
        } else {
            let body: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(body["usage"]["output_tokens"].as_u64().unwrap() <= 20);
        }
        node.wait_idle("t").await;
    }
    let stats = upstream.stats();
    let status = node.key("tenant:t").await;
    assert_eq!(
        status["tokens"]["used"],
        stats.prompt_tokens + stats.completion_tokens
    );
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn busy_upstream_at_90_percent_is_skipped_while_a_fallback_exists() {
    let primary = mock(|_| {}).await;
    let fallback = mock(|_| {}).await;
    let toml = TWO_UPSTREAMS.replace("base_url = \"{MOCK}\"", "base_url = \"{MOCK}\"\nrpm = 10");
    let node = node(&toml, &[&primary, &fallback]).await;
    for _ in 0..10 {
        assert_eq!(
            post(&node, "/chat/completions", chat_body("hi", 5), &[])
                .await
                .status(),
            200
        );
    }
    // Requests 1-9 found the primary below 90% of its 10/min; the 10th found it at
    // 9/10 and went to the fallback, keeping the last 10% for when nothing else can.
    assert_eq!(primary.stats().admitted, 9);
    assert_eq!(fallback.stats().admitted, 1);
    node.stop().await;
    primary.shutdown().await.unwrap();
    fallback.shutdown().await.unwrap();
}

#[tokio::test]
async fn nothing_is_charged_to_the_tenant_when_the_upstream_refuses() {
    let upstream = mock(|_| {}).await;
    let toml = single("rpm = 100\nmax_wait = \"10s\"").replace(
        "kind = \"openai\"\nbase_url = \"{MOCK}\"",
        "kind = \"openai\"\nbase_url = \"{MOCK}\"\nrpm = 1",
    );
    let node = node(&toml, &[&upstream]).await;
    assert_eq!(
        post(&node, "/chat/completions", chat_body("a", 5), &[])
            .await
            .status(),
        200
    );
    // The upstream's 1/min is spent; the client asks not to wait at all.
    let refused = post(
        &node,
        "/chat/completions",
        chat_body("b", 5),
        &[("x-tollgate-max-wait-ms", "0")],
    )
    .await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after-ms"));
    let status = node.wait_idle("t").await;
    assert_eq!(
        status["requests"]["used"], 1,
        "the refused request was not charged to the tenant"
    );
    assert_eq!(upstream.stats().admitted, 1);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// A client that gives up while its request waits for the upstream (admitted by
/// its tenant, never sent) is charged nothing: the dropped request cancels its
/// permits. One sent and then abandoned keeps its charge (the provider may have
/// counted it).
#[tokio::test]
async fn a_client_that_leaves_before_its_request_is_sent_is_charged_nothing() {
    let upstream = mock(|m| m.latency_ms = 1_500).await;
    let toml = single("rpm = 100\nconcurrency = 10\nmax_wait = \"10s\"").replace(
        "kind = \"openai\"\nbase_url = \"{MOCK}\"",
        "kind = \"openai\"\nbase_url = \"{MOCK}\"\nconcurrency = 1",
    );
    let node = node(&toml, &[&upstream]).await;
    let client = |timeout_ms| {
        reqwest::Client::builder()
            .timeout(Duration::from_millis(timeout_ms))
            .build()
            .unwrap()
    };
    let send = |client: reqwest::Client| {
        let url = format!("{}/chat/completions", node.url());
        async move {
            client
                .post(url)
                .bearer_auth(KEY)
                .json(&chat_body("hi", 5))
                .send()
                .await
        }
    };
    // The first holds the upstream's only slot (the mock answers in 1.5 s) and
    // is abandoned at 1 s, once sent; the second waits for that slot from 0.1 s
    // and is abandoned at 0.4 s, before it could be sent.
    let first = tokio::spawn(send(client(1_000)));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(send(client(300)).await.unwrap_err().is_timeout());
    assert!(first.await.unwrap().unwrap_err().is_timeout());
    let status = node.wait_idle("t").await;
    assert_eq!(
        status["requests"]["used"], 1,
        "only the request that reached the upstream is charged: {status}"
    );
    assert_eq!(upstream.stats().admitted, 1);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// One request per 2 s window (buckets of 500 ms), a mock `latency_ms` to the
/// first byte.
async fn slow_upstream(latency_ms: u64) -> (tollgate::mock::MockHandle, Node) {
    let upstream = mock(|m| m.latency_ms = latency_ms).await;
    let config = format!(
        "[limits]\nwindow = \"2s\"\nbuckets = 4\n{}",
        single("rpm = 1\nmax_wait = \"0s\"")
    );
    let node = node(&config, &[&upstream]).await;
    (upstream, node)
}

#[tokio::test]
async fn a_request_counts_a_window_from_when_the_upstream_answered() {
    // The provider counts a request on arrival, which the gateway knows happened
    // by the answer (0.9 s here): the next must wait a window from the answer.
    let (upstream, node) = slow_upstream(900).await;
    let started = Instant::now();
    let first = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(first.status(), 200);
    // The admission's bucket has left (<= 2.5 s), the answer's has not (> 2.9 s).
    tokio::time::sleep_until(started + Duration::from_millis(2_700)).await;
    let early = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(
        early.status(),
        429,
        "counted from the admission, not the answer"
    );
    // The answer's bucket has left too (<= 3.4 s).
    tokio::time::sleep_until(started + Duration::from_millis(3_600)).await;
    let later = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(later.status(), 200);
    assert_eq!(upstream.stats().admitted, 2);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_still_unanswered_keeps_counting() {
    // 3 s to the first byte, longer than the window: moved every half window while
    // it waits, its charge never leaves before the provider can have counted it.
    let (upstream, node) = slow_upstream(3_000).await;
    let started = Instant::now();
    let url = node.url();
    let pending = tokio::spawn(async move {
        post_url(&url, "/chat/completions", chat_body("hi", 5))
            .await
            .status()
    });
    // Its admission's bucket has left the window (<= 2.5 s); it is still waiting.
    tokio::time::sleep_until(started + Duration::from_millis(2_700)).await;
    let meanwhile = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(
        meanwhile.status(),
        429,
        "the pending request stopped counting"
    );
    assert_eq!(pending.await.unwrap(), 200);
    assert_eq!(upstream.stats().admitted, 1);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// `server.upstream_idle_timeout`: an idle upstream connection is reused within
/// it (90 s by default), and with `"0s"` none is kept, each request opening its
/// own (counted by a TCP relay in front of the mock).
#[tokio::test]
async fn idle_upstream_connections_are_reused_or_not_kept_as_configured() {
    let upstream = mock(|_| {}).await;
    let mock_port: u16 = (upstream.base_url())
        .trim_start_matches("http://127.0.0.1:")
        .trim_end_matches("/v1")
        .parse()
        .unwrap();
    for (idle, connections) in [(None, 1), (Some("0s"), 3)] {
        let relay = crate::common::redis::TcpRelay::start(mock_port).await;
        let server = idle.map_or_else(String::new, |d| {
            format!("upstream_idle_timeout = \"{d}\"\n")
        });
        let toml = server
            + &single("rpm = 100")
                .replace("{MOCK}", &format!("http://127.0.0.1:{}/v1", relay.port));
        let node = node(&toml, &[&upstream]).await;
        for _ in 0..3 {
            let r = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
            assert_eq!(r.status(), 200);
        }
        let opened = relay.accepted.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(opened, connections, "upstream_idle_timeout {idle:?}");
        node.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// A token-bucket tenant's `burst` bounds its request limit only (one figure for
/// both would refuse for good, 413, every request costing more than 60 tokens
/// with `burst = 60`).
#[tokio::test]
async fn a_token_bucket_request_burst_does_not_bound_the_token_limit() {
    let upstream = mock(|_| {}).await;
    let tenant =
        "rpm = 60\ntpm = 100000\nalgorithm = \"token-bucket\"\nburst = 60\nmax_wait = \"0s\"";
    let node = node(&single(tenant), &[&upstream]).await;
    let response = post(&node, "/chat/completions", chat_body("hi", 500), &[]).await;
    assert_eq!(response.status(), 200);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_tenants_model_quota_holds_its_models_and_is_all_or_nothing_with_the_tenants() {
    let upstream = mock(|_| {}).await;
    let limits = r#"rpm = 3
max_wait = "0s"

[[tenants.model_limits]]
models = ["gpt-4o"]
rpm = 2

[[tenants.model_limits]]
models = ["gpt-3.5*"]
name = "legacy"
rpm = 10"#;
    let node = node(&single(limits), &[&upstream]).await;
    let ask = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    let status = |r: reqwest::Response| r.status().as_u16();
    // gpt-4o: its group's 2, then refused there, charging the tenant nothing.
    assert_eq!(
        status(post(&node, "/chat/completions", ask("gpt-4o"), &[]).await),
        200
    );
    assert_eq!(
        status(post(&node, "/chat/completions", ask("gpt-4o"), &[]).await),
        200
    );
    assert_eq!(
        status(post(&node, "/chat/completions", ask("gpt-4o"), &[]).await),
        429
    );
    // A model in no group meets the tenant's limit alone: its third request.
    assert_eq!(
        status(post(&node, "/chat/completions", ask("gpt-4o-mini"), &[]).await),
        200
    );
    // The legacy group has room, the tenant none: refused, and the group's
    // charge is given back.
    let refused = post(&node, "/chat/completions", ask("gpt-3.5-turbo"), &[]).await;
    assert_eq!(refused.status(), 429);
    let used = |key: serde_json::Value| key["requests"]["used"].clone();
    assert_eq!(used(node.key("tenant-model:t@gpt-4o").await), 2);
    assert_eq!(used(node.key("tenant-model:t@legacy").await), 0);
    assert_eq!(used(node.key("tenant:t").await), 3);
    assert_eq!(upstream.stats().admitted, 3);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// The provider's word about one model cools that model's group down, not the
/// account: gpt-4o's limit (unknown to the gateway) is used up by someone
/// else, and the account's other models keep being served at once.
#[tokio::test]
async fn a_models_429_cools_its_group_down_and_not_the_accounts_other_models() {
    let upstream = mock(|m| {
        m.model_limits = vec![tollgate::mock::ModelLimits {
            models: vec!["gpt-4o".into()],
            rpm: 1,
            ..Default::default()
        }];
    })
    .await;
    let ask = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5});
    let direct = reqwest::Client::new()
        .post(format!("{}/chat/completions", upstream.base_url()))
        .json(&ask("gpt-4o"))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 200);
    let group = "\n[[upstreams.model_limits]]\nmodels = [\"gpt-4o\"]\nname = \"gpt-4o\"\n";
    let config = single("max_wait = \"0s\"").replacen(
        "base_url = \"{MOCK}\"\n",
        &format!("base_url = \"{{MOCK}}\"\n{group}"),
        1,
    );
    let node = node(&config, &[&upstream]).await;
    let refused = post(&node, "/chat/completions", ask("gpt-4o"), &[]).await;
    assert_eq!(refused.status(), 429);
    let group = node.key("upstream-model:mock@gpt-4o").await;
    assert!(group["cooling_ms"].as_u64().unwrap() > 1_000, "{group}");
    assert_eq!(node.key("upstream:mock").await["cooling_ms"], 0);
    for _ in 0..3 {
        let served = post(&node, "/chat/completions", ask("gpt-4o-mini"), &[]).await;
        assert_eq!(served.status(), 200);
    }
    assert_eq!(upstream.stats().refused.requests, 1, "one 429, then none");
    node.stop().await;
    upstream.shutdown().await.unwrap();
}
