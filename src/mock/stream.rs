//! Response bodies. A stream holds the request's concurrency slot until its last chunk
//! is handed to hyper, or until the client goes away (the slot lives in the body
//! stream's state and drops with it); a JSON body is built whole before the handler
//! returns and drops the slot.
//!
//! Consecutive frames with no delay between them are merged into one write, so a
//! stream with zero delays costs one body chunk.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

use super::state::Slot;

/// Bytes to send after a delay.
#[derive(Debug)]
struct Chunk {
    delay: Duration,
    bytes: Bytes,
}

/// Builds an SSE body: `data:` lines (OpenAI) or `event:` + `data:` pairs
/// (Anthropic), each optionally preceded by a delay.
#[derive(Debug, Default)]
pub(crate) struct SseBuilder {
    done: Vec<Chunk>,
    pending_delay: Duration,
    pending: BytesMut,
}

impl SseBuilder {
    /// Waits `delay` before whatever is pushed next.
    pub(crate) fn delay(&mut self, delay: Duration) {
        if delay.is_zero() {
            return;
        }
        if !self.pending.is_empty() {
            let bytes = self.pending.split().freeze();
            self.done.push(Chunk {
                delay: self.pending_delay,
                bytes,
            });
            self.pending_delay = Duration::ZERO;
        }
        self.pending_delay += delay;
    }

    /// Appends `event: {event}\n` (when given) and `data: {json}\n\n`.
    pub(crate) fn event(&mut self, event: Option<&str>, data: &impl Serialize) {
        if let Some(event) = event {
            self.pending.put_slice(b"event: ");
            self.pending.put_slice(event.as_bytes());
            self.pending.put_u8(b'\n');
        }
        self.pending.put_slice(b"data: ");
        let mut writer = (&mut self.pending).writer();
        if let Err(err) = serde_json::to_writer(&mut writer, data) {
            // Our chunk types hold only strings and numbers: this cannot happen.
            tracing::error!(%err, "stream chunk not serializable");
        }
        self.pending.put_slice(b"\n\n");
    }

    /// Appends OpenAI's terminator, `data: [DONE]\n\n`.
    pub(crate) fn done_marker(&mut self) {
        self.pending.put_slice(b"data: [DONE]\n\n");
    }

    /// The `text/event-stream` response; `slot` is released when the body ends.
    pub(crate) fn into_response(mut self, headers: HeaderMap, slot: Slot) -> Response {
        if !self.pending.is_empty() || !self.pending_delay.is_zero() {
            let bytes = self.pending.split().freeze();
            self.done.push(Chunk {
                delay: self.pending_delay,
                bytes,
            });
        }
        let body = chunked_body(self.done, slot);
        let mut response = with_headers(body, headers);
        let response_headers = response.headers_mut();
        response_headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        response_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    }
}

fn chunked_body(chunks: Vec<Chunk>, slot: Slot) -> Body {
    let state = (chunks.into_iter(), Some(slot));
    let stream = futures_util::stream::unfold(state, |(mut rest, mut slot)| async move {
        let chunk = rest.next()?;
        if !chunk.delay.is_zero() {
            tokio::time::sleep(chunk.delay).await;
        }
        if rest.len() == 0 {
            // Release before the last bytes go out, so a client that has read the
            // whole stream always finds the slot free.
            slot = None;
        }
        Some((Ok::<_, Infallible>(chunk.bytes), (rest, slot)))
    });
    Body::from_stream(stream)
}

fn with_headers(body: Body, headers: HeaderMap) -> Response {
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    response
}

/// An `application/json` response with a `content-length`. The caller keeps its slot
/// until this returns: the whole body is in memory and hyper writes it at once.
pub(crate) fn json_response(json: Vec<u8>, headers: HeaderMap) -> Response {
    let mut response = with_headers(Body::from(json), headers);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Serializes a response body (our types cannot fail to serialize).
pub(crate) fn to_json(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|err| {
        tracing::error!(%err, "response not serializable");
        b"{}".to_vec()
    })
}
