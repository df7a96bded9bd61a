//! Maps tokio's monotonic clock onto the limiter core's [`Nanos`], so the core stays
//! pure and tests can pause time (`tokio::time::pause`).
//!
//! The epoch is the Unix epoch, read once at start: `now = wall clock at start +
//! monotonic time since`. Within a node, time never goes back (monotonic); across
//! nodes, bucket boundaries line up up to the clocks' skew (NTP), which the
//! cluster's CRDT counters rely on (a skew d costs at most rate x d; see
//! docs/design/counters.md). Leases and timeouts use plain monotonic time.
//!
//! A running node uses [`Clock::following_wall`]: the same, plus the offset that
//! [`wall`] keeps so the clock follows later steps of the wall clock
//! (NTP steps, VM time sync, suspend) instead of drifting away from Redis `TIME`
//! and the other nodes for the life of the process. [`Clock::start`] stays purely
//! monotonic, for tests that pause tokio's time.

pub mod wall;

use crate::limiter::Nanos;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;
use wall::WallTrack;

/// A fixed origin; every actor of a registry shares it so slots line up.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    origin_unix_ns: Nanos,
    /// The wall-clock correction, shared by every wall-following clock of the
    /// process (they share one origin too, so one offset fits all).
    wall: Option<&'static WallTrack>,
}

/// The origin and correction of the process's wall-following clocks.
static WALL_FOLLOWING: OnceLock<(Instant, Nanos, WallTrack)> = OnceLock::new();

impl Clock {
    /// A clock whose origin is now, labelled with the current wall-clock time and
    /// advancing on the monotonic clock alone.
    pub fn start() -> Clock {
        Clock {
            origin: Instant::now(),
            origin_unix_ns: unix_now_ns(),
            wall: None,
        }
    }

    /// The process's node clock: monotonic, following the wall clock's steps
    /// forward at once and its steps back by slowing down (never going back).
    /// Not for paused tokio time (the wall clock keeps running when it is paused).
    pub fn following_wall() -> Clock {
        let (origin, origin_unix_ns, track) =
            WALL_FOLLOWING.get_or_init(|| (Instant::now(), unix_now_ns(), WallTrack::new()));
        Clock {
            origin: *origin,
            origin_unix_ns: *origin_unix_ns,
            wall: Some(track),
        }
    }

    /// Nanoseconds since the Unix epoch, advancing monotonically.
    pub fn now_ns(&self) -> Nanos {
        let elapsed = self.elapsed_ns(Instant::now());
        let base = self.origin_unix_ns.saturating_add(elapsed);
        match self.wall {
            None => base,
            Some(track) => {
                let offset = track.offset(base, elapsed, unix_now_ns);
                track.never_back(wall::apply(base, offset))
            }
        }
    }

    /// Nanoseconds since the Unix epoch at `instant` (the origin's for earlier
    /// ones), with the correction in force now.
    pub fn ns_at(&self, instant: Instant) -> Nanos {
        let base = self.origin_unix_ns.saturating_add(self.elapsed_ns(instant));
        wall::apply(base, self.offset_now())
    }

    /// The instant at `ns` (the origin for earlier times), with the correction in
    /// force now.
    pub fn instant_at(&self, ns: Nanos) -> Instant {
        let base = wall::apply(ns, self.offset_now().saturating_neg());
        self.origin + Duration::from_nanos(base.saturating_sub(self.origin_unix_ns))
    }

    fn elapsed_ns(&self, instant: Instant) -> u64 {
        u64::try_from(instant.saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(u64::MAX / 2)
    }

    fn offset_now(&self) -> i64 {
        self.wall.map_or(0, WallTrack::current)
    }
}

fn unix_now_ns() -> Nanos {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    u64::try_from(unix.as_nanos()).unwrap_or(u64::MAX / 2)
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

    #[tokio::test]
    async fn a_wall_following_clock_reads_the_wall_clock_and_converts_both_ways() {
        let a = Clock::following_wall();
        let b = Clock::following_wall();
        let wall = unix_now_ns();
        let t = a.now_ns();
        assert!(t.abs_diff(wall) < 5_000_000, "{t} vs wall {wall}");
        assert!(b.now_ns() >= t, "clocks of one process share one timeline");
        let soon = a.instant_at(t + 3_000_000);
        assert!(a.ns_at(soon).abs_diff(t + 3_000_000) < 1_000);
    }
}
