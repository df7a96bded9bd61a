//! The mock's own limits: an exact sliding log over integer milliseconds, written
//! independently of `crate::limiter` so the oracle shares no code with the gateway it
//! judges.
//!
//! Time is the mock's clock in whole milliseconds (the same `ts_ms` the JSONL log
//! records, minus a constant), so replaying the log with the rule below reproduces
//! every decision and the peaks exactly. An admission at `t` stays in the window for
//! every `now` with `now - t < window_ms`: the window is `(now - window_ms, now]`.
//!
//! A request is admitted iff, with it, the window holds at most `rpm` requests and
//! `tpm` tokens, and fewer than `concurrency` requests are in flight. Nothing is
//! charged on refusal. Admissions in the same millisecond share one entry, so the log
//! holds at most `window_ms` entries; entries keep running totals, so the retry time
//! of a refusal is a binary search.

use std::collections::VecDeque;

/// The limits, `0` meaning unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    /// Requests per window.
    pub rpm: u64,
    /// Tokens per window.
    pub tpm: u64,
    /// Requests in flight.
    pub concurrency: u64,
    /// Window length, in milliseconds.
    pub window_ms: u64,
}

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LimitKind {
    /// Requests per window.
    Requests,
    /// Tokens per window.
    Tokens,
    /// Requests in flight.
    Concurrency,
}

/// What the window holds at a decision (after the admission, if admitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WindowUsage {
    /// Requests in the window.
    pub requests: u64,
    /// Tokens in the window.
    pub tokens: u64,
    /// Milliseconds until the window is empty again (the newest entry expires).
    pub reset_ms: u64,
}

/// The outcome of [`SlidingLog::try_admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    /// Charged; the usage includes this request.
    Admitted(WindowUsage),
    /// Not charged.
    Refused {
        /// The limit that needs the longest wait.
        kind: LimitKind,
        /// Milliseconds after which the same request would be admitted if nothing
        /// else arrived; `None` when unknowable (concurrency) or never (a request
        /// larger than `tpm`).
        retry_after_ms: Option<u64>,
        /// Usage of the window without this request.
        usage: WindowUsage,
    },
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    at_ms: u64,
    /// Requests admitted since start, up to and including this entry.
    total_requests: u64,
    /// Tokens admitted since start, up to and including this entry.
    total_tokens: u64,
}

/// The sliding log and the peaks it has seen.
#[derive(Debug)]
pub(super) struct SlidingLog {
    limits: Limits,
    entries: VecDeque<Entry>,
    total_requests: u64,
    total_tokens: u64,
    expired_requests: u64,
    expired_tokens: u64,
    peak_requests: u64,
    peak_tokens: u64,
}

impl SlidingLog {
    /// An empty log enforcing `limits` (`limits.window_ms` must be positive).
    pub(super) fn new(limits: Limits) -> Self {
        debug_assert!(limits.window_ms > 0);
        SlidingLog {
            limits,
            entries: VecDeque::new(),
            total_requests: 0,
            total_tokens: 0,
            expired_requests: 0,
            expired_tokens: 0,
            peak_requests: 0,
            peak_tokens: 0,
        }
    }

    /// The limits enforced.
    pub(super) fn limits(&self) -> Limits {
        self.limits
    }

    /// Largest window usage seen right after an admission: `(requests, tokens)`.
    pub(super) fn peaks(&self) -> (u64, u64) {
        (self.peak_requests, self.peak_tokens)
    }

    /// Decides one request costing `tokens` at `now_ms` (never earlier than a previous
    /// call) with `in_flight` requests running, and charges it if admitted.
    pub(super) fn try_admit(&mut self, now_ms: u64, tokens: u64, in_flight: u64) -> Decision {
        self.expire(now_ms);
        let usage = self.usage(now_ms);
        let limits = self.limits;
        if limits.concurrency > 0 && in_flight >= limits.concurrency {
            let kind = LimitKind::Concurrency;
            return Decision::Refused {
                kind,
                retry_after_ms: None,
                usage,
            };
        }
        let mut refusal: Option<(LimitKind, Option<u64>)> = None;
        if limits.rpm > 0 && usage.requests + 1 > limits.rpm {
            let wait = self.wait_ms(now_ms, usage.requests + 1 - limits.rpm, |e| {
                e.total_requests
            });
            refusal = Some((LimitKind::Requests, wait));
        }
        if limits.tpm > 0 && usage.tokens.saturating_add(tokens) > limits.tpm {
            let excess = usage.tokens.saturating_add(tokens) - limits.tpm;
            let wait = if tokens > limits.tpm {
                None
            } else {
                self.wait_ms(now_ms, excess, |e| e.total_tokens)
            };
            // Report the limit with the longest wait, so waiting it out suffices.
            if refusal.is_none_or(|(_, w)| wait.unwrap_or(u64::MAX) > w.unwrap_or(u64::MAX)) {
                refusal = Some((LimitKind::Tokens, wait));
            }
        }
        if let Some((kind, retry_after_ms)) = refusal {
            return Decision::Refused {
                kind,
                retry_after_ms,
                usage,
            };
        }
        self.charge(now_ms, tokens);
        let usage = self.usage(now_ms);
        self.peak_requests = self.peak_requests.max(usage.requests);
        self.peak_tokens = self.peak_tokens.max(usage.tokens);
        debug_assert!(limits.rpm == 0 || usage.requests <= limits.rpm);
        debug_assert!(limits.tpm == 0 || usage.tokens <= limits.tpm);
        Decision::Admitted(usage)
    }

    fn expire(&mut self, now_ms: u64) {
        while let Some(front) = self.entries.front() {
            if now_ms - front.at_ms.min(now_ms) < self.limits.window_ms {
                break;
            }
            self.expired_requests = front.total_requests;
            self.expired_tokens = front.total_tokens;
            self.entries.pop_front();
        }
    }

    fn usage(&self, now_ms: u64) -> WindowUsage {
        WindowUsage {
            requests: self.total_requests - self.expired_requests,
            tokens: self.total_tokens - self.expired_tokens,
            reset_ms: self.entries.back().map_or(0, |e| {
                (e.at_ms + self.limits.window_ms).saturating_sub(now_ms)
            }),
        }
    }

    /// Milliseconds until at least `amount` of the quantity read by `total` has left
    /// the window, or `None` if the window does not hold that much.
    fn wait_ms(&self, now_ms: u64, amount: u64, total: impl Fn(&Entry) -> u64) -> Option<u64> {
        let expired = total(&Entry {
            at_ms: 0,
            total_requests: self.expired_requests,
            total_tokens: self.expired_tokens,
        });
        let index = self
            .entries
            .partition_point(|e| total(e) - expired < amount);
        let entry = self.entries.get(index)?;
        Some(entry.at_ms + self.limits.window_ms - now_ms)
    }

    fn charge(&mut self, now_ms: u64, tokens: u64) {
        self.total_requests += 1;
        self.total_tokens += tokens;
        match self.entries.back_mut() {
            Some(back) if back.at_ms == now_ms => {
                back.total_requests = self.total_requests;
                back.total_tokens = self.total_tokens;
            }
            _ => self.entries.push_back(Entry {
                at_ms: now_ms,
                total_requests: self.total_requests,
                total_tokens: self.total_tokens,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(rpm: u64, tpm: u64, concurrency: u64) -> SlidingLog {
        SlidingLog::new(Limits {
            rpm,
            tpm,
            concurrency,
            window_ms: 1000,
        })
    }

    fn refused(d: Decision) -> (LimitKind, Option<u64>) {
        match d {
            Decision::Refused {
                kind,
                retry_after_ms,
                ..
            } => (kind, retry_after_ms),
            Decision::Admitted(u) => panic!("expected a refusal, got {u:?}"),
        }
    }

    #[test]
    fn rpm_admits_exactly_n_and_retry_is_exact() {
        let mut l = log(3, 0, 0);
        for t in [0, 10, 20] {
            assert!(matches!(l.try_admit(t, 1, 0), Decision::Admitted(_)));
        }
        assert_eq!(
            refused(l.try_admit(500, 1, 0)),
            (LimitKind::Requests, Some(500))
        );
        // One millisecond early is still refused; on time is admitted.
        assert_eq!(
            refused(l.try_admit(999, 1, 0)),
            (LimitKind::Requests, Some(1))
        );
        let Decision::Admitted(usage) = l.try_admit(1000, 1, 0) else {
            panic!()
        };
        assert_eq!(
            usage,
            WindowUsage {
                requests: 3,
                tokens: 3,
                reset_ms: 1000
            }
        );
        assert_eq!(l.peaks(), (3, 3));
    }

    #[test]
    fn tpm_retry_waits_for_enough_tokens_to_expire() {
        let mut l = log(0, 100, 0);
        assert!(matches!(l.try_admit(0, 30, 0), Decision::Admitted(_)));
        assert!(matches!(l.try_admit(100, 30, 0), Decision::Admitted(_)));
        assert!(matches!(l.try_admit(200, 30, 0), Decision::Admitted(_)));
        // 90 used; 50 more needs 40 freed: the first two entries, so until 100 + 1000.
        assert_eq!(
            refused(l.try_admit(300, 50, 0)),
            (LimitKind::Tokens, Some(800))
        );
        assert!(matches!(l.try_admit(1099, 50, 0), Decision::Refused { .. }));
        assert!(matches!(l.try_admit(1100, 50, 0), Decision::Admitted(_)));
        // Larger than the limit: never admitted, no retry time.
        assert_eq!(
            refused(l.try_admit(5000, 101, 0)),
            (LimitKind::Tokens, None)
        );
        assert_eq!(l.peaks(), (3, 90));
    }

    #[test]
    fn longest_wait_is_reported_and_nothing_is_charged() {
        let mut l = log(2, 100, 0);
        assert!(matches!(l.try_admit(0, 90, 0), Decision::Admitted(_)));
        assert!(matches!(l.try_admit(600, 5, 0), Decision::Admitted(_)));
        // Requests free at 1000 (wait 300), tokens need the entry at 0 gone too; at
        // 700 both free at 1000, so: tokens 300 vs requests 300 -> requests kept.
        let (kind, wait) = refused(l.try_admit(700, 50, 0));
        assert_eq!((kind, wait), (LimitKind::Requests, Some(300)));
        assert_eq!(l.peaks(), (2, 95));
        let mut l = log(3, 100, 0);
        assert!(matches!(l.try_admit(0, 10, 0), Decision::Admitted(_)));
        assert!(matches!(l.try_admit(500, 80, 0), Decision::Admitted(_)));
        assert!(matches!(l.try_admit(600, 1, 0), Decision::Admitted(_)));
        // Requests free at 1000 (wait 300); 50 tokens need the 80 gone: 1500.
        assert_eq!(
            refused(l.try_admit(700, 50, 0)),
            (LimitKind::Tokens, Some(800))
        );
    }

    #[test]
    fn concurrency_is_checked_first_and_same_ms_entries_merge() {
        let mut l = log(0, 0, 2);
        assert!(matches!(l.try_admit(5, 1, 1), Decision::Admitted(_)));
        assert_eq!(
            refused(l.try_admit(5, 1, 2)),
            (LimitKind::Concurrency, None)
        );
        assert!(matches!(l.try_admit(5, 1, 0), Decision::Admitted(_)));
        assert_eq!(l.entries.len(), 1);
        assert_eq!(l.peaks(), (2, 2));
    }

    /// Brute-force replay: the log's decisions equal a naive window sum.
    #[test]
    fn matches_naive_window_over_a_seeded_trace() {
        use rand::{Rng, SeedableRng};
        let seed = 7;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut l = log(20, 500, 0);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut now = 0;
        for _ in 0..5000 {
            now += rng.random_range(0..40);
            let cost = rng.random_range(1..60);
            let in_window = |a: &&(u64, u64)| now - a.0 < 1000;
            let reqs = admitted.iter().filter(in_window).count() as u64;
            let toks: u64 = admitted.iter().filter(in_window).map(|a| a.1).sum();
            let expect = reqs < 20 && toks + cost <= 500;
            let got = matches!(l.try_admit(now, cost, 0), Decision::Admitted(_));
            assert_eq!(got, expect, "seed={seed} now={now}");
            if got {
                admitted.push((now, cost));
            }
        }
    }
}
