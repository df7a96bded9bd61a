//! Membership configuration, its validation, and the chitchat settings derived from it.
//!
//! The failure-detection formula lives here ([`MembershipConfig::failure_detection_time`])
//! and is explained in docs/design/membership.md, "Failure detection".

use std::net::SocketAddr;
use std::time::Duration;

use chitchat::{ChitchatConfig, ChitchatId, FailureDetectorConfig, ProtocolVersion};

use super::budget::{MAX_STATE_BYTES_CEILING, StateLimits};
use super::error::MembershipError;
use super::metadata::{NodeMetadata, check_host_port};

/// Default gossip round period.
pub const DEFAULT_GOSSIP_INTERVAL: Duration = Duration::from_millis(200);
/// Default phi threshold (chitchat's default).
pub const DEFAULT_PHI_THRESHOLD: f64 = 8.0;
/// Default time a dead member is kept before being garbage collected.
pub const DEFAULT_DEAD_NODE_GRACE: Duration = Duration::from_secs(10 * 60);
/// Heartbeat intervals longer than this many gossip intervals are not sampled by the
/// failure detector (chitchat `max_interval`); it bounds the mean interval, hence the
/// detection time.
pub const MAX_INTERVAL_GOSSIP_ROUNDS: u32 = 2;
/// Shortest gossip interval accepted.
const MIN_GOSSIP_INTERVAL: Duration = Duration::from_millis(10);
/// Heartbeat samples kept per peer by the failure detector.
const SAMPLING_WINDOW_SIZE: usize = 1_000;
/// Longest accepted `cluster_id` / `node_id`, in bytes (they travel in every digest).
const MAX_ID_LEN_BYTES: usize = 128;

/// How a node joins and stays in the cluster. Build it with [`MembershipConfig::new`]
/// and override fields; [`MembershipConfig::validate`] runs at `Membership::start`.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    /// Nodes gossip only with nodes of the same cluster id (chitchat answers others
    /// with `BadCluster`).
    pub cluster_id: String,
    /// Stable node name, e.g. `node-1` (a StatefulSet pod name); unique among live nodes.
    pub node_id: String,
    /// Incarnation number, e.g. unix ms at start; must grow on every restart.
    pub generation: u64,
    /// Local UDP address chitchat binds (port must not be 0: chitchat cannot report
    /// the port it got).
    pub listen_addr: SocketAddr,
    /// Address peers dial to gossip with this node (often `listen_addr`).
    pub advertise_addr: SocketAddr,
    /// Seeds as `ip:port` or `host:port`; host names are re-resolved by chitchat every
    /// 60 s, so a Kubernetes headless service works.
    pub seeds: Vec<String>,
    /// Gossip round period.
    pub gossip_interval: Duration,
    /// Failure-detector threshold: a peer is dead once the time since its last
    /// heartbeat exceeds `phi_threshold` x its mean heartbeat interval.
    pub phi_threshold: f64,
    /// How long a dead member's state is kept before garbage collection (chitchat
    /// `dead_node_grace_period`; also used for key tombstones).
    pub dead_node_grace: Duration,
    /// What this node publishes about itself.
    pub metadata: NodeMetadata,
    /// Caps on what this node publishes through `set_many`.
    pub limits: StateLimits,
}

impl MembershipConfig {
    /// A config with the default gossip interval, phi threshold, grace and limits,
    /// listening and advertising on `gossip_addr`, with no seeds.
    pub fn new(
        cluster_id: impl Into<String>,
        node_id: impl Into<String>,
        generation: u64,
        gossip_addr: SocketAddr,
        metadata: NodeMetadata,
    ) -> Self {
        MembershipConfig {
            cluster_id: cluster_id.into(),
            node_id: node_id.into(),
            generation,
            listen_addr: gossip_addr,
            advertise_addr: gossip_addr,
            seeds: Vec::new(),
            gossip_interval: DEFAULT_GOSSIP_INTERVAL,
            phi_threshold: DEFAULT_PHI_THRESHOLD,
            dead_node_grace: DEFAULT_DEAD_NODE_GRACE,
            metadata,
            limits: StateLimits::default(),
        }
    }

    /// Upper bound on the time between a peer's last heartbeat and the moment this
    /// node stops listing it as live:
    ///
    /// `gossip_interval x (MAX_INTERVAL_GOSSIP_ROUNDS x phi_threshold + 2)`
    ///
    /// The mean heartbeat interval the detector learns is at most
    /// `MAX_INTERVAL_GOSSIP_ROUNDS` gossip intervals (longer samples are dropped), so
    /// phi crosses the threshold within `phi_threshold` of those; liveness is evaluated
    /// once per round (+1 interval), and the last heartbeat may reach us one round
    /// late through a third node (+1 interval). In a healthy cluster the learned mean
    /// is near or below one interval, so detection is usually about half this bound.
    /// Clusters larger than ~10 nodes add about `log3(N) - 1` rounds of propagation.
    pub fn failure_detection_time(&self) -> Duration {
        let rounds = f64::from(MAX_INTERVAL_GOSSIP_ROUNDS) * self.phi_threshold + 2.0;
        self.gossip_interval.mul_f64(rounds.max(0.0))
    }

    /// Checks every field and the rules across fields.
    pub fn validate(&self) -> Result<(), MembershipError> {
        check_id("cluster_id", &self.cluster_id)?;
        check_id("node_id", &self.node_id)?;
        if self.listen_addr.port() == 0 {
            return Err(invalid("listen_addr", "port 0 is not supported"));
        }
        if self.advertise_addr.port() == 0 || self.advertise_addr.ip().is_unspecified() {
            return Err(invalid("advertise_addr", "must be a dialable ip:port"));
        }
        for seed in &self.seeds {
            check_host_port("seeds", seed)
                .map_err(|err| invalid("seeds", format!("`{seed}`: {err}")))?;
        }
        if self.gossip_interval < MIN_GOSSIP_INTERVAL {
            return Err(invalid("gossip_interval", "must be at least 10 ms"));
        }
        if !(self.phi_threshold.is_finite() && self.phi_threshold > 1.0) {
            return Err(invalid("phi_threshold", "must be a finite number above 1"));
        }
        if self.dead_node_grace < self.failure_detection_time() {
            return Err(invalid(
                "dead_node_grace",
                format!(
                    "must be at least the failure detection time ({:?})",
                    self.failure_detection_time()
                ),
            ));
        }
        self.validate_limits()?;
        self.metadata.validate()?;
        Ok(())
    }

    fn validate_limits(&self) -> Result<(), MembershipError> {
        if self.limits.max_keys == 0 {
            return Err(invalid("limits.max_keys", "must be at least 1"));
        }
        if self.limits.max_bytes == 0 || self.limits.max_bytes > MAX_STATE_BYTES_CEILING {
            return Err(invalid(
                "limits.max_bytes",
                format!("must be 1-{MAX_STATE_BYTES_CEILING}"),
            ));
        }
        Ok(())
    }

    pub(crate) fn chitchat_id(&self) -> ChitchatId {
        ChitchatId::new(self.node_id.as_str(), self.generation, self.advertise_addr)
    }

    /// The chitchat configuration. No `extra_liveness_predicate`: it only sees one node
    /// at a time and only filters chitchat's watcher, while duplicate ids need a view
    /// across nodes (see `view.rs`).
    pub(crate) fn chitchat_config(&self) -> ChitchatConfig {
        ChitchatConfig {
            chitchat_id: self.chitchat_id(),
            cluster_id: self.cluster_id.clone(),
            gossip_interval: self.gossip_interval,
            listen_addr: self.listen_addr,
            seed_nodes: self.seeds.clone(),
            failure_detector_config: FailureDetectorConfig {
                phi_threshold: self.phi_threshold,
                sampling_window_size: SAMPLING_WINDOW_SIZE,
                max_interval: self.gossip_interval * MAX_INTERVAL_GOSSIP_ROUNDS,
                initial_interval: self.gossip_interval,
                dead_node_grace_period: self.dead_node_grace,
            },
            // Tombstones come only from a quiet key's ring being deleted (a few per
            // key gone quiet); keep them as long as dead nodes.
            marked_for_deletion_grace_period: self.dead_node_grace,
            catchup_callback: None,
            extra_liveness_predicate: None,
            // V0 (uncompressed digests) is understood by every chitchat 0.13 peer.
            protocol_version: ProtocolVersion::V0,
        }
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> MembershipError {
    MembershipError::InvalidConfig {
        field,
        reason: reason.into(),
    }
}

fn check_id(field: &'static str, value: &str) -> Result<(), MembershipError> {
    let printable = value.bytes().all(|b| b.is_ascii_graphic());
    if value.is_empty() || value.len() > MAX_ID_LEN_BYTES || !printable {
        return Err(invalid(
            field,
            format!("expected 1-{MAX_ID_LEN_BYTES} printable ASCII characters"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> MembershipConfig {
        let metadata = NodeMetadata {
            proxy_addr: "127.0.0.1:8080".to_string(),
            rpc_addr: "127.0.0.1:8081".to_string(),
            version: "0.1.0".to_string(),
            sync_mode: "lease".to_string(),
            rpc_version: crate::membership::RPC_VERSION,
            spills: false,
        };
        MembershipConfig::new("c", "node-1", 1, ([127, 0, 0, 1], 7000).into(), metadata)
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(config().validate(), Ok(()));
    }

    #[test]
    fn failure_detection_time_follows_the_formula() {
        let mut config = config();
        config.gossip_interval = Duration::from_millis(100);
        config.phi_threshold = 8.0;
        assert_eq!(
            config.failure_detection_time(),
            Duration::from_millis(1_800)
        );
    }

    #[test]
    fn each_rule_names_its_field() {
        type Mutation = Box<dyn Fn(&mut MembershipConfig)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("node_id", Box::new(|c| c.node_id.clear())),
            ("cluster_id", Box::new(|c| c.cluster_id = "a b".into())),
            ("listen_addr", Box::new(|c| c.listen_addr.set_port(0))),
            (
                "advertise_addr",
                Box::new(|c| c.advertise_addr = ([0, 0, 0, 0], 7000).into()),
            ),
            ("seeds", Box::new(|c| c.seeds = vec!["nope".into()])),
            (
                "gossip_interval",
                Box::new(|c| c.gossip_interval = Duration::ZERO),
            ),
            ("phi_threshold", Box::new(|c| c.phi_threshold = f64::NAN)),
            (
                "dead_node_grace",
                Box::new(|c| c.dead_node_grace = Duration::from_millis(1)),
            ),
            (
                "limits.max_bytes",
                Box::new(|c| c.limits.max_bytes = 1 << 24),
            ),
        ];
        for (field, mutate) in cases {
            let mut config = config();
            mutate(&mut config);
            match config.validate() {
                Err(MembershipError::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected InvalidConfig, got {other:?}"),
            }
        }
    }

    #[test]
    fn bad_metadata_is_refused() {
        let mut config = config();
        config.metadata.rpc_addr = "nowhere".to_string();
        assert!(matches!(
            config.validate(),
            Err(MembershipError::Metadata(_))
        ));
    }
}
