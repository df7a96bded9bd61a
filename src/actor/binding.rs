//! A limit key the cluster bounds: which actor and dimension it belongs to, its
//! capacity, and how the node learns its cluster bound (an allowance the sync
//! engine writes, or credit leased from the key's owner).

use super::scope::Allowance;
use super::{Dimension, ScopeId};
use std::sync::Arc;

/// One limit key whose cluster bound the sync engine maintains.
#[derive(Debug, Clone)]
pub struct Binding {
    /// Cluster-wide key, e.g. `tenant:acme:tokens` (shared with its credit).
    pub key: Arc<str>,
    /// The actor owning it.
    pub scope: ScopeId,
    /// Which dimension.
    pub dimension: Dimension,
    /// Capacity L (per window, or concurrent).
    pub capacity: u64,
    /// The allowance the actor reads (`local split`, `gossip`).
    pub allowance: Option<Allowance>,
    /// Cache-read input tokens count toward it (its scope's
    /// `input_counts_cache_reads`; `redis` mode settles by it in Redis).
    pub counts_cache_reads: bool,
    /// Leased (`lease`, `redis-lease`): its credit is in the node's
    /// [`CreditTable`](super::credit::CreditTable), made at the key's first use here.
    pub leased: bool,
}
