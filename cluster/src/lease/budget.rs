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
mod tests {
    use super::*;

    fn windowed(policy: CutOffPolicy) -> Budget {
        let w = Window::try_new(1_000, 10).expect("window");
        Budget::new(Kind::Windowed(w), policy)
    }

    /// An owner's reply: `credit` in all, of which `granted` new, telling
    /// `cut_off_share`, for 500 ms.
    fn reply(credit: u64, granted: u64, cut_off_share: u64) -> SyncReply {
        SyncReply {
            credit,
            granted,
            ttl_ms: 500,
            cut_off_share,
        }
    }

    fn grant(b: &mut Budget, credit: u64, now: u64) {
        let snap = b.snapshot(credit, now);
        b.apply(&snap, &reply(credit, credit, 0), now);
    }

    #[test]
    fn credit_is_spent_refunded_and_ends_at_send_time_plus_ttl() {
        let mut b = windowed(CutOffPolicy::Share);
        assert!(b.try_spend(1, 0).is_none(), "nothing before a grant");
        grant(&mut b, 10, 0);
        let s = b.try_spend(8, 100).expect("fits");
        assert!(b.try_spend(3, 100).is_none());
        b.settle(s, 8, 5, 100);
        assert_eq!((b.credit(100), b.used(100)), (5, 5));
        assert_eq!(b.credit(500), 0, "ends at send time + ttl");
        assert!(b.try_spend(1, 500).is_none());
    }

    #[test]
    fn nothing_is_spent_from_a_credit_after_a_statement_stamped_past_its_end() {
        let mut b = windowed(CutOffPolicy::Share);
        grant(&mut b, 10, 0); // ends at 0 + 500
        // Many statements in one ms run seq ahead of the clock: once one is
        // stamped at 500, the owner reads it as holding all spent from the credit.
        let mut snap = b.snapshot(0, 10);
        while snap.request.seq < 500 {
            assert_eq!(b.credit(10), 10);
            snap = b.snapshot(0, 10);
        }
        assert_eq!((b.credit(10), snap.request.remaining), (0, 0));
        assert!(b.try_spend(1, 10).is_none());
        // A late reply to an earlier statement, adopted after one stamped past the
        // end of the credit it grants, grants nothing to spend either.
        let early = b.snapshot(5, 20);
        let reply = reply(5, 5, 0);
        while b.snapshot(0, 20).request.seq < 520 {}
        b.apply(&early, &reply, 20);
        assert_eq!(b.credit(20), 0);
    }

    #[test]
    fn redate_moves_usage_to_the_answer_and_spends_again_what_had_left() {
        let mut b = windowed(CutOffPolicy::Share);
        grant(&mut b, 20, 0);
        // Buckets of 100 ms in a 1 s window.
        let s = b.try_spend(4, 100).expect("fits");
        let moved = b.redate(s, 4, 250);
        assert_eq!((s.bucket, moved.bucket), (1, 2));
        assert_eq!(b.credit(300), 16, "a move spends no credit");
        assert_eq!(b.snapshot(0, 300).request.usage, vec![(2, 4)]);
        // Settling corrects the new bucket.
        b.settle(moved, 4, 1, 300);
        assert_eq!(b.snapshot(0, 301).request.usage, vec![(2, 1)]);
        assert_eq!(b.credit(302), 19);
        // A spend whose bucket left the window (bucket 3 counts until 1.4 s) is
        // spent again in the bucket of the answer.
        let late = b.try_spend(2, 310).expect("fits");
        let again = b.redate(late, 2, 1_400);
        assert_eq!(again.bucket, 14);
        assert_eq!(b.used(1_400), 2, "only the re-spent 2 count");
        assert!(b.snapshot(0, 1_400).request.usage.contains(&(14, 2)));
    }

    #[test]
    fn a_lowered_told_share_is_confirmed_by_one_more_statement() {
        let mut b = windowed(CutOffPolicy::Share);
        let first = b.snapshot(5, 0);
        b.apply(
            &first,
            &SyncReply {
                credit: 5,
                granted: 5,
                ttl_ms: 500,
                cut_off_share: 5,
            },
            0,
        );
        assert!(!b.owes_statement(), "a higher figure needs no confirmation");
        // Still holding credit, it states; the owner tells 0 this time (say its
        // share went to others).
        let second = b.snapshot(1, 400);
        b.apply(
            &second,
            &SyncReply {
                credit: 5,
                granted: 0,
                ttl_ms: 500,
                cut_off_share: 0,
            },
            400,
        );
        // The owner still charges 5 until it reads that this reply was adopted.
        assert!(b.owes_statement());
        assert!(!b.is_at_rest(10_000), "not dropped before it confirms");
        let confirm = b.snapshot(0, 10_000);
        assert_eq!(confirm.request.adopted, second.request.seq);
        assert!(!b.owes_statement());
        assert!(b.is_at_rest(10_000));
        // Giving everything back needs no confirmation: the owner drops every
        // figure as it reads that statement.
        let mut g = windowed(CutOffPolicy::Share);
        let first = g.snapshot(5, 0);
        g.apply(&first, &reply(5, 5, 5), 0);
        let back = g.snapshot(0, 600);
        g.apply(&back, &reply(0, 0, 0), 600);
        assert!(!g.owes_statement());
    }

    /// A key that spent in the window keeps its figure across a statement made
    /// with nothing held and nothing wanted (a confirmation, or a heartbeat
    /// after a quiet spell that gave its credit back): it asks one unit, so the
    /// owner keeps the figure and a cut that comes next leaves it serving. Only
    /// once its spending has left the window, or as its node stops, does such
    /// a statement give everything back.
    #[test]
    fn a_key_in_use_keeps_its_figure_until_its_window_empties_or_its_node_stops() {
        let mut b = windowed(CutOffPolicy::Share);
        let first = b.snapshot(5, 0);
        b.apply(&first, &reply(5, 5, 5), 0);
        b.try_spend(2, 100).expect("fits");
        // The owner lowers the figure and takes the credit (it told 2 + 1 the
        // last time it granted one unit): one more statement is owed.
        let second = b.snapshot(0, 200);
        b.apply(&second, &reply(0, 0, 3), 200);
        assert!(b.owes_statement());
        b.return_credit(300);
        let confirm = b.snapshot(0, 300);
        assert_eq!((confirm.request.remaining, confirm.request.want), (0, 1));
        assert_eq!(b.told_share(), 3, "kept while the owner still tells it");
        b.cut_off_by_owner();
        assert!(b.try_spend(1, 400).is_some(), "served on its figure: 2 + 1");
        assert!(b.try_spend(1, 400).is_none(), "and no more");
        b.set_cut_off(None);
        // Its spending has left the window (1 s here): a give-back.
        let later = b.snapshot(0, 1_500);
        assert_eq!(later.request.want, 0);
        assert_eq!(b.told_share(), 0);
        // A stopping node gives back whatever it spent.
        let mut s = windowed(CutOffPolicy::Share);
        let first = s.snapshot(5, 0);
        s.apply(&first, &reply(5, 5, 5), 0);
        s.try_spend(2, 100).expect("fits");
        let last = s.final_snapshot(200);
        assert_eq!((last.request.remaining, last.request.want), (0, 0));
        assert_eq!(s.told_share(), 0);
    }

    #[test]
    fn spending_between_snapshot_and_reply_is_subtracted() {
        let mut b = windowed(CutOffPolicy::Share);
        grant(&mut b, 10, 0);
        let snap = b.snapshot(5, 100);
        b.try_spend(4, 110).expect("fits");
        let reply = reply(15, 5, 0);
        b.apply(&snap, &reply, 120);
        assert_eq!(b.credit(120), 11);
        assert_eq!(b.until_ms(), 600);
    }

    #[test]
    fn cut_off_policies() {
        for (policy, admitted) in [
            (CutOffPolicy::Share, 3),
            (CutOffPolicy::FailClosed, 0),
            (CutOffPolicy::FailOpen, 102),
        ] {
            let mut b = windowed(policy);
            grant(&mut b, 2, 0);
            b.set_cut_off(Some(5));
            assert!(b.try_spend(2, 100).is_some_and(|s| s.from_credit));
            let mut n = 0;
            // The credit first (2), then the share (5 per window, 2 already used).
            while n < 102 && b.try_spend(1, 600 + n).is_some() {
                n += 1;
            }
            assert_eq!(n, admitted, "{policy:?} after the credit ended");
            b.set_cut_off(None);
            assert!(b.try_spend(1, 800).is_none(), "{policy:?}: reachable again");
        }
        let mut b = windowed(CutOffPolicy::Share);
        grant(&mut b, 2, 0);
        b.set_cut_off(Some(5));
        assert!(b.try_spend(2, 100).is_some_and(|s| s.from_credit));
        assert_eq!((1..=3).filter(|_| b.try_spend(1, 600).is_some()).count(), 3);
        assert!(b.try_spend(1, 600).is_none(), "5 in the window");
        // Buckets are 100 ms: the credit's bucket 1 leaves at 1,200, bucket 6 at 1,700.
        assert!(b.try_spend(2, 1_200).is_some() && b.try_spend(1, 1_200).is_none());
        assert!(b.try_spend(3, 1_700).is_some(), "the share is per window");
    }

    #[test]
    fn the_told_share_is_the_cut_off_share_until_the_owner_changes() {
        let mut b = windowed(CutOffPolicy::Share);
        let snap = b.snapshot(2, 0);
        let reply = reply(2, 2, 5);
        b.apply(&snap, &reply, 0);
        assert_eq!(b.told_share(), 5);
        b.cut_off_by_owner();
        // The credit (2), then the told share: 5 in the window in all, and again
        // once those left the window (it binds until the owner hears again).
        assert_eq!((0..10).filter(|_| b.try_spend(1, 400).is_some()).count(), 5);
        assert_eq!(
            (0..10).filter(|_| b.try_spend(1, 1_500).is_some()).count(),
            5
        );
        // The next statement says which reply it holds.
        assert_eq!(b.snapshot(1, 1_600).request.adopted, snap.request.seq);
        // The key moved: the new owner keeps nothing for this holder.
        b.owner_changed();
        assert_eq!((b.told_share(), b.is_cut_off()), (0, false));
        b.cut_off_by_owner();
        assert!(b.try_spend(1, 2_700).is_none());
        // Giving everything back drops the figure as the statement is taken, but
        // not while cut off (it may be serving on it): it asks one unit instead.
        let snap = b.snapshot(0, 2_800);
        b.apply(&snap, &reply, 2_800);
        b.return_credit(2_900);
        b.cut_off_by_owner();
        let kept = b.snapshot(0, 2_900);
        assert_eq!((kept.request.want, b.told_share()), (1, 5));
        b.set_cut_off(None);
        let back = b.snapshot(0, 2_950);
        assert_eq!((back.request.remaining, back.request.want), (0, 0));
        assert_eq!(b.told_share(), 0);
        b.cut_off_by_owner();
        assert!(b.try_spend(1, 4_000).is_none(), "cut off, nothing beyond");
    }

    #[test]
    fn returned_credit_is_stated_as_nothing_left() {
        let mut b = windowed(CutOffPolicy::Share);
        grant(&mut b, 10, 0);
        b.try_spend(3, 10).expect("fits");
        b.return_credit(20);
        assert!(b.try_spend(1, 20).is_none());
        let snap = b.snapshot(0, 30);
        assert_eq!((snap.request.remaining, b.used(30)), (0, 3));
        let mut s = Budget::new(Kind::Slots, CutOffPolicy::Share);
        grant(&mut s, 3, 0);
        s.try_spend(1, 10).expect("slot");
        s.return_credit(20);
        assert_eq!(s.credit(20), 1, "the slot in use is kept");
    }

    #[test]
    fn slots_are_held_until_ttl_and_returned_on_settle() {
        let mut b = Budget::new(Kind::Slots, CutOffPolicy::Share);
        grant(&mut b, 2, 0);
        let a = b.try_spend(1, 10).expect("slot 1");
        b.try_spend(1, 10).expect("slot 2");
        assert!(b.try_spend(1, 10).is_none());
        b.settle(a, 1, 1, 10);
        assert!(b.can_spend(1, 10));
        assert!(!b.can_spend(1, 500), "slots end with the credit");
        assert_eq!(b.snapshot(1, 20).request.remaining, 1, "in use is stated");
    }
}
