//! Bad input: each gets the right status in the OpenAI error
//! shape, the node keeps serving, and no reservation or slot leaks.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::*;
use axum::Router;
use axum::routing::post as axum_post;
use serde_json::json;
use std::time::Duration;

/// (body, headers, expected status, expected `param`).
type Case<'a> = (Vec<u8>, Vec<(&'a str, &'a str)>, u16, Option<&'a str>);

async fn raw(
    node: &Node,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("{}{path}", node.url()))
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

async fn expect_error(response: reqwest::Response, status: u16) -> serde_json::Value {
    assert_eq!(response.status(), status);
    let body = json(response).await;
    let error = &body["error"];
    assert!(
        error["message"].is_string()
            && error.get("type").is_some()
            && error.get("param").is_some()
            && error.get("code").is_some(),
        "{body}"
    );
    body
}

#[tokio::test]
async fn client_mistakes_get_openai_errors_and_leak_nothing() {
    let upstream = mock(|_| {}).await;
    let node = node(
        &format!(
            "{}\n[server]\n",
            single("rpm = 1000\ntpm = 100000\nconcurrency = 4")
        )
        .replace("\n[server]\n", ""),
        &[&upstream],
    )
    .await;
    let auth = [
        ("authorization", "Bearer sk-test"),
        ("content-type", "application/json"),
    ];
    let cases: Vec<Case> = vec![
        (b"{not json".to_vec(), auth.to_vec(), 400, None),
        (
            br#"{"model": 5, "messages": []}"#.to_vec(),
            auth.to_vec(),
            400,
            None,
        ),
        (
            br#"{"messages": []}"#.to_vec(),
            auth.to_vec(),
            400,
            Some("model"),
        ),
        (
            br#"{"model": "gpt-4o"}"#.to_vec(),
            auth.to_vec(),
            400,
            Some("messages"),
        ),
        (
            br#"{"model":"gpt-4o","messages":[],"max_tokens":-1}"#.to_vec(),
            auth.to_vec(),
            400,
            Some("max_tokens"),
        ),
        (
            br#"{"model":"gpt-4o","messages":[],"max_tokens":1e30}"#.to_vec(),
            auth.to_vec(),
            400,
            None,
        ),
        (
            br#"{"model":"gpt-4o","messages":[],"max_tokens":99999999}"#.to_vec(),
            auth.to_vec(),
            400,
            Some("max_tokens"),
        ),
        (
            b"{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"
                .to_vec(),
            auth.to_vec(),
            400,
            None,
        ),
        (
            br#"{"model":"gpt-4o","messages":[]}"#.to_vec(),
            vec![],
            401,
            None,
        ),
        (
            br#"{"model":"gpt-4o","messages":[]}"#.to_vec(),
            vec![("authorization", "Bearer sk-wrong")],
            401,
            None,
        ),
        (
            br#"{"model":"gpt-4o","messages":[]}"#.to_vec(),
            [auth.as_slice(), &[("x-tollgate-priority", "urgent")]].concat(),
            400,
            Some("x-tollgate-priority"),
        ),
        (
            br#"{"model":"gpt-4o","messages":[]}"#.to_vec(),
            [auth.as_slice(), &[("x-tollgate-max-wait-ms", "-3")]].concat(),
            400,
            Some("x-tollgate-max-wait-ms"),
        ),
    ];
    for (body, headers, status, param) in cases {
        let label = String::from_utf8_lossy(&body).into_owned();
        let response = raw(&node, "/chat/completions", body, &headers).await;
        assert_eq!(response.status(), status, "{label}");
        let body = expect_error(response, status).await;
        if let Some(param) = param {
            assert_eq!(body["error"]["param"], param, "{label}");
        }
    }
    // Unknown model: 404 model_not_found.
    let unknown = json!({"model": "claude-nope", "messages": []});
    let body = expect_error(post(&node, "/chat/completions", unknown, &[]).await, 404).await;
    assert_eq!(body["error"]["code"], "model_not_found");
    // Body over the limit: 413.
    let huge = vec![b' '; 5 * 1024 * 1024];
    expect_error(raw(&node, "/chat/completions", huge, &auth).await, 413).await;
    // Anthropic callers get Anthropic's shape.
    let response = raw(
        &node,
        "/messages",
        br#"{"model":"claude-x","messages":[]}"#.to_vec(),
        &auth,
    )
    .await;
    assert_eq!(response.status(), 400);
    assert_eq!(
        json(response).await["error"]["type"],
        "invalid_request_error"
    );
    // A known path, the wrong method: 405 in the caller's shape, with `allow`.
    let wrong = reqwest::Client::new()
        .get(format!("{}/chat/completions", node.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.headers()["allow"], "POST");
    expect_error(wrong, 405).await;
    let wrong = reqwest::Client::new()
        .get(format!("{}/messages", node.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 405);
    assert_eq!(json(wrong).await["type"], "error", "Anthropic's shape");
    // An unknown path: 404, in Anthropic's shape under /v1/messages/ (its SDK's
    // batches), OpenAI's elsewhere.
    let unknown = raw(&node, "/messages/batches", b"{}".to_vec(), &auth).await;
    assert_eq!(unknown.status(), 404);
    let body = json(unknown).await;
    assert_eq!(body["type"], "error", "Anthropic's shape: {body}");
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
    let unknown = raw(&node, "/nothing/here", b"{}".to_vec(), &auth).await;
    assert_eq!(
        expect_error(unknown, 404).await["error"]["code"],
        "not_found"
    );
    // Nothing was charged or held by any of it, and the node still serves.
    let status = node.key("tenant:t").await;
    assert_eq!(
        (
            status["requests"]["used"].as_u64(),
            status["tokens"]["used"].as_u64()
        ),
        (Some(0), Some(0))
    );
    assert_eq!(
        post(&node, "/chat/completions", chat_body("still here?", 5), &[])
            .await
            .status(),
        200
    );
    assert_eq!(upstream.stats().admitted, 1);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// A client that sends its headers and then trickles its body (or stops) gets a
/// 408 in the OpenAI shape at `server.request_timeout` (1 s here), instead of
/// holding one of the node's in-flight slots for as long as it likes.
#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_gets_a_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = mock(|_| {}).await;
    let toml = format!(
        "request_timeout = \"1s\"\n{}",
        single("rpm = 100\nmax_wait = \"0s\"")
    );
    let node = node(&toml, &[&upstream]).await;
    let mut socket = tokio::net::TcpStream::connect(node.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"model\""
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let started = tokio::time::Instant::now();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&answer).contains("}}") {
        let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf))
            .await
            .expect("no answer within 5 s")
            .unwrap();
        assert!(n > 0, "closed without an answer");
        answer.extend_from_slice(&buf[..n]);
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("\"type\":\"invalid_request_error\""),
        "{answer}"
    );
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert_eq!(upstream.stats().admitted, 0);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// Requests that reached the address a redirect pointed at.
static REDIRECTS_FOLLOWED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// An upstream that misbehaves in the ways a real one can.
async fn bad_upstream() -> std::net::SocketAddr {
    let app = Router::new()
        .route(
            "/hang/chat/completions",
            axum_post(|| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                "never"
            }),
        )
        .route(
            "/garbage/chat/completions",
            axum_post(|| async { "this is not json" }),
        )
        .route(
            "/cut/chat/completions",
            axum_post(|| async {
                let first =
                    "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n"
                        .to_owned();
                // Headers and one event go out, then the connection dies.
                let stream = futures_util::stream::unfold(0, move |step| {
                    let first = first.clone();
                    async move {
                        match step {
                            0 => Some((Ok::<_, std::io::Error>(first), 1)),
                            1 => {
                                tokio::time::sleep(Duration::from_millis(100)).await;
                                Some((Err(std::io::Error::other("cut")), 2))
                            }
                            _ => None,
                        }
                    }
                });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(axum::body::Body::from_stream(stream))
                    .unwrap()
            }),
        )
        .route(
            "/redirect/chat/completions",
            axum_post(|| async {
                (
                    axum::http::StatusCode::TEMPORARY_REDIRECT,
                    [("location", "/landed/chat/completions")],
                    "moved",
                )
            }),
        )
        .route(
            "/landed/chat/completions",
            axum_post(|| async {
                REDIRECTS_FOLLOWED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                "followed"
            }),
        )
        .route(
            "/error/chat/completions",
            axum_post(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn upstream_that_hangs_cuts_or_lies_gets_5xx_and_leaks_nothing() {
    let addr = bad_upstream().await;
    let toml = format!(
        r#"
[retry]
max_attempts = 2
backoff_base = "10ms"
backoff_max = "20ms"

{}

[[routes]]
models = ["hang"]
upstreams = ["hang"]
[[routes]]
models = ["garbage"]
upstreams = ["garbage"]
[[routes]]
models = ["cut"]
upstreams = ["cut"]
[[routes]]
models = ["error"]
upstreams = ["error"]
[[routes]]
models = ["redirect"]
upstreams = ["redirect"]

[[tenants]]
id = "t"
api_key_hashes = ["{{HASH}}"]
rpm = 1000
tpm = 1000000
concurrency = 2
"#,
        ["hang", "garbage", "cut", "error", "redirect"]
            .map(|name| format!(
                "[[upstreams]]\nid = \"{name}\"\nkind = \"openai\"\nbase_url = \"http://{addr}/{name}\"\ntimeout = \"300ms\"\nstream_idle_timeout = \"300ms\"\n"
            ))
            .join("\n")
    );
    let node = node(&toml, &[]).await;
    let call = |model: &str, stream: bool| json!({"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 5, "stream": stream});
    expect_error(
        post(&node, "/chat/completions", call("hang", false), &[]).await,
        504,
    )
    .await;
    expect_error(
        post(&node, "/chat/completions", call("garbage", false), &[]).await,
        502,
    )
    .await;
    expect_error(
        post(&node, "/chat/completions", call("error", false), &[]).await,
        502,
    )
    .await;
    // A redirect is not followed (the key would go where the config never said).
    let error = expect_error(
        post(&node, "/chat/completions", call("redirect", false), &[]).await,
        502,
    )
    .await;
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("redirect"),
        "{error}"
    );
    assert_eq!(
        REDIRECTS_FOLLOWED.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the gateway followed the upstream's redirect"
    );
    let text = metrics(&node).await;
    assert!(
        text.contains(r#"upstream="redirect",status="3xx""#),
        "a redirect is counted as its own class: {text}"
    );
    // A stream cut mid-way: the client sees the bytes so far, then a broken body.
    let response = post(&node, "/chat/completions", call("cut", true), &[]).await;
    assert_eq!(response.status(), 200);
    assert!(
        response.bytes().await.is_err(),
        "the client must see the stream break"
    );
    let status = node.wait_idle("t").await;
    assert_eq!(status["concurrency"]["in_flight"], 0);
    // Failed attempts refunded the tenant's tokens, the hung request's too (the
    // upstream's permit keeps its reservation: the provider may have counted it;
    // the tenant pays for what it was served, docs/design/architecture.md); the
    // cut stream keeps its reservation (part of it was served, its usage unknown).
    let used = status["tokens"]["used"].as_u64().unwrap();
    assert!(used > 0 && used <= 2 * (5 + 20), "{status}");
    node.stop().await;
}

/// A prompt whose size alone exceeds its tenant's token limit is refused 413
/// without being tokenised (counting stops once the tenant's smallest input
/// window is passed, `tokens::CountBudget`), and nothing is sent or charged.
#[tokio::test]
async fn a_prompt_larger_than_the_tenants_token_limit_is_refused_413() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("tpm = 2000\nmax_wait = \"0s\""), &[&upstream]).await;
    let prompt = "Summarise the following report carefully. ".repeat(60_000);
    let body = serde_json::to_vec(&chat_body(&prompt, 16)).unwrap();
    assert!(body.len() > 2_000_000);
    let auth = [
        ("authorization", "Bearer sk-test"),
        ("content-type", "application/json"),
    ];
    let refused = expect_error(raw(&node, "/chat/completions", body, &auth).await, 413).await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokens"),
        "{refused}"
    );
    assert_eq!(upstream.stats().admitted, 0);
    // Never tokenised: a counted text that long would be a miss of the
    // tenant's count memo.
    let text = metrics(&node).await;
    let missed =
        tollgate::ops::metrics::sample(&text, "tollgate_prompt_count_memo_total{outcome=\"miss\"}");
    assert_eq!(missed.unwrap_or(0.0), 0.0, "{text}");
    // The tenant's window is untouched: a normal request is served.
    let ok = post(&node, "/chat/completions", chat_body("hi", 16), &[]).await;
    assert_eq!(ok.status(), 200);
    node.stop().await;
    upstream.shutdown().await.unwrap();
}
