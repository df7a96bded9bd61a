//! `lease` mode, pure core (design.md section 6; docs/design/lease.md): the key's
//! owner grants lease blocks that holders spend locally and renew before they run
//! out, so the hot path needs no network and the cluster stays within `L`.
//!
//! - [`rendezvous`]: which live member owns a key (highest random weight, stable hash).
//! - [`owner`]: the owner's per-key ledger for windowed limits (requests, tokens):
//!   grants, renewals, releases, expiry, failover rebuild and re-announce.
//! - [`slots`]: the owner's ledger for concurrency, leased as slots kept by heartbeat.
//! - [`holder`]: a node's view of its lease for one key: local spending, when to
//!   renew, per-bucket consumption to report, and the cut-off policy.
//!
//! Everything here is a state machine: every time is an argument (`now_ms`, the
//! node clock: monotonic, wall-aligned), nothing reads a clock, sends or sleeps. The
//! RPC, the re-announce protocol and heartbeats are wired elsewhere.

mod grant;
pub mod holder;
pub mod owner;
pub mod rendezvous;
pub mod slots;

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

/// Identifies a lease within one key's ledger. Ids only grow, so an id below the
/// next one that the ledger no longer holds is [`Refusal::Stale`].
pub type LeaseId = u64;

/// Why the owner refused a request. Every variant but [`Refusal::Exhausted`] is bad
/// input and leaves the ledger unchanged.
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
    /// No such lease was ever granted by this ledger.
    #[error("unknown lease {0}")]
    UnknownLease(LeaseId),
    /// The lease was granted to another holder.
    #[error("lease {0} belongs to another holder")]
    NotYourLease(LeaseId),
    /// The lease existed but expired or was already returned: its amount is counted.
    #[error("lease {0} is expired or already returned")]
    Stale(LeaseId),
    /// The holder reported more consumption than the lease held.
    #[error("reported {reported} consumed on a lease of {amount}")]
    Overreported {
        /// Sum of the reported costs.
        reported: u64,
        /// The lease amount.
        amount: u64,
    },
    /// Nothing can be granted now (capacity, the holder's fair share or its cap). A
    /// renewal or announce that ends with this still took effect.
    #[error("nothing available; retry in {retry_in_ms} ms")]
    Exhausted {
        /// When capacity may come back at the earliest (one bucket), in milliseconds.
        retry_in_ms: u64,
    },
}

/// Checks `1 <= amount <= max`.
pub(crate) fn bounded(what: &'static str, amount: u64, max: u64) -> Result<u64, Refusal> {
    if amount == 0 || amount > max {
        return Err(Refusal::Absurd { what, amount, max });
    }
    Ok(amount)
}
