use super::*;
use crate::counter::Window;

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

/// A holder cut off from this owner may spend past the share it was told, up
/// to its floor, on its own side's grants; at the heal its account still
/// shows the figures from before the cut. The floor charges it until a
/// statement taken after the heal says what it spent: without it, this owner
/// grants the same room again (a CI partition run sent 81 of L = 80).
#[test]
fn a_healed_holder_is_charged_its_floor_until_it_states_again() {
    let w = Window::try_new(20_000, 40).expect("window");
    let config = LineConfig::try_new(80, Kind::Windowed(w), 80, 3, 500).expect("config");
    let mut l: Line<&'static str> = Line::new(config);
    let shares = |a, b| Terms {
        shares: BTreeMap::from([("a", a), ("b", b)]),
        ..Terms::default()
    };
    l.set_terms_at(shares(27, 53), 0);
    // a spent 14 and holds 1 more before the cut.
    l.sync(&"a", &statement(100, &[(0, 14)], 0, 1), 100)
        .expect("accepted");
    assert_eq!(l.charge_of(&"a", 100), 15);
    // The cut: a is charged its floor, 27.
    let cut = Terms {
        shares: BTreeMap::from([("b", 53)]),
        floors: BTreeMap::from([("a", 27)]),
        ..Terms::default()
    };
    l.set_terms_at(cut, 5_000);
    assert_eq!(l.committed(5_000), 27);
    // The heal: a is a member again, but has not stated since.
    l.set_terms_at(shares(27, 53), 9_000);
    assert_eq!(l.committed(9_000), 27, "its floor, not its stale 15");
    l.settle(9_100);
    assert_eq!(l.committed(9_100), 27, "settling keeps it");
    // A statement from before the heal (a late one) changes nothing.
    l.sync(&"a", &statement(8_000, &[(0, 14), (15, 2)], 0, 0), 9_200)
        .expect("accepted");
    assert_eq!(l.committed(9_200), 27);
    // One taken after it says what a spent during the cut: 16.
    l.sync(&"a", &statement(9_300, &[(0, 14), (15, 2)], 0, 0), 9_300)
        .expect("accepted");
    assert_eq!(l.committed(9_300), 16);
    l.settle(9_400);
    assert_eq!(l.committed(9_400), 16);
}

/// A healed holder that never states again is charged its floor until the
/// window has turned over since the heal, no longer.
#[test]
fn a_healed_floor_ends_a_window_after_the_heal() {
    let w = Window::try_new(1_000, 10).expect("window");
    let config = LineConfig::try_new(80, Kind::Windowed(w), 80, 3, 500).expect("config");
    let mut l: Line<&'static str> = Line::new(config);
    l.set_terms_at(
        Terms {
            floors: BTreeMap::from([("a", 30)]),
            ..Terms::default()
        },
        0,
    );
    l.set_terms_at(
        Terms {
            shares: BTreeMap::from([("a", 80)]),
            ..Terms::default()
        },
        2_000,
    );
    assert_eq!(l.committed(2_000), 30);
    assert_eq!(l.committed(3_099), 30);
    assert_eq!(l.committed(3_100), 0);
    l.settle(3_100);
    assert!(l.is_at_rest());
}

/// A departed member learned of after the line opened (its counters
/// republished by a peer) is charged as a rebuild charges one: its counters
/// and the credit it may not have reported, until they leave the window;
/// a member the line already holds is not charged twice.
#[test]
fn a_departed_member_learned_late_is_charged_as_a_rebuild_charges_it() {
    let mut l = line(100, 20);
    let a = &mut crate::lease::budget::Budget::new(
        l.config().kind(),
        crate::lease::budget::CutOffPolicy::Share,
    );
    state(&mut l, "a", a, 10, 0);
    assert_eq!(l.available(10), 90);
    // "x" spent 30 in bucket 0 under an owner nobody remembers.
    assert!(l.absorb_departed(&"x", &[(0, 30)], 10));
    assert_eq!(l.available(10), 90 - 30 - 20, "its counters and max_credit");
    assert!(!l.absorb_departed(&"x", &[(0, 30)], 20), "once");
    assert!(
        !l.absorb_departed(&"a", &[(0, 5)], 20),
        "a holder's account rules"
    );
    assert!(!l.absorb_departed(&"y", &[(0, 0)], 20), "nothing spent");
    assert!(!l.is_at_rest());
    // Its bucket 0 leaves the window at 1,100: then nothing of x is left.
    let _ = l.settle(1_100);
    assert_eq!(l.charge_of(&"x", 1_100), 0);
}
