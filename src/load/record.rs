//! What each request ended as, and the cheap structures that accumulate it.
//!
//! A [`Recorder`] holds counts, token sums and latency histograms (hdrhistogram, in
//! microseconds, 3 significant figures, 1 us to [`MAX_TIMEOUT`]). A run keeps a small
//! fixed number of recorders ([`Shards`]): with up to [`MAX_SHARDS`] workers each worker
//! has its own, so its lock is never contended; beyond that workers share, which keeps
//! memory bounded (~0.6 MB per recorder) whatever the concurrency. Recorders are merged
//! once at the end. The progress bar reads [`Live`] atomics instead of locking.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use reqwest::StatusCode;
use serde::Serialize;

use super::args::MAX_TIMEOUT;
use super::usage::Usage;

/// Most recorders a run keeps, whatever its concurrency.
pub const MAX_SHARDS: usize = 16;

/// What one request (or one open-loop slot) ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// 2xx, body read in full.
    Ok,
    /// 429.
    RateLimited,
    /// Any other status below 500 (4xx, and the odd 1xx/3xx).
    ClientError,
    /// 5xx.
    ServerError,
    /// Connect failure, timeout, reset, or a body cut short.
    TransportError,
    /// Open loop only: the slot's time came with no in-flight room, or the schedule
    /// had fallen too far behind; nothing was sent.
    Dropped,
}

impl Outcome {
    /// Every outcome, in report order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::RateLimited,
        Outcome::ClientError,
        Outcome::ServerError,
        Outcome::TransportError,
        Outcome::Dropped,
    ];

    /// The outcome a response status means (for a response read to the end).
    pub fn from_status(status: StatusCode) -> Outcome {
        match status.as_u16() {
            200..=299 => Outcome::Ok,
            429 => Outcome::RateLimited,
            500..=599 => Outcome::ServerError,
            _ => Outcome::ClientError,
        }
    }

    /// The snake_case name used in the table and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::RateLimited => "rate_limited",
            Outcome::ClientError => "client_error",
            Outcome::ServerError => "server_error",
            Outcome::TransportError => "transport_error",
            Outcome::Dropped => "dropped",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The result of one sent request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// How it ended.
    pub outcome: Outcome,
    /// From just before sending to the end of the body (or the error).
    pub latency: Duration,
    /// Streams only: from just before sending to the first body chunk.
    pub ttfb: Option<Duration>,
    /// Tokens the response reported.
    pub usage: Usage,
}

/// Counts, token sums and histograms for some set of requests.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Requests per outcome, indexed in [`Outcome::ALL`] order.
    pub counts: [u64; 6],
    /// Latency of `ok` requests, in microseconds.
    pub latency_us: Histogram<u64>,
    /// Time to first body byte of `ok` streamed requests, in microseconds.
    pub ttfb_us: Histogram<u64>,
    /// Latency of `rate_limited` answers, in microseconds (shows a gateway's queueing).
    pub rate_limited_us: Histogram<u64>,
    /// Prompt tokens reported by `ok` responses.
    pub prompt_tokens: u64,
    /// Completion tokens reported by `ok` responses.
    pub completion_tokens: u64,
    /// `ok` responses that reported no usage.
    pub ok_without_usage: u64,
    /// Retry-after waits taken.
    pub backoff_waits: u64,
    /// Total time spent waiting out retry-after.
    pub backoff: Duration,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            counts: [0; 6],
            latency_us: histogram(),
            ttfb_us: histogram(),
            rate_limited_us: histogram(),
            prompt_tokens: 0,
            completion_tokens: 0,
            ok_without_usage: 0,
            backoff_waits: 0,
            backoff: Duration::ZERO,
        }
    }
}

fn histogram() -> Histogram<u64> {
    let high = u64::try_from(MAX_TIMEOUT.as_micros()).unwrap_or(u64::MAX);
    // Constant, valid bounds (1 <= low, high >= 2 * low, sigfig <= 5): cannot fail.
    Histogram::new_with_bounds(1, high, 3).expect("constant histogram bounds are valid")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

impl Recorder {
    /// Adds one sent request.
    pub fn record(&mut self, sample: &Sample) {
        self.counts[sample.outcome.index()] += 1;
        match sample.outcome {
            Outcome::Ok => {
                self.latency_us.saturating_record(micros(sample.latency));
                if let Some(ttfb) = sample.ttfb {
                    self.ttfb_us.saturating_record(micros(ttfb));
                }
                if !sample.usage.is_reported() {
                    self.ok_without_usage += 1;
                }
                self.prompt_tokens += sample.usage.prompt.unwrap_or(0);
                self.completion_tokens += sample.usage.completion.unwrap_or(0);
            }
            Outcome::RateLimited => self
                .rate_limited_us
                .saturating_record(micros(sample.latency)),
            _ => {}
        }
    }

    /// Adds `n` open-loop slots that were not sent.
    pub fn record_dropped(&mut self, n: u64) {
        self.counts[Outcome::Dropped.index()] += n;
    }

    /// Adds one retry-after wait of `waited`.
    pub fn record_backoff(&mut self, waited: Duration) {
        self.backoff_waits += 1;
        self.backoff += waited;
    }

    /// Requests that ended as `outcome`.
    pub fn count(&self, outcome: Outcome) -> u64 {
        self.counts[outcome.index()]
    }

    /// Folds `other` into `self`.
    pub fn merge(&mut self, other: &Recorder) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts) {
            *mine += theirs;
        }
        // Same bounds on both sides and saturating records: addition cannot overflow
        // the range, so an error would be a bug; keep going with what was added.
        for (mine, theirs) in [
            (&mut self.latency_us, &other.latency_us),
            (&mut self.ttfb_us, &other.ttfb_us),
            (&mut self.rate_limited_us, &other.rate_limited_us),
        ] {
            if let Err(e) = mine.add(theirs) {
                tracing::warn!(error = %e, "histogram merge failed");
            }
        }
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.ok_without_usage += other.ok_without_usage;
        self.backoff_waits += other.backoff_waits;
        self.backoff += other.backoff;
    }
}

/// A fixed set of recorders that tasks pick by index (worker id or slot number).
#[derive(Debug)]
pub struct Shards(Vec<Mutex<Recorder>>);

impl Shards {
    /// One recorder per user, up to [`MAX_SHARDS`].
    pub fn new(users: usize) -> Shards {
        Shards(
            (0..users.clamp(1, MAX_SHARDS))
                .map(|_| Mutex::default())
                .collect(),
        )
    }

    /// Runs `f` on the recorder for `key`. The lock is held only for `f`, never
    /// across an await.
    pub fn with<R>(&self, key: usize, f: impl FnOnce(&mut Recorder) -> R) -> R {
        let shard = &self.0[key % self.0.len()];
        let mut guard = shard.lock();
        f(&mut guard)
    }

    /// All recorders folded into one.
    pub fn merged(&self) -> Recorder {
        let mut total = Recorder::default();
        for shard in &self.0 {
            let shard = shard.lock();
            total.merge(&shard);
        }
        total
    }
}

/// Counters the progress bar reads while the run goes.
#[derive(Debug, Default)]
pub struct Live {
    /// Requests finished (any outcome but dropped).
    pub done: AtomicU64,
    /// `ok` so far.
    pub ok: AtomicU64,
    /// `rate_limited` so far.
    pub rate_limited: AtomicU64,
    /// client, server and transport errors so far.
    pub errors: AtomicU64,
    /// `dropped` so far.
    pub dropped: AtomicU64,
}

impl Live {
    /// Counts one finished request.
    pub fn record(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Ok => &self.ok,
            Outcome::RateLimited => &self.rate_limited,
            Outcome::Dropped => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            _ => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(outcome: Outcome, ms: u64, usage: Usage) -> Sample {
        Sample {
            outcome,
            latency: Duration::from_millis(ms),
            ttfb: None,
            usage,
        }
    }

    #[test]
    fn statuses_map_to_outcomes() {
        let cases = [
            (200, Outcome::Ok),
            (204, Outcome::Ok),
            (429, Outcome::RateLimited),
            (400, Outcome::ClientError),
            (401, Outcome::ClientError),
            (302, Outcome::ClientError),
            (500, Outcome::ServerError),
            (503, Outcome::ServerError),
        ];
        for (code, want) in cases {
            assert_eq!(
                Outcome::from_status(StatusCode::from_u16(code).unwrap()),
                want
            );
        }
    }

    #[test]
    fn only_ok_requests_feed_latency_and_tokens() {
        let mut r = Recorder::default();
        let usage = Usage {
            prompt: Some(10),
            completion: Some(5),
        };
        r.record(&sample(Outcome::Ok, 3, usage));
        r.record(&sample(Outcome::Ok, 4, Usage::default()));
        r.record(&sample(Outcome::RateLimited, 1, usage));
        r.record(&sample(Outcome::ServerError, 9, usage));
        assert_eq!(r.count(Outcome::Ok), 2);
        assert_eq!(r.latency_us.len(), 2);
        assert_eq!(r.rate_limited_us.len(), 1);
        assert_eq!(
            (r.prompt_tokens, r.completion_tokens, r.ok_without_usage),
            (10, 5, 1)
        );
    }

    #[test]
    fn shards_merge_everything_and_bound_their_number() {
        let shards = Shards::new(1000);
        assert_eq!(shards.0.len(), MAX_SHARDS);
        for i in 0..100 {
            shards.with(i, |r| {
                r.record(&sample(Outcome::Ok, i as u64 + 1, Usage::default()))
            });
        }
        shards.with(3, |r| r.record_dropped(7));
        shards.with(5, |r| r.record_backoff(Duration::from_millis(30)));
        shards.with(6, |r| r.record_backoff(Duration::from_millis(20)));
        let total = shards.merged();
        assert_eq!(total.count(Outcome::Ok), 100);
        assert_eq!(total.count(Outcome::Dropped), 7);
        assert_eq!(total.latency_us.len(), 100);
        assert!(total.latency_us.max() >= 99_900);
        assert_eq!(
            (total.backoff_waits, total.backoff),
            (2, Duration::from_millis(50))
        );
    }

    #[test]
    fn huge_latencies_saturate_instead_of_failing() {
        let mut r = Recorder::default();
        r.record(&sample(Outcome::Ok, u64::MAX / 1_000_000, Usage::default()));
        assert_eq!(r.latency_us.len(), 1);
    }
}
