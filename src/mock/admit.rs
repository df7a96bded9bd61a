//! The admission step every API shares: decide under the limit lock, count, log the
//! decision, and turn a refusal into a 429 that says how long to wait.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::response::Response;

use super::error::{ApiError, Flavor, RateLimited};
use super::headers::{format_duration, rate_limit_headers};
use super::limits::{Decision, LimitKind, Limits, WindowUsage};
use super::log::{Api, LogLine, Outcome};
use super::state::{Admission, Charge, MockState, Slot};

/// Suggested wait after a concurrency refusal, in milliseconds: when a slot frees is
/// unknowable, so this is a hint, not a promise.
const CONCURRENCY_RETRY_MS: u64 = 1000;

impl MockState {
    /// Decides `charge` against the limits, counts and logs the decision.
    pub(crate) async fn admit(self: &Arc<Self>, charge: Charge<'_>) -> Result<Admission, ApiError> {
        let now_ms = self.now_ms();
        let cost = charge
            .prompt_tokens
            .saturating_add(charge.completion_tokens);
        let (decision, limits) = {
            let mut log = self.limits.lock();
            let in_flight = self.counters.in_flight.load(Ordering::Relaxed);
            let decision = log.try_admit(now_ms, cost, in_flight);
            if let Decision::Admitted(_) = decision {
                // Under the lock, so concurrency checks never race each other.
                let now_in_flight = self.counters.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
                self.counters
                    .max_in_flight
                    .fetch_max(now_in_flight, Ordering::Relaxed);
            }
            (decision, log.limits())
        };
        let result = match decision {
            Decision::Admitted(usage) => {
                self.counters
                    .admitted(charge.prompt_tokens, charge.completion_tokens);
                let slot = Slot(Arc::clone(self));
                let mut headers = rate_limit_headers(limits, usage);
                // The provider's id of the request: OpenAI's header, or
                // Anthropic's, which the gateway passes on to its client.
                let name = match charge.api {
                    Api::Messages => "request-id",
                    _ => "x-request-id",
                };
                let id = format!("req_mock{:016x}", rand::random::<u64>());
                if let Ok(value) = axum::http::HeaderValue::from_str(&id) {
                    headers.insert(name, value);
                }
                Ok(Admission { slot, headers })
            }
            Decision::Refused {
                kind,
                retry_after_ms,
                usage,
            } => {
                let limited = rate_limited(&charge, limits, kind, retry_after_ms, usage);
                Err(ApiError::RateLimited(Box::new(limited)))
            }
        };
        let reason = result.as_ref().err().map(ApiError::reason);
        if let Some(reason) = reason {
            self.counters.refused(reason);
        }
        self.write_log(LogLine {
            ts_ms: self.started_unix_ms + now_ms,
            api: charge.api,
            model: Some(charge.model.to_owned()),
            outcome: if reason.is_some() {
                Outcome::Refused
            } else {
                Outcome::Admitted
            },
            reason,
            prompt_tokens: charge.prompt_tokens,
            completion_tokens: charge.completion_tokens,
            stream: charge.stream,
        })
        .await;
        result
    }

    /// Answers `error` in `flavor`'s shape; errors raised before admission (400, 401,
    /// 404, 413) are counted and logged here, 429s were logged by [`Self::admit`].
    pub(crate) async fn refuse(&self, api: Api, flavor: Flavor, error: ApiError) -> Response {
        if !matches!(error, ApiError::RateLimited(_)) {
            let reason = error.reason();
            self.counters.refused(reason);
            self.write_log(LogLine {
                ts_ms: self.started_unix_ms + self.now_ms(),
                api,
                model: None,
                outcome: Outcome::Refused,
                reason: Some(reason),
                prompt_tokens: 0,
                completion_tokens: 0,
                stream: false,
            })
            .await;
        }
        error.into_response(flavor)
    }

    async fn write_log(&self, line: LogLine) {
        if let Some(log) = &self.log {
            log.write(&line).await;
        }
    }
}

/// The 429 for a refusal, worded as OpenAI words it.
fn rate_limited(
    charge: &Charge<'_>,
    limits: Limits,
    kind: LimitKind,
    retry_after_ms: Option<u64>,
    usage: WindowUsage,
) -> RateLimited {
    let model = charge.model;
    let cost = charge
        .prompt_tokens
        .saturating_add(charge.completion_tokens);
    let org = "in organization org-tollgate-mock";
    let (message, retry_after_ms) = match (kind, retry_after_ms) {
        (LimitKind::Concurrency, _) => (
            format!(
                "Too many concurrent requests for {model} {org}: Limit {}. Please try again when a request finishes.",
                limits.concurrency
            ),
            CONCURRENCY_RETRY_MS,
        ),
        (LimitKind::Requests, wait) => {
            // The window holds at least one request when RPM refuses, so `wait` is Some.
            let ms = wait.unwrap_or(limits.window_ms);
            let message = format!(
                "Rate limit reached for {model} {org} on requests per min (RPM): Limit {}, Used {}, Requested 1. Please try again in {}.",
                limits.rpm,
                usage.requests,
                format_duration(ms)
            );
            (message, ms)
        }
        (LimitKind::Tokens, Some(ms)) => (
            format!(
                "Rate limit reached for {model} {org} on tokens per min (TPM): Limit {}, Used {}, Requested {cost}. Please try again in {}.",
                limits.tpm,
                usage.tokens,
                format_duration(ms)
            ),
            ms,
        ),
        (LimitKind::Tokens, None) => (
            format!(
                "Request too large for {model} {org} on tokens per min (TPM): Limit {}, Requested {cost}. The input or output tokens must be reduced in order to run successfully.",
                limits.tpm
            ),
            limits.window_ms,
        ),
    };
    RateLimited {
        kind,
        message,
        retry_after_ms,
        headers: rate_limit_headers(limits, usage),
    }
}
