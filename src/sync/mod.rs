//! # Cluster sync (the gateway's side)
//!
//! Joins the node to a cluster ([`tollgate_cluster::membership`]) and keeps every
//! limit key's cluster **allowance** up to date: actors enforce their local limits
//! *and* `local_used + cost <= allowance` with one atomic load, and the engine
//! recomputes allowances every `sync_interval` from the CRDT counters the members
//! publish. Promises and arguments: `docs/design/cluster.md`.
//!
//! - [`engine`]: the async shell of a round: export, publish, read, round, apply.
//! - [`mode`]: one round's arithmetic per mode (pure), behind one trait.
//! - [`partition`]: what a round knows about cuts, lag and losses (pure).
//! - [`lease`]: `lease` mode: the owner book, the internal RPC, the holder loop.
//! - [`parts`]: the node's handles sync works on.
//! - [`spill`]: spillover's room per peer and key, read by the proxy.
//! - [`status`]: what `/admin/cluster` shows.

pub(crate) mod auth;
pub(crate) mod engine;
pub(crate) mod lease;
pub(crate) mod mode;
pub(crate) mod partition;
pub(crate) mod parts;
pub(crate) mod spill;
pub(crate) mod status;

use crate::config::{ClusterConfig, SyncMode};
use engine::{Engine, LeaseFeed};
use lease::owner::{KeyTable, OwnerBook};
use parking_lot::{Mutex, RwLock};
use parts::NodeParts;
use status::ClusterStatus;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tollgate_cluster::chitchat::transport::Transport;
use tollgate_cluster::counter::ClusterUsage;
use tollgate_cluster::counter::Windows;
use tollgate_cluster::membership::{
    Membership, MembershipConfig, MembershipError, NodeMetadata, StateLimits,
};

/// A running sync engine (and in `lease` mode its RPC server and holder loop).
pub(crate) struct SyncHandle {
    stop: watch::Sender<bool>,
    /// `None` once [`SyncHandle::shutdown`] took it.
    task: Option<JoinHandle<Engine>>,
    /// `lease` mode's internal RPC server (statements, nudges, spilled requests).
    rpc_task: Option<JoinHandle<()>>,
    lease_tasks: Vec<JoinHandle<()>>,
}

impl Drop for SyncHandle {
    /// Dropped without [`SyncHandle::shutdown`] (the node's server future
    /// aborted, as the tests' crashes do, or unwound): the engine and lease tasks
    /// stop at once, as in a crashed process. Left running detached until they
    /// next look at the stop signal, one that does so while its runtime is
    /// shutting down would panic in its timer (in `tests/scale.rs`, the panic's
    /// backtrace costs 40 MB of heap in the next cell's measurement).
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        for task in self.lease_tasks.iter().chain(&self.rpc_task) {
            task.abort();
        }
    }
}

impl SyncHandle {
    /// Stops the engine and leaves the cluster: lease credit goes back first, then
    /// the last figures go out with the leave announcement ([`Engine::leave`]) if
    /// `drained` (every request ended and was settled); otherwise the node goes
    /// silent and peers charge it as they charge a crash.
    pub(crate) async fn shutdown(mut self, drained: bool) {
        let _ = self.stop.send(true);
        if let Some(rpc) = self.rpc_task.take() {
            if drained {
                // Spilled requests ended with the drain: only statements left.
                let _ = rpc.await;
            } else {
                // The grace ran out with spilled requests still served here: its
                // graceful stop would wait for them without bound.
                rpc.abort();
            }
        }
        for task in std::mem::take(&mut self.lease_tasks) {
            let _ = task.await;
        }
        let Some(task) = self.task.take() else {
            return;
        };
        let Ok(mut engine) = task.await else {
            return;
        };
        engine.leave(drained).await;
        if let Err(e) = engine.into_membership().shutdown().await {
            tracing::warn!(error = %e, "leaving the cluster failed");
        }
    }
}

/// Why the node could not join its cluster.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    /// Membership refused to start.
    #[error("cannot join the cluster: {0}")]
    Membership(#[from] MembershipError),
    /// The window cannot be published.
    #[error("cannot publish this window: {0}")]
    Window(String),
    /// The internal RPC address cannot be bound.
    #[error("cannot listen for lease RPCs on {addr}: {source}")]
    Rpc {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The Redis store cannot be set up (bad URL, cluster unreachable at start).
    #[error("cannot use Redis: {0}")]
    Redis(String),
    /// A key cannot be leased with these settings.
    #[error("cannot lease {key}: {reason}")]
    Lease {
        /// The limit key.
        key: String,
        /// Why.
        reason: String,
    },
}

fn membership_config(config: &ClusterConfig, proxy: SocketAddr) -> MembershipConfig {
    let generation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64;
    let metadata = NodeMetadata {
        proxy_addr: proxy.to_string(),
        rpc_addr: auth::announced_rpc(config),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        sync_mode: format!("{:?}", config.mode).to_lowercase(),
        rpc_version: tollgate_cluster::membership::RPC_VERSION,
        spills: config.mode == SyncMode::Lease && config.lease.spillover,
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
        // About 2,100 limit keys in use at once at the default 60 buckets (a ring
        // of 61 keys of ~50 bytes per windowed key); a key gone quiet has its ring
        // deleted (`LocalCounters::take_retired`), so the cap bounds the keys busy
        // within one window, not those ever used; docs/design/scale.md.
        limits: StateLimits {
            max_keys: 131_072,
            max_bytes: tollgate_cluster::membership::MAX_STATE_BYTES_CEILING,
        },
    }
}

/// Joins the cluster, runs one sync round (so allowances are set before the node
/// serves), and keeps syncing every `sync_interval` until shut down. In `lease` mode
/// also serves the internal RPC and runs the holder loop.
pub(crate) async fn start(
    node: Arc<NodeParts>,
    config: &ClusterConfig,
    proxy: SocketAddr,
    transport: &dyn Transport,
) -> Result<SyncHandle, SyncError> {
    let limits = &node.limits;
    let windows = (limits.cluster_windows()).map_err(|e| SyncError::Window(e.to_string()))?;
    let usage = Arc::new(Mutex::new(ClusterUsage::new(windows)));
    let (stop, stopped) = watch::channel(false);
    let (lease, rpc_task, lease_tasks) = match config.mode {
        mode if mode.leases() => {
            let (feed, rpc, tasks) = start_lease(&node, config, windows, &usage, &stopped).await?;
            (Some(feed), rpc, tasks)
        }
        _ => (None, None, Vec::new()),
    };
    let redis_gate = match config.mode {
        SyncMode::Redis => Some(start_redis_gate(&node, config, windows).await?),
        _ => None,
    };
    let membership = Membership::start(membership_config(config, proxy), transport).await?;
    let status = node.cluster_status.clone().unwrap_or_else(|| {
        Arc::new(Mutex::new(ClusterStatus::new(
            config,
            membership.self_id().to_string(),
        )))
    });
    let mut engine = Engine::new(node, membership, config, usage, status, lease, redis_gate);
    engine.tick().await;
    let interval = config.sync_interval;
    let mut stopped = stopped;
    let task = tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => engine.tick().await,
                _ = stopped.changed() => break,
            }
        }
        engine
    });
    Ok(SyncHandle {
        stop,
        task: Some(task),
        rpc_task,
        lease_tasks,
    })
}

/// The leased modes' parts. `lease`: the owner book, the RPC server on
/// `rpc_listen`, the holder loop. `redis-lease`: the holder loop with Redis as
/// the owner of every key. They read the view the engine writes each round.
async fn start_lease(
    node: &Arc<NodeParts>,
    config: &ClusterConfig,
    windows: Windows,
    usage: &Arc<Mutex<ClusterUsage>>,
    stopped: &watch::Receiver<bool>,
) -> Result<(LeaseFeed, Option<JoinHandle<()>>, Vec<JoinHandle<()>>), SyncError> {
    let window = *windows.base();
    let lease = &config.lease;
    let rpc_auth = Arc::new(
        auth::RpcAuth::new(config).map_err(|reason| SyncError::Lease {
            key: "*".into(),
            reason,
        })?,
    );
    let view = Arc::new(RwLock::new(Arc::new(lease::View::default())));
    let mut tasks = Vec::new();
    let mut rpc = None;
    let (owners, book) = if config.mode == SyncMode::RedisLease {
        let redis = node.redis.as_ref().ok_or_else(|| SyncError::Lease {
            key: "*".into(),
            reason: "redis-lease needs [redis]".into(),
        })?;
        let store = connect_redis(redis, node).await?;
        let owners: Box<dyn lease::holder::Owners> = Box::new(lease::holder::RedisOwner::new(
            store,
            redis.key_prefix.clone(),
            windows,
        ));
        (owners, None)
    } else {
        let book = peer_book(node, config, windows, usage, &view, &rpc_auth)?;
        rpc = Some(serve_rpc(node, config, &book, &rpc_auth, stopped).await?);
        tasks.push(tokio::spawn(lease::owner::offer_room_at_each_bucket(
            book.clone(),
            window.bucket_ms(),
            stopped.clone(),
        )));
        let owners: Box<dyn lease::holder::Owners> =
            Box::new(lease::holder::PeerOwners::new(book.clone()));
        (owners, Some(book))
    };
    let settings = lease::holder::HolderSettings {
        cluster_id: config.cluster_id.clone(),
        auth: rpc_auth.clone(),
        sync_interval: config.sync_interval,
        ttl: lease.ttl,
        window_ms: window.window_ms(),
        max_credit: lease.max_credit,
        rpc_timeout: lease.rpc_timeout,
    };
    let holder = lease::holder::Holder::new(node.clone(), owners, view.clone(), settings);
    let holder_cut_off = holder.cut_off.clone();
    let holder_held = holder.held.clone();
    tasks.push(tokio::spawn(holder.run(stopped.clone())));
    let feed = LeaseFeed {
        view,
        book,
        max_borrow: lease.max_borrow,
        cut_off: holder_cut_off,
        holder_held,
        fresh_within_ms: 2 * (config.sync_interval + config.gossip_interval).as_millis() as u64,
    };
    Ok((feed, rpc, tasks))
}

/// `redis` mode's gate over every bound key, installed for the request path.
async fn start_redis_gate(
    node: &Arc<NodeParts>,
    config: &ClusterConfig,
    windows: Windows,
) -> Result<Arc<crate::redis::gate::RedisGate>, SyncError> {
    let redis = node
        .redis
        .as_ref()
        .ok_or_else(|| SyncError::Redis("`redis` mode needs [redis]".into()))?;
    let store = connect_redis(redis, node).await?;
    let incarnation = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    let gate = Arc::new(crate::redis::gate::RedisGate::new(
        store,
        &redis.key_prefix,
        &node.bindings,
        windows,
        redis.slot_ttl,
        format!("{}/{incarnation}", config.node_id),
    ));
    let _ = node.redis_gate.set(gate.clone());
    Ok(gate)
}

/// The Redis store of `[redis]` (one server, lazily connected, or a cluster).
async fn connect_redis(
    redis: &crate::config::RedisConfig,
    node: &Arc<NodeParts>,
) -> Result<crate::redis::RedisStore, SyncError> {
    let metrics = Some(node.metrics.clone());
    let store = match &redis.url {
        Some(url) => crate::redis::RedisStore::single(url, redis.timeout, metrics),
        None => {
            crate::redis::RedisStore::cluster(&redis.cluster_urls, redis.timeout, metrics).await
        }
    };
    store.map_err(|e| SyncError::Redis(e.to_string()))
}

/// `lease` mode's owner book over the configured keys.
fn peer_book(
    node: &Arc<NodeParts>,
    config: &ClusterConfig,
    windows: Windows,
    usage: &Arc<Mutex<ClusterUsage>>,
    view: &Arc<RwLock<Arc<lease::View>>>,
    rpc_auth: &Arc<auth::RpcAuth>,
) -> Result<Arc<OwnerBook>, SyncError> {
    let lease = &config.lease;
    let ttl_ms = lease.ttl.as_millis() as u64;
    let keys = KeyTable::new(node.bindings.clone(), windows, lease.max_credit, ttl_ms).map_err(
        |(key, e)| SyncError::Lease {
            key,
            reason: e.to_string(),
        },
    )?;
    let nudger = lease::owner::Nudger {
        client: lease::rpc::client(lease.rpc_timeout),
        auth: rpc_auth.clone(),
        cluster_id: config.cluster_id.clone(),
    };
    let book = Arc::new(OwnerBook::new(
        keys,
        view.clone(),
        usage.clone(),
        node.registry.clock(),
        node.metrics.clone(),
        Some(nudger),
        Some(node.credit_wake.clone()),
    ));
    let _ = node.lease_book.set(book.clone());
    Ok(book)
}

/// The internal RPC server on `rpc_listen`, until `stopped`.
async fn serve_rpc(
    node: &Arc<NodeParts>,
    config: &ClusterConfig,
    book: &Arc<OwnerBook>,
    rpc_auth: &Arc<auth::RpcAuth>,
    stopped: &watch::Receiver<bool>,
) -> Result<JoinHandle<()>, SyncError> {
    let addr = config.rpc_listen.unwrap_or(config.gossip_listen);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| SyncError::Rpc { addr, source })?;
    let rpc_state = Arc::new(lease::rpc::RpcState {
        book: book.clone(),
        auth: rpc_auth.clone(),
        spill_body_limit: node.max_body_bytes,
        cluster_id: config.cluster_id.clone(),
        metrics: node.metrics.clone(),
        read_timeout: config.lease.rpc_timeout,
        spilled: node.spilled.clone(),
    });
    let mut rpc_stop = stopped.clone();
    Ok(tokio::spawn(async move {
        let shutdown = async move {
            let _ = rpc_stop.wait_for(|s| *s).await;
        };
        lease::rpc::serve(listener, rpc_state, shutdown).await;
    }))
}
