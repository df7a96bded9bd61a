//! A holder's side of one lease key: the credit it may spend locally, its exact
//! per-bucket consumption (what it states to the owner), and what it may spend
//! while its owner cannot be reached.
//!
//! The gateway keeps one `Budget` per key behind a mutex shared by the key's actor
//! (spend, refund, on every decision) and the sync engine (snapshot, apply, a few
//! times a second), so a snapshot is always consistent: the usage it states and
//! the credit it claims are taken at the same instant.
//!
//! Skew safety: a credit ends for the holder at its own monotonic **send** time of
//! the statement + ttl, before the owner's receive time + ttl.

use std::collections::BTreeMap;

use crate::counter::Window;
use crate::lease::line::{Kind, SyncReply, SyncRequest};

/// What a holder cut off from its owner may spend beyond its credit
/// (docs/design/lease.md, "Shares, borrowing and partitions").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CutOffPolicy {
    /// Default: at most its own share per window (slots: at once), in all, credit
    /// included. With peer owners, the share its owner told it with the last reply
    /// ([`SyncReply::cut_off_share`]), which that owner charges it until it states
    /// again; in `redis-lease`, the reservation Redis keeps for it. Either way the
    /// cluster stays within L (plus borrowing outstanding at the cut).
    #[default]
    Share,
    /// Nothing beyond the credit it holds: safe, unavailable under a cut.
    FailClosed,
    /// Unlimited: **unsafe**, the cluster total is unbounded during a cut.
    FailOpen,
}

/// How one admission was paid, needed to refund it exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spent {
    /// The bucket it was recorded in (windowed keys).
    pub bucket: u64,
    /// Whether it came out of the owner's credit (else: the cut-off allowance).
    pub from_credit: bool,
}

/// A consistent picture of the budget, to state to the owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The statement (seq = the snapshot time in ms, made unique by the caller).
    pub request: SyncRequest,
    /// When it was taken (the send time: the new credit's start).
    pub at_ms: u64,
    /// [`Budget`]'s running total spent beyond the credit, when it was taken.
    pub cut_off_spent: u64,
    /// [`Budget`]'s running total refunded into the credit, when it was taken.
    pub refunded: u64,
}

/// One key's budget on a holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    kind: Kind,
    credit: u64,
    until_ms: u64,
    usage: BTreeMap<u64, u64>,
    in_use: u64,
    /// `Some(share)` while the owner cannot be reached (set by the engine).
    cut_off: Option<u64>,
    /// Whether `cut_off` is the owner's told share (else Redis's reservation).
    cut_off_told: bool,
    /// The cut-off share the current owner told with its last reply (0: none yet).
    told_share: u64,
    /// A reply lowered the told share since the last statement: the owner keeps
    /// charging the higher figure until a statement says this reply was adopted,
    /// so one more statement is owed even if the key has gone idle (without it,
    /// an idle holder that adopted a 0 would stop stating and its owner would keep
    /// the old figure, and the line, for good: `tests/scale.rs`' used-once census).
    owes_statement: bool,
    /// Running total spent beyond the credit (windowed): what a reply to an earlier
    /// statement does not know of.
    cut_off_spent: u64,
    /// Running total refunded into the credit (windowed): what a reply to an
    /// earlier statement does not carry over ([`Budget::apply`]).
    refunded: u64,
    policy: CutOffPolicy,
    last_seq: u64,
    /// The statement whose reply was adopted last (the credit's origin).
    adopted_seq: u64,
}

impl Budget {
    /// An empty budget: nothing may be spent until the owner grants credit.
    pub fn new(kind: Kind, policy: CutOffPolicy) -> Self {
        Self {
            kind,
            credit: 0,
            until_ms: 0,
            usage: BTreeMap::new(),
            in_use: 0,
            cut_off: None,
            cut_off_told: false,
            told_share: 0,
            owes_statement: false,
            cut_off_spent: 0,
            refunded: 0,
            policy,
            last_seq: 0,
            adopted_seq: 0,
        }
    }

    /// Credit (windowed) or slots (concurrency) valid at `now_ms`.
    pub fn credit(&self, now_ms: u64) -> u64 {
        if self.until_ms > now_ms {
            self.credit
        } else {
            0
        }
    }

    /// When the current credit ends for this holder.
    pub fn until_ms(&self) -> u64 {
        self.until_ms
    }

    /// This holder's consumption in the window at `now_ms` (windowed) or in use.
    pub fn used(&self, now_ms: u64) -> u64 {
        match self.kind {
            Kind::Windowed(w) => (self.usage.iter())
                .filter(|(b, _)| w.counts(**b, now_ms))
                .map(|(_, c)| *c)
                .sum(),
            Kind::Slots => self.in_use,
        }
    }

    /// Whether `cost` (windowed) or one more slot could be admitted now.
    pub fn can_spend(&self, cost: u64, now_ms: u64) -> bool {
        match self.kind {
            Kind::Windowed(_) => self.credit(now_ms) >= cost || self.cut_off_allows(cost, now_ms),
            Kind::Slots => self.in_use < self.credit(now_ms) || self.cut_off_allows(1, now_ms),
        }
    }

    /// Spends `cost` (windowed; slots: takes one slot, `cost` ignored), or `None`.
    pub fn try_spend(&mut self, cost: u64, now_ms: u64) -> Option<Spent> {
        let from_credit = match self.kind {
            Kind::Windowed(_) => self.credit(now_ms) >= cost,
            Kind::Slots => self.in_use < self.credit(now_ms),
        };
        if !from_credit && !self.cut_off_allows(cost, now_ms) {
            return None;
        }
        let bucket = match self.kind {
            Kind::Windowed(w) => {
                if from_credit {
                    self.credit -= cost;
                } else {
                    self.cut_off_spent = self.cut_off_spent.saturating_add(cost);
                }
                let bucket = w.bucket_index(now_ms);
                *self.usage.entry(bucket).or_insert(0) += cost;
                self.prune(w, now_ms);
                bucket
            }
            Kind::Slots => {
                self.in_use += 1;
                0
            }
        };
        Some(Spent {
            bucket,
            from_credit,
        })
    }

    /// Moves a spend of `cost` to the bucket of `now_ms`, when the upstream
    /// answered (the provider counted the request by then, not at admission; see
    /// the gateway's `SlidingWindow::redate`): cost still in its old bucket moves,
    /// credit unchanged; cost whose bucket already left the window is spent again,
    /// out of the credit as a debt is. Returns the spend to settle. Slots: as is.
    pub fn redate(&mut self, spent: Spent, cost: u64, now_ms: u64) -> Spent {
        let Kind::Windowed(w) = self.kind else {
            return spent;
        };
        let bucket = w.bucket_index(now_ms);
        if spent.bucket >= bucket {
            return spent;
        }
        let moved = match self.usage.get_mut(&spent.bucket) {
            Some(entry) if w.counts(spent.bucket, now_ms) => {
                let moved = cost.min(*entry);
                *entry -= moved;
                if *entry == 0 {
                    self.usage.remove(&spent.bucket);
                }
                moved
            }
            _ => 0,
        };
        self.credit = self.credit.saturating_sub(cost - moved);
        *self.usage.entry(bucket).or_insert(0) += cost;
        self.prune(w, now_ms);
        Spent { bucket, ..spent }
    }

    /// Corrects a spend to its real cost `actual` (refund below, debt above), at
    /// `now_ms`. A refund of credit goes back into the credit: the owner sees the
    /// same move from usage to credit in the next statement. A spend whose bucket
    /// already left the window is not corrected (it no longer counts anywhere, so
    /// refunding it would mint credit; the property tests check this).
    ///
    /// Nor does a refund go back into the credit when its bucket leaves the
    /// owner's window before this credit ends (plus the skew the owner
    /// tolerates): until the next statement the owner still counts the cost as
    /// usage in that bucket and the credit as it was, and once the bucket has
    /// left, it counted the refund nowhere while the holder could spend it (130
    /// of L = 100 that way: `refund_at_a_buckets_edge_is_not_spent_beyond_l` in
    /// `line.rs`).
    /// The usage is still corrected, so the next statement frees it at the owner.
    /// Slots: returns the slot.
    pub fn settle(&mut self, spent: Spent, reserved: u64, actual: u64, now_ms: u64) {
        match self.kind {
            Kind::Windowed(w) => {
                if !w.counts(spent.bucket, now_ms) {
                    return;
                }
                let lasts = w.counts(
                    spent.bucket,
                    self.until_ms
                        .saturating_add(crate::counter::SKEW_TOLERANCE_MS),
                );
                let entry = self.usage.entry(spent.bucket).or_insert(0);
                if actual < reserved {
                    let refund = (reserved - actual).min(*entry);
                    *entry -= refund;
                    if spent.from_credit && lasts {
                        self.credit = self.credit.saturating_add(refund);
                        self.refunded = self.refunded.saturating_add(refund);
                    }
                } else {
                    let debt = actual - reserved;
                    *entry = entry.saturating_add(debt);
                    self.credit = self.credit.saturating_sub(debt);
                }
            }
            Kind::Slots => self.in_use = self.in_use.saturating_sub(1),
        }
    }

    /// The next statement's seq will be above `seq` (a statement made for the key
    /// without this budget: the owner refuses one not above the last it read).
    pub fn keep_seq_above(&mut self, seq: u64) {
        self.last_seq = self.last_seq.max(seq);
    }

    /// The statement for the owner at `now_ms`, asking `want` more. `seq` only grows.
    ///
    /// Stating want 0 with nothing left gives everything back, and the owner
    /// drops the figure it told ([`SyncReply::cut_off_share`]) as it reads that.
    /// A key still in use keeps its figure: one cut off from its owner (it may be
    /// serving on it), or a windowed one that spent in the window, asks one unit
    /// instead. Without the figure, a cut that comes next leaves it serving
    /// nothing for as long as the cut lasts: under the jepsen harness's `slow`
    /// nemesis, all three nodes refuse for a window (the returns of holders cut
    /// off), or one node refuses for 7 s after a statement that only confirmed a
    /// lowered figure (docs/design/lease.md, "Giving back").
    /// A node that stops gives back with [`Budget::final_snapshot`].
    pub fn snapshot(&mut self, want: u64, now_ms: u64) -> Snapshot {
        let cut_off_by_owner = self.cut_off_told && self.cut_off.is_some();
        let spent_in_window = matches!(self.kind, Kind::Windowed(_)) && self.used(now_ms) > 0;
        let keeps_figure = cut_off_by_owner || spent_in_window;
        let nothing_left = self.remaining_now(now_ms) == 0;
        let want = if want == 0 && nothing_left && keeps_figure {
            1
        } else {
            want
        };
        self.statement(want, now_ms)
    }

    /// The last statement of a node that stops serving: it gives back its credit
    /// and, whatever it spent in the window, the figure told for it (its spending
    /// stays charged as usage).
    pub fn final_snapshot(&mut self, now_ms: u64) -> Snapshot {
        self.return_credit(now_ms);
        self.statement(0, now_ms)
    }

    fn statement(&mut self, want: u64, now_ms: u64) -> Snapshot {
        self.last_seq = now_ms.max(self.last_seq + 1);
        self.owes_statement = false;
        self.end_credit_stated_over(now_ms);
        let nothing_left = self.remaining_now(now_ms) == 0;
        if want == 0 && nothing_left {
            // Giving everything back (never while in use: `snapshot`): the owner
            // drops every figure it told as it reads this, so this holder stops
            // holding one as it sends it.
            self.told_share = 0;
        }
        let (usage, remaining) = match self.kind {
            Kind::Windowed(w) => {
                self.prune(w, now_ms);
                let usage = self.usage.iter().map(|(b, c)| (*b, *c)).collect();
                (usage, self.credit(now_ms))
            }
            Kind::Slots => (Vec::new(), self.in_use),
        };
        Snapshot {
            request: SyncRequest {
                seq: self.last_seq,
                usage,
                remaining,
                want,
                adopted: self.adopted_seq,
                held: self.told_share,
            },
            at_ms: now_ms,
            cut_off_spent: self.cut_off_spent,
            refunded: self.refunded,
        }
    }

    /// Adopts the owner's reply to `snapshot`: the credit it states, minus what was
    /// spent since the snapshot (plus what was refunded), until the snapshot's time
    /// + ttl. Called at `now_ms`, when the reply arrived.
    ///
    /// Spending beyond the credit since the snapshot (cut off meanwhile) counts too:
    /// the owner granted against the usage stated, so a reply that ignored it would
    /// let the holder spend it twice (the property tests check this).
    /// Refunds since the snapshot are not carried into the new credit: the reply
    /// may outlive their buckets at the owner ([`Budget::settle`]); the next
    /// statement shows them as lower usage and the owner grants them anew.
    pub fn apply(&mut self, snapshot: &Snapshot, reply: &SyncReply, now_ms: u64) {
        match self.kind {
            Kind::Windowed(_) => {
                let now = self.credit(now_ms);
                let stated = snapshot.request.remaining;
                let beyond = self.cut_off_spent.saturating_sub(snapshot.cut_off_spent);
                let refunded = self.refunded.saturating_sub(snapshot.refunded);
                // now - stated = refunds - spends since the snapshot (may be < 0).
                self.credit = (reply.credit.saturating_add(now))
                    .saturating_sub(stated)
                    .saturating_sub(refunded)
                    .saturating_sub(beyond);
            }
            Kind::Slots => self.credit = reply.credit,
        }
        self.until_ms = snapshot.at_ms.saturating_add(reply.ttl_ms);
        self.end_credit_stated_over(now_ms);
        self.adopted_seq = snapshot.request.seq;
        if reply.cut_off_share < self.told_share {
            self.owes_statement = true;
        }
        self.told_share = reply.cut_off_share;
    }

    /// Whether a reply lowered the told share since the last statement (the
    /// holder states once more so the owner drops the higher figure).
    pub fn owes_statement(&self) -> bool {
        self.owes_statement
    }

    /// The cut-off share the current owner told (see [`SyncReply::cut_off_share`]).
    pub fn told_share(&self) -> u64 {
        self.told_share
    }

    /// The owner (a peer) cannot be reached: beyond the credit, spend only the
    /// share it told, which it charges this holder until a later statement says
    /// a later reply was adopted.
    pub fn cut_off_by_owner(&mut self) {
        self.cut_off = Some(self.told_share);
        self.cut_off_told = true;
    }

    /// The key's owner changed: the new one has told nothing yet and keeps nothing
    /// for this holder, so nothing beyond the credit may be spent until it answers
    /// (the old owner's reserve is not this owner's).
    pub fn owner_changed(&mut self) {
        self.told_share = 0;
        self.cut_off = None;
    }

    /// The owner reads a statement stamped at or after a credit's end (seq + ttl
    /// of the statement it answered) as holding everything spent from it, and
    /// drops its guess for that credit if it lapsed there (line.rs, `Lapsed`). So
    /// nothing is spent from a credit after a statement stamped past its end, even
    /// when seq runs a few ms ahead of the clock (several statements in one ms) or
    /// a late reply is adopted after a later statement.
    fn end_credit_stated_over(&mut self, now_ms: u64) {
        if self.until_ms <= self.last_seq {
            self.until_ms = self.until_ms.min(now_ms);
        }
    }

    /// What a statement now would say is left: credit (windowed) or slots in use.
    fn remaining_now(&self, now_ms: u64) -> u64 {
        match self.kind {
            Kind::Windowed(_) => self.credit(now_ms),
            Kind::Slots => self.in_use,
        }
    }

    /// The statement whose owner reply was adopted last (0: none yet).
    pub fn adopted_seq(&self) -> u64 {
        self.adopted_seq
    }

    /// The seq of the last statement (a budget made later for the key must state
    /// above it: [`Budget::keep_seq_above`]).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Gives back what is not in use (windowed: all credit; slots: the slots not in
    /// use); the next snapshot states it, so the owner frees it at once.
    pub fn return_credit(&mut self, now_ms: u64) {
        match self.kind {
            Kind::Windowed(_) => self.credit = 0,
            Kind::Slots => self.credit = self.in_use.min(self.credit(now_ms)),
        }
    }

    /// The owner cannot be reached (`Some(share)`: the share for policy `share`) or
    /// can again (`None`). The share is **frozen at the first cut**: later calls
    /// while still cut off keep it, because this node's own refused demand keeps
    /// growing (and with it its share as it sees it) while the other side charges
    /// it the share it had when gossip stopped (an unfrozen share overshoots by
    /// 5% in the jepsen harness).
    pub fn set_cut_off(&mut self, share: Option<u64>) {
        if share.is_none() || self.cut_off.is_none() {
            self.cut_off = share;
            self.cut_off_told = false;
        }
    }

    /// Whether the owner is currently unreachable.
    pub fn is_cut_off(&self) -> bool {
        self.cut_off.is_some()
    }

    /// Nothing spent in the window, nothing in use, no credit: the key costs no
    /// exchange (idle keys cost no traffic).
    pub fn is_idle(&self, now_ms: u64) -> bool {
        self.credit(now_ms) == 0 && self.used(now_ms) == 0
    }

    /// Idle, nothing in use, not cut off and no told share: it holds nothing a
    /// new budget would not, so the holder may drop it and make one at the next
    /// use (carrying [`Budget::last_seq`] over).
    pub fn is_at_rest(&self, now_ms: u64) -> bool {
        self.is_idle(now_ms)
            && self.in_use == 0
            && self.cut_off.is_none()
            && self.told_share == 0
            && !self.owes_statement
    }

    fn cut_off_allows(&self, cost: u64, now_ms: u64) -> bool {
        let Some(share) = self.cut_off else {
            return false;
        };
        // The credit first: beyond-credit spending starts only once it has ended.
        if self.credit(now_ms) > 0 && self.kind != Kind::Slots {
            return false;
        }
        match self.policy {
            CutOffPolicy::FailClosed => false,
            CutOffPolicy::FailOpen => true,
            CutOffPolicy::Share => match self.kind {
                Kind::Windowed(_) => self.used(now_ms).saturating_add(cost) <= share,
                Kind::Slots => self.in_use < share,
            },
        }
    }

    fn prune(&mut self, w: Window, now_ms: u64) {
        if self.usage.len() > w.ring_slots() as usize {
            self.usage.retain(|b, _| w.counts(*b, now_ms));
        }
    }
}

#[cfg(test)]
mod tests;
