//! The floor of the end-to-end benchmark: a proxy built from the same parts as a
//! tollgate node (axum server, the node's own upstream client over hyper's
//! pooled client, mimalloc, tokio's default runtime) that does nothing else: no
//! tenant, no tokenizer, no limiter, no headers. `scripts/bench-cores.sh` runs it
//! beside a lease node so the cost of tollgate's own work is the difference. Not
//! a product; no config.
//!
//! `cargo run --release --example bare_proxy -- 127.0.0.1:8192 http://127.0.0.1:9190`

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;
use tollgate::upstream_http::{Endpoint, UpstreamHttp};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Upstream {
    client: UpstreamHttp,
    endpoint: Endpoint,
}

async fn forward(State(up): State<Arc<Upstream>>, body: Bytes) -> Response {
    let mut headers = HeaderMap::with_capacity(1);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let Ok(response) = up.client.post(&up.endpoint, headers, body).await else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let status = response.status();
    match response.into_body().collect().await {
        Ok(body) => (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_bytes(),
        )
            .into_response(),
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
    let client = UpstreamHttp::new(Duration::from_secs(90)).map_err(anyhow::Error::msg)?;
    let endpoint = (client.endpoint(&format!("{upstream}/v1/chat/completions")))
        .map_err(anyhow::Error::msg)?;
    let up = Arc::new(Upstream { client, endpoint });
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(forward))
        .with_state(up);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
