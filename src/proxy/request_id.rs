//! Request ids. Every answer carries `x-request-id`, the id a client quotes
//! when it reports a problem (the SDKs expose it: `response._request_id` in
//! openai-python): the provider's own when its answer carried one (OpenAI's
//! `x-request-id`, Anthropic's `request-id`), so the provider's support can
//! find the request, else one the node makes (`req_` and 32 hex digits). Every
//! line the node logs while it serves a request is in a `request` span naming
//! the node's id (`request_id`) and, once an answer carried one, the
//! provider's (`upstream_request_id`): whichever id the client was given, the
//! node's lines about its request carry it.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;

/// The header every answer carries.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Anthropic's name for it.
const ANTHROPIC_REQUEST_ID: HeaderName = HeaderName::from_static("request-id");

/// Longest provider id passed on: a longer one is the provider's mistake (or
/// worse), and a client's log should not carry it.
const MAX_ID_BYTES: usize = 128;

/// A fresh id: `req_` and 128 random bits in hex.
pub fn new() -> HeaderValue {
    let id = format!("req_{:032x}", rand::random::<u128>());
    // Hex digits and `req_` are valid header bytes.
    HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("req_unknown"))
}

/// The provider's id of its answer, if it gave one of a sane size.
pub fn of_upstream(headers: &HeaderMap) -> Option<HeaderValue> {
    let sane = |id: &&HeaderValue| !id.is_empty() && id.len() <= MAX_ID_BYTES;
    (headers.get(X_REQUEST_ID).filter(sane))
        .or_else(|| headers.get(ANTHROPIC_REQUEST_ID).filter(sane))
        .cloned()
}

/// Gives `response` an id of the node's own unless it carries one already.
pub fn stamp(response: &mut Response) {
    if !response.headers().contains_key(X_REQUEST_ID) {
        response.headers_mut().insert(X_REQUEST_ID, new());
    }
}

/// Gives `response` the id `id` unless it carries one already (the
/// provider's).
pub fn stamp_with(response: &mut Response, id: HeaderValue) {
    if !response.headers().contains_key(X_REQUEST_ID) {
        response.headers_mut().insert(X_REQUEST_ID, id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_providers_id_is_passed_on_when_sane_and_a_fresh_one_is_made_otherwise() {
        let mut headers = HeaderMap::new();
        assert_eq!(of_upstream(&headers), None);
        headers.insert(
            ANTHROPIC_REQUEST_ID,
            HeaderValue::from_static("req_011CSHoE"),
        );
        assert_eq!(of_upstream(&headers).unwrap(), "req_011CSHoE");
        headers.insert(X_REQUEST_ID, HeaderValue::from_static("req_abc"));
        assert_eq!(of_upstream(&headers).unwrap(), "req_abc", "OpenAI's first");
        let long = "x".repeat(MAX_ID_BYTES + 1);
        headers.insert(X_REQUEST_ID, HeaderValue::from_str(&long).unwrap());
        assert_eq!(of_upstream(&headers).unwrap(), "req_011CSHoE");
        let (a, b) = (new(), new());
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 32);
        assert!(a.to_str().unwrap().starts_with("req_"));
    }
}
