//! Every way the mock refuses a request, and its one mapping to HTTP: OpenAI's error
//! body on the OpenAI routes, Anthropic's on `/v1/messages`, with `retry-after` and the
//! provider's rate-limit headers on 429.

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::limits::LimitKind;
use super::log::Reason;
use super::quotas::Scope;

/// Which provider's error shape to answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    /// `{"error":{"message","type","param","code"}}`.
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`.
    Anthropic,
}

/// A refused request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// 400: malformed JSON, missing or mistyped fields, out-of-range values.
    #[error("{0}")]
    Invalid(String),
    /// The body could not be read (e.g. 413 too large).
    #[error("{message}")]
    Body {
        /// Status axum chose.
        status: StatusCode,
        /// Its explanation.
        message: String,
    },
    /// 401: missing or wrong API key.
    #[error("Incorrect API key provided. You can find your API key in the mock's --api-key flag.")]
    Unauthorized,
    /// 404: the model is not in `--models`.
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotFound(String),
    /// 429: a limit refused the request.
    #[error("{}", .0.message)]
    RateLimited(Box<RateLimited>),
}

/// The details of a 429.
#[derive(Debug)]
pub(crate) struct RateLimited {
    /// The limit that refused.
    pub(crate) kind: LimitKind,
    /// The quota it belongs to: the day's requests and tokens are RPD and TPD.
    pub(crate) scope: Scope,
    /// Human-readable explanation, as the route's provider words it.
    pub(crate) message: String,
    /// Wait before the same request would be admitted, in milliseconds.
    pub(crate) retry_after_ms: u64,
    /// The provider's rate-limit headers describing the window.
    pub(crate) headers: HeaderMap,
}

impl ApiError {
    /// The log reason of this refusal.
    pub(crate) fn reason(&self) -> Reason {
        match self {
            ApiError::Invalid(_) | ApiError::Body { .. } | ApiError::ModelNotFound(_) => {
                Reason::Invalid
            }
            ApiError::Unauthorized => Reason::Unauthorized,
            // A model group's limits are the same kinds of limit as the account's.
            ApiError::RateLimited(limited) => match (limited.scope, limited.kind) {
                (Scope::Day, LimitKind::Requests) => Reason::RequestsPerDay,
                (Scope::Day, LimitKind::Tokens) => Reason::TokensPerDay,
                (_, LimitKind::Requests) => Reason::Requests,
                (_, LimitKind::Tokens) => Reason::Tokens,
                (_, LimitKind::InputTokens) => Reason::InputTokens,
                (_, LimitKind::OutputTokens) => Reason::OutputTokens,
                (_, LimitKind::Concurrency) => Reason::Concurrency,
            },
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiError::Body { status, .. } => *status,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::ModelNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// OpenAI's `(type, code)` for this error.
    fn openai_type_code(&self) -> (&'static str, Option<&'static str>) {
        match self {
            ApiError::Invalid(_) | ApiError::Body { .. } => ("invalid_request_error", None),
            ApiError::Unauthorized => ("invalid_request_error", Some("invalid_api_key")),
            ApiError::ModelNotFound(_) => ("invalid_request_error", Some("model_not_found")),
            ApiError::RateLimited(limited) => match limited.kind {
                LimitKind::Tokens | LimitKind::InputTokens | LimitKind::OutputTokens => {
                    ("tokens", Some("rate_limit_exceeded"))
                }
                LimitKind::Requests | LimitKind::Concurrency => {
                    ("requests", Some("rate_limit_exceeded"))
                }
            },
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self {
            ApiError::Invalid(_) => "invalid_request_error",
            ApiError::Body { status, .. } if *status == StatusCode::PAYLOAD_TOO_LARGE => {
                "request_too_large"
            }
            ApiError::Body { .. } => "invalid_request_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::ModelNotFound(_) => "not_found_error",
            ApiError::RateLimited(_) => "rate_limit_error",
        }
    }

    /// The HTTP response in `flavor`'s shape.
    pub(crate) fn into_response(self, flavor: Flavor) -> Response {
        let message = self.to_string();
        let body = match flavor {
            Flavor::OpenAi => {
                let (kind, code) = self.openai_type_code();
                json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            }
            Flavor::Anthropic => {
                json!({"type": "error", "error": {"type": self.anthropic_type(), "message": message}})
            }
        };
        let status = self.status();
        let mut response = (status, axum::Json(body)).into_response();
        if let ApiError::RateLimited(limited) = self {
            let headers = response.headers_mut();
            headers.extend(limited.headers);
            let ms = limited.retry_after_ms;
            let seconds = ms.div_ceil(1000).max(1);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            // OpenAI also gives the exact wait; Anthropic documents only `retry-after`.
            if flavor == Flavor::OpenAi {
                headers.insert("retry-after-ms", HeaderValue::from(ms));
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(scope: Scope, kind: LimitKind) -> ApiError {
        ApiError::RateLimited(Box::new(RateLimited {
            kind,
            scope,
            message: String::new(),
            retry_after_ms: 10_921_000,
            headers: HeaderMap::new(),
        }))
    }

    #[test]
    fn each_quota_refuses_with_its_reason() {
        let cases = [
            (Scope::Day, LimitKind::Requests, Reason::RequestsPerDay),
            (Scope::Day, LimitKind::Tokens, Reason::TokensPerDay),
            (Scope::Group, LimitKind::Tokens, Reason::Tokens),
            (Scope::Group, LimitKind::OutputTokens, Reason::OutputTokens),
            (Scope::Account, LimitKind::Requests, Reason::Requests),
            (Scope::Account, LimitKind::Concurrency, Reason::Concurrency),
        ];
        for (scope, kind, reason) in cases {
            assert_eq!(limited(scope, kind).reason(), reason, "{scope:?} {kind:?}");
        }
        let json = |reason: Reason| serde_json::to_string(&reason).unwrap();
        assert_eq!(json(Reason::RequestsPerDay), "\"requests_per_day\"");
        assert_eq!(json(Reason::TokensPerDay), "\"tokens_per_day\"");
    }

    #[test]
    fn a_daily_refusal_gives_the_exact_wait() {
        let response = limited(Scope::Day, LimitKind::Requests).into_response(Flavor::OpenAi);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()["retry-after"], "10921");
        assert_eq!(response.headers()["retry-after-ms"], "10921000");
    }
}
