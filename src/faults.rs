//! Deliberate faults for the jepsen harness (cargo feature `fault-injection`,
//! test builds only): a harness must prove its checker catches a broken limiter,
//! and the only honest way is to run one. Without the feature nothing here can be
//! turned on and every query is a constant `false`.

#[cfg(feature = "fault-injection")]
static SKIP_CLUSTER_SYNC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns on `skip-cluster-sync` for this process: actors ignore every cluster
/// bound (allowances and leased credit) and enforce only their local limits, as a
/// gateway whose cluster sync is broken would.
#[cfg(feature = "fault-injection")]
pub fn skip_cluster_sync_on() {
    SKIP_CLUSTER_SYNC.store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::warn!("fault injected: skip-cluster-sync (this node ignores its cluster bounds)");
}

/// Whether `skip-cluster-sync` is on.
pub fn skip_cluster_sync() -> bool {
    #[cfg(feature = "fault-injection")]
    {
        SKIP_CLUSTER_SYNC.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        false
    }
}
