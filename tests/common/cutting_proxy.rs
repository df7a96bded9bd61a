//! A TCP proxy in front of a node's internal RPC that passes everything through
//! but cuts spilled requests after delivering them: once a connection has carried
//! a `POST /internal/v1/spill/` request to the node and the node begins to answer
//! it with 200, both sides are closed and the answer is never passed on. The sender's hop then
//! fails after its request went out: a hop that was *maybe delivered* (here: surely,
//! the node served it). The node under test advertises this proxy as its
//! `rpc_advertise`, so every peer's lease statements pass through it too.

use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// What marks a spilled request on the wire (HTTP/1.1: the request line).
const SPILL_REQUEST: &[u8] = b"POST /internal/v1/spill/";
/// Most bytes of a cut request kept for the test to read.
const KEPT: usize = 64 * 1024;

/// A running proxy.
pub(crate) struct CuttingProxy {
    /// The address peers are told to dial.
    pub addr: std::net::SocketAddr,
    /// Each spilled request cut (request line, headers and body) and when, in
    /// the order they were cut.
    cut: Arc<Mutex<Vec<(Instant, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl CuttingProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub(crate) async fn start(target: std::net::SocketAddr) -> CuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(Mutex::new(Vec::new()));
        let record = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    if let Ok(node) = TcpStream::connect(target).await {
                        relay(client, node, record).await;
                    }
                });
            }
        });
        CuttingProxy { addr, cut, task }
    }

    /// The spilled requests cut so far, and when.
    pub(crate) fn cut(&self) -> Vec<(Instant, String)> {
        self.cut.lock().unwrap().clone()
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Passes bytes both ways until either side closes, or until the node begins
/// to answer a spilled request: then records it and drops both connections.
async fn relay(client: TcpStream, node: TcpStream, record: Arc<Mutex<Vec<(Instant, String)>>>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut node_read, mut node_write) = node.into_split();
    // The spilled request's bytes once its request line passed (None: none yet).
    let spilled: Arc<Mutex<Option<Vec<u8>>>> = Arc::default();
    let seen = spilled.clone();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        // The tail of the previous read, so a request line split across reads is found.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let chunk = &buf[..n];
            {
                let mut seen = seen.lock().unwrap();
                match seen.as_mut() {
                    Some(kept) if kept.len() < KEPT => kept.extend_from_slice(chunk),
                    Some(_) => {}
                    None => {
                        let mut window = std::mem::take(&mut tail);
                        window.extend_from_slice(chunk);
                        if let Some(at) = find(&window, SPILL_REQUEST) {
                            *seen = Some(window[at..].to_vec());
                        } else {
                            let keep = window.len().saturating_sub(SPILL_REQUEST.len());
                            tail = window.split_off(keep);
                        }
                    }
                }
            }
            if node_write.write_all(chunk).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match node_read.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(request) = spilled.lock().unwrap().take() {
            // The node answers a spilled request. Served (200): it was delivered
            // and served, and the answer is cut. Any other answer (a refusal)
            // passes, so that every cut hop is one the node served.
            if buf[..n].starts_with(b"HTTP/1.1 200") {
                let text = String::from_utf8_lossy(&request).into_owned();
                record.lock().unwrap().push((Instant::now(), text));
                break;
            }
        }
        if client_write.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // Dropping both halves closes both connections.
    upstream.abort();
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
