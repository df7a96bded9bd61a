//! Closed loop: N workers, each sending its next request as soon as the last one ends.
//!
//! A worker told to wait (429/503 with retry-after) sleeps that long before its next
//! send, unless the run's deadline comes first. Workers share a [`Budget`] so
//! `--requests N` sends exactly N in total.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;

use super::Ctx;
use super::send::send;
use super::stop::Stop;

/// When the run stops handing out requests: a deadline, a count, or both.
#[derive(Debug)]
pub(super) struct Budget {
    deadline: Option<Instant>,
    remaining: Option<AtomicU64>,
}

impl Budget {
    /// A budget ending at `deadline` and/or after `requests` takes.
    pub(super) fn new(deadline: Option<Instant>, requests: Option<u64>) -> Budget {
        Budget {
            deadline,
            remaining: requests.map(AtomicU64::new),
        }
    }

    /// The deadline, if any.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Claims one request; false once stopped, the deadline passed or the count ran out.
    pub(super) fn take(&self, stop: &Stop) -> bool {
        if stop.is_stopped() || self.deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        match &self.remaining {
            None => true,
            Some(left) => left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok(),
        }
    }
}

/// Runs `workers` closed-loop workers until the budget is spent and every request ended.
pub(super) async fn run(ctx: Arc<Ctx>, workers: usize, budget: Budget) {
    let budget = Arc::new(budget);
    let mut tasks = Vec::with_capacity(workers);
    for id in 0..workers {
        tasks.push(tokio::spawn(worker(ctx.clone(), budget.clone(), id)));
    }
    for task in tasks {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "load worker failed");
        }
    }
}

async fn worker(ctx: Arc<Ctx>, budget: Arc<Budget>, id: usize) {
    let headers = ctx.target.worker_headers(id);
    let mut rng =
        SmallRng::seed_from_u64(ctx.seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    while budget.take(&ctx.stop) {
        let variant = rng.random_range(0..ctx.target.variants());
        let sent = send(
            ctx.via(),
            ctx.target.request(&headers, variant),
            Instant::now(),
        )
        .await;
        ctx.live.record(sent.sample.outcome);
        ctx.shards.with(id, |r| r.record(&sent.sample));
        let Some(wait) = sent
            .retry_after
            .filter(|w| ctx.honour_retry_after && !w.is_zero())
        else {
            continue;
        };
        let start = Instant::now();
        let until = start + wait;
        let until = budget.deadline().map_or(until, |d| until.min(d));
        ctx.stop.sleep_until(until).await;
        let waited = start.elapsed();
        ctx.shards.with(id, |r| r.record_backoff(waited));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn count_budget_hands_out_exactly_n() {
        let (budget, stop) = (Budget::new(None, Some(3)), Stop::default());
        let taken = (0..10).filter(|_| budget.take(&stop)).count();
        assert_eq!(taken, 3);
        let budget = Budget::new(None, Some(3));
        assert!(budget.take(&stop));
        stop.stop();
        assert!(!budget.take(&stop), "a stopped run hands out nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_budget_stops_at_the_deadline() {
        let budget = Budget::new(Some(Instant::now() + Duration::from_secs(1)), None);
        let stop = Stop::default();
        assert!(budget.take(&stop));
        tokio::time::sleep(Duration::from_millis(999)).await;
        assert!(budget.take(&stop));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!budget.take(&stop));
    }
}
