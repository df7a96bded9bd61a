//! Maps tokio's monotonic clock onto the limiter core's [`Nanos`], so the core stays
//! pure and tests can pause time (`tokio::time::pause`).

use crate::limiter::Nanos;
use std::time::Duration;
use tokio::time::Instant;

/// A fixed origin; every actor of a registry shares it so slots line up.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock whose epoch is now.
    pub fn start() -> Clock {
        Clock {
            origin: Instant::now(),
        }
    }

    /// Nanoseconds since the origin.
    pub fn now_ns(&self) -> Nanos {
        self.ns_at(Instant::now())
    }

    /// Nanoseconds since the origin at `instant` (0 before the origin).
    pub fn ns_at(&self, instant: Instant) -> Nanos {
        u64::try_from(instant.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The instant `ns` nanoseconds after the origin.
    pub fn instant_at(&self, ns: Nanos) -> Instant {
        self.origin + Duration::from_nanos(ns)
    }
}
