//! `lease` mode, pure core (docs/design/lease.md): the key's
//! owner keeps a credit line per holder; holders spend their credit locally and
//! renew it before it runs out, so the hot path needs no network and the cluster
//! stays within `L`.
//!
//! - [`rendezvous`]: which live member owns a key (highest random weight, stable hash).
//! - [`line`]: the owner's ledger of one key: statements, grants, expiry, failover
//!   rebuild, shares and floors for unreachable members.
//! - [`budget`]: a holder's side of one key: local spending, refunds, the statement
//!   it sends, the reply it adopts, and the cut-off policy.
//!
//! Everything here is a state machine: every time is an argument (`now_ms`, the
//! node clock: monotonic, wall-aligned), nothing reads a clock, sends or sleeps.

pub mod budget;
pub mod line;
pub mod rendezvous;

#[cfg(test)]
mod proptests;

/// Largest capacity, lease, cost or slot count accepted (2^50, as the counters'
/// `MAX_COUNT`): anything above is a bug or hostile input, refused as [`Refusal::Absurd`].
pub const MAX_AMOUNT: u64 = 1 << 50;

/// Longest lease ttl accepted, in milliseconds (10 minutes): a lease is meant to
/// live a few seconds; a longer one would hold capacity hostage after a crash.
pub const MAX_TTL_MS: u64 = 600_000;

/// Most holders one key's ledger tracks (a cluster is far smaller; bounds memory).
pub const MAX_HOLDERS: usize = 1024;

/// Why the owner refused a statement. Each leaves the ledger unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The key is not configured on this owner.
    #[error("unknown lease key")]
    UnknownKey,
    /// An amount (request, cost, slots or ttl) is 0 or above its bound.
    #[error("absurd {what}: {amount} (allowed 1..={max})")]
    Absurd {
        /// Which amount.
        what: &'static str,
        /// What was asked.
        amount: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// The ledger already tracks its maximum number of holders.
    #[error("too many holders (max {max})")]
    TooManyHolders {
        /// The bound.
        max: usize,
    },
    /// A statement not newer than the last one accepted from this holder.
    #[error("stale statement {0}")]
    Stale(u64),
    /// This node does not own the key (membership moved it); ask the owner.
    #[error("not the owner of this key")]
    NotOwner,
    /// The sender is not a live member in the owner's view.
    #[error("not a live member of this cluster")]
    NotMember,
}

/// Checks `1 <= amount <= max`.
pub(crate) fn bounded(what: &'static str, amount: u64, max: u64) -> Result<u64, Refusal> {
    if amount == 0 || amount > max {
        return Err(Refusal::Absurd { what, amount, max });
    }
    Ok(amount)
}
