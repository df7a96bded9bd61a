//! One holder's statement: checked, read against the account it replaces, the
//! grant, the figure it may spend cut off, and the reply.

use super::*;

/// What a statement says its holder has: its own figures (usage and lapsed
/// credit in the window; 0 for slots) and the credit it still holds, as
/// accepted.
struct Stated {
    own: u64,
    accepted: u64,
}

impl<H: Ord + Clone> Line<H> {
    /// Applies `holder`'s statement at `now_ms` and grants what it can. Bad input
    /// (absurd amounts, stale statements, too many holders) is refused and changes
    /// nothing.
    pub fn sync(
        &mut self,
        holder: &H,
        request: &SyncRequest,
        now_ms: u64,
    ) -> Result<SyncReply, Refusal> {
        let now_ms = now_ms.max(self.last_now_ms);
        self.check(holder, request)?;
        self.last_now_ms = now_ms;
        self.settle(now_ms);
        // The statement supersedes what the counters said of this member.
        self.rebuilt.remove(holder);
        let known = self.accounts.get(holder).cloned();
        let mut account = known.clone().unwrap_or(Account {
            usage: BTreeMap::new(),
            credit: 0,
            until_ms: 0,
            holder_until: 0,
            lapsed: Vec::new(),
            seq: 0,
            reserves: Reserves::default(),
            previous: (0, 0),
        });
        account.seq = request.seq;
        let stated = match self.config.kind {
            Kind::Windowed(w) => {
                self.read_windowed(w, known.as_ref(), &mut account, request, now_ms)
            }
            Kind::Slots => read_slots(known.as_ref(), &mut account, request, now_ms),
        };
        if let Some(r) = &mut self.recovery {
            r.unknown.remove(holder);
        }
        // Room for a grant: L minus everyone else, minus this holder's own figures.
        self.accounts.remove(holder);
        let reply = self.grant(holder, &mut account, &stated, request, now_ms);
        self.accounts.insert(holder.clone(), account);
        self.note_refusal(holder, request.want > 0 && reply.granted == 0, now_ms);
        debug_assert!(
            reply.granted == 0 || self.committed(now_ms) <= self.config.capacity,
            "over-granted"
        );
        Ok(reply)
    }

    /// A windowed statement: its usage (buckets clamped to the owner's current
    /// one, shifted by the holder's clock skew), and the credit it claims,
    /// accepted up to what the account held (conservation).
    fn read_windowed(
        &self,
        w: crate::counter::Window,
        known: Option<&Account>,
        account: &mut Account,
        request: &SyncRequest,
        now_ms: u64,
    ) -> Stated {
        let now_bucket = w.bucket_index(now_ms);
        let shift = skew_shift(request.seq, now_ms, w.bucket_ms());
        let mut usage = BTreeMap::new();
        for &(bucket, cost) in &request.usage {
            let bucket = bucket.saturating_add(shift).min(now_bucket);
            if w.counts(bucket, now_ms) {
                add(&mut usage, bucket, cost);
            }
        }
        let used: u64 = usage.values().fold(0, |s, c| s.saturating_add(*c));
        let accepted = match known {
            Some(a) => {
                let live = self
                    .usage_in_window(&a.usage, now_ms)
                    .saturating_add(if a.until_ms > now_ms { a.credit } else { 0 });
                request.remaining.min(live.saturating_sub(used))
            }
            // First statement (a new holder, or the re-announce after a
            // failover): its credit from the old owner counts in full, up to L.
            // Not up to `max_credit`: one request may have been granted its whole
            // cost above it (the stretch, in `grant`), and a holder spends that
            // credit while this statement is in flight; capped, the new owner
            // could grant the difference again
            // (`a_stretched_credit_stated_to_a_new_owner_counts_in_full` would
            // read 110 of L = 100). Counting a claim in full only ever charges
            // more.
            None => request.remaining.min(self.config.capacity),
        };
        account.usage = usage;
        // A lapsed credit that had ended for the holder before it took this
        // statement is in its usage already, as what it really spent from it:
        // counting it again as spent would charge the holder twice (and, with a
        // figure told from that sum, would let it spend the unspent part again:
        // 101 of L = 100, docs/design/lease.md).
        account.lapsed.retain(|l| l.holder_until > request.seq);
        let lapsed = self.lapsed_in_window(&account.lapsed, now_ms);
        Stated {
            own: used.saturating_add(lapsed),
            accepted,
        }
    }

    /// Grants what L, the holder's share, `max_credit` and its ask all leave,
    /// and tells it what it may spend cut off.
    fn grant(
        &self,
        holder: &H,
        account: &mut Account,
        stated: &Stated,
        request: &SyncRequest,
        now_ms: u64,
    ) -> SyncReply {
        let cap = self.config.capacity;
        let others = self.committed_beside(Some(holder), now_ms);
        let mine = stated.own.saturating_add(stated.accepted);
        let own_share = self.terms.shares.get(holder).copied().unwrap_or(0);
        let share = own_share.saturating_add(self.terms.borrow);
        // Figures told before still count (a reply may be lost), but not those its
        // statement says it replaced, nor any once it gives everything back (it
        // dropped its figure when it sent this). Beyond what L leaves, nothing can
        // be granted whatever this statement says.
        let returning = request.want == 0 && request.remaining == 0;
        account.reserves.confirm(request.adopted, returning);
        if !returning {
            // No owner tells more than L (a figure from before a lower L is
            // clamped, not refused: refusing would leave the holder unheard).
            (account.reserves).keep(request.held.min(cap), request.adopted);
        }
        let left = cap.saturating_sub(others);
        let told_before = account.reserves.max();
        let room = [
            if told_before > left {
                0
            } else {
                left.saturating_sub(mine)
            },
            share.saturating_sub(mine),
            // A single request may cost more than max_credit (a big prompt under
            // a small TPM): the cap stretches to what was asked, never beyond L.
            (self.config.max_credit.max(request.want)).saturating_sub(stated.accepted),
            request.want,
        ];
        let granted = room.into_iter().min().unwrap_or(0);
        account.credit = stated.accepted.saturating_add(granted);
        account.until_ms = now_ms.saturating_add(self.config.ttl_ms);
        account.holder_until = request.seq.saturating_add(self.config.ttl_ms);
        // What it may use per window if it loses this owner: what it holds now
        // (its usage in the window and its credit: already charged, so keeping it
        // reserves nothing new) within its share, nothing once it gave everything
        // back (an idle holder needs no reserve). Cut off, it goes on at about the
        // rate it had, as its old buckets leave the window.
        // Never beyond what L leaves beside the others: `mine` may still count a
        // lapsed credit as spent on top of what the holder spent from an earlier
        // told figure while cut off (a statement taken before the credit ended on
        // its side, read after it lapsed here), and a figure told from that sum
        // would let it spend the unspent credit's worth again (a lapsed 25 and
        // 16 spent cut off, told as 41 beside 60 held by the others: 101 of
        // L = 100).
        let cut_off_share = if returning {
            0
        } else {
            own_share.min(mine.saturating_add(granted)).min(left)
        };
        account.reserves.tell(cut_off_share, request.seq);
        SyncReply {
            credit: account.credit,
            granted,
            ttl_ms: self.config.ttl_ms,
            cut_off_share,
        }
    }

    /// A holder asked and was granted nothing: while the line recovers from a
    /// failover it waits for the recovery's end; otherwise (windowed) it is
    /// offered the room when some comes back. Granted, it is neither.
    fn note_refusal(&mut self, holder: &H, refused: bool, now_ms: u64) {
        let shut = self.recovering(now_ms);
        match &mut self.recovery {
            Some(r) if shut && refused => {
                r.waiting.insert(holder.clone());
            }
            _ if refused && matches!(self.config.kind, Kind::Windowed(_)) => {
                self.short.insert(holder.clone());
            }
            _ => {
                self.short.remove(holder);
            }
        }
    }
}

/// A slots statement: slots in use are real whatever the owner thinks, always
/// counted. The credit this statement replaces still binds until the holder
/// adopts the reply: slots it starts from it meanwhile are not in the statement
/// (left uncharged, 6 slots could be in use of C = 4, with borrowing on). It
/// stays charged until its own end, so a silent holder's slots still come back
/// within one ttl.
fn read_slots(
    known: Option<&Account>,
    account: &mut Account,
    request: &SyncRequest,
    now_ms: u64,
) -> Stated {
    if let Some(a) = known {
        let live = |(credit, until): (u64, u64)| if until > now_ms { credit } else { 0 };
        let current = live((a.credit, a.until_ms));
        let earlier = live(a.previous);
        account.previous = if current >= earlier {
            (a.credit, a.until_ms)
        } else {
            a.previous
        };
    }
    Stated {
        own: 0,
        accepted: request.remaining,
    }
}
