//! What a holder and an owner say to each other about one key: the holder's
//! statement, the owner's reply, and the terms the engine sets each round.

use std::collections::BTreeMap;

/// A holder's statement for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncRequest {
    /// Orders one holder's statements (its clock at the snapshot); an older or equal
    /// one than the last accepted is [`Refusal::Stale`].
    pub seq: u64,
    /// Windowed: the holder's exact consumption `(bucket, cost)` over its window.
    pub usage: Vec<(u64, u64)>,
    /// Windowed: credit it can still spend. Slots: slots in use.
    pub remaining: u64,
    /// How much more it wants (0: return what is not in use).
    pub want: u64,
    /// The statement whose reply it adopted last (0: none): cut-off shares told
    /// with replies to older statements no longer bind it.
    pub adopted: u64,
    /// The cut-off share that reply told it, which it still holds (0: none). An
    /// owner that has no record of it (it dropped the line and rebuilt it while
    /// the holder saw no move) keeps it from this statement on, as if it had told
    /// it: otherwise a lost reply to this statement would leave the holder
    /// serving on a figure nobody charges it.
    pub held: u64,
}

/// The owner's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncReply {
    /// The holder's whole credit (windowed) or slots, as of its statement.
    pub credit: u64,
    /// Of which newly granted.
    pub granted: u64,
    /// How long it is valid from the holder's send time.
    pub ttl_ms: u64,
    /// What the holder may have used in the window in all (slots: hold) while it
    /// cannot reach this owner (policy `share`): what it holds at this reply (usage
    /// in the window and credit), at most its share, charged to it here until a
    /// later statement says it adopted a later reply, so a holder cut off from a
    /// live owner spends only what the owner keeps for it. 0 when it gave
    /// everything back.
    pub cut_off_share: u64,
}

/// What the engine tells the owner each round about the members: shares of `L`
/// by gossiped demand, and floors for members that cannot be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terms<H> {
    /// Each member's share `s_j` of L (they sum to L). A holder's commitment may
    /// not exceed its share plus `borrow`; a holder missing here gets `borrow` only.
    pub shares: BTreeMap<H, u64>,
    /// How far a holder may go beyond its share (0: borrowing off, or while any
    /// member is unreachable: borrowing needs provably live lenders).
    pub borrow: u64,
    /// Unreachable members: each is charged at least this much (its frozen share).
    pub floors: BTreeMap<H, u64>,
    /// The cut-off share each member says in the gossiped state that it holds for
    /// the key (what an owner told it, rounded up): a member with no account here
    /// is charged at least this, so a line rebuilt while a holder cut off from it
    /// saw no move still charges what that holder may spend (docs/design/lease.md,
    /// "Double fault"). Members with an account are charged by what they state.
    pub held: BTreeMap<H, u64>,
}

impl<H> Default for Terms<H> {
    fn default() -> Self {
        Self {
            shares: BTreeMap::new(),
            borrow: 0,
            floors: BTreeMap::new(),
            held: BTreeMap::new(),
        }
    }
}
