//! Property tests of the counter algebra: the CRDT laws of [`ClusterUsage`], versions
//! only growing, the sum equal to the truth once gossip settles (with drops,
//! duplicates and reordering), coalesced publishing, and decoding that never panics.
//! A failing case prints its minimal input, shuffle seeds included.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::codec::{
    MAX_KEY_BYTES, MAX_VALUE_BYTES, decode, demand_key, held_key, in_flight_key, scalar_value,
    slot_key, slot_value,
};
use super::{Applied, ClusterUsage, LocalCounters, MAX_COUNT, Recorded, Window};

const LIMIT_KEYS: [&str; 2] = ["tenant:a:tokens", "b"];
const START_MS: u64 = 1_700_000_000_000;

/// SplitMix64: a seeded RNG for shuffles, so a failing case reproduces from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// One gossiped update: (node, key, version, value).
type Update = (String, String, u64, String);

fn window_strategy() -> impl Strategy<Value = Window> {
    (1u32..=12, 0u64..3_000).prop_map(|(buckets, extra_ms)| {
        Window::try_new(u64::from(buckets) + extra_ms, buckets).expect("window_ms >= buckets")
    })
}

/// Valid updates for a 60 s / 60 bucket window, with colliding versions on purpose.
fn update_strategy() -> impl Strategy<Value = Update> {
    let w = Window::try_new(60_000, 60).expect("valid");
    (
        0usize..3,
        0usize..2,
        0u8..4,
        1_000u64..1_200,
        0u64..50,
        0u64..6,
    )
        .prop_map(move |(node, key, kind, bucket, n, version)| {
            let limit_key = LIMIT_KEYS[key];
            let (k, v) = match kind {
                0 => (slot_key(limit_key, w.slot(bucket)), slot_value(bucket, n)),
                1 => (demand_key(limit_key), scalar_value(n)),
                2 => (in_flight_key(limit_key), scalar_value(n)),
                _ => (held_key(limit_key), scalar_value(n)),
            };
            (format!("n{node}"), k, version, v)
        })
}

fn replica_of(updates: &[Update]) -> ClusterUsage {
    let mut u = ClusterUsage::new(Window::try_new(60_000, 60).expect("valid"));
    for (node, key, version, value) in updates {
        u.apply_versioned(node, key, *version, value)
            .expect("valid update");
    }
    u
}

/// A per-node view: (node, value) sorted by node.
type PerNode = Vec<(String, u64)>;

/// Every sum a reader can ask for, at a few times around the generated buckets.
fn sums(u: &ClusterUsage) -> Vec<(u64, PerNode)> {
    let mut out = Vec::new();
    for limit_key in LIMIT_KEYS {
        for now_ms in [1_000_000, 1_100_000, 1_150_500, 1_250_000] {
            out.push((
                u.global_usage(limit_key, now_ms),
                u.usage_by_node(limit_key, now_ms),
            ));
        }
        out.push((0, u.demand_by_node(limit_key)));
        out.push((0, u.in_flight_by_node(limit_key)));
    }
    out
}

proptest! {
    #[test]
    fn merge_is_commutative_associative_idempotent(
        updates in prop::collection::vec(update_strategy(), 0..60),
        seed in any::<u64>(),
        cut in (0usize..60, 0usize..60),
    ) {
        let in_order = replica_of(&updates);
        // Any order, with duplicates: the same state and the same sums.
        let mut rng = Rng(seed);
        let mut shuffled = updates.clone();
        shuffled.extend(updates.iter().filter(|_| rng.below(3) == 0).cloned());
        rng.shuffle(&mut shuffled);
        let reordered = replica_of(&shuffled);
        prop_assert_eq!(&in_order, &reordered);
        prop_assert_eq!(sums(&in_order), sums(&reordered));
        // State merge: split into three replicas and join them every way.
        let (i, j) = (cut.0.min(cut.1).min(updates.len()), cut.0.max(cut.1).min(updates.len()));
        let (x, y, z) = (replica_of(&updates[..i]), replica_of(&updates[i..j]), replica_of(&updates[j..]));
        let join = |a: &ClusterUsage, b: &ClusterUsage| {
            let mut m = a.clone();
            m.merge(b);
            m
        };
        prop_assert_eq!(join(&x, &y), join(&y, &x), "commutative");
        prop_assert_eq!(join(&join(&x, &y), &z), join(&x, &join(&y, &z)), "associative");
        prop_assert_eq!(join(&x, &x), x.clone(), "idempotent");
        prop_assert_eq!(join(&join(&x, &y), &z), in_order, "merge = applying every update");
    }

    #[test]
    fn versions_only_grow_and_older_updates_change_nothing(
        updates in prop::collection::vec(update_strategy(), 1..60),
    ) {
        let mut u = replica_of(&[]);
        for (node, key, version, value) in &updates {
            let before = u.register_versions();
            let state = u.clone();
            let applied = u.apply_versioned(node, key, *version, value).expect("valid");
            let after = u.register_versions();
            for (register, v) in &before {
                prop_assert!(after.get(register).is_some_and(|a| a >= v), "{register:?} went back");
            }
            if applied != Applied::Updated {
                prop_assert_eq!(&u, &state, "{:?} changed the state", applied);
            }
        }
        // Once everything is in, replaying any update is Stale or Unchanged.
        let settled = u.clone();
        for (node, key, version, value) in &updates {
            let applied = u.apply_versioned(node, key, *version, value).expect("valid");
            prop_assert!(matches!(applied, Applied::Stale | Applied::Unchanged));
        }
        prop_assert_eq!(u, settled);
    }

    #[test]
    fn decode_never_panics(key in ".{0,300}", value in ".{0,60}", structured in ("[cdfx]:[a-z0-9:]{0,12}", "[0-9a-z:]{0,30}")) {
        let w = Window::try_new(60_000, 60).expect("valid");
        let _ = decode(&key, &value, &w.into());
        let _ = decode(&structured.0, &structured.1, &w.into());
        let mut u = ClusterUsage::new(w);
        let _ = u.apply("n", &structured.0, &structured.1);
    }

    #[test]
    fn encoding_round_trips(limit_key in "[!-~]{1,128}", bucket in any::<u64>(), count in 0..=MAX_COUNT, window in window_strategy()) {
        let slot = window.slot(bucket);
        let (key, value) = (slot_key(&limit_key, slot), slot_value(bucket, count));
        prop_assert!(key.len() <= MAX_KEY_BYTES && value.len() <= MAX_VALUE_BYTES);
        let decoded = decode(&key, &value, &window.into()).expect("own encoding decodes");
        prop_assert_eq!(decoded, Some(super::Decoded::Slot { limit_key: &limit_key, slot, bucket, count }));
    }
}

/// What a simulated writer does.
#[derive(Debug, Clone)]
enum Op {
    /// Every clock moves forward by this many ms.
    Advance(u64),
    /// `writer` reserves `cost` on `LIMIT_KEYS[key]` in the current bucket.
    Reserve {
        writer: usize,
        key: usize,
        cost: u32,
    },
    /// `writer` settles `delta` (refund < 0, debt > 0) to the bucket `back` buckets ago.
    Settle {
        writer: usize,
        key: usize,
        back: u64,
        delta: i32,
    },
    /// `writer` publishes what changed; the updates go to the gossip log.
    Publish { writer: usize },
}

const WRITERS: usize = 3;

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u64..1_500).prop_map(Op::Advance),
        4 => (0..WRITERS, 0usize..2, 0u32..1_000)
            .prop_map(|(writer, key, cost)| Op::Reserve { writer, key, cost }),
        3 => (0..WRITERS, 0usize..2, 0u64..16, -1_500i32..500)
            .prop_map(|(writer, key, back, delta)| Op::Settle { writer, key, back, delta }),
        2 => (0..WRITERS).prop_map(|writer| Op::Publish { writer }),
    ]
}

/// Ground truth, computed from the records alone: (writer, key, bucket) -> count.
type Truth = BTreeMap<(usize, usize, u64), u64>;

/// Independent of `Window::counts`: a past bucket counts while its end is in the window.
fn truth_counts(window: &Window, bucket: u64, now_ms: u64) -> bool {
    let (b, w) = (i128::from(bucket), i128::from(window.bucket_ms()));
    (b + 1) * w > i128::from(now_ms) - i128::from(window.window_ms())
}

fn truth_usage(
    truth: &Truth,
    window: &Window,
    writer: Option<usize>,
    key: usize,
    now_ms: u64,
) -> u64 {
    (truth.iter())
        .filter(|((wr, k, b), _)| {
            writer.is_none_or(|x| x == *wr) && *k == key && truth_counts(window, *b, now_ms)
        })
        .map(|(_, c)| *c)
        .sum()
}

/// Runs `ops` on the writers, checking each writer's own view; returns the gossip log,
/// the truth and the final time.
fn run_writers(window: Window, ops: &[Op]) -> Result<(Vec<Update>, Truth, u64), TestCaseError> {
    let mut writers: Vec<LocalCounters> =
        (0..WRITERS).map(|_| LocalCounters::new(window)).collect();
    let mut versions = [0u64; WRITERS];
    let (mut log, mut truth, mut now_ms) = (Vec::new(), Truth::new(), START_MS);
    let mut publish = |writer: usize, c: &mut LocalCounters, now_ms: u64, log: &mut Vec<Update>| {
        for (key, value) in c.publish(now_ms) {
            versions[writer] += 1;
            log.push((format!("w{writer}"), key, versions[writer], value));
        }
    };
    for op in ops {
        let (writer, key, bucket, delta) = match *op {
            Op::Advance(ms) => {
                now_ms += ms;
                continue;
            }
            Op::Publish { writer } => {
                publish(writer, &mut writers[writer], now_ms, &mut log);
                continue;
            }
            Op::Reserve { writer, key, cost } => {
                (writer, key, window.bucket_index(now_ms), i64::from(cost))
            }
            Op::Settle {
                writer,
                key,
                back,
                delta,
            } => (
                writer,
                key,
                window.bucket_index(now_ms).saturating_sub(back),
                i64::from(delta),
            ),
        };
        let recorded = writers[writer]
            .record(LIMIT_KEYS[key], bucket, delta, now_ms)
            .expect("room");
        if truth_counts(&window, bucket, now_ms) {
            prop_assert_ne!(recorded, Recorded::Expired);
            let count = truth.entry((writer, key, bucket)).or_insert(0);
            *count = count.saturating_add_signed(delta);
        } else {
            prop_assert_eq!(recorded, Recorded::Expired);
        }
        let own = writers[writer].local_usage(LIMIT_KEYS[key], now_ms);
        prop_assert_eq!(own, truth_usage(&truth, &window, Some(writer), key, now_ms));
    }
    for (writer, c) in writers.iter_mut().enumerate() {
        publish(writer, c, now_ms, &mut log);
    }
    Ok((log, truth, now_ms))
}

proptest! {
    #[test]
    fn sum_equals_the_truth_once_gossip_settles(
        window in window_strategy(),
        ops in prop::collection::vec(op_strategy(), 0..120),
        seed in any::<u64>(),
    ) {
        let (log, truth, last_ms) = run_writers(window, &ops)?;
        let mut rng = Rng(seed);
        let mut replicas = vec![ClusterUsage::new(window), ClusterUsage::new(window)];
        for replica in &mut replicas {
            // Lossy phase: drops, duplicates, any order.
            let mut lossy: Vec<&Update> = log.iter().filter(|_| rng.below(3) != 0).collect();
            lossy.extend(log.iter().filter(|_| rng.below(4) == 0));
            rng.shuffle(&mut lossy);
            // Settling: everything arrives eventually, in any order.
            let mut all: Vec<&Update> = log.iter().collect();
            rng.shuffle(&mut all);
            for (node, key, version, value) in lossy.into_iter().chain(all) {
                replica.apply_versioned(node, key, *version, value).expect("own encoding");
            }
        }
        prop_assert_eq!(&replicas[0], &replicas[1]);
        let (w_ms, b_ms) = (window.window_ms(), window.bucket_ms());
        for now_ms in [last_ms, last_ms + b_ms, last_ms + w_ms / 2, last_ms + w_ms, last_ms + w_ms + b_ms] {
            for (key, limit_key) in LIMIT_KEYS.iter().enumerate() {
                let want = truth_usage(&truth, &window, None, key, now_ms);
                prop_assert_eq!(replicas[0].global_usage(limit_key, now_ms), want, "{} at {}", limit_key, now_ms);
                for (node, usage) in replicas[0].usage_by_node(limit_key, now_ms) {
                    let writer: usize = node[1..].parse().expect("w{n}");
                    prop_assert_eq!(usage, truth_usage(&truth, &window, Some(writer), key, now_ms));
                }
            }
        }
    }

    #[test]
    fn publish_carries_exactly_the_changes(
        window in window_strategy(),
        ops in prop::collection::vec(op_strategy(), 0..120),
        demands in prop::collection::vec((0usize..2, 0u64..4, 0u64..3), 0..20),
    ) {
        let mut c = LocalCounters::new(window);
        let mut mirror = ClusterUsage::new(window);
        let mut last: HashMap<String, String> = HashMap::new();
        let mut now_ms = START_MS;
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Advance(ms) => now_ms += ms,
                Op::Reserve { key, cost, .. } => {
                    c.record(LIMIT_KEYS[key], window.bucket_index(now_ms), i64::from(cost), now_ms).expect("room");
                }
                Op::Settle { key, back, delta, .. } => {
                    let bucket = window.bucket_index(now_ms).saturating_sub(back);
                    c.record(LIMIT_KEYS[key], bucket, i64::from(delta), now_ms).expect("room");
                }
                Op::Publish { .. } => {}
            }
            if let Some(&(key, demand, in_flight)) = demands.get(i) {
                c.set_demand(LIMIT_KEYS[key], demand).expect("room");
                c.set_in_flight(LIMIT_KEYS[key], in_flight).expect("room");
            }
            if !matches!(op, Op::Publish { .. }) {
                continue;
            }
            let out = c.publish(now_ms);
            for pair in out.windows(2) {
                prop_assert!(pair[0].0 < pair[1].0, "one value per key, sorted");
            }
            for (key, value) in out {
                prop_assert!(key.len() <= MAX_KEY_BYTES && value.len() <= MAX_VALUE_BYTES);
                prop_assert_ne!(last.get(&key), Some(&value), "{} republished unchanged", key);
                mirror.apply("me", &key, &value).expect("own encoding");
                last.insert(key, value);
            }
            prop_assert!(c.publish(now_ms).is_empty(), "a second publish has nothing");
            for limit_key in LIMIT_KEYS {
                prop_assert_eq!(mirror.global_usage(limit_key, now_ms), c.local_usage(limit_key, now_ms));
            }
        }
    }
}
