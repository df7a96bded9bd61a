//! The in-process conformance layer: every mode's round over simulated members,
//! cuts and time, checked against the mode's promise. Deterministic and fast
//! (no sockets, no clock), so proptest explores thousands of clusters; the
//! real-UDP suite (`tests/it/conformance.rs`) and the jepsen harness are the
//! outer layers.
//!
//! A simulated cluster runs rounds within one window. Each round every member
//! computes its bound from its own view (real `LocalCounters` publications
//! applied to a real `ClusterUsage`), then spends what it wants within it and
//! publishes. Within a side of a cut the figures arrive at once; the far side's
//! stay as they were when the cut began, both sides froze the same demand
//! vector, and each sees the other side's members as unreachable.

use super::{KeyInput, Mode, Output, RedisRound, Round, lease, local, redis, redis_lease};
use crate::actor::scope::Allowance;
use crate::actor::{Binding, Dimension, ScopeId};
use crate::config::{CutOff, LocalShare};
use crate::sync::partition::cut::split_members;
use crate::sync::partition::redis_loss::Loss;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use tollgate_cluster::counter::{ClusterUsage, LocalCounters, Window};
use tollgate_cluster::lease::line::Terms;

const KEY: &str = "tenant:t:requests";
/// A window-aligned start, so that every round falls in one window.
const T0_MS: u64 = 1_800_000_000_000;
const ROUND_MS: u64 = 1_000;

fn window() -> Window {
    Window::try_new(60_000, 60).expect("a valid window")
}

fn binding(capacity: u64) -> Binding {
    Binding {
        key: Arc::from(KEY),
        scope: ScopeId::tenant("t"),
        dimension: Dimension::Requests,
        capacity,
        allowance: Some(Allowance::new(u64::MAX)),
        counts_cache_reads: false,
        leased: false,
    }
}

/// One simulated member: its counters and everything it has published.
struct Member {
    id: String,
    counters: LocalCounters,
    published: BTreeMap<String, String>,
    spent: u64,
    demand: u64,
}

impl Member {
    fn new(i: usize) -> Member {
        Member {
            id: format!("n{i}"),
            counters: LocalCounters::new(window()),
            published: BTreeMap::new(),
            spent: 0,
            demand: 0,
        }
    }

    fn spend(&mut self, cost: u64, now_ms: u64) {
        self.spent += cost;
        let bucket = window().bucket_index(now_ms);
        let before = self.counters.bucket_count(KEY, bucket);
        self.counters
            .set_bucket(KEY, bucket, before + cost, now_ms)
            .expect("a valid key");
    }

    fn publish(&mut self, now_ms: u64) {
        self.counters
            .set_demand(KEY, self.demand)
            .expect("a valid key");
        self.published.extend(self.counters.publish(now_ms));
    }
}

/// A cut: which side each member is on, and what each published before it.
struct Cut {
    side: Vec<bool>,
    at_cut: Vec<BTreeMap<String, String>>,
    frozen: Vec<(String, u64)>,
}

struct Cluster {
    capacity: u64,
    members: Vec<Member>,
    cut: Option<Cut>,
}

/// What one member's round decided.
struct Decision {
    out: Output,
}

impl Decision {
    fn allowance(&self) -> u64 {
        (self.out.allowances.first()).map_or(u64::MAX, |(_, a)| *a)
    }

    fn terms(&self, capacity: u64) -> Arc<Terms<String>> {
        let terms = (self.out.terms.get(KEY)).or_else(|| self.out.idle_terms.get(&capacity));
        Arc::clone(terms.expect("a leased key has terms every round"))
    }
}

impl Cluster {
    fn new(capacity: u64, n: usize) -> Cluster {
        Cluster {
            capacity,
            members: (0..n).map(Member::new).collect(),
            cut: None,
        }
    }

    fn ids(&self) -> Vec<String> {
        self.members.iter().map(|m| m.id.clone()).collect()
    }

    /// Cuts the members whose `far` flag differs from member 0's off from it.
    fn cut(&mut self, far: &[bool]) {
        let side: Vec<bool> = (0..self.members.len())
            .map(|i| far.get(i).copied().unwrap_or(false))
            .collect();
        if side.iter().all(|s| *s == side[0]) {
            return;
        }
        self.cut = Some(Cut {
            side,
            at_cut: self.members.iter().map(|m| m.published.clone()).collect(),
            frozen: (self.members.iter())
                .map(|m| (m.id.clone(), m.demand))
                .collect(),
        });
    }

    fn unreachable_from(&self, i: usize) -> Vec<String> {
        let Some(cut) = &self.cut else {
            return Vec::new();
        };
        (self.members.iter().enumerate())
            .filter(|(j, _)| cut.side[*j] != cut.side[i])
            .map(|(_, m)| m.id.clone())
            .collect()
    }

    /// Member `i`'s view of the cluster's counters.
    fn usage_seen_by(&self, i: usize) -> ClusterUsage {
        let mut usage = ClusterUsage::new(window());
        for (j, m) in self.members.iter().enumerate() {
            if j == i {
                continue;
            }
            let far = self.cut.as_ref().filter(|c| c.side[j] != c.side[i]);
            let state = far.map_or(&m.published, |c| &c.at_cut[j]);
            for (key, value) in state {
                usage.apply(&m.id, key, value).expect("a valid publication");
            }
        }
        // Every member this one reaches counts, published or not (as the
        // engine's membership makes it count).
        let unreachable = self.unreachable_from(i);
        let live: HashSet<String> = (self.members.iter().enumerate())
            .filter(|(j, m)| *j != i && !unreachable.contains(&m.id))
            .map(|(_, m)| m.id.clone())
            .collect();
        usage.retain_nodes(&live);
        usage
    }

    /// Member `i`'s round under `mode`.
    fn round(&self, mode: &dyn Mode, i: usize, now_ms: u64, redis: RedisRound<'_>) -> Decision {
        let me = &self.members[i];
        let usage = self.usage_seen_by(i);
        let dead = self.unreachable_from(i);
        let mut demands = usage.demand_by_node(KEY);
        demands.push((me.id.clone(), me.demand));
        demands.sort();
        let frozen: Vec<&[(String, u64)]> =
            (self.cut.iter()).map(|c| c.frozen.as_slice()).collect();
        let at_cut = self
            .cut
            .as_ref()
            .map(|_| split_members(&self.ids(), std::iter::empty(), &dead));
        let round = Round {
            self_id: &me.id,
            usage: &usage,
            now_ms,
            dead: &dead,
            borrow: 0.0,
            spill_peers: None,
            split_at_cut: at_cut.as_deref(),
            redis,
        };
        let binding = binding(self.capacity);
        let key = KeyInput {
            index: 0,
            binding: &binding,
            own: super::Own {
                used: me.spent,
                seen: me.spent,
                demand: me.demand,
            },
            demands: &demands,
            frozen: &frozen,
            others_live: usage.global_usage_except(KEY, None, now_ms),
            adopted: None,
        };
        let mut out = Output::default();
        mode.key(&round, &key, &mut out);
        Decision { out }
    }

    /// One round: every member decides from the same figures, then spends what
    /// it wants within its allowance and publishes.
    fn run_allowance_round(&mut self, mode: &dyn Mode, t: u64, wants: &[(u64, u64)]) {
        let now_ms = T0_MS + t * ROUND_MS;
        let allowances: Vec<u64> = (0..self.members.len())
            .map(|i| {
                self.round(mode, i, now_ms, RedisRound::default())
                    .allowance()
            })
            .collect();
        for (i, member) in self.members.iter_mut().enumerate() {
            let (want, demand) = wants.get(i).copied().unwrap_or_default();
            member.demand = demand;
            let room = allowances[i].saturating_sub(member.spent);
            member.spend(want.min(room), now_ms);
            member.publish(now_ms);
        }
    }

    fn total_spent(&self) -> u64 {
        self.members.iter().map(|m| m.spent).sum()
    }
}

/// A run: members, capacity, per round each member's (want, demand), and
/// which round a cut begins at with which members on the far side.
#[derive(Debug, Clone)]
struct Run {
    capacity: u64,
    rounds: Vec<Vec<(u64, u64)>>,
    cut_at: usize,
    far: Vec<bool>,
}

fn runs() -> impl Strategy<Value = Run> {
    (1usize..6, 1u64..2_000).prop_flat_map(|(n, capacity)| {
        let want = (0..=capacity / 2, 0..=capacity);
        (
            Just(capacity),
            prop::collection::vec(prop::collection::vec(want, n), 1..10),
            0usize..10,
            prop::collection::vec(any::<bool>(), n),
        )
            .prop_map(|(capacity, rounds, cut_at, far)| Run {
                capacity,
                rounds,
                cut_at,
                far,
            })
    })
}

/// Runs `run` under an allowance mode and returns the cluster's total.
fn spend_through(mode: &dyn Mode, run: &Run) -> u64 {
    let n = run.rounds[0].len();
    let mut cluster = Cluster::new(run.capacity, n);
    for (t, wants) in run.rounds.iter().enumerate() {
        if t == run.cut_at {
            cluster.cut(&run.far);
        }
        cluster.run_allowance_round(mode, t as u64, wants);
    }
    cluster.total_spent()
}

/// The leased modes' terms at the end of `run` (spending as demand asks, which
/// moves only the figures terms are computed from), as each side's members
/// compute them: what each side may grant in all, and member 0's terms.
fn leased_sides(mode: &dyn Mode, run: &Run) -> (Vec<u64>, Cluster) {
    let n = run.rounds[0].len();
    let mut cluster = Cluster::new(run.capacity, n);
    for (t, wants) in run.rounds.iter().enumerate() {
        if t == run.cut_at {
            cluster.cut(&run.far);
        }
        let now_ms = T0_MS + t as u64 * ROUND_MS;
        for (member, (want, demand)) in cluster.members.iter_mut().zip(wants) {
            member.demand = *demand;
            member.spend((*want).min(run.capacity / n as u64), now_ms);
            member.publish(now_ms);
        }
    }
    let now_ms = T0_MS + run.rounds.len() as u64 * ROUND_MS;
    let mut grantable = Vec::new();
    for i in 0..n {
        let terms = cluster
            .round(mode, i, now_ms, RedisRound::default())
            .terms(run.capacity);
        let floors: u64 = terms.floors.values().sum();
        let shares: u64 = terms.shares.values().sum();
        assert!(
            shares + floors <= run.capacity.max(floors),
            "{}: shares {shares} + floors {floors} > L {}",
            mode.promise(),
            run.capacity
        );
        grantable.push(shares + terms.borrow);
    }
    (grantable, cluster)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `local split` and `gossip`: the cluster never spends more than L in the
    /// window, healthy or cut (gossip's e is 0 where figures arrive at once, as
    /// here). `local full` bounds nothing: every allowance is unbounded.
    #[test]
    fn allowance_modes_keep_the_cluster_within_their_promise(run in runs()) {
        let split = local::Local { share: LocalShare::Split };
        let total = spend_through(&split, &run);
        prop_assert!(total <= run.capacity, "{}: {total} > L {}", split.promise(), run.capacity);
        let gossip = super::gossip::Gossip;
        let total = spend_through(&gossip, &run);
        prop_assert!(total <= run.capacity, "{}: {total} > L {}", gossip.promise(), run.capacity);
        let full = local::Local { share: LocalShare::Full };
        let cluster = Cluster::new(run.capacity, run.rounds[0].len());
        let decision = cluster.round(&full, 0, T0_MS, RedisRound::default());
        prop_assert_eq!(decision.allowance(), u64::MAX);
    }

    /// `lease` and `redis-lease`: every side's owner grants within its terms,
    /// and the terms two sides of a cut compute leave room for at most L
    /// between them (each charges the other its share of the frozen vector).
    /// Healthy, one side grants at most L.
    #[test]
    fn leased_modes_grant_at_most_l_between_the_sides_of_a_cut(run in runs()) {
        for mode in [&lease::Lease as &dyn Mode, &redis_lease::RedisLease] {
            let (grantable, cluster) = leased_sides(mode, &run);
            match &cluster.cut {
                None => prop_assert!(grantable[0] <= run.capacity),
                Some(cut) => {
                    let far = (0..grantable.len()).find(|j| cut.side[*j] != cut.side[0]);
                    let far = far.expect("a cut has two sides");
                    let both = grantable[0] + grantable[far];
                    prop_assert!(
                        both <= run.capacity,
                        "{}: sides grant {} + {} > L {}",
                        mode.promise(), grantable[0], grantable[far], run.capacity
                    );
                }
            }
        }
    }

    /// `redis`: what the peers that still reach Redis ask of it, plus what the
    /// members that lost it may spend locally meanwhile, stays within L, once
    /// every loss is charged.
    #[test]
    fn redis_keeps_the_cluster_within_l_while_some_members_lost_it(
        run in runs(),
        lost in prop::collection::vec(any::<bool>(), 1..6),
    ) {
        let n = run.rounds[0].len();
        let mut cluster = Cluster::new(run.capacity, n);
        for (member, (want, demand)) in cluster.members.iter_mut().zip(&run.rounds[0]) {
            member.demand = *demand;
            member.spend((*want).min(run.capacity / n as u64), T0_MS);
            member.publish(T0_MS);
        }
        let lost: Vec<bool> = (0..n).map(|i| lost.get(i).copied().unwrap_or(false)).collect();
        let divisor = n as u64;
        let charged: Vec<Loss> = (lost.iter().enumerate())
            .filter(|(_, l)| **l)
            .map(|(i, _)| Loss { epoch: T0_MS + i as u64, divisor })
            .collect();
        let mode = redis::Redis { cut_off: CutOff::Share };
        let mut cap = None;
        let mut local = 0u64;
        for (i, is_lost) in lost.iter().enumerate() {
            let others: Vec<Loss> = (charged.iter())
                .filter(|l| l.epoch != T0_MS + i as u64)
                .copied()
                .collect();
            let redis = RedisRound { lost: *is_lost, divisor, charged: if *is_lost { &[] } else { &others } };
            let decision = cluster.round(&mode, i, T0_MS + ROUND_MS, redis);
            if *is_lost {
                let fallback = decision.out.redis_fallback[0];
                local += fallback.own.min(fallback.charged);
                prop_assert_eq!(decision.allowance(), fallback.own);
            } else {
                cap = Some(decision.out.redis_caps[KEY]);
                prop_assert_eq!(decision.allowance(), u64::MAX, "Redis is the bound");
            }
        }
        let redis_total = cap.unwrap_or(0);
        prop_assert!(
            redis_total + local <= run.capacity,
            "{}: Redis {redis_total} + local {local} > L {}", mode.promise(), run.capacity
        );
    }
}
