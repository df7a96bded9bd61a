//! Open loop: a schedule of slots at the target rate, independent of response times.
//!
//! Slot `k` is due at `epoch + k / rate`. At its time a slot is sent on its own task if
//! fewer than `max_in_flight` requests are outstanding; otherwise, or if the scheduler
//! woke more than [`MAX_LATENESS`] after the slot was due, it is counted as `dropped`
//! (never silently skipped). A 429/503 retry-after pauses the whole schedule: no slot
//! is due before the wait ends, and the schedule restarts from there at the same rate
//! (no catch-up burst). Slots inside a pause are not scheduled at all, so they are
//! neither sent nor dropped; the pause is recorded as backoff time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Ctx;
use super::record::Outcome;
use super::send::send;

/// How late a slot may be sent; later than this it is dropped.
pub(super) const MAX_LATENESS: Duration = Duration::from_millis(100);
/// Lateness not charged to a slot's latency: tokio's timer rounds a deadline up to
/// its next millisecond tick and its driver's wait rounds up to whole milliseconds
/// again, so every slot may leave up to this late with nothing behind; a slot later
/// than this was held up, and that is charged.
pub(super) const TIMER_GRAIN: Duration = Duration::from_millis(2);
/// Slots the scheduler handles back to back before yielding to other tasks.
const SLOTS_PER_YIELD: u32 = 1024;

/// The open-loop schedule's settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    /// Target slots per second.
    pub rate_per_s: f64,
    /// Most requests outstanding.
    pub max_in_flight: usize,
    /// No slot is due at or after this.
    pub deadline: Option<Instant>,
    /// Stop after this many slots (sent plus dropped).
    pub slots: Option<u64>,
}

/// The moment the schedule may resume, shared with request tasks (microseconds since
/// the run's start; 0 means no pause asked).
#[derive(Debug, Default)]
struct Pause(AtomicU64);

impl Pause {
    fn extend_to(&self, start: Instant, until: Instant) {
        let us =
            u64::try_from(until.saturating_duration_since(start).as_micros()).unwrap_or(u64::MAX);
        self.0.fetch_max(us, Ordering::Relaxed);
    }

    fn until(&self, start: Instant) -> Option<Instant> {
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            us => Some(start + Duration::from_micros(us)),
        }
    }
}

/// Runs the schedule, then waits for every outstanding request to end.
pub(super) async fn run(ctx: Arc<Ctx>, schedule: Schedule) {
    let in_flight = Arc::new(Semaphore::new(schedule.max_in_flight));
    let pause = Arc::new(Pause::default());
    let mut rng = SmallRng::seed_from_u64(ctx.seed);
    let interval_s = 1.0 / schedule.rate_per_s;
    let (mut epoch, mut k, mut slots, mut dropped, mut burst) = (ctx.start, 0u64, 0u64, 0u64, 0u32);
    loop {
        if ctx.stop.is_stopped() || schedule.slots.is_some_and(|n| slots >= n) {
            break;
        }
        let due = epoch + Duration::from_secs_f64(k as f64 * interval_s);
        if schedule.deadline.is_some_and(|d| due >= d) {
            break;
        }
        if let Some(until) = pause.until(ctx.start).filter(|u| *u > due) {
            let resume = schedule.deadline.map_or(until, |d| until.min(d));
            ctx.stop.sleep_until(resume).await;
            let paused = Instant::now().min(resume).saturating_duration_since(due);
            ctx.shards.with(0, |r| r.record_backoff(paused));
            (epoch, k) = (resume, 0);
            continue;
        }
        if due > Instant::now() {
            ctx.stop.sleep_until(due).await;
            burst = 0;
            if ctx.stop.is_stopped() {
                break;
            }
        } else {
            burst += 1;
            if burst >= SLOTS_PER_YIELD {
                tokio::task::yield_now().await;
                burst = 0;
            }
        }
        let on_time = Instant::now().saturating_duration_since(due) <= MAX_LATENESS;
        let permit = in_flight
            .clone()
            .try_acquire_owned()
            .ok()
            .filter(|_| on_time);
        match permit {
            Some(permit) => {
                let variant = rng.random_range(0..ctx.target.variants());
                let due_slot = Due {
                    slot: slots,
                    at: due,
                };
                tokio::spawn(slot(ctx.clone(), pause.clone(), due_slot, variant, permit));
            }
            None => {
                dropped += 1;
                ctx.live.record(Outcome::Dropped);
            }
        }
        (k, slots) = (k + 1, slots + 1);
    }
    ctx.shards.with(0, |r| r.record_dropped(dropped));
    let all = u32::try_from(schedule.max_in_flight).unwrap_or(u32::MAX);
    // The semaphore is never closed, so acquiring cannot fail; the permits are only a
    // way to wait until every slot task has finished.
    let _ = in_flight.acquire_many(all).await;
}

/// A slot of the schedule: its number and the moment it was due.
#[derive(Debug, Clone, Copy)]
struct Due {
    slot: u64,
    at: Instant,
}

/// Sends one slot's request, timed from its due time plus the timer's grain (or
/// from the send, if sooner): a slot held up beyond the timer's own resolution
/// has that delay in its latency, not hidden (coordinated omission).
async fn slot(
    ctx: Arc<Ctx>,
    pause: Arc<Pause>,
    due: Due,
    variant: usize,
    permit: OwnedSemaphorePermit,
) {
    let req = ctx.target.request(ctx.target.headers(), variant);
    let started = Instant::now().min(due.at + TIMER_GRAIN);
    let sent = send(ctx.via(), req, started).await;
    ctx.live.record(sent.sample.outcome);
    // Spread slots over the shards; truncation only changes which shard is used.
    ctx.shards
        .with(due.slot as usize, |r| r.record(&sent.sample));
    if let Some(wait) = sent
        .retry_after
        .filter(|w| ctx.honour_retry_after && !w.is_zero())
    {
        pause.extend_to(ctx.start, Instant::now() + wait);
    }
    drop(permit);
}
