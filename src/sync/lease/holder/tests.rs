use super::*;
use crate::sync::lease::owner::OwnerBook;
use parking_lot::Mutex;
use tollgate_cluster::membership::RPC_VERSION;

/// A lease node "a" whose view is `members`, with `tenants` tenants of two
/// leased keys each (requests, tokens), and a holder over them.
fn holder(tenants: usize) -> Holder {
    let mut text = String::from(
        r#"
[cluster]
cluster_id = "t"
node_id = "a"
gossip_listen = "127.0.0.1:1"
rpc_listen = "127.0.0.1:2"
seeds = []
secret = "holder-test-secret-0123456789abcdef"
mode = "lease"

[[upstreams]]
id = "u"
kind = "openai"
base_url = "http://127.0.0.1:1/v1"

[[routes]]
models = ["*"]
upstreams = ["u"]
"#,
    );
    for t in 0..tenants {
        text.push_str(&format!(
            "[[tenants]]\nid = \"t{t}\"\napi_key_hashes = [\"sha256:{t:064x}\"]\nrpm = 100\ntpm = 1000\n"
        ));
    }
    let config = crate::config::Config::from_toml(&text, "test.toml").expect("config");
    let config_cluster = config.cluster.clone();
    let state = Arc::new(crate::server::build::node_state(config).expect("state"));
    let state = Arc::new(state.sync_parts(None));
    let window = tollgate_cluster::counter::Window::try_new(60_000, 60).expect("window");
    let keys = super::super::owner::KeyTable::new(state.bindings.clone(), window, 0.25, 3_000)
        .expect("keys");
    let view = Arc::new(RwLock::new(view(&["a", "b"])));
    let book = OwnerBook::new(
        keys,
        view.clone(),
        Arc::new(Mutex::new(tollgate_cluster::counter::ClusterUsage::new(
            window,
        ))),
        state.registry.clock(),
        state.metrics.clone(),
        None,
        None,
    );
    let cluster = (config_cluster.as_ref()).expect("[cluster]");
    let auth = crate::sync::auth::RpcAuth::new(cluster).expect("keys");
    let settings = HolderSettings {
        cluster_id: "t".into(),
        auth: Arc::new(auth),
        sync_interval: Duration::from_millis(200),
        ttl: Duration::from_secs(3),
        window_ms: 60_000,
        max_credit: 0.25,
        rpc_timeout: Duration::from_millis(100),
    };
    Holder::new(
        state,
        Box::new(PeerOwners::new(Arc::new(book))),
        view,
        settings,
    )
}

fn view(members: &[&str]) -> Arc<View> {
    Arc::new(View {
        self_id: "a".into(),
        members: (members.iter())
            .map(|m| MemberAddr {
                id: (*m).into(),
                rpc: format!("127.0.0.1:1/{m}"),
                rpc_version: RPC_VERSION,
            })
            .collect(),
        settled: true,
        ..View::default()
    })
}

fn leased(holder: &Holder) -> Vec<u32> {
    (0..holder.node.bindings.len() as u32).collect()
}

/// `owner`'s answers to `keys`, each accepted (`Ok`) or refused with `code`.
fn answer(holder: &mut Holder, owner: &str, keys: &[u32], code: Option<&str>) {
    let owner = MemberAddr {
        id: owner.into(),
        rpc: String::new(),
        rpc_version: RPC_VERSION,
    };
    let items = (keys.iter())
        .map(|i| (*i as usize, nothing_held(1, 1)))
        .collect();
    let reply = SyncReply {
        credit: 0,
        granted: 0,
        ttl_ms: 3_000,
        cut_off_share: 0,
    };
    let answers = (keys.iter())
        .map(|_| code.map_or(Ok(reply), |c| Err(c.to_owned())))
        .collect();
    holder.adopt(&owner, items, Ok(answers));
}

#[tokio::test]
async fn an_unused_key_is_stated_again_only_when_its_owner_moves_or_refuses() {
    let mut holder = holder(30);
    let all = leased(&holder);
    assert_eq!(all.len(), 60);
    // At start every key is stated (a new owner waits to hear from all).
    let two = view(&["a", "b"]);
    holder.mark_moved(&two);
    assert_eq!(holder.unused_to_state(Round::Normal), all);
    for owner in ["a", "b"] {
        let owned: Vec<u32> = (all.iter().copied())
            .filter(|i| {
                two.owner(&holder.node.bindings[*i as usize].key)
                    .unwrap()
                    .id
                    == owner
            })
            .collect();
        answer(&mut holder, owner, &owned, None);
    }
    assert!(
        holder.unused_to_state(Round::Normal).is_empty(),
        "all settled"
    );
    holder.mark_moved(&two);
    assert!(
        holder.unused_to_state(Round::Normal).is_empty(),
        "same members"
    );
    // c joins: exactly the keys it takes are stated (to c).
    let three = view(&["a", "b", "c"]);
    holder.mark_moved(&three);
    let moved: Vec<u32> = (all.iter().copied())
        .filter(|i| {
            let key = &holder.node.bindings[*i as usize].key;
            two.owner(key).unwrap().id != three.owner(key).unwrap().id
        })
        .collect();
    assert!(!moved.is_empty() && moved.len() < all.len(), "{moved:?}");
    assert_eq!(holder.unused_to_state(Round::Normal), moved);
    // Refused (c's view lags): stated again; unreachable: still unsettled.
    answer(&mut holder, "c", &moved[..1], Some("not_owner"));
    holder.adopt(
        &three.members[2],
        moved[1..]
            .iter()
            .map(|i| (*i as usize, nothing_held(2, 2)))
            .collect(),
        Err(CallError::Unreachable("down".into())),
    );
    assert_eq!(holder.unused_to_state(Round::Normal), moved);
    answer(&mut holder, "c", &moved, None);
    assert!(holder.unused_to_state(Round::Normal).is_empty());
    // A refusal after an acceptance (views differ for a moment) states it again.
    answer(&mut holder, "c", &moved[..1], Some("not_owner"));
    assert_eq!(holder.unused_to_state(Round::Normal), moved[..1]);
}

/// A holder of `tenants` tenants on members a and b, whose key 0's owner
/// accepted "nothing held" (the others' have not yet): the view, that owner
/// and the node's credit table.
fn key_0_settled(tenants: usize) -> (Holder, Arc<View>, String, Arc<CreditTable>) {
    let mut holder = holder(tenants);
    let two = view(&["a", "b"]);
    holder.mark_moved(&two);
    let owner0 = two.owner(&holder.node.bindings[0].key).unwrap().id.clone();
    answer(&mut holder, &owner0, &[0], None);
    let table = holder.node.credits.clone().expect("lease table");
    (holder, two, owner0, table)
}

#[tokio::test]
async fn a_credit_made_after_its_owner_heard_nothing_held_starts_with_that_owner() {
    let (mut holder, two, owner0, table) = key_0_settled(2);
    let (first, second) = (table.get_or_make(0), table.get_or_make(1));
    holder.take_new_credits(&two);
    let owner_of = |i: u32| holder.active[&i].owner.as_deref().map(str::to_owned);
    assert_eq!(owner_of(0), Some(owner0));
    assert_eq!(owner_of(1), None, "stated to its owner first");
    assert_eq!(
        holder.unused_to_state(Round::Normal),
        vec![2, 3],
        "only unused keys"
    );
    // Used keys keep their own owner: a members change marks no bit for them.
    holder.mark_moved(&view(&["a", "b", "c", "d", "e"]));
    assert!(
        holder
            .unused_to_state(Round::Normal)
            .iter()
            .all(|i| *i >= 2)
    );
    // Their answers reach their budgets; an unreachable owner cuts them off.
    let b = &two.members[1];
    holder.adopt(
        b,
        vec![(0, nothing_held(3, 3)), (1, nothing_held(3, 3))],
        Err(CallError::Unreachable("down".into())),
    );
    assert!(first.with(|b| b.is_cut_off()) && second.with(|b| b.is_cut_off()));
    holder.take_new_credits(&two);
    assert_eq!(holder.active.len(), 2, "each credit taken once");
}

#[tokio::test]
async fn a_used_key_at_rest_is_dropped_and_its_next_credit_states_above_it() {
    let (mut holder, two, owner0, table) = key_0_settled(1);
    let actor = table.get_or_make(0);
    holder.take_new_credits(&two);
    actor.with(|b| b.keep_seq_above(5_000));
    holder.drop_at_rest(0, 1);
    assert!(holder.active.contains_key(&0), "its actor still runs");
    drop(actor);
    holder.drop_at_rest(0, 1);
    assert!(
        holder.active.is_empty() && table.get(0).is_none(),
        "dropped"
    );
    assert!(
        !holder.unused_to_state(Round::Normal).contains(&0),
        "still settled"
    );
    assert!(
        holder.nothing_held_seq >= 5_000,
        "{}",
        holder.nothing_held_seq
    );
    // Used again: a new credit, starting with the owner that heard the last.
    let _again = table.get_or_make(0);
    holder.take_new_credits(&two);
    assert_eq!(holder.active[&0].owner.as_deref(), Some(owner0.as_str()));
}

/// Only a refused statement that carried an actor's ask is asked in vain:
/// the one unit a key in use asks to keep its figure, granted nothing, is
/// not: a nudge would otherwise turn that unit into a horizon's worth of
/// credit, through `Credit::ask_again` (docs/design/lease.md, "Room offered
/// as it comes back").
#[tokio::test]
async fn only_a_refused_actors_ask_is_asked_in_vain() {
    let (mut holder, two, owner0, table) = key_0_settled(1);
    let _actor = table.get_or_make(0);
    holder.take_new_credits(&two);
    let owner = (two.members.iter())
        .find(|m| m.id == owner0)
        .unwrap()
        .clone();
    let nothing_granted = SyncReply {
        credit: 0,
        granted: 0,
        ttl_ms: 3_000,
        cut_off_share: 5,
    };
    for (asked, in_vain) in [(None, false), (Some(0), true), (Some(40), true)] {
        holder.active.get_mut(&0).unwrap().asked = asked;
        let mut asks_one_unit = nothing_held(10, 10);
        asks_one_unit.request.want = 1;
        holder.adopt(
            &owner,
            vec![(0, asks_one_unit)],
            Ok(vec![Ok(nothing_granted)]),
        );
        assert_eq!(holder.active[&0].asked_in_vain, in_vain, "asked {asked:?}");
    }
}

fn inputs() -> TargetInputs {
    TargetInputs {
        demand: 0,
        window_ms: 60_000,
        horizon_ms: 400,
        spent_since: 0,
        elapsed_ms: None,
        wanted: false,
        wanted_cost: 0,
        last_target: 0,
        cap: 1_000_000,
    }
}

#[test]
fn the_credit_horizon_is_four_intervals_but_at_most_a_fiftieth_of_the_window() {
    let interval = Duration::from_millis(200);
    // A minute: four intervals (1.3% of W).
    assert_eq!(horizon_ms(interval, 60_000), 800);
    // The harness's 5 s window: 100 ms, not 16% of W.
    assert_eq!(horizon_ms(interval, 5_000), 100);
    // A per-second limit: 20 ms; never 0.
    assert_eq!(horizon_ms(interval, 1_000), 20);
    assert_eq!(horizon_ms(interval, 10), 1);
}

#[test]
fn a_key_asked_in_vain_waits_for_the_intervals_round_once() {
    let mut flag = true;
    let woken = |flag: &mut bool, recorded: Option<&str>| {
        waits_for_the_interval(flag, recorded, "b", Round::Woken)
    };
    assert!(woken(&mut flag, Some("b")), "same owner: waits");
    assert!(
        woken(&mut flag, None),
        "refused per key (no owner recorded): waits"
    );
    assert!(
        !woken(&mut flag, Some("c")),
        "its owner moved: asks the new one"
    );
    assert!(!waits_for_the_interval(
        &mut flag,
        Some("b"),
        "b",
        Round::Normal
    ));
    assert!(!flag, "the interval's round forgets it");
    assert!(!woken(&mut flag, Some("b")), "a later burst asks at once");
    let mut flag = true;
    assert!(!waits_for_the_interval(
        &mut flag,
        Some("b"),
        "b",
        Round::ReturnAll
    ));
}

#[test]
fn an_owner_is_left_to_the_intervals_rounds_after_two_failures_in_a_row() {
    let mut holder = holder(1);
    let owner = MemberAddr {
        id: "b".into(),
        rpc: String::new(),
        rpc_version: RPC_VERSION,
    };
    let down = CallError::Unreachable("refused".into());
    let skipped = |h: &Holder| {
        if h.retried_next_round(&owner, Round::Woken) {
            "woken: skipped"
        } else {
            "woken: sent"
        }
    };
    assert_eq!(skipped(&holder), "woken: sent");
    holder.note_batches(&owner, Some(&down));
    assert_eq!(
        skipped(&holder),
        "woken: sent",
        "one failure is retried at once"
    );
    holder.note_batches(&owner, Some(&down));
    assert_eq!(skipped(&holder), "woken: skipped");
    assert!(
        !holder.retried_next_round(&owner, Round::Normal),
        "every interval"
    );
    assert!(!holder.retried_next_round(&owner, Round::ReturnAll));
    holder.note_batches(&owner, None);
    assert_eq!(skipped(&holder), "woken: sent", "an answer clears it");
}

#[test]
fn the_target_follows_the_faster_of_the_window_and_the_recent_rate() {
    // 60,000 per window: 1,000/s, 400 for the horizon.
    let steady = TargetInputs {
        demand: 60_000,
        ..inputs()
    };
    assert_eq!(credit_target(&steady), 400);
    // Just started (window nearly empty) but spending 9,000/s: 3,600.
    let ramp = TargetInputs {
        demand: 900,
        spent_since: 900,
        elapsed_ms: Some(100),
        ..inputs()
    };
    assert_eq!(credit_target(&ramp), 3_600);
    assert_eq!(credit_target(&TargetInputs { cap: 1_000, ..ramp }), 1_000);
}

#[test]
fn a_holder_that_ran_dry_doubles_its_target() {
    let dry = TargetInputs {
        wanted: true,
        wanted_cost: 1,
        last_target: 60,
        ..inputs()
    };
    assert_eq!(credit_target(&dry), 120);
    // Only ran low (the ordinary refill): no doubling.
    let low = TargetInputs {
        wanted_cost: 0,
        ..dry
    };
    assert_eq!(credit_target(&low), 1);
    // At least the one request that could not be paid, and at least 1.
    let big = TargetInputs {
        wanted_cost: 5_000,
        ..dry
    };
    assert_eq!(credit_target(&big), 5_000);
    let first = TargetInputs {
        wanted: true,
        wanted_cost: 1,
        ..inputs()
    };
    assert_eq!(credit_target(&first), 1);
    assert_eq!(credit_target(&inputs()), 0, "idle: nothing");
}
