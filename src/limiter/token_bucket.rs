//! GCRA token bucket with a burst, in exact integer arithmetic.
//!
//! Rate `capacity / W`, emission interval `T = W / capacity`. Time is kept *scaled by
//! capacity* (`ns * capacity`, in u128), so one unit of cost is exactly `W` scaled units
//! and every comparison and retry-after is exact to the nanosecond, with no float drift.
//!
//! A cost `n` at `now` is admitted iff `max(TAT, now) + n*T - now <= B'*T`, where
//! `B' = ceiling.of(burst)`. Promise: for admitted costs settled at or below their
//! reservation, any closed interval of length `d` holds `W * admitted <= W * B +
//! capacity * d`, i.e. `admitted <= B + floor(capacity * d / W)`; no other rounding.
//! Proofs and the settlement floor: `docs/design/limiter.md`.

use super::{
    Algorithm, Ceiling, Denial, LimitSpec, Nanos, Reservation, Settlement, Snapshot, SpecError,
};

/// A GCRA limiter; see the module docs for its promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    spec: LimitSpec,
    /// Theoretical arrival time, scaled by capacity (`ns * capacity`).
    tat: u128,
    /// Newest `now` a reservation was made at; earlier times are clamped to it.
    last_arrival_ns: Nanos,
    /// Cost charged so far (reservations and debts, never reduced by refunds),
    /// re-anchored to at least `now` in ns whenever the bucket restarts from rest, so
    /// slots are time-anchored (see `is_at_rest`).
    charged: u64,
    /// `charged` when the bucket last restarted from rest: older slots are expired.
    epoch: u64,
}

impl TokenBucket {
    /// Builds a full bucket (at rest), or says why the spec is unusable.
    pub fn try_new(spec: LimitSpec) -> Result<Self, SpecError> {
        spec.validate_for(Algorithm::TokenBucket)?;
        let spec = LimitSpec {
            algorithm: Algorithm::TokenBucket,
            ..spec
        };
        Ok(Self {
            spec,
            tat: 0,
            last_arrival_ns: 0,
            charged: 0,
            epoch: 0,
        })
    }

    /// The validated spec.
    pub fn spec(&self) -> &LimitSpec {
        &self.spec
    }

    /// Would `cost` be admitted under `ceiling` at `now`? Changes nothing.
    pub fn check(&self, now: Nanos, cost: u64, ceiling: Ceiling) -> Result<(), Denial> {
        self.decide(now.max(self.last_arrival_ns), cost, ceiling)
            .map(|_| ())
    }

    /// Moves the TAT forward by `cost` emission intervals if the result stays within
    /// the burst allowed by `ceiling`. The slot is the charge counter after this cost.
    pub fn reserve(
        &mut self,
        now: Nanos,
        cost: u64,
        ceiling: Ceiling,
    ) -> Result<Reservation, Denial> {
        let now = now.max(self.last_arrival_ns);
        let tat = self.decide(now, cost, ceiling)?;
        if self.tat <= self.scaled(now) {
            // Restart from rest: everything charged before has drained. Anchoring to `now`
            // keeps slots of an instance dropped at rest below this one's.
            self.charged = self.charged.saturating_add(1).max(now);
            self.epoch = self.charged;
        }
        self.tat = tat;
        self.charged = self.charged.saturating_add(cost);
        self.last_arrival_ns = now;
        Ok(Reservation {
            cost,
            slot: self.charged,
        })
    }

    /// Re-dating to the upstream's answer changes nothing here: GCRA spaces
    /// admissions at the rate, with no window for a charge to leave early (and
    /// cluster modes require `sliding-window`).
    pub fn redate(&mut self, _now: Nanos, reservation: Reservation) -> Reservation {
        reservation
    }

    /// Moves the TAT back by the refund or forward by the debt. A refund never takes
    /// the TAT below `last arrival + everything charged after this reservation`, the
    /// least the later reservations imply on their own. A reservation made before the
    /// bucket last restarted from rest, or settled while it is at rest, has expired:
    /// the correction is reported in `expired` and nothing changes.
    pub fn settle(&mut self, now: Nanos, reservation: Reservation, actual: u64) -> Settlement {
        let now = now.max(self.last_arrival_ns);
        let slot = reservation.slot;
        let live = self.tat > self.scaled(now) && self.epoch <= slot && slot <= self.charged;
        let mut out = Settlement::default();
        if !live {
            out.expired = reservation.cost.abs_diff(actual);
            return out;
        }
        if actual <= reservation.cost {
            out.refunded = reservation.cost - actual;
            let later = self.charged - slot;
            let floor = self
                .scaled(self.last_arrival_ns)
                .saturating_add(self.units(later));
            let floor = floor.min(self.tat);
            self.tat = self.tat.saturating_sub(self.units(out.refunded)).max(floor);
        } else {
            out.debt = actual - reservation.cost;
            self.tat = self.tat.saturating_add(self.units(out.debt));
            self.charged = self.charged.saturating_add(out.debt);
        }
        out
    }

    /// Burst-relative figures: `capacity` is the burst, `used` the burst consumed
    /// (rounded up), `remaining` the largest cost admissible now, `reset_after_ns` the
    /// time until the bucket is full again.
    pub fn snapshot(&self, now: Nanos) -> Snapshot {
        let now = now.max(self.last_arrival_ns);
        let consumed = self.tat.saturating_sub(self.scaled(now));
        let capacity = self.spec.burst;
        let used = saturate(consumed.div_ceil(u128::from(self.spec.window_ns)));
        let remaining = capacity.saturating_sub(used);
        debug_assert!(remaining <= capacity);
        let reset_after_ns = saturate(consumed.div_ceil(u128::from(self.spec.capacity)));
        Snapshot {
            capacity,
            used,
            remaining,
            reset_after_ns,
        }
    }

    /// True when the bucket is full (TAT not after `now`) and every slot handed out is
    /// below `now` in ns, so a new instance's slots (anchored at or after its first
    /// reservation time) can never collide with this one's.
    pub fn is_at_rest(&self, now: Nanos) -> bool {
        let now = now.max(self.last_arrival_ns);
        self.tat <= self.scaled(now) && (self.charged == 0 || self.charged < now)
    }

    /// The TAT after admitting `cost` at `now`, or why not.
    fn decide(&self, now: Nanos, cost: u64, ceiling: Ceiling) -> Result<u128, Denial> {
        let burst = ceiling.of(self.spec.burst);
        if burst == 0 || cost > burst {
            return Err(Denial::Never);
        }
        let now_scaled = self.scaled(now);
        let tat = self.tat.max(now_scaled).saturating_add(self.units(cost));
        let allowance = self.units(burst);
        if tat - now_scaled <= allowance {
            return Ok(tat);
        }
        // Denied, so self.tat > now: the cost fits from the first t with
        // t * capacity >= tat - allowance, and not one nanosecond before.
        let fits_at = (tat - allowance).div_ceil(u128::from(self.spec.capacity));
        debug_assert!(fits_at > u128::from(now), "denied but fits now");
        Err(Denial::RetryAfter(saturate(fits_at - u128::from(now))))
    }

    /// `t` in scaled units (`ns * capacity`).
    fn scaled(&self, t: Nanos) -> u128 {
        u128::from(t) * u128::from(self.spec.capacity)
    }

    /// `cost` in scaled units (`cost * W`: one emission interval per unit of cost).
    fn units(&self, cost: u64) -> u128 {
        u128::from(cost) * u128::from(self.spec.window_ns)
    }
}

/// `x` as u64, saturating.
fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

#[cfg(test)]
impl TokenBucket {
    /// The TAT in scaled units, for the oracles.
    pub(crate) fn tat_scaled(&self) -> u128 {
        self.tat
    }
}

#[cfg(test)]
mod tests;
