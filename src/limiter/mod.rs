//! # Limiter core: pure, clock-injected rate-limit algorithms
//!
//! No IO and no clock: every method takes `now` ([`Nanos`] since an epoch the caller
//! picks) and returns a decision. The actors own instances and feed them time.
//!
//! - [`sliding_window`]: bucketed window (default). Conservative: a bucket counts in
//!   full until its *end* leaves the window, so no window of length W ever holds more
//!   than the ceiling. Amortised O(1) per admission; a denial walks at most the
//!   ring (`buckets + 1` slots) to compute the exact retry-after.
//! - [`token_bucket`]: GCRA with a burst. In any interval of length d it admits at most
//!   `burst + capacity * d / W`.
//! - [`sliding_log`]: an exact per-event log. Costly (24 bytes per admission in the
//!   window, at most [`sliding_log::MAX_LOG_ENTRIES`]); kept for comparison.
//!
//! Two-phase use: [`Limiter::reserve`] charges an estimate and returns a
//! [`Reservation`]; [`Limiter::settle`] later corrects it to the real cost (a refund
//! or a debt), attributed to the time slot of the reservation, never to "now".
//! A refund never returns more than the reservation charged.
//!
//! Batch lanes use a [`Ceiling`] below the full capacity, so they can never take the
//! headroom interactive traffic relies on.
//!
//! Time is expected to be monotonic per limiter; an earlier `now` than the newest one
//! a reservation was made at is treated as that newest instant.
//!
//! The algorithms, their promises and proof sketches: `docs/design/limiter.md`.

pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

#[cfg(test)]
mod testkit;

/// Nanoseconds since an epoch chosen by the caller. The core never reads a clock.
pub type Nanos = u64;

/// Nanoseconds per second, for conversions at the edges.
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

pub use crate::config::Algorithm;

/// The static description of one limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    /// Cost admitted per window (requests or tokens). Must be > 0.
    pub capacity: u64,
    /// Window length in nanoseconds. Must be > 0.
    pub window_ns: Nanos,
    /// Algorithm to enforce the limit with.
    pub algorithm: Algorithm,
    /// Number of buckets per window for `sliding-window` (default 60); ignored by the
    /// others. Must divide into a non-zero bucket width.
    pub buckets: u32,
    /// Burst for `token-bucket` (cost admissible at once from rest); ignored by the
    /// others. Must be in 1..=capacity.
    pub burst: u64,
}

impl LimitSpec {
    /// Bucket count used by [`LimitSpec::new`] (a bucket per second for a minute window).
    pub const DEFAULT_BUCKETS: u32 = 60;
    /// Upper bound on `buckets`, so a sliding window's ring (at most `2 * buckets + 1`
    /// slots of 16 bytes) stays small.
    pub const MAX_BUCKETS: u32 = crate::config::bounds::MAX_BUCKETS;

    /// A spec with [`LimitSpec::DEFAULT_BUCKETS`] buckets and `burst = capacity`.
    pub fn new(capacity: u64, window_ns: Nanos, algorithm: Algorithm) -> LimitSpec {
        LimitSpec {
            capacity,
            window_ns,
            algorithm,
            buckets: Self::DEFAULT_BUCKETS,
            burst: capacity,
        }
    }

    /// Checks the fields `self.algorithm` uses; [`Limiter::try_new`] accepts exactly the
    /// specs this accepts.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.validate_for(self.algorithm)
    }

    /// Checks the fields `algorithm` uses (the others are ignored).
    pub(crate) fn validate_for(&self, algorithm: Algorithm) -> Result<(), SpecError> {
        if self.capacity == 0 {
            return Err(SpecError::ZeroCapacity);
        }
        if self.window_ns == 0 {
            return Err(SpecError::WindowTooShort);
        }
        match algorithm {
            Algorithm::SlidingWindow if self.buckets > Self::MAX_BUCKETS => {
                Err(SpecError::TooManyBuckets)
            }
            Algorithm::SlidingWindow
                if self.buckets == 0 || self.window_ns / u64::from(self.buckets) == 0 =>
            {
                Err(SpecError::WindowTooShort)
            }
            Algorithm::TokenBucket if self.burst == 0 || self.burst > self.capacity => {
                Err(SpecError::BadBurst)
            }
            _ => Ok(()),
        }
    }
}

/// Why a [`LimitSpec`] is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// capacity is zero.
    #[error("capacity must be greater than 0")]
    ZeroCapacity,
    /// window is zero, or too short for the bucket count.
    #[error("window must be at least one nanosecond per bucket")]
    WindowTooShort,
    /// burst is zero or above capacity.
    #[error("burst must be between 1 and the capacity")]
    BadBurst,
    /// more buckets than [`LimitSpec::MAX_BUCKETS`] (memory bound).
    #[error("buckets must be at most {}", LimitSpec::MAX_BUCKETS)]
    TooManyBuckets,
}

/// A fraction of capacity a lane may use, in parts per million.
///
/// Every algorithm admits a cost only if the lane's usage after it stays within
/// `ceiling.of(capacity)` (`ceiling.of(burst)` for token-bucket), so a batch lane at 60%
/// always leaves 40% for interactive traffic. A ceiling that rounds to 0 admits nothing
/// ([`Denial::Never`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ceiling(u32);

impl Ceiling {
    /// All of the capacity.
    pub const FULL: Ceiling = Ceiling(1_000_000);

    /// A share in `0.0..=1.0` (clamped).
    pub fn from_share(share: f64) -> Ceiling {
        Ceiling((share.clamp(0.0, 1.0) * 1_000_000.0).round() as u32)
    }

    /// `capacity` scaled to this ceiling, rounded down.
    pub fn of(self, capacity: u64) -> u64 {
        // The share is <= 1_000_000 ppm, so the quotient is <= capacity and fits.
        ((u128::from(capacity) * u128::from(self.0)) / 1_000_000) as u64
    }

    /// The share in parts per million (0..=1_000_000).
    pub fn ppm(self) -> u32 {
        self.0
    }
}

impl std::fmt::Display for Ceiling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:04}%", self.0 / 10_000, self.0 % 10_000)
    }
}

/// Why a reservation was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denial {
    /// Admissible after this many nanoseconds if nothing else is admitted meanwhile.
    /// Exact: never earlier than the first instant the cost fits.
    RetryAfter(Nanos),
    /// The cost exceeds the ceiling itself; waiting will never help.
    Never,
}

impl Denial {
    /// The wait in nanoseconds, or `None` for [`Denial::Never`].
    pub fn retry_after_ns(self) -> Option<Nanos> {
        match self {
            Denial::RetryAfter(ns) => Some(ns),
            Denial::Never => None,
        }
    }
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Denial::RetryAfter(ns) => write!(f, "retry after {ns} ns"),
            Denial::Never => f.write_str("cost exceeds the ceiling; never admissible"),
        }
    }
}

/// Proof of a charge, needed to settle it. Not `Clone`: it is settled exactly once.
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Cost charged by [`Limiter::reserve`].
    pub cost: u64,
    /// Algorithm-specific slot the cost was charged to: the absolute bucket index
    /// (sliding-window), the entry's sequence number (sliding-log), or the charge
    /// counter after this cost (token-bucket).
    pub slot: u64,
}

/// What a settlement did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Cost given back (estimate above the real cost).
    pub refunded: u64,
    /// Cost added (real cost above the estimate).
    pub debt: u64,
    /// Part of the correction that could not be applied because the reservation's
    /// slot had already left the window (it no longer constrains anything).
    pub expired: u64,
}

/// Figures for the `x-ratelimit-*` headers and the admin API.
///
/// For token-bucket the figures are relative to the burst: `capacity` is the burst,
/// `used` the burst consumed (rounded up) and `remaining` exactly the largest cost
/// admissible right now under [`Ceiling::FULL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The limit's capacity per window (token-bucket: the burst).
    pub capacity: u64,
    /// Cost currently counted against the window; may exceed `capacity` after debts.
    pub used: u64,
    /// `capacity - used`, saturating.
    pub remaining: u64,
    /// Nanoseconds until `used` is back to zero if nothing else is admitted.
    pub reset_after_ns: Nanos,
}

/// One limit instance: the algorithm's state. Static dispatch over the three kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Limiter {
    /// See [`sliding_window::SlidingWindow`].
    SlidingWindow(sliding_window::SlidingWindow),
    /// See [`token_bucket::TokenBucket`].
    TokenBucket(token_bucket::TokenBucket),
    /// See [`sliding_log::SlidingLog`].
    SlidingLog(sliding_log::SlidingLog),
}

macro_rules! dispatch {
    ($self:expr, $inner:ident => $body:expr) => {
        match $self {
            Limiter::SlidingWindow($inner) => $body,
            Limiter::TokenBucket($inner) => $body,
            Limiter::SlidingLog($inner) => $body,
        }
    };
}

impl Limiter {
    /// Builds a limiter at rest, or says why the spec is unusable.
    pub fn try_new(spec: LimitSpec) -> Result<Limiter, SpecError> {
        Ok(match spec.algorithm {
            Algorithm::SlidingWindow => {
                Limiter::SlidingWindow(sliding_window::SlidingWindow::try_new(spec)?)
            }
            Algorithm::TokenBucket => {
                Limiter::TokenBucket(token_bucket::TokenBucket::try_new(spec)?)
            }
            Algorithm::SlidingLog => Limiter::SlidingLog(sliding_log::SlidingLog::try_new(spec)?),
        })
    }

    /// Would `cost` be admitted under `ceiling` at `now`? Changes nothing.
    pub fn check(&self, now: Nanos, cost: u64, ceiling: Ceiling) -> Result<(), Denial> {
        dispatch!(self, l => l.check(now, cost, ceiling))
    }

    /// Charges `cost` at `now` if it fits under `ceiling`.
    pub fn reserve(
        &mut self,
        now: Nanos,
        cost: u64,
        ceiling: Ceiling,
    ) -> Result<Reservation, Denial> {
        dispatch!(self, l => l.reserve(now, cost, ceiling))
    }

    /// Corrects `reservation` to the real cost `actual`.
    pub fn settle(&mut self, now: Nanos, reservation: Reservation, actual: u64) -> Settlement {
        dispatch!(self, l => l.settle(now, reservation, actual))
    }

    /// Moves `reservation` to `now`, when the upstream answered: the provider
    /// counts a request on arrival, which happened by then (see
    /// [`sliding_window::SlidingWindow::redate`]). Returns the reservation to settle.
    pub fn redate(&mut self, now: Nanos, reservation: Reservation) -> Reservation {
        dispatch!(self, l => l.redate(now, reservation))
    }

    /// The live buckets and bucket width, for cluster counters; `None` for algorithms
    /// without buckets (cluster modes require `sliding-window`).
    pub fn export(&self, now: Nanos) -> Option<(Nanos, Vec<(u64, u64)>)> {
        match self {
            Limiter::SlidingWindow(l) => Some(l.export(now)),
            _ => None,
        }
    }

    /// Header and admin figures at `now`.
    pub fn snapshot(&self, now: Nanos) -> Snapshot {
        dispatch!(self, l => l.snapshot(now))
    }

    /// True when the state is indistinguishable from a fresh limiter at `now`, so the
    /// owner may drop it without losing anything.
    pub fn is_at_rest(&self, now: Nanos) -> bool {
        dispatch!(self, l => l.is_at_rest(now))
    }

    /// The limit's capacity per window.
    pub fn capacity(&self) -> u64 {
        dispatch!(self, l => l.spec().capacity)
    }

    /// The validated spec this limiter enforces.
    pub fn spec(&self) -> &LimitSpec {
        dispatch!(self, l => l.spec())
    }
}
