//! Spillover's room (docs/design/spillover.md): each live peer's room per
//! `lease` key, which the sync engine computes each round from the gossiped
//! figures and the proxy reads to pick a peer for a request its own share
//! cannot take, and the [`Board`] that holds the latest room with what a spill
//! carries (the cluster's id, a tag under the secret). The request side is
//! `proxy::spill`.

use super::lease::MemberAddr;
use axum::http::HeaderMap;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tollgate_cluster::auth::rpc::RpcSigner;

/// The spill route on the internal RPC, one per API (`/internal/v1/spill/chat`).
pub(crate) const PATH_PREFIX: &str = "/internal/v1/spill/";
/// Names the node a request was spilled from. A request carrying it is never
/// spilled again (one hop at most).
pub(crate) const FROM_HEADER: &str = "x-tollgate-spilled-from";
/// Names the cluster a spilled request is for.
pub(crate) const CLUSTER_HEADER: &str = "x-tollgate-cluster-id";
/// On a spilled request's answer: the node that served it.
pub(crate) const SERVED_BY_HEADER: &str = "x-tollgate-served-by";
/// On a spilled request: what is left of its time at the sender, in ms. The
/// peer serves it within that (and its own `request_timeout`).
pub(crate) const TIME_LEFT_HEADER: &str = "x-tollgate-spill-time-left-ms";

/// Each live peer's room per `lease` key as of the sync engine's last round:
/// its share (plus borrowing) less its published usage, never below 0, less
/// what this node spilled there since.
#[derive(Debug, Default)]
pub struct Room {
    /// Live peers (this node left out), in the order of every room vector.
    pub peers: Vec<MemberAddr>,
    /// Per binding index of a key with demand somewhere: each peer's room.
    pub by_binding: HashMap<u32, Row>,
    /// Per capacity: each peer's share of an idle key of that capacity.
    pub idle: HashMap<u64, Vec<u64>>,
}

/// One key's room.
#[derive(Debug)]
pub struct Row {
    /// What the whole cluster has left of L by this node's figures (its own
    /// usage and its peers' published): a spill into a full cluster would only
    /// be refused there.
    pub free: AtomicU64,
    /// This node's own room: its share (plus borrowing) less its own usage.
    pub own: u64,
    /// Each peer's room, in [`Room::peers`]' order.
    pub peers: Vec<AtomicU64>,
}

impl Room {
    /// Peer `peer`'s room on binding `binding` (of capacity `capacity`): 0 when
    /// unknown (no round yet), so that nothing is sent on a guess.
    pub fn at(&self, binding: u32, capacity: u64, peer: usize) -> u64 {
        match self.by_binding.get(&binding) {
            Some(row) => {
                let at_peer = row.peers.get(peer).map_or(0, |r| r.load(Ordering::Relaxed));
                at_peer.min(row.free.load(Ordering::Relaxed))
            }
            None => (self.idle.get(&capacity))
                .and_then(|r| r.get(peer))
                .copied()
                .unwrap_or(0),
        }
    }

    /// Whether this node's own share lacks the room for any of `costs` (a key
    /// with no row is idle: its share is free).
    pub fn own_short(&self, costs: &[(u32, u64)]) -> bool {
        (costs.iter()).any(|(binding, cost)| {
            (self.by_binding.get(binding)).is_some_and(|row| row.own < *cost)
        })
    }

    /// Takes a spilled request's costs off `peer`'s room and the cluster's until
    /// the next round, so that the requests one round spills do not all count on
    /// the same room.
    pub fn take(&self, costs: &[(u32, u64)], peer: usize) {
        let less = |slot: &AtomicU64, cost: u64| {
            let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |room| {
                Some(room.saturating_sub(cost))
            });
        };
        for (binding, cost) in costs {
            if let Some(row) = self.by_binding.get(binding) {
                less(&row.free, *cost);
                if let Some(slot) = row.peers.get(peer) {
                    less(slot, *cost);
                }
            }
        }
    }
}

/// Spillover's state on one node: the engine's latest [`Room`] and what a spill
/// carries.
#[derive(Debug)]
pub struct Board {
    room: RwLock<Arc<Room>>,
    /// How long a spilled request may wait at the peer.
    pub wait: Duration,
    node_id: String,
    cluster_id: String,
    signer: RpcSigner,
}

impl Board {
    /// A board with no room known yet.
    pub fn new(node_id: &str, cluster_id: &str, signer: RpcSigner, wait: Duration) -> Board {
        Board {
            room: RwLock::new(Arc::new(Room::default())),
            wait,
            node_id: node_id.to_string(),
            cluster_id: cluster_id.to_string(),
            signer,
        }
    }

    /// The engine's round: the room it computed.
    pub fn set(&self, room: Room) {
        *self.room.write() = Arc::new(room);
    }

    /// This node's id, which a spilled request names as its sender.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The cluster's id, which a spilled request carries.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Tags the spilled requests (the internal RPC checks them).
    pub(crate) fn signer(&self) -> &RpcSigner {
        &self.signer
    }

    /// The latest room.
    pub fn room(&self) -> Arc<Room> {
        self.room.read().clone()
    }

    /// Why `headers` are refused (the peer's check, after the internal RPC
    /// checked the request's tag): another cluster (`cluster_id`); `None` when
    /// admitted.
    pub fn refuses(&self, headers: &HeaderMap) -> Option<&'static str> {
        let given = (headers.get(CLUSTER_HEADER)).map(|v| v.as_bytes());
        (given != Some(self.cluster_id.as_bytes())).then_some("cluster_id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(free: u64, peers: &[u64]) -> Room {
        let member = |i: usize| MemberAddr {
            id: format!("n{i}"),
            rpc: format!("127.0.0.1:{}", 7000 + i),
            rpc_version: 2,
        };
        Room {
            peers: (0..peers.len()).map(member).collect(),
            by_binding: HashMap::from([(
                3,
                Row {
                    free: AtomicU64::new(free),
                    own: 1,
                    peers: peers.iter().map(|r| AtomicU64::new(*r)).collect(),
                },
            )]),
            idle: HashMap::from([(30, vec![15, 15])]),
        }
    }

    #[test]
    fn a_peers_room_is_its_own_within_what_the_cluster_has_left() {
        let room = room(4, &[6, 2]);
        assert_eq!(room.at(3, 30, 0), 4, "the cluster has 4 left");
        assert_eq!(room.at(3, 30, 1), 2);
        assert_eq!(room.at(3, 30, 2), 0, "an unknown peer has none");
        // A key with no row this round: idle, each peer its share.
        assert_eq!(room.at(9, 30, 1), 15);
        assert_eq!(
            room.at(9, 40, 1),
            0,
            "nothing known: nothing sent on a guess"
        );
    }

    #[test]
    fn a_spill_takes_its_cost_off_the_peer_and_the_cluster_until_the_next_round() {
        let room = room(5, &[6, 2]);
        room.take(&[(3, 2)], 0);
        assert_eq!(room.at(3, 30, 0), 3);
        assert_eq!(
            room.at(3, 30, 1),
            2,
            "the other peer keeps its room, the cluster's is less"
        );
        room.take(&[(3, 9), (9, 5)], 1);
        assert_eq!(room.at(3, 30, 1), 0, "never below 0");
        assert_eq!(room.at(9, 30, 1), 15, "an idle row is not taken from");
    }
}
