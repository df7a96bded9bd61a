//! The API surface beyond the metered calls: Anthropic's `count_tokens`,
//! answered by the provider and charged as one request with no tokens.

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
