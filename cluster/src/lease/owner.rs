//! The owner's ledger for one windowed key (requests or tokens per window W).
//!
//! Invariant, at every `now` (checked by `debug_assert!` and the property tests):
//!
//! ```text
//! consumed_in_window(now) + outstanding(now) + hidden(now) <= L   (what we grant)
//! available(now) = L - consumed_in_window(now) - outstanding(now) - hidden(now)
//! ```
//!
//! - *consumed*: per bucket (the counters' [`Window`]), what holders reported at
//!   renewal or release, plus the whole amount of every expired lease (in the bucket
//!   of its expiry: the holder may have spent all of it up to then). Ages out with
//!   the window, never earlier.
//! - *outstanding*: leases granted and not yet renewed, returned or expired, counted
//!   in full. A lease expires at the owner's `now + ttl`; the holder stops spending at
//!   its own send time + ttl, which is earlier (skew safety, docs/design/lease.md).
//! - *hidden*: after a failover [`Ledger::rebuild`], `max_lease` for every live
//!   holder that has not re-announced yet, until one ttl has passed; then it becomes
//!   consumption (the holder may have spent it all).
//!
//! Grant size: `min(requested, available, max_lease - held, fair - held)`, where
//! `fair` is the holder's demand-weighted share ([`crate::share::shares`]) of
//! `L - consumed - hidden` among the holders holding a lease or asking within a ttl.

use std::collections::{BTreeMap, BTreeSet};

use crate::counter::Window;
use crate::lease::{LeaseId, MAX_AMOUNT, MAX_HOLDERS, MAX_TTL_MS, Refusal};

/// Why a [`LedgerConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `capacity` must be in `1..=MAX_AMOUNT`.
    #[error("capacity must be in 1..={MAX_AMOUNT}, got {0}")]
    Capacity(u64),
    /// `max_lease` must be in `1..=capacity`.
    #[error("max_lease must be in 1..=capacity ({capacity}), got {max_lease}")]
    MaxLease {
        /// The capacity.
        capacity: u64,
        /// What was asked.
        max_lease: u64,
    },
    /// `max_holders` must be in `1..=MAX_HOLDERS`.
    #[error("max_holders must be in 1..={MAX_HOLDERS}, got {0}")]
    MaxHolders(usize),
}

/// A key's limit as the owner enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerConfig {
    pub(super) capacity: u64,
    pub(super) window: Window,
    pub(super) max_lease: u64,
    pub(super) max_holders: usize,
}

impl LedgerConfig {
    /// `capacity` L per `window`; `max_lease` caps what one holder may hold at once
    /// (it is also what a rebuilt owner assumes an unknown holder holds, so it must be
    /// the same on every node); `max_holders` bounds the holders tracked.
    pub fn try_new(
        capacity: u64,
        window: Window,
        max_lease: u64,
        max_holders: usize,
    ) -> Result<Self, ConfigError> {
        if capacity == 0 || capacity > MAX_AMOUNT {
            return Err(ConfigError::Capacity(capacity));
        }
        if max_lease == 0 || max_lease > capacity {
            return Err(ConfigError::MaxLease {
                capacity,
                max_lease,
            });
        }
        if max_holders == 0 || max_holders > MAX_HOLDERS {
            return Err(ConfigError::MaxHolders(max_holders));
        }
        Ok(Self {
            capacity,
            window,
            max_lease,
            max_holders,
        })
    }

    /// The capacity L per window.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The window the capacity applies to.
    pub fn window(&self) -> &Window {
        &self.window
    }

    /// The most one holder holds at once.
    pub fn max_lease(&self) -> u64 {
        self.max_lease
    }
}

/// A block granted to a holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Names the lease in renewals and releases.
    pub lease_id: LeaseId,
    /// How much the holder may spend (requests or tokens).
    pub amount: u64,
    /// When the owner counts the lease as spent, on the owner's clock (ms). The holder
    /// uses its own send time + ttl instead, never this.
    pub expires_at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Lease<H> {
    pub(super) holder: H,
    pub(super) amount: u64,
    pub(super) granted_at_ms: u64,
    pub(super) expires_at_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Demand {
    pub(super) requested: u64,
    pub(super) active_until_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Recovery<H> {
    pub(super) unknown: BTreeSet<H>,
    pub(super) until_ms: u64,
}

/// The owner's ledger of one key. See the module docs for the invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger<H> {
    pub(super) config: LedgerConfig,
    pub(super) consumed: BTreeMap<u64, u64>,
    pub(super) leases: BTreeMap<LeaseId, Lease<H>>,
    pub(super) demand: BTreeMap<H, Demand>,
    pub(super) recovery: Option<Recovery<H>>,
    pub(super) next_id: LeaseId,
    pub(super) last_now_ms: u64,
}

impl<H: Ord + Clone> Ledger<H> {
    /// An empty ledger: nothing consumed, nothing outstanding (a key that was never
    /// owned before; a key that was owned elsewhere uses [`Ledger::rebuild`]).
    pub fn new(config: LedgerConfig) -> Self {
        Self {
            config,
            consumed: BTreeMap::new(),
            leases: BTreeMap::new(),
            demand: BTreeMap::new(),
            recovery: None,
            next_id: 1,
            last_now_ms: 0,
        }
    }

    /// A new owner's ledger after ownership moved: consumption from the gossiped
    /// counters (`(bucket, cost)`, summed over members), and until every one of
    /// `live_holders` has [`announce`](Self::announce)d or `ttl_ms` has passed, each
    /// unknown holder is assumed to hold `max_lease` (the old owner capped every
    /// holder there), so the worst case stays <= L.
    pub fn rebuild(
        config: LedgerConfig,
        consumed_from_counters: &[(u64, u64)],
        live_holders: &[H],
        now_ms: u64,
        ttl_ms: u64,
    ) -> Self {
        let mut ledger = Self::new(config);
        ledger.last_now_ms = now_ms;
        let now_bucket = config.window.bucket_index(now_ms);
        for &(bucket, cost) in consumed_from_counters {
            ledger.add_consumed(bucket.min(now_bucket), cost.min(MAX_AMOUNT));
        }
        let unknown: BTreeSet<H> = live_holders.iter().cloned().collect();
        if !unknown.is_empty() {
            let until_ms = now_ms.saturating_add(ttl_ms.min(MAX_TTL_MS));
            ledger.recovery = Some(Recovery { unknown, until_ms });
        }
        ledger
    }

    /// The configuration.
    pub fn config(&self) -> &LedgerConfig {
        &self.config
    }

    /// What may still be granted at `now_ms`: `L - consumed - outstanding - hidden`,
    /// never negative (gossiped consumption can exceed L).
    pub fn available(&self, now_ms: u64) -> u64 {
        let now_ms = now_ms.max(self.last_now_ms);
        let committed =
            self.consumed_in_window(now_ms) + self.outstanding(now_ms) + self.hidden(now_ms);
        self.config.capacity.saturating_sub(committed)
    }

    /// Consumption counting at `now_ms`: reported, plus expired leases and expired
    /// failover reservations (counted even before [`Self::settle`] moves them).
    pub fn consumed_in_window(&self, now_ms: u64) -> u64 {
        let w = &self.config.window;
        let reported: u64 = (self.consumed.iter())
            .filter(|(b, _)| w.counts(**b, now_ms))
            .map(|(_, c)| *c)
            .sum();
        let expired: u64 = (self.leases.values())
            .filter(|l| l.expires_at_ms <= now_ms)
            .filter(|l| w.counts(w.bucket_index(l.expires_at_ms), now_ms))
            .map(|l| l.amount)
            .sum();
        reported + expired + self.hidden_expired(now_ms)
    }

    /// Leases granted, not yet returned and not expired at `now_ms`, in full.
    pub fn outstanding(&self, now_ms: u64) -> u64 {
        (self.leases.values())
            .filter(|l| l.expires_at_ms > now_ms)
            .map(|l| l.amount)
            .sum()
    }

    /// What a rebuilt owner still reserves for holders that have not re-announced.
    pub fn hidden(&self, now_ms: u64) -> u64 {
        match &self.recovery {
            Some(r) if r.until_ms > now_ms => self.reservation(r),
            _ => 0,
        }
    }

    /// Whether a rebuilt owner is still conservative (unknown holders, within a ttl).
    pub fn recovering(&self, now_ms: u64) -> bool {
        self.hidden(now_ms) > 0
    }

    /// What `holder` holds in unexpired leases at `now_ms`.
    pub fn held_by(&self, holder: &H, now_ms: u64) -> u64 {
        (self.leases.values())
            .filter(|l| &l.holder == holder && l.expires_at_ms > now_ms)
            .map(|l| l.amount)
            .sum()
    }

    pub(super) fn reservation(&self, r: &Recovery<H>) -> u64 {
        let n = r.unknown.len() as u64;
        n.saturating_mul(self.config.max_lease)
            .min(self.config.capacity)
    }

    fn hidden_expired(&self, now_ms: u64) -> u64 {
        let w = &self.config.window;
        match &self.recovery {
            Some(r) if r.until_ms <= now_ms && w.counts(w.bucket_index(r.until_ms), now_ms) => {
                self.reservation(r)
            }
            _ => 0,
        }
    }

    pub(super) fn add_consumed(&mut self, bucket: u64, cost: u64) {
        if cost > 0 {
            let c = self.consumed.entry(bucket).or_insert(0);
            *c = c.saturating_add(cost).min(MAX_AMOUNT);
        }
    }
}

/// The ledgers of every key this node owns, bounded: a request for a key that is not
/// configured here is [`Refusal::UnknownKey`], never a new ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Book<H> {
    ledgers: BTreeMap<String, Ledger<H>>,
    max_keys: usize,
}

impl<H: Ord + Clone> Book<H> {
    /// An empty book holding at most `max_keys` ledgers.
    pub fn new(max_keys: usize) -> Self {
        Self {
            ledgers: BTreeMap::new(),
            max_keys,
        }
    }

    /// Starts owning `key` with `ledger` (new or rebuilt); `false` when the book is
    /// full and the key is new (the ledger is dropped).
    pub fn insert(&mut self, key: &str, ledger: Ledger<H>) -> bool {
        if !self.ledgers.contains_key(key) && self.ledgers.len() >= self.max_keys {
            return false;
        }
        self.ledgers.insert(key.to_owned(), ledger);
        true
    }

    /// Stops owning `key` (ownership moved away), returning its ledger.
    pub fn remove(&mut self, key: &str) -> Option<Ledger<H>> {
        self.ledgers.remove(key)
    }

    /// The ledger of `key`, or [`Refusal::UnknownKey`].
    pub fn ledger_mut(&mut self, key: &str) -> Result<&mut Ledger<H>, Refusal> {
        self.ledgers.get_mut(key).ok_or(Refusal::UnknownKey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(capacity: u64, max_lease: u64) -> LedgerConfig {
        let window = Window::try_new(1_000, 10).expect("valid window");
        LedgerConfig::try_new(capacity, window, max_lease, 3).expect("valid config")
    }

    #[test]
    fn rebuilt_owner_is_conservative_then_fully_available_after_announces() {
        let mut l = Ledger::rebuild(config(100, 30), &[(0, 10)], &["a", "b"], 50, 500);
        assert_eq!(l.available(50), 100 - 10 - 2 * 30);
        assert!(l.recovering(50));
        assert_eq!(l.grant(&"c", 100, 50, 500).map(|g| g.amount), Ok(30));
        let adopted = l.announce(&"a", 20, &[], 60, 500);
        assert_eq!(adopted.map(|g| g.map(|g| g.amount)), Ok(Some(20)));
        assert_eq!(l.available(60), 100 - 10 - 30 - 20 - 30);
        assert_eq!(l.announce(&"b", 0, &[], 70, 500), Ok(None));
        assert!(!l.recovering(70));
        assert_eq!(l.available(70), 100 - 10 - 30 - 20, "back to full use");
    }

    #[test]
    fn rebuilt_owner_charges_silent_holders_after_one_ttl() {
        let l: Ledger<&str> = Ledger::rebuild(config(100, 30), &[], &["a"], 0, 500);
        assert_eq!(l.available(499), 70);
        // Hidden becomes consumption in bucket 5, counted until 600 + 1000.
        assert_eq!(l.available(500), 70);
        assert!(!l.recovering(500));
        assert_eq!(l.available(1_599), 70);
        assert_eq!(l.available(1_600), 100);
    }

    #[test]
    fn bad_input_is_refused_with_state_unchanged() {
        let mut l = Ledger::new(config(100, 50));
        let g = l.grant(&"a", 40, 0, 500).expect("granted");
        l.grant(&"b", 10, 0, 500).expect("granted");
        l.settle(10);
        let before = l.clone();
        fn absurd<T>(what: &'static str, amount: u64, max: u64) -> Result<T, Refusal> {
            Err(Refusal::Absurd { what, amount, max })
        }
        assert_eq!(l.grant(&"a", 0, 10, 500), absurd("requested", 0, 100));
        assert_eq!(l.grant(&"a", 101, 10, 500), absurd("requested", 101, 100));
        assert_eq!(l.grant(&"a", 1, 10, 0), absurd("ttl_ms", 0, MAX_TTL_MS));
        assert_eq!(
            l.grant(&"a", 1, 10, MAX_TTL_MS + 1),
            absurd("ttl_ms", MAX_TTL_MS + 1, MAX_TTL_MS)
        );
        let id = g.lease_id;
        assert_eq!(l.release(&"b", id, &[], 10), Err(Refusal::NotYourLease(id)));
        assert_eq!(l.release(&"a", 99, &[], 10), Err(Refusal::UnknownLease(99)));
        let over = Err(Refusal::Overreported {
            reported: 41,
            amount: 40,
        });
        assert_eq!(l.renew(&"a", id, &[(0, 40), (0, 1)], 5, 10, 500), over);
        assert_eq!(
            l.release(&"a", id, &[(0, MAX_AMOUNT + 1)], 10),
            absurd("cost", MAX_AMOUNT + 1, MAX_AMOUNT)
        );
        assert_eq!(
            l.announce(&"a", 51, &[], 10, 500),
            absurd("outstanding", 51, 50)
        );
        l.grant(&"c", 1, 10, 500).expect("third holder");
        l.settle(10);
        let before_full = l.clone();
        assert_eq!(
            l.grant(&"d", 1, 10, 500),
            Err(Refusal::TooManyHolders { max: 3 })
        );
        assert_eq!(l, before_full);
        let mut l = before.clone();
        assert_eq!(l, before);
        // Stale: released, then reported again; expired, then reported.
        assert_eq!(l.release(&"a", id, &[(0, 5)], 20), Ok(()));
        l.settle(20);
        let closed = l.clone();
        assert_eq!(l.release(&"a", id, &[], 20), Err(Refusal::Stale(id)));
        assert_eq!(l, closed);
        assert_eq!(l.available(20), 100 - 5 - 10);
        let mut book: Book<&str> = Book::new(1);
        assert_eq!(book.ledger_mut("k").err(), Some(Refusal::UnknownKey));
        assert!(book.insert("k", l));
        assert!(!book.insert("other", Ledger::new(config(1, 1))));
        assert!(book.ledger_mut("k").is_ok());
    }

    #[test]
    fn grants_follow_demand_weighted_shares() {
        let mut l = Ledger::new(config(100, 100));
        assert_eq!(l.grant(&"a", 30, 0, 500).map(|g| g.amount), Ok(30));
        // b asks 90 while a holds 30 (demand 30): b's share of 100 is 75.
        assert_eq!(l.grant(&"b", 90, 0, 500).map(|g| g.amount), Ok(70));
        assert!(matches!(
            l.grant(&"c", 10, 0, 500),
            Err(Refusal::Exhausted { .. })
        ));
        // A lease ends at the owner's now + ttl and is then consumed, not freed.
        assert_eq!(l.available(500), 0);
    }
}
