//! # Cluster sync (the gateway's side)
//!
//! Joins the node to a cluster ([`tollgate_cluster::membership`]) and keeps every
//! limit key's cluster **allowance** up to date: actors enforce their local limits
//! *and* `local_used + cost <= allowance` with one atomic load, and the engine
//! recomputes allowances every `sync_interval` from the CRDT counters the members
//! publish. Promises and arguments: `docs/design/cluster.md`.
//!
//! - [`allowance`]: per-mode arithmetic (pure).
//! - [`demand`]: demand over the last window from the actors' cumulative counters.
//! - [`engine`]: one round: export, publish, read, recompute.
//! - [`status`]: what `/admin/cluster` shows.

pub mod allowance;
pub mod demand;
pub mod engine;
pub mod status;

use crate::config::ClusterConfig;
use crate::proxy::AppState;
use engine::Engine;
use status::ClusterStatus;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate_cluster::chitchat::transport::Transport;
use tollgate_cluster::counter::Window;
use tollgate_cluster::membership::{
    Membership, MembershipConfig, MembershipError, NodeMetadata, StateLimits,
};

/// A running sync engine.
pub struct SyncHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<Membership>,
}

impl SyncHandle {
    /// Stops the engine and leaves the cluster.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Ok(membership) = self.task.await
            && let Err(e) = membership.shutdown().await
        {
            tracing::warn!(error = %e, "leaving the cluster failed");
        }
    }
}

/// Why the node could not join its cluster.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Membership refused to start.
    #[error("cannot join the cluster: {0}")]
    Membership(#[from] MembershipError),
    /// The window cannot be published.
    #[error("cannot publish this window: {0}")]
    Window(String),
}

fn membership_config(config: &ClusterConfig, proxy: SocketAddr) -> MembershipConfig {
    let generation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64;
    let metadata = NodeMetadata {
        proxy_addr: proxy.to_string(),
        rpc_addr: config
            .rpc_listen
            .unwrap_or(config.gossip_listen)
            .to_string(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        sync_mode: format!("{:?}", config.mode).to_lowercase(),
    };
    MembershipConfig {
        cluster_id: config.cluster_id.clone(),
        node_id: config.node_id.clone(),
        generation,
        listen_addr: config.gossip_listen,
        advertise_addr: config.gossip_advertise.unwrap_or(config.gossip_listen),
        seeds: config.seeds.clone(),
        gossip_interval: config.gossip_interval,
        phi_threshold: config.phi_threshold,
        dead_node_grace: config.dead_node_grace,
        metadata,
        limits: StateLimits {
            max_keys: 16_384,
            max_bytes: tollgate_cluster::membership::MAX_STATE_BYTES_CEILING,
        },
    }
}

/// Joins the cluster, runs one sync round (so allowances are set before the node
/// serves), and keeps syncing every `sync_interval` until shut down.
pub async fn start(
    state: Arc<AppState>,
    config: &ClusterConfig,
    proxy: SocketAddr,
    transport: &dyn Transport,
) -> Result<SyncHandle, SyncError> {
    let limits = &state.config.limits;
    let window = Window::try_new(limits.window.as_millis() as u64, limits.buckets)
        .map_err(|e| SyncError::Window(e.to_string()))?;
    let membership = Membership::start(membership_config(config, proxy), transport).await?;
    let status = state.cluster_status.clone().unwrap_or_else(|| {
        Arc::new(Mutex::new(ClusterStatus::new(
            config,
            membership.self_id().to_string(),
        )))
    });
    let mut engine = Engine::new(state, membership, config, window, status);
    engine.tick().await;
    let (stop, mut stopped) = watch::channel(false);
    let interval = config.sync_interval;
    let task = tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => engine.tick().await,
                _ = stopped.changed() => break,
            }
        }
        engine.into_membership()
    });
    Ok(SyncHandle { stop, task })
}
