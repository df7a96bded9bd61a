//! `lease` mode's credit for one limit key, shared by the key's actor (spends and
//! refunds on every decision: one uncontended mutex) and the sync engine (states it
//! to the key's owner and adopts the reply, off the request path). The state
//! machine itself is [`tollgate_cluster::lease::budget::Budget`]. A node's
//! credits live in its [`CreditTable`], made at each key's first use.

use crate::actor::Binding;
use crate::actor::Dimension;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::Notify;
use tollgate_cluster::counter::Windows;
use tollgate_cluster::lease::budget::{Budget, CutOffPolicy, Spent};
use tollgate_cluster::lease::line::Kind;

/// One key's credit on this node, made by the node's [`CreditTable`] when the
/// key's actor first starts here.
#[derive(Clone, Debug)]
pub struct Credit(Arc<State>);

/// What every credit of a node is made from.
#[derive(Debug)]
pub struct CreditRecipe {
    /// The cluster windows of windowed keys (each key's by its name).
    pub windows: Windows,
    /// What a holder spends while cut off from its owner.
    pub policy: CutOffPolicy,
    /// Wakes the engine's holder loop.
    pub wake: Arc<Notify>,
}

#[derive(Debug)]
struct State {
    /// The limit key (for the lease audit), shared with its binding.
    key: Arc<str>,
    recipe: Arc<CreditRecipe>,
    budget: Mutex<Budget>,
    /// Below this much credit the engine is woken to renew early.
    low_water: AtomicU64,
    /// The actor was refused for lack of credit (or ran low) since the last statement.
    wanted: AtomicBool,
    /// The largest single cost that was refused for lack of credit (so the next
    /// statement asks at least that much).
    wanted_cost: AtomicU64,
}

/// The credits of a node's lease keys, made at each key's first use here: a key
/// never used on this node costs nothing here but its binding. A handle per
/// configured key, made or not, would be ~64 B of the ~1.1 KB an idle lease
/// tenant would then hold per node, the most of what would keep `lease` above
/// 1 KB where `gossip` is below it (docs/BENCHMARKS.md, "Idle tenants under
/// 1 KB").
#[derive(Debug)]
pub struct CreditTable {
    recipe: Arc<CreditRecipe>,
    /// The node's bindings; the credit ones are the keys this table makes for.
    bindings: Arc<[Binding]>,
    made: Mutex<Made>,
}

/// The credits made and not yet dropped at rest.
#[derive(Debug, Default)]
struct Made {
    by_binding: HashMap<u32, Credit>,
    /// Binding indices of credits made since the holder loop last took them.
    fresh: Vec<u32>,
}

impl CreditTable {
    /// The table of `bindings`' credit keys, none made yet.
    pub fn new(recipe: Arc<CreditRecipe>, bindings: Arc<[Binding]>) -> CreditTable {
        CreditTable {
            recipe,
            bindings,
            made: Mutex::default(),
        }
    }

    fn made(&self) -> MutexGuard<'_, Made> {
        self.made.lock()
    }

    /// The credit of binding `index`, made now if it was not yet.
    pub fn get_or_make(&self, index: u32) -> Credit {
        let mut made = self.made();
        if let Some(credit) = made.by_binding.get(&index) {
            return credit.clone();
        }
        let binding = &self.bindings[index as usize];
        let credit = Credit::new(
            binding.key.clone(),
            binding.dimension == Dimension::Concurrency,
            self.recipe.clone(),
        );
        made.by_binding.insert(index, credit.clone());
        made.fresh.push(index);
        credit
    }

    /// How many credits are made and not dropped at rest (`/admin/cluster`'s
    /// `held`).
    pub fn made_count(&self) -> usize {
        self.made().by_binding.len()
    }

    /// Each made credit's cut-off share as its owner told it (`Budget::told_share`;
    /// 0 for none), by binding index: what the engine publishes so that an owner
    /// that forgot it still charges it (docs/design/lease.md, "Double fault").
    pub fn told_shares(&self) -> Vec<(u32, u64)> {
        let credits: Vec<(u32, Credit)> = (self.made().by_binding.iter())
            .map(|(i, c)| (*i, c.clone()))
            .collect();
        // Each budget's lock taken after the table's is released.
        (credits.into_iter())
            .map(|(i, c)| (i, c.with(|b| b.told_share())))
            .collect()
    }

    /// The credit of binding `index` if it was made (`None`: never used here,
    /// nothing held).
    pub fn get(&self, index: u32) -> Option<Credit> {
        self.made().by_binding.get(&index).cloned()
    }

    /// The holder loop: the credits made since its last call, in the order they
    /// were made.
    pub fn take_made(&self) -> Vec<(u32, Credit)> {
        let mut made = self.made();
        let fresh = std::mem::take(&mut made.fresh);
        (fresh.into_iter())
            .filter_map(|i| made.by_binding.get(&i).map(|c| (i, c.clone())))
            .collect()
    }

    /// The holder loop: drops the credit of binding `index` if nobody but the
    /// table and `others` handles holds it (its actor has stopped) and its budget
    /// is at rest ([`Budget::is_at_rest`] at `now_ms`). Its last seq, for the
    /// next credit of the key to state above, if dropped. Under the table's lock,
    /// so an actor starting meanwhile finds either this credit or a new one.
    pub fn drop_at_rest(&self, index: u32, others: usize, now_ms: u64) -> Option<u64> {
        let mut made = self.made();
        let credit = made.by_binding.get(&index)?;
        if Arc::strong_count(&credit.0) != 1 + others {
            return None;
        }
        let last_seq = credit.with(|b| b.is_at_rest(now_ms).then(|| b.last_seq()))?;
        made.by_binding.remove(&index);
        tollgate_cluster::maps::shrink_if_sparse(&mut made.by_binding);
        Some(last_seq)
    }

    /// The credits of the scope whose first credit binding is `first`, made now
    /// (its actor starts).
    pub fn credits_for(&self, first: u32) -> Credits {
        let (mut windows, mut concurrency) = (WindowCredits::default(), None);
        let Some(scope) = self.bindings.get(first as usize).map(|b| &b.scope) else {
            return Credits::default();
        };
        let same_scope = (first as usize..self.bindings.len())
            .take_while(|i| self.bindings[*i].scope == *scope && self.bindings[*i].leased);
        for i in same_scope {
            let credit = Some(self.get_or_make(i as u32));
            let dimension = self.bindings[i].dimension;
            match dimension.window_index() {
                Some(w) => windows[w] = credit,
                None if dimension == Dimension::Concurrency => concurrency = credit,
                None => {}
            }
        }
        Credits::new(windows, concurrency)
    }
}

impl Credit {
    /// `key`'s credit, holding nothing (see [`CreditTable`] for a node's).
    pub fn new(key: Arc<str>, slots: bool, recipe: Arc<CreditRecipe>) -> Credit {
        let kind = if slots {
            Kind::Slots
        } else {
            Kind::Windowed(*recipe.windows.of(&key))
        };
        Credit(Arc::new(State {
            key,
            budget: Mutex::new(Budget::new(kind, recipe.policy)),
            recipe,
            low_water: AtomicU64::new(0),
            wanted: AtomicBool::new(false),
            wanted_cost: AtomicU64::new(0),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Budget> {
        self.0.budget.lock()
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
            if spent.is_some_and(|s| s.from_credit) && crate::audit::enabled() {
                crate::audit::record(&crate::audit::Event::Spend {
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
            self.0.recipe.wake.notify_one();
        }
    }

    /// The engine: an ask its owner refused stands again, with the largest
    /// cost it was made for (the owner asked for it once the refusal's cause, a
    /// rebuilt line's gate, was gone). Without the cost, a request above what
    /// the holder aims to hold would be granted the ordinary target, still could
    /// not be paid, and would ask once more a round trip later. No wake: the
    /// engine is in the round that takes it.
    pub fn ask_again(&self, cost: u64) {
        self.0.wanted_cost.fetch_max(cost, Ordering::Relaxed);
        self.0.wanted.store(true, Ordering::Relaxed);
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

/// Per window dimension, in [`Dimension::WINDOWED`] order.
type WindowCredits = [Option<Credit>; crate::actor::WINDOWS];

/// Credits of a scope's dimensions (`lease` mode); `None` = not leased. The
/// window credits are boxed, and only when one is leased: every configured
/// scope's spec holds a `Credits` for the node's life, empty but for the
/// scopes whose actors run in `lease` mode.
#[derive(Clone, Debug, Default)]
pub struct Credits {
    windows: Option<Box<WindowCredits>>,
    /// Requests in flight (slots).
    pub concurrency: Option<Credit>,
}

impl Credits {
    /// The credits of the window dimensions (in [`Dimension::WINDOWED`]
    /// order) and of the slots.
    pub fn new(windows: WindowCredits, concurrency: Option<Credit>) -> Credits {
        Credits {
            windows: windows
                .iter()
                .any(Option::is_some)
                .then(|| Box::new(windows)),
            concurrency,
        }
    }

    /// The credit of the window dimension at `index` in [`Dimension::WINDOWED`].
    pub fn window(&self, index: usize) -> Option<&Credit> {
        self.windows.as_ref()?.get(index)?.as_ref()
    }

    /// Whether any dimension is leased.
    pub fn any(&self) -> bool {
        self.windows.is_some() || self.concurrency.is_some()
    }

    /// Each dimension's credit: the window dimensions in
    /// [`Dimension::WINDOWED`] order, then the slots.
    pub fn each(&self) -> [(Option<&Credit>, Dimension); crate::actor::WINDOWS + 1] {
        std::array::from_fn(|i| match Dimension::WINDOWED.get(i) {
            Some(&dimension) => (self.window(i), dimension),
            None => (self.concurrency.as_ref(), Dimension::Concurrency),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe() -> Arc<CreditRecipe> {
        Arc::new(CreditRecipe {
            windows: tollgate_cluster::counter::Window::try_new(1_000, 10)
                .expect("window")
                .into(),
            policy: CutOffPolicy::Share,
            wake: Arc::default(),
        })
    }

    fn binding(scope: &str, dimension: Dimension) -> Binding {
        Binding {
            key: format!("tenant:{scope}:{}", dimension.as_str()).into(),
            scope: crate::actor::ScopeId::tenant(scope),
            dimension,
            capacity: 100,
            allowance: None,
            counts_cache_reads: false,
            leased: true,
        }
    }

    #[test]
    fn credits_are_made_at_their_scopes_first_use_and_only_then() {
        let recipe = recipe();
        let bindings: Arc<[Binding]> = Arc::from([
            binding("a", Dimension::Requests),
            binding("b", Dimension::Tokens),
            binding("b", Dimension::Concurrency),
            binding("c", Dimension::Requests),
        ]);
        let table = CreditTable::new(recipe, bindings);
        assert!(table.get(1).is_none(), "nothing made by reading");
        assert!(table.take_made().is_empty());
        // b's actor starts: its two keys, and no neighbour's.
        let credits = table.credits_for(1);
        assert!(credits.window(0).is_none());
        let (tokens, slots) = (
            credits.window(1).cloned().unwrap(),
            credits.concurrency.unwrap(),
        );
        let made: Vec<u32> = table.take_made().into_iter().map(|(i, _)| i).collect();
        assert_eq!(made, vec![1, 2]);
        assert!(table.get(0).is_none() && table.get(3).is_none());
        // One state for every handle: the engine sees what the actor asked for.
        assert!(!tokens.can_spend(5, 0), "nothing held yet");
        assert_eq!(table.get(1).unwrap().take_wanted(), (true, 5));
        assert!(!slots.can_spend(1, 0));
        // Made once: a restarted actor finds the same credits.
        table.credits_for(1);
        assert!(table.take_made().is_empty());
        table.credits_for(3);
        assert_eq!(table.take_made().len(), 1);
    }

    #[test]
    fn a_credit_at_rest_is_dropped_only_once_its_actor_has_stopped() {
        let recipe = recipe();
        let table = CreditTable::new(recipe, Arc::from([binding("a", Dimension::Requests)]));
        let actors = table.credits_for(0);
        let holders = table.take_made();
        let credit = actors.window(0).cloned().unwrap();
        // Spent from a granted credit: not at rest while that counts.
        credit.with(|b| {
            let s = b.snapshot(5, 1_000);
            let reply = tollgate_cluster::lease::line::SyncReply {
                credit: 5,
                granted: 5,
                ttl_ms: 3_000,
                cut_off_share: 0,
            };
            b.apply(&s, &reply, 1_000);
        });
        assert!(credit.try_spend(1, 1_000).is_some());
        drop(credit);
        assert_eq!(
            table.drop_at_rest(0, 1, 2_000),
            None,
            "the actor still holds it"
        );
        drop(actors);
        assert_eq!(
            table.drop_at_rest(0, 1, 2_000),
            None,
            "credit and usage left"
        );
        // Past the credit's ttl and the window: at rest, dropped with its seq.
        assert_eq!(table.drop_at_rest(0, 1, 10_000), Some(1_000));
        assert!(table.get(0).is_none());
        drop(holders);
        // Used again: a new credit, and the holder loop takes it anew.
        assert_eq!(
            table
                .credits_for(0)
                .window(0)
                .cloned()
                .unwrap()
                .with(|b| b.last_seq()),
            0
        );
        assert_eq!(table.take_made().len(), 1);
    }
}
