//! Cluster membership on chitchat (pinned 0.13.0): who is in the cluster, how to reach
//! them, and the per-node replicated key-value state the CRDT counters live in.
//!
//! chitchat gives the gossip (scuttlebutt anti-entropy over UDP), cluster-id checks,
//! seeds re-resolved by DNS, a phi-accrual failure detector, dead-node GC and each
//! node's versioned key-values. This module adds what the gateway needs on top:
//! validated config (`config.rs`), metadata as reserved keys (`metadata.rs`), one trusted
//! member per `node_id` with duplicate refusal and generation takeover (`view.rs`), and a
//! cap on what a node publishes (`budget.rs`). Design and limits:
//! docs/design/membership.md.
//!
//! Actor shape: chitchat's server task owns the state behind its handle; a small view
//! task follows chitchat's live-set watcher, runs the pure `view.rs` arbiter and
//! publishes a [`LiveView`] on a watch channel. Reads intersect that view with
//! chitchat's current live set, so a member the failure detector has just declared dead
//! disappears at once.

mod budget;
mod config;
mod error;
mod metadata;
mod view;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chitchat::transport::Transport;
use chitchat::{ChitchatHandle, ChitchatId, NodeState, spawn_chitchat};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

pub use self::budget::{ENTRY_OVERHEAD_BYTES, MAX_STATE_BYTES_CEILING, StateLimits, StateSize};
pub use self::config::{
    DEFAULT_DEAD_NODE_GRACE, DEFAULT_GOSSIP_INTERVAL, DEFAULT_PHI_THRESHOLD,
    MAX_INTERVAL_GOSSIP_ROUNDS, MembershipConfig,
};
pub use self::error::MembershipError;
pub use self::metadata::{
    HELD_SINCE_RPC_VERSION, MetadataError, NodeMetadata, RESERVED_PREFIX, RPC_VERSION,
};
use self::view::{Arbiter, Candidate, Event};
pub use self::view::{LiveView, Member, MemberId, UntrustedMember};

/// A running member of the cluster. Dropping it stops gossip (peers then see it die);
/// [`Membership::shutdown`] does the same and waits for the gossip task to end.
pub struct Membership {
    handle: ChitchatHandle,
    self_id: MemberId,
    limits: StateLimits,
    failure_detection_time: Duration,
    seeds: usize,
    view_rx: watch::Receiver<LiveView>,
    duplicates_seen: Arc<AtomicU64>,
    _view_task: AbortOnDrop,
}

/// Every member's values, split: trusted live members, and the rest chitchat
/// still holds (dead, superseded, refused).
#[derive(Debug, Default)]
pub struct MemberValues {
    /// Trusted live members (self included), with their values.
    pub live: Vec<(MemberId, Vec<(String, String)>)>,
    /// Departed members, with their last values.
    pub departed: Vec<(MemberId, Vec<(String, String)>)>,
}

/// Aborts the view task when the [`Membership`] goes away.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Membership {
    /// Validates `config`, binds the gossip socket through `transport` and starts
    /// gossiping with the seeds. Returns at once; peers appear in [`Self::watch_live`].
    pub async fn start(
        config: MembershipConfig,
        transport: &dyn Transport,
    ) -> Result<Membership, MembershipError> {
        config.validate()?;
        let self_chitchat_id = config.chitchat_id();
        let self_id = MemberId::from(&self_chitchat_id);
        let handle = spawn_chitchat(
            config.chitchat_config(),
            config.metadata.to_key_values(),
            transport,
        )
        .await
        .map_err(|err| MembershipError::Start(format!("{err:#}")))?;
        let live_rx = handle
            .with_chitchat(|chitchat| chitchat.live_nodes_watcher())
            .await;
        let mut arbiter = Arbiter::new(self_id.clone());
        let self_candidate = Candidate {
            id: self_id.clone(),
            metadata: Ok(config.metadata.clone()),
        };
        let (initial_view, _) = arbiter.update(vec![self_candidate.clone()]);
        let (view_tx, view_rx) = watch::channel(initial_view);
        let duplicates_seen = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run_view_task(
            live_rx,
            arbiter,
            self_candidate,
            view_tx,
            duplicates_seen.clone(),
        ));
        info!(member = %self_id, cluster_id = %config.cluster_id, seeds = ?config.seeds, "membership started");
        Ok(Membership {
            handle,
            self_id,
            limits: config.limits,
            failure_detection_time: config.failure_detection_time(),
            seeds: config.seeds.len(),
            view_rx,
            duplicates_seen,
            _view_task: AbortOnDrop(task),
        })
    }

    /// This node's identity: `node_id`, generation and advertised gossip address.
    pub fn self_id(&self) -> &MemberId {
        &self.self_id
    }

    /// How many seeds it was configured with (0: a cluster of one by design).
    pub fn seeds_configured(&self) -> usize {
        self.seeds
    }

    /// Publishes key-values in this node's replicated state (all or nothing). Refuses
    /// keys under [`RESERVED_PREFIX`], empty keys, and batches that would take this
    /// node past its [`StateLimits`].
    pub async fn set_many(&self, kvs: Vec<(String, String)>) -> Result<(), MembershipError> {
        self.publish(&[], kvs).await.map(|_| ())
    }

    /// Deletes `deletes` (those this node holds; readers stop seeing them at once,
    /// chitchat keeps a tombstone for the dead-node grace), then sets `kvs`, all or
    /// nothing, under the same checks as [`Self::set_many`]. Returns the size of
    /// this node's published state after the write.
    pub async fn publish(
        &self,
        deletes: &[String],
        kvs: Vec<(String, String)>,
    ) -> Result<StateSize, MembershipError> {
        let limits = self.limits;
        self.handle
            .with_chitchat(|chitchat| {
                let state = chitchat.self_node_state();
                let size = budget::check_batch(state.key_values(), deletes, &kvs, limits)?;
                for key in deletes {
                    // chitchat warns when deleting what it does not hold: most slots
                    // of a ring were never written.
                    if state.get(key).is_some() {
                        state.delete(key);
                    }
                }
                for (key, value) in &kvs {
                    state.set(key, value);
                }
                Ok(size)
            })
            .await
    }

    /// Trusted live members, self included (unless superseded), sorted by `node_id`.
    pub async fn live_members(&self) -> Vec<Member> {
        let live = self.chitchat_live_set().await;
        self.view_rx
            .borrow()
            .members
            .iter()
            .filter(|member| live.contains(&member.id.to_chitchat_id()))
            .cloned()
            .collect()
    }

    /// Incarnations the failure detector holds dead and has not garbage collected yet
    /// (old incarnations of restarted nodes included), sorted.
    pub async fn dead_members(&self) -> Vec<MemberId> {
        let mut dead: Vec<MemberId> = self
            .handle
            .with_chitchat(|chitchat| chitchat.dead_nodes().map(MemberId::from).collect())
            .await;
        dead.sort();
        dead
    }

    /// For every trusted live member (self included), its keys starting with `prefix`
    /// and their values; metadata keys are never returned.
    pub async fn live_values(&self, prefix: &str) -> Vec<(MemberId, Vec<(String, String)>)> {
        self.values(prefix).await.live
    }

    /// [`Self::live_values`] and [`Self::departed_values`] from one snapshot of the
    /// view and of chitchat's state, so no member falls between the two lists.
    pub async fn values(&self, prefix: &str) -> MemberValues {
        let trusted: Vec<MemberId> = (self.view_rx.borrow().members.iter())
            .map(|member| member.id.clone())
            .collect();
        self.handle
            .with_chitchat(|chitchat| {
                let live: HashSet<&ChitchatId> = chitchat.live_nodes().collect();
                let mut out = MemberValues::default();
                let mut listed: HashSet<ChitchatId> = HashSet::new();
                for id in &trusted {
                    let chitchat_id = id.to_chitchat_id();
                    if !live.contains(&chitchat_id) {
                        continue;
                    }
                    if let Some(state) = chitchat.node_state(&chitchat_id) {
                        out.live
                            .push((id.clone(), values_with_prefix(state, prefix)));
                        listed.insert(chitchat_id);
                    }
                }
                for (id, state) in chitchat.node_states() {
                    if !listed.contains(id) && id != chitchat.self_chitchat_id() {
                        out.departed
                            .push((MemberId::from(id), values_with_prefix(state, prefix)));
                    }
                }
                out
            })
            .await
    }

    /// For every member chitchat still holds that is not a trusted live member (dead,
    /// superseded by a newer generation of its `node_id`, or refused as a duplicate),
    /// its keys starting with `prefix` as last received; metadata keys are never
    /// returned. Chitchat keeps a dead node's state for the dead-node grace period, so
    /// what a departed member spent still counts until it has left the window.
    pub async fn departed_values(&self, prefix: &str) -> Vec<(MemberId, Vec<(String, String)>)> {
        self.values(prefix).await.departed
    }

    /// Follows the live view; a new value is published whenever chitchat's live set or
    /// a live node's state version changes (heartbeats alone do not notify).
    pub fn watch_live(&self) -> watch::Receiver<LiveView> {
        self.view_rx.clone()
    }

    /// Upper bound on failure-detection time; see
    /// [`MembershipConfig::failure_detection_time`] for the formula.
    pub fn failure_detection_time(&self) -> Duration {
        self.failure_detection_time
    }

    /// Duplicate incarnations refused since start (a counter for
    /// `tollgate_cluster_duplicate_ids_total`).
    pub fn duplicate_ids_seen(&self) -> u64 {
        self.duplicates_seen.load(Ordering::Relaxed)
    }

    /// Stops gossiping and waits for chitchat's task to end. Peers see this node die
    /// after their failure-detection time.
    pub async fn shutdown(self) -> Result<(), MembershipError> {
        info!(member = %self.self_id, "membership shutting down");
        self._view_task.0.abort();
        self.handle
            .shutdown()
            .await
            .map_err(|err| MembershipError::Shutdown(format!("{err:#}")))
    }

    async fn chitchat_live_set(&self) -> HashSet<ChitchatId> {
        self.handle
            .with_chitchat(|chitchat| chitchat.live_nodes().cloned().collect())
            .await
    }
}

fn values_with_prefix(state: &NodeState, prefix: &str) -> Vec<(String, String)> {
    state
        .iter_prefix(prefix)
        .filter(|(key, _)| !key.starts_with(RESERVED_PREFIX))
        .map(|(key, versioned)| (key.to_string(), versioned.value.clone()))
        .collect()
}

/// Turns chitchat's live set into arbiter candidates (self always included).
fn candidates(
    live: &BTreeMap<ChitchatId, NodeState>,
    self_candidate: &Candidate,
) -> Vec<Candidate> {
    let mut candidates: Vec<Candidate> = live
        .iter()
        .map(|(id, state)| Candidate {
            id: MemberId::from(id),
            metadata: NodeMetadata::parse(|key| state.get(key)),
        })
        .collect();
    if !candidates.iter().any(|c| c.id == self_candidate.id) {
        candidates.push(self_candidate.clone());
    }
    candidates
}

/// The view task: one update per change of chitchat's live set. Ends when chitchat
/// drops its watcher (shutdown) or the task is aborted.
async fn run_view_task(
    mut live_rx: watch::Receiver<BTreeMap<ChitchatId, NodeState>>,
    mut arbiter: Arbiter,
    self_candidate: Candidate,
    view_tx: watch::Sender<LiveView>,
    duplicates_seen: Arc<AtomicU64>,
) {
    while live_rx.changed().await.is_ok() {
        let candidates = candidates(&live_rx.borrow_and_update(), &self_candidate);
        let (view, events) = arbiter.update(candidates);
        duplicates_seen.store(arbiter.duplicates_seen(), Ordering::Relaxed);
        events.iter().for_each(log_event);
        view_tx.send_if_modified(|current| {
            let changed = *current != view;
            *current = view;
            changed
        });
    }
}

fn log_event(event: &Event) {
    match event {
        Event::DuplicateRefused { refused, kept } => {
            warn!(%refused, %kept, "duplicate node id refused: not a member, its state is not trusted (its usage is still charged as a departed member's)");
        }
        Event::Superseded { old, new } => {
            info!(%old, %new, "member restarted with a newer generation")
        }
        Event::SelfSuperseded { by } => {
            error!(%by, "a newer incarnation of this node id is live; peers follow it, not this process");
        }
        Event::Untrusted {
            id,
            reason: reason @ MetadataError::Missing { .. },
        } => {
            info!(member = %id, %reason, "member has no metadata yet; not trusted");
        }
        Event::Untrusted { id, reason } => {
            warn!(member = %id, %reason, "member metadata invalid; not trusted");
        }
    }
}
