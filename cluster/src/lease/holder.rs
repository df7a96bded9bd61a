//! A node's side of one lease key: the leases it holds, local spending, when to
//! renew (so renewal stays off the request path), the per-bucket consumption it
//! reports, and what it may spend while its owner is unreachable.
//!
//! Renewal policy (docs/design/lease.md, "Utilisation"): the holder asks for a new
//! block of `block` while it still has `low_water` left or when its youngest lease
//! is older than ttl/2, and keeps spending the old lease meanwhile, so a request
//! never waits on the owner unless the owner grants too little. A lease that is
//! spent out (or past the holder's own expiry) is closed in the next message:
//! `Renew` (close and ask at once) or `Release`.
//!
//! Skew safety: a lease ends for the holder at its own monotonic **send** time of
//! the request + ttl, which is before the owner's receive time + ttl, so the holder
//! always stops spending a lease before the owner counts it as spent.

use std::collections::BTreeMap;

use crate::counter::Window;
use crate::lease::LeaseId;
use crate::lease::owner::Grant;

/// What a holder cut off from its owner may spend beyond its current leases
/// (design.md section 6, "Shares, borrowing and partitions").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutOffPolicy {
    /// Default: at most its own share `s_j` per window (the frozen share). With every
    /// side charging unreachable members their share, the cluster stays <= L.
    Share(u64),
    /// Nothing beyond the leases it holds: safe, unavailable under a cut.
    FailClosed,
    /// Unlimited: **unsafe**, the cluster total is unbounded during a cut.
    FailOpen,
}

/// A message for the owner (the RPC is the integrator's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Ask for a new block, keeping the current leases.
    Grant {
        /// The block size asked (the holder's demand).
        requested: u64,
    },
    /// Close `lease_id` with its exact consumption and ask for a new block.
    Renew {
        /// The lease being closed.
        lease_id: LeaseId,
        /// Its exact consumption, `(bucket, cost)`.
        report: Vec<(u64, u64)>,
        /// The block size asked.
        requested: u64,
    },
    /// Close `lease_id`, returning what it did not spend.
    Release {
        /// The lease being closed.
        lease_id: LeaseId,
        /// Its exact consumption, `(bucket, cost)`.
        report: Vec<(u64, u64)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    id: LeaseId,
    amount: u64,
    spent_by_bucket: BTreeMap<u64, u64>,
    sent_at_ms: u64,
}

impl Held {
    fn spent(&self) -> u64 {
        self.spent_by_bucket.values().sum()
    }
}

/// One node's leases for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    window: Window,
    ttl_ms: u64,
    block: u64,
    low_water: u64,
    leases: Vec<Held>,
    in_flight_since_ms: Option<u64>,
    policy: CutOffPolicy,
    reachable: bool,
    beyond_lease: BTreeMap<u64, u64>,
}

impl Holder {
    /// A holder asking for blocks of `block`, renewing below `low_water` or at
    /// ttl/2, with `policy` for when the owner is unreachable.
    pub fn new(
        window: Window,
        ttl_ms: u64,
        block: u64,
        low_water: u64,
        policy: CutOffPolicy,
    ) -> Self {
        Self {
            window,
            ttl_ms,
            block,
            low_water,
            leases: Vec::new(),
            in_flight_since_ms: None,
            policy,
            reachable: true,
            beyond_lease: BTreeMap::new(),
        }
    }

    /// What the holder may still spend from leases that have not ended for it.
    pub fn balance(&self, now_ms: u64) -> u64 {
        (self.live(now_ms)).map(|l| l.amount - l.spent()).sum()
    }

    fn live(&self, now_ms: u64) -> impl Iterator<Item = &Held> {
        let ttl = self.ttl_ms;
        (self.leases.iter()).filter(move |l| l.sent_at_ms.saturating_add(ttl) > now_ms)
    }

    /// Spends `cost` locally (oldest lease first, all of it from one lease; else,
    /// when cut off, as the policy allows). `false`: refuse the request (429).
    pub fn spend(&mut self, cost: u64, now_ms: u64) -> bool {
        let bucket = self.window.bucket_index(now_ms);
        let ttl = self.ttl_ms;
        let lease = (self.leases.iter_mut())
            .filter(|l| l.sent_at_ms.saturating_add(ttl) > now_ms)
            .find(|l| l.amount - l.spent() >= cost);
        if let Some(l) = lease {
            *l.spent_by_bucket.entry(bucket).or_insert(0) += cost;
            return true;
        }
        if self.reachable {
            return false;
        }
        self.spend_cut_off(cost, bucket, now_ms)
    }

    fn spend_cut_off(&mut self, cost: u64, bucket: u64, now_ms: u64) -> bool {
        let w = self.window;
        self.beyond_lease.retain(|b, _| w.counts(*b, now_ms));
        let used: u64 = self.beyond_lease.values().sum();
        let ok = match self.policy {
            CutOffPolicy::FailClosed => false,
            CutOffPolicy::FailOpen => true,
            CutOffPolicy::Share(share) => used.saturating_add(cost) <= share,
        };
        if ok {
            *self.beyond_lease.entry(bucket).or_insert(0) += cost;
        }
        ok
    }

    /// Whether a new block should be asked now: below the low-water mark, or the
    /// youngest lease is past half its ttl, and no request is in flight.
    pub fn needs_renewal(&self, now_ms: u64) -> bool {
        if self.in_flight_since_ms.is_some() {
            return false;
        }
        let youngest = self.live(now_ms).map(|l| l.sent_at_ms).max();
        let old = youngest.is_none_or(|t| now_ms.saturating_sub(t) >= self.ttl_ms / 2);
        old || self.balance(now_ms) < self.low_water
    }

    /// The next message for the owner, if any: closes a spent-out or ended lease
    /// (`Renew` when a block is also due, else `Release`), or asks for a block. The
    /// closed lease is forgotten here; a request is in flight until
    /// [`Self::on_reply`] (send it at `now_ms`: that is the new lease's start).
    pub fn poll(&mut self, now_ms: u64) -> Option<Request> {
        let due = self.needs_renewal(now_ms);
        let ttl = self.ttl_ms;
        let done = (self.leases.iter())
            .position(|l| l.spent() == l.amount || l.sent_at_ms.saturating_add(ttl) <= now_ms);
        let request = match (done, due) {
            (Some(i), true) => {
                let l = self.leases.remove(i);
                Request::Renew {
                    lease_id: l.id,
                    report: report(&l),
                    requested: self.block,
                }
            }
            (Some(i), false) => {
                let l = self.leases.remove(i);
                return Some(Request::Release {
                    lease_id: l.id,
                    report: report(&l),
                });
            }
            (None, true) => Request::Grant {
                requested: self.block,
            },
            (None, false) => return None,
        };
        self.in_flight_since_ms = Some(now_ms);
        Some(request)
    }

    /// The owner's answer to the request sent at `sent_at_ms`: a grant becomes a lease
    /// ending for the holder at `sent_at_ms + ttl`. `None`: refused or lost.
    pub fn on_reply(&mut self, grant: Option<Grant>) {
        let sent_at_ms = self.in_flight_since_ms.take();
        if let (Some(g), Some(sent_at_ms)) = (grant, sent_at_ms) {
            let spent_by_bucket = BTreeMap::new();
            self.leases.push(Held {
                id: g.lease_id,
                amount: g.amount,
                spent_by_bucket,
                sent_at_ms,
            });
        }
    }

    /// The owner became unreachable (`false`) or reachable again (`true`). What was
    /// spent beyond the leases reaches the cluster through the gossiped counters.
    pub fn set_reachable(&mut self, reachable: bool) {
        // What was spent beyond the leases keeps counting for its window, so going
        // reachable and cut off again within a window never resets the share.
        self.reachable = reachable;
    }
}

/// A lease's consumption as `(bucket, cost)`, ascending by bucket.
fn report(l: &Held) -> Vec<(u64, u64)> {
    l.spent_by_bucket.iter().map(|(b, c)| (*b, *c)).collect()
}
