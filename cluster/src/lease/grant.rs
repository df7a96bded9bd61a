//! The owner ledger's transitions: grant, renew, release, announce and settle
//! (expiry). Each one settles first, then validates its input (a refusal other than
//! `Exhausted` leaves the ledger as settling left it), then acts.

use crate::lease::owner::{Demand, Grant, Lease, Ledger};
use crate::lease::{LeaseId, MAX_AMOUNT, MAX_TTL_MS, Refusal, bounded};
use crate::share::shares;

/// Most `(bucket, cost)` entries in one report: a window has at most 2 x 4096 + 1
/// buckets that count (the counters' `MAX_BUCKETS`).
const MAX_REPORT_ENTRIES: usize = 8193;

impl<H: Ord + Clone> Ledger<H> {
    /// Moves what expired by `now_ms` into consumption: expired leases in full, in
    /// the bucket of their expiry, and a finished failover reservation; forgets
    /// buckets out of the window and idle holders. Observationally neutral (every
    /// read already counts expired amounts as consumed); returns the effective now
    /// (time never goes back: an earlier `now_ms` is taken as the latest seen).
    pub fn settle(&mut self, now_ms: u64) -> u64 {
        let now = now_ms.max(self.last_now_ms);
        self.last_now_ms = now;
        let w = self.config.window;
        let expired: Vec<LeaseId> = (self.leases.iter())
            .filter(|(_, l)| l.expires_at_ms <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(l) = self.leases.remove(&id) {
                self.add_consumed(w.bucket_index(l.expires_at_ms), l.amount);
            }
        }
        if let Some(r) = self.recovery.take() {
            if r.until_ms <= now {
                let charge = self.reservation(&r);
                self.add_consumed(w.bucket_index(r.until_ms), charge);
            } else {
                self.recovery = Some(r);
            }
        }
        let now_bucket = w.bucket_index(now);
        self.consumed
            .retain(|b, _| *b > now_bucket || w.counts(*b, now));
        let holders: Vec<H> = self.leases.values().map(|l| l.holder.clone()).collect();
        self.demand
            .retain(|h, d| d.active_until_ms > now || holders.contains(h));
        now
    }

    /// A new lease for `holder`, who asks for `requested` (its demand) to last
    /// `ttl_ms` on the owner's clock. Sized by the module's rule; `Exhausted` when
    /// that is 0 (the holder is then recorded as waiting, which weighs later grants).
    pub fn grant(
        &mut self,
        holder: &H,
        requested: u64,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Grant, Refusal> {
        let now = self.settle(now_ms);
        bounded("requested", requested, self.config.capacity())?;
        bounded("ttl_ms", ttl_ms, MAX_TTL_MS)?;
        self.admit(holder)?;
        self.grant_checked(holder, requested, now, ttl_ms)
    }

    /// Closes `lease_id` with the holder's exact per-bucket consumption (`(bucket,
    /// cost)`, moved from outstanding to consumed; the rest returns) and grants a new
    /// block as [`Self::grant`] does. `Exhausted` means closed but nothing new.
    pub fn renew(
        &mut self,
        holder: &H,
        lease_id: LeaseId,
        consumed_by_bucket: &[(u64, u64)],
        requested: u64,
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Grant, Refusal> {
        let now = self.settle(now_ms);
        bounded("requested", requested, self.config.capacity())?;
        bounded("ttl_ms", ttl_ms, MAX_TTL_MS)?;
        self.check_report(holder, lease_id, consumed_by_bucket)?;
        self.close(lease_id, consumed_by_bucket, now);
        self.grant_checked(holder, requested, now, ttl_ms)
    }

    /// Closes `lease_id` with the holder's exact per-bucket consumption; the unused
    /// rest returns to the pool at once. The holder stops weighing shares.
    pub fn release(
        &mut self,
        holder: &H,
        lease_id: LeaseId,
        consumed_by_bucket: &[(u64, u64)],
        now_ms: u64,
    ) -> Result<(), Refusal> {
        let now = self.settle(now_ms);
        self.check_report(holder, lease_id, consumed_by_bucket)?;
        self.close(lease_id, consumed_by_bucket, now);
        if let Some(d) = self.demand.get_mut(holder) {
            d.active_until_ms = now;
        }
        Ok(())
    }

    /// A holder's re-announce to a rebuilt owner: the unspent balance it still holds
    /// from the old owner, and what it spent under those leases without reporting it
    /// yet, per bucket (together at most `max_lease`). The owner charges the
    /// unreported spending as consumption, adopts the balance as a lease expiring at
    /// its own `now + ttl` (later than the old lease's end, so conservative) and
    /// returns its new id; the holder is no longer unknown. `None` when it holds
    /// nothing.
    pub fn announce(
        &mut self,
        holder: &H,
        outstanding: u64,
        unreported_by_bucket: &[(u64, u64)],
        now_ms: u64,
        ttl_ms: u64,
    ) -> Result<Option<Grant>, Refusal> {
        let now = self.settle(now_ms);
        bounded("ttl_ms", ttl_ms, MAX_TTL_MS)?;
        let unreported = unreported_by_bucket
            .iter()
            .fold(0u64, |sum, (_, cost)| sum.saturating_add(*cost));
        let claimed = outstanding.saturating_add(unreported);
        if claimed > self.config.max_lease() {
            let max = self.config.max_lease();
            return Err(Refusal::Absurd {
                what: "outstanding",
                amount: claimed,
                max,
            });
        }
        self.admit(holder)?;
        if let Some(r) = self.recovery.as_mut() {
            r.unknown.remove(holder);
            if r.unknown.is_empty() {
                self.recovery = None;
            }
        }
        // What the holder spent under leases from the previous owner and never
        // reported is consumption this owner's counter snapshot may not include.
        // The lease lived at most one ttl, so a bucket older than that is clamped
        // forward (the holder's clock cannot make it leave the window early).
        let w = self.config.window;
        let (first, last) = (
            w.bucket_index(now.saturating_sub(ttl_ms)),
            w.bucket_index(now),
        );
        for &(bucket, cost) in unreported_by_bucket {
            self.add_consumed(bucket.clamp(first, last), cost);
        }
        if outstanding == 0 {
            return Ok(None);
        }
        Ok(Some(self.insert_lease(holder, outstanding, now, ttl_ms)))
    }

    /// Refuses a new holder beyond `max_holders`.
    fn admit(&self, holder: &H) -> Result<(), Refusal> {
        let known =
            self.demand.contains_key(holder) || self.leases.values().any(|l| &l.holder == holder);
        if !known && self.demand.len() >= self.config.max_holders {
            return Err(Refusal::TooManyHolders {
                max: self.config.max_holders,
            });
        }
        Ok(())
    }

    fn grant_checked(
        &mut self,
        holder: &H,
        requested: u64,
        now: u64,
        ttl_ms: u64,
    ) -> Result<Grant, Refusal> {
        let active_until_ms = now.saturating_add(ttl_ms);
        let demand = Demand {
            requested,
            active_until_ms,
        };
        self.demand.insert(holder.clone(), demand);
        let held = self.held_by(holder, now);
        let size = requested
            .min(self.available(now))
            .min(self.config.max_lease().saturating_sub(held))
            .min(self.fair_share(holder, now).saturating_sub(held));
        if size == 0 {
            let retry_in_ms = self.config.window().bucket_ms();
            return Err(Refusal::Exhausted { retry_in_ms });
        }
        let grant = self.insert_lease(holder, size, now, ttl_ms);
        debug_assert!(self.available(now) + size <= self.config.capacity());
        Ok(grant)
    }

    fn insert_lease(&mut self, holder: &H, amount: u64, now: u64, ttl_ms: u64) -> Grant {
        let lease_id = self.next_id;
        self.next_id += 1;
        let expires_at_ms = now.saturating_add(ttl_ms);
        let lease = Lease {
            holder: holder.clone(),
            amount,
            granted_at_ms: now,
            expires_at_ms,
        };
        self.leases.insert(lease_id, lease);
        Grant {
            lease_id,
            amount,
            expires_at_ms,
        }
    }

    /// The holder's demand-weighted share of what is not consumed, among holders
    /// holding a lease or asking within their ttl.
    fn fair_share(&self, holder: &H, now: u64) -> u64 {
        let pool = (self.config.capacity())
            .saturating_sub(self.consumed_in_window(now) + self.hidden(now));
        let demands: Vec<(H, u64)> = (self.demand.iter())
            .filter(|(h, d)| d.active_until_ms > now || self.held_by(h, now) > 0 || *h == holder)
            .map(|(h, d)| (h.clone(), d.requested))
            .collect();
        (shares(pool, &demands).into_iter())
            .find(|(h, _)| h == holder)
            .map_or(0, |(_, s)| s)
    }

    /// Validates a lease id and a consumption report against it (no change).
    fn check_report(&self, holder: &H, id: LeaseId, report: &[(u64, u64)]) -> Result<(), Refusal> {
        let lease = match self.leases.get(&id) {
            None if id >= 1 && id < self.next_id => return Err(Refusal::Stale(id)),
            None => return Err(Refusal::UnknownLease(id)),
            Some(l) if &l.holder != holder => return Err(Refusal::NotYourLease(id)),
            Some(l) => l,
        };
        if report.len() > MAX_REPORT_ENTRIES {
            let (what, amount) = ("report entries", report.len() as u64);
            return Err(Refusal::Absurd {
                what,
                amount,
                max: MAX_REPORT_ENTRIES as u64,
            });
        }
        let mut reported = 0u64;
        for &(_, cost) in report {
            if cost > MAX_AMOUNT {
                return Err(Refusal::Absurd {
                    what: "cost",
                    amount: cost,
                    max: MAX_AMOUNT,
                });
            }
            reported += cost; // <= 2^13 entries * 2^50: no overflow
        }
        if reported > lease.amount {
            return Err(Refusal::Overreported {
                reported,
                amount: lease.amount,
            });
        }
        Ok(())
    }

    /// Closes a validated lease: each reported cost goes to its bucket, clamped to
    /// the lease's life on the owner's clock (the holder's wall clock is not trusted
    /// to age a cost out early: real spending happened between grant and now).
    fn close(&mut self, id: LeaseId, report: &[(u64, u64)], now: u64) {
        let w = self.config.window;
        if let Some(lease) = self.leases.remove(&id) {
            let first = w.bucket_index(lease.granted_at_ms);
            let last = w.bucket_index(now);
            for &(bucket, cost) in report {
                self.add_consumed(bucket.clamp(first, last), cost);
            }
        }
    }
}
