//! Keeps the node clock on the wall clock without ever letting it go back.
//!
//! The node clock is Unix time read once at start plus monotonic progress. That
//! stays wall-aligned only while the wall clock and the monotonic clock advance
//! together, and they do not: an NTP step, a VM's time sync, a suspend or a live
//! migration moves `CLOCK_REALTIME` and leaves `CLOCK_MONOTONIC` alone. Without
//! correction the difference stays for the life of the process and adds up with
//! every step, so bucket boundaries drift away from Redis `TIME` (which `redis`
//! and `redis-lease` use) and from the other nodes' boundaries. In `redis-lease`,
//! with the machine's wall clock moving about 5 ms/s ahead of its monotonic
//! clock, uncorrected holders fall 100 ms behind Redis after 20 s, so Redis
//! releases a bucket before the provider does (41 requests admitted in a window
//! of 40; docs/design/counters.md, "Clock skew").
//!
//! [`WallTrack`] holds an offset added to the monotonic reading. Every
//! [`CHECK_EVERY_NS`] of monotonic time, whichever reader comes first compares
//! it with the wall clock and corrects it by [`correction`]: a wall clock ahead is
//! followed at once (that time really passed, and the provider's clock saw it),
//! one behind is approached by slewing at most [`SLEW_BACK_PER_MILLE`] of the
//! elapsed time, so the node clock slows down but never stops or goes back. A
//! process-wide maximum keeps every reading at or after the last one handed out.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::limiter::Nanos;

/// How often (monotonic nanoseconds) the offset is compared with the wall clock.
/// One `clock_gettime` (a vDSO read, tens of ns) per 10 ms is free on the hot
/// path, and a step is followed within 10 ms: processes that each follow the
/// wall clock (nodes, the mock, Redis) disagree about a step for at most that.
pub const CHECK_EVERY_NS: u64 = 10_000_000;

/// Differences smaller than this are reading noise, not steps: left alone, so
/// the clock does not jitter back and forth around the wall clock.
pub const DEADBAND_NS: i64 = 1_000_000;

/// A wall clock behind the node clock is approached by slowing the node clock
/// by at most this much per thousand (10%): buckets last up to 11% longer while
/// it catches up, which only ever admits less (ntpd's slew is far slower, but it
/// corrects ppm; we correct steps and want them gone in seconds, not hours).
pub const SLEW_BACK_PER_MILLE: u64 = 100;

/// The change to the offset, given how far the wall clock leads the node clock
/// (`lead_ns`, negative when it is behind) and the monotonic time since the last
/// check. Pure, so its policy is tested without a clock.
pub fn correction(lead_ns: i64, elapsed_ns: u64) -> i64 {
    if lead_ns.abs() < DEADBAND_NS {
        0
    } else if lead_ns > 0 {
        lead_ns
    } else {
        let most = i64::try_from(elapsed_ns.saturating_mul(SLEW_BACK_PER_MILLE) / 1000)
            .unwrap_or(i64::MAX);
        lead_ns.max(-most)
    }
}

/// The shared correction state of every wall-following clock in a process.
#[derive(Debug)]
pub struct WallTrack {
    /// Added to `origin_unix_ns + monotonic elapsed`.
    offset_ns: AtomicI64,
    /// The monotonic reading (ns since origin) at which the next check is due:
    /// the last check's plus [`CHECK_EVERY_NS`].
    next_check_ns: AtomicU64,
    /// The latest time handed out, so no reader ever sees time go back.
    latest_ns: AtomicU64,
}

impl WallTrack {
    /// No correction yet; the first reading checks the wall clock.
    pub const fn new() -> WallTrack {
        WallTrack {
            offset_ns: AtomicI64::new(0),
            next_check_ns: AtomicU64::new(0),
            latest_ns: AtomicU64::new(0),
        }
    }

    /// The offset now, checking it against `wall_ns()` first when a check is due.
    /// `base_ns` is the uncorrected reading (`origin_unix_ns + elapsed`) and
    /// `elapsed_ns` the monotonic time since the origin.
    pub fn offset(&self, base_ns: Nanos, elapsed_ns: u64, wall_ns: impl FnOnce() -> Nanos) -> i64 {
        let due = self.next_check_ns.load(Ordering::Relaxed);
        if elapsed_ns >= due
            && self
                .next_check_ns
                .compare_exchange(
                    due,
                    elapsed_ns.saturating_add(CHECK_EVERY_NS),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            // This reader won the check; the others go on with the old offset.
            let offset = self.offset_ns.load(Ordering::Relaxed);
            let lead = signed_gap(wall_ns(), apply(base_ns, offset));
            let last_check = due.saturating_sub(CHECK_EVERY_NS);
            let since = elapsed_ns.saturating_sub(last_check);
            let change = correction(lead, since);
            if change != 0 {
                self.offset_ns.fetch_add(change, Ordering::Relaxed);
            }
        }
        self.offset_ns.load(Ordering::Relaxed)
    }

    /// The offset in force, without checking it.
    pub fn current(&self) -> i64 {
        self.offset_ns.load(Ordering::Relaxed)
    }

    /// `ns`, or the latest reading handed out if that is later.
    pub fn never_back(&self, ns: Nanos) -> Nanos {
        self.latest_ns.fetch_max(ns, Ordering::Relaxed).max(ns)
    }
}

impl Default for WallTrack {
    fn default() -> WallTrack {
        WallTrack::new()
    }
}

/// `base + offset`, saturating at the ends of the range.
pub fn apply(base_ns: Nanos, offset_ns: i64) -> Nanos {
    base_ns.saturating_add_signed(offset_ns)
}

/// `a - b` as a signed difference, saturating.
fn signed_gap(a: Nanos, b: Nanos) -> i64 {
    if a >= b {
        i64::try_from(a - b).unwrap_or(i64::MAX)
    } else {
        i64::try_from(b - a).map_or(i64::MIN, |d| -d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    #[test]
    fn a_wall_clock_ahead_is_followed_at_once_and_one_behind_is_slewed() {
        assert_eq!(correction(250 * MS, 100 * MS as u64), 250 * MS);
        // Behind: 10% of the elapsed time per check, never more than the gap.
        assert_eq!(correction(-250 * MS, 100 * MS as u64), -10 * MS);
        assert_eq!(correction(-3 * MS, 100 * MS as u64), -3 * MS);
        // Reading noise is left alone.
        assert_eq!(correction(MS / 2, 100 * MS as u64), 0);
        assert_eq!(correction(-MS / 2, 100 * MS as u64), 0);
    }

    #[test]
    fn the_offset_follows_a_stepped_wall_clock_and_readings_never_go_back() {
        let track = WallTrack::new();
        let origin: Nanos = 1_000_000_000_000;
        let mut last = 0;
        let mut read = |elapsed: u64, wall: Nanos| {
            let base = origin + elapsed;
            let now = track.never_back(apply(base, track.offset(base, elapsed, || wall)));
            assert!(now >= last, "time went back at {elapsed} ns");
            last = now;
            now
        };
        // The wall clock runs 5 ms/s ahead of the monotonic clock (the
        // `redis-lease` drift in the module's notes), for 20 s: followed within
        // the deadband.
        let drift = |elapsed: u64| elapsed / 200;
        let twenty_s = 20_000 * MS as u64;
        for elapsed in (0..=twenty_s).step_by(CHECK_EVERY_NS as usize) {
            let wall = origin + elapsed + drift(elapsed);
            let now = read(elapsed, wall);
            assert!(
                wall.abs_diff(now) < 2 * MS as u64,
                "{elapsed}: {now} vs wall {wall}"
            );
        }
        // Then it is stepped back 1 s: the node clock slows to 90% and catches up
        // within about 10 s of monotonic time, never going back.
        let back = 1_000 * MS as u64;
        let eleven_s = 11_000 * MS as u64;
        let mut gap = 0;
        for elapsed in
            (twenty_s + CHECK_EVERY_NS..=twenty_s + eleven_s).step_by(CHECK_EVERY_NS as usize)
        {
            let wall = origin + elapsed + drift(elapsed) - back;
            gap = read(elapsed, wall).abs_diff(wall);
        }
        assert!(gap < 2 * MS as u64, "caught up to within {gap} ns");
    }

    #[test]
    fn only_one_reader_per_interval_reads_the_wall_clock() {
        let track = WallTrack::new();
        let mut reads = 0;
        for elapsed in (0..CHECK_EVERY_NS * 3).step_by(1_000_000) {
            track.offset(elapsed, elapsed, || {
                reads += 1;
                elapsed
            });
        }
        assert_eq!(reads, 3);
    }
}
