//! Counters behind `GET /stats` and [`MockHandle::stats`](super::MockHandle::stats):
//! plain atomics on the hot path, read without stopping the mock.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::limits::{Limits, Peaks};
use super::log::Reason;

/// A snapshot of what the mock has seen since it started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MockStats {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests refused, by reason (a model group's refusals under the account's
    /// reason of the same kind).
    pub refused: RefusedStats,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Completion tokens of admitted requests.
    pub completion_tokens: u64,
    /// Requests being served now (streams until their last byte).
    pub in_flight: u64,
    /// Most requests in flight at once.
    pub max_in_flight: u64,
    /// Most requests the sliding window ever held, measured at each admission (with
    /// the RPM limit `L`, `peak / L - 1` is the overshoot; never above `L` here).
    pub peak_window_requests: u64,
    /// Most tokens the sliding window ever held, measured at each admission.
    pub peak_window_tokens: u64,
    /// Most input tokens the sliding window ever held, measured at each admission.
    #[serde(default)]
    pub peak_window_input_tokens: u64,
    /// Most output tokens the sliding window ever held, measured at each admission:
    /// as charged then, so answers still running count their `max_tokens`.
    #[serde(default)]
    pub peak_window_output_tokens: u64,
    /// The limits enforced (`0` = unlimited).
    pub limits: Limits,
}

/// Refusal counts, one per [`Reason`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedStats {
    /// Over the requests-per-window limit.
    pub requests: u64,
    /// Over the tokens-per-window limit.
    pub tokens: u64,
    /// Over the input-tokens-per-window limit.
    #[serde(default)]
    pub input_tokens: u64,
    /// Over the output-tokens-per-window limit.
    #[serde(default)]
    pub output_tokens: u64,
    /// Over the concurrency limit.
    pub concurrency: u64,
    /// Over the requests-per-day limit.
    #[serde(default)]
    pub requests_per_day: u64,
    /// Over the tokens-per-day limit.
    #[serde(default)]
    pub tokens_per_day: u64,
    /// Malformed or unacceptable requests.
    pub invalid: u64,
    /// Missing or wrong API key.
    pub unauthorized: u64,
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) admitted: AtomicU64,
    refused: [AtomicU64; 9],
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) completion_tokens: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) max_in_flight: AtomicU64,
}

fn reason_index(reason: Reason) -> usize {
    match reason {
        Reason::Requests => 0,
        Reason::Tokens => 1,
        Reason::Concurrency => 2,
        Reason::Invalid => 3,
        Reason::Unauthorized => 4,
        Reason::InputTokens => 5,
        Reason::OutputTokens => 6,
        Reason::RequestsPerDay => 7,
        Reason::TokensPerDay => 8,
    }
}

impl Counters {
    /// Counts one refusal.
    pub(crate) fn refused(&self, reason: Reason) {
        self.refused[reason_index(reason)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one admission of `prompt` + `completion` tokens.
    pub(crate) fn admitted(&self, prompt: u64, completion: u64) {
        self.admitted.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens.fetch_add(prompt, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(completion, Ordering::Relaxed);
    }

    /// A snapshot, completed with the window figures kept under the limit lock.
    pub(crate) fn snapshot(&self, limits: Limits, peaks: Peaks) -> MockStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let refused = |reason| get(&self.refused[reason_index(reason)]);
        MockStats {
            admitted: get(&self.admitted),
            refused: RefusedStats {
                requests: refused(Reason::Requests),
                tokens: refused(Reason::Tokens),
                input_tokens: refused(Reason::InputTokens),
                output_tokens: refused(Reason::OutputTokens),
                concurrency: refused(Reason::Concurrency),
                requests_per_day: refused(Reason::RequestsPerDay),
                tokens_per_day: refused(Reason::TokensPerDay),
                invalid: refused(Reason::Invalid),
                unauthorized: refused(Reason::Unauthorized),
            },
            prompt_tokens: get(&self.prompt_tokens),
            completion_tokens: get(&self.completion_tokens),
            in_flight: get(&self.in_flight),
            max_in_flight: get(&self.max_in_flight),
            peak_window_requests: peaks.requests,
            peak_window_tokens: peaks.tokens,
            peak_window_input_tokens: peaks.input_tokens,
            peak_window_output_tokens: peaks.output_tokens,
            limits,
        }
    }
}
