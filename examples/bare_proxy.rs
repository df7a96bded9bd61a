//! The floor of the end-to-end benchmark: a proxy built from the same parts as a
//! tollgate node (axum server, pooled reqwest client, mimalloc, tokio's default
//! runtime) that does nothing else: no tenant, no tokenizer, no limiter, no
//! headers. `scripts/bench-floor.sh` runs it beside a lease node so the cost of
//! tollgate's own work is the difference. Not a product; no config.
//!
//! `cargo run --release --example bare_proxy -- 127.0.0.1:8192 http://127.0.0.1:9190`

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Upstream {
    client: reqwest::Client,
    url: String,
}

async fn forward(State(up): State<Arc<Upstream>>, body: Bytes) -> Response {
    let sent = up
        .client
        .post(&up.url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let Ok(response) = sent else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let status = response.status();
    match response.bytes().await {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:8192".into());
    let upstream = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:9190".into());
    let up = Arc::new(Upstream {
        client: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .tcp_nodelay(true)
            .pool_max_idle_per_host(1024)
            .build()?,
        url: format!("{upstream}/v1/chat/completions"),
    });
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(forward))
        .with_state(up);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
