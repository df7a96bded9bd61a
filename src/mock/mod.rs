//! The mock upstream: a strict, honest stand-in for an LLM
//! provider whose JSONL log is the ground truth the gateway is judged by.
//!
//! - [`config`]: [`MockConfig`] and the CLI flags [`MockArgs`].
//! - `limits`: its own exact sliding log (RPM, TPM, ITPM, OTPM, concurrency), sharing
//!   no code with the gateway's limiter. OTPM is charged `max_tokens` at admission and
//!   corrected to the real output when the answer ends, as Anthropic does.
//! - `quotas`: every quota a request must fit, one such log each: the account's, its
//!   day (RPD, TPD) and its model group's; all or nothing.
//! - `headers`: the providers' rate-limit headers (`x-ratelimit-*`,
//!   `anthropic-ratelimit-*`).
//! - `state` / `admit`: the one shared state and the admission step every API uses.
//! - `openai`, `completions`, `embeddings`, `anthropic`, `responses`: the provider APIs.
//! - `stream`: SSE bodies that hold the concurrency slot until their last byte.
//! - `log`: the JSONL decision log and its writer task.
//! - `stats`: counters behind `GET /stats`.
//! - `stored`: responses kept for `GET /v1/responses/{id}`, files by size.
//!
//! Prompt tokens are counted by the mock's own rules (`count`: tiktoken-rs and
//! the providers' documented rules, no code of the gateway's estimator);
//! completion lengths are drawn from a seeded
//! uniform distribution, never above the request's `max_tokens`, and the completion
//! text is exactly that many tokens long. See `docs/mock-upstream.md`.

mod admit;
mod anthropic;
mod audio;
mod completion;
mod completions;
pub mod config;
mod count;
mod embeddings;
mod error;
mod headers;
mod limits;
mod log;
mod openai;
mod quotas;
mod request;
mod responses;
mod state;
mod stats;
mod stored;
mod stream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{ConfigError, MockArgs, MockConfig, ModelLimits, TokenRange};
pub use limits::Limits;
pub use log::{Api, LogLine, Outcome, Reason};
pub use state::MockState;
pub use stats::{MockStats, RefusedStats};

/// Models listed by `GET /v1/models` when `--models` is not set (any name is accepted).
const DEFAULT_MODELS: [&str; 4] = [
    "gpt-4o-mini",
    "gpt-4o",
    "text-embedding-3-small",
    "claude-sonnet-4-5",
];

/// The mock's routes over `state`, without a socket (tests can call it directly).
pub fn app(state: Arc<MockState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::responses))
        .route(
            "/v1/responses/{id}",
            get(stored::get_response).delete(stored::delete_response),
        )
        .route("/v1/files", post(stored::upload))
        .route("/v1/files/{id}/content", get(stored::content))
        .route("/v1/models", get(models))
        .route("/stats", get(stats))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(not_found)
        .with_state(state)
}

/// Serves the mock on `listener` until `shutdown` resolves, then drains open
/// connections and flushes the log before returning.
pub async fn serve(
    listener: TcpListener,
    config: MockConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let state = MockState::start(config).await?;
    run(listener, state, shutdown).await
}

async fn run(
    listener: TcpListener,
    state: Arc<MockState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Without TCP_NODELAY a keep-alive response written in two parts stalls ~40 ms
    // (Nagle against delayed ACK; docs/mock-upstream.md).
    let listener = listener.tap_io(|tcp| {
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(%err, "set_nodelay failed");
        }
    });
    let served = axum::serve(listener, app(Arc::clone(&state)))
        .with_graceful_shutdown(shutdown)
        .await;
    let closed = state.close().await;
    served.and(closed)
}

/// Starts a mock on `127.0.0.1:0` in the background.
pub async fn spawn(config: MockConfig) -> std::io::Result<MockHandle> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let state = MockState::start(config).await?;
    let (stop, stopped) = oneshot::channel::<()>();
    // Dropping the handle (and with it `stop`) also shuts the mock down.
    let shutdown = async move {
        let _ = stopped.await;
    };
    let task = tokio::spawn(run(listener, Arc::clone(&state), shutdown));
    Ok(MockHandle {
        addr,
        state,
        stop,
        task,
    })
}

/// A mock running in the background; dropping it shuts the mock down without waiting.
#[derive(Debug)]
pub struct MockHandle {
    addr: SocketAddr,
    state: Arc<MockState>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl MockHandle {
    /// The address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The OpenAI-style base URL, `http://ADDR/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The counters, read in-process.
    pub fn stats(&self) -> MockStats {
        self.state.stats()
    }

    /// Stops accepting, waits for open requests (streams included) to finish and
    /// flushes the log: once this returns, the log is complete.
    pub async fn shutdown(self) -> std::io::Result<()> {
        let _ = self.stop.send(());
        self.task.await.map_err(std::io::Error::other)?
    }
}

async fn stats(State(state): State<Arc<MockState>>) -> Response {
    axum::Json(state.stats()).into_response()
}

async fn models(State(state): State<Arc<MockState>>, headers: HeaderMap) -> Response {
    if let Err(error) = state.check_auth(&headers) {
        return error.into_response(error::Flavor::OpenAi);
    }
    let configured = &state.config().models;
    let names: Vec<&str> = if configured.is_empty() {
        DEFAULT_MODELS.to_vec()
    } else {
        configured.iter().map(String::as_str).collect()
    };
    let created = state.unix_secs();
    let data: Vec<serde_json::Value> = names
        .into_iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": created, "owned_by": "tollgate-mock"}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

async fn not_found() -> Response {
    let body = serde_json::json!({"error": {
        "message": "Unknown request URL. Please check the URL for typos.",
        "type": "invalid_request_error", "param": null, "code": "unknown_url"}});
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}
