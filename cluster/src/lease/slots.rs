//! The owner's ledger for a concurrency key: `C` slots leased to holders and kept
//! alive by heartbeat while their streams run.
//!
//! Each holder has one slot lease: a count and an expiry at the owner's `now + ttl`,
//! pushed back by every [`SlotLedger::heartbeat`] (which also reports how many slots
//! the holder still uses; the rest return). A silent holder's slots return when its
//! lease expires, i.e. within one ttl of its last heartbeat. Concurrency is not a
//! window: a returned slot is free at once. Invariant: `held + hidden <= C`.
//! After failover ([`SlotLedger::rebuild`]) each live holder that has not announced
//! is assumed to hold `max_per_holder` slots for one ttl.

use std::collections::{BTreeMap, BTreeSet};

use crate::lease::{MAX_AMOUNT, MAX_TTL_MS, Refusal, bounded};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold {
    slots: u64,
    expires_at_ms: u64,
}

/// Concurrency slots of one key, as its owner tracks them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotLedger<H> {
    capacity: u64,
    max_per_holder: u64,
    holds: BTreeMap<H, Hold>,
    unknown: BTreeSet<H>,
    recover_until_ms: u64,
    last_now_ms: u64,
}

impl<H: Ord + Clone> SlotLedger<H> {
    /// `capacity` slots, at most `max_per_holder` held by one holder (clamped to
    /// `1..=capacity`; the same on every node: a rebuilt owner relies on it).
    pub fn new(capacity: u64, max_per_holder: u64) -> Self {
        let capacity = capacity.min(MAX_AMOUNT);
        Self {
            capacity,
            max_per_holder: max_per_holder.clamp(1, capacity.max(1)),
            holds: BTreeMap::new(),
            unknown: BTreeSet::new(),
            recover_until_ms: 0,
            last_now_ms: 0,
        }
    }

    /// A new owner's slot ledger: every one of `live_holders` is assumed to hold
    /// `max_per_holder` until it announces or `ttl_ms` passes.
    pub fn rebuild(
        capacity: u64,
        max_per_holder: u64,
        live_holders: &[H],
        now_ms: u64,
        ttl_ms: u64,
    ) -> Self {
        let mut ledger = Self::new(capacity, max_per_holder);
        ledger.unknown = live_holders.iter().cloned().collect();
        ledger.recover_until_ms = now_ms.saturating_add(ttl_ms.min(MAX_TTL_MS));
        ledger.last_now_ms = now_ms;
        ledger
    }

    /// Slots free at `now_ms`: `C - held - hidden`.
    pub fn available(&self, now_ms: u64) -> u64 {
        self.capacity
            .saturating_sub(self.held(now_ms) + self.hidden(now_ms))
    }

    /// Slots held by holders whose lease has not expired at `now_ms`.
    pub fn held(&self, now_ms: u64) -> u64 {
        let now = now_ms.max(self.last_now_ms);
        (self.holds.values())
            .filter(|h| h.expires_at_ms > now)
            .map(|h| h.slots)
            .sum()
    }

    /// Slots reserved for holders that have not re-announced after a rebuild.
    pub fn hidden(&self, now_ms: u64) -> u64 {
        if now_ms.max(self.last_now_ms) >= self.recover_until_ms {
            return 0;
        }
        let n = self.unknown.len() as u64;
        n.saturating_mul(self.max_per_holder).min(self.capacity)
    }

    /// Up to `n` more slots for `holder` (`Exhausted` when none), all of its slots
    /// then expiring at `now + ttl`. Returns the slots granted now.
    pub fn grant_slots(
        &mut self,
        holder: &H,
        n: u64,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<u64, Refusal> {
        let now = self.settle(now_ms);
        bounded("slots", n, self.capacity.max(1))?;
        bounded("ttl_ms", ttl_ms, MAX_TTL_MS)?;
        let held = self.holds.get(holder).map_or(0, |h| h.slots);
        let size = n
            .min(self.available(now))
            .min(self.max_per_holder.saturating_sub(held));
        if size == 0 {
            return Err(Refusal::Exhausted {
                retry_in_ms: ttl_ms,
            });
        }
        let expires_at_ms = now.saturating_add(ttl_ms);
        self.holds.insert(
            holder.clone(),
            Hold {
                slots: held + size,
                expires_at_ms,
            },
        );
        debug_assert!(self.held(now) + self.hidden(now) <= self.capacity);
        Ok(size)
    }

    /// The holder's heartbeat (or re-announce after a rebuild): it still uses
    /// `in_use` slots (at most what it holds, or `max_per_holder` when announcing to
    /// a rebuilt owner); the rest return and the lease lives another ttl.
    pub fn heartbeat(
        &mut self,
        holder: &H,
        in_use: u64,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<(), Refusal> {
        let now = self.settle(now_ms);
        bounded("ttl_ms", ttl_ms, MAX_TTL_MS)?;
        let announcing = self.unknown.contains(holder);
        let max = match self.holds.get(holder) {
            _ if announcing => self.max_per_holder,
            Some(h) => h.slots,
            None => 0,
        };
        if in_use > max {
            return Err(Refusal::Absurd {
                what: "slots in use",
                amount: in_use,
                max,
            });
        }
        self.unknown.remove(holder);
        let expires_at_ms = now.saturating_add(ttl_ms);
        if in_use == 0 {
            self.holds.remove(holder);
        } else {
            self.holds.insert(
                holder.clone(),
                Hold {
                    slots: in_use,
                    expires_at_ms,
                },
            );
        }
        Ok(())
    }

    /// Drops expired holds and a finished recovery; returns the effective now.
    fn settle(&mut self, now_ms: u64) -> u64 {
        let now = now_ms.max(self.last_now_ms);
        self.last_now_ms = now;
        self.holds.retain(|_, h| h.expires_at_ms > now);
        if now >= self.recover_until_ms {
            self.unknown.clear();
        }
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silent_holder_slots_return_within_one_ttl() {
        let mut s = SlotLedger::new(4, 4);
        assert_eq!(s.grant_slots(&"a", 3, 0, 1_000), Ok(3));
        assert_eq!(s.grant_slots(&"b", 3, 10, 1_000), Ok(1));
        assert_eq!(s.heartbeat(&"a", 2, 500, 1_000), Ok(()));
        assert_eq!(s.heartbeat(&"b", 1, 1_000, 1_000), Ok(()));
        assert_eq!(
            s.available(1_499),
            1,
            "a's slots held 999 ms after its heartbeat"
        );
        assert_eq!(
            s.available(1_500),
            3,
            "returned one ttl after a's last heartbeat"
        );
        assert_eq!(s.grant_slots(&"b", 4, 1_500, 1_000), Ok(3));
    }

    #[test]
    fn rebuilt_slot_owner_is_conservative_until_announced() {
        let mut s = SlotLedger::rebuild(10, 4, &["a", "b"], 0, 1_000);
        assert_eq!(s.available(0), 2);
        assert_eq!(
            s.heartbeat(&"a", 5, 1, 1_000),
            Err(Refusal::Absurd {
                what: "slots in use",
                amount: 5,
                max: 4
            })
        );
        s.heartbeat(&"a", 3, 1, 1_000).ok();
        assert_eq!(s.available(1), 10 - 3 - 4);
        assert_eq!(
            s.available(1_000),
            10 - 3,
            "unknown b stops counting after one ttl"
        );
        assert_eq!(s.grant_slots(&"c", 1, 2, 1_000).ok(), Some(1));
        assert_eq!(s.heartbeat(&"c", 2, 3, 1_000).ok(), None, "more than held");
    }
}
