use super::*;

fn windowed(policy: CutOffPolicy) -> Budget {
    let w = Window::try_new(1_000, 10).expect("window");
    Budget::new(Kind::Windowed(w), policy)
}

/// An owner's reply: `credit` in all, of which `granted` new, telling
/// `cut_off_share`, for 500 ms.
fn reply(credit: u64, granted: u64, cut_off_share: u64) -> SyncReply {
    SyncReply {
        credit,
        granted,
        ttl_ms: 500,
        cut_off_share,
    }
}

fn grant(b: &mut Budget, credit: u64, now: u64) {
    let snap = b.snapshot(credit, now);
    b.apply(&snap, &reply(credit, credit, 0), now);
}

#[test]
fn credit_is_spent_refunded_and_ends_at_send_time_plus_ttl() {
    let mut b = windowed(CutOffPolicy::Share);
    assert!(b.try_spend(1, 0).is_none(), "nothing before a grant");
    grant(&mut b, 10, 0);
    let s = b.try_spend(8, 100).expect("fits");
    assert!(b.try_spend(3, 100).is_none());
    b.settle(s, 8, 5, 100);
    assert_eq!((b.credit(100), b.used(100)), (5, 5));
    assert_eq!(b.credit(500), 0, "ends at send time + ttl");
    assert!(b.try_spend(1, 500).is_none());
}

#[test]
fn nothing_is_spent_from_a_credit_after_a_statement_stamped_past_its_end() {
    let mut b = windowed(CutOffPolicy::Share);
    grant(&mut b, 10, 0); // ends at 0 + 500
    // Many statements in one ms run seq ahead of the clock: once one is
    // stamped at 500, the owner reads it as holding all spent from the credit.
    let mut snap = b.snapshot(0, 10);
    while snap.request.seq < 500 {
        assert_eq!(b.credit(10), 10);
        snap = b.snapshot(0, 10);
    }
    assert_eq!((b.credit(10), snap.request.remaining), (0, 0));
    assert!(b.try_spend(1, 10).is_none());
    // A late reply to an earlier statement, adopted after one stamped past the
    // end of the credit it grants, grants nothing to spend either.
    let early = b.snapshot(5, 20);
    let reply = reply(5, 5, 0);
    while b.snapshot(0, 20).request.seq < 520 {}
    b.apply(&early, &reply, 20);
    assert_eq!(b.credit(20), 0);
}

#[test]
fn redate_moves_usage_to_the_answer_and_spends_again_what_had_left() {
    let mut b = windowed(CutOffPolicy::Share);
    grant(&mut b, 20, 0);
    // Buckets of 100 ms in a 1 s window.
    let s = b.try_spend(4, 100).expect("fits");
    let moved = b.redate(s, 4, 250);
    assert_eq!((s.bucket, moved.bucket), (1, 2));
    assert_eq!(b.credit(300), 16, "a move spends no credit");
    assert_eq!(b.snapshot(0, 300).request.usage, vec![(2, 4)]);
    // Settling corrects the new bucket.
    b.settle(moved, 4, 1, 300);
    assert_eq!(b.snapshot(0, 301).request.usage, vec![(2, 1)]);
    assert_eq!(b.credit(302), 19);
    // A spend whose bucket left the window (bucket 3 counts until 1.4 s) is
    // spent again in the bucket of the answer.
    let late = b.try_spend(2, 310).expect("fits");
    let again = b.redate(late, 2, 1_400);
    assert_eq!(again.bucket, 14);
    assert_eq!(b.used(1_400), 2, "only the re-spent 2 count");
    assert!(b.snapshot(0, 1_400).request.usage.contains(&(14, 2)));
}

#[test]
fn a_lowered_told_share_is_confirmed_by_one_more_statement() {
    let mut b = windowed(CutOffPolicy::Share);
    let first = b.snapshot(5, 0);
    b.apply(
        &first,
        &SyncReply {
            credit: 5,
            granted: 5,
            ttl_ms: 500,
            cut_off_share: 5,
        },
        0,
    );
    assert!(!b.owes_statement(), "a higher figure needs no confirmation");
    // Still holding credit, it states; the owner tells 0 this time (say its
    // share went to others).
    let second = b.snapshot(1, 400);
    b.apply(
        &second,
        &SyncReply {
            credit: 5,
            granted: 0,
            ttl_ms: 500,
            cut_off_share: 0,
        },
        400,
    );
    // The owner still charges 5 until it reads that this reply was adopted.
    assert!(b.owes_statement());
    assert!(!b.is_at_rest(10_000), "not dropped before it confirms");
    let confirm = b.snapshot(0, 10_000);
    assert_eq!(confirm.request.adopted, second.request.seq);
    assert!(!b.owes_statement());
    assert!(b.is_at_rest(10_000));
    // Giving everything back needs no confirmation: the owner drops every
    // figure as it reads that statement.
    let mut g = windowed(CutOffPolicy::Share);
    let first = g.snapshot(5, 0);
    g.apply(&first, &reply(5, 5, 5), 0);
    let back = g.snapshot(0, 600);
    g.apply(&back, &reply(0, 0, 0), 600);
    assert!(!g.owes_statement());
}

/// A key that spent in the window keeps its figure across a statement made
/// with nothing held and nothing wanted (a confirmation, or a heartbeat
/// after a quiet spell that gave its credit back): it asks one unit, so the
/// owner keeps the figure and a cut that comes next leaves it serving. Only
/// once its spending has left the window, or as its node stops, does such
/// a statement give everything back.
#[test]
fn a_key_in_use_keeps_its_figure_until_its_window_empties_or_its_node_stops() {
    let mut b = windowed(CutOffPolicy::Share);
    let first = b.snapshot(5, 0);
    b.apply(&first, &reply(5, 5, 5), 0);
    b.try_spend(2, 100).expect("fits");
    // The owner lowers the figure and takes the credit (it told 2 + 1 the
    // last time it granted one unit): one more statement is owed.
    let second = b.snapshot(0, 200);
    b.apply(&second, &reply(0, 0, 3), 200);
    assert!(b.owes_statement());
    b.return_credit(300);
    let confirm = b.snapshot(0, 300);
    assert_eq!((confirm.request.remaining, confirm.request.want), (0, 1));
    assert_eq!(b.told_share(), 3, "kept while the owner still tells it");
    b.cut_off_by_owner();
    assert!(b.try_spend(1, 400).is_some(), "served on its figure: 2 + 1");
    assert!(b.try_spend(1, 400).is_none(), "and no more");
    b.set_cut_off(None);
    // Its spending has left the window (1 s here): a give-back.
    let later = b.snapshot(0, 1_500);
    assert_eq!(later.request.want, 0);
    assert_eq!(b.told_share(), 0);
    // A stopping node gives back whatever it spent.
    let mut s = windowed(CutOffPolicy::Share);
    let first = s.snapshot(5, 0);
    s.apply(&first, &reply(5, 5, 5), 0);
    s.try_spend(2, 100).expect("fits");
    let last = s.final_snapshot(200);
    assert_eq!((last.request.remaining, last.request.want), (0, 0));
    assert_eq!(s.told_share(), 0);
}

#[test]
fn spending_between_snapshot_and_reply_is_subtracted() {
    let mut b = windowed(CutOffPolicy::Share);
    grant(&mut b, 10, 0);
    let snap = b.snapshot(5, 100);
    b.try_spend(4, 110).expect("fits");
    let reply = reply(15, 5, 0);
    b.apply(&snap, &reply, 120);
    assert_eq!(b.credit(120), 11);
    assert_eq!(b.until_ms(), 600);
}

#[test]
fn cut_off_policies() {
    for (policy, admitted) in [
        (CutOffPolicy::Share, 3),
        (CutOffPolicy::FailClosed, 0),
        (CutOffPolicy::FailOpen, 102),
    ] {
        let mut b = windowed(policy);
        grant(&mut b, 2, 0);
        b.set_cut_off(Some(5));
        assert!(b.try_spend(2, 100).is_some_and(|s| s.from_credit));
        let mut n = 0;
        // The credit first (2), then the share (5 per window, 2 already used).
        while n < 102 && b.try_spend(1, 600 + n).is_some() {
            n += 1;
        }
        assert_eq!(n, admitted, "{policy:?} after the credit ended");
        b.set_cut_off(None);
        assert!(b.try_spend(1, 800).is_none(), "{policy:?}: reachable again");
    }
    let mut b = windowed(CutOffPolicy::Share);
    grant(&mut b, 2, 0);
    b.set_cut_off(Some(5));
    assert!(b.try_spend(2, 100).is_some_and(|s| s.from_credit));
    assert_eq!((1..=3).filter(|_| b.try_spend(1, 600).is_some()).count(), 3);
    assert!(b.try_spend(1, 600).is_none(), "5 in the window");
    // Buckets are 100 ms: the credit's bucket 1 leaves at 1,200, bucket 6 at 1,700.
    assert!(b.try_spend(2, 1_200).is_some() && b.try_spend(1, 1_200).is_none());
    assert!(b.try_spend(3, 1_700).is_some(), "the share is per window");
}

#[test]
fn the_told_share_is_the_cut_off_share_until_the_owner_changes() {
    let mut b = windowed(CutOffPolicy::Share);
    let snap = b.snapshot(2, 0);
    let reply = reply(2, 2, 5);
    b.apply(&snap, &reply, 0);
    assert_eq!(b.told_share(), 5);
    b.cut_off_by_owner();
    // The credit (2), then the told share: 5 in the window in all, and again
    // once those left the window (it binds until the owner hears again).
    assert_eq!((0..10).filter(|_| b.try_spend(1, 400).is_some()).count(), 5);
    assert_eq!(
        (0..10).filter(|_| b.try_spend(1, 1_500).is_some()).count(),
        5
    );
    // The next statement says which reply it holds.
    assert_eq!(b.snapshot(1, 1_600).request.adopted, snap.request.seq);
    // The key moved: the new owner keeps nothing for this holder.
    b.owner_changed();
    assert_eq!((b.told_share(), b.is_cut_off()), (0, false));
    b.cut_off_by_owner();
    assert!(b.try_spend(1, 2_700).is_none());
    // Giving everything back drops the figure as the statement is taken, but
    // not while cut off (it may be serving on it): it asks one unit instead.
    let snap = b.snapshot(0, 2_800);
    b.apply(&snap, &reply, 2_800);
    b.return_credit(2_900);
    b.cut_off_by_owner();
    let kept = b.snapshot(0, 2_900);
    assert_eq!((kept.request.want, b.told_share()), (1, 5));
    b.set_cut_off(None);
    let back = b.snapshot(0, 2_950);
    assert_eq!((back.request.remaining, back.request.want), (0, 0));
    assert_eq!(b.told_share(), 0);
    b.cut_off_by_owner();
    assert!(b.try_spend(1, 4_000).is_none(), "cut off, nothing beyond");
}

#[test]
fn returned_credit_is_stated_as_nothing_left() {
    let mut b = windowed(CutOffPolicy::Share);
    grant(&mut b, 10, 0);
    b.try_spend(3, 10).expect("fits");
    b.return_credit(20);
    assert!(b.try_spend(1, 20).is_none());
    let snap = b.snapshot(0, 30);
    assert_eq!((snap.request.remaining, b.used(30)), (0, 3));
    let mut s = Budget::new(Kind::Slots, CutOffPolicy::Share);
    grant(&mut s, 3, 0);
    s.try_spend(1, 10).expect("slot");
    s.return_credit(20);
    assert_eq!(s.credit(20), 1, "the slot in use is kept");
}

#[test]
fn slots_are_held_until_ttl_and_returned_on_settle() {
    let mut b = Budget::new(Kind::Slots, CutOffPolicy::Share);
    grant(&mut b, 2, 0);
    let a = b.try_spend(1, 10).expect("slot 1");
    b.try_spend(1, 10).expect("slot 2");
    assert!(b.try_spend(1, 10).is_none());
    b.settle(a, 1, 1, 10);
    assert!(b.can_spend(1, 10));
    assert!(!b.can_spend(1, 500), "slots end with the credit");
    assert_eq!(b.snapshot(1, 20).request.remaining, 1, "in use is stated");
}
