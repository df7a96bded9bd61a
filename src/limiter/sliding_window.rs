//! Bucketed, conservative sliding window (the default algorithm).
//!
//! The window W is cut into buckets of width `w = W / buckets` (rounded down). Bucket
//! `b` covers `[b*w, (b+1)*w)` and counts **in full** at time `t` while it overlaps the
//! window `(t-W, t]`, i.e. while `b*w <= t < (b+1)*w + W`: until its *end* leaves the
//! window. So the used amount at `t` is never below what any exact window ending at `t`
//! holds, and no window of length W ever admits more than the ceiling.
//!
//! State is a fixed ring of `ceil(W/w) + 1` slots (`buckets + 1` when `buckets`
//! divides W), each tagged with its absolute bucket index so stale slots are detected;
//! a running total makes a decision amortised O(1). Proofs: `docs/design/limiter.md`.

use super::{
    Algorithm, Ceiling, Denial, LimitSpec, Nanos, Reservation, Settlement, Snapshot, SpecError,
};

/// Tag of a slot that has never been written (no real bucket index reaches it).
const EMPTY: u64 = u64::MAX;

/// One ring slot: an absolute bucket index and the cost charged to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    bucket: u64,
    used: u64,
}

/// A bucketed sliding window; see the module docs for its promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindow {
    spec: LimitSpec,
    /// Bucket width in nanoseconds (>= 1).
    width_ns: Nanos,
    /// The ring; bucket `b` lives in `slots[b % len]` while `slots[..].bucket == b`.
    slots: Box<[Slot]>,
    /// Sum of the slots whose bucket is in `tail..=newest`.
    total: u64,
    /// Every bucket below `tail` has been subtracted from `total` (retired).
    tail: u64,
    /// Newest bucket ever charged, if any.
    newest: Option<u64>,
    /// Newest `now` a reservation was made at; earlier times are clamped to it.
    latest_ns: Nanos,
}

impl SlidingWindow {
    /// Builds an empty window, or says why the spec is unusable.
    pub fn try_new(spec: LimitSpec) -> Result<Self, SpecError> {
        spec.validate_for(Algorithm::SlidingWindow)?;
        let width_ns = spec.window_ns / u64::from(spec.buckets);
        // At most ceil(W/w) + 1 buckets overlap a window; <= 2 * MAX_BUCKETS + 1.
        let len = spec.window_ns.div_ceil(width_ns) + 1;
        let slot = Slot {
            bucket: EMPTY,
            used: 0,
        };
        let slots = (0..len).map(|_| slot).collect();
        let spec = LimitSpec {
            algorithm: Algorithm::SlidingWindow,
            ..spec
        };
        Ok(Self {
            spec,
            width_ns,
            slots,
            total: 0,
            tail: 0,
            newest: None,
            latest_ns: 0,
        })
    }

    /// The validated spec.
    pub fn spec(&self) -> &LimitSpec {
        &self.spec
    }

    /// Would `cost` be admitted under `ceiling` at `now`? Changes nothing.
    pub fn check(&self, now: Nanos, cost: u64, ceiling: Ceiling) -> Result<(), Denial> {
        let now = now.max(self.latest_ns);
        self.decide(now, self.used_at(now), cost, ceiling)
    }

    /// Charges `cost` to the bucket of `now` if it fits under `ceiling`.
    pub fn reserve(
        &mut self,
        now: Nanos,
        cost: u64,
        ceiling: Ceiling,
    ) -> Result<Reservation, Denial> {
        let now = now.max(self.latest_ns);
        self.retire(now);
        self.decide(now, self.total, cost, ceiling)?;
        Ok(self.charge_now(now, cost))
    }

    /// Moves `reservation` to the bucket of `now`, when the upstream answered: the
    /// provider counts a request when it arrives, which the gateway only knows
    /// happened by then. Left in its admission bucket, the charge would leave this
    /// window before it leaves the provider's whenever the way there takes longer
    /// than what was left of that bucket (the jepsen harness measured 41 of 40
    /// over slow links). Cost still in the old bucket moves (the total is
    /// unchanged); cost whose bucket already left the window is charged again, as
    /// a debt (the provider still counts it). Never checked against a ceiling: the
    /// request is already out.
    pub fn redate(&mut self, now: Nanos, reservation: Reservation) -> Reservation {
        let now = now.max(self.latest_ns);
        let old = reservation.slot;
        if old >= now / self.width_ns {
            return reservation;
        }
        self.retire(now);
        let index = self.index(old);
        if old >= self.tail
            && self.newest.is_some_and(|n| old <= n)
            && self.slots[index].bucket == old
        {
            let moved = reservation.cost.min(self.slots[index].used);
            self.slots[index].used -= moved;
            self.total -= moved;
        }
        self.charge_now(now, reservation.cost)
    }

    /// Adds `cost` to the bucket of `now` (already retired to `now`).
    fn charge_now(&mut self, now: Nanos, cost: u64) -> Reservation {
        self.latest_ns = now;
        let bucket = now / self.width_ns;
        let index = self.index(bucket);
        let slot = &mut self.slots[index];
        if slot.bucket != bucket {
            debug_assert!(
                slot.bucket == EMPTY || slot.bucket < self.tail,
                "live slot reused"
            );
            *slot = Slot { bucket, used: 0 };
        }
        slot.used = slot.used.saturating_add(cost);
        self.total = self.total.saturating_add(cost);
        self.newest = Some(self.newest.map_or(bucket, |n| n.max(bucket)));
        debug_assert!(self.total >= self.slots[index].used, "total below a bucket");
        Reservation { cost, slot: bucket }
    }

    /// Corrects `reservation` to `actual` in the reservation's own bucket, if that bucket
    /// still counts at `now`; otherwise reports the correction as expired and changes
    /// nothing. A refund never takes a bucket below zero.
    pub fn settle(&mut self, now: Nanos, reservation: Reservation, actual: u64) -> Settlement {
        let now = now.max(self.latest_ns);
        let bucket = reservation.slot;
        let index = self.index(bucket);
        let live = bucket >= self.tail.max(self.oldest_at(now))
            && self.newest.is_some_and(|n| bucket <= n)
            && self.slots[index].bucket == bucket;
        let mut out = Settlement::default();
        if !live {
            out.expired = reservation.cost.abs_diff(actual);
            return out;
        }
        let slot = &mut self.slots[index];
        if actual <= reservation.cost {
            out.refunded = (reservation.cost - actual).min(slot.used);
            slot.used -= out.refunded;
            self.total -= out.refunded;
        } else {
            out.debt = actual - reservation.cost;
            slot.used = slot.used.saturating_add(out.debt);
            self.total = self.total.saturating_add(out.debt);
        }
        out
    }

    /// Used and remaining cost at `now`, and the time until the newest non-empty bucket
    /// leaves the window.
    pub fn snapshot(&self, now: Nanos) -> Snapshot {
        let now = now.max(self.latest_ns);
        let used = self.used_at(now);
        let capacity = self.spec.capacity;
        let remaining = capacity.saturating_sub(used);
        debug_assert!(remaining <= capacity);
        let reset_after_ns = if used == 0 {
            0
        } else {
            self.live_buckets(now)
                .rev()
                .find(|&(_, used)| used > 0)
                .map_or(0, |(b, _)| self.leaves_at(b).saturating_sub(now))
        };
        Snapshot {
            capacity,
            used,
            remaining,
            reset_after_ns,
        }
    }

    /// True when no bucket charged so far still counts at `now`.
    pub fn is_at_rest(&self, now: Nanos) -> bool {
        let now = now.max(self.latest_ns);
        self.newest.is_none_or(|n| self.leaves_at(n) <= now)
    }

    /// Admission decision given the amount `used` at `now`.
    fn decide(&self, now: Nanos, used: u64, cost: u64, ceiling: Ceiling) -> Result<(), Denial> {
        let limit = ceiling.of(self.spec.capacity);
        if limit == 0 || cost > limit {
            return Err(Denial::Never);
        }
        if used.saturating_add(cost) <= limit {
            return Ok(());
        }
        // Buckets leave oldest first; the wait ends when enough of them have left.
        let mut left = used;
        let wait = self.live_buckets(now).find_map(|(bucket, charged)| {
            left = left.saturating_sub(charged);
            (charged > 0 && left.saturating_add(cost) <= limit)
                .then(|| self.leaves_at(bucket).saturating_sub(now))
        });
        debug_assert!(wait.is_some(), "used {used} not explained by live buckets");
        let fallback = || {
            self.newest
                .map_or(0, |n| self.leaves_at(n).saturating_sub(now))
        };
        Err(Denial::RetryAfter(wait.unwrap_or_else(fallback).max(1)))
    }

    /// Buckets that count at `now`, oldest first, as `(absolute bucket index, cost)`,
    /// and the bucket width: what a node publishes as its share of a cluster-wide
    /// counter (docs/design/counters.md).
    pub fn export(&self, now: Nanos) -> (Nanos, Vec<(u64, u64)>) {
        (self.width_ns, self.live_buckets(now).collect())
    }

    /// Amount counted at `now` without mutating: the total minus buckets retired since.
    fn used_at(&self, now: Nanos) -> u64 {
        let gone: u64 = self.retiring(now).map(|(_, used)| used).sum();
        debug_assert!(gone <= self.total, "retiring more than the total");
        self.total - gone
    }

    /// Subtracts buckets that no longer count at `now` from the total.
    fn retire(&mut self, now: Nanos) {
        let gone: u64 = self.retiring(now).map(|(_, used)| used).sum();
        debug_assert!(gone <= self.total, "retiring more than the total");
        self.total -= gone;
        self.tail = self.tail.max(self.oldest_at(now));
    }

    /// Charged buckets in `tail..oldest_at(now)` (at most the ring length).
    fn retiring(&self, now: Nanos) -> impl Iterator<Item = (u64, u64)> + '_ {
        let end = self
            .oldest_at(now)
            .min(self.newest.map_or(0, |n| n.saturating_add(1)));
        self.charged(self.tail..end.max(self.tail))
    }

    /// Charged buckets that count at `now`, oldest first.
    fn live_buckets(&self, now: Nanos) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        let start = self.tail.max(self.oldest_at(now));
        let end = self
            .newest
            .map_or(start, |n| n.saturating_add(1))
            .max(start);
        self.charged(start..end)
    }

    /// The slots of `range` whose tag matches, as `(bucket, used)`.
    fn charged(
        &self,
        range: std::ops::Range<u64>,
    ) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        range.filter_map(move |b| {
            let slot = self.slots[self.index(b)];
            (slot.bucket == b).then_some((b, slot.used))
        })
    }

    /// Oldest bucket that still counts at `now`: the smallest `b` with
    /// `(b+1)*w + W > now`.
    fn oldest_at(&self, now: Nanos) -> u64 {
        now.checked_sub(self.spec.window_ns)
            .map_or(0, |t| t / self.width_ns)
    }

    /// First instant at which bucket `b` no longer counts: its end plus W.
    fn leaves_at(&self, bucket: u64) -> Nanos {
        bucket
            .saturating_add(1)
            .saturating_mul(self.width_ns)
            .saturating_add(self.spec.window_ns)
    }

    /// Ring position of bucket `b`.
    fn index(&self, bucket: u64) -> usize {
        // The ring length came from a usize, so the remainder fits.
        (bucket % self.slots.len() as u64) as usize
    }
}

#[cfg(test)]
mod tests;
