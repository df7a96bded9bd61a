//! What the owner knows of each holder: its last statement, the credit it was
//! granted and until when, credit that lapsed unstated, and the cut-off shares
//! it was told. Kept sorted by holder in one vector (a few holders per key).

use super::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Account {
    pub(super) usage: BTreeMap<u64, u64>,
    pub(super) credit: u64,
    pub(super) until_ms: u64,
    /// When `credit` ends for the holder, on its clock: the statement's seq + ttl
    /// (it stops at its snapshot time + ttl, and its seq is never earlier).
    pub(super) holder_until: u64,
    /// Credits that lapsed without a new statement, taken as spent.
    pub(super) lapsed: Vec<Lapsed>,
    pub(super) seq: u64,
    /// Cut-off shares it may still hold ([`SyncReply::cut_off_share`]).
    pub(super) reserves: Reserves,
    /// Slots: the credit it held before its last statement, and until when
    /// (owner clock): it may start slots from it until the reply arrives.
    pub(super) previous: (u64, u64),
}

/// The holders' accounts of one line, sorted by holder. A key has a handful of
/// holders (one per node at most), and a `BTreeMap` allocates a whole 11-slot leaf
/// for its first entry: 1.3 KB per line with a single holder, most of an idle
/// lease key's memory at its owner (massif; docs/BENCHMARKS.md). Emptied, it frees
/// its buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Accounts<H>(Vec<(H, Account)>);

impl<H> Default for Accounts<H> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<H: Ord> Accounts<H> {
    pub(super) fn find(&self, holder: &H) -> Result<usize, usize> {
        self.0.binary_search_by(|(h, _)| h.cmp(holder))
    }

    pub(super) fn get(&self, holder: &H) -> Option<&Account> {
        self.find(holder).ok().map(|i| &self.0[i].1)
    }

    pub(super) fn insert(&mut self, holder: H, account: Account) {
        match self.find(&holder) {
            Ok(i) => self.0[i].1 = account,
            Err(i) => self.0.insert(i, (holder, account)),
        }
    }

    pub(super) fn remove(&mut self, holder: &H) {
        if let Ok(i) = self.find(holder) {
            self.0.remove(i);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = &H> {
        self.0.iter().map(|(h, _)| h)
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&H, &mut Account)> {
        self.0.iter_mut().map(|(h, a)| (&*h, a))
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Account> {
        self.0.iter_mut().map(|(_, a)| a)
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&H, &mut Account) -> bool) {
        self.0.retain_mut(|(h, a)| keep(h, a));
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
    }
}

/// A credit that ran out at the owner without a new statement: taken as spent in
/// `bucket`, the bucket of its expiry (the latest moment it could have been), until
/// that bucket leaves the window, or until a statement taken after `holder_until`
/// (the credit had ended for the holder, so the statement's usage already holds
/// everything spent from it) replaces the guess with the truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lapsed {
    pub(super) bucket: u64,
    pub(super) credit: u64,
    pub(super) holder_until: u64,
}
