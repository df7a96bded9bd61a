//! Maps tokio's monotonic clock onto the limiter core's [`Nanos`], so the core stays
//! pure and tests can pause time (`tokio::time::pause`).
//!
//! The epoch is the Unix epoch, read once at start: `now = wall clock at start +
//! monotonic time since`. Within a node, time never goes back (monotonic); across
//! nodes, bucket boundaries line up up to the clocks' skew at start (NTP), which the
//! cluster's CRDT counters rely on (a skew d costs at most rate x d; see
//! docs/design/counters.md). Leases and timeouts use plain monotonic time.

use crate::limiter::Nanos;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// A fixed origin; every actor of a registry shares it so slots line up.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    origin_unix_ns: Nanos,
}

impl Clock {
    /// A clock whose origin is now, labelled with the current wall-clock time.
    pub fn start() -> Clock {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Clock {
            origin: Instant::now(),
            origin_unix_ns: u64::try_from(unix.as_nanos()).unwrap_or(u64::MAX / 2),
        }
    }

    /// Nanoseconds since the Unix epoch, advancing monotonically.
    pub fn now_ns(&self) -> Nanos {
        self.ns_at(Instant::now())
    }

    /// Nanoseconds since the Unix epoch at `instant` (the origin's for earlier ones).
    pub fn ns_at(&self, instant: Instant) -> Nanos {
        let since = u64::try_from(instant.saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(u64::MAX / 2);
        self.origin_unix_ns.saturating_add(since)
    }

    /// The instant at `ns` (the origin for earlier times).
    pub fn instant_at(&self, ns: Nanos) -> Instant {
        self.origin + Duration::from_nanos(ns.saturating_sub(self.origin_unix_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn wall_clock_labelled_and_monotonic() {
        let clock = Clock::start();
        let t0 = clock.now_ns();
        // Within a minute of the real wall clock (it was read at start).
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(t0.abs_diff(unix) < 60_000_000_000);
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(clock.now_ns() - t0, 1_500_000_000);
        assert_eq!(clock.ns_at(clock.instant_at(t0 + 7)), t0 + 7);
    }
}
