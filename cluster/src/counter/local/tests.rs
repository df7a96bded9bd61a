use super::*;
use crate::counter::Window;

const K: &str = "tenant:acme:tokens";

fn counters() -> LocalCounters {
    LocalCounters::new(Window::try_new(60_000, 60).unwrap())
}

#[test]
fn refunds_never_go_below_zero_and_debts_add() {
    let mut c = counters();
    let t = 1_000_000;
    let b = c.windows().base().bucket_index(t);
    assert_eq!(c.record(K, b, 100, t), Ok(Recorded::Changed));
    assert_eq!(c.record(K, b, -30, t), Ok(Recorded::Changed));
    assert_eq!(c.local_usage(K, t), 70);
    assert_eq!(c.record(K, b, -500, t), Ok(Recorded::Changed));
    assert_eq!(c.local_usage(K, t), 0);
    assert_eq!(c.record(K, b, -1, t), Ok(Recorded::Unchanged));
    assert_eq!(c.record(K, b, 25, t + 5_000), Ok(Recorded::Changed));
    assert_eq!(c.local_usage(K, t + 5_000), 25);
    assert_eq!(c.record(K, b, i64::MAX, t), Ok(Recorded::Changed));
    assert_eq!(c.local_usage(K, t), MAX_COUNT);
}

#[test]
fn publish_is_coalesced_and_only_carries_changes() {
    let mut c = counters();
    let t = 1_000_000;
    let b = c.windows().base().bucket_index(t);
    for _ in 0..100 {
        c.record(K, b, 3, t).unwrap();
    }
    c.record(K, b - 1, 7, t).unwrap();
    c.set_demand(K, 500).unwrap();
    let first = c.publish(t);
    assert_eq!(
        first,
        vec![
            // Bucket 999 lives in slot 999 mod 61 = 23 ("n"), bucket 1000 in 24.
            ("c:tenant:acme:tokens:n".to_owned(), "rr:7".to_owned()),
            ("c:tenant:acme:tokens:o".to_owned(), "rs:8c".to_owned()),
            ("d:tenant:acme:tokens".to_owned(), "dw".to_owned()),
        ]
    );
    assert!(c.publish(t).is_empty(), "nothing changed");
    c.record(K, b, 1, t).unwrap();
    c.record(K, b, -1, t).unwrap();
    c.set_demand(K, 500).unwrap();
    // Back and forth since the last publish: nothing to say.
    assert!(c.publish(t).is_empty());
}

#[test]
fn a_publish_that_never_arrived_is_carried_again() {
    let mut c = counters();
    let t = 1_000_000;
    let b = c.windows().base().bucket_index(t);
    c.record(K, b, 9, t).unwrap();
    c.set_demand(K, 12).unwrap();
    let lost = c.publish(t);
    assert_eq!(lost.len(), 2);
    c.unpublish();
    // The same values again, and the in-flight and held 0s (a value the lost
    // write may have changed to 0 must reach readers too; a redundant 0 costs
    // nothing).
    let mut again = lost.clone();
    again.push(("f:tenant:acme:tokens".to_owned(), "0".to_owned()));
    again.push(("h:tenant:acme:tokens".to_owned(), "0".to_owned()));
    assert_eq!(c.publish(t), again);
    assert!(c.publish(t).is_empty(), "then nothing new");
}

#[test]
fn a_lost_final_zero_of_a_key_going_idle_is_carried_again() {
    let mut c = counters();
    c.set_in_flight(K, 2).unwrap();
    assert_eq!(c.publish(1_000).len(), 1);
    // The key goes idle: its in-flight 0 is published, and that write fails.
    c.set_in_flight(K, 0).unwrap();
    assert_eq!(
        c.publish(2_000),
        vec![("f:tenant:acme:tokens".to_owned(), "0".to_owned())]
    );
    c.unpublish();
    assert!(
        c.publish(3_000)
            .contains(&("f:tenant:acme:tokens".to_owned(), "0".to_owned())),
        "the final 0 goes out again"
    );
}

#[test]
fn a_forgotten_key_is_retired_once_unless_it_is_used_again_first() {
    let mut c = counters();
    let w = *c.windows().base();
    let t = 1_000_000;
    let all = u64::MAX;
    c.record(K, w.bucket_index(t), 10, t).unwrap();
    c.set_demand("tenant:other:requests", 3).unwrap();
    c.publish(t);
    assert!(
        c.take_retired(all, usize::MAX).is_empty(),
        "both keys count"
    );
    // K's bucket leaves the window: its forgetting retires it, once, and only
    // a window after it was forgotten.
    let later = t + w.window_ms() + w.bucket_ms();
    assert!(c.publish(later).is_empty());
    assert!(c.take_retired(later - 1, usize::MAX).is_empty());
    assert_eq!(c.take_retired(later, usize::MAX), vec![K.to_owned()]);
    assert!(c.take_retired(all, usize::MAX).is_empty());
    // The write carrying the deletion failed: it is retried, unless the key
    // was used again meanwhile (its ring is live then).
    c.retire_again(vec![K.to_owned()]);
    c.retire_again(vec![K.to_owned()]);
    assert_eq!(c.take_retired(0, usize::MAX), vec![K.to_owned()]);
    c.retire_again(vec![K.to_owned()]);
    c.record(K, w.bucket_index(later), 1, later).unwrap();
    assert!(c.take_retired(all, usize::MAX).is_empty(), "in use again");
    c.retire_again(vec![K.to_owned()]);
    assert!(
        c.take_retired(all, usize::MAX).is_empty(),
        "nor on a late retry"
    );
    // The other key's demand drops to 0: published, then retired.
    c.set_demand("tenant:other:requests", 0).unwrap();
    assert_eq!(c.publish(later).len(), 2);
    assert!(
        c.take_retired(all, usize::MAX).is_empty(),
        "its final 0 just went out"
    );
    c.publish(later);
    assert_eq!(
        c.take_retired(all, usize::MAX),
        vec!["tenant:other:requests".to_owned()]
    );
    // Many at once go out a few per call, oldest first.
    c.retire_again(vec!["c".to_owned(), "a".to_owned(), "b".to_owned()]);
    assert_eq!(c.take_retired(all, 2), vec!["a".to_owned(), "b".to_owned()]);
    assert_eq!(c.take_retired(all, 2), vec!["c".to_owned()]);
}

#[test]
fn zeros_for_keys_not_tracked_track_nothing_and_retire_nothing() {
    let mut c = counters();
    // An idle actor's export every round: demand and in-flight 0.
    for round in 0..3 {
        c.set_demand(K, 0).unwrap();
        c.set_in_flight(K, 0).unwrap();
        assert!(c.publish(round).is_empty());
    }
    assert!(c.is_empty());
    assert!(c.take_retired(u64::MAX, usize::MAX).is_empty());
    assert!(c.set_in_flight("bad key", 0).is_err(), "still validated");
    // A key tracked but never published (recorded and refunded before any
    // publish) leaves no ring either.
    let w = *c.windows().base();
    c.record(K, w.bucket_index(5), 4, 5).unwrap();
    c.record(K, w.bucket_index(5), -4, 5).unwrap();
    assert!(c.publish(5).is_empty());
    assert!(c.publish(5 + w.window_ms() + w.bucket_ms()).is_empty());
    assert!(c.is_empty());
    assert_eq!(c.retired_len(), 0);
}

#[test]
fn slot_reuse_after_a_full_window_overwrites_cleanly() {
    let mut c = counters();
    let w = *c.windows().base();
    let t = 1_000_000;
    let b = w.bucket_index(t);
    c.record(K, b, 10, t).unwrap();
    c.publish(t);
    let later = t + u64::from(w.ring_slots()) * w.bucket_ms();
    let b2 = w.bucket_index(later);
    assert_eq!(w.slot(b2), w.slot(b));
    // A late refund to the old bucket is expired, and the old bucket is forgotten.
    assert_eq!(c.record(K, b, -5, later), Ok(Recorded::Expired));
    assert!(c.publish(later).is_empty());
    assert!(c.is_empty(), "idle key forgotten");
    c.record(K, b2, 4, later).unwrap();
    let out = c.publish(later);
    assert_eq!(out, vec![(slot_key(K, w.slot(b2)), slot_value(b2, 4))]);
    assert_eq!(c.local_usage(K, later), 4);
}

#[test]
fn a_newer_bucket_keeps_its_slot_after_a_clock_step_back() {
    let mut c = counters();
    let w = *c.windows().base();
    let t = 1_000_000;
    let newer = w.bucket_index(t);
    c.record(K, newer, 10, t).unwrap();
    let back = t - 50_000;
    let older = newer - u64::from(w.ring_slots());
    assert!(w.counts(older, back) && w.counts(newer, back));
    assert_eq!(c.record(K, older, 5, back), Ok(Recorded::Expired));
    assert_eq!(c.local_usage(K, t), 10);
}

#[test]
fn demand_and_in_flight_are_published_when_they_change() {
    let mut c = counters();
    c.set_in_flight(K, 3).unwrap();
    c.set_demand(K, 0).unwrap();
    assert_eq!(c.publish(0), vec![(in_flight_key(K), "3".to_owned())]);
    c.set_in_flight(K, 0).unwrap();
    assert_eq!(c.publish(0), vec![(in_flight_key(K), "0".to_owned())]);
    // Kept one more publish (its 0 may have to go out again), then forgotten.
    assert!(!c.is_empty());
    assert!(c.publish(0).is_empty());
    assert!(c.is_empty(), "0 published, nothing counts: forgotten");
    c.set_demand(K, u64::MAX).unwrap();
    assert_eq!(c.publish(0), vec![(demand_key(K), scalar_value(MAX_COUNT))]);
}

#[test]
fn a_held_share_is_published_when_it_changes_and_a_zero_tracks_nothing() {
    let mut c = counters();
    c.set_held(K, 0).unwrap();
    assert!(c.is_empty(), "an idle key's 0 costs nothing");
    c.set_held(K, 14).unwrap();
    assert_eq!(c.publish(0), vec![(held_key(K), "e".to_owned())]);
    c.set_held(K, 14).unwrap();
    assert!(c.publish(0).is_empty(), "unchanged: nothing goes out");
    c.set_held(K, 0).unwrap();
    assert_eq!(c.publish(0), vec![(held_key(K), "0".to_owned())]);
    assert!(c.publish(0).is_empty());
    assert!(c.is_empty(), "0 published, nothing held: forgotten");
    assert!(c.set_held("bad key", 0).is_err(), "still validated");
}

#[test]
fn full_refuses_new_keys_until_one_goes_idle() {
    let w = Window::try_new(60_000, 60).unwrap();
    let mut c = LocalCounters::with_max_keys(w, 2);
    let t = 1_000_000;
    let b = w.bucket_index(t);
    c.record("a", b, 1, t).unwrap();
    c.set_in_flight("b", 1).unwrap();
    assert_eq!(
        c.record("c", b, 1, t),
        Err(RecordError::Full { max_keys: 2 })
    );
    assert_eq!(
        c.record("a", b, 1, t),
        Ok(Recorded::Changed),
        "known keys still work"
    );
    c.set_in_flight("b", 0).unwrap();
    c.publish(t);
    assert_eq!(c.record("c", b, 1, t), Ok(Recorded::Changed));
    assert_eq!(
        c.record("bad key", b, 1, t),
        Err(RecordError::Key(KeyError::BadByte { index: 3 }))
    );
}
