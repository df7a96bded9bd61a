//! Every error a client can see, mapped to HTTP in one place. The body takes the
//! caller's own shape: OpenAI's `{"error":{"message","type","param","code"}}` on the
//! OpenAI routes, Anthropic's `{"type":"error","error":{"type","message"}}` on
//! `/v1/messages`, so official SDKs classify and retry correctly. 429 and 503 carry
//! `retry-after` (whole seconds, rounded up) and `retry-after-ms`.

use super::headers::RateHeaders;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::time::Duration;

/// Which API the caller spoke, for the error body's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// OpenAI error JSON.
    OpenAi,
    /// Anthropic error JSON.
    Anthropic,
}

impl Flavor {
    /// The error shape a client of `api` reads.
    pub fn of(api: crate::api::Api) -> Flavor {
        match api {
            crate::api::Api::Messages | crate::api::Api::CountTokens => Flavor::Anthropic,
            _ => Flavor::OpenAi,
        }
    }
}

/// Where an error came from, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The request itself is wrong.
    Client,
    /// A limit or queue of the gateway.
    Limiter,
    /// The upstream failed or refused.
    Upstream,
    /// The gateway itself.
    Internal,
}

/// A client-visible error.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable explanation.
    pub message: String,
    /// Offending request field, if any.
    pub param: Option<String>,
    /// Machine-readable code (OpenAI `code`).
    pub code: &'static str,
    /// Where it came from.
    pub source: Source,
    /// Wait hint for 429/503.
    pub retry_after: Option<Duration>,
    /// Rate-limit headers to attach (boxed: keeps `Result<_, ApiError>` small).
    pub rate_headers: Option<Box<RateHeaders>>,
    /// Body shape.
    pub flavor: Flavor,
    /// This node's own refusal of a request never sent upstream: spillover may
    /// send it to a peer with room instead (`super::spill`).
    pub spillable: bool,
}

impl ApiError {
    fn new(
        status: StatusCode,
        code: &'static str,
        source: Source,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code,
            source,
            retry_after: None,
            rate_headers: None,
            flavor: Flavor::OpenAi,
            spillable: false,
        }
    }

    /// 400: malformed or invalid request.
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Source::Client,
            message,
        );
        e.param = param.map(str::to_owned);
        e
    }

    /// 401: missing or unknown API key.
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            Source::Client,
            "Incorrect or missing API key. Send it as `Authorization: Bearer <key>` or `x-api-key`.",
        )
    }

    /// 404: no route serves this model on this API.
    pub fn unknown_model(model: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            Source::Client,
            format!("The model `{model}` does not exist or is not routed on this API."),
        );
        e.param = Some("model".into());
        e
    }

    /// 413: body or cost larger than anything the limits can ever admit.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            Source::Client,
            message,
        )
    }

    /// 408: the client did not send its whole body in time.
    pub fn request_timeout(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            Source::Client,
            message,
        )
    }

    /// 405: the path exists, not for this method.
    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            Source::Client,
            message,
        )
    }

    /// 429 from the gateway's limits.
    pub fn rate_limited(
        message: impl Into<String>,
        retry_after: Duration,
        headers: Option<RateHeaders>,
    ) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            Source::Limiter,
            message,
        );
        e.retry_after = Some(retry_after);
        e.rate_headers = headers.map(Box::new);
        e
    }

    /// 502: the upstream failed or answered garbage.
    pub fn bad_gateway(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            Source::Upstream,
            message,
        )
    }

    /// 503: the gateway cannot take the request now.
    pub fn unavailable(message: impl Into<String>, retry_after: Duration) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            Source::Internal,
            message,
        );
        e.retry_after = Some(retry_after);
        e
    }

    /// 504: the upstream did not answer in time.
    pub fn gateway_timeout(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_timeout",
            Source::Upstream,
            message,
        )
    }

    /// The same error in `flavor`'s body shape.
    pub fn with_flavor(mut self, flavor: Flavor) -> ApiError {
        self.flavor = flavor;
        self
    }

    fn openai_type(&self) -> &'static str {
        match self.status {
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_exceeded",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_server_error() => "api_error",
            _ => "invalid_request_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.flavor {
            Flavor::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.openai_type(),
                "param": self.param,
                "code": self.code,
            }}),
            Flavor::Anthropic => json!({"type": "error", "error": {
                "type": self.anthropic_type(),
                "message": self.message,
            }}),
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(rate) = &self.rate_headers {
            rate.apply_for(self.flavor, headers);
        }
        if let Some(wait) = self.retry_after {
            let secs = wait.as_millis().div_ceil(1000).max(1);
            headers.insert("retry-after", HeaderValue::from(secs as u64));
            headers.insert(
                "retry-after-ms",
                HeaderValue::from(wait.as_millis().max(1) as u64),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_json(response: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn rate_limited_has_openai_shape_and_both_retry_headers() {
        let response =
            ApiError::rate_limited("slow down", Duration::from_millis(1500), None).into_response();
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "2");
        assert_eq!(response.headers()["retry-after-ms"], "1500");
        let body = body_json(response).await;
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
        assert_eq!(body["error"]["type"], "rate_limit_exceeded");
        assert!(body["error"]["param"].is_null());
        assert_eq!(body["error"]["message"], "slow down");
    }

    #[tokio::test]
    async fn anthropic_flavor_uses_anthropic_shape() {
        let response = ApiError::unknown_model("x")
            .with_flavor(Flavor::Anthropic)
            .into_response();
        assert_eq!(response.status(), 404);
        let body = body_json(response).await;
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "not_found_error");
    }
}
