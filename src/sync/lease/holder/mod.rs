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
use super::rpc::{self, CallError};
use super::{MemberAddr, View};
use crate::actor::credit::{Credit, CreditTable};
use crate::actor::{Binding, Dimension};
use crate::sync::parts::NodeParts;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tollgate_cluster::lease::budget::Snapshot;
use tollgate_cluster::lease::line::{SyncReply, SyncRequest};
use tollgate_cluster::lease::rendezvous;

/// The id the holder loop gives Redis as a key's owner (`redis-lease`).
pub(crate) const REDIS_OWNER: &str = "redis";

/// Shortest gap between two rounds woken by actors (coalesces a burst of wakes).
const MIN_WAKE_GAP: Duration = Duration::from_millis(5);

/// Failed batches in a row after which an owner is stated to on the sync
/// interval's rounds only ([`Round::Woken`]). One failure is retried at once: a
/// single timed-out call (in `redis-lease` one key's 15 ms timeout fails the
/// whole round, and Redis owns every key) would otherwise hold every refill
/// back by up to an interval.
const FAILURES_BEFORE_BACKOFF: u32 = 2;

/// Settings of the holder loop.
pub(crate) struct HolderSettings {
    /// Cluster id sent with every batch.
    pub cluster_id: String,
    /// Tags statements and checks the owners' answers.
    pub auth: std::sync::Arc<crate::sync::auth::RpcAuth>,
    /// Heartbeat rhythm (and the regular round).
    pub sync_interval: Duration,
    /// Credit life.
    pub ttl: Duration,
    /// The base window's length, to turn demand per window into a rate (demand
    /// is measured over the base window for every key, the day's included).
    pub window_ms: u64,
    /// Most credit per holder, as a fraction of L.
    pub max_credit: f64,
    /// RPC timeout.
    pub rpc_timeout: Duration,
}

/// The holder loop's state.
pub(crate) struct Holder {
    node: Arc<NodeParts>,
    owners: Box<dyn Owners>,
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
    /// Owners this node cannot reach now (for `/admin/cluster` and metrics).
    pub cut_off: Arc<RwLock<Vec<String>>>,
    /// What this holder keeps per key, as of its last round (for
    /// `/admin/cluster`'s `held`).
    pub held: Arc<HolderHeld>,
}

/// The per-key entries a holder keeps, counted each round.
#[derive(Debug, Default)]
pub(crate) struct HolderHeld {
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
pub(crate) enum Round {
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
type Answered = Result<Vec<Result<SyncReply, String>>, CallError>;

impl Holder {
    /// A holder loop over `node`'s credit bindings.
    pub(crate) fn new(
        node: Arc<NodeParts>,
        owners: Box<dyn Owners>,
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
            cut_off: Arc::default(),
            held: Arc::default(),
        }
    }

    /// Runs rounds every sync interval and whenever an actor asks, until `stop`.
    pub(crate) async fn run(mut self, mut stop: watch::Receiver<bool>) {
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
    pub(crate) async fn round(&mut self, round: Round) {
        let view = self.view.read().clone();
        if view.members.is_empty() {
            return;
        }
        self.prepare(&view);
        let now_ms = self.now_ms();
        let mut batches = Batches::new();
        // One seq for every statement of an unused key this round: per key it
        // grows from round to round, and one per key in a round would run the
        // floor (and with it every used key's seq) ahead of the clock by the
        // number of such keys, ending credits early.
        let nothing_held_seq = now_ms.max(self.nothing_held_seq + 1);
        let due = Due {
            view: &view,
            round,
            nothing_held_seq,
            now_ms,
        };
        self.state_unused(&due, &mut batches);
        self.state_active(&due, &mut batches);
        self.count_held(now_ms);
        if batches.is_empty() {
            return;
        }
        self.send_batches(batches, &view, round).await;
        self.publish_cut_off();
    }

    /// What changed since the last round: owners gone, keys moved or asked
    /// for, credits made.
    fn prepare(&mut self, view: &View) {
        if self.owners.are_members() {
            // An owner gone from the members owns nothing any more (its keys moved,
            // and `owner_changed` dropped what it told): no longer "cut off from
            // it". Without this a crashed owner would stay listed, and the node
            // degraded, for as long as the process runs (the scale simulation's
            // owner crash at 3 and 5 nodes shows it).
            (self.unreachable).retain(|id, _| view.members.iter().any(|m| m.id == *id));
        }
        self.publish_cut_off();
        self.mark_moved(view);
        // An owner asked for these: its rebuilt line waits for them (its view
        // moved, this node's did not), or it has room again for an ask it
        // refused (its gate opened, or a bucket left the window). Each is
        // stated at this round; one asked in vain asks again at once with what
        // it asked for, not left to the next interval's round. Not as if its
        // owner had changed: that would drop the told figure, which a node cut
        // off from its owner in one direction only could then not serve on. If
        // the owner did move, the round sees it in the view, and a rebuilt line
        // reads the figure the statement says it holds.
        for i in self.owners.take_restates() {
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
        self.take_new_credits(view);
    }

    /// States "nothing held" for the keys never used here that are due.
    fn state_unused(&mut self, due: &Due<'_>, batches: &mut Batches) {
        let unused = self.unused_to_state(due.round);
        for &i in &unused {
            // Never used here: nothing held, nothing to renew. Stated as such to
            // a new owner (its rebuilt line waits to hear from every live
            // holder; on a graceful stop too), and to Redis on a graceful stop
            // if it keeps a reservation for this node.
            let key = &self.node.bindings[i as usize].key;
            let Some(owner) = self.owners.owner_of(due.view, key) else {
                continue;
            };
            if self.retried_next_round(owner, due.round) {
                continue;
            }
            let snapshot = nothing_held(due.nothing_held_seq, due.now_ms);
            add_to_batch(batches, owner, (i as usize, snapshot));
        }
        if !unused.is_empty() {
            self.nothing_held_seq = due.nothing_held_seq;
        }
    }

    /// States every key used here that is due; drops the credits at rest.
    fn state_active(&mut self, due: &Due<'_>, batches: &mut Batches) {
        // Out of `self` for the loop, which also reads `self`; put back after it.
        let mut active = std::mem::take(&mut self.active);
        // Idle keys with nothing due: their credits may be at rest.
        let mut resting = Vec::new();
        for (&i, key) in active.iter_mut() {
            let binding = &self.node.bindings[i as usize];
            let Some(owner) = self.owners.owner_of(due.view, &binding.key) else {
                continue;
            };
            // Before anything is taken from the key (its ask stays for that round).
            if self.retried_next_round(owner, due.round)
                || asked_in_vain_this_interval(key, owner, due.round)
            {
                continue;
            }
            match self.statement(i, key, owner, due) {
                Statement::Send(snapshot) => add_to_batch(batches, owner, (i as usize, snapshot)),
                Statement::Nothing { idle } => {
                    if due.round != Round::ReturnAll && idle {
                        resting.push(i);
                    }
                }
            }
        }
        self.active = active;
        for i in resting {
            self.drop_at_rest(i, due.now_ms);
        }
    }

    /// Sends every owner's batch at once and adopts the answers.
    async fn send_batches(&mut self, batches: Batches, view: &View, round: Round) {
        let this = &*self;
        let sends = batches.into_values().map(|(owner, items)| async move {
            let sender = Sender {
                node: &this.node,
                client: &this.client,
                settings: &this.settings,
            };
            let parts = this.owners.send(sender, &owner, items, view, round).await;
            (owner, parts)
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
    }

    /// When the members changed since the last round, marks every key never used
    /// here whose owner moved with them (the new owner hears "nothing held").
    fn mark_moved(&mut self, view: &View) {
        if !self.owners.are_members()
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
                .then(|| (self.owners).owner_of(view, &self.node.bindings[i as usize].key))
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
        let reservations = self.owners.reservations_kept(now_ms);
        (self.held.active).store(self.active.len(), Ordering::Relaxed);
        (self.held.reservations).store(reservations, Ordering::Relaxed);
    }

    /// The keys never used here to state "nothing held" for this round: those
    /// unsettled, and on a graceful stop also those `redis-lease` keeps a
    /// reservation for.
    fn unused_to_state(&self, round: Round) -> Vec<u32> {
        let mut unused: Vec<u32> = self.unsettled.ids().collect();
        if round == Round::ReturnAll && !self.owners.are_members() {
            let bindings = self.node.bindings.iter().enumerate();
            let reserved = bindings.filter(|(i, b)| {
                b.leased
                    && !self.unsettled.contains(*i as u32)
                    && !self.active.contains_key(&(*i as u32))
                    && self.owners.reservation(&b.key, self.now_ms()) > 0
            });
            unused.extend(reserved.map(|(i, _)| i as u32));
            unused.sort_unstable();
        }
        unused
    }

    /// Tells the engine (status, `degraded`) which owners this node cannot reach.
    fn publish_cut_off(&self) {
        let cut: Vec<String> = self.unreachable.keys().cloned().collect();
        *self.cut_off.write() = cut;
    }

    fn ttl_ms(&self) -> u64 {
        self.settings.ttl.as_millis() as u64
    }
}

/// This round's batches: per owner id, the owner and its statements.
type Batches = BTreeMap<String, (MemberAddr, Items)>;

/// What decides which statements are due this round.
struct Due<'a> {
    view: &'a View,
    round: Round,
    /// The seq of this round's statements of nothing held.
    nothing_held_seq: u64,
    now_ms: u64,
}

/// Whether a key used here is stated this round.
enum Statement {
    /// Nothing due; `idle`: its credit may be at rest.
    Nothing { idle: bool },
    /// This statement.
    Send(Snapshot),
}

mod answers;
mod owners;
mod peers;
mod plan;
mod redis_owner;
mod statement;
#[cfg(test)]
mod tests;

pub(crate) use owners::Owners;
use owners::Sender;
pub(crate) use peers::PeerOwners;
pub(crate) use plan::max_credit;
use plan::*;
pub(crate) use redis_owner::RedisOwner;
