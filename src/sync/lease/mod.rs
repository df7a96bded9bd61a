//! `lease` mode, wired (docs/design/lease.md): every node is both a **holder** (its
//! actors spend credit locally; a loop off the request path states each active
//! key's usage to the key's owner and adopts the answer) and an **owner** (the
//! keys rendezvous hashing gives it: a credit line per key, answering statements
//! over the internal RPC).
//!
//! - [`wire`]: the RPC's messages and the secret check.
//! - [`owner`]: the lines this node owns.
//! - [`rpc`]: the internal HTTP server (axum, `cluster.rpc_listen`) and client.
//! - [`holder`]: the statement rounds.
//!
//! The sync engine feeds both sides a [`View`] each round: live members with their
//! RPC addresses, and each key's terms (shares by gossiped demand, floors for
//! unreachable members, borrowing).

mod bits;
pub(crate) mod holder;
pub(crate) mod owner;
mod reservations;
pub(crate) mod rpc;
pub(crate) mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use tollgate_cluster::lease::line::Terms;
use tollgate_cluster::lease::rendezvous;

/// A live member as the lease side needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberAddr {
    /// Member id (`node/generation@gossip-addr`), as in the counters.
    pub id: String,
    /// Its internal RPC address.
    pub rpc: String,
    /// The internal RPC's wire version it speaks (`NodeMetadata::rpc_version`):
    /// what a statement to it may carry.
    pub rpc_version: u32,
}

/// A member is found by its id (rendezvous hashing over the members themselves).
impl AsRef<str> for MemberAddr {
    fn as_ref(&self) -> &str {
        &self.id
    }
}

/// What the engine tells the lease side each round.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// This node's member id.
    pub self_id: String,
    /// Live members, this node included.
    pub members: Vec<MemberAddr>,
    /// The terms (shares, borrowing, floors) of each key with demand somewhere or
    /// a member cut off; read with [`View::terms_for`].
    pub terms: HashMap<String, Arc<Terms<String>>>,
    /// Per capacity: the terms every idle key of that capacity shares this round.
    /// Idle keys have no entry in `terms` (one per configured key each round
    /// would cost ~100 B per idle lease key).
    pub idle_terms: HashMap<u64, Arc<Terms<String>>>,
    /// This node's demand per key (cost per window), to size what it asks; absent
    /// when 0.
    pub demand: HashMap<String, u64>,
    /// Whether this node's view of the members has settled since it joined: it
    /// owns (grants for) no key before (the engine's `settle`).
    pub settled: bool,
    /// `redis-lease`: members whose reservations Redis must keep however stale
    /// their accounts: those that announced over gossip they cannot reach Redis,
    /// and those gossip cannot reach (either may be spending its reservation).
    pub redis_held: Vec<String>,
}

impl View {
    /// `key`'s terms this round; `capacity` (its L) finds an idle key's shared
    /// terms. `None` before the engine's first round.
    pub fn terms_for(&self, key: &str, capacity: u64) -> Option<&Arc<Terms<String>>> {
        (self.terms.get(key)).or_else(|| self.idle_terms.get(&capacity))
    }

    /// The owner of `key` among the live members.
    pub fn owner(&self, key: &str) -> Option<&MemberAddr> {
        rendezvous::owner(key, &self.members)
    }

    /// Whether this node owns `key`.
    pub fn owns(&self, key: &str) -> bool {
        self.owner(key).is_some_and(|m| m.id == self.self_id)
    }
}
