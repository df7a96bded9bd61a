//! The API surface beyond the metered calls: Anthropic's `count_tokens`,
//! answered by the provider and charged as one request with no tokens, and
//! the provider endpoints passed through (`[[routes]] passthrough`).

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::*;

#[tokio::test]
async fn count_tokens_is_the_providers_count_and_costs_a_request_but_no_tokens() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("rpm = 100\ntpm = 100000"), &[&upstream]).await;
    let body = serde_json::json!({
        "model": "claude-sonnet-4-5",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
    });
    let counted = reqwest::Client::new()
        .post(format!("{}/messages/count_tokens", node.url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(counted.status(), 200);
    assert!(counted.headers().contains_key("x-request-id"));
    let counted = json(counted).await;
    let input_tokens = counted["input_tokens"].as_u64().unwrap();
    // The same input, sent as a message, is charged that many input tokens.
    let mut message = body.clone();
    message["max_tokens"] = serde_json::json!(5);
    let sent = reqwest::Client::new()
        .post(format!("{}/messages", node.url()))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_eq!(json(sent).await["usage"]["input_tokens"], input_tokens);
    let status = node.wait_idle("t").await;
    assert_eq!(status["requests"]["used"], 2, "each a request");
    // Only the message's tokens: the count was free.
    let stats = upstream.stats();
    assert_eq!(
        status["tokens"]["used"],
        stats.prompt_tokens + stats.completion_tokens
    );
    assert_eq!(stats.prompt_tokens, input_tokens);
    // An unknown model is refused in Anthropic's error shape.
    let refused = reqwest::Client::new()
        .post(format!("{}/messages/count_tokens", node.url()))
        .header("x-api-key", KEY)
        .json(&serde_json::json!({"messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert_eq!(json(refused).await["type"], "error");
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// `single` with the catch-all route passing `responses` and `files` through.
fn passing(tenant_limits: &str) -> String {
    single(tenant_limits).replace(
        "models = [\"*\"]\nupstreams = [\"mock\"]",
        "models = [\"*\"]\nupstreams = [\"mock\"]\npassthrough = [\"responses\", \"files\"]",
    )
}

#[tokio::test]
async fn passed_through_endpoints_stream_both_ways_and_cost_one_request_each() {
    let upstream = mock(|_| {}).await;
    let toml = format!(
        "[server]\nmax_body_bytes = 65536\nmax_passthrough_body_bytes = 4000000\n{}",
        passing("rpm = 100\ntpm = 100000")
    );
    let node = node(&toml, &[&upstream]).await;
    let client = reqwest::Client::new();
    // A stored response, fetched and deleted through the node.
    let created = post(
        &node,
        "/responses",
        serde_json::json!({"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": 8}),
        &[],
    )
    .await;
    let id = json(created).await["id"].as_str().unwrap().to_owned();
    let fetched = client
        .get(format!("{}/responses/{id}", node.url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status(), 200);
    assert!(
        fetched
            .headers()
            .contains_key("x-ratelimit-remaining-requests")
    );
    assert_eq!(json(fetched).await["id"], id);
    let deleted = client
        .delete(format!("{}/responses/{id}", node.url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(json(deleted).await["deleted"], true);
    // A 3 MB upload, past the metered body bound, streams through; and back.
    let upload = vec![b'a'; 3_000_000];
    let file = client
        .post(format!("{}/files", node.url()))
        .bearer_auth(KEY)
        .header("content-type", "application/octet-stream")
        .body(upload)
        .send()
        .await
        .unwrap();
    assert_eq!(file.status(), 200);
    let file = json(file).await;
    assert_eq!(file["bytes"], 3_000_000);
    let content = client
        .get(format!(
            "{}/files/{}/content",
            node.url(),
            file["id"].as_str().unwrap()
        ))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(content.bytes().await.unwrap().len(), 3_000_000);
    // Past the pass-through bound: 413, before anything is sent.
    let too_big = client
        .post(format!("{}/files", node.url()))
        .bearer_auth(KEY)
        .body(vec![b'a'; 4_000_001])
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), 413);
    // Past it with no declared length (chunked): the stream is cut, 413.
    let chunks = (0..40).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'a'; 100_001])));
    let streamed = client
        .post(format!("{}/files", node.url()))
        .bearer_auth(KEY)
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 413);
    // A family no route lists, and a caller without a key.
    let unlisted = client
        .get(format!("{}/batches", node.url()))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(unlisted.status(), 404);
    let anonymous = client
        .get(format!("{}/responses/{id}", node.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    // Each call through the node was one request of the tenant's, no tokens.
    let status = node.wait_idle("t").await;
    assert_eq!(status["requests"]["used"], 1 + 4);
    let stats = upstream.stats();
    assert_eq!(
        status["tokens"]["used"],
        stats.prompt_tokens + stats.completion_tokens
    );
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// Every answer carries an id a client can quote: the model list, the
/// operations routes, an unknown path.
#[tokio::test]
async fn every_answer_carries_a_request_id() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("rpm = 10"), &[&upstream]).await;
    let client = reqwest::Client::new();
    for path in ["/v1/models", "/healthz", "/metrics", "/v1/nowhere"] {
        let answer = (client.get(format!("http://{}{path}", node.addr)))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        let id = answer.headers().get("x-request-id");
        let id = id.and_then(|v| v.to_str().ok()).unwrap_or_default();
        assert!(id.starts_with("req_") && id.len() > 8, "{path}: {id:?}");
    }
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// A Messages API client is told its input and output windows in Anthropic's
/// headers, beside OpenAI's.
#[tokio::test]
async fn messages_answers_carry_anthropics_rate_limit_headers() {
    let upstream = mock(|_| {}).await;
    let node = node(&single("rpm = 10\nitpm = 5000\notpm = 1000"), &[&upstream]).await;
    let body = serde_json::json!({"model": "claude-sonnet-4-5", "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}]});
    let answer = post(
        &node,
        "/messages",
        body,
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(answer.status(), 200);
    let headers = answer.headers();
    assert_eq!(headers["anthropic-ratelimit-requests-remaining"], "9");
    assert_eq!(headers["anthropic-ratelimit-output-tokens-limit"], "1000");
    assert_eq!(
        headers["anthropic-ratelimit-output-tokens-remaining"],
        "950"
    );
    let reset = headers["anthropic-ratelimit-input-tokens-reset"]
        .to_str()
        .unwrap();
    assert!(humantime::parse_rfc3339(reset).is_ok(), "{reset}");
    assert!(headers.contains_key("x-ratelimit-remaining-requests"));
    node.stop().await;
    upstream.shutdown().await.unwrap();
}

/// What the node logs, captured.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The line a node logs about a request it failed names the id its answer
/// carries, and the provider's id of the answer that failed. A current-thread
/// test: the node's tasks log to this thread's subscriber.
#[tokio::test]
async fn a_failed_requests_log_line_names_its_id_and_the_providers() {
    let logs = Logs::default();
    let writer = logs.clone();
    // A warn filter, as an operator quieting the node would set: the id must
    // still be on the line.
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    // A provider that fails every request, naming its own id.
    let failing = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|| async {
            let id = [("x-request-id", "req_provider_7f3a")];
            (axum::http::StatusCode::INTERNAL_SERVER_ERROR, id, "boom")
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, failing).await.unwrap() });
    let toml = format!(
        "[retry]\nmax_attempts = 1\n{}",
        single("rpm = 10").replace("{MOCK}", &format!("http://{addr}/v1"))
    );
    let node = node(&toml, &[]).await;
    let answer = post(&node, "/chat/completions", chat_body("hi", 5), &[]).await;
    assert_eq!(answer.status(), 502);
    let id = answer.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(id.starts_with("req_"), "{id}");
    node.stop().await;
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let line = (text.lines())
        .find(|l| l.contains("request failed"))
        .unwrap_or_else(|| panic!("no failure logged:\n{text}"));
    assert!(line.contains(&id), "{line}");
    assert!(line.contains("req_provider_7f3a"), "{line}");
}
