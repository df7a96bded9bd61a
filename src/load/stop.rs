//! Stopping a run early (Ctrl-C): no new sends, waits cut short, in-flight requests
//! allowed to finish so the summary counts everything that was sent.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

/// A one-way stop signal shared by the pacing loops.
#[derive(Debug, Default)]
pub(super) struct Stop {
    stopped: AtomicBool,
    notify: Notify,
}

impl Stop {
    /// Asks every loop to stop sending and wakes any that are waiting.
    pub(super) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Whether [`Stop::stop`] was called.
    pub(super) fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Sleeps until `until` or until stopped, whichever is first.
    pub(super) async fn sleep_until(&self, until: Instant) {
        // Created before the check, so a stop() between the two still wakes it.
        let notified = self.notify.notified();
        if self.is_stopped() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(until) => {}
            () = notified => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stop_cuts_a_sleep_short_and_stays_stopped() {
        let stop = Arc::new(Stop::default());
        let start = Instant::now();
        let sleeper = tokio::spawn({
            let stop = stop.clone();
            async move { stop.sleep_until(start + Duration::from_secs(60)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        stop.stop();
        sleeper.await.unwrap();
        assert!(start.elapsed() < Duration::from_secs(2));
        stop.sleep_until(start + Duration::from_secs(60)).await;
        assert!(stop.is_stopped() && start.elapsed() < Duration::from_secs(2));
    }
}
