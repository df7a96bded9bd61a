//! What a node takes from a provider that is wrong or hostile: usage figures
//! beyond what a request could have used are clamped, and a refusal of the
//! gateway's own credentials never reaches the tenant as the tenant's.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::*;

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
