//! The one shared state of a running mock: config, the quotas' logs behind a short
//! `Mutex` (held for one decision or one correction, never across an await),
//! atomic counters, the log sender, and the request sequence that keys the
//! completion draws.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, header};

use crate::clock::Clock;

use super::completion::{self, Completion};
use super::config::MockConfig;
use super::error::ApiError;
use super::log::{Api, LogSender};
use super::quotas::Quotas;
use super::stats::{Counters, MockStats};

/// The shared state of one mock upstream; build it with [`MockState::start`] and pass
/// it to [`app`](super::app).
#[derive(Debug)]
pub struct MockState {
    pub(super) config: MockConfig,
    pub(super) quotas: Mutex<Quotas>,
    pub(super) counters: Counters,
    pub(super) log: Option<LogSender>,
    seq: AtomicU64,
    /// The wall-following node clock: an honest provider keeps time on its
    /// (NTP-disciplined) wall clock, and on one machine the wall clock is the best
    /// reading of true time; a clock that ignored its steps would judge windows
    /// that are longer or shorter than the provider's (src/clock/wall.rs).
    clock: Clock,
    pub(super) started_unix_ms: u64,
    /// The last responses the Responses API made, for `GET
    /// /v1/responses/{id}` (`super::stored`).
    pub(super) stored: super::stored::Stored,
}

/// What an admitted request is charged.
#[derive(Debug)]
pub(crate) struct Charge<'a> {
    pub(crate) api: Api,
    pub(crate) model: &'a str,
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
    /// The most output the request allows in all (`max_tokens`, times the prompts
    /// of a legacy completion); `None` when it sets no cap. The output limit is
    /// charged this at admission, as Anthropic estimates OTPM from `max_tokens`.
    pub(crate) output_cap: Option<u64>,
    pub(crate) stream: bool,
}

/// A concurrency slot, released on drop. Its answer has ended then, so releasing
/// it also gives back the output tokens its admission was charged beyond the real
/// output.
#[derive(Debug)]
pub(crate) struct Slot {
    state: Arc<MockState>,
    /// When the admission was charged, on the limit logs' clock.
    admitted_ms: u64,
    /// The model group it was charged to, whose log is corrected too.
    group: Option<usize>,
    /// Output tokens charged at admission beyond the real output.
    output_excess: u64,
}

impl Slot {
    /// The slot of an admission charged at `admitted_ms` (and to `group`),
    /// `output_excess` output tokens above its real output.
    pub(super) fn new(
        state: Arc<MockState>,
        admitted_ms: u64,
        group: Option<usize>,
        output_excess: u64,
    ) -> Slot {
        Slot {
            state,
            admitted_ms,
            group,
            output_excess,
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.output_excess > 0 {
            let mut quotas = self.state.quotas.lock();
            quotas.correct_output(self.admitted_ms, self.group, self.output_excess);
        }
        self.state
            .counters
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// An admitted request: its slot and the `x-ratelimit-*` headers to send.
#[derive(Debug)]
pub(crate) struct Admission {
    pub(crate) slot: Slot,
    pub(crate) headers: HeaderMap,
}

impl MockState {
    /// Validates `config`, opens the log (if any) and warms up the tokenizers.
    pub async fn start(config: MockConfig) -> std::io::Result<Arc<MockState>> {
        config
            .validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let log = match &config.log_path {
            Some(path) => Some(LogSender::open(path).await?),
            None => None,
        };
        let warm = tokio::task::spawn_blocking(|| {
            let _ = tiktoken_rs::cl100k_base_singleton();
            let _ = tiktoken_rs::o200k_base_singleton();
        });
        warm.await.map_err(std::io::Error::other)?;
        let quotas = Quotas::new(&config);
        let clock = Clock::following_wall();
        let started_unix_ms = clock.now_ns() / 1_000_000;
        Ok(Arc::new(MockState {
            config,
            quotas: Mutex::new(quotas),
            counters: Counters::default(),
            log,
            seq: AtomicU64::new(0),
            clock,
            started_unix_ms,
            stored: super::stored::Stored::default(),
        }))
    }

    /// The configuration this mock runs with.
    pub fn config(&self) -> &MockConfig {
        &self.config
    }

    /// A snapshot of the counters and the account window's limits and peaks.
    pub fn stats(&self) -> MockStats {
        let (limits, peaks) = {
            let quotas = self.quotas.lock();
            (quotas.account().limits(), quotas.account().peaks())
        };
        self.counters.snapshot(limits, peaks)
    }

    /// Flushes and closes the log; call once the server has stopped.
    pub async fn close(&self) -> std::io::Result<()> {
        match &self.log {
            Some(log) => log.close().await,
            None => Ok(()),
        }
    }

    /// Milliseconds since start on the mock's clock (monotonic, following the
    /// wall clock's steps).
    pub(super) fn now_ms(&self) -> u64 {
        (self.clock.now_ns() / 1_000_000).saturating_sub(self.started_unix_ms)
    }

    /// Unix seconds, for `created` fields.
    pub(crate) fn unix_secs(&self) -> u64 {
        (self.started_unix_ms + self.now_ms()) / 1000
    }

    /// 401 unless the request carries the configured key (Bearer or `x-api-key`).
    pub(crate) fn check_auth(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.config.api_key else {
            return Ok(());
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
        if bearer == Some(key.as_str()) || x_api_key == Some(key.as_str()) {
            Ok(())
        } else {
            Err(ApiError::Unauthorized)
        }
    }

    /// 404 when `--models` is set and does not list `model`.
    pub(crate) fn check_model(&self, model: &str) -> Result<(), ApiError> {
        let models = &self.config.models;
        if models.is_empty() || models.iter().any(|m| m == model) {
            Ok(())
        } else {
            Err(ApiError::ModelNotFound(model.to_owned()))
        }
    }

    /// Numbers the next valid request and draws its completion, capped by
    /// `max_tokens`: `(sequence number, completion)`.
    /// The next request sequence number (ids of the mock's objects).
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn draw(&self, max_tokens: Option<u64>) -> (u64, Completion) {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let (min, max) = (
            self.config.completion_min_tokens,
            self.config.completion_max_tokens,
        );
        (
            seq,
            completion::draw(self.config.seed, seq, min, max, max_tokens),
        )
    }

    /// Waits the configured time to first byte, plus the whole generation time when
    /// the response is not streamed.
    pub(crate) async fn first_byte_delay(&self, stream: bool, completion_tokens: u64) {
        let mut ms = self.config.latency_ms;
        if !stream {
            ms = ms.saturating_add(self.config.inter_token_ms.saturating_mul(completion_tokens));
        }
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}
