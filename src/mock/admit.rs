//! The admission step every API shares: decide under the limit lock, count, log the
//! decision, and turn a refusal into a 429 that says how long to wait, in the
//! route's provider's words and headers.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;

use super::error::{ApiError, Flavor, RateLimited};
use super::headers::{format_duration, window_headers};
use super::limits::{Cost, LimitKind};
use super::log::{Api, LogLine, Outcome};
use super::quotas::{Refused, Scope, Verdict};
use super::state::{Admission, Charge, MockState, Slot};

/// Suggested wait after a concurrency refusal, in milliseconds: when a slot frees is
/// unknowable, so this is a hint, not a promise.
const CONCURRENCY_RETRY_MS: u64 = 1000;

impl MockState {
    /// Decides `charge` against the quotas, counts and logs the decision.
    pub(crate) async fn admit(self: &Arc<Self>, charge: Charge<'_>) -> Result<Admission, ApiError> {
        let cost = cost_of(&charge);
        let (now_ms, verdict) = self.decide(charge.model, cost);
        let now_unix_ms = self.started_unix_ms + now_ms;
        let result = match verdict {
            Verdict::Admitted { group, view } => {
                self.counters
                    .admitted(charge.prompt_tokens, charge.completion_tokens);
                // What the estimate charged beyond the answer comes back when it ends.
                let excess = cost.output.saturating_sub(charge.completion_tokens);
                let slot = Slot::new(Arc::clone(self), now_ms, group, excess);
                let mut headers = window_headers(charge.api, view.limits, view.usage, now_unix_ms);
                add_request_id(&mut headers, charge.api);
                Ok(Admission { slot, headers })
            }
            Verdict::Refused(refused) => {
                let refusal = Refusal { refused, cost };
                let limited = rate_limited(&charge, &refusal, now_unix_ms);
                Err(ApiError::RateLimited(Box::new(limited)))
            }
        };
        let reason = result.as_ref().err().map(ApiError::reason);
        if let Some(reason) = reason {
            self.counters.refused(reason);
        }
        self.write_log(LogLine {
            ts_ms: now_unix_ms,
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
            output_estimate: cost.output,
            stream: charge.stream,
        })
        .await;
        result
    }

    /// Decides a request for `model` costing `cost` under the quotas' lock:
    /// `(now_ms, verdict)`. The clock is read under the lock too, so decisions reach
    /// the log in time order.
    fn decide(&self, model: &str, cost: Cost) -> (u64, Verdict) {
        let mut quotas = self.quotas.lock();
        let now_ms = self.now_ms();
        let in_flight = self.counters.in_flight.load(Ordering::Relaxed);
        let verdict = quotas.try_admit(now_ms, model, cost, in_flight);
        if let Verdict::Admitted { .. } = verdict {
            // Under the lock, so concurrency checks never race each other.
            let now_in_flight = self.counters.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
            self.counters
                .max_in_flight
                .fetch_max(now_in_flight, Ordering::Relaxed);
        }
        (now_ms, verdict)
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
                output_estimate: 0,
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

/// What `charge` costs each limit at admission: the output at its cap when it has
/// one (Anthropic estimates OTPM from `max_tokens` before the answer exists), else
/// the completion the mock will produce.
fn cost_of(charge: &Charge<'_>) -> Cost {
    let completion = charge.completion_tokens;
    Cost {
        tokens: charge.prompt_tokens.saturating_add(completion),
        input: charge.prompt_tokens,
        output: charge
            .output_cap
            .map_or(completion, |cap| cap.max(completion)),
    }
}

/// Adds the provider's id of the request: OpenAI's header, or Anthropic's, which
/// the gateway passes on to its client.
fn add_request_id(headers: &mut HeaderMap, api: Api) {
    let name = match api {
        Api::Messages => "request-id",
        Api::Chat | Api::Completions | Api::Embeddings | Api::Responses => "x-request-id",
    };
    let id = format!("req_mock{:016x}", rand::random::<u64>());
    if let Ok(value) = HeaderValue::from_str(&id) {
        headers.insert(name, value);
    }
}

/// A refusal with the cost its message quotes.
struct Refusal {
    refused: Refused,
    cost: Cost,
}

/// The figures a refusal quotes for the limit that refused it.
struct Quote {
    limit: u64,
    used: u64,
    requested: u64,
}

impl Refusal {
    /// The figures of the refusing quota (the day's RPD and TPD stand as its `rpm`
    /// and `tpm`).
    fn quote(&self) -> Quote {
        let (limits, usage, cost) = (self.refused.limits, self.refused.usage, self.cost);
        let (limit, used, requested) = match self.refused.kind {
            LimitKind::Requests => (limits.rpm, usage.requests, 1),
            LimitKind::Tokens => (limits.tpm, usage.tokens, cost.tokens),
            LimitKind::InputTokens => (limits.itpm, usage.input_tokens, cost.input),
            LimitKind::OutputTokens => (limits.otpm, usage.output_tokens, cost.output),
            // The window does not hold requests in flight: all slots are taken.
            LimitKind::Concurrency => (limits.concurrency, limits.concurrency, 1),
        };
        Quote {
            limit,
            used,
            requested,
        }
    }

    /// The wait `retry-after` gives: exact when known; a hint after a concurrency
    /// refusal; one window of the refusing quota for a request no wait admits.
    fn wait_ms(&self) -> u64 {
        match (self.refused.kind, self.refused.retry_after_ms) {
            (LimitKind::Concurrency, _) => CONCURRENCY_RETRY_MS,
            (_, Some(ms)) => ms,
            (_, None) => self.refused.limits.window_ms,
        }
    }
}

/// The 429 for a refusal, worded as the route's provider words it.
fn rate_limited(charge: &Charge<'_>, refusal: &Refusal, now_unix_ms: u64) -> RateLimited {
    let message = match charge.api {
        Api::Messages => anthropic_message(refusal),
        Api::Chat | Api::Completions | Api::Embeddings | Api::Responses => {
            openai_message(charge.model, refusal)
        }
    };
    let view = refusal.refused.view;
    RateLimited {
        kind: refusal.refused.kind,
        scope: refusal.refused.scope,
        message,
        retry_after_ms: refusal.wait_ms(),
        headers: window_headers(charge.api, view.limits, view.usage, now_unix_ms),
    }
}

/// OpenAI's wording: "Rate limit reached ... on tokens per min (TPM): Limit ..,
/// Used .., Requested ..", or "Request too large" when no wait would do. It names
/// the model whichever quota refused: a model group's reads as the account's, with
/// the group's figures.
fn openai_message(model: &str, refusal: &Refusal) -> String {
    let org = "in organization org-tollgate-mock";
    let quote = refusal.quote();
    let name = match (refusal.refused.scope, refusal.refused.kind) {
        (_, LimitKind::Concurrency) => {
            return format!(
                "Too many concurrent requests for {model} {org}: Limit {}. Please try again when a request finishes.",
                quote.limit
            );
        }
        (Scope::Day, LimitKind::Requests) => "requests per day (RPD)",
        (Scope::Day, LimitKind::Tokens) => "tokens per day (TPD)",
        (_, LimitKind::Requests) => "requests per min (RPM)",
        (_, LimitKind::Tokens) => "tokens per min (TPM)",
        (_, LimitKind::InputTokens) => "input tokens per min (ITPM)",
        (_, LimitKind::OutputTokens) => "output tokens per min (OTPM)",
    };
    if quote.requested > quote.limit {
        return format!(
            "Request too large for {model} {org} on {name}: Limit {}, Requested {}. The input or output tokens must be reduced in order to run successfully.",
            quote.limit, quote.requested
        );
    }
    format!(
        "Rate limit reached for {model} {org} on {name}: Limit {}, Used {}, Requested {}. Please try again in {}.",
        quote.limit,
        quote.used,
        quote.requested,
        format_duration(refusal.wait_ms())
    )
}

/// Anthropic's wording: "This request would exceed the rate limit for your
/// organization of 8,000 output tokens per minute. ..." (Anthropic's limits are per
/// model class already, so a model group's refusal reads the same.)
fn anthropic_message(refusal: &Refusal) -> String {
    let quote = refusal.quote();
    let period = match refusal.refused.scope {
        Scope::Day => "day",
        Scope::Account | Scope::Group => "minute",
    };
    let unit = match refusal.refused.kind {
        LimitKind::Concurrency => {
            return format!(
                "Number of concurrent connections has exceeded your rate limit of {}. Please try again when a request finishes.",
                thousands(quote.limit)
            );
        }
        LimitKind::Requests => "requests",
        LimitKind::Tokens => "tokens",
        LimitKind::InputTokens => "input tokens",
        LimitKind::OutputTokens => "output tokens",
    };
    format!(
        "This request would exceed the rate limit for your organization of {} {unit} per {period}. For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later.",
        thousands(quote.limit)
    )
}

/// `n` with a comma between groups of three digits, as Anthropic writes limits.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mock::limits::{Limits, WindowUsage};
    use crate::mock::quotas::View;

    fn refusal_in(
        scope: Scope,
        kind: LimitKind,
        retry_after_ms: Option<u64>,
        cost: Cost,
    ) -> Refusal {
        let usage = WindowUsage {
            requests: 3,
            input_tokens: 500,
            output_tokens: 7000,
            ..WindowUsage::default()
        };
        let limits = Limits {
            rpm: 50,
            tpm: 0,
            itpm: 40_000,
            otpm: 8000,
            concurrency: 0,
            window_ms: 60_000,
        };
        let refused = Refused {
            scope,
            kind,
            retry_after_ms,
            limits,
            usage,
            view: View { limits, usage },
        };
        Refusal { refused, cost }
    }

    fn refusal(kind: LimitKind, retry_after_ms: Option<u64>, cost: Cost) -> Refusal {
        refusal_in(Scope::Account, kind, retry_after_ms, cost)
    }

    #[test]
    fn thousands_are_grouped() {
        let cases = [
            (0, "0"),
            (999, "999"),
            (8000, "8,000"),
            (40_000, "40,000"),
            (1_000_000, "1,000,000"),
        ];
        for (n, text) in cases {
            assert_eq!(thousands(n), text);
        }
    }

    #[test]
    fn refusals_name_the_limit_in_each_providers_words() {
        let cost = Cost {
            tokens: 1100,
            input: 100,
            output: 1024,
        };
        let output = refusal(LimitKind::OutputTokens, Some(1500), cost);
        assert!(
            anthropic_message(&output).starts_with(
                "This request would exceed the rate limit for your organization of 8,000 output tokens per minute."
            ),
            "{}",
            anthropic_message(&output)
        );
        assert_eq!(
            openai_message("m", &output),
            "Rate limit reached for m in organization org-tollgate-mock on output tokens per min (OTPM): Limit 8000, Used 7000, Requested 1024. Please try again in 1.5s."
        );
        let input = refusal(LimitKind::InputTokens, Some(20), cost);
        assert!(anthropic_message(&input).contains("of 40,000 input tokens per minute"));
        assert!(openai_message("m", &input).contains("input tokens per min (ITPM): Limit 40000"));
        let huge = Cost {
            output: 9000,
            ..cost
        };
        let too_large = refusal(LimitKind::OutputTokens, None, huge);
        assert!(openai_message("m", &too_large).starts_with("Request too large for m"));
        assert_eq!(too_large.wait_ms(), 60_000);
    }

    #[test]
    fn daily_and_model_group_refusals_name_their_limit() {
        let cost = Cost {
            tokens: 1100,
            input: 100,
            output: 1024,
        };
        let mut rpd = refusal_in(Scope::Day, LimitKind::Requests, Some(10_921_000), cost);
        rpd.refused.limits.rpm = 3;
        assert_eq!(
            openai_message("gpt-4o", &rpd),
            "Rate limit reached for gpt-4o in organization org-tollgate-mock on requests per day (RPD): Limit 3, Used 3, Requested 1. Please try again in 3h2m1s."
        );
        assert!(anthropic_message(&rpd).contains("of 3 requests per day."));
        let mut tpd = refusal_in(Scope::Day, LimitKind::Tokens, Some(1500), cost);
        (tpd.refused.limits.tpm, tpd.refused.usage.tokens) = (2000, 1000);
        assert_eq!(
            openai_message("m", &tpd),
            "Rate limit reached for m in organization org-tollgate-mock on tokens per day (TPD): Limit 2000, Used 1000, Requested 1100. Please try again in 1.5s."
        );
        // Too large for the day: no wait admits it, so retry-after is one day window.
        tpd.refused.limits.window_ms = 86_400_000;
        tpd.refused.retry_after_ms = None;
        tpd.refused.limits.tpm = 1000;
        assert!(openai_message("m", &tpd).starts_with("Request too large for m"));
        assert!(openai_message("m", &tpd).contains("tokens per day (TPD)"));
        assert_eq!(tpd.wait_ms(), 86_400_000);
        // A model group's limit reads as the account's, with the group's figures.
        let small = Cost {
            tokens: 500,
            ..cost
        };
        let mut group = refusal_in(Scope::Group, LimitKind::Tokens, Some(1200), small);
        (group.refused.limits.tpm, group.refused.usage.tokens) = (30_000, 29_600);
        assert_eq!(
            openai_message("gpt-4o", &group),
            "Rate limit reached for gpt-4o in organization org-tollgate-mock on tokens per min (TPM): Limit 30000, Used 29600, Requested 500. Please try again in 1.2s."
        );
        assert!(anthropic_message(&group).contains("of 30,000 tokens per minute."));
    }
}
