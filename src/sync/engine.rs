//! The sync engine: every `sync_interval` it publishes this node's usage, reads the
//! cluster's, and recomputes every key's allowance. Off the request path: actors only
//! ever read an atomic.

use super::allowance::{KeyFigures, SyncPolicy, policy};
use super::cut::{CutKnowledge, is_cut_key, split_budget};
use super::demand::Demand;
use super::echo::OwnEcho;
use super::history::DemandHistory;
use super::lease::owner::OwnerBook;
use super::lease::{MemberAddr, View};
use super::parts::NodeParts;
use super::redis_loss::{Announced, Loss, REDIS_CHARGING_KEY, RedisLosses};
use super::sightings::Sightings;
use super::spill::{Room, Row};
use super::status::{ClusterStatus, HeldKeys, MemberStatus};
use super::successor::Successors;
use crate::actor::scope::ScopeExport;
use crate::actor::{Binding, Dimension, ScopeId};
use crate::config::{ClusterConfig, CutOff, SyncMode};
use crate::redis::gate::{Fallback, RedisGate};
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tollgate_cluster::counter::{Applied, ClusterUsage, LocalCounters};
use tollgate_cluster::lease::line::Terms;
use tollgate_cluster::membership::{Member, MemberId, Membership, StateSize};

/// The key every node publishes its sync round's time under (unix ms, decimal), so
/// readers can tell how stale their view of each member is (convergence lag).
pub const ROUND_AT_KEY: &str = "sync:at";

/// The key a node sets while it cannot reach Redis, so peers that still reach
/// Redis charge its share there: `1` in `redis-lease`; in `redis` the loss's epoch
/// (`super::redis_loss`). `0` when healthy.
pub const REDIS_LOST_KEY: &str = "redis:lost";

/// Published once, `1`, by a node leaving gracefully (after its last requests were
/// settled and its lease credit returned): peers charge it what its counters say
/// and no partition floor, since it spends nothing more. Without it a restarted
/// node declared dead before its successor appears would be charged its frozen
/// share of L every window until collected (minutes): in
/// `tests/it/cluster_lease.rs` a cluster would serve nothing for 5 s after its
/// busiest node restarted.
pub const LEFT_KEY: &str = "sync:left";

/// What the engine feeds `lease` mode each round.
pub struct LeaseFeed {
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

/// This node's own figures for one key, from its actors.
#[derive(Debug, Default, Clone, Copy)]
struct Own {
    used: u64,
    /// `used` as every peer has surely seen it ([`OwnEcho`]); `used` for
    /// concurrency, which is not re-carved (a slot is taken or not).
    seen: u64,
    demand: u64,
}

/// The engine's state.
pub struct Engine {
    node: Arc<NodeParts>,
    membership: Membership,
    mode: SyncMode,
    policy: Box<dyn SyncPolicy>,
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
    /// frozen at the cut (`super::history`).
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
    /// Each member's last round, and when it was last fresh here (`super::sightings`).
    sightings: Sightings,
    /// Members (this one included) that announced they cannot reach Redis.
    redis_lost: Vec<String>,
    /// `redis`: who lost Redis, who charges whom (`super::redis_loss`).
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
    /// begin, and what this node charges, for the next one (`super::cut`).
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
    pub fn new(
        node: Arc<NodeParts>,
        membership: Membership,
        config: &ClusterConfig,
        usage: Arc<Mutex<ClusterUsage>>,
        status: Arc<Mutex<ClusterStatus>>,
        lease: Option<LeaseFeed>,
        redis_gate: Option<Arc<RedisGate>>,
    ) -> Engine {
        let window = *lock(&usage).window();
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
            mode: config.mode,
            policy: policy(config.mode, config.local_share),
            self_id,
            counters: LocalCounters::new(window),
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
                window.window_ms(),
                window.bucket_ms(),
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
    pub fn into_membership(self) -> Membership {
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
    pub async fn leave(&mut self, drained: bool) {
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

    /// One round: publish, read, recompute.
    #[expect(
        clippy::too_many_lines,
        reason = "the sync round; one core per mode is an open gap (docs/design/architecture.md)"
    )]
    pub async fn tick(&mut self) {
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
        let mut published = self.counters.publish(now_ms);
        // Keys quiet for a window: delete their rings (every reader reads them 0).
        let window = *self.counters.window();
        let quiet_since = now_ms.saturating_sub(window.window_ms());
        let retired = self
            .counters
            .take_retired(quiet_since, MAX_RETIRED_PER_ROUND);
        let deletes: Vec<String> = (retired.iter())
            .flat_map(|key| tollgate_cluster::counter::codec::all_keys(key, &window))
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
        } else if self.mode.uses_redis() {
            let lost = self.redis_lost_here();
            published.push((REDIS_LOST_KEY.to_owned(), u8::from(lost).to_string()));
        }
        // What this node charges the unreachable, for peers that did not see the
        // cut begin (written last: the marker after the charges).
        let (cut_deletes, cut_writes) = self.cut.publish(!self.dead.is_empty());
        let mut deletes = deletes;
        deletes.extend(cut_deletes);
        published.extend(cut_writes);
        let bytes: usize = published.iter().map(|(k, v)| k.len() + v.len()).sum();
        let publish_error = match self.membership.publish(&deletes, published).await {
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
        let (decode_errors, received, lag_ms) = self.read_cluster(now_ms).await;
        let dead = self.membership.dead_members().await;
        let members = self.membership.live_members().await;
        let live_ids: Vec<MemberId> = members.iter().map(|m| m.id.clone()).collect();
        self.fence_if_superseded();
        self.successors.observe(&dead, &live_ids, now_ms);
        // A member that left gracefully spends nothing more: it is departed (its
        // counters count), not unreachable (no floor for what it might spend). So
        // is a crashed incarnation a window after its successor came up
        // (`super::successor`): all it spent has left the window.
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
        let settled = self.settle(&dead, members.len(), now_ms);
        self.unwitnessed = self.unwitnessed_cut();
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
        metrics.degraded("members_unreachable", !self.dead.is_empty());
        metrics.degraded("publish_failed", publish_error.is_some());
        let cut_off = self.unreachable_owners();
        let redis_lost = self.redis_lost_here();
        metrics.degraded("owner_unreachable", !cut_off.is_empty() && !redis_lost);
        metrics.degraded("redis_unreachable", redis_lost);
        let superseded = self.node.superseded.load(Ordering::Relaxed);
        let degraded = match (&publish_error, self.dead.is_empty(), cut_off.is_empty()) {
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
        status.members = members.iter().map(MemberStatus::from).collect();
        status.dead.clone_from(&self.dead);
        status.left = self.left.iter().cloned().collect();
        status.last_sync_ms = now_ms;
        status.bytes_published_total += bytes as u64;
        status.decode_errors_total += decode_errors;
        status.duplicate_ids_seen = self.membership.duplicate_ids_seen();
        status.unreachable_charged.clone_from(self.cut.recorded());
        status.cut_adopted = self.unwitnessed;
        // The members a `local split` budget came from this round (its own
        // freeze, or a peer's list), else this node's own freeze.
        status.cut_members = match self.cut.members() {
            [] => self.history.frozen_members(),
            used => used.to_vec(),
        };
        status.bytes_received_total += received;
        status.state_keys = self.state_size.keys;
        status.state_bytes = self.state_size.bytes;
        status.keys_retired_total = self.keys_retired_total;
        status.unreachable_owners = cut_off;
        status.convergence_lag_ms = lag_ms;
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
    /// (`super::successor`) on the strength of this rule. A process cut off when
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

    /// Feeds this node's exports into the counters; returns its own figures per key.
    fn record_own(
        &mut self,
        exports: &[(ScopeId, ScopeExport)],
        now_ms: u64,
    ) -> HashMap<String, Own> {
        let mut own = HashMap::new();
        for (scope, export) in exports {
            for (dimension, window, requested) in [
                (
                    Dimension::Requests,
                    &export.requests,
                    export.requested_requests,
                ),
                (Dimension::Tokens, &export.tokens, export.requested_tokens),
            ] {
                let Some((_, buckets)) = window else { continue };
                let key = key_of(scope, dimension);
                let mut added = 0u64;
                for (bucket, cost) in buckets {
                    let before = self.counters.bucket_count(&key, *bucket);
                    // Bucket indices line up: both clocks count Unix time in buckets of
                    // the same width (validate() pins one window for every limit).
                    match self.counters.set_bucket(&key, *bucket, *cost, now_ms) {
                        Ok(_) => added = added.saturating_add(cost.saturating_sub(before)),
                        Err(e) => tracing::warn!(%key, error = %e, "usage not published"),
                    }
                }
                self.echo.added(&key, added);
                let demand = self.demand.observe(&key, requested, now_ms);
                let _ = self.counters.set_demand(&key, demand);
                let used = buckets.iter().map(|(_, c)| c).sum();
                own.insert(
                    key.clone(),
                    Own {
                        used,
                        seen: self.echo.seen(&key, used, now_ms),
                        demand,
                    },
                );
            }
            let key = key_of(scope, Dimension::Concurrency);
            // Slots are shared by what waits for one now, not by request rate: the
            // headroom left beside the slots in use goes where requests queue. By
            // rate, a busy node whose clients run one request at a time would take
            // all of it and another node's queued request get none while a slot
            // stands free (the jepsen harness's ghost-slot check: 8 s at one of two
            // slots in use, in `gossip`).
            let demand = export.waiting;
            let _ = self.counters.set_in_flight(&key, export.in_flight);
            let _ = self.counters.set_demand(&key, demand);
            own.insert(
                key,
                Own {
                    used: export.in_flight,
                    seen: export.in_flight,
                    demand,
                },
            );
        }
        // Keys whose actor has retired: nothing of theirs is in flight here, and
        // what they asked for leaves the window with time. Their last exported
        // figures stayed published for good when an actor retired with demand
        // still in its window (an idle timeout equal to the window allows it):
        // a ghost demand that held peers' shares of the key down, and the key's
        // ring, replicas and demand records on every member, never collected
        // (docs/BENCHMARKS.md, "Used once, now idle: the census").
        // The demand trackers' keys too: a key the counters refused (at their
        // cap) still has one.
        let mut retired: Vec<String> = (self.counters.keys().chain(self.demand.keys()))
            .filter(|key| !own.contains_key(*key))
            .cloned()
            .collect();
        retired.sort_unstable();
        retired.dedup();
        for key in retired {
            let _ = self.counters.set_in_flight(&key, 0);
            let _ = self.counters.set_held(&key, 0);
            let _ = self
                .counters
                .set_demand(&key, self.demand.decay(&key, now_ms));
        }
        // `lease`: the cut-off share each used key's owner told this node, so that
        // an owner that forgot it (its line rebuilt while this node saw no move and
        // could not reach it) still charges it (docs/design/lease.md, "Double
        // fault"). After the retired keys' zeros: a credit not dropped yet may
        // still hold a figure its next actor could spend. Rounded up to a
        // sixteenth of L: it changes with the shares, not with every statement.
        if let Some(credits) = &self.node.credits {
            for (index, told) in credits.told_shares() {
                let Some(binding) = self.node.bindings.get(index as usize) else {
                    continue;
                };
                let held = held_figure(told, binding.capacity);
                let _ = self.counters.set_held(&binding.key, held);
            }
        }
        self.echo.forget_seen(now_ms);
        self.demand.forget_retired(now_ms);
        own
    }

    /// The per-key entries this node holds, structure by structure.
    fn held_keys(&self) -> HeldKeys {
        let lease = self.lease.as_ref();
        let holder = |count: fn(&super::lease::holder::HolderHeld) -> &AtomicUsize| {
            lease.map_or(0, |f| count(&f.holder_held).load(Ordering::Relaxed))
        };
        // One lock at a time, each released before the next is taken: a guard
        // made inside the struct literal would live to its end, and the owner
        // book takes the usage lock inside its own (a deadlock the scale tests
        // hit when this held the usage lock while asking the book).
        let replicas = lock(&self.usage).key_count();
        let owner_lines = (lease.and_then(|f| f.book.as_ref())).map_or(0, |b| b.open_lines());
        let credits = (self.node.credits.as_ref()).map_or(0, |t| t.made_count());
        HeldKeys {
            counters: self.counters.len(),
            demand: self.demand.len(),
            history: self.history.len(),
            echo: self.echo.len(),
            replicas,
            credits,
            holder_keys: holder(|h| &h.active),
            reservations: holder(|h| &h.reservations),
            owner_lines,
        }
    }

    /// Applies every live member's published values; returns how many were refused,
    /// the bytes that changed something, and the convergence lag: how old the
    /// stalest live peer's last round is in this node's view (ms).
    #[expect(
        clippy::too_many_lines,
        reason = "the sync round; one core per mode is an open gap (docs/design/architecture.md)"
    )]
    async fn read_cluster(&mut self, now_ms: u64) -> (u64, u64, u64) {
        let (mut refused, mut received, mut lag) = (0, 0, 0);
        let mut redis_lost = Vec::new();
        let mut left = BTreeSet::new();
        let mut live = HashSet::new();
        self.cut.clear_heard();
        let values = self.membership.values("").await;
        let (members, departed) = (values.live, values.departed);
        let mut usage = lock(&self.usage);
        let mut announced = Vec::new();
        for (member, values) in members {
            let node = member.to_string();
            let mut redis = Announced {
                id: member,
                live: true,
                stale: false,
                lost: None,
                charging: None,
            };
            for (key, value) in &values {
                if key == REDIS_LOST_KEY {
                    // `1` (`redis-lease`) or the loss's epoch (`redis`).
                    if value != "0" {
                        redis_lost.push(node.clone());
                    }
                    redis.lost = Some(value.clone());
                    continue;
                }
                if key == REDIS_CHARGING_KEY {
                    redis.charging = Some(value.clone());
                    continue;
                }
                if key == LEFT_KEY {
                    if value == "1" {
                        left.insert(node.clone());
                    }
                    continue;
                }
                if is_cut_key(key) {
                    if node != self.self_id {
                        self.cut.hear(&node, key, value);
                    }
                    continue;
                }
                if key == ROUND_AT_KEY {
                    if node != self.self_id
                        && let Ok(at) = value.parse::<u64>()
                    {
                        lag = lag.max(now_ms.saturating_sub(at));
                        // Bounds how far its clock runs behind this one, so its
                        // buckets can be dated on this clock where it matters.
                        usage.observe_round(&node, at, now_ms, true);
                        // When this member was last heard from.
                        self.sightings.live_round(&node, at, now_ms);
                    }
                    continue;
                }
                match usage.apply(&node, key, value) {
                    Ok(Applied::Updated) => received += (key.len() + value.len()) as u64,
                    Ok(_) => {}
                    Err(e) => {
                        refused += 1;
                        tracing::warn!(%node, %key, error = %e, "refused a gossip value");
                    }
                }
            }
            live.insert(node);
            if self.redis_gate.is_some() {
                announced.push(redis);
            }
        }
        live.insert(self.self_id.clone());
        // Departed members (dead, or a restarted node's previous incarnation): their
        // last values, as received. What they spent in the window still counts (a
        // rebuilt lease line, a dead member's charge); forgetting the old
        // incarnation's usage when a node restarts within one window of itself,
        // the jepsen harness measures 41-42 of L = 40.
        let mut known = live.clone();
        for (member, values) in departed {
            let node = member.to_string();
            let heard_ms = self.sightings.last_fresh(&node).unwrap_or(0);
            let mut redis = Announced {
                id: member,
                live: false,
                stale: now_ms.saturating_sub(heard_ms) >= self.dead_node_grace_ms / 2,
                lost: None,
                charging: None,
            };
            for (key, value) in &values {
                // A departed member's last word on Redis stands until it is
                // collected: it may be cut off and still spending locally.
                if key == REDIS_LOST_KEY {
                    redis.lost = Some(value.clone());
                    continue;
                }
                if key == REDIS_CHARGING_KEY {
                    redis.charging = Some(value.clone());
                    continue;
                }
                // Its last round's stamp bounds its clock's lag even if this node
                // never saw it live (a restarted node's previous incarnation, read
                // by the new one): it ran no later than now.
                if key == ROUND_AT_KEY {
                    if let Ok(at) = value.parse::<u64>() {
                        usage.observe_round(&node, at, now_ms, false);
                        // Its last round, for `unwitnessed_cut` (not a sign of life:
                        // `last_fresh` is not touched).
                        self.sightings.departed_round(&node, at);
                    }
                    continue;
                }
                if key == LEFT_KEY {
                    if value == "1" {
                        left.insert(node.clone());
                    }
                    continue;
                }
                if is_cut_key(key) {
                    continue;
                }
                // Errors were logged while it was live; stale values are ignored.
                let _ = usage.apply(&node, key, value);
            }
            known.insert(node);
            if self.redis_gate.is_some() {
                announced.push(redis);
            }
        }
        self.cut.drop_unmarked();
        usage.retain_nodes(&live);
        // Registers that read 0 carry nothing (a ring its owner deleted keeps its
        // last, zero, values here until collected); one still published comes
        // back with the next read, so collect seldom.
        if now_ms >= self.next_gc_ms {
            usage.gc(now_ms);
            self.next_gc_ms = now_ms + GC_EVERY_MS;
        }
        // Members chitchat collected (after the dead-node grace) are forgotten here
        // too once nothing of theirs counts any more: bounded memory however many
        // restarts, and never before their usage has left the window (the grace
        // may be shorter than a window).
        for node in usage.nodes() {
            if !known.contains(&node) && usage.is_idle(&node, now_ms) {
                usage.forget_node(&node);
            }
        }
        // Bounded: members chitchat still holds (live, dead or superseded). A
        // member that just went silent keeps its last fresh round: the cut's time
        // for `freeze`, and what tells a witness of the cut (`unwitnessed_cut`).
        self.sightings.retain(&known);
        redis_lost.sort();
        self.redis_lost = redis_lost;
        if self.redis_gate.is_some() {
            self.redis_losses = RedisLosses::read(self.membership.self_id(), &announced, &left);
        }
        self.left = left;
        (refused, received, lag)
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the sync round; one core per mode is an open gap (docs/design/architecture.md)"
    )]
    fn recompute(
        &mut self,
        own: &HashMap<String, Own>,
        members: &[Member],
        now_ms: u64,
        settled: bool,
    ) {
        let node = Arc::clone(&self.node);
        let horizon_ms = self.horizon_ms(now_ms);
        // `redis`: what this node divides each capacity by when it spends locally:
        // its loss's fixed divisor, or what a loss beginning now would use.
        let redis_divisor = (self.own_redis_loss())
            .map_or_else(|| self.redis_losses.known_members(), |l| l.divisor);
        let mut views = std::collections::BTreeMap::new();
        let usage_guard = Arc::clone(&self.usage);
        let usage = lock(&usage_guard);
        let mut redis_caps = HashMap::new();
        // Per capacity: the terms every idle key of that capacity shares this round.
        let mut idle_terms: HashMap<u64, Arc<Terms<String>>> = HashMap::new();
        let mut redis_fallback = HashMap::new();
        let mut lease_view = View {
            self_id: self.self_id.clone(),
            members: (members.iter())
                .map(|m| MemberAddr {
                    id: m.id.to_string(),
                    rpc: m.metadata.rpc_addr.clone(),
                    rpc_version: m.metadata.rpc_version,
                })
                .collect(),
            settled,
            redis_held: {
                let mut held: Vec<String> =
                    self.redis_lost.iter().chain(&self.dead).cloned().collect();
                held.sort();
                held.dedup();
                held
            },
            ..View::default()
        };
        // Every key's demand vector lists the same members (each live one, 0 when
        // it published nothing for the key).
        let mut live_nodes = usage.live_nodes();
        live_nodes.push(self.self_id.clone());
        self.history.set_members(&live_nodes, &self.dead);
        // Spillover: each peer's room per key this round (`super::spill`),
        // for the peers that accept spilled requests.
        let spill_peers: Vec<MemberAddr> = (members.iter().zip(&lease_view.members))
            .filter(|(m, addr)| addr.id != self.self_id && m.metadata.spills)
            .map(|(_, addr)| addr.clone())
            .collect();
        let mut spill_rows = HashMap::new();
        for (index, binding) in node.bindings.iter().enumerate() {
            let mine = own.get(&*binding.key).copied().unwrap_or(Own {
                used: 0,
                seen: 0,
                demand: self.demand.current(&binding.key),
            });
            // This node's own figure in `demands` becomes its demand as it stood
            // one failure-detection time ago: what every peer has surely received.
            // The figures frozen at a cut use it: with the fresh own figure (which
            // keeps growing with refused demand during a cut) this side would grant
            // itself more than the other side charges it; the jepsen harness
            // measures that as a 2.5% overshoot of lease mode under partition.
            let mut demands = usage.demand_by_node(&binding.key);
            self.history.observe(
                &binding.key,
                mine.demand,
                &mut demands,
                &self.self_id,
                &self.dead,
                (horizon_ms, now_ms),
            );
            // This node's view of the key's global usage (admin), one read for
            // every mode.
            let others_live = usage.global_usage_except(&binding.key, Some(&self.self_id), now_ms);
            // Keys nobody used in the window are left out (read as 0): a copy of
            // every configured key's name each round would be ~160 B per idle
            // tenant.
            let global = mine.used.saturating_add(others_live);
            if binding.dimension != Dimension::Concurrency && global > 0 {
                views.insert(binding.key.to_string(), global);
            }
            if let (Some(gate), Some(allowance)) = (&self.redis_gate, &binding.allowance) {
                // `redis`: Redis is the bound; the allowance is only the fallback
                // while Redis is lost. Peers that lost Redis are charged what each
                // announced it may spend, `capacity / its divisor`, by lowering the
                // capacity asked of Redis (`super::redis_loss`).
                // The fallback (policy `share`): windows fall back to gossip mode's
                // rule, this node's demand-weighted share of the headroom the
                // counters show (what others already spent through Redis counts:
                // a plain share of L would add to it; the harness measures 5%);
                // concurrency to an equal share of the slots.
                let share = match binding.dimension {
                    Dimension::Concurrency => binding.capacity / redis_divisor,
                    _ => {
                        let figures = KeyFigures {
                            capacity: binding.capacity,
                            self_id: &self.self_id,
                            own_used: mine.used,
                            own_seen: mine.seen,
                            others_used: others_live,
                            demands: &demands,
                        };
                        super::allowance::GossipPolicy
                            .allowance(&figures)
                            .unwrap_or(0)
                    }
                };
                let own = match self.cut_off {
                    CutOff::Share => share,
                    CutOff::FailClosed => 0,
                    CutOff::FailOpen => u64::MAX,
                };
                let lost: u64 = (self.redis_losses.charged())
                    .map(|loss| loss.share_of(binding.capacity))
                    .sum();
                redis_caps.insert(
                    binding.key.to_string(),
                    binding.capacity.saturating_sub(lost),
                );
                redis_fallback.insert(
                    binding.key.to_string(),
                    Fallback {
                        allowance: allowance.clone(),
                        own,
                        charged: match self.cut_off {
                            CutOff::FailOpen => u64::MAX,
                            _ => binding.capacity / redis_divisor,
                        },
                    },
                );
                if allowance.set(if gate.is_lost() { own } else { u64::MAX }) {
                    self.node.registry.wake(&binding.scope);
                }
                continue;
            }
            // What a node that did not see the cut begin charges at least: the
            // most its peers charge, or all of L while none has told it.
            let adopted = (self.unwitnessed && binding.dimension != Dimension::Concurrency)
                .then(|| (self.cut.adopted_charge(&binding.key)).unwrap_or(binding.capacity));
            if let Some(feed) = &self.lease {
                let frozen = self.history.frozen_all(&binding.key);
                let cut = Cut {
                    dead: &self.dead,
                    frozen: &frozen,
                    at_least: adopted.unwrap_or(0),
                };
                let borrow = if self.lag_ms <= feed.fresh_within_ms {
                    feed.max_borrow
                } else {
                    0.0
                };
                // Every idle key of one capacity has the same terms this round (no
                // demand anywhere, nobody cut off, the same members): one copy.
                // The cut-off shares peers say they hold (an idle key has none).
                let held = usage.held_by_node(&binding.key);
                let idle =
                    self.dead.is_empty() && demands.iter().all(|(_, d)| *d == 0) && held.is_empty();
                let make = || {
                    Arc::new(lease_terms(
                        &usage,
                        &cut,
                        &demands,
                        held.clone(),
                        binding,
                        borrow,
                        now_ms,
                    ))
                };
                if idle {
                    idle_terms.entry(binding.capacity).or_insert_with(&make);
                } else {
                    let terms = make();
                    if node.spill.is_some() {
                        let free = match binding.dimension {
                            Dimension::Concurrency => u64::MAX,
                            _ => binding.capacity.saturating_sub(global),
                        };
                        let peers = spill_room(&usage, &terms, binding, &spill_peers, now_ms);
                        let free = AtomicU64::new(free);
                        let own = (terms.shares.get(&self.self_id))
                            .map_or(0, |s| s.saturating_add(terms.borrow))
                            .saturating_sub(mine.used);
                        spill_rows.insert(index as u32, Row { free, own, peers });
                    }
                    self.record_cut_charge(&binding.key, terms.floors.values().sum());
                    lease_view.terms.insert(binding.key.to_string(), terms);
                }
                if mine.demand > 0 {
                    // Read as 0 when absent: an idle key costs no entry.
                    lease_view
                        .demand
                        .insert(binding.key.to_string(), mine.demand);
                }
                continue;
            }
            let mut capacity = binding.capacity;
            let (others_used, demands) = match (binding.dimension, self.mode) {
                // A crashed node's requests died with it: its slots come back as soon
                // as it is declared dead.
                (Dimension::Concurrency, _) => {
                    let live: u64 = usage
                        .in_flight_by_node(&binding.key)
                        .iter()
                        .filter(|(node, _)| *node != self.self_id)
                        .map(|(_, n)| n)
                        .sum();
                    (live, demands)
                }
                // Split: during a cut, this side's part of L, by its members at the
                // cut, goes equally to those live now (a node that joined since
                // shares it), so two sides never hand out more than L between them.
                (_, SyncMode::Local) if !self.dead.is_empty() => {
                    capacity = self.split_budget(binding.capacity);
                    (0, demands)
                }
                (_, SyncMode::Local) => (0, demands),
                // Gossip: unreachable members are charged their frozen share (or
                // what they last published, if more) until GC; other departed
                // members (a restarted node's previous incarnation, before it is
                // declared dead) what they last published.
                _ => {
                    let frozen = self.history.frozen_all(&binding.key);
                    let dead = dead_charge(&usage, &self.dead, &frozen, binding, now_ms)
                        .max(adopted.unwrap_or(0));
                    self.record_cut_charge(&binding.key, dead);
                    let departed = usage.departed_usage_except(&binding.key, &self.dead, now_ms);
                    let others = others_live.saturating_add(dead).saturating_add(departed);
                    (others, demands)
                }
            };
            let figures = KeyFigures {
                capacity,
                self_id: &self.self_id,
                own_used: mine.used,
                own_seen: mine.seen,
                others_used,
                demands: &demands,
            };
            if let Some(allowance) = &binding.allowance
                && allowance.set(self.policy.allowance(&figures).unwrap_or(u64::MAX))
            {
                // Waiters held back by the old figure are admitted now rather than
                // at their next re-check (up to ALLOWANCE_RETRY_HINT_NS later): a
                // freed slot in `gossip` reached a waiting node ~0.25 s late.
                self.node.registry.wake(&binding.scope);
            }
        }
        drop(usage);
        if let Some(gate) = &self.redis_gate {
            gate.set_caps(redis_caps);
            gate.set_fallback(redis_fallback);
            let epoch = gate.lost_since();
            let alone_by_design = self.membership.seeds_configured() == 0;
            let confirmed = self.cut_off == CutOff::FailOpen
                || self.redis_losses.confirmed(epoch, alone_by_design);
            gate.set_confirmed(if confirmed { epoch } else { 0 });
        }
        if let Some(board) = &node.spill {
            let idle = (idle_terms.iter())
                .map(|(capacity, terms)| {
                    let shares = (spill_peers.iter())
                        .map(|p| terms.shares.get(&p.id).map_or(0, |s| s + terms.borrow))
                        .collect();
                    (*capacity, shares)
                })
                .collect();
            board.set(Room {
                peers: spill_peers,
                by_binding: spill_rows,
                idle,
            });
        }
        if let Some(feed) = &self.lease {
            lease_view.idle_terms = idle_terms;
            *feed.view.write() = Arc::new(lease_view);
            if let Some(book) = &feed.book {
                let _nudged = book.on_round();
            }
        }
        self.status.lock().global_usage = views;
    }
}

impl Engine {
    /// `redis`: this node's current loss (none while Redis answers), its divisor
    /// fixed the first time it is asked for: the largest member count known then.
    fn own_redis_loss(&mut self) -> Option<Loss> {
        let epoch = self.redis_gate.as_ref()?.lost_since();
        if epoch == 0 {
            self.redis_loss = None;
        } else if !self.redis_losses.is_read() {
            // Lost before the first reading of the members: no divisor yet (1
            // would let it spend all of L); announced, and confirmable, next round.
            return None;
        } else if self.redis_loss.is_none_or(|l| l.epoch != epoch) {
            let divisor = self.redis_losses.known_members();
            self.redis_loss = Some(Loss { epoch, divisor });
        }
        self.redis_loss
    }

    /// Whether this node currently cannot reach Redis.
    fn redis_lost_here(&self) -> bool {
        if let Some(gate) = &self.redis_gate {
            return gate.is_lost();
        }
        (self.unreachable_owners().iter()).any(|o| o == super::lease::holder::REDIS_OWNER)
    }

    /// The lease owners this node's holder cannot reach now (none outside the
    /// leased modes).
    fn unreachable_owners(&self) -> Vec<String> {
        (self.lease.as_ref())
            .map(|feed| (feed.cut_off.read()).clone())
            .unwrap_or_default()
    }
}

impl Engine {
    /// The time this node's own demand figure is read at: what every peer has
    /// surely received. Healthy: a sync interval and two gossip intervals ago. When
    /// a peer goes silent (a cut, before it is declared dead), its last round stops
    /// advancing and so does this horizon: this node's figure stays what the far
    /// side last saw, however its refused demand grows meanwhile.
    fn horizon_ms(&self, now_ms: u64) -> u64 {
        let healthy = now_ms.saturating_sub(self.cutoff_lag_ms);
        let quietest = (self.sightings.fresh())
            .filter(|(n, _)| !self.dead.contains(*n))
            .map(|(_, t)| t.saturating_sub(self.propagation_ms))
            .min();
        quietest.map_or(healthy, |q| q.min(healthy))
    }

    /// Whether some unreachable member went silent before this node joined (its
    /// last round known here is more than a detection time older than the
    /// join): this node has no figures from that moment, so the ones it would
    /// freeze are not the ones the far side froze. A member with no round at all
    /// (a bare membership) has spent nothing. A member still joining, dead to
    /// chitchat until its first heartbeats arrive, publishes rounds as it goes:
    /// its last round is recent, so a cluster forming does not look like an
    /// unseen cut (with "older than this node's records" as the test it would:
    /// every node of a forming 3-node cluster would charge all of L and publish a
    /// charge for each of 900 keys, as `tests/scale.rs` shows).
    fn unwitnessed_cut(&self) -> bool {
        let Some(joined) = self.joined_ms else {
            return false;
        };
        (self.dead.iter()).any(|d| {
            (self.sightings.round(d))
                .is_some_and(|at| at.saturating_add(self.demand_lag_ms) < joined)
        })
    }

    /// Records what this node charges the unreachable for `key`, for a node
    /// that did not see the cut begin; only the figures above one unit per
    /// unreachable member (what a quiet key is charged anyway).
    fn record_cut_charge(&mut self, key: &str, charge: u64) {
        if !self.dead.is_empty() && charge > self.dead.len() as u64 {
            self.cut.record(key, charge);
        }
    }

    /// `local split` during a cut: this side's part of `capacity` by the members
    /// at the cut (`super::cut::split_budget`), as this node froze them unless it
    /// did not see the cut begin.
    fn split_budget(&mut self, capacity: u64) -> u64 {
        let own = if self.unwitnessed {
            Vec::new()
        } else {
            self.history.frozen_members()
        };
        let (budget, at_cut) = split_budget(capacity, &own, self.cut.adopted_members(), &self.dead);
        self.cut.record_members(&at_cut);
        budget
    }

    /// Freezes every key's demands as last seen, this node's own as it stood
    /// before the cut (when the newly unreachable were last heard from, less the
    /// time a value takes to reach them): the figure the other side holds.
    fn freeze(&mut self, newly_dead: &[String], now_ms: u64) {
        let cut_ms = (newly_dead.iter())
            .filter_map(|d| self.sightings.last_fresh(d))
            .min()
            .unwrap_or(now_ms.saturating_sub(self.demand_lag_ms));
        self.history
            .freeze(cut_ms.saturating_sub(self.propagation_ms));
    }
}

fn lock(usage: &Mutex<ClusterUsage>) -> MutexGuard<'_, ClusterUsage> {
    usage.lock()
}

/// What is known about a cut: the unreachable members and the key's demands
/// frozen when they became unreachable.
#[derive(Clone, Copy)]
struct Cut<'a> {
    dead: &'a [String],
    /// Every vector frozen while the cut goes on (empty: none).
    frozen: &'a [&'a [(String, u64)]],
    /// The least the unreachable are charged in all (what peers that saw the
    /// cut begin charge, for a node that did not: `super::cut`).
    at_least: u64,
}

/// The figure published for a told cut-off share: rounded up to a sixteenth of
/// `capacity` (at least 1), never above it; 0 stays 0.
fn held_figure(told: u64, capacity: u64) -> u64 {
    let step = (capacity / 16).max(1);
    told.div_ceil(step)
        .saturating_mul(step)
        .min(capacity.max(told))
}

/// A key's lease terms.
///
/// Healthy: every member's max-min fair share of L by gossiped demand
/// (`share::fair_shares`); borrowing allowed.
/// While members are unreachable (windowed keys): each is charged a floor, its
/// share of L by the demands **frozen at the cut** (both sides froze the same
/// figures, so they agree without talking) or its last published usage if more;
/// the live members share what is left by their *current* demand (a member that
/// was idle at the cut can still get a share, and this side's total stays within
/// its frozen shares). A holder's cut-off share is not decided here but told by
/// its owner with each reply (`SyncReply::cut_off_share`), from these shares.
/// Concurrency has no floors: an unreachable member's
/// slots come back with its credit's ttl (a crashed node's streams died with it).
fn lease_terms(
    usage: &ClusterUsage,
    cut: &Cut<'_>,
    demands: &[(String, u64)],
    held: BTreeMap<String, u64>,
    binding: &Binding,
    max_borrow: f64,
    now_ms: u64,
) -> Terms<String> {
    let Cut {
        dead,
        frozen,
        at_least,
    } = *cut;
    // Max-min fair, not proportional: near-equal demands jitter, and proportional
    // shares of a saturated key jittered with them (`fair_shares`' docs).
    use tollgate_cluster::share::fair_shares;
    let current: BTreeMap<String, u64> =
        fair_shares(binding.capacity, demands).into_iter().collect();
    let windowed = binding.dimension != Dimension::Concurrency;
    if dead.is_empty() || !windowed {
        let borrow = if dead.is_empty() {
            (binding.capacity as f64 * max_borrow) as u64
        } else {
            0
        };
        return Terms {
            shares: current,
            borrow,
            floors: BTreeMap::new(),
            held,
        };
    }
    let at_cut = if frozen.is_empty() {
        fair_shares(binding.capacity, demands).into_iter().collect()
    } else {
        most_share(binding.capacity, frozen, fair_shares)
    };
    let mut floors = BTreeMap::new();
    for node in dead {
        // +1: largest-remainder rounding of two sides' (nearly equal) vectors may
        // differ by one unit per member.
        let share = at_cut.get(node).map_or(0, |s| s.saturating_add(1));
        let published = usage.usage_of(node, &binding.key, now_ms).unwrap_or(0);
        floors.insert(node.clone(), share.max(published).min(binding.capacity));
    }
    raise_floors(&mut floors, at_least.min(binding.capacity));
    let charged: u64 = floors.values().sum();
    let live = fair_shares(binding.capacity.saturating_sub(charged), demands);
    Terms {
        shares: live.into_iter().collect(),
        borrow: 0,
        floors,
        held,
    }
}

/// Each peer's room on a leased key: its share plus borrowing, less what it
/// last published it used (requests in flight for concurrency).
fn spill_room(
    usage: &ClusterUsage,
    terms: &Terms<String>,
    binding: &Binding,
    peers: &[MemberAddr],
    now_ms: u64,
) -> Vec<AtomicU64> {
    let in_flight = (binding.dimension == Dimension::Concurrency)
        .then(|| usage.in_flight_by_node(&binding.key));
    (peers.iter())
        .map(|peer| {
            let share = (terms.shares.get(&peer.id)).map_or(0, |s| s.saturating_add(terms.borrow));
            let used = match &in_flight {
                Some(by_node) => (by_node.iter())
                    .find(|(node, _)| *node == peer.id)
                    .map_or(0, |(_, n)| *n),
                None => usage.usage_of(&peer.id, &binding.key, now_ms).unwrap_or(0),
            };
            AtomicU64::new(share.saturating_sub(used))
        })
        .collect()
}

/// How a vector of demands divides a capacity (`share::shares`, `fair_shares`).
type ShareRule = fn(u64, &[(String, u64)]) -> Vec<(String, u64)>;

/// Each member's largest share of `capacity` by `rule` over the vectors frozen
/// during a cut. Sides of a cut froze (nearly) the same vectors at its start,
/// but a second member becoming unreachable freezes again on one side only, at
/// figures that moved since: the far side may still hold any earlier one, so a
/// member is charged the most any of them gives it (shares of one vector sum to
/// L; the most of several only charges the unreachable more).
fn most_share(
    capacity: u64,
    frozen: &[&[(String, u64)]],
    rule: ShareRule,
) -> BTreeMap<String, u64> {
    let mut most = BTreeMap::new();
    for vector in frozen {
        for (node, share) in rule(capacity, vector) {
            let at = most.entry(node).or_insert(0);
            *at = share.max(*at);
        }
    }
    most
}

/// Raises `floors` to `at_least` in all, the shortfall spread as evenly as the
/// units allow (the first members in order take the remainder).
fn raise_floors(floors: &mut BTreeMap<String, u64>, at_least: u64) {
    let total: u64 = floors.values().sum();
    let Some(short) = at_least.checked_sub(total).filter(|s| *s > 0) else {
        return;
    };
    let n = floors.len() as u64;
    if n == 0 {
        return;
    }
    for (i, floor) in floors.values_mut().enumerate() {
        let extra = short / n + u64::from((i as u64) < short % n);
        *floor = floor.saturating_add(extra);
    }
}

/// What unreachable members are charged for `binding`: each its share of the
/// capacity frozen at the demands last seen, or its last published usage if more.
fn dead_charge(
    usage: &ClusterUsage,
    dead: &[String],
    frozen: &[&[(String, u64)]],
    binding: &Binding,
    now_ms: u64,
) -> u64 {
    if dead.is_empty() {
        return 0;
    }
    let shares = most_share(binding.capacity, frozen, tollgate_cluster::share::shares);
    dead.iter()
        .map(|node| {
            let share = shares.get(node).copied().unwrap_or(0);
            let published = usage.usage_of(node, &binding.key, now_ms).unwrap_or(0);
            share.max(published)
        })
        .sum()
}

#[cfg(test)]
mod step_place_tests {
    use std::time::Duration;

    use super::{IN_PLACE_MAX, StepPlace};

    const SHORT: Duration = Duration::from_micros(20);

    #[test]
    fn outside_a_runtime_or_on_a_current_thread_every_step_runs_in_place() {
        for last in [None, Some(SHORT), Some(Duration::from_millis(113))] {
            assert_eq!(StepPlace::after(last), StepPlace::InPlace);
        }
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        current.block_on(async {
            assert_eq!(StepPlace::after(None), StepPlace::InPlace);
            assert_eq!(StepPlace::after(Some(IN_PLACE_MAX)), StepPlace::InPlace);
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn on_workers_a_step_goes_off_them_until_measured_short() {
        assert_eq!(StepPlace::after(None), StepPlace::OffWorker, "not measured");
        assert_eq!(StepPlace::after(Some(SHORT)), StepPlace::InPlace);
        let just_under = IN_PLACE_MAX - Duration::from_nanos(1);
        assert_eq!(StepPlace::after(Some(just_under)), StepPlace::InPlace);
        assert_eq!(StepPlace::after(Some(IN_PLACE_MAX)), StepPlace::OffWorker);
        let at_10k_tenants = Duration::from_millis(113);
        assert_eq!(StepPlace::after(Some(at_10k_tenants)), StepPlace::OffWorker);
        // Both places run the step and hand back its result.
        assert_eq!(StepPlace::OffWorker.run(|| 7), 7);
        assert_eq!(StepPlace::InPlace.run(|| 8), 8);
    }
}

#[cfg(test)]
mod tests {
    use super::{held_figure, most_share};
    use tollgate_cluster::share::fair_shares;

    #[test]
    fn a_member_is_charged_the_most_any_freeze_of_the_cut_gives_it() {
        let v = |d: &[(&str, u64)]| -> Vec<(String, u64)> {
            d.iter().map(|(n, x)| (n.to_string(), *x)).collect()
        };
        let first = v(&[("a", 2), ("b", 2), ("c", 12)]);
        let second = v(&[("a", 47), ("b", 47), ("c", 12)]);
        // Claims 4, 4, 24 fit: each its claim, the rest (88) equally.
        let one = most_share(120, &[&first], fair_shares);
        assert_eq!((one["a"], one["b"], one["c"]), (34, 33, 53));
        // Claims 94, 94, 24 do not: max-min gives 48, 48, 24.
        let both = most_share(120, &[&second, &first], fair_shares);
        assert_eq!(both["c"], 53, "the first freeze's share, not the second's");
        assert_eq!(both["a"], 48, "the second freeze's, larger for a");
        assert!(most_share(120, &[], fair_shares).is_empty());
    }

    #[test]
    fn a_held_figure_is_rounded_up_to_a_sixteenth_of_l_and_never_above_it() {
        assert_eq!(held_figure(0, 100), 0, "nothing held: nothing published");
        assert_eq!(held_figure(1, 100), 6);
        assert_eq!(held_figure(13, 100), 18);
        assert_eq!(held_figure(99, 100), 100, "capped at L");
        assert_eq!(held_figure(13, 40), 14, "steps of 2");
        assert_eq!(held_figure(3, 10), 3, "L under 16: exact");
        assert_eq!(held_figure(120, 100), 120, "above a lowered L: as told");
    }
}
