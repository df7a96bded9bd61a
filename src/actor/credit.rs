//! `lease` mode's credit for one limit key, shared by the key's actor (spends and
//! refunds on every decision: one uncontended mutex) and the sync engine (states it
//! to the key's owner and adopts the reply, off the request path). The state
//! machine itself is [`tollgate_cluster::lease::budget::Budget`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use tokio::sync::Notify;
use tollgate_cluster::counter::Window;
use tollgate_cluster::lease::budget::{Budget, CutOffPolicy, Spent};
use tollgate_cluster::lease::line::Kind;

/// One key's credit on this node. Its state is made at the key's first use
/// here: a key never used costs this handle only (~64 B), where the state costs
/// ~210 B, most of a configured lease key that never sees a request
/// (docs/design/scale.md). The sync engine reads only made ones
/// ([`Credit::is_made`]); a key without one holds nothing.
#[derive(Clone, Debug)]
pub struct Credit(Arc<Slot>);

#[derive(Debug)]
struct Slot {
    /// The limit key (for the lease audit), shared with its binding.
    key: Arc<str>,
    /// Slots (concurrency) rather than a windowed dimension.
    slots: bool,
    recipe: Arc<CreditRecipe>,
    state: OnceLock<Box<State>>,
}

/// What every credit of a node is made from.
#[derive(Debug)]
pub struct CreditRecipe {
    /// The cluster window of windowed keys.
    pub window: Window,
    /// What a holder spends while cut off from its owner.
    pub policy: CutOffPolicy,
    /// Wakes the engine's holder loop.
    pub wake: Arc<Notify>,
}

#[derive(Debug)]
struct State {
    budget: Mutex<Budget>,
    /// Below this much credit the engine is woken to renew early.
    low_water: AtomicU64,
    /// The actor was refused for lack of credit (or ran low) since the last statement.
    wanted: AtomicBool,
    /// The largest single cost that was refused for lack of credit (so the next
    /// statement asks at least that much).
    wanted_cost: AtomicU64,
}

impl Credit {
    /// `key`'s credit, made from `recipe` at its first use.
    pub fn new(key: Arc<str>, slots: bool, recipe: Arc<CreditRecipe>) -> Credit {
        Credit(Arc::new(Slot {
            key,
            slots,
            recipe,
            state: OnceLock::new(),
        }))
    }

    /// Whether its state was made (the key was used here since start).
    pub fn is_made(&self) -> bool {
        self.0.state.get().is_some()
    }

    fn state(&self) -> &State {
        self.0.state.get_or_init(|| {
            let kind = if self.0.slots {
                Kind::Slots
            } else {
                Kind::Windowed(self.0.recipe.window)
            };
            Box::new(State {
                budget: Mutex::new(Budget::new(kind, self.0.recipe.policy)),
                low_water: AtomicU64::new(0),
                wanted: AtomicBool::new(false),
                wanted_cost: AtomicU64::new(0),
            })
        })
    }

    fn lock(&self) -> MutexGuard<'_, Budget> {
        self.state()
            .budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
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
            Some(_) if left < self.state().low_water.load(Ordering::Relaxed) => self.want(0),
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
        self.state().wanted_cost.fetch_max(cost, Ordering::Relaxed);
        if !self.state().wanted.swap(true, Ordering::Relaxed) {
            self.0.recipe.wake.notify_one();
        }
    }

    /// The engine: whether the actor asked for more since the last call, and the
    /// largest cost it could not pay (both reset).
    pub fn take_wanted(&self) -> (bool, u64) {
        let cost = self.state().wanted_cost.swap(0, Ordering::Relaxed);
        (self.state().wanted.swap(false, Ordering::Relaxed), cost)
    }

    /// The engine: sets the low-water mark.
    pub fn set_low_water(&self, low_water: u64) {
        self.state().low_water.store(low_water, Ordering::Relaxed);
    }

    /// The engine: runs `f` on the budget under its lock (snapshot, apply, cut-off).
    pub fn with<R>(&self, f: impl FnOnce(&mut Budget) -> R) -> R {
        f(&mut self.lock())
    }

    /// Reads the budget if it was made (`None`: never used here, nothing held).
    pub fn peek<R>(&self, f: impl FnOnce(&Budget) -> R) -> Option<R> {
        self.is_made().then(|| f(&self.lock()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credit_is_made_at_its_first_use_and_not_by_reading_it() {
        let recipe = Arc::new(CreditRecipe {
            window: Window::try_new(1_000, 10).expect("window"),
            policy: CutOffPolicy::Share,
            wake: Arc::default(),
        });
        let credit = Credit::new("tenant:t:tokens".into(), false, recipe);
        let shared = credit.clone();
        assert!(!credit.is_made());
        assert_eq!(credit.peek(|b| b.credit(0)), None, "reading makes nothing");
        assert!(!credit.is_made());
        // The actor's first decision makes it (and, with nothing held, asks the
        // engine for credit).
        assert!(!credit.can_spend(1, 0));
        assert!(shared.is_made(), "one state for every handle");
        assert_eq!(shared.take_wanted(), (true, 1));
        assert_eq!(shared.peek(|b| b.credit(0)), Some(0));
    }
}
