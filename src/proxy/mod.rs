//! # Proxy
//!
//! The axum app. Request path (docs/design/architecture.md, "Request path"):
//! [`handler`] authenticates, reads hints, parses ([`request`]) and admits on the
//! tenant's actor; [`dispatch`] picks upstreams ([`select`]), forwards, retries
//! and settles; [`stream`] meters SSE responses; [`usage`] reads what providers
//! report; [`models`] lists the models the routes serve; [`passthrough`]
//! passes the provider's other endpoints through; [`headers`] writes the
//! `x-ratelimit-*` headers, and `provider_limits` reads the provider's own
//! (OpenAI's and Anthropic's) as ground truth; [`request_id`] gives every
//! answer its `x-request-id`; [`error`] maps every failure to the
//! caller's error shape.

mod admit;
pub mod charges;
pub mod dispatch;
pub mod error;
pub mod handler;
pub mod headers;
pub mod models;
pub mod passthrough;
mod provider_limits;
pub mod request;
pub mod request_id;
pub mod select;
pub mod spill;
pub mod stall;
pub mod state;
pub mod stream;
pub mod usage;

pub use state::AppState;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use request::Api;
use std::sync::Arc;

macro_rules! api_route {
    ($api:expr) => {
        // The whole request, not axum's `HeaderMap` extractor: that one clones
        // the headers, and these are the request's own, used once.
        post(
            |State(state): State<Arc<AppState>>, request: axum::extract::Request| async move {
                let (parts, body) = request.into_parts();
                handler::handle(state, $api, parts.headers, body, handler::Hop::Client).await
            },
        )
    };
}

/// The proxy routes of a node. The server merges the operations routes in and
/// answers every other path with [`not_found`] and [`method_not_allowed`].
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/chat/completions", api_route!(Api::Chat))
        .route("/v1/completions", api_route!(Api::Completions))
        .route("/v1/embeddings", api_route!(Api::Embeddings))
        .route("/v1/messages", api_route!(Api::Messages))
        .route("/v1/messages/count_tokens", api_route!(Api::CountTokens))
        .route("/v1/responses", api_route!(Api::Responses))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::one))
        .route("/v1/responses/{*rest}", any(passthrough::handle))
        .route("/v1/files", any(passthrough::handle))
        .route("/v1/files/{*rest}", any(passthrough::handle))
        .route("/v1/uploads", any(passthrough::handle))
        .route("/v1/uploads/{*rest}", any(passthrough::handle))
        .route("/v1/batches", any(passthrough::handle))
        .route("/v1/batches/{*rest}", any(passthrough::handle))
        .route("/v1/images/{*rest}", any(passthrough::handle))
        .route("/v1/audio/{*rest}", any(passthrough::handle))
        .route("/v1/moderations", any(passthrough::handle))
}

/// A known path, another method (`GET /v1/chat/completions`): in the caller's
/// error shape, with an `allow` header, not axum's empty 405.
pub async fn method_not_allowed(uri: axum::http::Uri) -> Response {
    let path = uri.path();
    let (allow, error) = if path.starts_with("/v1/") && !path.starts_with("/v1/models") {
        let e = error::ApiError::method_not_allowed(format!("{path} takes POST."));
        let flavor = match path {
            "/v1/messages" | "/v1/messages/count_tokens" => error::Flavor::Anthropic,
            _ => error::Flavor::OpenAi,
        };
        ("POST", e.with_flavor(flavor))
    } else {
        let e = error::ApiError::method_not_allowed(format!("{path} takes GET."));
        ("GET", e)
    };
    let mut response = error.into_response();
    response.headers_mut().insert(
        axum::http::header::ALLOW,
        axum::http::HeaderValue::from_static(allow),
    );
    response
}

/// An unknown path, in the caller's error shape.
pub async fn not_found(uri: axum::http::Uri) -> Response {
    let mut e = error::ApiError::bad_request(
        "Unknown path. tollgate serves /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/models, /v1/messages and /v1/messages/count_tokens.",
        None,
    );
    e.status = axum::http::StatusCode::NOT_FOUND;
    e.code = "not_found";
    // Anthropic's SDK calls paths under /v1/messages tollgate does not serve
    // (count_tokens, batches): it reads Anthropic's error shape.
    let flavor = if uri.path().starts_with("/v1/messages/") {
        error::Flavor::Anthropic
    } else {
        error::Flavor::OpenAi
    };
    e.with_flavor(flavor).into_response()
}
