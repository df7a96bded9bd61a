//! The holder side: a loop, off the request path, that states each active key to
//! its owner and adopts the answer. A key is stated when its owner changed (the
//! re-announce a new owner waits for), when its actor ran low or was refused
//! (woken at once, unless its owner failed the last two batches or its last ask
//! this interval was granted nothing: then at the next interval's round,
//! [`Round::Woken`]), or as a heartbeat every ttl/3 while it holds credit or usage;
//! a heartbeat with nothing spent since the last statement returns the unused
//! credit, and a graceful stop returns all of it.
//! Statements for one owner travel in one batch; batches to different owners go
//! out concurrently, each bounded by the RPC timeout.

use super::bits::Bits;
use super::owner::OwnerBook;
use super::reservations::Reservations;
use super::rpc::{self, CallError};
use super::wire::{self, Entry};
use super::{MemberAddr, View};
use crate::actor::Dimension;
use crate::actor::credit::{Credit, CreditTable};
use crate::redis::{LeaseAsk, LeaseLine, RedisStore, Reserve, ScopeKeys};
use crate::sync::parts::NodeParts;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tollgate_cluster::lease::budget::Snapshot;
use tollgate_cluster::lease::line::{SyncReply, SyncRequest};
use tollgate_cluster::lease::rendezvous;
use tollgate_cluster::membership::RPC_VERSION;

/// The id the holder loop gives Redis as a key's owner (`redis-lease`).
pub const REDIS_OWNER: &str = "redis";

/// Redis as every key's owner (`redis-lease`; no RPC address).
static REDIS: std::sync::LazyLock<MemberAddr> = std::sync::LazyLock::new(|| MemberAddr {
    id: REDIS_OWNER.to_owned(),
    rpc: String::new(),
    rpc_version: RPC_VERSION,
});

/// Who owns the keys.
pub enum Owners {
    /// `lease`: each key's owner among the live members (rendezvous hashing),
    /// this node's own book directly, the others over the internal RPC.
    Peers(Arc<OwnerBook>),
    /// `redis-lease`: Redis owns every key (`lease.lua`).
    Redis {
        /// The store.
        store: RedisStore,
        /// Key prefix.
        prefix: String,
        /// Bucket width of the shared window.
        bucket_ms: u64,
    },
}

/// Shortest gap between two rounds woken by actors (coalesces a burst of wakes).
const MIN_WAKE_GAP: Duration = Duration::from_millis(5);

/// Failed batches in a row after which an owner is stated to on the sync
/// interval's rounds only ([`Round::Woken`]). One failure is retried at once: a
/// single timed-out call (in `redis-lease` one key's 15 ms timeout fails the
/// whole round, and Redis owns every key) would otherwise hold every refill
/// back by up to an interval.
const FAILURES_BEFORE_BACKOFF: u32 = 2;

/// Settings of the holder loop.
pub struct HolderSettings {
    /// Cluster id sent with every batch.
    pub cluster_id: String,
    /// Shared secret.
    pub secret: String,
    /// Heartbeat rhythm (and the regular round).
    pub sync_interval: Duration,
    /// Credit life.
    pub ttl: Duration,
    /// Window length, to turn demand per window into a rate.
    pub window_ms: u64,
    /// Most credit per holder, as a fraction of L.
    pub max_credit: f64,
    /// RPC timeout.
    pub rpc_timeout: Duration,
}

/// The holder loop's state.
pub struct Holder {
    node: Arc<NodeParts>,
    owners: Owners,
    view: Arc<RwLock<Arc<View>>>,
    client: reqwest::Client,
    settings: HolderSettings,
    /// The node's credits (`None`: no leased key).
    credits: Option<Arc<CreditTable>>,
    /// The keys used here (credit made and not dropped at rest), by binding index.
    active: BTreeMap<u32, ActiveKey>,
    /// Keys never used here whose "nothing held" their owner has not accepted
    /// yet, by binding index: every key at start (a new owner's rebuilt line
    /// waits to hear from every live holder), then those whose owner moved or
    /// asked. A bit per key: nothing else of an unused key is kept here.
    unsettled: Bits,
    /// The member ids the unsettled bits were last checked against.
    members: Vec<String>,
    /// The seq of the last statement of a key never used here (its made budget's
    /// statements come after it).
    nothing_held_seq: u64,
    /// The owners whose last batch failed (this node is cut off from them), each
    /// with its failed batches in a row.
    unreachable: BTreeMap<String, u32>,
    /// `redis-lease`: the reservation Redis last confirmed per key: the cut-off
    /// share.
    reserved: Mutex<Reservations>,
    /// Owners this node cannot reach now (for `/admin/cluster` and metrics).
    pub cut_off: Arc<RwLock<Vec<String>>>,
    /// What this holder keeps per key, as of its last round (for
    /// `/admin/cluster`'s `held`).
    pub held: Arc<HolderHeld>,
}

/// The per-key entries a holder keeps, counted each round.
#[derive(Debug, Default)]
pub struct HolderHeld {
    /// Keys used here whose credit is not dropped at rest yet.
    pub active: AtomicUsize,
    /// `redis-lease`: keys whose reservation Redis still keeps for this node.
    pub reservations: AtomicUsize,
}

/// What the holder remembers of a key used here, between rounds. Only keys used
/// here have one, keyed by binding index: a key never used here has one bit, in
/// [`Holder::unsettled`] (maps keyed by a copy of each configured key's name
/// would cost ~350 B per lease key at rest).
#[derive(Debug, Clone)]
struct ActiveKey {
    credit: Credit,
    /// The owner that accepted the last statement (`None`: state to it again).
    owner: Option<Arc<str>>,
    /// When it was last stated (ms; 0: never).
    stated_ms: u64,
    /// Its usage figure at the last statement.
    used: Option<u64>,
    /// What it aimed to hold at its last statement (grows while it runs dry).
    target: u64,
    /// Its last statement asked for more and was granted nothing, or was
    /// refused: asked again at the next interval's round, not on every ask
    /// ([`Round::Woken`]).
    asked_in_vain: bool,
    /// The actor's ask its last statement carried, as the largest cost it
    /// could not pay (`None`: no ask, at most the one unit a key in use asks
    /// to keep its figure). Only such an ask, refused, is asked in vain, and
    /// it stands again with that cost (`Credit::ask_again`).
    asked: Option<u64>,
    /// Its owner asked it to state (a nudge): stated at the next round even if
    /// nothing else is due, to the same owner without dropping its figure.
    restate_due: bool,
}

/// What a round does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// State what is due (owner changed, asked for, heartbeat), renew, return unused.
    Normal,
    /// As `Normal`, started by an actor asking for credit rather than the sync
    /// interval: keys whose owner failed the last [`FAILURES_BEFORE_BACKOFF`]
    /// batches in a row, and keys whose last ask was granted nothing or refused,
    /// are left to the next `Normal` round. An actor refused for want of credit
    /// asks again as soon as an answer wakes it (an unreachable one, or one that
    /// leaves it credit it cannot use: its last slot in use, a cost above what
    /// it holds), so without this the holder would re-send every few
    /// milliseconds while requests wait: a test owner refusing every batch would
    /// read ~211 batches in 1.5 s instead of the 15 of one per 100 ms round, and
    /// one granting nothing more than a slot in use ~212 statements of that key
    /// instead of 15 (tests/it/cluster_lease.rs).
    Woken,
    /// Graceful stop: return every credit.
    ReturnAll,
}

type Items = Vec<(usize, Snapshot)>;
/// One key's `redis-lease` ask: its reservation, and the held members with floors.
type RedisAsk = (Option<Reserve>, Vec<(String, u64)>);
type Answered = Result<Vec<Result<SyncReply, String>>, CallError>;

/// What [`credit_target`] decides from.
struct TargetInputs {
    /// This node's demand over the window (cost per window).
    demand: u64,
    window_ms: u64,
    /// How long the credit should last (four sync intervals).
    horizon_ms: u64,
    /// Cost spent since the last statement, and how long ago that was (`None`:
    /// never stated).
    spent_since: u64,
    elapsed_ms: Option<u64>,
    /// The actor was refused or ran low since, and the largest cost refused (0:
    /// it only ran low).
    wanted: bool,
    wanted_cost: u64,
    last_target: u64,
    cap: u64,
}

/// Credit a holder holds and has not spent is committed at its owner, so with
/// every holder holding its horizon's worth, about `horizon / W` of L sits idle
/// where no request needs it. The horizon is four sync intervals (a refill is a
/// round away long before the credit runs out), but at most `W /
/// HORIZON_PARTS_OF_WINDOW`: four 200 ms intervals are 1.3% of a 60 s window,
/// and 16% of the harness's 5 s one (four intervals ahead there, holders keep
/// ~2.3 of 40 unspent while their owners find L committed, and lease trails
/// `local split`; docs/BENCHMARKS.md, "`hot-tenant` at 3 nodes"), or most of a
/// per-second limit.
const HORIZON_PARTS_OF_WINDOW: u64 = 50;

/// How long a holder's windowed credit should last ([`HORIZON_PARTS_OF_WINDOW`]).
fn horizon_ms(sync_interval: Duration, window_ms: u64) -> u64 {
    (4 * sync_interval.as_millis() as u64)
        .min(window_ms / HORIZON_PARTS_OF_WINDOW)
        .max(1)
}

/// What a holder aims to hold for a windowed key: enough for the horizon at the
/// faster of its rate over the window and its rate since its last statement, and
/// twice its last target when its actor ran dry meanwhile; at least the one
/// request it could not pay; at most `cap`. Over the window alone, a node whose
/// load has just risen (or that has just started: its window not yet full) would
/// ask for a few milliseconds' worth each round and its requests would queue for
/// credit (in lease mode at 64 connections, ~250 statements/s and 1% of requests
/// waiting over 32 ms).
fn credit_target(t: &TargetInputs) -> u64 {
    let over_window = t.demand.saturating_mul(t.horizon_ms) / t.window_ms.max(1);
    let recent = t.elapsed_ms.map_or(0, |elapsed| {
        t.spent_since.saturating_mul(t.horizon_ms) / elapsed.max(1)
    });
    // A refusal (a cost it could not pay), not merely running low: a low-water
    // wake is the ordinary refill, and doubling on it would climb to max_credit.
    let grown = if t.wanted && t.wanted_cost > 0 {
        t.last_target.saturating_mul(2)
    } else {
        0
    };
    (over_window.max(recent).max(grown))
        .max(t.wanted_cost)
        .max(u64::from(t.wanted))
        .min(t.cap)
}

/// The statement of a key never used here: no usage, no credit, wants nothing,
/// adopted no reply (what a new budget states).
fn nothing_held(seq: u64, now_ms: u64) -> Snapshot {
    Snapshot {
        request: SyncRequest {
            seq,
            ..SyncRequest::default()
        },
        at_ms: now_ms,
        cut_off_spent: 0,
        refunded: 0,
    }
}

/// Whether `key`, asked for in a [`Round::Woken`] round, waits for the next
/// `Normal` one: its last ask was granted nothing or refused within this
/// interval (each `Normal` round forgets it, so a key gone quiet asks at once
/// when its next burst comes). Not when its owner moved: the new owner hears
/// from it at once (a rebuilt line waits for it). A key refused per key has no
/// owner recorded and waits.
fn asked_in_vain_this_interval(key: &mut ActiveKey, owner: &MemberAddr, round: Round) -> bool {
    waits_for_the_interval(
        &mut key.asked_in_vain,
        key.owner.as_deref(),
        &owner.id,
        round,
    )
}

/// [`asked_in_vain_this_interval`] on the key's flag and its recorded owner.
fn waits_for_the_interval(
    asked_in_vain: &mut bool,
    recorded_owner: Option<&str>,
    owner: &str,
    round: Round,
) -> bool {
    if round != Round::Woken {
        *asked_in_vain = false;
        return false;
    }
    let owner_moved = recorded_owner.is_some_and(|o| o != owner);
    *asked_in_vain && !owner_moved
}

/// Adds `item` to `owner`'s batch (its id and address copied once per batch, not
/// per key).
fn add_to_batch(
    batches: &mut BTreeMap<String, (MemberAddr, Items)>,
    owner: &MemberAddr,
    item: (usize, Snapshot),
) {
    match batches.get_mut(&owner.id) {
        Some((_, items)) => items.push(item),
        None => {
            batches.insert(owner.id.clone(), (owner.clone(), vec![item]));
        }
    }
}

/// Most credit one holder holds for a key of capacity `capacity`.
pub fn max_credit(capacity: u64, fraction: f64) -> u64 {
    ((capacity as f64 * fraction).floor() as u64).clamp(1, capacity.max(1))
}

impl Holder {
    /// A holder loop over `node`'s credit bindings.
    pub fn new(
        node: Arc<NodeParts>,
        owners: Owners,
        view: Arc<RwLock<Arc<View>>>,
        settings: HolderSettings,
    ) -> Holder {
        let mut unsettled = Bits::default();
        for (i, _) in (node.bindings.iter().enumerate()).filter(|(_, b)| b.leased) {
            unsettled.set(i as u32, true);
        }
        Holder {
            credits: node.credits.clone(),
            active: BTreeMap::new(),
            unsettled,
            members: Vec::new(),
            nothing_held_seq: 0,
            node,
            owners,
            view,
            client: rpc::client(settings.rpc_timeout),
            settings,
            unreachable: BTreeMap::new(),
            reserved: Mutex::default(),
            cut_off: Arc::default(),
            held: Arc::default(),
        }
    }

    /// Runs rounds every sync interval and whenever an actor asks, until `stop`.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let wake = self.node.credit_wake.clone();
        let mut ticker = tokio::time::interval(self.settings.sync_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Stop first: a node going away states nothing more (its credit ends
            // with its ttl at the owners, as a crash would).
            let round = tokio::select! {
                biased;
                stopped = stop.changed() => {
                    // A graceful stop (not a dropped handle) gives credit back at
                    // once instead of letting it run out its ttl.
                    if stopped.is_ok() && *stop.borrow() {
                        self.round(Round::ReturnAll).await;
                    }
                    break;
                }
                _ = ticker.tick() => Round::Normal,
                () = wake.notified() => {
                    tokio::time::sleep(MIN_WAKE_GAP).await;
                    Round::Woken
                }
            };
            self.round(round).await;
        }
    }

    fn now_ms(&self) -> u64 {
        self.node.registry.clock().now_ns() / 1_000_000
    }

    /// One round: snapshot what is due, send, adopt.
    pub async fn round(&mut self, round: Round) {
        let view = self.view.read().unwrap_or_else(|p| p.into_inner()).clone();
        if view.members.is_empty() {
            return;
        }
        if matches!(self.owners, Owners::Peers(_)) {
            // An owner gone from the members owns nothing any more (its keys moved,
            // and `owner_changed` dropped what it told): no longer "cut off from
            // it". Without this a crashed owner would stay listed, and the node
            // degraded, for as long as the process runs (the scale simulation's
            // owner crash at 3 and 5 nodes shows it).
            (self.unreachable).retain(|id, _| view.members.iter().any(|m| m.id == *id));
        }
        self.publish_cut_off();
        self.mark_moved(&view);
        if let Owners::Peers(book) = &self.owners {
            // An owner asked for these: its rebuilt line waits for them (its
            // view moved, this node's did not), or it has room again for an ask
            // it refused (its gate opened, or a bucket left the window). Each
            // is stated at this round; one asked in vain asks again at once
            // with what it asked for, not left to the next interval's round.
            // Not as if its owner had changed: that would drop the told figure,
            // which a node cut off from its owner in one direction only could
            // then not serve on. If the owner did move, the round sees it in the
            // view, and a rebuilt line reads the figure the statement says it
            // holds.
            for i in book.take_restates() {
                match self.active.get_mut(&(i as u32)) {
                    Some(key) => {
                        key.restate_due = true;
                        if std::mem::take(&mut key.asked_in_vain) {
                            key.credit.ask_again(key.asked.unwrap_or(0));
                        }
                    }
                    None => self.unsettled.set(i as u32, true),
                }
            }
        }
        self.take_new_credits(&view);
        let now_ms = self.now_ms();
        let mut batches: BTreeMap<String, (MemberAddr, Items)> = BTreeMap::new();
        // One seq for every statement of an unused key this round: per key it
        // grows from round to round, and one per key in a round would run the
        // floor (and with it every used key's seq) ahead of the clock by the
        // number of such keys, ending credits early.
        let nothing_held_seq = now_ms.max(self.nothing_held_seq + 1);
        let unused = self.unused_to_state(round);
        for &i in &unused {
            // Never used here: nothing held, nothing to renew. Stated as such to
            // a new owner (its rebuilt line waits to hear from every live
            // holder; on a graceful stop too), and to Redis on a graceful stop
            // if it keeps a reservation for this node.
            let Some(owner) = self.owner_of(&view, &self.node.bindings[i as usize].key) else {
                continue;
            };
            if self.retried_next_round(owner, round) {
                continue;
            }
            add_to_batch(
                &mut batches,
                owner,
                (i as usize, nothing_held(nothing_held_seq, now_ms)),
            );
        }
        if !unused.is_empty() {
            self.nothing_held_seq = nothing_held_seq;
        }
        // Out of `self` for the loop, which also reads `self`; put back after it.
        let mut active = std::mem::take(&mut self.active);
        // Idle keys with nothing due: their credits may be at rest.
        let mut resting = Vec::new();
        for (&i, key) in active.iter_mut() {
            let binding = &self.node.bindings[i as usize];
            let Some(owner) = self.owner_of(&view, &binding.key) else {
                continue;
            };
            // Before anything is taken from the key (its ask stays for that round).
            if self.retried_next_round(owner, round)
                || asked_in_vain_this_interval(key, owner, round)
            {
                continue;
            }
            let credit = &key.credit;
            let moved = key.owner.as_deref() != Some(owner.id.as_str());
            let (wanted, wanted_cost) = credit.take_wanted();
            key.asked = wanted.then_some(wanted_cost);
            if moved && matches!(self.owners, Owners::Peers(_)) {
                // What the previous owner kept for this node went with it.
                credit.with(|b| b.owner_changed());
            }
            let (idle, held, used) =
                credit.with(|b| (b.is_idle(now_ms), b.credit(now_ms), b.used(now_ms)));
            let last = key.stated_ms;
            let heartbeat = now_ms.saturating_sub(last) >= self.ttl_ms() / 3;
            // Read under one lock:
            // - a key still cut off is stated every round (every interval's round
            //   once its owner failed twice in a row): when its owner answers
            //   again it must leave the cut-off (and report its spending) at once;
            // - a key gone idle still holding a told cut-off share states once
            //   more, giving it back: the owner charges that figure until it hears
            //   so (without this, an idle holder leaves it charged for good);
            // - a reply that lowered the told figure is confirmed by one more
            //   statement, or the owner keeps charging the old one for good.
            let (cut_off, holds_figure, owes) =
                credit.with(|b| (b.is_cut_off(), b.told_share() > 0, b.owes_statement()));
            // A graceful stop gives back credit, a figure it holds (the owner
            // charges it until told), and a `redis-lease` reservation (peers
            // would otherwise keep it for this node until it is collected).
            let returning = round == Round::ReturnAll
                && (held > 0 || holds_figure || self.reservation(&binding.key) > 0);
            // Its owner asked for a statement (a rebuilt line waits for it, or
            // room came back for an ask it refused).
            let restate_due = std::mem::take(&mut key.restate_due);
            if !(moved
                || restate_due
                || wanted
                || returning
                || cut_off
                || owes
                || ((!idle || holds_figure) && heartbeat))
            {
                if round != Round::ReturnAll && idle {
                    resting.push(i);
                }
                continue;
            }
            // Nothing spent since the last statement: give unused credit back, so
            // nodes whose demand moved on do not hold capacity others need.
            let unused = (heartbeat || restate_due) && !wanted && key.used == Some(used);
            if returning || (unused && held > 0) {
                credit.with(|b| b.return_credit(now_ms));
            }
            let spent_since = key.used.map_or(0, |before| used.saturating_sub(before));
            key.used = Some(used);
            let max = max_credit(binding.capacity, self.settings.max_credit);
            // What this holder aims to hold: slots up to max_credit while in use;
            // windowed credit for about four sync intervals at the recent rate.
            let target = match binding.dimension {
                _ if round == Round::ReturnAll || (unused && !moved) => 0,
                Dimension::Concurrency if wanted || !idle => max,
                Dimension::Concurrency => 0,
                _ => credit_target(&TargetInputs {
                    demand: view.demand.get(&*binding.key).copied().unwrap_or(0),
                    window_ms: self.settings.window_ms,
                    horizon_ms: horizon_ms(self.settings.sync_interval, self.settings.window_ms),
                    spent_since,
                    elapsed_ms: (last > 0).then(|| now_ms.saturating_sub(last)),
                    wanted,
                    wanted_cost,
                    last_target: key.target,
                    // At most max_credit, or the one request that costs more.
                    cap: max.max(wanted_cost).min(binding.capacity),
                }),
            };
            key.target = target;
            let want = match binding.dimension {
                Dimension::Concurrency => target,
                _ => target.saturating_sub(held),
            };
            // Woken again once the credit falls below half of the target, so the
            // refill is a round away long before it runs out. (Half of `want` is
            // near 0 whenever a round finds the credit nearly full: the actor
            // would then run dry and its requests queue for the next round.)
            credit.set_low_water(target / 2);
            // After any statement of nothing held made before the credit was. A
            // stopping node gives its figures back too; a serving one keeps those
            // of keys in use (`Budget::snapshot`).
            let snapshot = credit.with(|b| {
                b.keep_seq_above(nothing_held_seq);
                match round {
                    Round::ReturnAll => b.final_snapshot(now_ms),
                    _ => b.snapshot(want, now_ms),
                }
            });
            key.stated_ms = now_ms;
            add_to_batch(&mut batches, owner, (i as usize, snapshot));
        }
        self.active = active;
        for i in resting {
            self.drop_at_rest(i, now_ms);
        }
        self.count_held(now_ms);
        if batches.is_empty() {
            return;
        }
        let this = &*self;
        let sends = batches.into_values().map(|(owner, items)| {
            let view = &view;
            async move {
                let parts = this.send(&owner, items, view, round).await;
                (owner, parts)
            }
        });
        let results = futures_util::future::join_all(sends).await;
        for (owner, parts) in results {
            // Each batch's answers are adopted on their own; an owner that failed
            // any batch is unreachable this round.
            let failed = parts.iter().find_map(|(_, a)| a.as_ref().err());
            self.note_batches(&owner, failed);
            for (items, answered) in parts {
                self.adopt(&owner, items, answered);
            }
        }
        self.publish_cut_off();
    }

    /// Records how `owner` answered this round's batches: `failed`, the first
    /// failure, if any.
    fn note_batches(&mut self, owner: &MemberAddr, failed: Option<&CallError>) {
        match failed {
            Some(e) => {
                let failures = self.unreachable.entry(owner.id.clone()).or_insert(0);
                *failures += 1;
                if *failures == 1 {
                    tracing::warn!(owner = %owner.id, error = %e, "lease owner unreachable: spending the credit held, then the cut-off policy");
                }
            }
            None => {
                if self.unreachable.remove(&owner.id).is_some() {
                    tracing::info!(owner = %owner.id, "lease owner reachable again");
                }
            }
        }
    }

    /// Whether statements to `owner` wait for the next `Normal` round: in a
    /// `Woken` round, an owner that failed its last [`FAILURES_BEFORE_BACKOFF`]
    /// batches. The skipped key keeps its ask (`take_wanted` is not called), so
    /// that round takes it; meanwhile its actor does not wake the loop again
    /// (`Credit::want` notifies once per ask), which also means a key whose
    /// owner moves meanwhile is stated to the new one at that round, up to an
    /// interval later.
    fn retried_next_round(&self, owner: &MemberAddr, round: Round) -> bool {
        round == Round::Woken
            && (self.unreachable.get(&owner.id)).is_some_and(|n| *n >= FAILURES_BEFORE_BACKOFF)
    }

    /// `key`'s owner in `view` (Redis for every key in `redis-lease`).
    fn owner_of<'v>(&self, view: &'v View, key: &str) -> Option<&'v MemberAddr> {
        match &self.owners {
            Owners::Peers(_) => view.owner(key),
            Owners::Redis { .. } => Some(&REDIS),
        }
    }

    /// When the members changed since the last round, marks every key never used
    /// here whose owner moved with them (the new owner hears "nothing held").
    fn mark_moved(&mut self, view: &View) {
        if !matches!(self.owners, Owners::Peers(_))
            || (view.members.iter().map(|m| &m.id)).eq(self.members.iter())
        {
            return;
        }
        let before = &self.members;
        // Before the first round every key is unsettled already.
        if !before.is_empty() {
            let bindings = self.node.bindings.iter().enumerate();
            for (i, binding) in
                bindings.filter(|(i, b)| b.leased && !self.active.contains_key(&(*i as u32)))
            {
                let key = &*binding.key;
                let was = rendezvous::owner(key, before).map(String::as_str);
                if was != view.owner(key).map(|m| m.id.as_str()) {
                    self.unsettled.set(i as u32, true);
                }
            }
        }
        self.members = view.members.iter().map(|m| m.id.clone()).collect();
    }

    /// Takes the credits actors made since the last round. A key whose "nothing
    /// held" the current owner accepted starts with that owner (its first
    /// statement is the actor's ask, not a restatement).
    fn take_new_credits(&mut self, view: &View) {
        let Some(table) = &self.credits else {
            return;
        };
        for (i, credit) in table.take_made() {
            let settled = !self.unsettled.contains(i);
            self.unsettled.set(i, false);
            let owner = settled
                .then(|| self.owner_of(view, &self.node.bindings[i as usize].key))
                .flatten()
                .map(|m| Arc::from(m.id.as_str()));
            (self.active).insert(
                i,
                ActiveKey {
                    credit,
                    owner,
                    stated_ms: 0,
                    used: None,
                    target: 0,
                    asked_in_vain: false,
                    asked: None,
                    restate_due: false,
                },
            );
        }
    }

    /// Drops key `i`'s credit if its budget is at rest and its actor has stopped
    /// (the table's check), so that a key used once and idle since costs what a
    /// key never used here does: its credit (~200 B, and a usage map node of
    /// ~190 B per windowed key) and the holder's entry would be ~1.4 KB of a 3-key
    /// tenant used once per node (docs/BENCHMARKS.md, "Used once, now idle: the
    /// census"). The key's owner accepted
    /// its last statement (a key whose owner did not is stated, never at rest
    /// here), so it stays settled; the next credit for it states above the
    /// dropped one's last seq.
    fn drop_at_rest(&mut self, i: u32, now_ms: u64) {
        let Some(table) = &self.credits else {
            return;
        };
        // The holder's own handle is the one besides the table's.
        if let Some(last_seq) = table.drop_at_rest(i, 1, now_ms) {
            self.active.remove(&i);
            self.nothing_held_seq = self.nothing_held_seq.max(last_seq);
        }
    }

    /// Counts what this holder keeps per key for `/admin/cluster`. Lapsed
    /// `redis-lease` reservations are dropped first: with no statement going
    /// out (every key idle), one would otherwise stay until the next statement.
    fn count_held(&self, now_ms: u64) {
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        reserved.drop_lapsed(now_ms);
        (self.held.active).store(self.active.len(), Ordering::Relaxed);
        (self.held.reservations).store(reserved.len(), Ordering::Relaxed);
    }

    /// The keys never used here to state "nothing held" for this round: those
    /// unsettled, and on a graceful stop also those `redis-lease` keeps a
    /// reservation for.
    fn unused_to_state(&self, round: Round) -> Vec<u32> {
        let mut unused: Vec<u32> = self.unsettled.ids().collect();
        if round == Round::ReturnAll && matches!(self.owners, Owners::Redis { .. }) {
            let bindings = self.node.bindings.iter().enumerate();
            let reserved = bindings.filter(|(i, b)| {
                b.leased
                    && !self.unsettled.contains(*i as u32)
                    && !self.active.contains_key(&(*i as u32))
                    && self.reservation(&b.key) > 0
            });
            unused.extend(reserved.map(|(i, _)| i as u32));
            unused.sort_unstable();
        }
        unused
    }

    /// Tells the engine (status, `degraded`) which owners this node cannot reach.
    fn publish_cut_off(&self) {
        let cut: Vec<String> = self.unreachable.keys().cloned().collect();
        *self.cut_off.write().unwrap_or_else(|p| p.into_inner()) = cut;
    }

    fn ttl_ms(&self) -> u64 {
        self.settings.ttl.as_millis() as u64
    }

    /// States `items` to `owner`: each part with its answers (one part, unless
    /// a peer's statements fill more than one batch).
    async fn send(
        &self,
        owner: &MemberAddr,
        items: Items,
        view: &View,
        round: Round,
    ) -> Vec<(Items, Answered)> {
        let bindings = &self.node.bindings;
        let book = match &self.owners {
            Owners::Peers(book) => book,
            Owners::Redis {
                store,
                prefix,
                bucket_ms,
            } => {
                let answered =
                    (self.send_redis(store, prefix, *bucket_ms, &items, view, round)).await;
                return vec![(items, answered)];
            }
        };
        if owner.id == view.self_id {
            let answers = (items.iter())
                .map(|(i, s)| {
                    let key = &bindings[*i].key;
                    (book.sync(&view.self_id, key, &s.request))
                        .map_err(|e| super::wire::refusal_code(&e).to_owned())
                })
                .collect();
            book.send_asks_again();
            return vec![(items, Ok(answers))];
        }
        let entries = (items.iter())
            .map(|(i, s)| Entry::new(&bindings[*i].key, &s.request).readable_by(owner.rpc_version))
            .collect();
        let batches = wire::batches(
            &self.settings.cluster_id,
            &view.self_id,
            entries,
            wire::SEND_BODY_BYTES,
        );
        // Usually one; all at once when more, each answered in order.
        let calls = (batches.iter())
            .map(|batch| rpc::call(&self.client, &owner.rpc, &self.settings.secret, batch));
        let answered = futures_util::future::join_all(calls).await;
        let mut rest = items;
        let mut parts = Vec::with_capacity(batches.len());
        for (batch, answers) in batches.iter().zip(answered) {
            let after = rest.split_off(batch.entries.len().min(rest.len()));
            let part = std::mem::replace(&mut rest, after);
            let answers = answers.map(|a| a.into_iter().map(|a| a.into_result()).collect());
            parts.push((part, answers));
        }
        parts
    }

    /// `redis-lease`: one `lease.lua` call per key, all concurrently on the
    /// multiplexed connection. Each asks Redis to reserve this node's share of L
    /// (by gossiped demand) and to keep the reservations of members that lost
    /// Redis or gossip; the reservation confirmed is what this node spends per
    /// window if Redis is lost, and Redis keeps every holder's charge at least its
    /// reservation, so the cluster stays within L (docs/design/redis.md).
    async fn send_redis(
        &self,
        store: &RedisStore,
        prefix: &str,
        bucket_ms: u64,
        items: &Items,
        view: &View,
        round: Round,
    ) -> Answered {
        let sent_ms = self.now_ms();
        let asks: Vec<RedisAsk> = (items.iter())
            .map(|(i, _)| {
                let binding = &self.node.bindings[*i];
                let terms = view.terms_for(&binding.key, binding.capacity);
                let reserve = terms.map(|t| match round {
                    Round::ReturnAll => Reserve {
                        share: 0,
                        borrow: 0,
                    },
                    Round::Normal | Round::Woken => Reserve {
                        share: t.shares.get(&view.self_id).copied().unwrap_or(0),
                        borrow: t.borrow,
                    },
                });
                // Held members, each with the floor Redis charges it if it has no
                // account of it: its share (or frozen floor) in this view.
                let held = (view.redis_held.iter())
                    .filter(|m| **m != view.self_id)
                    .map(|m| {
                        let floor = terms.and_then(|t| t.floors.get(m).or(t.shares.get(m)));
                        (m.clone(), floor.copied().unwrap_or(0))
                    })
                    .collect();
                (reserve, held)
            })
            .collect();
        {
            // Until Redis confirms, the cut-off share is at most what this statement
            // asks: if the answer is lost, Redis may already hold the smaller figure.
            let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
            for ((i, _), (reserve, _)) in items.iter().zip(&asks) {
                let ask = reserve.map_or(0, |r| r.share);
                reserved.lower_to(&self.node.bindings[*i].key, ask);
            }
        }
        let calls = items
            .iter()
            .zip(&asks)
            .map(|((i, snapshot), (reserve, held))| {
                let binding = &self.node.bindings[*i];
                let dimension = binding.dimension;
                let line = LeaseLine {
                    windowed: dimension != Dimension::Concurrency,
                    capacity: binding.capacity,
                    window_ms: self.settings.window_ms,
                    bucket_ms,
                    max_credit: max_credit(binding.capacity, self.settings.max_credit),
                    ttl_ms: self.ttl_ms(),
                };
                let key = ScopeKeys::lease(prefix, &binding.scope.to_string(), dimension.as_str());
                let reserve = *reserve;
                async move {
                    let ask = LeaseAsk { reserve, held };
                    let leased = store
                        .lease(&key, &view.self_id, &line, &snapshot.request, &ask)
                        .await;
                    if crate::audit::enabled()
                        && let Ok(Ok(leased)) = &leased
                    {
                        let r = &snapshot.request;
                        crate::audit::record(&crate::audit::Event::Stated {
                            key: &binding.key,
                            seq: r.seq,
                            sent_ms,
                            answered_ms: self.now_ms(),
                            redis_ms: leased.redis_ms,
                            usage: &r.usage,
                            remaining: r.remaining,
                            want: r.want,
                            credit: leased.reply.credit,
                            granted: leased.reply.granted,
                            reserved: leased.reserved,
                        });
                    }
                    (binding.key.clone(), leased)
                }
            });
        let results = futures_util::future::join_all(calls).await;
        let mut out = Vec::with_capacity(items.len());
        let mut unreachable = None;
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        reserved.drop_lapsed(self.now_ms());
        // Every confirmed reservation is recorded, even when another key's call
        // failed (its figure may be smaller than the one held here).
        for (key, result) in results {
            match result {
                Ok(Ok(leased)) => {
                    let until = sent_ms.saturating_add(self.ttl_ms());
                    reserved.confirm(&key, leased.reserved, until);
                    out.push(Ok(leased.reply));
                }
                Ok(Err(code)) => out.push(Err(code)),
                Err(e) => unreachable = Some(CallError::Unreachable(e.to_string())),
            }
        }
        match unreachable {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The reservation Redis keeps for this node on `key` now (`redis-lease`).
    fn reservation(&self, key: &str) -> u64 {
        let reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        reserved.at(key, self.now_ms())
    }

    /// Marks `key` cut off from its owner. What it may then use per window, credit
    /// included (policy `share`): with peer owners, the share the owner told it
    /// with the last reply it adopted (the owner charges it until a statement says
    /// a later reply was adopted, whatever either side's view of demand); in
    /// `redis-lease`, the reservation Redis still keeps for it (none once lapsed).
    fn cut_off(&self, credit: &Credit, key: &str) {
        match &self.owners {
            Owners::Peers(_) => credit.with(|b| b.cut_off_by_owner()),
            Owners::Redis { .. } => {
                let share = self.reservation(key);
                credit.with(|b| b.set_cut_off(Some(share)));
            }
        }
    }

    fn adopt(&mut self, owner: &MemberAddr, items: Items, answered: Answered) {
        let now_ms = self.now_ms();
        let metrics = &self.node.metrics;
        let answers = match answered {
            Ok(answers) => answers,
            Err(_) => {
                // Policy `share`: the told share per window once the credit ends.
                // (A key never used here holds nothing, and stays unsettled.)
                for (i, _) in &items {
                    let binding = &self.node.bindings[*i];
                    if let Some(key) = self.active.get(&(*i as u32)) {
                        self.cut_off(&key.credit, &binding.key);
                    }
                    self.node.registry.wake(&binding.scope);
                    metrics.lease_statement("holder", "unreachable");
                }
                return;
            }
        };
        // One shared name for every key this owner answered.
        let owner_id: Arc<str> = owner.id.as_str().into();
        for ((i, snapshot), answer) in items.into_iter().zip(answers) {
            let binding = &self.node.bindings[i];
            let key = self.active.get_mut(&(i as u32));
            match answer {
                Ok(reply) => {
                    match key {
                        Some(key) => {
                            key.credit.with(|b| {
                                b.apply(&snapshot, &reply, now_ms);
                                b.set_cut_off(None);
                            });
                            key.owner = Some(owner_id.clone());
                            key.asked_in_vain = key.asked.is_some()
                                && snapshot.request.want > 0
                                && reply.granted == 0;
                        }
                        // Its owner heard "nothing held" (a credit made since
                        // starts from this owner: `take_new_credits`).
                        None => self.unsettled.set(i as u32, false),
                    }
                    let outcome = if reply.granted > 0 {
                        "granted"
                    } else {
                        "nothing_granted"
                    };
                    metrics.lease_statement("holder", outcome);
                    if reply.credit > 0 {
                        self.node.registry.wake(&binding.scope);
                    }
                }
                Err(code) => {
                    if code != "not_owner" && code != "stale" {
                        tracing::warn!(key = %binding.key, owner = %owner.id, %code, "lease statement refused");
                    }
                    metrics.lease_statement("holder", "refused");
                    // Stated again next round (views of the membership may differ
                    // for a moment).
                    match key {
                        Some(key) => {
                            key.owner = None;
                            key.asked_in_vain = true;
                            if code == "not_owner" && matches!(self.owners, Owners::Peers(_)) {
                                // It no longer keeps anything for this node.
                                key.credit.with(|b| b.owner_changed());
                            }
                        }
                        None => self.unsettled.set(i as u32, true),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease node "a" whose view is `members`, with `tenants` tenants of two
    /// leased keys each (requests, tokens), and a holder over them.
    fn holder(tenants: usize) -> Holder {
        let mut text = String::from(
            r#"
[cluster]
cluster_id = "t"
node_id = "a"
gossip_listen = "127.0.0.1:1"
rpc_listen = "127.0.0.1:2"
seeds = []
secret = "holder-test-secret-0123456789abcdef"
mode = "lease"

[[upstreams]]
id = "u"
kind = "openai"
base_url = "http://127.0.0.1:1/v1"

[[routes]]
models = ["*"]
upstreams = ["u"]
"#,
        );
        for t in 0..tenants {
            text.push_str(&format!(
                "[[tenants]]\nid = \"t{t}\"\napi_key_hashes = [\"sha256:{t:064x}\"]\nrpm = 100\ntpm = 1000\n"
            ));
        }
        let config = crate::config::Config::from_toml(&text, "test.toml").expect("config");
        let state = Arc::new(crate::proxy::AppState::new(config).expect("state"));
        let state = Arc::new(state.sync_parts(None));
        let window = tollgate_cluster::counter::Window::try_new(60_000, 60).expect("window");
        let keys = super::super::owner::KeyTable::new(state.bindings.clone(), window, 0.25, 3_000)
            .expect("keys");
        let view = Arc::new(RwLock::new(view(&["a", "b"])));
        let book = OwnerBook::new(
            keys,
            view.clone(),
            Arc::new(Mutex::new(tollgate_cluster::counter::ClusterUsage::new(
                window,
            ))),
            state.registry.clock(),
            state.metrics.clone(),
            None,
            None,
        );
        let settings = HolderSettings {
            cluster_id: "t".into(),
            secret: String::new(),
            sync_interval: Duration::from_millis(200),
            ttl: Duration::from_secs(3),
            window_ms: 60_000,
            max_credit: 0.25,
            rpc_timeout: Duration::from_millis(100),
        };
        Holder::new(state, Owners::Peers(Arc::new(book)), view, settings)
    }

    fn view(members: &[&str]) -> Arc<View> {
        Arc::new(View {
            self_id: "a".into(),
            members: (members.iter())
                .map(|m| MemberAddr {
                    id: (*m).into(),
                    rpc: format!("127.0.0.1:1/{m}"),
                    rpc_version: RPC_VERSION,
                })
                .collect(),
            settled: true,
            ..View::default()
        })
    }

    fn leased(holder: &Holder) -> Vec<u32> {
        (0..holder.node.bindings.len() as u32).collect()
    }

    /// `owner`'s answers to `keys`, each accepted (`Ok`) or refused with `code`.
    fn answer(holder: &mut Holder, owner: &str, keys: &[u32], code: Option<&str>) {
        let owner = MemberAddr {
            id: owner.into(),
            rpc: String::new(),
            rpc_version: RPC_VERSION,
        };
        let items = (keys.iter())
            .map(|i| (*i as usize, nothing_held(1, 1)))
            .collect();
        let reply = SyncReply {
            credit: 0,
            granted: 0,
            ttl_ms: 3_000,
            cut_off_share: 0,
        };
        let answers = (keys.iter())
            .map(|_| code.map_or(Ok(reply), |c| Err(c.to_owned())))
            .collect();
        holder.adopt(&owner, items, Ok(answers));
    }

    #[tokio::test]
    async fn an_unused_key_is_stated_again_only_when_its_owner_moves_or_refuses() {
        let mut holder = holder(30);
        let all = leased(&holder);
        assert_eq!(all.len(), 60);
        // At start every key is stated (a new owner waits to hear from all).
        let two = view(&["a", "b"]);
        holder.mark_moved(&two);
        assert_eq!(holder.unused_to_state(Round::Normal), all);
        for owner in ["a", "b"] {
            let owned: Vec<u32> = (all.iter().copied())
                .filter(|i| {
                    two.owner(&holder.node.bindings[*i as usize].key)
                        .unwrap()
                        .id
                        == owner
                })
                .collect();
            answer(&mut holder, owner, &owned, None);
        }
        assert!(
            holder.unused_to_state(Round::Normal).is_empty(),
            "all settled"
        );
        holder.mark_moved(&two);
        assert!(
            holder.unused_to_state(Round::Normal).is_empty(),
            "same members"
        );
        // c joins: exactly the keys it takes are stated (to c).
        let three = view(&["a", "b", "c"]);
        holder.mark_moved(&three);
        let moved: Vec<u32> = (all.iter().copied())
            .filter(|i| {
                let key = &holder.node.bindings[*i as usize].key;
                two.owner(key).unwrap().id != three.owner(key).unwrap().id
            })
            .collect();
        assert!(!moved.is_empty() && moved.len() < all.len(), "{moved:?}");
        assert_eq!(holder.unused_to_state(Round::Normal), moved);
        // Refused (c's view lags): stated again; unreachable: still unsettled.
        answer(&mut holder, "c", &moved[..1], Some("not_owner"));
        holder.adopt(
            &three.members[2],
            moved[1..]
                .iter()
                .map(|i| (*i as usize, nothing_held(2, 2)))
                .collect(),
            Err(CallError::Unreachable("down".into())),
        );
        assert_eq!(holder.unused_to_state(Round::Normal), moved);
        answer(&mut holder, "c", &moved, None);
        assert!(holder.unused_to_state(Round::Normal).is_empty());
        // A refusal after an acceptance (views differ for a moment) states it again.
        answer(&mut holder, "c", &moved[..1], Some("not_owner"));
        assert_eq!(holder.unused_to_state(Round::Normal), moved[..1]);
    }

    /// A holder of `tenants` tenants on members a and b, whose key 0's owner
    /// accepted "nothing held" (the others' have not yet): the view, that owner
    /// and the node's credit table.
    fn key_0_settled(tenants: usize) -> (Holder, Arc<View>, String, Arc<CreditTable>) {
        let mut holder = holder(tenants);
        let two = view(&["a", "b"]);
        holder.mark_moved(&two);
        let owner0 = two.owner(&holder.node.bindings[0].key).unwrap().id.clone();
        answer(&mut holder, &owner0, &[0], None);
        let table = holder.node.credits.clone().expect("lease table");
        (holder, two, owner0, table)
    }

    #[tokio::test]
    async fn a_credit_made_after_its_owner_heard_nothing_held_starts_with_that_owner() {
        let (mut holder, two, owner0, table) = key_0_settled(2);
        let (first, second) = (table.get_or_make(0), table.get_or_make(1));
        holder.take_new_credits(&two);
        let owner_of = |i: u32| holder.active[&i].owner.as_deref().map(str::to_owned);
        assert_eq!(owner_of(0), Some(owner0));
        assert_eq!(owner_of(1), None, "stated to its owner first");
        assert_eq!(
            holder.unused_to_state(Round::Normal),
            vec![2, 3],
            "only unused keys"
        );
        // Used keys keep their own owner: a members change marks no bit for them.
        holder.mark_moved(&view(&["a", "b", "c", "d", "e"]));
        assert!(
            holder
                .unused_to_state(Round::Normal)
                .iter()
                .all(|i| *i >= 2)
        );
        // Their answers reach their budgets; an unreachable owner cuts them off.
        let b = &two.members[1];
        holder.adopt(
            b,
            vec![(0, nothing_held(3, 3)), (1, nothing_held(3, 3))],
            Err(CallError::Unreachable("down".into())),
        );
        assert!(first.with(|b| b.is_cut_off()) && second.with(|b| b.is_cut_off()));
        holder.take_new_credits(&two);
        assert_eq!(holder.active.len(), 2, "each credit taken once");
    }

    #[tokio::test]
    async fn a_used_key_at_rest_is_dropped_and_its_next_credit_states_above_it() {
        let (mut holder, two, owner0, table) = key_0_settled(1);
        let actor = table.get_or_make(0);
        holder.take_new_credits(&two);
        actor.with(|b| b.keep_seq_above(5_000));
        holder.drop_at_rest(0, 1);
        assert!(holder.active.contains_key(&0), "its actor still runs");
        drop(actor);
        holder.drop_at_rest(0, 1);
        assert!(
            holder.active.is_empty() && table.get(0).is_none(),
            "dropped"
        );
        assert!(
            !holder.unused_to_state(Round::Normal).contains(&0),
            "still settled"
        );
        assert!(
            holder.nothing_held_seq >= 5_000,
            "{}",
            holder.nothing_held_seq
        );
        // Used again: a new credit, starting with the owner that heard the last.
        let _again = table.get_or_make(0);
        holder.take_new_credits(&two);
        assert_eq!(holder.active[&0].owner.as_deref(), Some(owner0.as_str()));
    }

    /// Only a refused statement that carried an actor's ask is asked in vain:
    /// the one unit a key in use asks to keep its figure, granted nothing, is
    /// not: a nudge would otherwise turn that unit into a horizon's worth of
    /// credit, through `Credit::ask_again` (docs/design/lease.md, "Room offered
    /// as it comes back").
    #[tokio::test]
    async fn only_a_refused_actors_ask_is_asked_in_vain() {
        let (mut holder, two, owner0, table) = key_0_settled(1);
        let _actor = table.get_or_make(0);
        holder.take_new_credits(&two);
        let owner = (two.members.iter())
            .find(|m| m.id == owner0)
            .unwrap()
            .clone();
        let nothing_granted = SyncReply {
            credit: 0,
            granted: 0,
            ttl_ms: 3_000,
            cut_off_share: 5,
        };
        for (asked, in_vain) in [(None, false), (Some(0), true), (Some(40), true)] {
            holder.active.get_mut(&0).unwrap().asked = asked;
            let mut asks_one_unit = nothing_held(10, 10);
            asks_one_unit.request.want = 1;
            holder.adopt(
                &owner,
                vec![(0, asks_one_unit)],
                Ok(vec![Ok(nothing_granted)]),
            );
            assert_eq!(holder.active[&0].asked_in_vain, in_vain, "asked {asked:?}");
        }
    }

    fn inputs() -> TargetInputs {
        TargetInputs {
            demand: 0,
            window_ms: 60_000,
            horizon_ms: 400,
            spent_since: 0,
            elapsed_ms: None,
            wanted: false,
            wanted_cost: 0,
            last_target: 0,
            cap: 1_000_000,
        }
    }

    #[test]
    fn the_credit_horizon_is_four_intervals_but_at_most_a_fiftieth_of_the_window() {
        let interval = Duration::from_millis(200);
        // A minute: four intervals (1.3% of W).
        assert_eq!(horizon_ms(interval, 60_000), 800);
        // The harness's 5 s window: 100 ms, not 16% of W.
        assert_eq!(horizon_ms(interval, 5_000), 100);
        // A per-second limit: 20 ms; never 0.
        assert_eq!(horizon_ms(interval, 1_000), 20);
        assert_eq!(horizon_ms(interval, 10), 1);
    }

    #[test]
    fn a_key_asked_in_vain_waits_for_the_intervals_round_once() {
        let mut flag = true;
        let woken = |flag: &mut bool, recorded: Option<&str>| {
            waits_for_the_interval(flag, recorded, "b", Round::Woken)
        };
        assert!(woken(&mut flag, Some("b")), "same owner: waits");
        assert!(
            woken(&mut flag, None),
            "refused per key (no owner recorded): waits"
        );
        assert!(
            !woken(&mut flag, Some("c")),
            "its owner moved: asks the new one"
        );
        assert!(!waits_for_the_interval(
            &mut flag,
            Some("b"),
            "b",
            Round::Normal
        ));
        assert!(!flag, "the interval's round forgets it");
        assert!(!woken(&mut flag, Some("b")), "a later burst asks at once");
        let mut flag = true;
        assert!(!waits_for_the_interval(
            &mut flag,
            Some("b"),
            "b",
            Round::ReturnAll
        ));
    }

    #[test]
    fn an_owner_is_left_to_the_intervals_rounds_after_two_failures_in_a_row() {
        let mut holder = holder(1);
        let owner = MemberAddr {
            id: "b".into(),
            rpc: String::new(),
            rpc_version: RPC_VERSION,
        };
        let down = CallError::Unreachable("refused".into());
        let skipped = |h: &Holder| {
            if h.retried_next_round(&owner, Round::Woken) {
                "woken: skipped"
            } else {
                "woken: sent"
            }
        };
        assert_eq!(skipped(&holder), "woken: sent");
        holder.note_batches(&owner, Some(&down));
        assert_eq!(
            skipped(&holder),
            "woken: sent",
            "one failure is retried at once"
        );
        holder.note_batches(&owner, Some(&down));
        assert_eq!(skipped(&holder), "woken: skipped");
        assert!(
            !holder.retried_next_round(&owner, Round::Normal),
            "every interval"
        );
        assert!(!holder.retried_next_round(&owner, Round::ReturnAll));
        holder.note_batches(&owner, None);
        assert_eq!(skipped(&holder), "woken: sent", "an answer clears it");
    }

    #[test]
    fn the_target_follows_the_faster_of_the_window_and_the_recent_rate() {
        // 60,000 per window: 1,000/s, 400 for the horizon.
        let steady = TargetInputs {
            demand: 60_000,
            ..inputs()
        };
        assert_eq!(credit_target(&steady), 400);
        // Just started (window nearly empty) but spending 9,000/s: 3,600.
        let ramp = TargetInputs {
            demand: 900,
            spent_since: 900,
            elapsed_ms: Some(100),
            ..inputs()
        };
        assert_eq!(credit_target(&ramp), 3_600);
        assert_eq!(credit_target(&TargetInputs { cap: 1_000, ..ramp }), 1_000);
    }

    #[test]
    fn a_holder_that_ran_dry_doubles_its_target() {
        let dry = TargetInputs {
            wanted: true,
            wanted_cost: 1,
            last_target: 60,
            ..inputs()
        };
        assert_eq!(credit_target(&dry), 120);
        // Only ran low (the ordinary refill): no doubling.
        let low = TargetInputs {
            wanted_cost: 0,
            ..dry
        };
        assert_eq!(credit_target(&low), 1);
        // At least the one request that could not be paid, and at least 1.
        let big = TargetInputs {
            wanted_cost: 5_000,
            ..dry
        };
        assert_eq!(credit_target(&big), 5_000);
        let first = TargetInputs {
            wanted: true,
            wanted_cost: 1,
            ..inputs()
        };
        assert_eq!(credit_target(&first), 1);
        assert_eq!(credit_target(&inputs()), 0, "idle: nothing");
    }
}
