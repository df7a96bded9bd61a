//! The owner's ledger for one key in `lease` mode: one **credit line** per holder.
//!
//! Every exchange with a holder is a full statement of its state for the key
//! ([`SyncRequest`]): its exact per-bucket consumption over the window (windowed
//! keys) or its requests in flight (slots), the credit it can still spend, and how
//! much more it wants. The owner replaces what it knew of that holder with the
//! statement, grants more if it can, and answers with the holder's whole credit
//! ([`SyncReply`]), valid for one ttl. So renewal, report, return (`want = 0,
//! remaining = 0`) and the re-announce after a failover are the same message.
//!
//! Invariant (windowed; `debug_assert!`ed on every grant and property-tested with
//! the holders' real spending in `proptests.rs`; one exception, below):
//!
//! ```text
//! committed(now) = sum over holders h of charge_h(now) + hidden(now) + floors <= L
//! charge_h(now)  = max(usage_h in window + lapsed_h in window + credit_h (unexpired),
//!                      every cut_off_share_h it may still hold)
//! ```
//!
//! The exception: a statement taken before its holder's credit ended there but
//! read after it lapsed here (delayed by most of a ttl) leaves the lapsed credit
//! counted beside the usage it states, so `committed` can read above L by what was
//! spent from that credit, though nobody can spend it: no figure told then exceeds
//! what L leaves beside the others (docs/design/lease.md, "The told cut-off
//! share").
//!
//! - `usage_h`: the holder's last statement, buckets clamped to the owner's current
//!   bucket (a holder clock running ahead never ages cost out early).
//! - `credit_h`: what it may still spend, until the owner's `now + ttl` at the last
//!   exchange. The holder stops at its own *send* time + ttl, which is earlier.
//! - `lapsed_h`: a credit that ran out without a new statement is taken as spent in
//!   the bucket of its expiry (the latest moment it could have been) and ages out
//!   with the window, or is dropped by a statement the holder took after the
//!   credit had ended on its side (its usage then holds what it really spent
//!   from it): never by an earlier one, which may be followed by more spending.
//! - `hidden`: after a failover [`Line::rebuild`], all of L while any live holder
//!   has not stated yet, for at most one ttl; then `max_credit` per holder still
//!   silent becomes consumption (docs/design/lease.md, "Failover").
//! - `cut_off_shares_h`: what the holder may have used in the window if it loses
//!   this owner while both stay live in gossip (an asymmetric fault: packet loss or
//!   a slow link on the RPC path only). Told with every reply (what it holds then,
//!   at most its share); the holder uses the last one it adopted. Every figure it
//!   may still hold counts: the one its statement says it adopted and any told
//!   since (a reply may be lost, leaving it an earlier, larger one). None once it
//!   gives everything back (it drops its figure when it sends that statement), or
//!   once the member is gone from the terms (collected, or left).
//! - floors: members that are unreachable are charged at least their share of `L`
//!   per window (docs/design/lease.md, "Shares, borrowing and partitions"),
//!   [`Terms::floors`].
//!
//! **Conservation.** A statement may not raise a known holder's commitment: the
//! remaining credit it claims is accepted only up to `charge_h - usage_new` (a
//! refund moves cost from usage back to credit, one for one). The holder adopts the
//! owner's figure, so a holder and its owner never disagree upwards.
//!
//! Slots (concurrency) are not windowed: `charge_h` = the slots it holds until its
//! credit expires, then 0, so a crashed holder's slots return within one ttl.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::lease::{MAX_AMOUNT, Refusal, bounded};

/// The owner's ledger of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line<H> {
    config: LineConfig,
    accounts: Accounts<H>,
    /// Consumption per member known only from the gossiped counters at rebuild, per
    /// bucket; a member's first statement replaces its part.
    rebuilt: BTreeMap<H, BTreeMap<u64, u64>>,
    /// Members known from the counters at rebuild that were not live holders then
    /// (dead, or a restarted node's previous incarnation): they may have spent
    /// credit from the old owner that the counters do not show yet.
    departed: BTreeSet<H>,
    recovery: Option<Recovery<H>>,
    /// Holders whose last statement asked for credit and was granted nothing
    /// while the line was open (windowed keys): offered the room when it comes
    /// back ([`Line::take_short_with_room`]). Only holders with an account.
    short: BTreeSet<H>,
    /// Shared: every idle key of one capacity has the same terms in a round, and
    /// a copy per line would be most of an idle lease key's memory.
    terms: Arc<Terms<H>>,
    /// Members whose cut healed and who have not stated since (windowed keys):
    /// when it healed (owner clock) and the floor they were charged. During the
    /// cut their side's owner may have let them spend past the cut-off share
    /// this owner told them (up to their floor); their account still shows the
    /// figures from before the cut, so the floor charges them until a statement
    /// taken after the heal does (or the window has turned over).
    healed: BTreeMap<H, (u64, u64)>,
    last_now_ms: u64,
}

impl<H: Ord + Clone> Line<H> {
    /// An empty ledger (a key that nobody owned before).
    pub fn new(config: LineConfig) -> Self {
        Self {
            config,
            accounts: Accounts::default(),
            rebuilt: BTreeMap::new(),
            departed: BTreeSet::new(),
            recovery: None,
            short: BTreeSet::new(),
            terms: Arc::new(Terms::default()),
            healed: BTreeMap::new(),
            last_now_ms: 0,
        }
    }

    /// A new owner's ledger after ownership moved: each member's consumption per
    /// bucket from the gossiped counters; until each of `live_holders` has stated
    /// (holders state to a new owner at once) or one ttl passed, nothing is granted:
    /// the counters lag, so an unknown holder's recent spending is unknown. Holders
    /// still silent after one ttl are charged `max_credit` each (the old owner never
    /// let one hold more credit) on top of their counters.
    pub fn rebuild(
        config: LineConfig,
        consumed_from_counters: &[(H, Vec<(u64, u64)>)],
        live_holders: &[H],
        now_ms: u64,
    ) -> Self {
        let mut line = Self::new(config);
        line.last_now_ms = now_ms;
        if let Kind::Windowed(w) = config.kind {
            let now_bucket = w.bucket_index(now_ms);
            for (member, buckets) in consumed_from_counters {
                let part = line.rebuilt.entry(member.clone()).or_default();
                for &(bucket, cost) in buckets {
                    add(part, bucket.min(now_bucket), cost);
                }
                if !live_holders.contains(member) {
                    line.departed.insert(member.clone());
                }
            }
        }
        if !live_holders.is_empty() {
            line.recovery = Some(Recovery {
                unknown: live_holders.iter().cloned().collect(),
                until_ms: now_ms.saturating_add(config.ttl_ms),
                nudged: false,
                waiting: BTreeSet::new(),
            });
        }
        line
    }

    /// A departed member's consumption per bucket learned after the line opened
    /// (one chitchat had collected before this node started, whose counters a
    /// peer republished; or one whose counters arrived after a rebuild): counted
    /// as [`Line::rebuild`] counts a departed member, if the line holds nothing
    /// of it yet. Returns whether it was taken. A member with an account or a
    /// rebuilt part is left alone: what the line has is at least as fresh.
    pub fn absorb_departed(&mut self, member: &H, buckets: &[(u64, u64)], now_ms: u64) -> bool {
        let Kind::Windowed(w) = self.config.kind else {
            return false;
        };
        let known = self.accounts.get(member).is_some() || self.rebuilt.contains_key(member);
        if known || buckets.iter().all(|&(_, cost)| cost == 0) {
            return false;
        }
        let now_bucket = w.bucket_index(now_ms.max(self.last_now_ms));
        let part = self.rebuilt.entry(member.clone()).or_default();
        for &(bucket, cost) in buckets {
            add(part, bucket.min(now_bucket), cost);
        }
        self.departed.insert(member.clone());
        true
    }

    /// The configuration.
    pub fn config(&self) -> &LineConfig {
        &self.config
    }

    /// The members' shares and floors in force.
    pub fn terms(&self) -> &Terms<H> {
        &self.terms
    }

    /// Replaces the members' shares and floors (the engine, every round). A member
    /// that became unreachable is no longer waited for: its floor (its share at the
    /// cut, at least what the old owner let it commit with borrowing off) charges it.
    /// A member gone from both (collected after its death, or left after giving
    /// everything back) can no longer spend a cut-off share: its reserves end
    /// (so a crashed holder's slots come back when it is declared dead).
    pub fn set_terms(&mut self, terms: impl Into<Arc<Terms<H>>>) {
        let now_ms = self.last_now_ms;
        self.set_terms_at(terms, now_ms);
    }

    /// [`Self::set_terms`] at `now_ms` (owner clock): a member whose floor the
    /// new terms drop while it is still a member (its cut healed) keeps that
    /// floor until it states again ([`Line`]'s `healed`).
    pub fn set_terms_at(&mut self, terms: impl Into<Arc<Terms<H>>>, now_ms: u64) {
        let terms = terms.into();
        if matches!(self.config.kind, Kind::Windowed(_)) {
            let at = now_ms.max(self.last_now_ms);
            for (member, floor) in &self.terms.floors {
                let healed = !terms.floors.contains_key(member)
                    && (terms.shares.contains_key(member) || self.accounts.get(member).is_some());
                if healed {
                    self.healed.insert(member.clone(), (at, *floor));
                }
            }
            self.healed
                .retain(|member, _| !terms.floors.contains_key(member));
        }
        if let (Some(r), Kind::Windowed(_)) = (&mut self.recovery, self.config.kind) {
            for member in terms.floors.keys() {
                r.unknown.remove(member);
            }
        }
        for (member, account) in self.accounts.iter_mut() {
            if !terms.shares.contains_key(member) && !terms.floors.contains_key(member) {
                account.reserves = Reserves::default();
            }
        }
        self.terms = terms;
    }

    /// Everything counted against L at `now_ms` (see the module docs).
    pub fn committed(&self, now_ms: u64) -> u64 {
        self.committed_beside(None, now_ms)
    }

    /// Everything counted against L but `holder`'s gossiped figure: the room for
    /// a grant to `holder` counts its own figures apart (what it states, and the
    /// figure its statement says it holds), so its published one must not count
    /// again among the others.
    fn committed_beside(&self, holder: Option<&H>, now_ms: u64) -> u64 {
        let now_ms = now_ms.max(self.last_now_ms);
        let mut members: BTreeSet<&H> = self.accounts.keys().collect();
        members.extend(self.rebuilt.keys());
        members.extend(self.terms.floors.keys());
        members.extend(self.healed.keys());
        members.extend((self.terms.held.keys()).filter(|m| Some(*m) != holder));
        if let Some(r) = &self.recovery {
            members.extend(r.unknown.iter());
        }
        (members.into_iter())
            .map(|m| self.member_charge(m, now_ms))
            .fold(self.hidden(now_ms), u64::saturating_add)
    }

    /// One member's charge: what its account (or, before its first statement, its
    /// counters and the silent-holder charge) says, but at least its floor when it
    /// is unreachable. Each figure counts once, however many sources know of it.
    fn member_charge(&self, member: &H, now_ms: u64) -> u64 {
        let healed = self.healed_floor(member, now_ms);
        let own = match self.accounts.get(member) {
            Some(a) => self.account_charge(a, now_ms),
            None => {
                let rebuilt = self.rebuilt.get(member);
                let counters = rebuilt.map_or(0, |part| self.usage_in_window(part, now_ms));
                // A member known only from the counters (this line was rebuilt after
                // its owner changed) that is unreachable or was already gone at the
                // rebuild (a restarted node's previous incarnation) may have spent
                // credit the counters have not shown yet: up to `max_credit`, while
                // its counters count (without this charge, the jepsen harness sees
                // 41 of 40 after a kill -9, and again after a restart).
                let gone = self.terms.floors.contains_key(member) || self.departed.contains(member);
                let unreported = match (rebuilt, gone) {
                    (Some(_), true) => self.config.max_credit,
                    _ => 0,
                };
                (counters.saturating_add(unreported))
                    .saturating_add(self.silent_charge_of(member, now_ms))
                    .max(self.terms.held.get(member).copied().unwrap_or(0))
            }
        };
        own.max(self.terms.floors.get(member).copied().unwrap_or(0))
            .max(healed)
    }

    /// The floor a member whose cut healed is still charged at `now_ms`: until
    /// the owner holds a statement of it taken after the heal (its seq, on its
    /// clock, past the heal by more than the skew tolerance), or the window
    /// has turned over since.
    fn healed_floor(&self, member: &H, now_ms: u64) -> u64 {
        let Some(&(at, floor)) = self.healed.get(member) else {
            return 0;
        };
        let stated = (self.accounts.get(member))
            .is_some_and(|a| a.seq > at.saturating_add(SKEW_TOLERANCE_MS));
        let turned = match self.config.kind {
            Kind::Windowed(w) => now_ms >= at.saturating_add(w.window_ms() + w.bucket_ms()),
            Kind::Slots => true,
        };
        if stated || turned { 0 } else { floor }
    }

    /// What may still be granted at `now_ms`.
    pub fn available(&self, now_ms: u64) -> u64 {
        self.config.capacity.saturating_sub(self.committed(now_ms))
    }

    /// What a rebuilt owner still reserves for holders that have not stated.
    pub fn hidden(&self, now_ms: u64) -> u64 {
        match &self.recovery {
            Some(r) if r.until_ms > now_ms => self.reservation(r),
            _ => 0,
        }
    }

    /// `holder`'s charge at `now_ms` (0 if nothing is known of it).
    pub fn charge_of(&self, holder: &H, now_ms: u64) -> u64 {
        self.member_charge(holder, now_ms)
    }

    /// What `holder`'s account holds at `now_ms`, for audits: its stated usage
    /// in the window, its lapsed credit counted as spent, and the largest
    /// cut-off share it may hold (zeros if nothing is known of it).
    pub fn figures_of(&self, holder: &H, now_ms: u64) -> (u64, u64, u64) {
        self.accounts.get(holder).map_or((0, 0, 0), |a| {
            (
                self.usage_in_window(&a.usage, now_ms),
                self.lapsed_in_window(&a.lapsed, now_ms),
                a.reserves.max(),
            )
        })
    }

    /// Holders with an account.
    pub fn holders(&self) -> usize {
        self.accounts.len()
    }

    /// Nothing held by anyone (read after [`Line::settle`]): no account, nothing
    /// known from the counters, no recovery. Such a line answers every statement
    /// exactly as [`Line::new`] with the same terms would, so an owner may drop it
    /// and open a new one while it keeps owning the key.
    pub fn is_at_rest(&self) -> bool {
        self.accounts.len() == 0
            && self.healed.is_empty()
            && self.rebuilt.is_empty()
            && self.departed.is_empty()
            && self.recovery.is_none()
    }

    /// Moves expired credits into consumption, drops what left the window and
    /// forgets holders with nothing left (bounded memory); returns how many credits
    /// expired (holders that went silent). Reads never depend on when this runs.
    pub fn settle(&mut self, now_ms: u64) -> usize {
        let now_ms = now_ms.max(self.last_now_ms);
        let kind = self.config.kind;
        let mut expired = 0;
        for a in self.accounts.values_mut() {
            if a.until_ms <= now_ms && a.credit > 0 {
                expired += 1;
                if let Kind::Windowed(w) = kind {
                    a.lapsed.push(Lapsed {
                        bucket: w.bucket_index(a.until_ms),
                        credit: a.credit,
                        holder_until: a.holder_until,
                    });
                }
                a.credit = 0;
            }
            if let Kind::Windowed(w) = kind {
                a.usage.retain(|b, _| w.counts(*b, now_ms));
                a.lapsed.retain(|l| w.counts(l.bucket, now_ms));
            }
        }
        let healed: Vec<H> = self.healed.keys().cloned().collect();
        for member in healed {
            if self.healed_floor(&member, now_ms) == 0 {
                self.healed.remove(&member);
            }
        }
        // An account with nothing left is forgotten; its next statement is a first
        // one, which counts its claimed credit in full (safe), so nothing is lost.
        self.accounts.retain(|_, a| {
            a.credit > 0
                || !a.usage.is_empty()
                || !a.lapsed.is_empty()
                || a.until_ms > now_ms
                || !a.reserves.0.is_empty()
        });
        let accounts = &self.accounts;
        self.short.retain(|h| accounts.get(h).is_some());
        if let Kind::Windowed(w) = kind {
            for part in self.rebuilt.values_mut() {
                part.retain(|b, _| w.counts(*b, now_ms));
            }
            self.rebuilt.retain(|_, part| !part.is_empty());
            let rebuilt = &self.rebuilt;
            self.departed.retain(|m| rebuilt.contains_key(m));
        }
        if let Some(r) = &self.recovery {
            let done = r.unknown.is_empty();
            let ended = r.until_ms <= now_ms;
            let ended_counts =
                matches!(kind, Kind::Windowed(w) if w.counts(w.bucket_index(r.until_ms), now_ms));
            if done || (ended && !ended_counts) {
                self.recovery = None;
            }
        }
        expired
    }

    fn check(&self, holder: &H, request: &SyncRequest) -> Result<(), Refusal> {
        let entries = request.usage.len() as u64;
        if entries > 0 {
            bounded("usage entries", entries, MAX_USAGE_ENTRIES)?;
        }
        for &(_, cost) in &request.usage {
            bounded("cost", cost.max(1), MAX_AMOUNT)?;
        }
        if request.remaining > 0 {
            bounded("remaining", request.remaining, MAX_AMOUNT)?;
        }
        if request.want > 0 {
            bounded("want", request.want, self.config.capacity)?;
        }
        let known = self.accounts.get(holder);
        if let Some(a) = known
            && request.seq <= a.seq
        {
            return Err(Refusal::Stale(request.seq));
        }
        if known.is_none() && self.accounts.len() >= self.config.max_holders {
            return Err(Refusal::TooManyHolders {
                max: self.config.max_holders,
            });
        }
        Ok(())
    }

    fn account_charge(&self, a: &Account, now_ms: u64) -> u64 {
        // What it may spend cut off from this owner, on any figure it may hold.
        self.account_stated(a, now_ms).max(a.reserves.max())
    }

    /// What an account holds by its statements: usage, lapsed credit and live
    /// credit (its told figures apart).
    fn account_stated(&self, a: &Account, now_ms: u64) -> u64 {
        let credit = if a.until_ms > now_ms { a.credit } else { 0 };
        match self.config.kind {
            Kind::Windowed(w) => {
                let expired_now =
                    if a.until_ms <= now_ms && w.counts(w.bucket_index(a.until_ms), now_ms) {
                        a.credit
                    } else {
                        0
                    };
                (self.usage_in_window(&a.usage, now_ms))
                    .saturating_add(self.lapsed_in_window(&a.lapsed, now_ms))
                    .saturating_add(expired_now)
                    .saturating_add(credit)
            }
            Kind::Slots => {
                let (previous, until) = a.previous;
                credit.max(if until > now_ms { previous } else { 0 })
            }
        }
    }

    fn usage_in_window(&self, usage: &BTreeMap<u64, u64>, now_ms: u64) -> u64 {
        match self.config.kind {
            Kind::Windowed(w) => (usage.iter())
                .filter(|(b, _)| w.counts(**b, now_ms))
                .fold(0, |s, (_, c)| s.saturating_add(*c)),
            Kind::Slots => 0,
        }
    }

    fn lapsed_in_window(&self, lapsed: &[Lapsed], now_ms: u64) -> u64 {
        match self.config.kind {
            Kind::Windowed(w) => (lapsed.iter())
                .filter(|l| w.counts(l.bucket, now_ms))
                .fold(0, |s, l| s.saturating_add(l.credit)),
            Kind::Slots => 0,
        }
    }
}

/// The skew tolerance, shared with the counters' readers (see there).
pub use crate::counter::SKEW_TOLERANCE_MS;

/// How many buckets of width `bucket_ms` to shift a statement stamped `seq` (the
/// holder's clock at its snapshot) and received at the owner's `now_ms`: the lag
/// beyond [`SKEW_TOLERANCE_MS`], rounded up (the counters' readers' rule,
/// [`crate::counter::buckets_behind`]). Clocks running ahead shift nothing (their
/// buckets are clamped to the owner's current one).
pub fn skew_shift(seq: u64, now_ms: u64, bucket_ms: u64) -> u64 {
    crate::counter::buckets_behind(now_ms.saturating_sub(seq), bucket_ms)
}

/// Most `(bucket, cost)` entries in one statement (the counters' largest ring).
pub const MAX_USAGE_ENTRIES: u64 = 2 * crate::counter::MAX_BUCKETS as u64 + 2;

fn add(map: &mut BTreeMap<u64, u64>, bucket: u64, cost: u64) {
    if cost > 0 {
        let c = map.entry(bucket).or_insert(0);
        *c = c.saturating_add(cost).min(MAX_AMOUNT);
    }
}

mod accounts;
mod config;
mod messages;
mod recovery;
mod reserves;
mod statement;
#[cfg(test)]
mod tests;

use accounts::{Account, Accounts, Lapsed};
pub use config::{ConfigError, Kind, LineConfig};
pub use messages::{SyncReply, SyncRequest, Terms};
use recovery::Recovery;
use reserves::Reserves;
