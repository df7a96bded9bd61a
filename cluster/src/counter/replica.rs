//! [`ClusterUsage`]: every node's published counters, merged, and the sums over them.
//!
//! Each (node, chitchat key) is a register written by that node only. A register keeps
//! the greatest `(version, value)` it was given, so merging is a join: commutative,
//! associative and idempotent (property-tested in `proptests.rs`), and an older
//! version never changes anything. Global usage of a limit key is the sum over live
//! nodes of their buckets that count at `now_ms`; a slot whose bucket left the window
//! counts 0 without being deleted. Dead nodes are excluded from every sum at once and
//! their registers kept until [`ClusterUsage::forget_node`], so a node wrongly
//! suspected and back a moment later is counted again without a resync.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use super::archive::Archived;
use super::codec::{DecodeError, Decoded, decode};
use super::{DEFAULT_MAX_KEYS, Window, Windows};

/// What an update did to the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The register took the new value.
    Updated,
    /// The register already held exactly this version and value.
    Unchanged,
    /// The register holds a newer version (or the same version with a greater value):
    /// the update was ignored.
    Stale,
    /// Not a counter key (no `c:`/`d:`/`f:` prefix), e.g. membership metadata: ignored.
    Foreign,
    /// The node already has `max_keys_per_node` limit keys here: ignored (see
    /// [`ClusterUsage::gc`]).
    Full,
}

/// A register's content and the version it was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Versioned<T> {
    version: u64,
    value: T,
}

/// How an incoming value merges into a register.
#[derive(Debug, Clone, Copy)]
enum Merge {
    /// Keep the greatest `(version, value)`: the CRDT join.
    MaxVersion(u64),
    /// The caller already ordered updates (chitchat did): take the value, keep the
    /// register's version.
    Overwrite,
}

impl Merge {
    fn join<T: Ord + Copy>(self, register: &mut Option<Versioned<T>>, value: T) -> Applied {
        let incoming = match (self, *register) {
            (Merge::MaxVersion(version), _) => Versioned { version, value },
            (Merge::Overwrite, current) => Versioned {
                version: current.map_or(0, |c| c.version),
                value,
            },
        };
        match *register {
            Some(current) if current == incoming => Applied::Unchanged,
            Some(current) if matches!(self, Merge::MaxVersion(_)) && current > incoming => {
                Applied::Stale
            }
            _ => {
                *register = Some(incoming);
                Applied::Updated
            }
        }
    }
}

/// One node's registers for one limit key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct KeyReplica {
    /// Ring slot -> `(bucket, count)`.
    slots: BTreeMap<u32, Versioned<(u64, u64)>>,
    demand: Option<Versioned<u64>>,
    in_flight: Option<Versioned<u64>>,
    held: Option<Versioned<u64>>,
}

impl KeyReplica {
    fn usage(&self, window: &Window, now_ms: u64) -> u64 {
        self.usage_shifted(window, 0, now_ms)
    }

    /// Usage with every bucket dated `shift` buckets later (a writer's clock behind).
    fn usage_shifted(&self, window: &Window, shift: u64, now_ms: u64) -> u64 {
        self.slots
            .values()
            .filter(|r| window.counts(r.value.0.saturating_add(shift), now_ms))
            .fold(0u64, |sum, r| sum.saturating_add(r.value.1))
    }

    fn apply(&mut self, decoded: Decoded<'_>, merge: Merge) -> Applied {
        match decoded {
            Decoded::Slot {
                slot,
                bucket,
                count,
                ..
            } => {
                let mut register = self.slots.get(&slot).copied();
                let applied = merge.join(&mut register, (bucket, count));
                if let (Applied::Updated, Some(r)) = (applied, register) {
                    self.slots.insert(slot, r);
                }
                applied
            }
            Decoded::Demand { demand, .. } => merge.join(&mut self.demand, demand),
            Decoded::InFlight { in_flight, .. } => merge.join(&mut self.in_flight, in_flight),
            Decoded::Held { held, .. } => merge.join(&mut self.held, held),
        }
    }

    /// Every register reads as zero at `now_ms`, buckets dated `shift` later.
    fn is_zero_shifted(&self, window: &Window, shift: u64, now_ms: u64) -> bool {
        self.usage_shifted(window, shift, now_ms) == 0
            && self.demand.is_none_or(|d| d.value == 0)
            && self.in_flight.is_none_or(|f| f.value == 0)
            && self.held.is_none_or(|h| h.value == 0)
    }
}

/// One node's registers and whether it is counted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeReplica {
    live: bool,
    keys: HashMap<String, KeyReplica>,
    clock: ClockLag,
}

/// How many recent observations bound a node's clock lag: a writer whose clock
/// steps back is dated right again within this many of its rounds.
const LAG_SAMPLES: usize = 8;

/// The most lag assumed for a member this reader never saw live (a restarted
/// node's previous incarnation, read by the new one): its only bound, `now - last
/// stamp`, includes the time since it stopped, so uncapped it would keep a member
/// that died long ago counting up to a window longer. A clock further behind than
/// this is broken; its buckets are then under-dated by the excess.
pub(super) const UNSEEN_LAG_CAP_MS: u64 = 10_000;

/// What this reader knows of a writer's clock: the stamp of its last round (the
/// writer's clock) and, for each new stamp, how far behind this reader's clock it
/// was when first seen. A stamp is written before it is seen, so every sample is
/// an upper bound of the writer's lag (plus propagation): the smallest recent one is
/// the tightest, and `now - last stamp` is one at any time, even for a member this
/// reader never saw live (a restarted node's previous incarnation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ClockLag {
    last_round_ms: Option<u64>,
    samples: VecDeque<u64>,
    seen_live: bool,
}

impl ClockLag {
    fn observe(&mut self, round_ms: u64, now_ms: u64, live: bool) {
        self.seen_live |= live;
        if self.last_round_ms == Some(round_ms) {
            return;
        }
        self.last_round_ms = Some(round_ms);
        if self.samples.len() == LAG_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(now_ms.saturating_sub(round_ms));
    }

    /// The writer's lag behind this reader at `now_ms` (0 if it never stamped a
    /// round: nothing bounds it, its buckets are read as dated).
    fn lag_ms(&self, now_ms: u64) -> u64 {
        let Some(last) = self.last_round_ms else {
            return 0;
        };
        let observed = self.samples.iter().copied().min().unwrap_or(u64::MAX);
        let bound = observed.min(now_ms.saturating_sub(last));
        if self.seen_live {
            bound
        } else {
            bound.min(UNSEEN_LAG_CAP_MS)
        }
    }
}

/// Every node's counters as gossiped, merged by max version. Pure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterUsage {
    windows: Windows,
    max_keys_per_node: usize,
    nodes: HashMap<String, NodeReplica>,
}

impl ClusterUsage {
    /// An empty replica over `windows` (which every node must share), keeping at
    /// most `DEFAULT_MAX_KEYS` limit keys per node.
    pub fn new(windows: impl Into<Windows>) -> Self {
        Self::with_max_keys_per_node(windows, DEFAULT_MAX_KEYS)
    }

    /// An empty replica keeping at most `max_keys_per_node` limit keys per node.
    pub fn with_max_keys_per_node(windows: impl Into<Windows>, max_keys_per_node: usize) -> Self {
        Self {
            windows: windows.into(),
            max_keys_per_node,
            nodes: HashMap::new(),
        }
    }

    /// The windows buckets are read with (each key's by its name).
    pub fn windows(&self) -> &Windows {
        &self.windows
    }

    /// Applies `node`'s value for `key` as the newest one (chitchat already keeps the
    /// highest version and hands us only that). Don't mix with
    /// [`apply_versioned`](Self::apply_versioned) for the same node.
    pub fn apply(&mut self, node: &str, key: &str, value: &str) -> Result<Applied, DecodeError> {
        self.apply_with(node, key, value, Merge::Overwrite)
    }

    /// Applies `node`'s value for `key` written at `version`: the register keeps the
    /// greatest `(version, value)`, so an older version never changes anything and a
    /// repeat is `Unchanged`. A node first seen here is live.
    pub fn apply_versioned(
        &mut self,
        node: &str,
        key: &str,
        version: u64,
        value: &str,
    ) -> Result<Applied, DecodeError> {
        self.apply_with(node, key, value, Merge::MaxVersion(version))
    }

    fn apply_with(
        &mut self,
        node: &str,
        key: &str,
        value: &str,
        merge: Merge,
    ) -> Result<Applied, DecodeError> {
        let Some(decoded) = decode(key, value, &self.windows)? else {
            return Ok(Applied::Foreign);
        };
        let limit_key = match decoded {
            Decoded::Slot { limit_key, .. }
            | Decoded::Demand { limit_key, .. }
            | Decoded::InFlight { limit_key, .. }
            | Decoded::Held { limit_key, .. } => limit_key,
        };
        let max_keys = self.max_keys_per_node;
        let replica = self.node_mut(node);
        if !replica.keys.contains_key(limit_key) && replica.keys.len() >= max_keys {
            return Ok(Applied::Full);
        }
        let key_replica = replica.keys.entry(limit_key.to_owned()).or_default();
        Ok(key_replica.apply(decoded, merge))
    }

    /// Merges every register of `other` into this replica (max version per register),
    /// as if all its updates were applied here. Liveness is this node's own view and is
    /// not merged: nodes new to this replica are live.
    pub fn merge(&mut self, other: &ClusterUsage) {
        for (node, theirs) in &other.nodes {
            let max_keys = self.max_keys_per_node;
            let replica = self.node_mut(node);
            for (limit_key, key) in &theirs.keys {
                if !replica.keys.contains_key(limit_key) && replica.keys.len() >= max_keys {
                    continue;
                }
                let mine = replica.keys.entry(limit_key.clone()).or_default();
                for (&slot, r) in &key.slots {
                    let mut register = mine.slots.get(&slot).copied();
                    let applied = Merge::MaxVersion(r.version).join(&mut register, r.value);
                    if let (Applied::Updated, Some(r)) = (applied, register) {
                        mine.slots.insert(slot, r);
                    }
                }
                for (mine, theirs) in [
                    (&mut mine.demand, key.demand),
                    (&mut mine.in_flight, key.in_flight),
                    (&mut mine.held, key.held),
                ] {
                    if let Some(r) = theirs {
                        Merge::MaxVersion(r.version).join(mine, r.value);
                    }
                }
            }
        }
    }

    /// Makes exactly the nodes in `live` count: others are excluded from every sum at
    /// once (registers kept), known nodes in `live` count again, unknown ones are added
    /// empty so they show up (with 0) in the per-node views and get a share.
    pub fn retain_nodes(&mut self, live: &HashSet<String>) {
        for (node, replica) in &mut self.nodes {
            replica.live = live.contains(node);
        }
        for node in live {
            self.node_mut(node);
        }
    }

    /// Excludes `node` from every sum at once (e.g. declared dead); registers kept.
    pub fn remove_node(&mut self, node: &str) {
        if let Some(replica) = self.nodes.get_mut(node) {
            replica.live = false;
        }
    }

    /// `node` stamped a round with its clock at `round_ms`, seen here at `now_ms`
    /// (this reader's clock) while it was `live`: bounds how far its clock runs
    /// behind this one, so its buckets are dated on this reader's clock where the
    /// figure must not leave the window early (a lease owner's rebuild, a departed
    /// member's charge).
    pub fn observe_round(&mut self, node: &str, round_ms: u64, now_ms: u64, live: bool) {
        self.node_mut(node).clock.observe(round_ms, now_ms, live);
    }

    /// How far `node`'s clock runs behind this reader's at `now_ms`, as bounded by
    /// its round stamps (0: unknown, or not behind).
    pub fn clock_lag_ms(&self, node: &str, now_ms: u64) -> u64 {
        self.nodes.get(node).map_or(0, |r| r.clock.lag_ms(now_ms))
    }

    /// Buckets of `window` to date `replica`'s cost later by at `now_ms` (its
    /// clock's lag).
    fn shift_of(window: &Window, replica: &NodeReplica, now_ms: u64) -> u64 {
        window.buckets_behind(replica.clock.lag_ms(now_ms))
    }

    /// Drops `node`'s registers (after chitchat garbage-collected the dead node).
    /// Returns whether it was known.
    pub fn forget_node(&mut self, node: &str) -> bool {
        self.nodes.remove(node).is_some()
    }

    /// Drops every limit key whose registers all read 0 at `now_ms` (no bucket that
    /// counts, demand and in-flight 0), returning how many. Buckets are dated on this
    /// reader's clock, as every charge is: a key of a member whose clock runs behind
    /// is kept while its shifted buckets count. Safe with chitchat, which hands over
    /// only the newest version of a key, so a dropped register cannot be brought back
    /// by an older value; the property tests run without it.
    pub fn gc(&mut self, now_ms: u64) -> usize {
        let windows = self.windows;
        let mut dropped = 0;
        for replica in self.nodes.values_mut() {
            let lag_ms = replica.clock.lag_ms(now_ms);
            let before = replica.keys.len();
            (replica.keys).retain(|limit_key, key| {
                let window = windows.of(limit_key);
                !key.is_zero_shifted(window, window.buckets_behind(lag_ms), now_ms)
            });
            crate::maps::shrink_if_sparse(&mut replica.keys);
            dropped += before - replica.keys.len();
        }
        dropped
    }

    /// Every node with registers here, live or departed, sorted.
    pub fn nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self.nodes.keys().cloned().collect();
        nodes.sort_unstable();
        nodes
    }

    /// Whether nothing `node` published counts at `now_ms` (no bucket in the
    /// window, demand and in-flight 0), or it is unknown.
    pub fn is_idle(&self, node: &str, now_ms: u64) -> bool {
        // Dated on this reader's clock, as its charges are: a member whose clock ran
        // behind is not forgotten while its shifted buckets still count.
        (self.nodes.get(node)).is_none_or(|r| {
            (r.keys.iter()).all(|(limit_key, k)| {
                let window = self.windows.of(limit_key);
                k.is_zero_shifted(window, Self::shift_of(window, r, now_ms), now_ms)
            })
        })
    }

    /// Limit keys replicated here, summed over the nodes.
    pub fn key_count(&self) -> usize {
        self.nodes.values().map(|r| r.keys.len()).sum()
    }

    /// Live nodes, sorted.
    pub fn live_nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = (self.nodes.iter())
            .filter(|(_, r)| r.live)
            .map(|(n, _)| n.clone())
            .collect();
        nodes.sort_unstable();
        nodes
    }

    /// Cluster usage of `limit_key` at `now_ms`, in cost units: the sum over live nodes
    /// of their buckets that count.
    pub fn global_usage(&self, limit_key: &str, now_ms: u64) -> u64 {
        self.global_usage_except(limit_key, None, now_ms)
    }

    /// [`global_usage`](Self::global_usage) without `except_node`'s part (typically
    /// this node, whose fresher figure is in its `LocalCounters`).
    pub fn global_usage_except(
        &self,
        limit_key: &str,
        except_node: Option<&str>,
        now_ms: u64,
    ) -> u64 {
        let window = self.windows.of(limit_key);
        (self.nodes.iter())
            .filter(|(node, r)| r.live && Some(node.as_str()) != except_node)
            .filter_map(|(_, r)| r.keys.get(limit_key))
            .fold(0u64, |sum, k| sum.saturating_add(k.usage(window, now_ms)))
    }

    /// Usage of `limit_key` at `now_ms` per live node (0 if it published none), sorted
    /// by node.
    pub fn usage_by_node(&self, limit_key: &str, now_ms: u64) -> Vec<(String, u64)> {
        let window = self.windows.of(limit_key);
        self.per_live_node(limit_key, |k| k.usage(window, now_ms))
    }

    /// `node`'s usage of `limit_key` at `now_ms`, live or not (`None` if never seen):
    /// what a member declared dead had spent in the window, e.g. to charge it
    /// `max(usage, share)` rather than only its share.
    pub fn usage_of(&self, node: &str, limit_key: &str, now_ms: u64) -> Option<u64> {
        let replica = self.nodes.get(node)?;
        let key = replica.keys.get(limit_key);
        let window = self.windows.of(limit_key);
        let shift = Self::shift_of(window, replica, now_ms);
        Some(key.map_or(0, |k| k.usage_shifted(window, shift, now_ms)))
    }

    /// `limit_key`'s usage at `now_ms` summed over the nodes that are not live
    /// (departed: dead, or an older generation superseded by a restart), except those
    /// in `skip`: what they spent still counts until it leaves the window.
    pub fn departed_usage_except(&self, limit_key: &str, skip: &[String], now_ms: u64) -> u64 {
        let window = self.windows.of(limit_key);
        (self.nodes.iter())
            .filter(|(node, r)| !r.live && !skip.contains(node))
            .filter_map(|(_, r)| Some((r.keys.get(limit_key)?, Self::shift_of(window, r, now_ms))))
            .fold(0u64, |sum, (k, shift)| {
                sum.saturating_add(k.usage_shifted(window, shift, now_ms))
            })
    }

    /// `limit_key`'s usage at `now_ms` per node that is not live, those with
    /// none left out, sorted by node: what [`Self::departed_usage_except`]
    /// sums, member by member.
    pub fn departed_usage_by_node(&self, limit_key: &str, now_ms: u64) -> Vec<(String, u64)> {
        let window = self.windows.of(limit_key);
        let mut out: Vec<(String, u64)> = (self.nodes.iter())
            .filter(|(_, r)| !r.live)
            .filter_map(|(node, r)| {
                let key = r.keys.get(limit_key)?;
                let used = key.usage_shifted(window, Self::shift_of(window, r, now_ms), now_ms);
                (used > 0).then(|| (node.clone(), used))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Each node's consumption of `limit_key` per bucket that counts at `now_ms`,
    /// live or departed (a restarted node's previous incarnation spent in this window
    /// too), ascending by bucket, nodes sorted: what a new lease owner rebuilds from.
    /// Buckets are dated on this reader's clock: a node whose clock ran behind has
    /// its buckets moved later by its lag ([`Self::clock_lag_ms`]), or a rebuilt
    /// owner would let its cost leave the window early (the jepsen harness measured
    /// 41-43 of L = 40 after a node ran 2 s behind and restarted with the true clock).
    pub fn buckets_by_node(&self, limit_key: &str, now_ms: u64) -> Vec<(String, Vec<(u64, u64)>)> {
        let mut out: Vec<(String, Vec<(u64, u64)>)> = (self.nodes.iter())
            .filter_map(|(node, replica)| {
                Some((node.clone(), self.buckets_in(replica, limit_key, now_ms)?))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// `node`'s buckets of `limit_key` as [`Self::buckets_by_node`] reads them
    /// (`None`: it published none for the key, or is unknown).
    pub fn buckets_of(&self, node: &str, limit_key: &str, now_ms: u64) -> Option<Vec<(u64, u64)>> {
        self.buckets_in(self.nodes.get(node)?, limit_key, now_ms)
    }

    fn buckets_in(
        &self,
        replica: &NodeReplica,
        limit_key: &str,
        now_ms: u64,
    ) -> Option<Vec<(u64, u64)>> {
        let key = replica.keys.get(limit_key)?;
        let window = self.windows.of(limit_key);
        let shift = Self::shift_of(window, replica, now_ms);
        let mut buckets: Vec<(u64, u64)> = (key.slots.values())
            .map(|r| (r.value.0.saturating_add(shift), r.value.1))
            .filter(|&(bucket, _)| window.counts(bucket, now_ms))
            .collect();
        buckets.sort_unstable();
        Some(buckets)
    }

    /// Nodes with registers here that are not live (dead, superseded, collected
    /// by chitchat, or adopted from an archive), sorted.
    pub fn departed_nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = (self.nodes.iter())
            .filter(|(_, r)| !r.live)
            .map(|(n, _)| n.clone())
            .collect();
        nodes.sort_unstable();
        nodes
    }

    /// What `node` spent that still counts at `now_ms`, per limit key (buckets
    /// dated on this reader's clock, as [`Self::buckets_of`]), keys without a
    /// cost left out, sorted: what [`super::archive`] republishes for a member
    /// chitchat no longer holds.
    pub fn archive_of(&self, node: &str, now_ms: u64) -> Vec<(String, Vec<(u64, u64)>)> {
        let Some(replica) = self.nodes.get(node) else {
            return Vec::new();
        };
        let mut out: Vec<(String, Vec<(u64, u64)>)> = (replica.keys.keys())
            .filter_map(|limit_key| {
                let buckets = self.buckets_in(replica, limit_key, now_ms)?;
                let spent: Vec<(u64, u64)> = buckets.into_iter().filter(|&(_, c)| c > 0).collect();
                (!spent.is_empty()).then(|| (limit_key.clone(), spent))
            })
            .collect();
        out.sort_unstable();
        out
    }

    /// Adopts an archived key of a member that is not live here (one chitchat
    /// no longer holds; the caller checks): the key's registers become the
    /// archive's buckets if those count for more at `now_ms` than what this
    /// replica holds of it, and are left alone otherwise. Each copy of a
    /// departed member's key is its final state, dated no earlier than the
    /// member dated it, so the greater is the one to keep (the join of every
    /// publisher's copy), and adopting one twice changes nothing. `Stale` for a
    /// live node, whose own registers rule; `Full` at the per-node key cap.
    pub fn adopt(&mut self, archived: &Archived<'_>, now_ms: u64) -> Applied {
        if self.nodes.get(archived.member).is_some_and(|r| r.live) {
            return Applied::Stale;
        }
        let window = *self.windows.of(archived.limit_key);
        let incoming = (archived.buckets.iter())
            .filter(|&&(bucket, _)| window.counts(bucket, now_ms))
            .fold(0u64, |sum, &(_, c)| sum.saturating_add(c));
        let held = self
            .usage_of(archived.member, archived.limit_key, now_ms)
            .unwrap_or(0);
        if incoming <= held {
            return Applied::Unchanged;
        }
        let max_keys = self.max_keys_per_node;
        let fresh = !self.nodes.contains_key(archived.member);
        let replica = self.node_mut(archived.member);
        if fresh {
            replica.live = false;
        }
        if !replica.keys.contains_key(archived.limit_key) && replica.keys.len() >= max_keys {
            return Applied::Full;
        }
        let key = replica
            .keys
            .entry(archived.limit_key.to_owned())
            .or_default();
        key.slots = (archived.buckets.iter())
            .map(|&(bucket, count)| {
                let value = Versioned {
                    version: 0,
                    value: (bucket, count),
                };
                (window.slot(bucket), value)
            })
            .collect();
        Applied::Updated
    }

    /// Demand for `limit_key` per live node (cost units per window, 0 if none
    /// published), sorted by node: the input of [`crate::share::shares`].
    pub fn demand_by_node(&self, limit_key: &str) -> Vec<(String, u64)> {
        self.per_live_node(limit_key, |k| k.demand.map_or(0, |d| d.value))
    }

    /// In-flight count for `limit_key` per live node (0 if none published), sorted.
    pub fn in_flight_by_node(&self, limit_key: &str) -> Vec<(String, u64)> {
        self.per_live_node(limit_key, |k| k.in_flight.map_or(0, |f| f.value))
    }

    /// `lease`: the cut-off share each live node holds for `limit_key`, only the
    /// non-zero ones: what an owner that forgot it charges a node that has not
    /// stated to it. Read for every leased key each round, so an idle key (no
    /// figure anywhere) allocates nothing.
    pub fn held_by_node(&self, limit_key: &str) -> BTreeMap<String, u64> {
        (self.nodes.iter())
            .filter(|(_, r)| r.live)
            .filter_map(|(node, r)| {
                let held = r.keys.get(limit_key)?.held?.value;
                (held > 0).then(|| (node.clone(), held))
            })
            .collect()
    }

    fn per_live_node(
        &self,
        limit_key: &str,
        read: impl Fn(&KeyReplica) -> u64,
    ) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = (self.nodes.iter())
            .filter(|(_, r)| r.live)
            .map(|(node, r)| (node.clone(), r.keys.get(limit_key).map_or(0, &read)))
            .collect();
        out.sort_unstable();
        out
    }

    /// Every register's version by (node, limit key, register), for the property
    /// tests: register 0..R is a slot, `u32::MAX - 2` held, `u32::MAX - 1` demand,
    /// `u32::MAX` in-flight.
    #[cfg(test)]
    pub(super) fn register_versions(&self) -> BTreeMap<(String, String, u32), u64> {
        let mut out = BTreeMap::new();
        for (node, replica) in &self.nodes {
            for (limit_key, key) in &replica.keys {
                let at = |register: u32| (node.clone(), limit_key.clone(), register);
                for (&slot, r) in &key.slots {
                    out.insert(at(slot), r.version);
                }
                out.extend(key.demand.map(|d| (at(u32::MAX - 1), d.version)));
                out.extend(key.in_flight.map(|f| (at(u32::MAX), f.version)));
                out.extend(key.held.map(|h| (at(u32::MAX - 2), h.version)));
            }
        }
        out
    }

    fn node_mut(&mut self, node: &str) -> &mut NodeReplica {
        let fresh = || NodeReplica {
            live: true,
            keys: HashMap::new(),
            clock: ClockLag::default(),
        };
        self.nodes.entry(node.to_owned()).or_insert_with(fresh)
    }
}

#[cfg(test)]
mod tests;
