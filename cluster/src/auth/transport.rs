//! chitchat's UDP transport, sealed: each envelope chitchat sends is
//! serialized, sealed ([`super::frame`]) and sent; each datagram received is
//! opened, and only then decoded and handed to chitchat. A datagram that fails
//! is dropped and counted in [`Refusals`] before chitchat sees a byte of it.

use super::frame::{MAX_DATAGRAM, Opener, Sealer};
use super::{ClusterKeys, Refusals, unix_ms};
use anyhow::Context;
use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};
use std::net::SocketAddr;
use std::sync::Arc;

/// The sealed UDP transport.
pub struct SealedUdpTransport {
    keys: Arc<ClusterKeys>,
    refusals: Arc<Refusals>,
}

impl SealedUdpTransport {
    /// A transport sealing with `keys` (the gossip channel's), counting what it
    /// refuses in `refusals`.
    pub fn new(keys: ClusterKeys, refusals: Arc<Refusals>) -> SealedUdpTransport {
        SealedUdpTransport {
            keys: Arc::new(keys),
            refusals,
        }
    }
}

#[async_trait]
impl Transport for SealedUdpTransport {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let socket = tokio::net::UdpSocket::bind(listen_addr)
            .await
            .with_context(|| format!("failed to bind to {listen_addr}/UDP for gossip"))?;
        Ok(Box::new(SealedUdpSocket {
            socket,
            sealer: Sealer::new(self.keys.clone(), rand::random()),
            opener: Opener::new(self.keys.clone()),
            refusals: self.refusals.clone(),
            buf_send: Vec::with_capacity(MAX_DATAGRAM),
            buf_recv: vec![0; MAX_DATAGRAM].into_boxed_slice(),
        }))
    }
}

struct SealedUdpSocket {
    socket: tokio::net::UdpSocket,
    sealer: Sealer,
    opener: Opener,
    refusals: Arc<Refusals>,
    buf_send: Vec<u8>,
    buf_recv: Box<[u8]>,
}

#[async_trait]
impl Socket for SealedUdpSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        (self.socket.local_addr()).context("failed to get UDP socket address")
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        self.buf_send.clear();
        envelope.serialize(&mut self.buf_send);
        let Some(sealed) = self.sealer.seal(&self.buf_send, unix_ms()) else {
            // chitchat leaves room for the seal; a datagram this large is a bug
            // there, and dropping it is what the network would do.
            tracing::error!(
                len = self.buf_send.len(),
                "gossip datagram too large to seal: dropped"
            );
            return Ok(SendOutcome { num_bytes_sent: 0 });
        };
        let num_bytes_sent = match self.socket.send_to(&sealed, to).await {
            Ok(sent) => sent,
            // A peer gone or unreachable: gossip's loss, not a broken socket.
            Err(e) if is_transient(&e) => 0,
            Err(e) => return Err(e).context("failed to send chitchat message to peer"),
        };
        Ok(SendOutcome { num_bytes_sent })
    }

    /// Cancel-safe: the only await is the socket's own receive.
    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let (len, from_addr) = match self.socket.recv_from(&mut self.buf_recv).await {
                Ok(received) => received,
                Err(e) if is_transient(&e) => continue,
                Err(e) => return Err(e).context("fatal UDP recv error"),
            };
            let payload = match self.opener.open(&self.buf_recv[..len], unix_ms()) {
                Ok(payload) => payload,
                Err(refusal) => {
                    self.refusals.record(refusal, "gossip", &from_addr);
                    continue;
                }
            };
            let mut read = payload;
            match ChitchatEnvelope::deserialize(&mut read) {
                Ok(envelope) => {
                    return Ok(RecvOutcome {
                        from_addr,
                        envelope,
                        num_bytes_received: len,
                    });
                }
                // Sealed by a member but not chitchat's: a bug on that member.
                Err(e) => {
                    tracing::warn!(from = %from_addr, error = %e, "undecodable gossip from a member")
                }
            }
        }
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::OutOfMemory
    )
}
