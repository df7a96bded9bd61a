//! The node's inbound HTTP listeners (the proxy's, the admin API's, the
//! internal RPC's): every connection is bounded in time and in number, so
//! idle, half-sent or trickling connections cannot hold a node's descriptors.
//!
//! - **Header timeout**: a request's header must arrive within
//!   `header_timeout`, counted from when the connection opened or its last
//!   answer ended (hyper's header-read timer, which also runs between
//!   keep-alive requests): it is the idle keep-alive timeout too.
//! - **Body idle timeout**: while a handler reads a request body, each chunk
//!   must arrive within `body_idle_timeout` of asking ([`idle_body`]); the
//!   clock runs only while the body is awaited, never while the request waits
//!   in a queue before its body is read.
//! - **Connection caps**: at most `max_connections` open at once, and at
//!   most `max_per_ip` from one peer address when set; one more is answered
//!   `503` with `retry-after` once its request begins, and closed unserved.
//! - **Descriptors**: [`nofile::raise_to_hard`] raises the soft limit to the
//!   hard one at start; [`Limits::connections_for`] fits the cap under it.
//!
//! - **TLS** (optional): a listener given a [`tokio_rustls::TlsAcceptor`]
//!   ([`tls::acceptor`]) completes each handshake within the header timeout
//!   before serving; a connection refused at a cap is closed unanswered
//!   (there is no session to answer in).
//!
//! Graceful shutdown: accepting stops, idle connections close, a connection
//! serving a request closes once its answer ends; [`serve`] returns when none
//! is left.

pub mod idle_body;
pub mod nofile;
pub mod tls;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower_service::Service;

/// Descriptors kept out of the connection cap's reach: the gossip and RPC
/// sockets, Redis connections, log files, the statement client's pool.
pub const RESERVED_DESCRIPTORS: u64 = 128;

/// Refusals written at once at most; beyond, a refused connection is closed
/// without an answer (writing costs a task and a descriptor for up to
/// [`REFUSAL_WRITE_TIMEOUT`]).
const MAX_REFUSALS_IN_FLIGHT: usize = 64;

/// How long a refused connection is kept for its answer: the request's
/// first bytes read (so a client reads the answer as its request's, not as
/// a message on an idle connection), the answer written, the rest drained
/// so the close does not reset it.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// One listener's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request's header must arrive within this, from the connection's start
    /// or its last answer's end (so also the idle keep-alive timeout).
    pub header_timeout: Duration,
    /// Each chunk of a request body must arrive within this while it is read.
    pub body_idle_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one peer address (`None`: no cap).
    pub max_per_ip: Option<usize>,
}

impl Limits {
    /// The connection cap that fits `descriptors` (the soft limit), each
    /// client connection counted with the upstream connection its request
    /// may open, less [`RESERVED_DESCRIPTORS`]: at least 16.
    pub fn connections_for(descriptors: u64) -> usize {
        let usable = descriptors.saturating_sub(RESERVED_DESCRIPTORS) / 2;
        usize::try_from(usable).unwrap_or(usize::MAX).max(16)
    }
}

/// What a listener did, for the metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections open now.
    pub open: AtomicUsize,
    /// Connections accepted since start.
    pub accepted: AtomicU64,
    /// Connections refused at the node's cap.
    pub refused_at_cap: AtomicU64,
    /// Connections refused at the per-address cap.
    pub refused_per_ip: AtomicU64,
}

/// Serves `router` on `listener` within `limits` until `shutdown` resolves,
/// then drains (see the module docs).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stats: Arc<Stats>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let counts = Arc::new(Counts::default());
    let refusals = Arc::new(tokio::sync::Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let slot = match Slot::take(&counts, &stats, peer.ip(), &limits) {
            Ok(slot) => slot,
            Err(_) if tls.is_some() => continue,
            Err(refusal) => {
                refuse(tcp, peer, refusal, &refusals);
                continue;
            }
        };
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let router = router.clone();
        let idle = limits.body_idle_timeout;
        let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
            let request =
                request.map(|body| axum::body::Body::new(idle_body::IdleBody::new(body, idle)));
            router.clone().call(request)
        });
        let Some(tls) = tls.clone() else {
            let watched = graceful.watch(builder.serve_connection(TokioIo::new(tcp), service));
            tokio::spawn(async move {
                if let Err(e) = watched.await {
                    tracing::debug!(error = %e, %peer, "connection ended with an error");
                }
                drop(slot);
            });
            continue;
        };
        let (watcher, builder) = (graceful.watcher(), builder.clone());
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(limits.header_timeout, tls.accept(tcp)).await;
            let Ok(Ok(stream)) = handshake else {
                tracing::debug!(%peer, "TLS handshake failed or took too long");
                return;
            };
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// An accept that failed: a connection reset before it was taken is nothing;
/// anything else (descriptors exhausted: `EMFILE`) is logged and waited out a
/// moment, so a full table does not spin the loop.
async fn accept_failed(e: &std::io::Error) {
    use std::io::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "cannot accept a connection (descriptors exhausted?): retrying in 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Open connections, in all and per peer address.
#[derive(Debug, Default)]
struct Counts {
    /// Peer address -> connections open from it (no zero entries: bounded by
    /// the open connections).
    per_ip: Mutex<HashMap<IpAddr, usize>>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    AtCap,
    PerIp,
}

/// One open connection's place in the counts, given back on drop.
struct Slot {
    counts: Arc<Counts>,
    stats: Arc<Stats>,
    ip: IpAddr,
}

impl Slot {
    fn take(
        counts: &Arc<Counts>,
        stats: &Arc<Stats>,
        ip: IpAddr,
        limits: &Limits,
    ) -> Result<Slot, Refusal> {
        let mut per_ip = counts.per_ip.lock();
        if stats.open.load(Ordering::Relaxed) >= limits.max_connections {
            stats.refused_at_cap.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::AtCap);
        }
        let from_ip = per_ip.entry(ip).or_default();
        if limits.max_per_ip.is_some_and(|cap| *from_ip >= cap) {
            if *from_ip == 0 {
                per_ip.remove(&ip);
            }
            stats.refused_per_ip.fetch_add(1, Ordering::Relaxed);
            return Err(Refusal::PerIp);
        }
        *from_ip += 1;
        stats.open.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            counts: Arc::clone(counts),
            stats: Arc::clone(stats),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per_ip = self.counts.per_ip.lock();
        if let Some(n) = per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per_ip.remove(&self.ip);
            }
        }
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Answers a refused connection `503` (OpenAI's error shape, `retry-after`,
/// `connection: close`) once its request begins, without serving it, then
/// closes it; dropped at once when too many refusals are being written.
fn refuse(
    mut tcp: TcpStream,
    peer: SocketAddr,
    refusal: Refusal,
    refusals: &Arc<tokio::sync::Semaphore>,
) {
    let Ok(permit) = Arc::clone(refusals).try_acquire_owned() else {
        return;
    };
    let message = match refusal {
        Refusal::AtCap => "This node holds as many connections as it accepts; retry shortly.",
        Refusal::PerIp => "Too many connections from this address; reuse or close some.",
    };
    tracing::debug!(%peer, ?refusal, "connection refused");
    let body = serde_json::json!({"error": {"message": message, "type": "server_error",
        "param": null, "code": "too_many_connections"}})
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::spawn(async move {
        let answered = async {
            let mut request = [0u8; 4096];
            let _ = tcp.read(&mut request).await?;
            tcp.write_all(answer.as_bytes()).await?;
            tcp.shutdown().await?;
            while tcp.read(&mut request).await? > 0 {}
            Ok::<(), std::io::Error>(())
        };
        let _ = tokio::time::timeout(REFUSAL_TIMEOUT, answered).await;
        drop(permit);
    });
}

#[cfg(test)]
mod tests;
