//! Cluster trust: only holders of the cluster secret take part.
//!
//! Every gossip datagram and every internal RPC carries an HMAC-SHA256 tag
//! under a key derived from the secret, the cluster id and the channel
//! ([`keys`]), a sender instance, a counter and a timestamp. A receiver drops
//! what fails the tag, what is older or newer than [`MAX_CLOCK_SKEW`], and
//! what it has seen before ([`replay`]), before anything reads it: a process
//! without the secret cannot join, publish, own, state or replay.
//!
//! - [`keys`]: key derivation, the sending key and the accepted ones (rotation).
//! - [`replay`]: the per-sender sliding window of counters seen.
//! - [`frame`]: the sealed gossip datagram and its opener.
//! - [`transport`]: chitchat's UDP transport, sealed.
//! - [`rpc`]: the tag of an internal RPC request and of its answer.
//!
//! Design and proof sketch: docs/design/cluster-trust.md.

pub mod frame;
pub mod keys;
pub mod replay;
pub mod rpc;
pub mod transport;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use self::keys::{ClusterKeys, KeyError};

/// How far a sealed message's timestamp may be from the receiver's clock: the
/// nodes' wall clocks must agree within this (NTP keeps them within ms). A
/// message captured longer ago than this is refused whatever the receiver
/// remembers, so a receiver restarted since is not fooled either.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Why a sealed message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not a sealed message of this format (too short, wrong magic or version).
    #[error("malformed")]
    Malformed,
    /// Sealed under a key this node does not accept (another secret).
    #[error("sealed under another secret")]
    UnknownKey,
    /// The tag does not match: forged or altered.
    #[error("bad tag")]
    BadTag,
    /// Its timestamp is further than [`MAX_CLOCK_SKEW`] from this node's clock.
    #[error("stale")]
    Stale,
    /// Seen before (or older than the sender's window).
    #[error("replayed")]
    Replayed,
    /// This node tracks as many live senders as it can: refused until one ages.
    #[error("too many senders")]
    TooManySenders,
}

impl Refusal {
    /// Its metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::UnknownKey => "wrong_secret",
            Refusal::BadTag => "bad_tag",
            Refusal::Stale => "stale",
            Refusal::Replayed => "replayed",
            Refusal::TooManySenders => "too_many_senders",
        }
    }
}

/// Where refused messages are reported: a sink (the node's metrics) and a
/// log line at most every 10 s (a flood of forgeries must not become a flood
/// of log lines).
pub struct Refusals {
    sink: Box<dyn Fn(Refusal) + Send + Sync>,
    last_logged_ms: AtomicU64,
}

impl std::fmt::Debug for Refusals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Refusals")
    }
}

impl Refusals {
    /// Refusals reported to `sink`.
    pub fn new(sink: impl Fn(Refusal) + Send + Sync + 'static) -> Refusals {
        Refusals {
            sink: Box::new(sink),
            last_logged_ms: AtomicU64::new(0),
        }
    }

    /// Reports one refused message from `from` on `channel`.
    pub fn record(&self, refusal: Refusal, channel: &str, from: &dyn std::fmt::Display) {
        (self.sink)(refusal);
        let now = unix_ms();
        let last = self.last_logged_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 10_000
            && (self.last_logged_ms)
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(channel, %from, reason = refusal.label(), "unauthenticated cluster message dropped (more within 10 s are counted, not logged)");
        }
    }
}

/// Milliseconds since the Unix epoch by the wall clock (0 before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether `stamp_ms` is within [`MAX_CLOCK_SKEW`] of `now_ms`.
pub fn fresh(stamp_ms: u64, now_ms: u64) -> bool {
    let skew = u64::try_from(MAX_CLOCK_SKEW.as_millis()).unwrap_or(u64::MAX);
    stamp_ms.abs_diff(now_ms) <= skew
}
