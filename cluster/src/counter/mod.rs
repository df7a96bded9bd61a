//! CRDT usage counters: what every node spent, per limit key, cluster-wide.
//!
//! Each node is the **single writer** of its own consumption per limit key, kept in a
//! bucketed sliding window ([`Window`]) and published into chitchat's per-node
//! key-value state as a **fixed ring** of keys (slot = bucket mod ring size), so a
//! slot is overwritten when its bucket is reused and nothing is ever deleted per
//! window (no stream of tombstones). chitchat keeps the highest version of each key,
//! so a node's ring is a set of single-writer, max-version registers: a state-based
//! PN-counter by construction. **Global usage = sum over live members of their
//! in-window buckets.**
//!
//! - [`codec`]: the text encoding of keys and values, and `decode` for untrusted gossip.
//! - [`LocalCounters`]: the writer: records reservations, refunds and debts, and
//!   publishes only what changed, coalesced.
//! - [`ClusterUsage`]: the reader: merges every node's values (max version) and sums.
//! - [`archive`]: departed members' usage, republished by the members that hold it.
//!
//! Everything here is pure: time comes in as `now_ms` (wall-clock unix milliseconds,
//! so nodes agree on bucket boundaries), nothing reads a clock or does IO. The design,
//! the CRDT argument, the datagram budget and the clock-skew bound are in
//! `docs/design/counters.md`.

pub mod archive;
pub mod codec;
mod local;
mod replica;

#[cfg(test)]
mod proptests;

pub use codec::{DecodeError, Decoded, KeyError};
pub use local::{LocalCounters, RecordError, Recorded};
pub use replica::{Applied, ClusterUsage};

/// Longest limit key, in bytes (ASCII graphic characters only), so a key-value pair
/// stays small inside a gossip datagram.
pub const MAX_LIMIT_KEY_BYTES: usize = 128;

/// Largest count a bucket, a demand or an in-flight value may carry (2^50, about
/// 10^15 tokens): anything above is garbage from a broken or hostile peer.
pub const MAX_COUNT: u64 = 1 << 50;

/// Most limit keys a [`LocalCounters`] tracks and a [`ClusterUsage`] keeps per node.
pub const DEFAULT_MAX_KEYS: usize = 10_000;

/// Most buckets per window (the local limiter's bound too), so the ring stays small.
pub const MAX_BUCKETS: u32 = 4096;

/// How far behind a reader's clock a writer's may run before the reader dates the
/// writer's buckets later (transit time plus NTP-level skew). Beyond it, a writer
/// running behind would have its cost leave the reader's window early (the jepsen
/// harness's `skew` nemesis, a clock 2 s behind, measured 41-43 of L = 40); within
/// it, the error is at most the writer's spending in this many ms at a bucket's edge.
pub const SKEW_TOLERANCE_MS: u64 = 100;

/// [`Window::buckets_behind`] for buckets of `bucket_ms` (a lease statement's
/// shift uses it with the line's bucket width).
pub fn buckets_behind(lag_ms: u64, bucket_ms: u64) -> u64 {
    lag_ms
        .saturating_sub(SKEW_TOLERANCE_MS)
        .div_ceil(bucket_ms.max(1))
}

/// Why a window cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// `buckets` must be in `1..=MAX_BUCKETS`.
    #[error("buckets must be in 1..={MAX_BUCKETS}, got {0}")]
    Buckets(u32),
    /// The bucket width `window_ms / buckets` must be at least 1 ms.
    #[error("window_ms ({window_ms}) must be at least buckets ({buckets})")]
    TooShort {
        /// The window asked for, in milliseconds.
        window_ms: u64,
        /// The bucket count asked for.
        buckets: u32,
    },
}

/// The bucketed sliding window every node of the cluster shares for gossiped keys.
///
/// Bucket `b` covers `[b*w, (b+1)*w)` in unix milliseconds. It **counts** at `now_ms`
/// while its end has not left the window, `(b+1)*w + W > now_ms` (conservative, the
/// local limiter's rule), and while it is not more than one window in the future,
/// `b*w <= now_ms + W`: a peer whose clock runs ahead is still counted (safe side),
/// a bucket further ahead is garbage from a broken clock and counts 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    window_ms: u64,
    bucket_ms: u64,
    ring_slots: u32,
}

impl Window {
    /// Builds a window of `window_ms` cut into `buckets` buckets of
    /// `window_ms / buckets` ms (rounded down), or says why it cannot.
    pub fn try_new(window_ms: u64, buckets: u32) -> Result<Self, WindowError> {
        if buckets == 0 || buckets > MAX_BUCKETS {
            return Err(WindowError::Buckets(buckets));
        }
        let bucket_ms = window_ms / u64::from(buckets);
        if bucket_ms == 0 {
            return Err(WindowError::TooShort { window_ms, buckets });
        }
        // At most ceil(W/w) + 1 past buckets count at once; w >= W / buckets - 1 bounds
        // it by 2 * MAX_BUCKETS + 1, which fits a u32.
        let ring = window_ms.div_ceil(bucket_ms) + 1;
        let ring_slots = u32::try_from(ring).map_err(|_| WindowError::Buckets(buckets))?;
        Ok(Self {
            window_ms,
            bucket_ms,
            ring_slots,
        })
    }

    /// The window length W, in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The bucket width w, in milliseconds (>= 1).
    pub fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    /// Ring size R = ceil(W/w) + 1 (`buckets + 1` when `buckets` divides W): every
    /// bucket that can count at once (up to `now`) has its own slot.
    pub fn ring_slots(&self) -> u32 {
        self.ring_slots
    }

    /// Index of the bucket holding `now_ms`.
    pub fn bucket_index(&self, now_ms: u64) -> u64 {
        now_ms / self.bucket_ms
    }

    /// The ring slot bucket `bucket` is published in.
    pub fn slot(&self, bucket: u64) -> u32 {
        // The remainder is < ring_slots, a u32.
        (bucket % u64::from(self.ring_slots)) as u32
    }

    /// How many buckets later to date the cost of a writer whose clock runs `lag_ms`
    /// behind the reader's: the lag beyond [`SKEW_TOLERANCE_MS`], rounded up, so the
    /// cost counts at least as long as it does at the provider.
    pub fn buckets_behind(&self, lag_ms: u64) -> u64 {
        buckets_behind(lag_ms, self.bucket_ms)
    }

    /// Whether bucket `bucket` counts at `now_ms` (see the type docs). u128 arithmetic:
    /// bucket indices come from untrusted gossip.
    pub fn counts(&self, bucket: u64, now_ms: u64) -> bool {
        let (b, w, big_w, t) = (
            u128::from(bucket),
            u128::from(self.bucket_ms),
            u128::from(self.window_ms),
            u128::from(now_ms),
        );
        (b + 1) * w + big_w > t && b * w <= t + big_w
    }
}

/// The name ending of limit keys counted over the long window of [`Windows`]
/// (daily quotas: `tenant:acme:requests_per_day`).
pub const LONG_WINDOW_SUFFIX: &str = "_per_day";

/// The windows the cluster counts keys over: the base window (`rpm`, `tpm`, ...)
/// and a long one for keys whose name ends in [`LONG_WINDOW_SUFFIX`] (`rpd`,
/// `tpd`). The window is part of what a key means, so it is read from the key's
/// name: a writer and a reader can never disagree on which window a key is
/// counted over, and every node must share both windows as it shares the base
/// one today.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    base: Window,
    long: Window,
}

impl Windows {
    /// Keys counted over `base`, or over `long` when named so.
    pub fn new(base: Window, long: Window) -> Self {
        Self { base, long }
    }

    /// The window `limit_key` is counted over.
    pub fn of(&self, limit_key: &str) -> &Window {
        if limit_key.ends_with(LONG_WINDOW_SUFFIX) {
            &self.long
        } else {
            &self.base
        }
    }

    /// The base window.
    pub fn base(&self) -> &Window {
        &self.base
    }

    /// The long window.
    pub fn long(&self) -> &Window {
        &self.long
    }
}

impl From<Window> for Windows {
    /// Every key over one window.
    fn from(window: Window) -> Self {
        Self::new(window, window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_ring_is_buckets_plus_one_when_they_divide() {
        let w = Window::try_new(60_000, 60).unwrap();
        assert_eq!((w.bucket_ms(), w.ring_slots()), (1_000, 61));
        let odd = Window::try_new(1_000, 3).unwrap();
        assert_eq!((odd.bucket_ms(), odd.ring_slots()), (333, 5));
        assert_eq!(Window::try_new(10, 0), Err(WindowError::Buckets(0)));
        assert!(matches!(
            Window::try_new(10, 11),
            Err(WindowError::TooShort { .. })
        ));
        let max = Window::try_new(2 * 4096 - 1, MAX_BUCKETS).unwrap();
        assert_eq!(max.ring_slots(), 2 * 4096);
    }

    #[test]
    fn bucket_counts_exactly_until_its_end_leaves_the_window() {
        let w = Window::try_new(60_000, 60).unwrap();
        // Bucket 100 covers [100_000, 101_000); its end leaves at 101_000 + 60_000.
        assert!(w.counts(100, 100_000));
        assert!(w.counts(100, 160_999));
        assert!(!w.counts(100, 161_000));
        // Up to one window ahead (a peer's fast clock) counts; further is garbage.
        assert!(w.counts(100, 40_000));
        assert!(!w.counts(100, 39_999));
        assert!(!w.counts(u64::MAX, 0));
        assert!(w.counts(u64::MAX / 1_000, u64::MAX));
    }

    #[test]
    fn a_key_named_per_day_is_counted_over_the_long_window() {
        let base = Window::try_new(60_000, 60).unwrap();
        let day = Window::try_new(86_400_000, 24).unwrap();
        let windows = Windows::new(base, day);
        assert_eq!(windows.of("tenant:a:requests_per_day"), &day);
        assert_eq!(windows.of("tenant:a:requests"), &base);
        assert_eq!(Windows::from(base).of("x_per_day"), &base);
    }

    #[test]
    fn all_past_buckets_that_count_fit_the_ring() {
        for (window_ms, buckets) in [(60_000, 60), (1_000, 3), (7, 7), (10, 4)] {
            let w = Window::try_new(window_ms, buckets).unwrap();
            let now_ms = 1_000_003;
            let newest = w.bucket_index(now_ms);
            let counting = (0..=newest).rev().take_while(|&b| w.counts(b, now_ms));
            assert!(counting.count() <= w.ring_slots() as usize);
        }
    }
}
