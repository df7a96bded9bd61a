//! A rebuilt line after a failover: the live holders not heard from yet, the
//! gate that stays shut until each has stated or one ttl has passed, and the
//! holders asked to state again when the gate opens or room comes back
//! (docs/design/lease.md, "Failover").

use super::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Recovery<H> {
    pub(super) unknown: BTreeSet<H>,
    pub(super) until_ms: u64,
    /// Whether the holders still unknown were asked to state ([`Line::to_nudge`]).
    pub(super) nudged: bool,
    /// Holders that asked for credit while the gate was shut and were granted
    /// nothing: told once it opens ([`Line::take_reopened`]), or each would wait
    /// out its interval before asking again.
    pub(super) waiting: BTreeSet<H>,
}

impl<H: Ord + Clone> Line<H> {
    /// Whether a rebuilt owner is still conservative.
    pub fn recovering(&self, now_ms: u64) -> bool {
        self.hidden(now_ms) > 0
    }

    /// Once per rebuild, `after_ms` into it: the live holders that have not
    /// stated yet. Holders state to a new owner at once when they see the key
    /// move; one that does not (its view never moved: the owner alone saw a member
    /// leave and come back) would hold the line for its whole ttl, so the owner
    /// asks it to state (docs/design/lease.md, "an owner's flap alone").
    pub fn to_nudge(&mut self, now_ms: u64, after_ms: u64) -> Vec<H> {
        let ttl = self.config.ttl_ms;
        match &mut self.recovery {
            Some(r)
                if !r.nudged
                    && !r.unknown.is_empty()
                    && r.until_ms <= now_ms.saturating_add(ttl).saturating_sub(after_ms)
                    && now_ms < r.until_ms =>
            {
                r.nudged = true;
                r.unknown.iter().cloned().collect()
            }
            _ => Vec::new(),
        }
    }

    /// Once the rebuilt line's gate opened (every live holder stated, or its
    /// ttl passed): the holders it refused while shut, each once. The owner asks
    /// them to state again at once (docs/design/lease.md, "The gate").
    pub fn take_reopened(&mut self, now_ms: u64) -> Vec<H> {
        let open = !self.recovering(now_ms);
        match &mut self.recovery {
            Some(r) if open && !r.waiting.is_empty() => {
                std::mem::take(&mut r.waiting).into_iter().collect()
            }
            _ => Vec::new(),
        }
    }

    /// The holders refused for want of room that could be granted something
    /// now (room under L and under their share), each once: the owner asks
    /// them to state again at once, when a bucket leaves the window, rather
    /// than leaving each to its next sync round (docs/design/lease.md, "Room
    /// offered as it comes back"). The others stay for a later call.
    pub fn take_short_with_room(&mut self, now_ms: u64) -> Vec<H> {
        // Not `available`: it counts each holder's told figure, which is room
        // for that holder itself.
        if self.short.is_empty() || self.recovering(now_ms) {
            return Vec::new();
        }
        let with_room: Vec<H> = (self.short.iter())
            .filter(|h| self.has_room_for(h, now_ms))
            .cloned()
            .collect();
        for h in &with_room {
            self.short.remove(h);
        }
        with_room
    }

    /// Whether `holder`'s next statement would be granted something, as
    /// [`Line::sync`] reckons it (its figures apart from everyone else's):
    /// below its share, room under L beside the others, and no figure told to
    /// it beyond that room.
    pub(super) fn has_room_for(&self, holder: &H, now_ms: u64) -> bool {
        let Some(account) = self.accounts.get(holder) else {
            return false;
        };
        let share =
            (self.terms.shares.get(holder).copied().unwrap_or(0)).saturating_add(self.terms.borrow);
        let mine = self.account_stated(account, now_ms);
        let others = (self.committed_beside(Some(holder), now_ms))
            .saturating_sub(self.member_charge(holder, now_ms));
        let left = self.config.capacity.saturating_sub(others);
        mine < share && mine < left && account.reserves.max() <= left
    }

    /// Whether some holder waits for room ([`Line::take_short_with_room`]).
    pub fn has_short(&self) -> bool {
        !self.short.is_empty()
    }

    /// After one ttl, a holder that never stated may have spent all the credit the
    /// old owner could have given it: `max_credit`, as consumption in the bucket
    /// the ttl ended in (windowed keys; a silent holder's slots simply return).
    pub(super) fn silent_charge_of(&self, member: &H, now_ms: u64) -> u64 {
        match (&self.recovery, self.config.kind) {
            (Some(r), Kind::Windowed(w))
                if r.unknown.contains(member)
                    && r.until_ms <= now_ms
                    && w.counts(w.bucket_index(r.until_ms), now_ms) =>
            {
                self.config.max_credit
            }
            _ => 0,
        }
    }

    pub(super) fn reservation(&self, r: &Recovery<H>) -> u64 {
        if r.unknown.is_empty() {
            0
        } else {
            self.config.capacity
        }
    }
}
