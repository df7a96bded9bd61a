//! Running a node: bind, serve the app with TCP_NODELAY on every accepted socket
//! (without it, keep-alive responses stall ~40 ms), optionally
//! start the built-in mock upstream, and drain on shutdown: stop accepting, let
//! in-flight requests finish for up to `server.shutdown_grace`, then stop.

use crate::config::Config;
use crate::listen;
use crate::proxy::{self, AppState};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_cluster::chitchat::transport::Transport;

pub mod admin;
pub mod build;

/// The whole HTTP surface of a node: the proxy's routes and the operations
/// routes, with every other path answered in the caller's error shape, and
/// every answer carrying an `x-request-id` (the proxied ones their
/// provider's, when it gave one).
pub fn app(state: Arc<AppState>) -> axum::Router {
    let admin = Arc::new(admin::AdminParts::of(&state));
    let operations = match state.config.server.admin_listen {
        Some(_) => admin::probes(admin),
        None => admin::routes(admin),
    };
    proxy::routes()
        .with_state(state)
        .merge(operations)
        .fallback(proxy::not_found)
        .method_not_allowed_fallback(proxy::method_not_allowed)
        .layer(axum::middleware::map_response(with_request_id))
}

/// The admin listener's app (`server.admin_listen`): the operations routes.
fn admin_app(state: &Arc<AppState>) -> axum::Router {
    admin::routes(Arc::new(admin::AdminParts::of(state)))
        .fallback(proxy::not_found)
        .layer(axum::middleware::map_response(with_request_id))
}

/// The admin listener's bounds: probes and scrapes are few and short.
const ADMIN_LIMITS: listen::Limits = listen::Limits {
    header_timeout: Duration::from_secs(15),
    body_idle_timeout: Duration::from_secs(10),
    max_connections: 256,
    max_per_ip: None,
};

/// Gives an answer that has none its own `x-request-id`.
async fn with_request_id(mut response: axum::response::Response) -> axum::response::Response {
    proxy::request_id::stamp(&mut response);
    response
}

/// The handles cluster sync works on, with requests peers spill here served by
/// this node's proxy.
fn sync_parts(state: &Arc<AppState>) -> Arc<crate::sync::parts::NodeParts> {
    let spilled = state.spill.is_some().then(|| {
        let proxy = state.clone();
        let serve: crate::sync::parts::SpilledRequests = Arc::new(move |api, headers, body| {
            Box::pin(proxy::spill::accept_named(
                proxy.clone(),
                api,
                headers,
                body,
            ))
        });
        serve
    });
    Arc::new(state.sync_parts(spilled))
}

/// Why a node could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The IO error.
        source: std::io::Error,
    },
    /// The state could not be built.
    #[error("{0}")]
    State(String),
    /// Serving failed.
    #[error("server error: {0}")]
    Io(#[from] std::io::Error),
}

/// A running node's addresses.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    /// Proxy address.
    pub proxy: SocketAddr,
    /// Built-in mock upstream address, if started.
    pub mock: Option<SocketAddr>,
    /// Admin listener address (`server.admin_listen`), if set.
    pub admin: Option<SocketAddr>,
}

/// Binds `config.server.listen` (and the built-in mock's address, if configured).
pub async fn bind(config: &Config) -> Result<(TcpListener, Option<TcpListener>), ServeError> {
    let listen = config.server.listen;
    let proxy = TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: listen,
            source,
        })?;
    let mock = match &config.builtin_mock {
        Some(mock) => {
            Some(
                TcpListener::bind(mock.listen)
                    .await
                    .map_err(|source| ServeError::Bind {
                        addr: mock.listen,
                        source,
                    })?,
            )
        }
        None => None,
    };
    Ok((proxy, mock))
}

/// Serves a node on `listener` until `shutdown` resolves, then drains. `on_ready`
/// receives the bound addresses once serving. A `[cluster]` node gossips over UDP.
pub async fn run(
    config: Config,
    listener: TcpListener,
    mock_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(Bound),
) -> Result<(), ServeError> {
    run_node(config, listener, mock_listener, shutdown, on_ready, None).await
}

/// Waits, until `deadline`, for every request this node still serves to end:
/// after the proxy drained, those are requests peers spilled here, served on the
/// internal RPC's server (new ones are refused while draining). Each holds a slot
/// of `in_flight` until its answer ends, so all slots free means none is left.
/// They end before the cluster sync stops, so their usage is stated with the
/// rest of this node's when it gives its credit back. `false`: the grace ran out.
async fn spilled_requests_ended(state: &AppState, deadline: tokio::time::Instant) -> bool {
    let slots = u32::try_from(state.config.server.max_in_flight).unwrap_or(u32::MAX);
    tokio::time::timeout_at(deadline, state.in_flight.acquire_many(slots))
        .await
        .is_ok_and(|acquired| acquired.is_ok())
}

/// As [`run`], gossiping over `transport` (tests use chitchat's in-memory
/// `ChannelTransport`, which can cut links to make partitions). The node's
/// life in order: start, serve, drain, stop.
pub async fn run_with_transport(
    config: Config,
    listener: TcpListener,
    mock_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(Bound),
    transport: Arc<dyn Transport>,
) -> Result<(), ServeError> {
    let transport = Some(transport);
    run_node(
        config,
        listener,
        mock_listener,
        shutdown,
        on_ready,
        transport,
    )
    .await
}

/// The gossip transport of a node: chitchat's UDP, each datagram sealed under
/// the cluster secret; what it refuses counted in
/// `tollgate_gossip_datagrams_refused_total{reason}`.
fn sealed_udp(
    cluster: &crate::config::ClusterConfig,
    metrics: &Arc<crate::ops::metrics::Metrics>,
) -> Result<Arc<dyn Transport>, ServeError> {
    use tollgate_cluster::auth::{Refusals, keys::Channel, transport::SealedUdpTransport};
    let keys = crate::sync::auth::keys(cluster, Channel::Gossip).map_err(ServeError::State)?;
    let metrics = metrics.clone();
    let refusals = Refusals::new(move |refusal| metrics.gossip_datagram_refused(refusal.label()));
    Ok(Arc::new(SealedUdpTransport::new(keys, Arc::new(refusals))))
}

/// [`run`] over `transport`, or the sealed UDP transport when `None`.
async fn run_node(
    config: Config,
    listener: TcpListener,
    mock_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(Bound),
    transport: Option<Arc<dyn Transport>>,
) -> Result<(), ServeError> {
    let grace = config.server.shutdown_grace;
    let (limits, nofile) = connection_limits(&config.server);
    let tls = match &config.server.tls {
        Some(files) => Some(
            listen::tls::acceptor(&files.cert, &files.key)
                .map_err(|e| ServeError::State(format!("server.tls: {e}")))?,
        ),
        None => None,
    };
    let admin_listener = match config.server.admin_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| ServeError::Bind { addr, source })?,
        ),
        None => None,
    };
    // `mock_stop` fires once the proxy has drained, so requests still in flight
    // can reach the built-in mock.
    let (mock_stop_tx, mock_stop_rx) = watch::channel(false);
    let mock = match (mock_listener, &config.builtin_mock) {
        (Some(listener), Some(mock_config)) => {
            Some(serve_builtin_mock(listener, mock_config, mock_stop_rx)?)
        }
        _ => None,
    };
    let cluster = config.cluster.clone();
    let state = Arc::new(build::node_state(config).map_err(|e| ServeError::State(e.message))?);
    if let Some(nofile) = nofile {
        state.metrics.connections().nofile(nofile);
    }
    // What `server.worker_threads` (or tokio's default) gave this node, for operators
    // checking that the setting took.
    (state.metrics).runtime_workers(tokio::runtime::Handle::current().metrics().num_workers());
    tokio::spawn(state.stall_watch.clone().run());
    let proxy = listener.local_addr()?;
    let sync = match &cluster {
        Some(cluster) => {
            let transport = match transport {
                Some(transport) => transport,
                None => sealed_udp(cluster, &state.metrics)?,
            };
            Some(
                crate::sync::start(sync_parts(&state), cluster, proxy, transport.as_ref())
                    .await
                    .map_err(|e| ServeError::State(e.to_string()))?,
            )
        }
        None => None,
    };
    let admin = match admin_listener {
        Some(listener) => Some(serve_admin(
            listener,
            &state,
            tls.clone(),
            mock_stop_tx.subscribe(),
        )?),
        None => None,
    };
    on_ready(Bound { proxy, mock, admin });
    let drained = serve_until_drained(listener, state, limits, tls, shutdown, grace).await?;
    if let Some(sync) = sync {
        sync.shutdown(drained).await;
    }
    let _ = mock_stop_tx.send(true);
    Ok(())
}

/// The admin listener on `listener` until `stop` (sent with the mock's, once
/// the proxy has drained: `/readyz` says `draining` meanwhile); returns its
/// address.
fn serve_admin(
    listener: TcpListener,
    state: &Arc<AppState>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) -> Result<SocketAddr, ServeError> {
    let addr = listener.local_addr()?;
    let stats = Arc::new(listen::Stats::default());
    state
        .metrics
        .connections()
        .watch("admin", Arc::clone(&stats));
    let app = admin_app(state);
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    tokio::spawn(listen::serve(
        listener,
        app,
        ADMIN_LIMITS,
        stats,
        tls,
        stopped,
    ));
    Ok(addr)
}

/// The built-in mock upstream on `listener`, until `stop`; returns its address.
fn serve_builtin_mock(
    listener: TcpListener,
    config: &crate::config::BuiltinMockConfig,
    mut stop: watch::Receiver<bool>,
) -> Result<SocketAddr, ServeError> {
    let addr = listener.local_addr()?;
    let mock_config = crate::mock::MockConfig::from_builtin(config);
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    tokio::spawn(async move {
        if let Err(e) = crate::mock::serve(listener, mock_config, stopped).await {
            tracing::error!(error = %e, "built-in mock upstream failed");
        }
    });
    Ok(addr)
}

/// The proxy listener's bounds, and the open-file limit, raised first (and
/// logged): the connection cap defaults to what the limit allows.
fn connection_limits(
    server: &crate::config::ServerConfig,
) -> (listen::Limits, Option<listen::nofile::Nofile>) {
    let nofile = match listen::nofile::raise_to_hard() {
        Ok(nofile) => {
            tracing::info!(
                soft = nofile.soft,
                hard = nofile.hard,
                raised_from = nofile.raised_from,
                "open-file limit"
            );
            Some(nofile)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit: connections capped at 1,024");
            None
        }
    };
    let fitting = nofile.map_or(1_024, |n| listen::Limits::connections_for(n.soft));
    let max_connections = server.max_connections.unwrap_or(fitting);
    if max_connections > fitting {
        tracing::warn!(
            max_connections,
            fitting,
            "server.max_connections is above what the open-file limit leaves room for: descriptors may run out before the cap refuses a connection"
        );
    }
    let limits = listen::Limits {
        header_timeout: server.header_timeout,
        body_idle_timeout: server.body_idle_timeout,
        max_connections,
        max_per_ip: server.max_connections_per_ip,
    };
    (limits, nofile)
}

/// Serves the proxy until `shutdown`, then drains: returns whether every
/// request ended within `grace` (the proxy's and those peers spilled here).
async fn serve_until_drained(
    listener: TcpListener,
    state: Arc<AppState>,
    limits: listen::Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> Result<bool, ServeError> {
    let stats = Arc::new(listen::Stats::default());
    state
        .metrics
        .connections()
        .watch("proxy", Arc::clone(&stats));
    // `stop` fires when shutdown starts.
    let (stop_tx, stop_rx) = watch::channel(false);
    let draining = state.clone();
    let in_flight = state.clone();
    let mut drained_rx = stop_rx;
    // When the drain began: the grace covers the proxy's requests and the
    // requests peers spilled here, together.
    let drain_began = Arc::new(std::sync::OnceLock::new());
    let began = drain_began.clone();
    let signal = async move {
        shutdown.await;
        draining.draining.store(true, Ordering::Relaxed);
        let _ = began.set(tokio::time::Instant::now());
        tracing::info!("shutting down: draining in-flight requests");
        let _ = stop_tx.send(true);
    };
    let serve = listen::serve(listener, app(state), limits, stats, tls, signal);
    let overrun = async move {
        let _ = drained_rx.wait_for(|stop| *stop).await;
        tokio::time::sleep(grace).await;
    };
    let drained = tokio::select! {
        () = serve => true,
        () = overrun => false,
    };
    let began = drain_began
        .get()
        .copied()
        .unwrap_or_else(tokio::time::Instant::now);
    let drained = drained && spilled_requests_ended(&in_flight, began + grace).await;
    if !drained {
        tracing::warn!(
            grace_secs = grace.as_secs(),
            "shutdown grace expired with requests still in flight"
        );
    }
    Ok(drained)
}
