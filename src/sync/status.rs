//! What `/admin/cluster` shows: members with liveness and addresses, mode, degraded
//! state, sync figures. Written by the engine each round.

use crate::config::{LocalShare, SyncMode};
use serde::Serialize;
use tollgate_cluster::membership::Member;

/// One live member.
#[derive(Debug, Clone, Serialize)]
pub struct MemberStatus {
    /// `node/generation@gossip-addr`.
    pub id: String,
    /// Its proxy address.
    pub proxy_addr: String,
    /// Its internal RPC address.
    pub rpc_addr: String,
    /// Its version.
    pub version: String,
    /// Its sync mode.
    pub sync_mode: String,
    /// The internal RPC's wire version it speaks (a mixed cluster, mid-upgrade,
    /// shows two).
    pub rpc_version: u32,
    /// Is it this node?
    pub is_self: bool,
}

impl From<&Member> for MemberStatus {
    fn from(m: &Member) -> Self {
        MemberStatus {
            id: m.id.to_string(),
            proxy_addr: m.metadata.proxy_addr.clone(),
            rpc_addr: m.metadata.rpc_addr.clone(),
            version: m.metadata.version.clone(),
            sync_mode: m.metadata.sync_mode.clone(),
            rpc_version: m.metadata.rpc_version,
            is_self: m.is_self,
        }
    }
}

/// The cluster as this node sees it.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// Sync mode.
    pub mode: SyncMode,
    /// `local` mode's share.
    pub local_share: LocalShare,
    /// What the mode promises about the cluster's total per window
    /// (docs/design/cluster.md has the argument).
    pub promise: &'static str,
    /// This node.
    pub self_id: String,
    /// Live members (this one included).
    pub members: Vec<MemberStatus>,
    /// Members the failure detector declared dead (until garbage-collected), those
    /// that left gracefully excluded: the unreachable, charged their frozen share.
    pub dead: Vec<String>,
    /// Members that announced a graceful leave and are not collected yet: charged
    /// what their counters say, no floor.
    pub left: Vec<String>,
    /// Unix ms of the last sync round.
    pub last_sync_ms: u64,
    /// Bytes of usage published since start.
    pub bytes_published_total: u64,
    /// Bytes of peers' usage that changed this node's view, since start.
    pub bytes_received_total: u64,
    /// How old the stalest live peer's last sync round is in this node's view (ms).
    pub convergence_lag_ms: u64,
    /// Keys this node publishes in the cluster state now (metadata excluded).
    pub state_keys: usize,
    /// Their weight against the 8 MiB cap (`MAX_STATE_BYTES_CEILING`): at the
    /// cap, publishes are refused.
    pub state_bytes: usize,
    /// Limit keys gone quiet whose rings this node deleted since start.
    pub keys_retired_total: u64,
    /// `lease` mode: key owners this node cannot reach.
    pub unreachable_owners: Vec<String>,
    /// Gossip values refused (did not decode) since start.
    pub decode_errors_total: u64,
    /// Other processes seen claiming this cluster's node ids.
    pub duplicate_ids_seen: u64,
    /// While members are unreachable: per limit key, what this node charges them
    /// in all (floors), where that is more than one unit each.
    pub unreachable_charged: std::collections::BTreeMap<String, u64>,
    /// Whether this node did not see the current cut begin, and so charges at
    /// least what its peers publish (docs/design/cluster.md, "Joining during a cut").
    pub cut_adopted: bool,
    /// The members at the current cut this node counts with: those a `local
    /// split` budget came from (its own freeze, or a peer's list), else its own
    /// freeze; empty with no cut, or none known.
    pub cut_members: Vec<String>,
    /// Why this node is degraded, if it is.
    pub degraded: Option<String>,
    /// This node's view of each key's global usage (its own plus the live members'
    /// published usage), for convergence checks; keys with none are absent (0).
    pub global_usage: std::collections::BTreeMap<String, u64>,
    /// The per-key state this node holds, entries per structure.
    pub held: HeldKeys,
}

/// The per-key state a node holds, limit keys per structure, as of its last
/// round. Each is bounded by the keys used within a window or so: once a
/// tenant has been idle for the rest described in docs/design/scale.md
/// ("Used once, now idle"), none of them counts its keys.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct HeldKeys {
    /// This node's own counters (its rings).
    pub counters: usize,
    /// Demand trackers.
    pub demand: usize,
    /// Demand records (the largest of own, vector and last-seen records).
    pub history: usize,
    /// Own additions peers may not have seen yet.
    pub echo: usize,
    /// Peers' registers replicated here, summed over the members.
    pub replicas: usize,
    /// `lease`, `redis-lease`: credits made here and not dropped at rest.
    pub credits: usize,
    /// `lease`, `redis-lease`: keys the holder loop keeps (used, not at rest).
    pub holder_keys: usize,
    /// `redis-lease`: keys whose reservation Redis still keeps for this node.
    pub reservations: usize,
    /// `lease`: open lines this node owns (a line at rest is dropped).
    pub owner_lines: usize,
    /// Departed members' keys this node republishes (their usage still counts
    /// and chitchat no longer holds them).
    pub archived: usize,
}

impl ClusterStatus {
    /// Before the first round.
    pub fn new(config: &crate::config::ClusterConfig, self_id: String) -> ClusterStatus {
        ClusterStatus {
            mode: config.mode,
            local_share: config.local_share,
            promise: crate::sync::mode::of(config).promise(),
            self_id,
            members: Vec::new(),
            dead: Vec::new(),
            left: Vec::new(),
            last_sync_ms: 0,
            bytes_published_total: 0,
            bytes_received_total: 0,
            convergence_lag_ms: 0,
            state_keys: 0,
            state_bytes: 0,
            keys_retired_total: 0,
            unreachable_owners: Vec::new(),
            decode_errors_total: 0,
            duplicate_ids_seen: 0,
            unreachable_charged: Default::default(),
            cut_adopted: false,
            cut_members: Vec::new(),
            degraded: None,
            global_usage: Default::default(),
            held: HeldKeys::default(),
        }
    }
}
