use super::*;
use crate::counter::codec::{
    demand_key, held_key, in_flight_key, scalar_value, slot_key, slot_value,
};

const K: &str = "tenant:acme:tokens";

fn window() -> Window {
    Window::try_new(60_000, 60).unwrap()
}

/// Node `node` publishes `count` in bucket `bucket` of `K` at `version`.
fn put(u: &mut ClusterUsage, node: &str, version: u64, bucket: u64, count: u64) -> Applied {
    let key = slot_key(K, u.windows().base().slot(bucket));
    u.apply_versioned(node, &key, version, &slot_value(bucket, count))
        .unwrap()
}

#[test]
fn a_departed_clock_running_behind_has_its_buckets_dated_on_the_readers_clock() {
    let mut u = ClusterUsage::new(window());
    // b's clock runs 2 s behind: at reader time 1_000_500 it stamps 998_500 and
    // spends 9 in its bucket 998 (real time: this reader's bucket 1_000).
    u.observe_round("b", 998_500, 1_000_500, true);
    put(&mut u, "b", 1, 998, 9);
    u.observe_round("b", 998_700, 1_000_700, true);
    u.retain_nodes(&HashSet::new());
    assert_eq!(u.clock_lag_ms("b", 1_000_700), 2_000);
    // Read as dated, bucket 998 leaves at 1_059_000; the provider counts the
    // spend until 1_061_000. Dated on this clock (shifted by 2 buckets: the lag
    // beyond the tolerance, rounded up) it counts as long.
    let at = 1_060_000;
    assert_eq!(u.departed_usage_except(K, &[], at), 9);
    assert_eq!(u.usage_of("b", K, at), Some(9));
    assert_eq!(
        u.buckets_by_node(K, at),
        vec![("b".to_owned(), vec![(1_000, 9)])]
    );
    assert_eq!(u.departed_usage_except(K, &[], 1_061_000), 0, "then leaves");
    // Not forgotten while its shifted buckets count, nor its key collected.
    assert!(!u.is_idle("b", at));
    assert_eq!(u.gc(at), 0);
    assert_eq!(u.usage_of("b", K, at), Some(9));
    assert!(u.is_idle("b", 1_061_000));
    assert_eq!(u.gc(1_061_000), 1);
}

#[test]
fn a_clock_lag_is_bounded_by_the_smallest_recent_sample_and_the_last_stamp() {
    let mut u = ClusterUsage::new(window());
    assert_eq!(u.clock_lag_ms("a", 5_000), 0, "unknown: read as dated");
    // Seen late once (propagation), then promptly: the tightest bound wins.
    u.observe_round("a", 1_000, 1_400, true);
    u.observe_round("a", 1_200, 1_250, true);
    assert_eq!(u.clock_lag_ms("a", 1_260), 50);
    u.observe_round("a", 1_200, 9_999, true);
    assert_eq!(
        u.clock_lag_ms("a", 1_300),
        50,
        "a repeated stamp is no sample"
    );
    // A member never seen live, whose last stamp is old: it ran no later than
    // now, so `now - stamp` bounds its lag.
    u.observe_round("old", 500, 3_000, false);
    assert_eq!(u.clock_lag_ms("old", 3_000), 2_500);
    // ... capped: one that stopped long ago is not dated that much later.
    u.observe_round("long-gone", 500, 60_500, false);
    assert_eq!(u.clock_lag_ms("long-gone", 60_500), UNSEEN_LAG_CAP_MS);
    // A clock stepped back 2 s is learned within LAG_SAMPLES of its rounds.
    let mut t = 2_000;
    for _ in 0..LAG_SAMPLES {
        t += 200;
        u.observe_round("a", t - 2_000, t, true);
    }
    assert_eq!(u.clock_lag_ms("a", t), 2_000);
    // Never dated earlier: a clock ahead of this one lags 0.
    u.observe_round("ahead", 9_000, 5_000, true);
    assert_eq!(u.clock_lag_ms("ahead", 5_000), 0);
}

#[test]
fn global_usage_sums_live_nodes_in_window_buckets() {
    let mut u = ClusterUsage::new(window());
    put(&mut u, "a", 1, 1_000, 10);
    put(&mut u, "a", 2, 1_001, 5);
    put(&mut u, "b", 1, 1_000, 7);
    // Bucket 1_000 is [1_000_000, 1_001_000): counts until 1_061_000.
    assert_eq!(u.global_usage(K, 1_001_500), 22);
    assert_eq!(u.global_usage(K, 1_060_999), 22);
    assert_eq!(
        u.global_usage(K, 1_061_000),
        5,
        "bucket 1_000 left, exactly"
    );
    assert_eq!(u.global_usage(K, 1_062_000), 0, "stale slots count 0");
    assert_eq!(u.global_usage("other", 1_001_500), 0);
    let by_node = u.usage_by_node(K, 1_001_500);
    assert_eq!(by_node, vec![("a".to_owned(), 15), ("b".to_owned(), 7)]);
    assert_eq!(u.global_usage_except(K, Some("a"), 1_001_500), 7);
}

#[test]
fn slot_reuse_overwrites_the_old_bucket() {
    let mut u = ClusterUsage::new(window());
    put(&mut u, "a", 1, 1_000, 10);
    assert_eq!(put(&mut u, "a", 2, 1_061, 3), Applied::Updated, "same slot");
    assert_eq!(u.global_usage(K, 1_061_000), 3);
    assert_eq!(u.global_usage(K, 1_001_000), 3, "the old bucket is gone");
}

#[test]
fn older_versions_are_stale_and_repeats_unchanged() {
    let mut u = ClusterUsage::new(window());
    assert_eq!(put(&mut u, "a", 5, 1_000, 10), Applied::Updated);
    assert_eq!(put(&mut u, "a", 5, 1_000, 10), Applied::Unchanged);
    assert_eq!(put(&mut u, "a", 4, 1_000, 99), Applied::Stale);
    assert_eq!(u.global_usage(K, 1_000_000), 10);
    // Unversioned apply trusts the caller's order.
    let key = slot_key(K, u.windows().base().slot(1_000));
    assert_eq!(
        u.apply("a", &key, &slot_value(1_000, 2)),
        Ok(Applied::Updated)
    );
    assert_eq!(u.global_usage(K, 1_000_000), 2);
}

#[test]
fn dead_node_usage_drops_at_once_and_returns_with_it() {
    let mut u = ClusterUsage::new(window());
    put(&mut u, "a", 1, 1_000, 10);
    put(&mut u, "b", 1, 1_000, 7);
    u.remove_node("b");
    assert_eq!(u.global_usage(K, 1_000_000), 10);
    assert_eq!(u.usage_by_node(K, 1_000_000), vec![("a".to_owned(), 10)]);
    assert_eq!(u.usage_of("b", K, 1_000_000), Some(7), "registers kept");
    assert_eq!(u.usage_of("z", K, 1_000_000), None);
    // What the departed spent still counts where asked for (a new lease owner's
    // rebuild, a gossip node's charge for a superseded incarnation).
    assert_eq!(u.departed_usage_except(K, &[], 1_000_000), 7);
    assert_eq!(u.departed_usage_except(K, &["b".to_owned()], 1_000_000), 0);
    let nodes: Vec<String> = (u.buckets_by_node(K, 1_000_000).into_iter())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(nodes, vec!["a".to_owned(), "b".to_owned()]);
    let live: HashSet<String> = ["b".to_owned(), "c".to_owned()].into();
    u.retain_nodes(&live);
    assert_eq!(u.global_usage(K, 1_000_000), 7);
    assert_eq!(u.live_nodes(), vec!["b".to_owned(), "c".to_owned()]);
    assert_eq!(
        u.demand_by_node(K),
        vec![("b".to_owned(), 0), ("c".to_owned(), 0)]
    );
    assert!(!u.is_idle("b", 1_000_000), "its bucket still counts");
    assert!(u.is_idle("b", 2_000_000), "left the window");
    assert!(u.is_idle("z", 1_000_000), "unknown");
    assert!(u.forget_node("b"));
    assert!(!u.forget_node("b"));
    assert_eq!(u.global_usage(K, 1_000_000), 0);
}

#[test]
fn demand_and_in_flight_per_node() {
    let mut u = ClusterUsage::new(window());
    u.apply_versioned("a", &demand_key(K), 1, &scalar_value(300))
        .unwrap();
    u.apply_versioned("b", &demand_key(K), 1, &scalar_value(100))
        .unwrap();
    u.apply_versioned("b", &in_flight_key(K), 2, &scalar_value(4))
        .unwrap();
    assert_eq!(
        u.demand_by_node(K),
        vec![("a".to_owned(), 300), ("b".to_owned(), 100)]
    );
    assert_eq!(
        u.in_flight_by_node(K),
        vec![("a".to_owned(), 0), ("b".to_owned(), 4)]
    );
}

#[test]
fn held_shares_per_node_merge_by_version() {
    let mut u = ClusterUsage::new(window());
    u.apply_versioned("a", &held_key(K), 2, &scalar_value(14))
        .unwrap();
    u.apply_versioned("a", &held_key(K), 1, &scalar_value(40))
        .unwrap();
    u.apply_versioned("b", &demand_key(K), 1, &scalar_value(3))
        .unwrap();
    assert_eq!(
        u.held_by_node(K),
        BTreeMap::from([("a".to_owned(), 14)]),
        "the older 40 changes nothing; b holds none"
    );
    let mut other = ClusterUsage::new(window());
    other.merge(&u);
    assert_eq!(other.held_by_node(K), u.held_by_node(K));
}

#[test]
fn foreign_garbage_and_full_are_reported() {
    let mut u = ClusterUsage::with_max_keys_per_node(window(), 1);
    assert_eq!(
        u.apply("a", "proxy_addr", "10.0.0.1:8080"),
        Ok(Applied::Foreign)
    );
    assert!(u.apply("a", "c:k:1", "2:1").is_err());
    assert!(u.live_nodes().is_empty(), "errors create nothing");
    assert_eq!(u.apply("a", &demand_key("k1"), "1"), Ok(Applied::Updated));
    assert_eq!(u.apply("a", &demand_key("k2"), "1"), Ok(Applied::Full));
    assert_eq!(u.apply("b", &demand_key("k2"), "1"), Ok(Applied::Updated));
}

#[test]
fn gc_drops_only_keys_that_read_zero() {
    let mut u = ClusterUsage::new(window());
    put(&mut u, "a", 1, 1_000, 10);
    u.apply_versioned("a", &demand_key("idle"), 1, "0").unwrap();
    u.apply_versioned("a", &in_flight_key("busy"), 1, "2")
        .unwrap();
    assert_eq!(u.gc(1_000_000), 1);
    assert_eq!(u.gc(1_061_000), 1, "its bucket left the window");
    assert_eq!(u.in_flight_by_node("busy"), vec![("a".to_owned(), 2)]);
}

#[test]
fn a_per_day_key_is_read_over_the_long_window_beside_a_minute_key() {
    // Minute buckets of 1 s, day buckets of 1 h.
    let day = Window::try_new(86_400_000, 24).unwrap();
    let mut u = ClusterUsage::new(Windows::new(window(), day));
    let daily = "tenant:acme:requests_per_day";
    let at = 10 * 3_600_000;
    let slot = slot_key(daily, day.slot(day.bucket_index(at)));
    u.apply_versioned("b", &slot, 1, &slot_value(day.bucket_index(at), 7))
        .unwrap();
    put(&mut u, "b", 2, at / 1_000, 3);
    // An hour later the minute key's bucket has left its window; the day's counts.
    let later = at + 3_600_000;
    assert_eq!(u.global_usage(K, later), 0);
    assert_eq!(u.global_usage(daily, later), 7);
    assert_eq!(
        u.global_usage(daily, at + 86_400_000),
        7,
        "until its end leaves"
    );
    assert_eq!(u.global_usage(daily, at + 90_000_000), 0);
    // A slot beyond the day ring (25 slots) is refused for the daily key.
    let bad = slot_key(daily, 30);
    assert!(u.apply_versioned("b", &bad, 3, &slot_value(30, 1)).is_err());
}

/// A departed member's usage carried through an archive: a reader that never
/// saw the member adopts it, republishes it, and keeps the greater copy.
#[test]
fn an_archived_members_usage_is_adopted_by_a_reader_that_never_saw_it() {
    use crate::counter::archive::{archive_key, archive_value, decode_archive};
    // The one that saw b: b spent 9 and 4 in two buckets, then died.
    let mut seen = ClusterUsage::new(window());
    put(&mut seen, "b", 1, 1_000, 9);
    put(&mut seen, "b", 2, 1_010, 4);
    seen.retain_nodes(&HashSet::new());
    let at = 1_020_000;
    let archive = seen.archive_of("b", at);
    assert_eq!(archive, vec![(K.to_owned(), vec![(1_000, 9), (1_010, 4)])]);
    let (key, value) = (archive_key("b", K), archive_value(&archive[0].1));
    // The newcomer, which has never heard of b.
    let mut newcomer = ClusterUsage::new(window());
    let windows = *newcomer.windows();
    let archived = decode_archive(&key, &value, &windows).unwrap().unwrap();
    assert_eq!(newcomer.adopt(&archived, at), Applied::Updated);
    assert_eq!(
        newcomer.adopt(&archived, at),
        Applied::Unchanged,
        "idempotent"
    );
    assert_eq!(newcomer.departed_usage_except(K, &[], at), 13);
    assert_eq!(newcomer.global_usage(K, at), 0, "not live");
    assert_eq!(newcomer.departed_nodes(), vec!["b".to_owned()]);
    assert_eq!(newcomer.archive_of("b", at), archive, "republished alike");
    // A staler copy (one that missed b's last update) changes nothing.
    let stale = archive_value(&[(1_000, 9)]);
    let stale = decode_archive(&key, &stale, &windows).unwrap().unwrap();
    assert_eq!(newcomer.adopt(&stale, at), Applied::Unchanged);
    assert_eq!(newcomer.usage_of("b", K, at), Some(13));
    // Its usage leaves with its window, and b is then idle.
    assert_eq!(newcomer.departed_usage_except(K, &[], 1_061_000), 4);
    assert!(newcomer.is_idle("b", 1_071_000));
    // A live member's own registers rule.
    let mut live = ClusterUsage::new(window());
    put(&mut live, "b", 1, 1_000, 1);
    assert_eq!(live.adopt(&archived, at), Applied::Stale);
    assert_eq!(live.global_usage(K, at), 1);
}
