//! The sync engine: every `sync_interval` it publishes this node's usage, reads the
//! cluster's, and recomputes every key's allowance. Off the request path: actors only
//! ever read an atomic.
//!
//! - this file: the engine's state and the round (`tick`), leaving, fencing.
//! - `own`: this node's own figures from its actors' exports.
//! - `read`: every member's published state, decoded once.
//! - `recompute`: every key's figures through the mode's round
//!   (`super::mode`), and what it decided applied.
//! - `partition`: the cut arithmetic the round applies (horizon, freeze, split).
//! - `reach`: what this node cannot reach (Redis, lease owners).
//! - `archive`: departed members' usage republished past chitchat's memory.

use super::lease::owner::OwnerBook;
use super::lease::{MemberAddr, View};
use super::mode::{self, Mode, Own};
use super::partition::cut::{CutKnowledge, is_cut_key, split_members};
use super::partition::demand::Demand;
use super::partition::echo::OwnEcho;
use super::partition::history::DemandHistory;
use super::partition::redis_loss::{Announced, Loss, REDIS_CHARGING_KEY, RedisLosses};
use super::partition::sightings::Sightings;
use super::partition::successor::Successors;
use super::parts::NodeParts;
use super::spill::Room;
use super::status::{ClusterStatus, HeldKeys, MemberStatus};
use crate::actor::scope::ScopeExport;
use crate::actor::{Dimension, ScopeId};
use crate::config::{ClusterConfig, CutOff, SyncMode};
use crate::redis::gate::{Fallback, RedisGate};
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tollgate_cluster::counter::{Applied, ClusterUsage, LocalCounters};
use tollgate_cluster::membership::{Member, MemberId, Membership, StateSize};

/// The key every node publishes its sync round's time under (unix ms, decimal), so
/// readers can tell how stale their view of each member is (convergence lag).
pub(crate) const ROUND_AT_KEY: &str = "sync:at";

/// The key a node sets while it cannot reach Redis, so peers that still reach
/// Redis charge its share there: `1` in `redis-lease`; in `redis` the loss's epoch
/// (`super::partition::redis_loss`). `0` when healthy.
pub(crate) const REDIS_LOST_KEY: &str = "redis:lost";

/// Published once, `1`, by a node leaving gracefully (after its last requests were
/// settled and its lease credit returned): peers charge it what its counters say
/// and no partition floor, since it spends nothing more. Without it a restarted
/// node declared dead before its successor appears would be charged its frozen
/// share of L every window until collected (minutes): in
/// `tests/it/cluster_lease.rs` a cluster would serve nothing for 5 s after its
/// busiest node restarted.
pub(crate) const LEFT_KEY: &str = "sync:left";

/// What the engine feeds `lease` mode each round.
pub(crate) struct LeaseFeed {
    /// The view the holder loop and the owner book read.
    pub view: Arc<RwLock<Arc<View>>>,
    /// The lines this node owns (`lease`; `None` in `redis-lease`, where Redis owns).
    pub book: Option<Arc<OwnerBook>>,
    /// Borrowing beyond shares, as a fraction of L.
    pub max_borrow: f64,
    /// Owners the holder loop cannot reach (degraded while any).
    pub cut_off: Arc<RwLock<Vec<String>>>,
    /// What the holder loop keeps per key (for `held`).
    pub holder_held: Arc<super::lease::holder::HolderHeld>,
    /// Lenders are provably live while every member's last published round is at
    /// most this old here: borrowing is allowed only then.
    pub fresh_within_ms: u64,
}

/// The engine's state.
pub(crate) struct Engine {
    node: Arc<NodeParts>,
    membership: Membership,
    sync_mode: SyncMode,
    /// The configured mode's round arithmetic.
    mode: Box<dyn Mode>,
    self_id: String,
    counters: LocalCounters,
    usage: Arc<Mutex<ClusterUsage>>,
    lease: Option<LeaseFeed>,
    /// `redis` mode's gate (its fallback allowances and effective capacities).
    redis_gate: Option<Arc<RedisGate>>,
    /// What a node that lost its owner or Redis may spend (`share` by default).
    cut_off: CutOff,
    demand: Demand,
    /// Each key's demand records and, while anyone is unreachable, the vectors
    /// frozen at the cut (`super::partition::history`).
    history: DemandHistory,
    /// What this node added to each key that its peers may not have seen yet.
    echo: OwnEcho,
    /// Members declared dead and not yet garbage-collected, as counter node ids.
    dead: Vec<String>,
    /// How old the stalest live member's last round is here (ms).
    lag_ms: u64,
    /// Failure-detection time plus two gossip intervals (the look-back bound).
    demand_lag_ms: u64,
    /// How old an own figure must be for every peer to have it: two gossip
    /// intervals and a sync interval (the cut-off share's figure).
    cutoff_lag_ms: u64,
    /// Two gossip intervals: how long a value takes to reach a peer.
    propagation_ms: u64,
    /// Each member's last round, and when it was last fresh here (`super::partition::sightings`).
    sightings: Sightings,
    /// Members (this one included) that announced they cannot reach Redis.
    redis_lost: Vec<String>,
    /// `redis`: who lost Redis, who charges whom (`super::partition::redis_loss`).
    redis_losses: RedisLosses,
    /// `redis`: this node's current loss, its divisor fixed when it began.
    redis_loss: Option<Loss>,
    /// A departed member's confirmation of a loss counts while it was heard from
    /// within half of this (it forgets a dead member this long after).
    dead_node_grace_ms: u64,
    /// Members that announced a graceful leave ([`LEFT_KEY`]): departed, never
    /// treated as unreachable (no floor, no frozen share).
    left: BTreeSet<String>,
    /// Crashed incarnations whose node came back: their floors end a window
    /// after the successor was first seen.
    successors: Successors,
    /// What peers charge the unreachable, for a node that did not see the cut
    /// begin, and what this node charges, for the next one (`super::partition::cut`).
    cut: CutKnowledge,
    /// Whether some unreachable member's last rounds came before this node's
    /// records do: its frozen figures would be wrong, so it adopts its peers'.
    unwitnessed: bool,
    /// When this process joined (ms), and whether its view of the members has
    /// settled since (see [`Engine::settle`]).
    joined_ms: Option<u64>,
    settled: bool,
    status: Arc<Mutex<ClusterStatus>>,
    /// This node's published state after the last successful write.
    state_size: StateSize,
    /// Limit keys whose rings this node deleted since start.
    keys_retired_total: u64,
    /// When the replica's zero registers are next collected (ms).
    next_gc_ms: u64,
    /// How long the last round's recompute took, which decides where the next
    /// one runs ([`StepPlace`]); `None` before the first.
    recompute_took: Option<Duration>,
    /// Departed members' usage this node republishes (`archive`).
    archive: archive::ArchiveState,
}

/// What one round did, for [`Engine::report`].
struct RoundReport<'a> {
    members: &'a [Member],
    now_ms: u64,
    bytes: u64,
    decode_errors: u64,
    received: u64,
    lag_ms: u64,
    publish_error: Option<String>,
}

/// How often the replica's zero registers are collected (ms).
const GC_EVERY_MS: u64 = 10_000;

/// Most limit keys whose rings one round deletes (63 chitchat keys each at the
/// default window); more wait for the next rounds.
const MAX_RETIRED_PER_ROUND: usize = 256;

/// A synchronous step shorter than this runs in place on the request worker.
/// Handing the worker's tasks to another thread (`block_in_place`) means waking
/// that thread, and when the node shares its cores with busy neighbours the OS
/// may take a scheduler slice or more to run it, while every request on the
/// worker waits. Done on every 200 ms round, those hand-offs raise a
/// one-tenant lease node's p99 at 64 connections on one shared worker from
/// 3.02 to 4.20 ms, side by side, with a recompute of ~0.1 ms
/// (docs/BENCHMARKS.md, "Measured choices on the request path"). A step this
/// long costs the requests about what one slow hand-off does.
const IN_PLACE_MAX: Duration = Duration::from_millis(1);

/// Where a round's synchronous step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepPlace {
    /// On the request worker, which it holds meanwhile.
    InPlace,
    /// On this thread after handing the worker's other tasks to a new worker
    /// (`block_in_place`), so a long step (113 ms at 10,000 tenants,
    /// docs/BENCHMARKS.md "Scale") stalls no request.
    OffWorker,
}

impl StepPlace {
    /// Chosen by how long the last such step took: a step's cost moves with the
    /// configured and active keys, which change slowly. The first step, not yet
    /// measured, runs off the worker. A current-thread runtime (tests) has no
    /// other worker to hand the tasks to.
    fn after(last: Option<Duration>) -> StepPlace {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let multi_thread =
            Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
        match last {
            Some(took) if took < IN_PLACE_MAX => StepPlace::InPlace,
            _ if multi_thread => StepPlace::OffWorker,
            _ => StepPlace::InPlace,
        }
    }

    fn run<R>(self, f: impl FnOnce() -> R) -> R {
        match self {
            StepPlace::InPlace => f(),
            StepPlace::OffWorker => tokio::task::block_in_place(f),
        }
    }
}

fn key_of(scope: &ScopeId, dimension: Dimension) -> String {
    format!("{scope}:{}", dimension.as_str())
}

impl Engine {
    /// An engine over a started membership.
    pub(crate) fn new(
        node: Arc<NodeParts>,
        membership: Membership,
        config: &ClusterConfig,
        usage: Arc<Mutex<ClusterUsage>>,
        status: Arc<Mutex<ClusterStatus>>,
        lease: Option<LeaseFeed>,
        redis_gate: Option<Arc<RedisGate>>,
    ) -> Engine {
        let windows = *lock(&usage).windows();
        let window = *windows.base();
        // A crashed incarnation's floor holds until its spending left every
        // window a key of this node is counted over.
        let hold_window = match node.bindings.iter().any(|b| b.dimension.is_daily()) {
            true => *windows.long(),
            false => window,
        };
        let self_id = membership.self_id().to_string();
        let cutoff_lag_ms = (config.gossip_interval * 2 + config.sync_interval).as_millis() as u64;
        let demand_lag_ms = (config
            .gossip_interval
            .mul_f64(2.0 * config.phi_threshold + 2.0)
            + config.gossip_interval * 2)
            .as_millis() as u64;
        Engine {
            node,
            membership,
            sync_mode: config.mode,
            mode: mode::of(config),
            self_id,
            counters: LocalCounters::new(windows),
            usage,
            lease,
            redis_gate,
            cut_off: config.lease.cut_off,
            demand: Demand::new(window.window_ms()),
            history: DemandHistory::new(demand_lag_ms),
            echo: OwnEcho::new(cutoff_lag_ms),
            dead: Vec::new(),
            lag_ms: 0,
            cutoff_lag_ms,
            propagation_ms: (config.gossip_interval * 2).as_millis() as u64,
            sightings: Sightings::default(),
            demand_lag_ms,
            redis_lost: Vec::new(),
            redis_losses: RedisLosses::default(),
            redis_loss: None,
            dead_node_grace_ms: config.dead_node_grace.as_millis() as u64,
            left: BTreeSet::new(),
            successors: Successors::new(Successors::hold_for(
                hold_window.window_ms(),
                hold_window.bucket_ms(),
            )),
            cut: CutKnowledge::default(),
            unwitnessed: false,
            joined_ms: None,
            settled: false,
            status,
            state_size: StateSize::default(),
            keys_retired_total: 0,
            next_gc_ms: 0,
            recompute_took: None,
            archive: archive::ArchiveState::default(),
        }
    }

    /// Whether this node's view of the members can be trusted to own lease keys.
    ///
    /// A node that just started sees no peer live until their heartbeats arrive,
    /// so for a round or two it believes it owns every key and, with no live
    /// holder to wait for, would grant at once, while its peers still hold credit
    /// from the owner it replaced (a previous incarnation of itself, after a
    /// restart). The jepsen harness measured that as 41 of L = 40 after a restart.
    /// Settled (and latched): once every member gossip knows of is live (older
    /// incarnations of this node aside), with at least one peer when seeds are
    /// configured, or at the latest one failure-detection time after joining.
    fn settle(&mut self, dead: &[MemberId], live: usize, now_ms: u64) -> bool {
        if self.settled {
            return true;
        }
        let joined = *self.joined_ms.get_or_insert(now_ms);
        let me = &self.membership.self_id().node_id;
        let others_dead =
            (dead.iter()).any(|d| d.node_id != *me && !self.left.contains(&d.to_string()));
        let alone_by_design = self.membership.seeds_configured() == 0;
        let waited = now_ms.saturating_sub(joined)
            >= self.membership.failure_detection_time().as_millis() as u64;
        self.settled = waited || (!others_dead && (live > 1 || alone_by_design));
        self.settled
    }

    /// The membership (for shutdown).
    pub(crate) fn into_membership(self) -> Membership {
        self.membership
    }

    /// A graceful leave, once requests have drained and lease credit went back:
    /// publishes the last figures with [`LEFT_KEY`] and gossips for two
    /// propagation times so peers have them before this node goes silent. If they
    /// do not arrive (a lost datagram, a crash meanwhile), peers treat the silence
    /// as they treat a crash: the safe side. Not announced (silent, charged as a
    /// crash) when something it spent may be unknown to its peers: requests still
    /// running (`drained` false), or spending on a cut-off share while its lease
    /// owner or Redis was unreachable, which only the floor peers charge covers.
    pub(crate) async fn leave(&mut self, drained: bool) {
        let cut_off = !self.unreachable_owners().is_empty();
        if !drained || cut_off || self.redis_lost_here() {
            tracing::info!(
                drained,
                cut_off,
                "leaving without the announcement: peers charge this node as unreachable until it is collected"
            );
            return;
        }
        let now_ms = self.node.registry.clock().now_ns() / 1_000_000;
        let exports = self.node.registry.export_live().await;
        self.record_own(&exports, now_ms);
        let mut published = self.counters.publish(now_ms);
        published.push((ROUND_AT_KEY.to_owned(), now_ms.to_string()));
        published.push((LEFT_KEY.to_owned(), "1".to_owned()));
        match self.membership.set_many(published).await {
            Ok(()) => {
                tokio::time::sleep(Duration::from_millis(2 * self.propagation_ms)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot announce the leave: peers treat this node as crashed")
            }
        }
    }

    /// One round: export and publish this node's figures, read the cluster's,
    /// run the mode's round and apply it, report.
    pub(crate) async fn tick(&mut self) {
        let started = tokio::time::Instant::now();
        if let Some(gate) = &self.redis_gate {
            if gate.is_lost() && gate.probe().await {
                // Back: the allowances go back to unbounded in this round's recompute.
            }
            if !gate.is_lost() {
                gate.release_orphaned_slots().await;
            }
        }
        let now_ms = self.node.registry.clock().now_ns() / 1_000_000;
        // What peers may not have seen yet: at least two gossip intervals and a
        // round, longer when this node sees its peers' rounds later than that
        // (the lag is symmetric enough: large clusters take more gossip rounds).
        let sync_ms = self.cutoff_lag_ms.saturating_sub(self.propagation_ms);
        (self.echo).set_bound(self.cutoff_lag_ms.max(self.lag_ms.saturating_add(sync_ms)));
        let exports = self.node.registry.export_live().await;
        let own = self.record_own(&exports, now_ms);
        let (bytes, publish_error) = self.publish(now_ms).await;
        self.publish_archive(now_ms).await;
        let (decode_errors, received, lag_ms) = self.read_cluster(now_ms).await;
        let dead = self.membership.dead_members().await;
        let members = self.membership.live_members().await;
        self.fence_if_superseded();
        // Settled first: it dates the join `observe_members` compares cuts with.
        let settled = self.settle(&dead, members.len(), now_ms);
        self.observe_members(&dead, &members, lag_ms, now_ms);
        // The round's O(configured keys) part is plain CPU: run a long one where
        // it holds no request worker, so requests keep both workers while the OS
        // shares the cores, and a short one in place.
        let recompute_began = tokio::time::Instant::now();
        StepPlace::after(self.recompute_took)
            .run(|| self.recompute(&own, &members, now_ms, settled));
        self.recompute_took = Some(recompute_began.elapsed());
        let metrics = &self.node.metrics;
        metrics.sync_round(bytes as u64, decode_errors, members.len() as i64);
        metrics.sync_received(received, lag_ms as i64);
        metrics.sync_round_took(started.elapsed());
        let round = RoundReport {
            members: &members,
            now_ms,
            bytes: bytes as u64,
            decode_errors,
            received,
            lag_ms,
            publish_error,
        };
        self.report(&round);
    }

    /// Publishes this node's figures, deletes the rings of keys quiet for a
    /// window; returns the bytes published and why publishing failed, if it did.
    async fn publish(&mut self, now_ms: u64) -> (usize, Option<String>) {
        let mut published = self.counters.publish(now_ms);
        // Keys quiet for a window: delete their rings (every reader reads them 0).
        let windows = *self.counters.windows();
        let quiet_since = now_ms.saturating_sub(windows.base().window_ms());
        let retired = self
            .counters
            .take_retired(quiet_since, MAX_RETIRED_PER_ROUND);
        let mut deletes: Vec<String> = (retired.iter())
            .flat_map(|key| tollgate_cluster::counter::codec::all_keys(key, &windows))
            .collect();
        published.push((ROUND_AT_KEY.to_owned(), now_ms.to_string()));
        if self.redis_gate.is_some() {
            // `redis`: this node's loss, and the peers' losses it charges.
            let lost = self
                .own_redis_loss()
                .map_or_else(|| "0".to_owned(), |l| l.value());
            published.push((REDIS_LOST_KEY.to_owned(), lost));
            let charging = self.redis_losses.charging_value();
            published.push((REDIS_CHARGING_KEY.to_owned(), charging));
        } else if self.sync_mode.uses_redis() {
            let lost = self.redis_lost_here();
            published.push((REDIS_LOST_KEY.to_owned(), u8::from(lost).to_string()));
        }
        // What this node charges the unreachable, for peers that did not see the
        // cut begin (written last: the marker after the charges).
        let (cut_deletes, cut_writes) = self.cut.publish(!self.dead.is_empty());
        deletes.extend(cut_deletes);
        published.extend(cut_writes);
        let bytes: usize = published.iter().map(|(k, v)| k.len() + v.len()).sum();
        let error = match self.membership.publish(&deletes, published).await {
            Ok(size) => {
                self.wrote(size, retired.len());
                // Dated when written, not when exported: peers see it from now.
                let written_ms = self.node.registry.clock().now_ns() / 1_000_000;
                self.echo.published(written_ms);
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot publish usage: peers see stale figures from this node");
                // Nothing was written: every counting value goes out next round.
                // The deletions alone only shrink the state, so they go now: at
                // the cap, they are what makes room again.
                self.counters.unpublish();
                self.cut.unpublish();
                match self.membership.publish(&deletes, Vec::new()).await {
                    Ok(size) => self.wrote(size, retired.len()),
                    Err(_) => self.counters.retire_again(retired),
                }
                Some(e.to_string())
            }
        };
        (bytes, error)
    }

    /// Who is unreachable this round, and what a cut beginning or ending means.
    fn observe_members(&mut self, dead: &[MemberId], members: &[Member], lag_ms: u64, now_ms: u64) {
        let live_ids: Vec<MemberId> = members.iter().map(|m| m.id.clone()).collect();
        self.successors.observe(dead, &live_ids, now_ms);
        // A member that left gracefully spends nothing more: it is departed (its
        // counters count), not unreachable (no floor for what it might spend). So
        // is a crashed incarnation a window after its successor came up
        // (`super::partition::successor`): all it spent has left the window.
        let dead_now: Vec<String> = (dead.iter())
            .map(ToString::to_string)
            .filter(|d| !self.left.contains(d))
            .filter(|d| !self.successors.ended(d, now_ms))
            .collect();
        // A member this node never saw live (one joining, whose first heartbeats
        // have not arrived; a crashed node's incarnation from before this one
        // started) went silent at no moment this node saw: it is charged, but it
        // is no cut to freeze at. Freezing again at a joining node's first
        // rounds would move an earlier unreachable member's floor to the demands
        // of that moment (69 of L = 120 to 17, in the successor test).
        let newly_dead: Vec<String> = (dead_now.iter())
            .filter(|d| !self.dead.contains(d) && self.sightings.last_fresh(d).is_some())
            .cloned()
            .collect();
        if !newly_dead.is_empty() {
            // Someone just became unreachable: freeze every member's demand as last
            // seen (the newly dead are still in the history from their last round).
            self.freeze(&newly_dead, now_ms);
        }
        if dead_now.is_empty() {
            self.history.thaw();
        }
        self.dead = dead_now;
        self.lag_ms = lag_ms;
        self.unwitnessed = self.unwitnessed_cut();
    }

    /// The round's degraded states, in metrics, the log and `/admin/cluster`.
    fn report(&mut self, round: &RoundReport<'_>) {
        let metrics = &self.node.metrics;
        metrics.degraded("members_unreachable", !self.dead.is_empty());
        metrics.degraded("publish_failed", round.publish_error.is_some());
        let cut_off = self.unreachable_owners();
        let redis_lost = self.redis_lost_here();
        metrics.degraded("owner_unreachable", !cut_off.is_empty() && !redis_lost);
        metrics.degraded("redis_unreachable", redis_lost);
        let superseded = self.node.superseded.load(Ordering::Relaxed);
        let degraded = match (&round.publish_error, self.dead.is_empty(), cut_off.is_empty()) {
            _ if superseded => Some(
                "superseded: a newer process runs under this node id; this one refuses every request"
                    .to_owned(),
            ),
            (Some(e), _, _) => Some(format!("publish_failed: {e}")),
            _ if redis_lost => Some(
                "redis_unreachable: admitting within this node's share (after any credit held); peers charge that share in Redis; reconciled when Redis answers".to_owned(),
            ),
            (None, false, _) => Some(format!(
                "members_unreachable: {} charged their frozen share until they return or are collected",
                self.dead.join(", ")
            )),
            (None, true, false) => Some(format!(
                "owner_unreachable: {}: keys they own spend the credit held, then the cut-off policy",
                cut_off.join(", ")
            )),
            (None, true, true) => None,
        };
        // Read before the status lock: no lock is taken inside it.
        let held = self.held_keys();
        let mut status = self.status.lock();
        status.self_id.clone_from(&self.self_id);
        status.members = round.members.iter().map(MemberStatus::from).collect();
        status.dead.clone_from(&self.dead);
        status.left = self.left.iter().cloned().collect();
        status.last_sync_ms = round.now_ms;
        status.bytes_published_total += round.bytes;
        status.decode_errors_total += round.decode_errors;
        status.duplicate_ids_seen = self.membership.duplicate_ids_seen();
        status.unreachable_charged.clone_from(self.cut.recorded());
        status.cut_adopted = self.unwitnessed;
        // The members a `local split` budget came from this round (its own
        // freeze, or a peer's list), else this node's own freeze.
        status.cut_members = match self.cut.members() {
            [] => self.history.frozen_members(),
            used => used.to_vec(),
        };
        status.bytes_received_total += round.received;
        status.state_keys = self.state_size.keys;
        status.state_bytes = self.state_size.bytes;
        status.keys_retired_total = self.keys_retired_total;
        status.unreachable_owners = cut_off;
        status.convergence_lag_ms = round.lag_ms;
        status.held = held;
        if status.degraded.is_none() != degraded.is_none() {
            match &degraded {
                Some(reason) => tracing::warn!(%reason, "cluster sync degraded"),
                None => tracing::info!("cluster sync healthy again"),
            }
        }
        status.degraded = degraded;
    }

    /// Stops admitting for good once a newer process runs under this node's id.
    ///
    /// Node ids name one process at a time: peers follow the highest generation
    /// of an id (docs/design/membership.md), so an older process that goes on
    /// serving spends outside every owner's and counter's account, and a crashed
    /// incarnation's floor ends a window after its successor appears
    /// (`super::partition::successor`) on the strength of this rule. A process cut off when
    /// its successor started cannot see it until the cut heals: that case is the
    /// operator's (docs/config.md, `node_id`); this fence ends it at the heal.
    fn fence_if_superseded(&self) {
        let superseded = self.membership.watch_live().borrow().self_superseded;
        if superseded && !self.node.superseded.swap(true, Ordering::Relaxed) {
            tracing::error!(
                node = %self.self_id,
                "a newer process runs under this node id: refusing every request from now on (503); stop this process"
            );
            self.node.metrics.degraded("superseded", true);
        }
    }

    /// A write to the cluster state succeeded, leaving it at `size`, with the
    /// rings of `retired` limit keys deleted.
    fn wrote(&mut self, size: StateSize, retired: usize) {
        self.node.metrics.sync_state(size.bytes);
        self.state_size = size;
        self.keys_retired_total += retired as u64;
    }
}

fn lock(usage: &Mutex<ClusterUsage>) -> MutexGuard<'_, ClusterUsage> {
    usage.lock()
}

mod archive;
mod own;
mod partition;
mod reach;
mod read;
mod recompute;
#[cfg(test)]
mod tests;
