//! The owner side on this node: a credit line per key this node owns, answering
//! statements from holders (over the internal RPC, or this node's own holder
//! directly). Ownership is rendezvous hashing over the live members in the
//! engine's latest [`View`]; a key that moves away is dropped at once (fencing), a
//! key that arrives is rebuilt conservatively from the gossiped counters.

use super::View;
use super::bits::Bits;
use crate::actor::Binding;
use crate::actor::Dimension;
use crate::clock::Clock;
use crate::ops::metrics::Metrics;
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tollgate_cluster::counter::{ClusterUsage, Windows};
use tollgate_cluster::lease::line::{ConfigError, Kind, Line, LineConfig, SyncReply, SyncRequest};
use tollgate_cluster::lease::rendezvous;
use tollgate_cluster::lease::{MAX_HOLDERS, Refusal};

/// The lines of the keys this node owns.
pub struct OwnerBook {
    keys: KeyTable,
    lines: Mutex<Lines>,
    /// Keys an owner asked this node's holder to state (a bit per binding),
    /// taken by the holder at its next round.
    restate: Mutex<Bits>,
    /// How rebuilt lines' silent holders are asked to state (`None`: not sent).
    nudger: Option<Nudger>,
    /// Wakes this node's holder when it is asked to state keys (`None`: it
    /// finds them at its next interval's round).
    holder_wake: Option<Arc<tokio::sync::Notify>>,
    /// Holders refused that may be granted now (a gate opened, or room came
    /// back), and their keys: asked to state once per batch of statements, per
    /// round or per bucket ([`OwnerBook::send_asks_again`]), so a batch opening
    /// many gates sends each holder one nudge, not one per key.
    asks_again: Mutex<std::collections::BTreeMap<String, Vec<String>>>,
    view: Arc<RwLock<Arc<View>>>,
    usage: Arc<Mutex<ClusterUsage>>,
    clock: Clock,
    metrics: Arc<Metrics>,
    rebuilt: std::sync::atomic::AtomicU64,
    /// Departed members (not live in the replica) already offered to the open
    /// lines ([`OwnerBook::absorb_departed`]); bounded by the replica's.
    offered: Mutex<std::collections::BTreeSet<String>>,
}

/// The keys any node may own: the credit bindings, found by key, each line's
/// config computed from its binding (every node computes the same). A stored
/// config per key, on every node, would be ~150 B of an idle lease key.
pub struct KeyTable {
    bindings: Arc<[Binding]>,
    /// Indices into `bindings` of those with credit, sorted by key.
    by_key: Box<[u32]>,
    windows: Windows,
    max_credit: f64,
    ttl_ms: u64,
}

impl KeyTable {
    /// The credit bindings of `bindings`, each line config checked once here.
    pub fn new(
        bindings: Arc<[Binding]>,
        windows: impl Into<Windows>,
        max_credit: f64,
        ttl_ms: u64,
    ) -> Result<KeyTable, (String, ConfigError)> {
        let mut by_key: Vec<u32> = (0..bindings.len() as u32)
            .filter(|i| bindings[*i as usize].leased)
            .collect();
        by_key.sort_by(|a, b| bindings[*a as usize].key.cmp(&bindings[*b as usize].key));
        let table = KeyTable {
            bindings,
            by_key: by_key.into_boxed_slice(),
            windows: windows.into(),
            max_credit,
            ttl_ms,
        };
        for &id in table.by_key.iter() {
            table
                .try_config(id)
                .map_err(|e| (table.key(id).to_owned(), e))?;
        }
        Ok(table)
    }

    /// The binding index of `key`, if it is a lease key.
    fn find(&self, key: &str) -> Option<u32> {
        let found = (self.by_key).binary_search_by(|i| (*self.bindings[*i as usize].key).cmp(key));
        found.ok().map(|at| self.by_key[at])
    }

    fn key(&self, id: u32) -> &str {
        &self.bindings[id as usize].key
    }

    fn try_config(&self, id: u32) -> Result<LineConfig, ConfigError> {
        let binding = &self.bindings[id as usize];
        let kind = match binding.dimension {
            Dimension::Concurrency => Kind::Slots,
            _ => Kind::Windowed(*self.windows.of(&binding.key)),
        };
        let max = super::holder::max_credit(binding.capacity, self.max_credit);
        LineConfig::try_new(binding.capacity, kind, max, MAX_HOLDERS, self.ttl_ms)
    }
}

/// What an owner needs to ask holders to state keys.
pub struct Nudger {
    /// The statement client.
    pub client: reqwest::Client,
    /// Tags nudges.
    pub(crate) auth: std::sync::Arc<crate::sync::auth::RpcAuth>,
    /// This cluster's id.
    pub cluster_id: String,
}

/// Most keys in one nudge: ~1 MB of key names at 100 B each.
const NUDGE_KEYS: usize = 10_000;

/// Holders asked to state keys this round: `(member id, keys)`.
pub(crate) type Nudges = Vec<(String, Vec<String>)>;

/// The open lines, and which owned keys have none because theirs came to rest.
#[derive(Default)]
struct Lines {
    open: HashMap<u32, Line<String>>,
    /// Bit per binding: owned without a break since its line was dropped at rest
    /// (nothing held by anyone: no account, nothing rebuilt, no recovery). Such a
    /// line is exactly a new line with the round's terms, so its key's next
    /// statement opens one without the rebuild's hold. Cleared once the key is
    /// not owned here in a round's view (a key that comes back is rebuilt).
    resting: Bits,
    /// The members the resting bits were last checked against.
    members: Vec<String>,
    /// Open lines with holders refused for want of room
    /// ([`OwnerBook::offer_room`]).
    short: std::collections::BTreeSet<u32>,
}

impl Lines {
    fn is_resting(&self, id: u32) -> bool {
        self.resting.contains(id)
    }

    fn set_resting(&mut self, id: u32, on: bool) {
        self.resting.set(id, on);
    }

    fn resting_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.resting.ids()
    }
}

/// One owned key with an open line, for `/admin/cluster` (a key owned here whose
/// line came to rest has none until its next statement).
#[derive(Debug, Clone, serde::Serialize)]
pub struct OwnedKey {
    /// The limit key.
    pub key: String,
    /// Everything counted against L now.
    pub committed: u64,
    /// The capacity L.
    pub capacity: u64,
    /// Holders with an account.
    pub holders: usize,
    /// Still conservative after a rebuild.
    pub recovering: bool,
    /// The cut-off shares peers say in gossip that they hold for the key (what a
    /// member with no account here is charged at least).
    pub held: BTreeMap<String, u64>,
    /// Each live member's share of L by the demands as this owner last had
    /// them (what a holder may commit, borrowing aside).
    pub shares: BTreeMap<String, u64>,
}

impl OwnerBook {
    /// A book for `keys`, reading membership from `view` and rebuilding from
    /// `usage`.
    pub fn new(
        keys: KeyTable,
        view: Arc<RwLock<Arc<View>>>,
        usage: Arc<Mutex<ClusterUsage>>,
        clock: Clock,
        metrics: Arc<Metrics>,
        nudger: Option<Nudger>,
        holder_wake: Option<Arc<tokio::sync::Notify>>,
    ) -> OwnerBook {
        OwnerBook {
            keys,
            lines: Mutex::new(Lines::default()),
            restate: Mutex::default(),
            nudger,
            holder_wake,
            asks_again: Mutex::default(),
            view,
            usage,
            clock,
            metrics,
            rebuilt: std::sync::atomic::AtomicU64::new(0),
            offered: Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// How many lines are open here (`/admin/cluster`'s `held`): a key at rest
    /// keeps only its resting bit.
    pub fn open_lines(&self) -> usize {
        self.lines().open.len()
    }

    fn lines(&self) -> MutexGuard<'_, Lines> {
        self.lines.lock()
    }

    fn view(&self) -> Arc<View> {
        self.view.read().clone()
    }

    fn now_ms(&self) -> u64 {
        self.clock.now_ns() / 1_000_000
    }

    /// Answers `from`'s statement for `key`. Bad input is refused and changes nothing.
    pub fn sync(&self, from: &str, key: &str, request: &SyncRequest) -> Result<SyncReply, Refusal> {
        let result = self.sync_inner(from, key, request);
        let outcome = match &result {
            Ok(r) if r.granted > 0 => "granted",
            Ok(_) => "nothing_granted",
            Err(e) => super::wire::refusal_code(e),
        };
        self.metrics.lease_statement("owner", outcome);
        if let Ok(r) = &result {
            self.metrics.lease_owner(r.granted, 0);
        }
        result
    }

    fn sync_inner(
        &self,
        from: &str,
        key: &str,
        request: &SyncRequest,
    ) -> Result<SyncReply, Refusal> {
        let id = self.keys.find(key).ok_or(Refusal::UnknownKey)?;
        let config = (self.keys.try_config(id)).map_err(|_| Refusal::UnknownKey)?;
        let view = self.view();
        if !view.members.iter().any(|m| m.id == from) {
            return Err(Refusal::NotMember);
        }
        // Not before this node's view of the members settled: it could believe it
        // owns a key whose holders still spend a previous owner's credit.
        if !view.owns(key) || !view.settled {
            return Err(Refusal::NotOwner);
        }
        let now_ms = self.now_ms();
        let mut guard = self.lines();
        let lines = &mut *guard;
        let resting = lines.is_resting(id);
        lines.set_resting(id, false);
        let line = match lines.open.entry(id) {
            std::collections::hash_map::Entry::Occupied(line) => line.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                let line = if resting {
                    // Owned throughout, and nobody held anything: a fresh line.
                    let mut line = Line::new(config);
                    if let Some(terms) = view.terms_for(key, config.capacity()) {
                        line.set_terms_at(Arc::clone(terms), now_ms);
                    }
                    line
                } else {
                    self.rebuild(config, key, &view, now_ms)
                };
                slot.insert(line)
            }
        };
        let reply = line.sync(&from.to_owned(), request, now_ms)?;
        let reopened = line.take_reopened(now_ms);
        if line.has_short() {
            lines.short.insert(id);
        }
        if crate::audit::enabled()
            && line.config().kind() != tollgate_cluster::lease::line::Kind::Slots
        {
            let holder = from.to_owned();
            let (usage, lapsed, told) = line.figures_of(&holder, now_ms);
            crate::audit::record(&crate::audit::Event::Grant {
                key,
                holder: from,
                seq: request.seq,
                credit: reply.credit,
                until_ms: now_ms.saturating_add(reply.ttl_ms),
                want: request.want,
                granted: reply.granted,
                share: line.terms().shares.get(from).copied().unwrap_or(0),
                borrow: line.terms().borrow,
                charge: line.charge_of(&holder, now_ms),
                committed: line.committed(now_ms),
                usage,
                lapsed,
                told,
            });
        }
        drop(guard);
        self.add_asks_again(reopened, key);
        Ok(reply)
    }

    /// Notes `holders`, refused on `key` and now to be asked again (its gate
    /// opened, or room came back), for [`OwnerBook::send_asks_again`].
    fn add_asks_again(&self, holders: Vec<String>, key: &str) {
        if holders.is_empty() {
            return;
        }
        let mut pending = self.asks_again.lock();
        for holder in holders {
            pending.entry(holder).or_default().push(key.to_owned());
        }
    }

    /// After a batch of statements, a round or a bucket: asks each holder
    /// noted by [`OwnerBook::add_asks_again`] to state again, once for all its
    /// keys.
    pub fn send_asks_again(&self) {
        let pending = std::mem::take(&mut *self.asks_again.lock());
        if !pending.is_empty() {
            self.ask_to_state(&self.view(), pending.into_iter().collect());
        }
    }

    /// As a bucket leaves the window: asks each holder that was refused for
    /// want of room, on a line that has room for it now, to state again, once
    /// for all its keys. Without this, such a holder asks again only at its
    /// next sync round, and in the bench's audit refused holders are then
    /// granted 50-200 ms after the room comes back, while their requests' waits
    /// run out (docs/design/lease.md, "Room offered as it comes back").
    pub fn offer_room(&self) {
        let now_ms = self.now_ms();
        let mut with_room = Vec::new();
        let mut guard = self.lines();
        let lines = &mut *guard;
        for id in std::mem::take(&mut lines.short) {
            let Some(line) = lines.open.get_mut(&id) else {
                continue;
            };
            with_room.push((line.take_short_with_room(now_ms), id));
            if line.has_short() {
                lines.short.insert(id);
            }
        }
        drop(guard);
        for (holders, id) in with_room {
            self.add_asks_again(holders, self.keys.key(id));
        }
        self.send_asks_again();
    }

    /// Asks each holder to state its keys: this node's own holder through its
    /// restate bits, the others over the internal RPC.
    fn ask_to_state(&self, view: &View, asked: Nudges) {
        let (own, others): (Nudges, Nudges) =
            asked.into_iter().partition(|(h, _)| *h == view.self_id);
        for (_, keys) in own {
            self.restate(&keys);
        }
        self.send_nudges(view, &others);
    }

    /// A line for a key this node just came to own: consumption from the counters,
    /// and nothing granted until every live member stated (or one ttl passed).
    fn rebuild(&self, config: LineConfig, key: &str, view: &View, now_ms: u64) -> Line<String> {
        let counters = (self.usage.lock()).buckets_by_node(key, now_ms);
        let holders: Vec<String> = view.members.iter().map(|m| m.id.clone()).collect();
        tracing::debug!(%key, holders = holders.len(), "now owning a lease key: rebuilt from the counters, conservative until every holder stated");
        self.rebuilt
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut line = Line::rebuild(config, &counters, &holders, now_ms);
        if let Some(terms) = view.terms_for(key, config.capacity()) {
            line.set_terms_at(Arc::clone(terms), now_ms);
        }
        line
    }

    /// Offers every open line the members that became departed in the replica
    /// since the last round (one learned from a peer's archive, a member that
    /// died, an incarnation superseded): a line that holds nothing of one
    /// counts its counters as a rebuild would ([`Line::absorb_departed`]). A
    /// line rebuilt before a departed member's counters arrived here would
    /// otherwise grant its spending again. Called with the lines locked, then
    /// the usage, the order every path takes them in.
    fn absorb_departed(&self, lines: &mut Lines, now_ms: u64) {
        let usage = self.usage.lock();
        let departed = usage.departed_nodes();
        let mut offered = self.offered.lock();
        let new: Vec<&String> = (departed.iter())
            .filter(|m| !offered.contains(*m))
            .collect();
        if !new.is_empty() {
            let mut absorbed = 0;
            for (id, line) in lines.open.iter_mut() {
                let key = self.keys.key(*id);
                for member in &new {
                    let Some(buckets) = usage.buckets_of(member, key, now_ms) else {
                        continue;
                    };
                    absorbed += usize::from(line.absorb_departed(*member, &buckets, now_ms));
                }
            }
            if absorbed > 0 {
                tracing::info!(
                    members = new.len(),
                    absorbed,
                    "departed members' counters learned late: charged on the open lines that did not hold them"
                );
            }
        }
        // Bounded by the replica: members it forgot are forgotten here too.
        if !new.is_empty() || offered.len() != departed.len() {
            *offered = departed.into_iter().collect();
        }
    }

    /// Each round: drops keys this node no longer owns (fencing), applies the new
    /// terms, settles expiries, drops lines that came to rest (their keys stay
    /// marked resting while owned), and asks the holders a rebuilt line still
    /// waits for to state (once per rebuild, a quarter ttl into it). Returns
    /// those requests.
    pub fn on_round(&self) -> Nudges {
        let view = self.view();
        let now_ms = self.now_ms();
        let mut expired = 0;
        let mut guard = self.lines();
        let lines = &mut *guard;
        let before = lines.open.len();
        let keys = &self.keys;
        lines.open.retain(|id, _| {
            let owned = view.owns(keys.key(*id));
            if !owned {
                tracing::debug!(
                    key = keys.key(*id),
                    "lease key moved to another owner: dropped here"
                );
            }
            owned
        });
        let dropped = before - lines.open.len();
        // Ownership moves only when the members do: then a resting key no longer
        // owned here stops resting (if it comes back, it is rebuilt).
        let members: Vec<String> = view.members.iter().map(|m| m.id.clone()).collect();
        if members != lines.members {
            let moved: Vec<u32> = (lines.resting_ids())
                .filter(|id| !view.owns(keys.key(*id)))
                .collect();
            for id in moved {
                lines.set_resting(id, false);
            }
            lines.members = members;
        }
        self.absorb_departed(lines, now_ms);
        let rebuilt = self.rebuilt.swap(0, std::sync::atomic::Ordering::Relaxed);
        if dropped > 0 || rebuilt > 0 {
            tracing::info!(
                rebuilt,
                dropped,
                owned = lines.open.len(),
                "lease ownership changed: new keys rebuilt from the counters (conservative until every holder stated), moved keys dropped"
            );
        }
        let mut resting = Vec::new();
        let mut nudges: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (id, line) in lines.open.iter_mut() {
            if let Some(terms) = view.terms_for(keys.key(*id), line.config().capacity()) {
                line.set_terms_at(Arc::clone(terms), now_ms);
            }
            // Before `settle`, which ends an opened line's recovery: gates
            // opened by a ttl or by the terms (an unreachable holder no longer
            // waited for) rather than by a statement, asked with the rest below.
            self.add_asks_again(line.take_reopened(now_ms), keys.key(*id));
            expired += line.settle(now_ms) as u64;
            for holder in line.to_nudge(now_ms, keys.ttl_ms / 4) {
                if holder != view.self_id {
                    nudges
                        .entry(holder)
                        .or_default()
                        .push(keys.key(*id).to_owned());
                }
            }
            if line.is_at_rest() {
                resting.push(*id);
            }
        }
        for id in resting {
            lines.open.remove(&id);
            lines.set_resting(id, true);
        }
        tollgate_cluster::maps::shrink_if_sparse(&mut lines.open);
        self.metrics.lease_owner(0, expired);
        drop(guard);
        let nudges: Nudges = nudges.into_iter().collect();
        if !nudges.is_empty() {
            tracing::info!(
                holders = nudges.len(),
                "rebuilt lines still wait for holders: asking them to state"
            );
        }
        self.send_nudges(&view, &nudges);
        self.send_asks_again();
        nudges
    }

    fn send_nudges(&self, view: &View, nudges: &Nudges) {
        let Some(nudger) = &self.nudger else { return };
        for (holder, keys) in nudges {
            let Some(member) = view.members.iter().find(|m| m.id == *holder) else {
                continue;
            };
            tracing::debug!(holder = %holder, keys = keys.len(), "asking a holder to state keys (a rebuilt line waits for it, or opened after refusing it)");
            // In parts far below the holder's body and entry limits.
            for part in keys.chunks(NUDGE_KEYS) {
                let nudge = super::wire::Nudge {
                    cluster_id: nudger.cluster_id.clone(),
                    from: view.self_id.clone(),
                    keys: part.to_vec(),
                };
                let (client, auth, rpc) = (
                    nudger.client.clone(),
                    nudger.auth.clone(),
                    member.rpc.clone(),
                );
                tokio::spawn(async move {
                    super::rpc::send_nudge(&client, &rpc, &auth, &nudge).await;
                });
            }
        }
    }

    /// An owner asked this node to state `keys`: they are stated at the holder's
    /// next round, which this wakes. Returns how many are lease keys here.
    pub fn restate(&self, keys: &[String]) -> usize {
        let mut bits = self.restate.lock();
        let mut known = 0;
        for id in keys.iter().filter_map(|k| self.keys.find(k)) {
            bits.set(id, true);
            known += 1;
        }
        drop(bits);
        if let (Some(wake), true) = (&self.holder_wake, known > 0) {
            wake.notify_one();
        }
        known
    }

    /// The holder, each round: the binding indices it was asked to state.
    pub fn take_restates(&self) -> Vec<usize> {
        let mut bits = self.restate.lock();
        std::mem::take(&mut *bits)
            .ids()
            .map(|id| id as usize)
            .collect()
    }

    /// The keys owned here with an open line, for `/admin/cluster?keys=true`.
    pub fn owned(&self) -> Vec<OwnedKey> {
        let now_ms = self.now_ms();
        let mut out: Vec<OwnedKey> = (self.lines().open.iter())
            .map(|(id, line)| OwnedKey {
                key: self.keys.key(*id).to_owned(),
                committed: line.committed(now_ms),
                capacity: line.config().capacity(),
                holders: line.holders(),
                recovering: line.recovering(now_ms),
                held: line.terms().held.clone(),
                shares: line.terms().shares.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// The owner of `key` in the current view.
    pub fn owner_of(&self, key: &str) -> Option<String> {
        let view = self.view();
        let ids: Vec<&str> = view.members.iter().map(|m| m.id.as_str()).collect();
        rendezvous::owner(key, &ids).map(|s| s.to_string())
    }
}

/// Offers room as it comes back: at each bucket boundary of the owner's
/// clock (when the oldest bucket leaves every windowed line's window),
/// [`OwnerBook::offer_room`], until `stopped`. One timer per node; a boundary
/// with nobody refused costs a look at an empty set.
pub(crate) async fn offer_room_at_each_bucket(
    book: Arc<OwnerBook>,
    bucket_ms: u64,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let bucket_ms = bucket_ms.max(1);
    loop {
        let now_ms = book.now_ms();
        // Just past the boundary: the bucket has left the window by then.
        let next = (now_ms / bucket_ms + 1) * bucket_ms + 1;
        let wait = std::time::Duration::from_millis(next - now_ms);
        tokio::select! {
            () = tokio::time::sleep(wait) => book.offer_room(),
            _ = stopped.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests;
