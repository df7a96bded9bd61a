//! `lease` mode's credit for one limit key, shared by the key's actor (spends and
//! refunds on every decision: one uncontended mutex) and the sync engine (states it
//! to the key's owner and adopts the reply, off the request path). The state
//! machine itself is [`tollgate_cluster::lease::budget::Budget`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::Notify;
use tollgate_cluster::lease::budget::{Budget, Spent};

/// One key's credit on this node.
#[derive(Clone, Debug)]
pub struct Credit(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// The limit key (for the lease audit).
    key: Arc<str>,
    budget: Mutex<Budget>,
    /// Below this much credit the engine is woken to renew early.
    low_water: AtomicU64,
    /// The actor was refused for lack of credit (or ran low) since the last statement.
    wanted: AtomicBool,
    /// The largest single cost that was refused for lack of credit (so the next
    /// statement asks at least that much).
    wanted_cost: AtomicU64,
    wake: Arc<Notify>,
}

impl Credit {
    /// `key`'s credit over `budget`; `wake` wakes the engine's holder loop.
    pub fn new(key: &str, budget: Budget, wake: Arc<Notify>) -> Credit {
        Credit(Arc::new(Inner {
            key: key.into(),
            budget: Mutex::new(budget),
            low_water: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
            wanted_cost: AtomicU64::new(0),
            wake,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Budget> {
        self.0.budget.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `cost` could be spent now; if not, asks the engine for more.
    pub fn can_spend(&self, cost: u64, now_ms: u64) -> bool {
        let ok = self.lock().can_spend(cost, now_ms);
        if !ok {
            self.want(cost);
        }
        ok
    }

    /// Spends `cost` (or takes a slot), waking the engine when the credit runs low.
    pub fn try_spend(&self, cost: u64, now_ms: u64) -> Option<Spent> {
        let (spent, left) = {
            let mut budget = self.lock();
            let spent = budget.try_spend(cost, now_ms);
            if spent.is_some_and(|s| s.from_credit) && crate::sync::lease::audit::enabled() {
                crate::sync::lease::audit::record(&crate::sync::lease::audit::Event::Spend {
                    key: &self.0.key,
                    seq: budget.adopted_seq(),
                    cost,
                    at_ms: now_ms,
                });
            }
            (spent, budget.credit(now_ms))
        };
        match spent {
            None => self.want(cost),
            Some(_) if left < self.0.low_water.load(Ordering::Relaxed) => self.want(0),
            Some(_) => {}
        }
        spent
    }

    /// Moves a spend to the bucket of `now_ms`, when the upstream answered (see
    /// [`Budget::redate`]).
    pub fn redate(&self, spent: Spent, cost: u64, now_ms: u64) -> Spent {
        self.lock().redate(spent, cost, now_ms)
    }

    /// Corrects a spend to its real cost at `now_ms` (see [`Budget::settle`]).
    pub fn settle(&self, spent: Spent, reserved: u64, actual: u64, now_ms: u64) {
        self.lock().settle(spent, reserved, actual, now_ms);
    }

    fn want(&self, cost: u64) {
        self.0.wanted_cost.fetch_max(cost, Ordering::Relaxed);
        if !self.0.wanted.swap(true, Ordering::Relaxed) {
            self.0.wake.notify_one();
        }
    }

    /// The engine: whether the actor asked for more since the last call, and the
    /// largest cost it could not pay (both reset).
    pub fn take_wanted(&self) -> (bool, u64) {
        let cost = self.0.wanted_cost.swap(0, Ordering::Relaxed);
        (self.0.wanted.swap(false, Ordering::Relaxed), cost)
    }

    /// The engine: sets the low-water mark.
    pub fn set_low_water(&self, low_water: u64) {
        self.0.low_water.store(low_water, Ordering::Relaxed);
    }

    /// The engine: runs `f` on the budget under its lock (snapshot, apply, cut-off).
    pub fn with<R>(&self, f: impl FnOnce(&mut Budget) -> R) -> R {
        f(&mut self.lock())
    }
}

/// Credits of a scope's dimensions (`lease` mode); `None` = not leased.
#[derive(Clone, Debug, Default)]
pub struct Credits {
    /// Requests per window.
    pub requests: Option<Credit>,
    /// Tokens per window.
    pub tokens: Option<Credit>,
    /// Requests in flight (slots).
    pub concurrency: Option<Credit>,
}

impl Credits {
    /// Whether any dimension is leased.
    pub fn any(&self) -> bool {
        self.requests.is_some() || self.tokens.is_some() || self.concurrency.is_some()
    }
}
