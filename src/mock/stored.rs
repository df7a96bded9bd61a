//! What the mock keeps between requests, beside its limits: the last
//! responses the Responses API made (`GET`/`DELETE /v1/responses/{id}`), and
//! files, known by their size alone. Bounded: [`MAX_STORED`] responses, the
//! oldest forgotten first; a file keeps no content (its id carries its size,
//! and its content is that many bytes of a fixed pattern).

use super::error::{ApiError, Flavor};
use super::state::MockState;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::Arc;

/// Most responses kept.
pub(super) const MAX_STORED: usize = 1024;

/// Bytes of a file's content per chunk sent.
const CHUNK_BYTES: usize = 64 * 1024;

/// The last responses made.
#[derive(Debug, Default)]
pub(crate) struct Stored {
    responses: Mutex<VecDeque<(String, Value)>>,
}

impl Stored {
    /// Keeps `response` (a `response` object with its `id`).
    pub(crate) fn keep(&self, response: &Value) {
        let Some(id) = response["id"].as_str() else {
            return;
        };
        let mut responses = self.responses.lock();
        if responses.len() == MAX_STORED {
            responses.pop_front();
        }
        responses.push_back((id.to_owned(), response.clone()));
    }

    fn get(&self, id: &str) -> Option<Value> {
        let responses = self.responses.lock();
        responses
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, r)| r.clone())
    }

    fn delete(&self, id: &str) -> bool {
        let mut responses = self.responses.lock();
        let before = responses.len();
        responses.retain(|(i, _)| i != id);
        responses.len() < before
    }
}

fn not_found(message: String) -> ApiError {
    ApiError::Body {
        status: StatusCode::NOT_FOUND,
        message,
    }
}

/// The 401 of a call without the mock's key, in OpenAI's shape.
fn unauthorized(mock: &MockState, headers: &HeaderMap) -> Option<Response> {
    (mock.check_auth(headers).err()).map(|error| error.into_response(Flavor::OpenAi))
}

fn no_response(id: &str) -> ApiError {
    not_found(format!("No response found with id '{id}'."))
}

/// `GET /v1/responses/{id}`.
pub(crate) async fn get_response(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Some(refused) = unauthorized(&mock, &headers) {
        return refused;
    }
    match mock.stored.get(&id) {
        Some(response) => axum::Json(response).into_response(),
        None => no_response(&id).into_response(Flavor::OpenAi),
    }
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete_response(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Some(refused) = unauthorized(&mock, &headers) {
        return refused;
    }
    if mock.stored.delete(&id) {
        axum::Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response()
    } else {
        no_response(&id).into_response(Flavor::OpenAi)
    }
}

/// `POST /v1/files`: the upload is read as it arrives (its bytes counted,
/// none kept) and answered as a file of that size.
pub(crate) async fn upload(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(refused) = unauthorized(&mock, &headers) {
        return refused;
    }
    let mut bytes = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => bytes += chunk.len() as u64,
            Err(e) => {
                return ApiError::Invalid(format!("the upload broke off: {e}"))
                    .into_response(Flavor::OpenAi);
            }
        }
    }
    let seq = mock.next_seq();
    axum::Json(json!({
        "id": format!("file-mock{seq:012}-{bytes}"),
        "object": "file",
        "bytes": bytes,
        "created_at": mock.unix_secs(),
        "filename": "upload",
        "purpose": "user_data",
    }))
    .into_response()
}

/// `GET /v1/files/{id}/content`: as many bytes as the file's id says, streamed.
pub(crate) async fn content(
    State(mock): State<Arc<MockState>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Some(refused) = unauthorized(&mock, &headers) {
        return refused;
    }
    let size = (id.strip_prefix("file-mock"))
        .and_then(|rest| rest.split_once('-'))
        .and_then(|(_, size)| size.parse::<u64>().ok());
    let Some(size) = size else {
        return not_found(format!("No such File object: {id}")).into_response(Flavor::OpenAi);
    };
    let chunks = size.div_ceil(CHUNK_BYTES as u64);
    let body = futures_util::stream::iter(0..chunks).map(move |i| {
        let from = i * CHUNK_BYTES as u64;
        let len = (size - from).min(CHUNK_BYTES as u64) as usize;
        Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; len]))
    });
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    *response.status_mut() = StatusCode::OK;
    response
}
