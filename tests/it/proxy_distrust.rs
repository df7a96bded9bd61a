//! What a node takes from a provider that is wrong or hostile: usage figures
//! beyond what a request could have used are clamped, figures that are not
//! counts are refused, answers are read within a bound, and a refusal of the
//! gateway's own credentials never reaches the tenant as the tenant's.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::*;
use axum::response::IntoResponse;

/// A provider that reports 2^60 more tokens than it served, each way: the
/// tenant is charged within the request's bound (its prompt twice over plus
/// 4,096, its `max_tokens`), so it keeps being served, and the clamp is
/// counted.
#[tokio::test]
async fn a_usage_figure_beyond_what_the_request_could_use_is_clamped() {
    let upstream = mock(|c| c.misreported_usage = 1 << 60).await;
    let n = node(&single("tpm = 100000\nmax_wait = \"0s\""), &[&upstream]).await;
    for _ in 0..5 {
        let response = post(&n, "/chat/completions", chat_body("hello", 16), &[]).await;
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.unwrap();
        // The client sees what the provider said; the gateway charges its bound.
        assert!(body["usage"]["prompt_tokens"].as_u64().unwrap() > 1 << 59);
    }
    let key = n.key("tenant:t:tokens").await;
    let used = key["usage"]["used"].as_u64().unwrap();
    // Five requests: each at most 2 x its estimate + 4,096 in, 16 out.
    assert!(used <= 5 * (2 * 20 + 4_096 + 16), "{key}");
    assert!(used >= 5 * 16, "{key}");
    let metrics = metrics(&n).await;
    assert_eq!(
        tollgate::ops::metrics::sample(&metrics, "tollgate_usage_clamped_total"),
        Some(5.0),
        "{metrics}"
    );
    n.stop().await;
    upstream.shutdown().await.unwrap();
}

/// The provider refuses the gateway's key: the tenant gets the gateway's 502
/// `upstream_auth_failed`, not the provider's 401 (which would read as its
/// own key refused) and none of the provider's words (which may echo the key).
#[tokio::test]
async fn an_upstream_refusing_the_gateways_key_is_the_gateways_error_and_says_nothing_of_it() {
    let upstream = mock(|c| c.api_key = Some("sk-provider-right".to_owned())).await;
    let toml = single("rpm = 100").replace(
        "id = \"mock\"\nkind = \"openai\"\nbase_url = \"{MOCK}\"\n",
        "id = \"mock\"\nkind = \"openai\"\nbase_url = \"{MOCK}\"\napi_key = \"sk-provider-wrong\"\n",
    );
    let n = node(&toml, &[&upstream]).await;
    let response = post(&n, "/chat/completions", chat_body("hello", 16), &[]).await;
    assert_eq!(response.status(), 502);
    let text = response.text().await.unwrap();
    let body: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["error"]["code"], "upstream_auth_failed", "{body}");
    for leaked in ["Incorrect API key", "sk-provider", "--api-key"] {
        assert!(
            !text.contains(leaked),
            "{leaked} reached the tenant: {text}"
        );
    }
    assert_eq!(upstream.stats().refused.unauthorized, 1);
    n.stop().await;
    upstream.shutdown().await.unwrap();
}

/// An upstream made by hand: every `POST /v1/chat/completions` gets `answer`.
struct HandUpstream {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream for HandUpstream {
    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

impl HandUpstream {
    async fn start(answer: fn() -> axum::response::Response) -> HandUpstream {
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move || async move { answer() }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        HandUpstream { addr, task }
    }
}

/// A usage figure below zero does not parse as a count: the answer is the
/// gateway's 502 (the tenant, served nothing, is refunded; an upstream limit
/// keeps its charge), never a settlement with a figure that wrapped.
#[tokio::test]
async fn a_negative_usage_figure_is_a_malformed_answer() {
    let upstream = HandUpstream::start(|| {
        let body = serde_json::json!({
            "id": "x", "object": "chat.completion", "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": -500, "completion_tokens": -7, "total_tokens": -507},
        });
        axum::Json(body).into_response()
    })
    .await;
    let n = node_with_transport(&single("tpm = 100000"), &[&upstream], None).await;
    let response = post(&n, "/chat/completions", chat_body("hello", 16), &[]).await;
    assert_eq!(response.status(), 502);
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
    n.stop().await;
    upstream.task.abort();
}

/// An answer longer than the gateway reads (64 MiB) is cut there: the tenant
/// gets a 502 and the node does not buffer the rest.
#[tokio::test]
async fn an_answer_beyond_the_body_bound_is_cut_off() {
    let upstream = HandUpstream::start(|| {
        let chunk = bytes::Bytes::from(vec![b' '; 1 << 20]);
        let chunks = (0..80).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
        let endless = futures_util::stream::iter(chunks);
        axum::response::Response::builder()
            .header("content-type", "application/json")
            .body(axum::body::Body::from_stream(endless))
            .unwrap()
    })
    .await;
    let n = node_with_transport(&single("tpm = 100000"), &[&upstream], None).await;
    let response = post(&n, "/chat/completions", chat_body("hello", 16), &[]).await;
    assert_eq!(response.status(), 502);
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too large"),
        "{body}"
    );
    n.stop().await;
    upstream.task.abort();
}
