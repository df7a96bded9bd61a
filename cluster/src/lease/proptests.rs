//! Property tests of the lease core against a ground truth kept by the test: every
//! holder's real spending per bucket and the balances it can still spend. A failing
//! case prints its inputs (proptest shrinks it) and its seed (`PROPTEST_RNG_SEED`
//! / the persisted failure file reproduce it).

use proptest::prelude::*;

use crate::counter::Window;
use crate::lease::Refusal;
use crate::lease::holder::{CutOffPolicy, Holder, Request};
use crate::lease::owner::{Grant, Ledger, LedgerConfig};

const W_MS: u64 = 1_000;

/// A lease as its holder knows it (start on the holder's clock).
#[derive(Debug, Clone)]
struct TLease {
    id: u64,
    amount: u64,
    start: u64,
    spent: u64,
    by_bucket: Vec<(u64, u64)>,
}

impl TLease {
    fn new(id: u64, amount: u64, start: u64) -> Self {
        Self {
            id,
            amount,
            start,
            spent: 0,
            by_bucket: Vec::new(),
        }
    }
}

/// One holder's truth: its leases and its real spending per bucket.
#[derive(Debug, Clone, Default)]
struct Truth {
    leases: Vec<TLease>,
    spent_by_bucket: Vec<(u64, u64)>,
}

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Grant(usize, u64),
    Spend(usize, usize, u64),
    Renew(usize, usize, u64),
    Release(usize, usize),
    Announce(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1u64..400).prop_map(Op::Advance),
        (0usize..5, 1u64..400).prop_map(|(h, r)| Op::Grant(h, r)),
        (0usize..5, any::<usize>(), 1u64..200).prop_map(|(h, l, c)| Op::Spend(h, l, c)),
        (0usize..5, any::<usize>(), 1u64..400).prop_map(|(h, l, r)| Op::Renew(h, l, r)),
        (0usize..5, any::<usize>()).prop_map(|(h, l)| Op::Release(h, l)),
        (0usize..5).prop_map(Op::Announce),
    ]
}

struct World {
    window: Window,
    ttl_ms: u64,
    now: u64,
    ledger: Ledger<usize>,
    truth: Vec<Truth>,
}

impl World {
    /// Real spending in buckets that count now + what holders can still spend.
    fn spendable(&self) -> u64 {
        let w = &self.window;
        let spent: u64 = (self.truth.iter().flat_map(|t| &t.spent_by_bucket))
            .filter(|(b, _)| w.counts(*b, self.now))
            .map(|(_, c)| c)
            .sum();
        let balance: u64 = (self.truth.iter().flat_map(|t| &t.leases))
            .filter(|l| l.start + self.ttl_ms > self.now)
            .map(|l| l.amount - l.spent)
            .sum();
        spent + balance
    }

    fn take(&mut self, h: usize, pick: usize) -> Option<TLease> {
        let leases = &mut self.truth[h].leases;
        (!leases.is_empty()).then(|| leases.remove(pick % leases.len()))
    }

    fn accept(&mut self, h: usize, g: Result<Grant, Refusal>) {
        if let Ok(g) = g {
            self.truth[h]
                .leases
                .push(TLease::new(g.lease_id, g.amount, self.now));
        }
    }

    fn apply(&mut self, op: &Op) {
        let (now, ttl) = (self.now, self.ttl_ms);
        match *op {
            Op::Advance(dt) => self.now += dt,
            Op::Grant(h, r) => {
                let g = self.ledger.grant(&h, r, now, ttl);
                self.accept(h, g);
            }
            Op::Spend(h, pick, cost) => self.spend(h, pick, cost),
            Op::Renew(h, pick, r) => {
                if let Some(l) = self.take(h, pick) {
                    let g = self.ledger.renew(&h, l.id, &l.by_bucket, r, now, ttl);
                    self.accept(h, g);
                }
            }
            Op::Release(h, pick) => {
                if let Some(l) = self.take(h, pick) {
                    let _ = self.ledger.release(&h, l.id, &l.by_bucket, now);
                }
            }
            Op::Announce(h) => self.announce(h),
        }
    }

    fn spend(&mut self, h: usize, pick: usize, cost: u64) {
        let (now, ttl, bucket) = (self.now, self.ttl_ms, self.window.bucket_index(self.now));
        let t = &mut self.truth[h];
        let n = t.leases.len();
        if let Some(l) = t.leases.get_mut(pick % n.max(1))
            && l.start + ttl > now
            && l.amount - l.spent >= cost
        {
            l.spent += cost;
            l.by_bucket.push((bucket, cost));
            t.spent_by_bucket.push((bucket, cost));
        }
    }

    /// Re-announce: the holder's live balance becomes one adopted lease; the spent
    /// part is in the counters the owner was rebuilt from.
    fn announce(&mut self, h: usize) {
        let (now, ttl) = (self.now, self.ttl_ms);
        let live: Vec<_> = (self.truth[h].leases.iter())
            .filter(|l| l.start + ttl > now)
            .collect();
        let balance: u64 = live.iter().map(|l| l.amount - l.spent).sum();
        // Everything spent and not yet reported to any owner, under live *or* ended
        // leases: the rebuilt owner's counters may predate all of it.
        let unreported: Vec<(u64, u64)> = self.truth[h]
            .leases
            .iter()
            .flat_map(|l| l.by_bucket.clone())
            .collect();
        let start = live.iter().map(|l| l.start).min().unwrap_or(now);
        if let Ok(adopted) = self.ledger.announce(&h, balance, &unreported, now, ttl) {
            self.truth[h].leases = adopted
                .map(|g| TLease::new(g.lease_id, g.amount, start))
                .into_iter()
                .collect();
        }
    }

    fn counters(&self) -> Vec<(u64, u64)> {
        self.truth
            .iter()
            .flat_map(|t| t.spent_by_bucket.clone())
            .collect()
    }
}

fn world(capacity: u64, max_lease: u64, ttl_ms: u64, buckets: u32) -> World {
    let window = Window::try_new(W_MS, buckets).expect("valid window");
    let max_lease = max_lease.clamp(1, capacity);
    let config = LedgerConfig::try_new(capacity, window, max_lease, 5).expect("valid config");
    World {
        window,
        ttl_ms,
        now: 0,
        ledger: Ledger::new(config),
        truth: vec![Truth::default(); 5],
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn owner_never_overcommits(
        capacity in 1u64..600, max_lease in 1u64..600, ttl in 10u64..1_500,
        buckets in 1u32..20, ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut w = world(capacity, max_lease, ttl, buckets);
        for op in ops.iter().filter(|o| !matches!(o, Op::Announce(_))) {
            w.apply(op);
            let (l, now) = (&w.ledger, w.now);
            let committed = l.consumed_in_window(now) + l.outstanding(now);
            prop_assert!(committed <= capacity, "{:?}: committed {} > L {}", op, committed, capacity);
            prop_assert_eq!(l.available(now), capacity - committed);
            prop_assert!(w.spendable() <= capacity, "{:?}: holders can spend {} > L", op, w.spendable());
            for h in 0..5 {
                prop_assert!(l.held_by(&h, now) <= l.config().max_lease());
            }
        }
    }

    #[test]
    fn failover_never_exceeds_capacity(
        capacity in 1u64..600, max_lease in 1u64..600, ttl in 10u64..1_500,
        before in prop::collection::vec(op(), 1..60),
        after in prop::collection::vec(op(), 1..80),
    ) {
        let mut w = world(capacity, max_lease, ttl, 10);
        for op in before.iter().filter(|o| !matches!(o, Op::Announce(_))) {
            w.apply(op);
        }
        let config = *w.ledger.config();
        let counters = w.counters();
        w.ledger = Ledger::rebuild(config, &counters, &[0, 1, 2, 3, 4], w.now, ttl);
        let mut announced = [false; 5];
        for op in &after {
            // A holder's first message to a new owner is its announce.
            let h = match *op { Op::Grant(h, _) | Op::Renew(h, _, _) | Op::Release(h, _) => Some(h), _ => None };
            if h.is_some_and(|h| !announced[h]) {
                continue;
            }
            if let Op::Announce(h) = *op { announced[h] = true; }
            w.apply(op);
            let (l, now) = (&w.ledger, w.now);
            prop_assert!(w.spendable() <= capacity, "{:?}: holders can spend {} > L {}", op, w.spendable(), capacity);
            let committed = l.consumed_in_window(now) + l.outstanding(now) + l.hidden(now);
            prop_assert!(l.available(now) + committed.min(capacity) == capacity);
        }
    }

    #[test]
    fn expired_lease_never_frees_capacity_early(
        capacity in 1u64..1_000, ttl in 1u64..3_000, buckets in 1u32..50, start in 0u64..10_000,
    ) {
        let window = Window::try_new(W_MS, buckets).expect("valid window");
        let config = LedgerConfig::try_new(capacity, window, capacity, 5).expect("valid config");
        let mut l = Ledger::new(config);
        let g = l.grant(&0usize, capacity, start, ttl);
        prop_assert!(g.is_ok());
        let end = start + ttl;
        // Counted until the expiry's bucket leaves the window, whatever settles when.
        let freed = (window.bucket_index(end) + 1) * window.bucket_ms() + W_MS;
        for t in [start, end - 1, end, end + 1, freed - 1] {
            prop_assert_eq!(l.available(t), 0, "at {}", t);
            l.settle(t);
            prop_assert_eq!(l.available(t), 0, "at {} after settling", t);
        }
        prop_assert_eq!(l.available(freed), capacity);
        prop_assert!(l.grant(&1usize, capacity, freed, ttl).is_ok());
    }
}

/// A single busy holder renewing by its policy (blocks of L/10, renew below L/20
/// or at ttl/2) against the owner: every window after the first gets >= 95% of L.
#[test]
fn single_busy_holder_uses_at_least_95_percent() {
    let (capacity, ttl) = (1_000u64, 500u64);
    let window = Window::try_new(W_MS, 60).expect("valid window");
    let config = LedgerConfig::try_new(capacity, window, capacity / 4, 5).expect("valid config");
    let mut ledger = Ledger::new(config);
    let mut holder = Holder::new(
        window,
        ttl,
        capacity / 10,
        capacity / 20,
        CutOffPolicy::FailClosed,
    );
    let mut per_window = [0u64; 10];
    for now in 0..10 * W_MS {
        // A few messages per ms: a refused Grant is asked again at the next ms.
        for _ in 0..3 {
            let Some(req) = holder.poll(now) else { break };
            let reply = match req {
                Request::Grant { requested } => ledger.grant(&0u8, requested, now, ttl).ok(),
                Request::Renew {
                    lease_id,
                    report,
                    requested,
                } => ledger
                    .renew(&0u8, lease_id, &report, requested, now, ttl)
                    .ok(),
                Request::Release { lease_id, report } => {
                    let _ = ledger.release(&0u8, lease_id, &report, now);
                    continue;
                }
            };
            holder.on_reply(reply);
        }
        for _ in 0..5 {
            if holder.spend(1, now) {
                per_window[(now / W_MS) as usize] += 1;
            }
        }
    }
    for (k, used) in per_window.iter().enumerate().skip(1) {
        assert!(
            *used * 100 >= 95 * capacity,
            "window {k}: {used} of {capacity}"
        );
        assert!(*used <= capacity, "window {k}: {used} > {capacity}");
    }
}
