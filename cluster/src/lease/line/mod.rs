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

use crate::counter::Window;
use crate::lease::{MAX_AMOUNT, MAX_HOLDERS, MAX_TTL_MS, Refusal, bounded};

/// What a line limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Cost per sliding window (requests, tokens), in the counters' buckets.
    Windowed(Window),
    /// Units held at once (requests in flight).
    Slots,
}

/// Why a [`LineConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `capacity` must be in `1..=MAX_AMOUNT`.
    #[error("capacity must be in 1..={MAX_AMOUNT}, got {0}")]
    Capacity(u64),
    /// `max_credit` must be in `1..=capacity`.
    #[error("max_credit must be in 1..=capacity ({capacity}), got {max_credit}")]
    MaxCredit {
        /// The capacity.
        capacity: u64,
        /// What was asked.
        max_credit: u64,
    },
    /// `max_holders` must be in `1..=MAX_HOLDERS`.
    #[error("max_holders must be in 1..={MAX_HOLDERS}, got {0}")]
    MaxHolders(usize),
    /// `ttl_ms` must be in `1..=MAX_TTL_MS`.
    #[error("ttl must be in 1..={MAX_TTL_MS} ms, got {0}")]
    Ttl(u64),
}

/// One key's limit as its owner enforces it. The same on every node (it decides what
/// a rebuilt owner assumes of holders it has not heard from).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineConfig {
    capacity: u64,
    kind: Kind,
    max_credit: u64,
    max_holders: usize,
    ttl_ms: u64,
}

impl LineConfig {
    /// `capacity` L of `kind`; `max_credit` caps one holder's credit (slots: what it
    /// holds); `max_holders` bounds the holders tracked; `ttl_ms` is a credit's life.
    pub fn try_new(
        capacity: u64,
        kind: Kind,
        max_credit: u64,
        max_holders: usize,
        ttl_ms: u64,
    ) -> Result<Self, ConfigError> {
        if capacity == 0 || capacity > MAX_AMOUNT {
            return Err(ConfigError::Capacity(capacity));
        }
        if max_credit == 0 || max_credit > capacity {
            return Err(ConfigError::MaxCredit {
                capacity,
                max_credit,
            });
        }
        if max_holders == 0 || max_holders > MAX_HOLDERS {
            return Err(ConfigError::MaxHolders(max_holders));
        }
        if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
            return Err(ConfigError::Ttl(ttl_ms));
        }
        Ok(Self {
            capacity,
            kind,
            max_credit,
            max_holders,
            ttl_ms,
        })
    }

    /// The capacity L.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// What the line limits.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The most credit one holder holds.
    pub fn max_credit(&self) -> u64 {
        self.max_credit
    }

    /// A credit's life.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

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

#[derive(Debug, Clone, PartialEq, Eq)]
struct Account {
    usage: BTreeMap<u64, u64>,
    credit: u64,
    until_ms: u64,
    /// When `credit` ends for the holder, on its clock: the statement's seq + ttl
    /// (it stops at its snapshot time + ttl, and its seq is never earlier).
    holder_until: u64,
    /// Credits that lapsed without a new statement, taken as spent.
    lapsed: Vec<Lapsed>,
    seq: u64,
    /// Cut-off shares it may still hold ([`SyncReply::cut_off_share`]).
    reserves: Reserves,
    /// Slots: the credit it held before its last statement, and until when
    /// (owner clock): it may start slots from it until the reply arrives.
    previous: (u64, u64),
}

/// The holders' accounts of one line, sorted by holder. A key has a handful of
/// holders (one per node at most), and a `BTreeMap` allocates a whole 11-slot leaf
/// for its first entry: 1.3 KB per line with a single holder, most of an idle
/// lease key's memory at its owner (massif; docs/BENCHMARKS.md). Emptied, it frees
/// its buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Accounts<H>(Vec<(H, Account)>);

impl<H> Default for Accounts<H> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<H: Ord> Accounts<H> {
    fn find(&self, holder: &H) -> Result<usize, usize> {
        self.0.binary_search_by(|(h, _)| h.cmp(holder))
    }

    fn get(&self, holder: &H) -> Option<&Account> {
        self.find(holder).ok().map(|i| &self.0[i].1)
    }

    fn insert(&mut self, holder: H, account: Account) {
        match self.find(&holder) {
            Ok(i) => self.0[i].1 = account,
            Err(i) => self.0.insert(i, (holder, account)),
        }
    }

    fn remove(&mut self, holder: &H) {
        if let Ok(i) = self.find(holder) {
            self.0.remove(i);
        }
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn keys(&self) -> impl Iterator<Item = &H> {
        self.0.iter().map(|(h, _)| h)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (&H, &mut Account)> {
        self.0.iter_mut().map(|(h, a)| (&*h, a))
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut Account> {
        self.0.iter_mut().map(|(_, a)| a)
    }

    fn retain(&mut self, mut keep: impl FnMut(&H, &mut Account) -> bool) {
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
struct Lapsed {
    bucket: u64,
    credit: u64,
    holder_until: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Recovery<H> {
    unknown: BTreeSet<H>,
    until_ms: u64,
    /// Whether the holders still unknown were asked to state ([`Line::to_nudge`]).
    nudged: bool,
    /// Holders that asked for credit while the gate was shut and were granted
    /// nothing: told once it opens ([`Line::take_reopened`]), or each would wait
    /// out its interval before asking again.
    waiting: BTreeSet<H>,
}

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
        let terms = terms.into();
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

    /// Whether a rebuilt owner is still conservative.
    pub fn recovering(&self, now_ms: u64) -> bool {
        self.hidden(now_ms) > 0
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
    fn has_room_for(&self, holder: &H, now_ms: u64) -> bool {
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
            && self.rebuilt.is_empty()
            && self.departed.is_empty()
            && self.recovery.is_none()
    }

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
        let cap = self.config.capacity;
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
        let (own, accepted) = match self.config.kind {
            Kind::Windowed(w) => {
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
                let accepted = match &known {
                    Some(a) => {
                        let live = self
                            .usage_in_window(&a.usage, now_ms)
                            .saturating_add(if a.until_ms > now_ms { a.credit } else { 0 });
                        request.remaining.min(live.saturating_sub(used))
                    }
                    // First statement (a new holder, or the re-announce after a
                    // failover): its credit from the old owner counts in full,
                    // up to L. Not up to `max_credit`: one request may have been
                    // granted its whole cost above it (the stretch, below), and a
                    // holder spends that credit while this statement is in
                    // flight; capped, the new owner could grant the difference
                    // again (`a_stretched_credit_stated_to_a_new_owner_counts_in_full`
                    // would read 110 of L = 100). Counting a claim in full only ever
                    // charges more.
                    None => request.remaining.min(cap),
                };
                account.usage = usage;
                // A lapsed credit that had ended for the holder before it took
                // this statement is in its usage already, as what it really spent
                // from it: counting it again as spent would charge the holder
                // twice (and, with a figure told from that sum, would let it spend
                // the unspent part again: 101 of L = 100, docs/design/lease.md).
                account.lapsed.retain(|l| l.holder_until > request.seq);
                let lapsed = self.lapsed_in_window(&account.lapsed, now_ms);
                (used.saturating_add(lapsed), accepted)
            }
            // Slots in use are real whatever the owner thinks: always counted.
            // The credit this statement replaces still binds until the holder
            // adopts the reply: slots it starts from it meanwhile are not in the
            // statement (left uncharged, 6 slots could be in use of C = 4, with
            // borrowing on). It stays charged until its own end, so a silent
            // holder's slots still come back within one ttl.
            Kind::Slots => {
                if let Some(a) = &known {
                    let live =
                        |(credit, until): (u64, u64)| if until > now_ms { credit } else { 0 };
                    let current = live((a.credit, a.until_ms));
                    let earlier = live(a.previous);
                    account.previous = if current >= earlier {
                        (a.credit, a.until_ms)
                    } else {
                        a.previous
                    };
                }
                (0, request.remaining)
            }
        };
        if let Some(r) = &mut self.recovery {
            r.unknown.remove(holder);
        }
        // Room for a grant: L minus everyone else, minus this holder's own figures.
        self.accounts.remove(holder);
        let others = self.committed_beside(Some(holder), now_ms);
        let mine = own.saturating_add(accepted);
        let share =
            (self.terms.shares.get(holder).copied().unwrap_or(0)).saturating_add(self.terms.borrow);
        // Figures told before still count (a reply may be lost), but not those its
        // statement says it replaced, nor any once it gives everything back (it
        // dropped its figure when it sent this). Beyond what L leaves, nothing can
        // be granted whatever this statement says.
        let returning = request.want == 0 && request.remaining == 0;
        account.reserves.confirm(request.adopted, returning);
        if !returning {
            // No owner tells more than L (a figure from before a lower L is
            // clamped, not refused: refusing would leave the holder unheard).
            account
                .reserves
                .keep(request.held.min(cap), request.adopted);
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
            (self.config.max_credit.max(request.want)).saturating_sub(accepted),
            request.want,
        ];
        let granted = room.into_iter().min().unwrap_or(0);
        account.credit = accepted.saturating_add(granted);
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
        let own_share = self.terms.shares.get(holder).copied().unwrap_or(0);
        let cut_off_share = if returning {
            0
        } else {
            own_share.min(mine.saturating_add(granted)).min(left)
        };
        account.reserves.tell(cut_off_share, request.seq);
        self.accounts.insert(holder.clone(), account);
        let shut = self.recovering(now_ms);
        let refused = request.want > 0 && granted == 0;
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
        debug_assert!(
            granted == 0 || self.committed(now_ms) <= cap,
            "over-granted"
        );
        Ok(SyncReply {
            credit: accepted.saturating_add(granted),
            granted,
            ttl_ms: self.config.ttl_ms,
            cut_off_share,
        })
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

    /// After one ttl, a holder that never stated may have spent all the credit the
    /// old owner could have given it: `max_credit`, as consumption in the bucket
    /// the ttl ended in (windowed keys; a silent holder's slots simply return).
    fn silent_charge_of(&self, member: &H, now_ms: u64) -> u64 {
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

    fn reservation(&self, r: &Recovery<H>) -> u64 {
        if r.unknown.is_empty() {
            0
        } else {
            self.config.capacity
        }
    }
}

/// The cut-off shares told to one holder that it may still hold: `(share, seq)`,
/// `seq` the statement whose reply told it. The holder holds the figure of the
/// reply it adopted last, or of one told since whose reply it got later; a reply
/// may be lost, so each counts until a statement says a later one was adopted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Reserves(Vec<(u64, u64)>);

/// Most figures kept per holder (a run of lost replies); beyond, the two oldest
/// merge into the larger share until the later of the two is replaced.
const MAX_RESERVES: usize = 8;

impl Reserves {
    /// A statement says the holder adopted the reply to `adopted`: figures told
    /// before it are replaced. `returning`: it gave everything back and dropped
    /// its figure when it sent the statement: none binds it.
    fn confirm(&mut self, adopted: u64, returning: bool) {
        if returning {
            self.0.clear();
        } else {
            self.0.retain(|&(_, seq)| seq >= adopted);
        }
    }

    /// The holder says it holds `share`, told in reply to statement `seq`: kept
    /// as if told here (an owner that rebuilt the line forgot what it told; one
    /// that did not already keeps it, merged upward at worst).
    fn keep(&mut self, share: u64, seq: u64) {
        // Covered by a figure that binds at least as long (told since, or merged
        // into a later one) and is at least as large.
        if share == 0 || self.0.iter().any(|&(s, q)| q >= seq && s >= share) {
            return;
        }
        let at = self.0.partition_point(|&(_, q)| q < seq);
        self.0.insert(at, (share, seq));
        self.bound();
    }

    /// Records `share` told in reply to statement `seq`.
    fn tell(&mut self, share: u64, seq: u64) {
        if share > 0 {
            self.0.push((share, seq));
        }
        self.bound();
    }

    /// At most [`MAX_RESERVES`]: the two oldest merge into the larger share, kept
    /// until the later of the two is replaced.
    fn bound(&mut self) {
        if self.0.len() > MAX_RESERVES {
            let (s, _) = self.0.remove(0);
            self.0[0].0 = self.0[0].0.max(s);
        }
    }

    /// The largest figure the holder may hold.
    fn max(&self) -> u64 {
        self.0.iter().map(|(s, _)| *s).max().unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn line(capacity: u64, max_credit: u64) -> Line<&'static str> {
        let w = Window::try_new(1_000, 10).expect("window");
        let config =
            LineConfig::try_new(capacity, Kind::Windowed(w), max_credit, 3, 500).expect("config");
        let mut line = Line::new(config);
        line.set_terms(Terms {
            borrow: capacity,
            ..Terms::default()
        });
        line
    }

    fn statement(seq: u64, usage: &[(u64, u64)], remaining: u64, want: u64) -> SyncRequest {
        SyncRequest {
            seq,
            usage: usage.to_vec(),
            remaining,
            want,
            adopted: 0,
            held: 0,
        }
    }

    use crate::lease::budget::Budget;

    /// A holder's statement and the owner's reply, adopted at once.
    fn state(l: &mut Line<&'static str>, h: &'static str, b: &mut Budget, want: u64, now: u64) {
        let snap = b.snapshot(want, now);
        let reply = l.sync(&h, &snap.request, now).expect("accepted");
        b.apply(&snap, &reply, now);
    }

    /// A refund settled just before its bucket leaves the window does not go
    /// back into the holder's credit: until the next statement the owner counts
    /// the cost in that bucket (then nowhere) and the credit as it was, so the
    /// refund spent again would admit 130 of L = 100.
    #[test]
    fn refund_at_a_buckets_edge_is_not_spent_beyond_l() {
        use crate::lease::budget::CutOffPolicy;
        let mut l = line(100, 40);
        let w = Window::try_new(1_000, 10).expect("window");
        let budget = || Budget::new(Kind::Windowed(w), CutOffPolicy::Share);
        let (a, b, c) = (&mut budget(), &mut budget(), &mut budget());
        state(&mut l, "a", a, 40, 0);
        // 30 reserved in bucket 0, which counts until 1,100.
        let spent = a.try_spend(30, 50).expect("fits");
        state(&mut l, "a", a, 30, 700); // credit until 1,200
        state(&mut l, "b", b, 40, 700);
        // The request used nothing: settled at 1,050, 50 ms before its bucket leaves.
        a.settle(spent, 30, 0, 1_050);
        // At 1,150 the owner no longer counts bucket 0: c is granted what is left.
        state(&mut l, "c", c, 40, 1_150);
        let admitted = a.credit(1_150) + b.credit(1_150) + c.credit(1_150);
        assert!(admitted <= 100, "{admitted} spendable in one window");
        // The refund is not lost: the next statement frees it at the owner.
        state(&mut l, "a", a, 40, 1_160);
        assert_eq!(l.charge_of(&"a", 1_160), a.credit(1_160));
    }

    #[test]
    fn an_expired_credit_counts_as_spent_until_its_bucket_leaves_the_window() {
        let mut l = line(100, 40);
        let r = l.sync(&"a", &statement(1, &[], 0, 40), 0).expect("granted");
        assert_eq!(r.credit, 40);
        // a goes silent; its credit ends at 500 (owner clock), bucket 5.
        assert_eq!(l.settle(800), 1);
        assert_eq!(l.available(800), 60, "taken as spent at expiry");
        assert_eq!(l.available(1_599), 60);
        assert_eq!(l.available(1_600), 100, "bucket 5 left the window");
        // A statement taken while the credit was still live for the holder (its
        // clock: before 1 + 500) does not drop it: it may have spent more after.
        let r = l
            .sync(&"a", &statement(2, &[(1, 10)], 0, 0), 900)
            .expect("ok");
        assert_eq!(r.credit, 0);
        assert_eq!(l.available(900), 100 - 10 - 40);
    }

    #[test]
    fn a_statement_taken_after_a_lapsed_credit_ended_replaces_the_guess() {
        let mut l = line(100, 40);
        l.sync(&"a", &statement(1, &[], 0, 40), 0).expect("granted");
        assert_eq!(l.settle(800), 1);
        assert_eq!(l.charge_of(&"a", 800), 40, "lapsed: taken as spent");
        // Stamped at 501, the credit (ended at 1 + 500 for a) is over: the 25 it
        // states spent are all it spent from it, and they are charged once.
        let r = l
            .sync(&"a", &statement(501, &[(0, 25)], 0, 0), 900)
            .expect("ok");
        assert_eq!(r.credit, 0);
        assert_eq!(l.charge_of(&"a", 900), 25, "not 25 + 40");
        assert_eq!(l.available(900), 75);
        // One stamped a ms earlier keeps the guess (a fresh line: same history).
        let mut l = line(100, 40);
        l.sync(&"a", &statement(1, &[], 0, 40), 0).expect("granted");
        l.sync(&"a", &statement(500, &[(0, 25)], 0, 0), 900)
            .expect("ok");
        assert_eq!(l.charge_of(&"a", 900), 65);
    }

    #[test]
    fn a_rebuilt_line_names_its_silent_holders_once_after_a_delay() {
        let config = LineConfig::try_new(100, Kind::Slots, 10, 3, 1_000).expect("config");
        let mut l = Line::rebuild(config, &[], &["a", "b", "c"], 5_000);
        l.sync(&"a", &statement(5_001, &[], 0, 0), 5_010)
            .expect("ok");
        assert!(
            l.to_nudge(5_100, 300).is_empty(),
            "too soon: they state at once"
        );
        assert_eq!(l.to_nudge(5_300, 300), vec!["b", "c"]);
        assert!(l.to_nudge(5_400, 300).is_empty(), "once per rebuild");
        assert!(Line::<&str>::new(config).to_nudge(9_000, 300).is_empty());
    }

    /// Holders refused for want of room are named once room for them comes
    /// back (a bucket leaving the window), not before; one whose share is full
    /// stays refused, and a holder granted since is no longer waiting. Each
    /// holder's own told figure is room for itself: here both holders were
    /// told their share, which keeps `available` at 0 throughout.
    #[test]
    fn holders_refused_for_want_of_room_are_named_once_it_comes_back() {
        use crate::lease::budget::CutOffPolicy;
        let w = Window::try_new(1_000, 10).expect("window");
        let config = LineConfig::try_new(10, Kind::Windowed(w), 10, 3, 500).expect("config");
        let mut l = Line::new(config);
        l.set_terms(Terms {
            shares: [("a", 5), ("b", 5)].into_iter().collect(),
            ..Terms::default()
        });
        let budget = || Budget::new(Kind::Windowed(w), CutOffPolicy::Share);
        let (a, b) = (&mut budget(), &mut budget());
        state(&mut l, "a", a, 5, 0);
        state(&mut l, "b", b, 5, 0);
        a.try_spend(5, 50).expect("fits"); // bucket 0: counts until 1,100
        b.try_spend(5, 250).expect("fits"); // bucket 2: until 1,300
        state(&mut l, "a", a, 5, 300);
        state(&mut l, "b", b, 5, 300);
        assert!(l.has_short(), "both refused");
        assert_eq!(l.available(300), 0);
        assert!(l.take_short_with_room(1_000).is_empty(), "nothing left yet");
        // a's bucket left: room for a, none for b (its share is still spent).
        assert_eq!(l.take_short_with_room(1_101), vec!["a"]);
        assert!(l.take_short_with_room(1_102).is_empty(), "named once");
        assert_eq!(l.available(1_102), 0, "its own figure still counts");
        state(&mut l, "a", a, 5, 1_102);
        assert_eq!(a.credit(1_102), 5, "granted as named");
        assert_eq!(l.take_short_with_room(1_301), vec!["b"]);
        // Granted since: not waiting any more.
        state(&mut l, "b", b, 5, 1_302);
        assert!(!l.has_short());
    }

    #[test]
    fn a_rebuilt_line_names_the_holders_it_refused_once_its_gate_opens() {
        let w = Window::try_new(1_000, 10).expect("window");
        let config = LineConfig::try_new(100, Kind::Windowed(w), 40, 3, 1_000).expect("config");
        let mut l = Line::rebuild(config, &[], &["a", "b", "c"], 5_000);
        l.set_terms(Terms {
            borrow: 100,
            ..Terms::default()
        });
        // a asks while b and c have not stated: nothing, and it waits.
        let r = l.sync(&"a", &statement(5_001, &[], 0, 10), 5_001);
        assert_eq!(r.expect("ok").granted, 0);
        // b states nothing held and wants nothing: not waiting.
        l.sync(&"b", &statement(5_002, &[], 0, 0), 5_002)
            .expect("ok");
        assert!(
            l.take_reopened(5_002).is_empty(),
            "still shut: c is unknown"
        );
        // c's statement opens the gate; it is granted itself.
        let r = l.sync(&"c", &statement(5_003, &[], 0, 10), 5_003);
        assert_eq!(r.expect("ok").granted, 10);
        assert_eq!(l.take_reopened(5_003), vec!["a"]);
        assert!(l.take_reopened(5_004).is_empty(), "each once");
        // Opened by its ttl instead (c never states): named then.
        let mut l = Line::rebuild(config, &[], &["a", "c"], 5_000);
        l.sync(&"a", &statement(5_001, &[], 0, 10), 5_001)
            .expect("ok");
        assert!(l.take_reopened(5_999).is_empty());
        assert_eq!(l.take_reopened(6_000), vec!["a"]);
        // Opened by the terms (c became unreachable: its floor charges it, it
        // is no longer waited for): named then.
        let mut l = Line::rebuild(config, &[], &["a", "c"], 5_000);
        l.sync(&"a", &statement(5_001, &[], 0, 10), 5_001)
            .expect("ok");
        assert!(l.take_reopened(5_002).is_empty());
        l.set_terms(Terms {
            borrow: 100,
            floors: BTreeMap::from([("c", 30)]),
            ..Terms::default()
        });
        assert_eq!(l.take_reopened(5_003), vec!["a"]);
        // A fresh line has no gate and names nobody.
        let mut l = Line::new(config);
        l.sync(&"a", &statement(1, &[], 0, 10), 1).expect("ok");
        assert!(l.take_reopened(2).is_empty());
    }

    #[test]
    fn a_holder_clock_running_behind_does_not_age_its_usage_out_early() {
        let mut l = line(100, 100);
        // The owner is at 5000 ms; the holder's clock says 3000 (2 s behind) and
        // it spent 60 in its current bucket, 30: unshifted, bucket 30 left the
        // owner's 1 s window at 4100 and the 60 would be free to grant again.
        let r = l
            .sync(&"a", &statement(3_000, &[(30, 60)], 0, 100), 5_000)
            .expect("ok");
        assert_eq!(r.credit, 40, "its 60 still count");
        assert_eq!(l.charge_of(&"a", 5_000), 100);
        // Within the tolerance nothing shifts (transit, NTP-level skew).
        assert_eq!(skew_shift(4_950, 5_000, 100), 0);
        assert_eq!(skew_shift(4_899, 5_000, 100), 1);
        assert_eq!(skew_shift(3_000, 5_000, 100), 19);
        // A clock running ahead shifts nothing (clamped to the owner's bucket).
        assert_eq!(skew_shift(7_000, 5_000, 100), 0);
    }

    #[test]
    fn a_statement_cannot_raise_a_known_holders_commitment() {
        let mut l = line(100, 40);
        l.sync(&"a", &statement(1, &[], 0, 40), 0).expect("granted");
        // It spent 30 (usage) and claims 35 left: only 10 are accepted.
        let r = l
            .sync(&"a", &statement(2, &[(1, 30)], 35, 0), 100)
            .expect("ok");
        assert_eq!(r.credit, 10);
        // A refund moves cost from usage back to credit one for one.
        let r = l
            .sync(&"a", &statement(3, &[(1, 20)], 20, 0), 200)
            .expect("ok");
        assert_eq!(r.credit, 20);
        assert_eq!(l.charge_of(&"a", 200), 40);
    }

    #[test]
    fn shares_cap_holders_and_floors_charge_the_unreachable() {
        let mut l = line(100, 100);
        l.set_terms(Terms {
            shares: BTreeMap::from([("a", 60), ("b", 40)]),
            borrow: 0,
            floors: BTreeMap::from([("c", 30)]),
            ..Terms::default()
        });
        let r = l
            .sync(&"a", &statement(1, &[(0, 50)], 0, 100), 0)
            .expect("ok");
        assert_eq!(r.credit, 10, "a's share is 60, it used 50");
        let r = l.sync(&"b", &statement(1, &[], 0, 100), 0).expect("ok");
        assert_eq!(r.credit, 10, "100 - 60 (a) - 30 (c's floor)");
        assert_eq!(l.available(0), 0);
    }

    #[test]
    fn borrowing_goes_beyond_the_share_by_at_most_borrow() {
        let mut l = line(100, 100);
        l.set_terms(Terms {
            shares: BTreeMap::from([("a", 50), ("b", 50)]),
            borrow: 20,
            floors: BTreeMap::new(),
            ..Terms::default()
        });
        let r = l.sync(&"a", &statement(1, &[], 0, 100), 0).expect("ok");
        assert_eq!(r.credit, 70, "share 50 + borrow 20");
        let r = l.sync(&"b", &statement(1, &[], 0, 100), 0).expect("ok");
        assert_eq!(r.credit, 30, "what is left of L");
    }

    #[test]
    fn a_figure_the_holder_holds_binds_a_line_that_never_told_it() {
        // A line rebuilt while the holder saw no move: the holder's statement says
        // it adopted the reply to 7 and holds 30, which this line never told.
        let mut l = line(100, 100);
        l.set_terms(Terms {
            shares: BTreeMap::from([("a", 20), ("b", 80)]),
            borrow: 0,
            floors: BTreeMap::new(),
            ..Terms::default()
        });
        let mut first = statement(1_000, &[(9, 5)], 0, 1);
        (first.adopted, first.held) = (7, 30);
        let r = l.sync(&"a", &first, 1_000).expect("ok");
        assert_eq!(r.cut_off_share, 6, "usage 5 and the unit granted");
        assert_eq!(l.charge_of(&"a", 1_000), 30, "what it still holds binds");
        let r = l
            .sync(&"b", &statement(1_000, &[], 0, 100), 1_000)
            .expect("ok");
        assert_eq!(r.credit, 70, "L beside a's 30, not its share of 80");
        // a says it adopted the reply to 1,000: the old figure is replaced.
        let mut next = statement(1_100, &[(9, 5)], 1, 0);
        (next.adopted, next.held) = (1_000, 6);
        l.sync(&"a", &next, 1_100).expect("ok");
        assert_eq!(l.charge_of(&"a", 1_100), 6);
    }

    #[test]
    fn a_holders_own_published_figure_does_not_shrink_its_grant() {
        // Every busy holder publishes the figure it holds; the line charges it to
        // members with no account, never to the holder it is granting to.
        let mut l = line(100, 100);
        l.set_terms(Terms {
            shares: BTreeMap::from([("a", 50), ("b", 50)]),
            borrow: 0,
            floors: BTreeMap::new(),
            held: BTreeMap::from([("a", 50), ("b", 30)]),
        });
        assert_eq!(l.available(0), 20, "both charged while neither has stated");
        let r = l.sync(&"a", &statement(1, &[], 0, 50), 0).expect("ok");
        assert_eq!(r.credit, 50, "its share, beside b's 30");
        let r = l.sync(&"b", &statement(1, &[], 0, 50), 0).expect("ok");
        assert_eq!(r.credit, 50, "its share: a's account replaces a's figure");
    }

    #[test]
    fn a_told_cut_off_share_binds_until_a_later_reply_is_adopted() {
        let mut l = line(100, 100);
        l.set_terms(Terms {
            shares: BTreeMap::from([("a", 60), ("b", 40)]),
            borrow: 0,
            floors: BTreeMap::new(),
            ..Terms::default()
        });
        let r = l
            .sync(&"a", &statement(1, &[(0, 10)], 0, 40), 0)
            .expect("ok");
        assert_eq!((r.credit, r.cut_off_share), (40, 50), "what it holds");
        // a goes silent (its statements stop arriving; gossip still lists it): long
        // after its usage and credit left the window it may still be spending 50
        // per window, cut off.
        assert_eq!(l.settle(2_000), 1);
        assert_eq!(l.charge_of(&"a", 2_000), 50);
        let r = l
            .sync(&"b", &statement(2_000, &[], 0, 100), 2_000)
            .expect("ok");
        assert_eq!((r.credit, r.cut_off_share), (40, 40), "its share");
        // a states again holding 10 and asking 1: told 11, but that reply is
        // lost, so a still holds 50; its next statement says so (it adopted
        // statement 1's reply).
        // (No `held`, as an older holder sends: the line's own memory binds.)
        let mut again = statement(2_100, &[(20, 10)], 0, 1);
        again.adopted = 1;
        let r = l.sync(&"a", &again, 2_100).expect("ok");
        assert_eq!(r.cut_off_share, 11);
        assert_eq!(l.charge_of(&"a", 2_100), 50, "the figure it may still hold");
        let mut third = statement(2_200, &[(20, 10)], 0, 1);
        third.adopted = 1;
        l.sync(&"a", &third, 2_200).expect("ok");
        assert_eq!(l.charge_of(&"a", 2_200), 50);
        // It adopted the reply to 2,200: the older figures are replaced.
        let mut fourth = statement(2_300, &[(20, 10)], 0, 1);
        fourth.adopted = 2_200;
        l.sync(&"a", &fourth, 2_300).expect("ok");
        assert_eq!(l.charge_of(&"a", 2_300), 11);
        // It gives everything back (dropping its figure as it sends): none binds
        // (its last credit, ended at 2,800, left the window at 3,900).
        let r = l
            .sync(&"a", &statement(4_000, &[], 0, 0), 4_000)
            .expect("ok");
        assert_eq!(
            r.cut_off_share, 0,
            "nothing kept for a holder that gave back"
        );
        assert_eq!(l.charge_of(&"a", 4_000), 0);
    }

    /// A guard: slots started from the old
    /// credit between a holder's snapshot and the reply (which grants it nothing:
    /// its share moved) stay charged, because the figure told with the reply it
    /// still spends on is kept until it says it adopted a later one.
    #[test]
    fn slots_started_during_a_round_trip_stay_charged_until_the_next_statement() {
        use crate::lease::budget::{Budget, CutOffPolicy};
        let config = LineConfig::try_new(4, Kind::Slots, 4, 8, 1_000).expect("config");
        let mut l: Line<&str> = Line::new(config);
        let shares = |s: &[(&'static str, u64)]| Terms {
            shares: s.iter().copied().collect(),
            ..Terms::default()
        };
        l.set_terms(shares(&[("a", 2), ("b", 2)]));
        let budget = || Budget::new(Kind::Slots, CutOffPolicy::Share);
        let (a, b) = (&mut budget(), &mut budget());
        state(&mut l, "a", a, 2, 0);
        assert_eq!(a.credit(0), 2);
        l.set_terms(shares(&[("a", 0), ("b", 4)]));
        // a states (nothing in use), then starts two slots before the reply.
        let snap = a.snapshot(2, 10);
        let started = [a.try_spend(1, 11), a.try_spend(1, 11)];
        assert!(started.iter().all(Option::is_some));
        let reply = l.sync(&"a", &snap.request, 12).expect("ok");
        a.apply(&snap, &reply, 12);
        state(&mut l, "b", b, 4, 13);
        assert!(
            2 + b.credit(13) <= 4,
            "b may start {} beside a's 2",
            b.credit(13)
        );
        // a's next statement (its two slots, the reply adopted) frees nothing more.
        state(&mut l, "a", a, 0, 20);
        assert_eq!(l.charge_of(&"a", 20), 2);
        // With borrowing on, the credit is above the told share: it is the
        // credit that stays charged.
        let mut l: Line<&str> = Line::new(config);
        l.set_terms(Terms {
            borrow: 2,
            ..shares(&[("a", 2), ("b", 2)])
        });
        let (a, b) = (&mut budget(), &mut budget());
        state(&mut l, "a", a, 4, 0);
        assert_eq!(a.credit(0), 4, "its share and 2 borrowed");
        l.set_terms(shares(&[("a", 0), ("b", 4)]));
        let snap = a.snapshot(0, 10);
        assert!((0..4).all(|_| a.try_spend(1, 11).is_some()));
        let reply = l.sync(&"a", &snap.request, 12).expect("ok");
        a.apply(&snap, &reply, 12);
        state(&mut l, "b", b, 4, 13);
        assert!(
            4 + b.credit(13) <= 4,
            "b may start {} beside a's 4",
            b.credit(13)
        );
    }

    #[test]
    fn a_dead_holders_told_slots_come_back_when_it_leaves_the_terms() {
        let config = LineConfig::try_new(2, Kind::Slots, 2, 8, 1_000).expect("config");
        let mut l: Line<&str> = Line::new(config);
        let shares = |s: &[(&'static str, u64)]| Terms {
            shares: s.iter().copied().collect(),
            ..Terms::default()
        };
        l.set_terms(shares(&[("a", 1), ("b", 1)]));
        let r = l.sync(&"a", &statement(1, &[], 1, 1), 0).expect("ok");
        assert_eq!((r.credit, r.cut_off_share), (1, 1));
        // Silent past its ttl while still live: it may hold its slot, cut off.
        l.settle(1_500);
        assert_eq!(l.charge_of(&"a", 1_500), 1);
        // Declared dead (slots have no floors): its streams died with it.
        l.set_terms(shares(&[("b", 2)]));
        assert_eq!(l.charge_of(&"a", 1_500), 0);
        let r = l
            .sync(&"b", &statement(1_500, &[], 0, 2), 1_500)
            .expect("ok");
        assert_eq!(r.credit, 2);
    }

    #[test]
    fn a_rebuilt_owner_grants_nothing_until_every_holder_stated() {
        let w = Window::try_new(1_000, 10).expect("window");
        let config = LineConfig::try_new(100, Kind::Windowed(w), 40, 3, 500).expect("config");
        let counters = [("a", vec![(0, 10)]), ("b", vec![(0, 20)])];
        let mut l = Line::rebuild(config, &counters, &["a", "b"], 50);
        l.set_terms(Terms {
            borrow: 100,
            ..Terms::default()
        });
        assert!(l.recovering(50));
        let r = l
            .sync(&"a", &statement(1, &[(0, 10)], 15, 40), 60)
            .expect("ok");
        assert_eq!(
            (r.credit, r.granted),
            (15, 0),
            "its old credit, nothing new"
        );
        let r = l
            .sync(&"b", &statement(1, &[(0, 20)], 0, 40), 70)
            .expect("ok");
        assert!(!l.recovering(70));
        assert_eq!(r.granted, 40);
        assert_eq!(l.available(70), 100 - 10 - 15 - 20 - 40);
        // Silent holders: one ttl later, each is charged max_credit as spent.
        let mut l: Line<&str> = Line::rebuild(config, &[], &["a", "b"], 0);
        assert_eq!(l.available(499), 0);
        let _ = l.settle(500);
        assert_eq!(l.available(500), 100 - 2 * 40);
        assert_eq!(l.available(1_600), 100);
    }

    #[test]
    fn a_stretched_credit_stated_to_a_new_owner_counts_in_full() {
        // The old owner granted a 50 for one request costing 50 (max_credit 40:
        // the cap stretches to the ask), then died. a states its 50 to the
        // rebuilt line and spends them while the reply is on its way; b then
        // asks for all of L. Counted at max_credit, a's 50 left 60 for b: 110.
        let w = Window::try_new(1_000, 10).expect("window");
        let config = LineConfig::try_new(100, Kind::Windowed(w), 40, 3, 500).expect("config");
        let mut l = Line::rebuild(config, &[], &["a", "b"], 0);
        l.set_terms(Terms {
            borrow: 100,
            ..Terms::default()
        });
        let r = l.sync(&"a", &statement(1, &[], 50, 0), 10).expect("ok");
        assert_eq!(r.credit, 50, "its whole credit, renewed");
        let b = l.sync(&"b", &statement(2, &[], 0, 100), 20).expect("ok");
        assert!(
            50 + b.granted <= 100,
            "b granted {} beside a's 50",
            b.granted
        );
        assert_eq!(b.granted, 50);
        // A claim is believed up to L, no further.
        let mut l = Line::rebuild(config, &[], &["a"], 0);
        let r = l.sync(&"a", &statement(1, &[], 150, 0), 10).expect("ok");
        assert_eq!(r.credit, 100);
    }

    #[test]
    fn an_unreachable_member_is_charged_once_the_most_any_source_says() {
        // A new owner after a cut: b and c are unreachable, known from the counters
        // (42, 12) plus what they may have spent unreported (max_credit 40), and
        // have floors (30): each is charged the most of the two, not their sum,
        // and is not waited for.
        let w = Window::try_new(1_000, 10).expect("window");
        let config = LineConfig::try_new(100, Kind::Windowed(w), 40, 3, 500).expect("config");
        let counters = [("b", vec![(0, 42)]), ("c", vec![(0, 12)])];
        let mut l = Line::rebuild(config, &counters, &["a", "b", "c"], 0);
        l.set_terms(Terms {
            shares: BTreeMap::from([("a", 40)]),
            borrow: 0,
            floors: BTreeMap::from([("b", 30), ("c", 30)]),
            ..Terms::default()
        });
        let r = l.sync(&"a", &statement(1, &[], 0, 40), 10).expect("ok");
        assert!(!l.recovering(10), "unreachable members are not waited for");
        assert_eq!(
            l.charge_of(&"b", 10),
            42 + 40,
            "counters and what it may not have reported yet, above the floor"
        );
        assert_eq!(
            l.charge_of(&"c", 10),
            12 + 40,
            "the most of counters + credit and floor, not their sum"
        );
        assert_eq!(r.granted, 0, "82 + 52 already exceed L");
    }

    #[test]
    fn a_departed_incarnation_is_charged_its_counters_and_unreported_credit() {
        // A node restarted as `b2`; its previous incarnation `b1` spent 20 in this
        // window and may hold up to max_credit (40) the counters do not show. The
        // restart moved the key to a new owner: b1 is no live holder and has no
        // floor (not declared dead yet), yet it is charged until its usage leaves.
        let w = Window::try_new(1_000, 10).expect("window");
        let config = LineConfig::try_new(100, Kind::Windowed(w), 40, 3, 500).expect("config");
        let counters = [("b1", vec![(0, 20)])];
        let mut l = Line::rebuild(config, &counters, &["a", "b2"], 0);
        l.set_terms(Terms {
            shares: BTreeMap::from([("a", 100), ("b2", 100)]),
            borrow: 0,
            floors: BTreeMap::new(),
            ..Terms::default()
        });
        l.sync(&"a", &statement(1, &[], 0, 0), 10).expect("ok");
        let r = l.sync(&"b2", &statement(1, &[], 0, 100), 20).expect("ok");
        assert!(!l.recovering(20));
        assert_eq!(l.charge_of(&"b1", 20), 20 + 40);
        assert_eq!(
            r.granted,
            100 - 60,
            "what b1 may have spent is not granted again"
        );
        l.settle(1_200);
        assert_eq!(
            l.charge_of(&"b1", 1_200),
            0,
            "left the window with its usage"
        );
        assert_eq!(l.available(1_200), 100 - 40, "only b2's credit is left");
    }

    #[test]
    fn bad_statements_are_refused_and_change_nothing() {
        let mut l = line(100, 40);
        l.sync(&"a", &statement(5, &[(0, 5)], 0, 10), 0)
            .expect("ok");
        l.sync(&"b", &statement(1, &[], 0, 10), 0).expect("ok");
        l.sync(&"c", &statement(1, &[], 0, 10), 0).expect("ok");
        let before = l.clone();
        let refused = [
            (&"a", statement(5, &[], 0, 1), Refusal::Stale(5)),
            (
                &"d",
                statement(1, &[], 0, 1),
                Refusal::TooManyHolders { max: 3 },
            ),
            (
                &"a",
                statement(6, &[], 0, 101),
                Refusal::Absurd {
                    what: "want",
                    amount: 101,
                    max: 100,
                },
            ),
            (
                &"a",
                statement(6, &[(0, MAX_AMOUNT + 1)], 0, 1),
                Refusal::Absurd {
                    what: "cost",
                    amount: MAX_AMOUNT + 1,
                    max: MAX_AMOUNT,
                },
            ),
            (
                &"a",
                statement(6, &vec![(0, 1); MAX_USAGE_ENTRIES as usize + 1], 0, 1),
                Refusal::Absurd {
                    what: "usage entries",
                    amount: MAX_USAGE_ENTRIES + 1,
                    max: MAX_USAGE_ENTRIES,
                },
            ),
        ];
        for (holder, request, refusal) in refused {
            assert_eq!(l.sync(holder, &request, 10), Err(refusal));
            assert_eq!(l, before, "state unchanged");
        }
    }
}
