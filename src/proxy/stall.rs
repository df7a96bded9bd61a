//! Noticing that this process stalled (SIGSTOP, a frozen VM, a starved host).
//!
//! A request admitted before a stall and sent after it reaches the provider in a
//! window the cluster may no longer charge it to: peers expire its charge on
//! schedule while the stalled node cannot publish anything, and a lease owner
//! takes back the credit of a holder silent past its ttl. The jepsen harness
//! measured 41 of L = 40 from such late sends after a 5 s SIGSTOP. Such
//! admissions are cancelled instead of sent (`dispatch`).
//!
//! A request that merely waited, for an upstream's slot or window, is not late
//! in that sense: its node kept publishing its charge and stating its credit
//! all along. Telling the two apart by how long ago the request was admitted
//! would cancel every request that waited more than one bucket for an upstream
//! (12-19% of requests ending in a 503 "gateway was stalled" in every synced
//! mode of the seed benchmark). So a ticker measures the stall itself: a gap
//! between its ticks longer than one bucket (and than [`MIN_STALL`]) is a
//! stall, and an admission made before the end of the last one is late.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How often the watch ticks: short against a bucket (>= 1 ms, 1 s by default),
/// cheap (one timer per node).
const TICK: Duration = Duration::from_millis(20);

/// The shortest gap counted as a stall, whatever the bucket: on a loaded host
/// (CI's debug builds, three nodes in one process at 1,000 requests/s) a timer
/// can be late by a 100 ms bucket, and a request cancelled for it would fail a
/// test. The stalls this guards against (SIGSTOP, a frozen VM) last seconds.
const MIN_STALL: Duration = Duration::from_millis(500);

/// When this process last came out of a stall.
#[derive(Debug)]
pub struct StallWatch {
    started: Instant,
    /// Nanoseconds after `started` at which the last stall ended (0: none yet).
    last_stall_end_ns: AtomicU64,
    /// A gap between ticks longer than this is a stall.
    threshold: Duration,
}

impl StallWatch {
    /// A watch counting gaps longer than `threshold` (a bucket) as stalls.
    pub fn new(threshold: Duration) -> StallWatch {
        StallWatch {
            started: Instant::now(),
            last_stall_end_ns: AtomicU64::new(0),
            threshold: threshold.max(MIN_STALL),
        }
    }

    /// Records that the process was stalled from `from` to `to`, if that gap is
    /// longer than the threshold.
    fn observe_gap(&self, from: Instant, to: Instant) {
        if to.saturating_duration_since(from) > self.threshold {
            let end = to.saturating_duration_since(self.started).as_nanos();
            let end = u64::try_from(end).unwrap_or(u64::MAX).max(1);
            self.last_stall_end_ns.fetch_max(end, Ordering::Relaxed);
            tracing::warn!(
                stalled_ms = to.saturating_duration_since(from).as_millis() as u64,
                "this process stalled: requests admitted before it are cancelled, not sent late"
            );
        }
    }

    /// Whether the process stalled after `admitted_at` (admitted before the end
    /// of a stall).
    pub fn stalled_since(&self, admitted_at: Instant) -> bool {
        let end = self.last_stall_end_ns.load(Ordering::Relaxed);
        end > 0 && self.started + Duration::from_nanos(end) > admitted_at
    }

    /// Ticks until the watch is the last holder of itself (the node is gone).
    pub async fn run(self: Arc<Self>) {
        let mut last = Instant::now();
        while Arc::strong_count(&self) > 1 {
            tokio::time::sleep(TICK).await;
            let now = Instant::now();
            self.observe_gap(last, now);
            last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_an_admission_made_before_a_stall_is_late() {
        let watch = StallWatch::new(Duration::from_secs(1));
        let before = Instant::now();
        tokio::time::advance(Duration::from_millis(500)).await;
        // A long wait with the process running: ticks every 20 ms.
        for _ in 0..100 {
            let from = Instant::now();
            tokio::time::advance(TICK).await;
            watch.observe_gap(from, Instant::now());
        }
        assert!(!watch.stalled_since(before), "a wait is not a stall");
        // Frozen for 5 s: the next tick comes 5 s after the last.
        let from = Instant::now();
        tokio::time::advance(Duration::from_secs(5)).await;
        watch.observe_gap(from, Instant::now());
        assert!(watch.stalled_since(before), "admitted before the stall");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!watch.stalled_since(Instant::now()), "admitted after it");
    }
}
