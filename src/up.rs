//! `tollgate up --nodes N`: a local cluster on 127.0.0.1 for trying the modes.
//! Node i (1-based) serves its proxy on port 8080+i, gossips on 8180+i and takes
//! lease statements on 8280+i; one built-in mock upstream on 9090 stands in for the
//! provider, with the demo upstreams' limits, so its log shows what the cluster as a
//! whole admitted. Every node has the demo tenant `sk-demo`, whose limits are shared
//! cluster-wide by the chosen mode.

use crate::config::{ClusterConfig, Config, LeaseConfig, LocalShare, RedisConfig, SyncMode};
use crate::server::{self, Bound, ServeError};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// First proxy port minus one: node i serves on `PROXY_BASE + i`.
pub const PROXY_BASE: u16 = 8080;
/// Node i gossips on `GOSSIP_BASE + i`.
pub const GOSSIP_BASE: u16 = 8180;
/// Node i takes lease statements (internal RPC) on `RPC_BASE + i`.
pub const RPC_BASE: u16 = 8280;
/// The built-in mock upstream's port.
pub const MOCK_PORT: u16 = 9090;
/// The cluster secret of `tollgate up` clusters (local demo only).
pub const DEMO_SECRET: &str = "tollgate-up-demo-secret";
/// Most nodes `up` starts (ports must stay below the gossip range).
pub const MAX_NODES: u16 = 99;

/// The config of node `i` (1-based) of an `n`-node local cluster.
pub fn node_config(
    i: u16,
    n: u16,
    mode: SyncMode,
    share: LocalShare,
    redis_url: Option<&str>,
) -> Result<Config, crate::config::ConfigError> {
    let mut config = Config::demo()?;
    config.redis = redis_url.map(|url| RedisConfig {
        url: Some(url.to_owned()),
        cluster_urls: Vec::new(),
        timeout: Duration::from_millis(15),
        key_prefix: "tg".into(),
        slot_ttl: Duration::from_secs(10),
    });
    config.builtin_mock = None;
    config.server.listen = SocketAddr::from(([127, 0, 0, 1], PROXY_BASE + i));
    let gossip = SocketAddr::from(([127, 0, 0, 1], GOSSIP_BASE + i));
    config.cluster = Some(ClusterConfig {
        cluster_id: "tollgate-up".into(),
        node_id: format!("node-{i}"),
        gossip_listen: gossip,
        gossip_advertise_text: None,
        gossip_advertise: None,
        rpc_listen: Some(SocketAddr::from(([127, 0, 0, 1], RPC_BASE + i))),
        rpc_advertise_text: None,
        rpc_advertise: None,
        // A local demo: the secret is printed with the URLs. Real clusters read it
        // from the environment (`secret = "${TOLLGATE_CLUSTER_SECRET}"`).
        secret: Some(DEMO_SECRET.into()),
        accept_secrets: Vec::new(),
        seeds: (1..=n)
            .filter(|j| *j != i)
            .map(|j| format!("127.0.0.1:{}", GOSSIP_BASE + j))
            .collect(),
        gossip_interval: Duration::from_millis(100),
        phi_threshold: 8.0,
        dead_node_grace: Duration::from_secs(60),
        mode,
        local_share: share,
        sync_interval: Duration::from_millis(200),
        lease: LeaseConfig::default(),
    });
    Ok(config)
}

/// Starts the mock and `n` nodes; returns when `shutdown` resolves and all stopped.
pub async fn up(
    n: u16,
    mode: SyncMode,
    share: LocalShare,
    redis_url: Option<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_node: impl Fn(u16, Bound) + Send + Sync + 'static,
) -> Result<(), ServeError> {
    let demo = Config::demo().map_err(|e| ServeError::State(e.to_string()))?;
    let mock_limits = demo
        .builtin_mock
        .clone()
        .ok_or_else(|| ServeError::State("demo config has no mock".into()))?;
    let mock_addr = SocketAddr::from(([127, 0, 0, 1], MOCK_PORT));
    let mock_listener = TcpListener::bind(mock_addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: mock_addr,
            source,
        })?;
    // Nodes stop first and drain; the mock stops after them.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (mock_stop_tx, mock_stop_rx) = watch::channel(false);
    let mock_config = crate::mock::MockConfig::from_builtin(&mock_limits);
    let mut mock_stop = mock_stop_rx;
    let mock = tokio::spawn(crate::mock::serve(mock_listener, mock_config, async move {
        let _ = mock_stop.wait_for(|s| *s).await;
    }));
    let on_node = std::sync::Arc::new(on_node);
    let mut nodes = Vec::new();
    for i in 1..=n {
        let config = node_config(i, n, mode, share, redis_url.as_deref())
            .map_err(|e| ServeError::State(e.to_string()))?;
        let (listener, _) = server::bind(&config).await?;
        let mut stop = stop_rx.clone();
        let on_node = on_node.clone();
        nodes.push(tokio::spawn(server::run(
            config,
            listener,
            None,
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
            move |bound| on_node(i, bound),
        )));
    }
    shutdown.await;
    let _ = stop_tx.send(true);
    for node in nodes {
        match node.await {
            Ok(result) => result?,
            Err(e) => tracing::error!(error = %e, "node task failed"),
        }
    }
    let _ = mock_stop_tx.send(true);
    let _ = mock.await;
    Ok(())
}
