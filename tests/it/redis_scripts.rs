//! The Lua scripts against a real redis-server (and a real 3-shard Redis Cluster)
//! started by the tests: window boundaries, refunds, debt, all-or-nothing, GCRA,
//! the exact log's retry-after, ghost slots expiring, NOSCRIPT after SCRIPT FLUSH,
//! concurrent callers from several clients, and a stalled Redis timing out.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::redis::{RedisCluster, RedisServer};
use std::time::Duration;
use tollgate::actor::scope::Cost;
use tollgate::redis::{
    Algorithm, DimSpec, LeaseAsk, Leased, RedisStore, Reservation, Reserve, Reserved, ScopeKeys,
    Settled,
};

const TIMEOUT: Duration = Duration::from_millis(500);

fn store(server: &RedisServer) -> RedisStore {
    RedisStore::single(&server.url(), TIMEOUT, None).unwrap()
}

fn window(capacity: u64) -> DimSpec {
    DimSpec {
        algorithm: Algorithm::Window { bucket_ms: 100 },
        capacity,
        window_ms: 1_000,
    }
}

fn reservation(requests: DimSpec, tokens: DimSpec, token_cost: u64) -> Reservation {
    Reservation {
        windows: [
            requests,
            tokens,
            DimSpec::NONE,
            DimSpec::NONE,
            DimSpec::NONE,
            DimSpec::NONE,
        ],
        cost: Cost {
            input: token_cost,
            output: 0,
            output_cap: 0,
        },
        concurrency: 0,
        permit_id: String::new(),
        slot_ttl_ms: 0,
    }
}

/// What a settlement says the request came to: `requests` (1 sent, 0 never)
/// and `tokens`.
fn settled(requests: u64, tokens: u64) -> Settled {
    Settled {
        requests,
        tokens: Cost {
            input: tokens,
            output: 0,
            output_cap: 0,
        },
    }
}

fn admitted(r: &Reserved) -> [String; 6] {
    match r {
        Reserved::Admitted { refs, .. } => refs.clone(),
        other => panic!("expected admission, got {other:?}"),
    }
}

fn refused(r: &Reserved) -> (String, Option<u64>) {
    match r {
        Reserved::Refused {
            dimension,
            retry_after_ms,
        } => (dimension.clone(), *retry_after_ms),
        other => panic!("expected refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn window_admits_its_capacity_then_refuses_with_the_time_until_room() {
    let server = RedisServer::start();
    let s = store(&server);
    let keys = ScopeKeys::new("tg", "tenant:w");
    let r = reservation(window(5), DimSpec::NONE, 0);
    for _ in 0..5 {
        admitted(&s.reserve(&keys, &r).await.unwrap());
    }
    let (dim, retry) = refused(&s.reserve(&keys, &r).await.unwrap());
    assert_eq!(dim, "requests");
    // The bucket holding the five counts until its end has left the window: within
    // (W - w, W + w] from now.
    let retry = retry.unwrap();
    assert!((900..=1_100).contains(&retry), "retry {retry}");
    tokio::time::sleep(Duration::from_millis(retry)).await;
    admitted(&s.reserve(&keys, &r).await.unwrap());
    // A cost above the capacity can never fit.
    let big = reservation(DimSpec::NONE, window(10), 11);
    assert_eq!(
        refused(&s.reserve(&keys, &big).await.unwrap()),
        ("tokens".into(), None)
    );
}

#[tokio::test]
async fn a_settlement_moves_the_charge_to_when_the_upstream_answered() {
    // The provider counts a request when it arrives, by the answer at the latest:
    // settled with the answer's time, the charge counts a window from there.
    let server = RedisServer::start();
    let s = store(&server);
    let log = DimSpec {
        algorithm: Algorithm::Log,
        capacity: 50,
        window_ms: 1_000,
    };
    for (name, tokens) in [("window", window(50)), ("log", log)] {
        let keys = ScopeKeys::new("tg", &format!("tenant:answered-{name}"));
        let r = reservation(window(5), tokens, 10);
        let mut refs = Vec::new();
        for _ in 0..5 {
            refs.push(admitted(&s.reserve(&keys, &r).await.unwrap()));
        }
        // One is answered 600 ms after its admission.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let corrections = s
            .settle(&keys, &r, &refs[0], settled(1, 10), Some(0))
            .await
            .unwrap();
        assert_eq!(
            corrections,
            [0, 0, 0, 0, 0, 0],
            "{name}: moved, not changed"
        );
        // Past the admissions' window: the four others have left, the answered
        // one still counts (requests and tokens), until a window after its answer.
        tokio::time::sleep(Duration::from_millis(600)).await;
        for _ in 0..4 {
            admitted(&s.reserve(&keys, &r).await.unwrap());
        }
        let (dim, retry) = refused(&s.reserve(&keys, &r).await.unwrap());
        assert_eq!(dim, "requests", "{name}");
        let retry = retry.unwrap();
        assert!((300..=600).contains(&retry), "{name}: retry {retry}");
        let only_tokens = reservation(DimSpec::NONE, tokens, 11);
        assert_eq!(
            refused(&s.reserve(&keys, &only_tokens).await.unwrap()).0,
            "tokens",
            "{name}: 50 - 40 - the answered 10 < 11"
        );
    }
}

#[tokio::test]
async fn a_refusal_that_recycles_buckets_keeps_the_window_sum_exact() {
    let server = RedisServer::start();
    let s = store(&server);
    let keys = ScopeKeys::new("tg", "tenant:n");
    let tokens = |cost| reservation(DimSpec::NONE, window(5), cost);
    admitted(&s.reserve(&keys, &tokens(3)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    admitted(&s.reserve(&keys, &tokens(2)).await.unwrap());
    // The first bucket leaves the window (1.1 s after it started): 2 still count.
    tokio::time::sleep(Duration::from_millis(700)).await;
    // This call recycles the first bucket's slot and is refused (2 + 4 > 5)...
    assert_eq!(
        refused(&s.reserve(&keys, &tokens(4)).await.unwrap()).0,
        "tokens"
    );
    // ...and the window still knows only 2 count: 3 more fit, not fewer.
    admitted(&s.reserve(&keys, &tokens(3)).await.unwrap());
    assert_eq!(
        refused(&s.reserve(&keys, &tokens(1)).await.unwrap()).0,
        "tokens"
    );
}

#[tokio::test]
async fn all_or_nothing_refunds_and_debt_go_to_the_reservations_bucket() {
    let server = RedisServer::start();
    let s = store(&server);
    let keys = ScopeKeys::new("tg", "tenant:t");
    let r = reservation(window(100), window(1_000), 600);
    let first = admitted(&s.reserve(&keys, &r).await.unwrap());
    // 600 + 600 > 1000 tokens: refused, and the request dimension is not charged.
    assert_eq!(refused(&s.reserve(&keys, &r).await.unwrap()).0, "tokens");
    // Settle the first at 100 real tokens: 500 refunded into its bucket.
    let corrections = s
        .settle(&keys, &r, &first, settled(1, 100), None)
        .await
        .unwrap();
    assert_eq!(corrections, [0, -500, 0, 0, 0, 0]);
    let second = admitted(&s.reserve(&keys, &r).await.unwrap());
    // 700 used; a debt of 300 on the second fills the window exactly.
    s.settle(&keys, &r, &second, settled(1, 900), None)
        .await
        .unwrap();
    let one = reservation(DimSpec::NONE, window(1_000), 1);
    assert_eq!(refused(&s.reserve(&keys, &one).await.unwrap()).0, "tokens");
    // Two requests were charged, never the refused one: 98 more fit, not 99.
    let req = reservation(window(100), DimSpec::NONE, 0);
    for _ in 0..98 {
        admitted(&s.reserve(&keys, &req).await.unwrap());
    }
    assert_eq!(
        refused(&s.reserve(&keys, &req).await.unwrap()).0,
        "requests"
    );
}

#[tokio::test]
async fn gcra_spaces_requests_by_the_emission_interval() {
    let server = RedisServer::start();
    let s = store(&server);
    let keys = ScopeKeys::new("tg", "tenant:g");
    let gcra = DimSpec {
        algorithm: Algorithm::Gcra { burst: 10 },
        capacity: 10,
        window_ms: 1_000,
    };
    let r = reservation(gcra, DimSpec::NONE, 0);
    for _ in 0..10 {
        admitted(&s.reserve(&keys, &r).await.unwrap());
    }
    let (_, retry) = refused(&s.reserve(&keys, &r).await.unwrap());
    // One emission interval (100 ms) minus the little time that passed.
    assert!((50..=100).contains(&retry.unwrap()), "{retry:?}");
    tokio::time::sleep(Duration::from_millis(retry.unwrap())).await;
    admitted(&s.reserve(&keys, &r).await.unwrap());
}

#[tokio::test]
async fn the_exact_log_says_when_enough_cost_has_left_not_just_the_oldest_entry() {
    let server = RedisServer::start();
    let s = store(&server);
    let keys = ScopeKeys::new("tg", "tenant:l");
    let log = DimSpec {
        algorithm: Algorithm::Log,
        capacity: 10,
        window_ms: 1_000,
    };
    let three = reservation(DimSpec::NONE, log, 3);
    admitted(&s.reserve(&keys, &three).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    admitted(&s.reserve(&keys, &three).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    admitted(&s.reserve(&keys, &three).await.unwrap());
    // 9 used at t = 0, 300, 600; 5 more need 4 freed: the first two entries
    // (3 + 3), so the time until the *second* leaves (t = 1300, ~700 ms from now),
    // not the oldest (t = 1000, ~400 ms), which would only free 3.
    let five = reservation(DimSpec::NONE, log, 5);
    let retry = refused(&s.reserve(&keys, &five).await.unwrap()).1.unwrap();
    assert!((600..=720).contains(&retry), "retry {retry}");
    tokio::time::sleep(Duration::from_millis(retry)).await;
    admitted(&s.reserve(&keys, &five).await.unwrap());
}

#[tokio::test]
async fn ghost_slots_expire_and_heartbeats_keep_live_ones() {
    let server = RedisServer::start();
    let s = store(&server);
    let key = ScopeKeys::new("tg", "tenant:s").concurrency;
    assert_eq!(s.semaphore(&key, "acquire", "a", 2, 300).await.unwrap(), 0);
    assert_eq!(s.semaphore(&key, "acquire", "b", 2, 300).await.unwrap(), 0);
    let retry = s.semaphore(&key, "acquire", "c", 2, 300).await.unwrap();
    assert!((1..=300).contains(&retry), "retry {retry}");
    // a keeps beating, b's holder crashed: b's slot comes back by itself.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            s.semaphore(&key, "heartbeat", "a", 0, 300).await.unwrap(),
            1
        );
    }
    assert_eq!(s.semaphore(&key, "acquire", "c", 2, 300).await.unwrap(), 0);
    assert_eq!(
        s.semaphore(&key, "heartbeat", "b", 0, 300).await.unwrap(),
        0,
        "b expired"
    );
    assert_eq!(s.semaphore(&key, "release", "a", 0, 0).await.unwrap(), 1);
    assert_eq!(s.semaphore(&key, "acquire", "d", 2, 300).await.unwrap(), 0);
}

#[tokio::test]
async fn scripts_reload_after_script_flush() {
    let server = RedisServer::start();
    let s = store(&server);
    let keys = ScopeKeys::new("tg", "tenant:f");
    let r = reservation(window(10), DimSpec::NONE, 0);
    admitted(&s.reserve(&keys, &r).await.unwrap());
    let _: () = s.command(redis::cmd("SCRIPT").arg("FLUSH")).await.unwrap();
    let loaded: Vec<bool> = s
        .command(
            redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(tollgate::redis::scripts::RESERVE.get_hash()),
        )
        .await
        .unwrap();
    assert_eq!(loaded, vec![false], "flushed");
    admitted(&s.reserve(&keys, &r).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_from_several_clients_never_exceed_the_capacity() {
    let server = RedisServer::start();
    let keys = ScopeKeys::new("tg", "tenant:c");
    let mut tasks = Vec::new();
    for _ in 0..4 {
        // Four "nodes", each with its own connection, 50 concurrent callers each.
        let s = store(&server);
        for _ in 0..50 {
            let s = s.clone();
            let keys = keys.clone();
            tasks.push(tokio::spawn(async move {
                let r = Reservation {
                    windows: [
                        window(1_000),
                        window(100),
                        DimSpec::NONE,
                        DimSpec::NONE,
                        DimSpec::NONE,
                        DimSpec::NONE,
                    ],
                    cost: Cost {
                        input: 1,
                        output: 0,
                        output_cap: 0,
                    },
                    concurrency: 0,
                    permit_id: String::new(),
                    slot_ttl_ms: 0,
                };
                matches!(
                    s.reserve(&keys, &r).await.unwrap(),
                    Reserved::Admitted { .. }
                )
            }));
        }
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += u32::from(t.await.unwrap());
    }
    assert_eq!(admitted, 100, "exactly the capacity, from 200 callers");
}

/// `(admitted?, refused dimension)` of each answer, to compare decisions.
fn outcomes(answers: &[Reserved]) -> Vec<(bool, String)> {
    (answers.iter())
        .map(|a| match a {
            Reserved::Admitted { .. } => (true, String::new()),
            Reserved::Refused { dimension, .. } => (false, dimension.clone()),
        })
        .collect()
}

#[tokio::test]
async fn a_batch_is_decided_as_the_same_reservations_one_call_at_a_time() {
    let server = RedisServer::start();
    let s = store(&server);
    // Requests 6, tokens 100, 3 slots: every dimension refuses somewhere, and a
    // refusal between admissions charges nothing.
    let r = |cost: u64, id: &str| Reservation {
        windows: [
            window(6),
            window(100),
            DimSpec::NONE,
            DimSpec::NONE,
            DimSpec::NONE,
            DimSpec::NONE,
        ],
        cost: Cost {
            input: cost,
            output: 0,
            output_cap: 0,
        },
        concurrency: 3,
        permit_id: id.to_owned(),
        slot_ttl_ms: 60_000,
    };
    let costs = [40, 70, 50, 200, 10, 0, 0, 0];
    let batch: Vec<Reservation> = (costs.iter().enumerate())
        .map(|(i, c)| r(*c, &format!("p{i}")))
        .collect();
    let batched = s
        .reserve_many(&ScopeKeys::new("tg", "tenant:batch"), &batch)
        .await
        .unwrap();
    let alone = ScopeKeys::new("tg", "tenant:alone");
    let mut one_by_one = Vec::new();
    for r in &batch {
        one_by_one.push(s.reserve(&alone, r).await.unwrap());
    }
    assert_eq!(outcomes(&batched), outcomes(&one_by_one));
    let expected: Vec<(bool, String)> = [
        (true, ""),
        (false, "tokens"),
        (true, ""),
        (false, "tokens"),
        (true, ""),
        (false, "concurrency"),
        (false, "concurrency"),
        (false, "concurrency"),
    ]
    .iter()
    .map(|(a, d)| (*a, (*d).to_owned()))
    .collect();
    assert_eq!(outcomes(&batched), expected);
    // A refusal after admissions in the same call still says when there is room.
    match &batched[1] {
        Reserved::Refused { retry_after_ms, .. } => {
            let retry = retry_after_ms.unwrap();
            assert!((900..=1_100).contains(&retry), "retry {retry}");
        }
        other => panic!("{other:?}"),
    }
    // The batch's charges were written: 100 tokens used, so 1 more does not fit,
    // and the window's sum is exact for the next caller.
    let next = Reservation {
        concurrency: 0,
        ..r(1, "late")
    };
    let keys = ScopeKeys::new("tg", "tenant:batch");
    assert_eq!(refused(&s.reserve(&keys, &next).await.unwrap()).0, "tokens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reservations_of_one_scope_are_batched_and_never_exceed_the_capacity() {
    let server = RedisServer::start();
    let metrics = std::sync::Arc::new(tollgate::ops::metrics::Metrics::new(false));
    let s = RedisStore::single(&server.url(), TIMEOUT, Some(metrics.clone())).unwrap();
    let keys = ScopeKeys::new("tg", "tenant:hot");
    let mut tasks = Vec::new();
    for _ in 0..300 {
        let (s, keys) = (s.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let r = reservation(window(200), window(10_000), 7);
            matches!(
                s.reserve(&keys, &r).await.unwrap(),
                Reserved::Admitted { .. }
            )
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += u32::from(t.await.unwrap());
    }
    assert_eq!(admitted, 200, "exactly the capacity, from 300 callers");
    // Fewer calls than decisions: the ones that queued went out together.
    let calls = |script: &str| -> u64 {
        let series = format!("tollgate_redis_script_seconds_count{{script=\"{script}\"}}");
        tollgate::ops::metrics::sample(&metrics.render(), &series).map_or(0, |v| v as u64)
    };
    let (single, batched) = (calls("reserve"), calls("reserve_many"));
    assert!(batched > 0, "no batch formed: {single} single calls");
    assert!(single + batched < 300, "{single} + {batched} calls for 300");
    println!("300 reservations in {single} single calls and {batched} batches");
}

#[tokio::test]
async fn a_new_bucket_pushes_the_expiry_back_even_when_its_first_reservation_is_refused() {
    // Commits later in the same bucket do not push the expiry back (they see no
    // new bucket), so the first call of a bucket must, admitted or not: else the
    // key could expire while those commits still count.
    let server = RedisServer::start();
    let s = store(&server);
    let keys = ScopeKeys::new("tg", "tenant:ttl");
    let r = reservation(window(1), DimSpec::NONE, 0);
    admitted(&s.reserve(&keys, &r).await.unwrap());
    // Two buckets (of 100 ms) later: the window is still full, refused.
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(refused(&s.reserve(&keys, &r).await.unwrap()).0, "requests");
    let pttl: i64 = s
        .command(redis::cmd("PTTL").arg(keys.requests()))
        .await
        .unwrap();
    // Pushed back to window + 2 buckets (1,200 ms) from the new bucket; without
    // it ~950 ms were left from the first commit.
    assert!(pttl > 1_050, "pttl {pttl}");
}

#[tokio::test]
async fn a_stalled_redis_times_out_fast_and_recovers() {
    let server = RedisServer::start();
    let s = RedisStore::single(&server.url(), Duration::from_millis(15), None).unwrap();
    let keys = ScopeKeys::new("tg", "tenant:p");
    let r = reservation(window(10), DimSpec::NONE, 0);
    admitted(&s.reserve(&keys, &r).await.unwrap());
    server.pause(true);
    let started = tokio::time::Instant::now();
    let err = s.reserve(&keys, &r).await.unwrap_err();
    assert!(
        matches!(
            err,
            tollgate::redis::StoreError::Timeout(_) | tollgate::redis::StoreError::Redis(_)
        ),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
    server.pause(false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(r) = s.reserve(&keys, &r).await {
            admitted(&r);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_scripts_run_on_a_three_shard_redis_cluster() {
    let cluster = RedisCluster::start(3);
    let s = RedisStore::cluster(&cluster.urls(), TIMEOUT, None)
        .await
        .unwrap();
    // Scopes hash to different slots (and so shards); each scope's keys share one.
    for scope in [
        "tenant:a",
        "tenant:b",
        "tenant:c",
        "upstream:x",
        "upstream:y",
    ] {
        let keys = ScopeKeys::new("tg", scope);
        let r = Reservation {
            windows: [
                window(3),
                DimSpec {
                    algorithm: Algorithm::Log,
                    capacity: 100,
                    window_ms: 1_000,
                },
                DimSpec::NONE,
                DimSpec::NONE,
                DimSpec::NONE,
                DimSpec::NONE,
            ],
            cost: Cost {
                input: 10,
                output: 0,
                output_cap: 0,
            },
            concurrency: 2,
            permit_id: format!("{scope}-1"),
            slot_ttl_ms: 1_000,
        };
        let refs = admitted(&s.reserve(&keys, &r).await.unwrap());
        s.settle(&keys, &r, &refs, settled(1, 5), None)
            .await
            .unwrap();
        for i in 2..=3 {
            let r = Reservation {
                permit_id: format!("{scope}-{i}"),
                ..r.clone()
            };
            admitted(&s.reserve(&keys, &r).await.unwrap());
        }
        assert_eq!(
            refused(&s.reserve(&keys, &r).await.unwrap()).0,
            "requests",
            "{scope}"
        );
        // Every other script on the same shard as its scope.
        assert_eq!(
            s.semaphore(&keys.concurrency, "release", &format!("{scope}-2"), 0, 0)
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            s.semaphore(&keys.concurrency, "acquire", "x", 3, 1_000)
                .await
                .unwrap(),
            0
        );
        let windowed = ScopeKeys::new("tg", &format!("{scope}:w"));
        let bucket = match s
            .reserve(&windowed, &reservation(DimSpec::NONE, window(100), 1))
            .await
            .unwrap()
        {
            Reserved::Admitted { refs, .. } => refs[1].parse::<u64>().unwrap(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            s.charge(
                &windowed.windows[1],
                (1_000, 100),
                bucket * 100,
                &[(bucket, 7)]
            )
            .await
            .unwrap(),
            7
        );
        let lease = ScopeKeys::lease("tg", scope, "tokens");
        let granted = s
            .lease(
                &lease,
                "node-a",
                &line(true, 100, 40, 1_000),
                &statement(1, &[], 0, 10),
                &LeaseAsk::default(),
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(granted.reply.credit, 10, "{scope}");
    }
}

fn line(windowed: bool, capacity: u64, max_credit: u64, ttl_ms: u64) -> tollgate::redis::LeaseLine {
    tollgate::redis::LeaseLine {
        windowed,
        capacity,
        window_ms: 1_000,
        bucket_ms: 100,
        max_credit,
        ttl_ms,
    }
}

fn statement(
    seq: u64,
    usage: &[(u64, u64)],
    remaining: u64,
    want: u64,
) -> tollgate_cluster::lease::line::SyncRequest {
    tollgate_cluster::lease::line::SyncRequest {
        seq,
        usage: usage.to_vec(),
        remaining,
        want,
        adopted: 0,
        held: 0,
    }
}

#[tokio::test]
async fn lease_lines_grant_within_capacity_conserve_and_charge_expired_credit() {
    let server = RedisServer::start();
    let s = store(&server);
    let key = ScopeKeys::lease("tg", "tenant:q", "tokens");
    let l = line(true, 100, 40, 300);
    let credit = |r: Result<Leased, String>| r.unwrap().reply.credit;
    assert_eq!(
        credit(
            s.lease(
                &key,
                "a",
                &l,
                &statement(1, &[], 0, 40),
                &LeaseAsk::default()
            )
            .await
            .unwrap()
        ),
        40
    );
    // b asks for more than max_credit: the cap stretches to one large request.
    assert_eq!(
        credit(
            s.lease(
                &key,
                "b",
                &l,
                &statement(1, &[], 0, 70),
                &LeaseAsk::default()
            )
            .await
            .unwrap()
        ),
        60
    );
    assert_eq!(
        credit(
            s.lease(
                &key,
                "c",
                &l,
                &statement(1, &[], 0, 10),
                &LeaseAsk::default()
            )
            .await
            .unwrap()
        ),
        0
    );
    // A stale statement changes nothing.
    assert_eq!(
        s.lease(
            &key,
            "a",
            &l,
            &statement(1, &[], 40, 0),
            &LeaseAsk::default()
        )
        .await
        .unwrap(),
        Err("stale".to_owned())
    );
    // a spent 30 (in the current bucket) and claims 35 left: only 10 accepted.
    let now_bucket = {
        let t: Vec<u64> = s.command(&redis::cmd("TIME")).await.unwrap();
        (t[0] * 1000 + t[1] / 1000) / 100
    };
    let r = s
        .lease(
            &key,
            "a",
            &l,
            &statement(2, &[(now_bucket, 30)], 35, 0),
            &LeaseAsk::default(),
        )
        .await
        .unwrap();
    assert_eq!(credit(r), 10);
    // b goes silent: after its ttl its 60 count as spent until they leave the window.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(
        credit(
            s.lease(
                &key,
                "c",
                &l,
                &statement(2, &[], 0, 10),
                &LeaseAsk::default()
            )
            .await
            .unwrap()
        ),
        0
    );
    // Slots: held until ttl, in-use always counted.
    let slots = ScopeKeys::lease("tg", "tenant:q", "concurrency");
    let sl = line(false, 2, 2, 300);
    assert_eq!(
        credit(
            s.lease(
                &slots,
                "a",
                &sl,
                &statement(1, &[], 1, 1),
                &LeaseAsk::default()
            )
            .await
            .unwrap()
        ),
        2
    );
    assert_eq!(
        credit(
            s.lease(
                &slots,
                "b",
                &sl,
                &statement(1, &[], 0, 1),
                &LeaseAsk::default()
            )
            .await
            .unwrap()
        ),
        0
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(
        credit(
            s.lease(
                &slots,
                "b",
                &sl,
                &statement(2, &[], 0, 1),
                &LeaseAsk::default()
            )
            .await
            .unwrap()
        ),
        1,
        "a's slots expired"
    );
}

/// `redis-lease` reservations: what each holder may spend per window if Redis is
/// lost. Redis keeps every holder's charge at least its reservation and the sum
/// within L, whatever shares the holders ask for from their own (differing)
/// gossip views; a reservation lapses when its holder goes quiet unless the
/// holder is held (lost Redis, or unreachable over gossip).
#[tokio::test]
async fn lease_reservations_sum_within_capacity_and_are_held_for_lost_members() {
    let server = RedisServer::start();
    let s = store(&server);
    let key = ScopeKeys::lease("tg", "tenant:r", "tokens");
    let l = line(true, 100, 100, 300);
    let held_a = vec![("a".to_owned(), 0)];
    let lease =
        |holder: &'static str, seq: u64, want: u64, share: u64, held: Vec<(String, u64)>| {
            let request = statement(seq, &[], 0, want);
            let (s, key) = (&s, &key);
            async move {
                let ask = LeaseAsk {
                    reserve: Some(Reserve { share, borrow: 0 }),
                    held: &held,
                };
                s.lease(key, holder, &l, &request, &ask)
                    .await
                    .unwrap()
                    .unwrap()
            }
        };
    // Views disagree: a and b each think 60 is theirs. Redis reserves 60 + 40.
    let a = lease("a", 1, 10, 60, vec![]).await;
    assert_eq!((a.reserved, a.reply.credit), (60, 10));
    let b = lease("b", 1, 50, 60, vec![]).await;
    assert_eq!(
        (b.reserved, b.reply.credit),
        (40, 40),
        "capped at its reservation"
    );
    // c gets nothing reserved until someone gives some back.
    let c = lease("c", 1, 10, 30, vec![]).await;
    assert_eq!((c.reserved, c.reply.credit), (0, 0));
    let a = lease("a", 2, 0, 30, vec![]).await;
    assert_eq!(a.reserved, 30);
    let c = lease("c", 2, 10, 30, vec![]).await;
    assert_eq!((c.reserved, c.reply.credit), (30, 10));
    // Borrowing only from room nobody reserved: none left.
    let borrowing = LeaseAsk {
        reserve: Some(Reserve {
            share: 30,
            borrow: 50,
        }),
        held: &[],
    };
    let c = (s
        .lease(&key, "c", &l, &statement(3, &[], 0, 50), &borrowing)
        .await)
        .unwrap()
        .unwrap();
    assert_eq!(c.reply.credit, 30, "no unreserved room to borrow");
    // a and b go quiet past the ttl; a is held (it lost Redis): its 30 stays
    // charged, b's reservation lapses (its expired credit still counts).
    tokio::time::sleep(Duration::from_millis(350)).await;
    let c = lease("c", 4, 0, 100, held_a.clone()).await;
    // 100 - a's reservation 30 - b's expired credit 40 (charged while in window).
    assert_eq!(c.reserved, 30);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let c = lease("c", 5, 0, 100, held_a.clone()).await;
    assert_eq!(
        c.reserved, 70,
        "b's credit left the window; a is still held"
    );
    let c = lease("c", 6, 0, 100, vec![]).await;
    assert_eq!(c.reserved, 100, "a no longer held: its reservation lapsed");
    // A held member Redis has no account of (the key expired while nobody stated)
    // is charged the floor the caller gives it.
    let fresh = ScopeKeys::lease("tg", "tenant:fresh", "tokens");
    let ask = LeaseAsk {
        reserve: Some(Reserve {
            share: 100,
            borrow: 0,
        }),
        held: &[("z".to_owned(), 25)],
    };
    let r = (s
        .lease(&fresh, "c", &l, &statement(1, &[], 0, 0), &ask)
        .await)
        .unwrap()
        .unwrap();
    assert_eq!(r.reserved, 75, "z's floor is charged");
    // A reservation also caps what its holder commits.
    let capped = ScopeKeys::lease("tg", "tenant:cap", "tokens");
    let ask = |share, borrow| LeaseAsk {
        reserve: Some(Reserve { share, borrow }),
        held: &[],
    };
    let r = s
        .lease(&capped, "a", &l, &statement(1, &[], 0, 40), &ask(15, 0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((r.reserved, r.reply.credit), (15, 15));
    // ... plus borrowing from room nobody reserved.
    let r = s
        .lease(&capped, "b", &l, &statement(1, &[], 0, 40), &ask(10, 20))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((r.reserved, r.reply.credit), (10, 30));
}

/// A holder whose clock runs 2 s behind Redis TIME reports its usage in buckets 2 s
/// old: unshifted they would have left the window and the same capacity would be
/// granted again (the jepsen harness's `skew` nemesis); `lease.lua` shifts them by
/// the lag beyond the tolerance.
#[tokio::test]
async fn lease_shifts_the_usage_of_a_holder_whose_clock_runs_behind() {
    let server = RedisServer::start();
    let s = store(&server);
    let key = ScopeKeys::lease("tg", "tenant:skew", "tokens");
    let l = line(true, 100, 100, 300);
    let t: Vec<u64> = s.command(&redis::cmd("TIME")).await.unwrap();
    let redis_now = t[0] * 1000 + t[1] / 1000;
    let behind = redis_now - 2_000;
    let r = s
        .lease(
            &key,
            "a",
            &l,
            &statement(behind, &[(behind / 100, 60)], 0, 100),
            &LeaseAsk::default(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.reply.credit, 40, "its 60 still count");
}

/// Reconciliation (`charge.lua`) judges the gateway's buckets on Redis's clock:
/// a bucket ahead of Redis's current one (gateway clock ahead) counts in it
/// instead of being dropped, and a gateway clock behind has its buckets shifted
/// forward (they would leave Redis's window early); within the skew tolerance
/// nothing moves.
#[tokio::test]
async fn reconciled_spending_is_dated_on_redis_time() {
    let server = RedisServer::start();
    let store = store(&server);
    let (window_ms, bucket_ms) = (10_000u64, 1_000u64);
    let redis_now = || async {
        let (secs, micros): (u64, u64) = store.command(&::redis::cmd("TIME")).await.unwrap();
        secs * 1_000 + micros / 1_000
    };
    let head = |key: &'static str| {
        let store = store.clone();
        async move {
            let h: Option<u64> = store
                .command(::redis::cmd("HGET").arg(key).arg("h"))
                .await
                .unwrap();
            h.unwrap()
        }
    };
    // Gateway 5 s ahead: its bucket is Redis's future; counted now, not dropped.
    let now = redis_now().await;
    let ahead = now + 5_000;
    let added = store
        .charge(
            "w:ahead",
            (window_ms, bucket_ms),
            ahead,
            &[(ahead / bucket_ms, 3)],
        )
        .await
        .unwrap();
    assert_eq!(added, 3, "a bucket ahead of Redis's was dropped");
    // Gateway 4 s behind: its newest bucket is dated 4 s later, so it counts
    // until the end of a window from Redis's now, not 4 s less.
    let now = redis_now().await;
    let behind = now - 4_000;
    let added = store
        .charge(
            "w:behind",
            (window_ms, bucket_ms),
            behind,
            &[(behind / bucket_ms, 2)],
        )
        .await
        .unwrap();
    assert_eq!(added, 2);
    let charged_bucket = {
        let fields: Vec<Option<u64>> = store
            .command(
                ::redis::cmd("HMGET")
                    .arg("w:behind")
                    .arg(format!("b{}", (now / bucket_ms) % 11)),
            )
            .await
            .unwrap();
        fields[0]
    };
    assert!(
        charged_bucket.is_some_and(|b| b + 1 >= now / bucket_ms),
        "charged into bucket {charged_bucket:?}, Redis's is {}",
        now / bucket_ms
    );
    assert!(head("w:behind").await + 1 >= now / bucket_ms);
    // Within the tolerance (100 ms): the bucket as sent.
    let now = redis_now().await;
    let close = now - 50;
    let bucket = close / bucket_ms;
    store
        .charge("w:close", (window_ms, bucket_ms), close, &[(bucket, 1)])
        .await
        .unwrap();
    let ring = window_ms / bucket_ms + 1;
    let stored: Vec<Option<u64>> = store
        .command(
            ::redis::cmd("HMGET")
                .arg("w:close")
                .arg(format!("b{}", bucket % ring)),
        )
        .await
        .unwrap();
    assert_eq!(stored[0], Some(bucket));
}

#[tokio::test]
async fn input_and_output_tokens_are_reserved_and_settled_on_their_own_windows() {
    let server = RedisServer::start();
    let s = store(&server);
    let keys = ScopeKeys::new("tg", "upstream:anthropic");
    // 100 input and 50 output tokens a window, as an ITPM/OTPM account.
    let r = |input, output| Reservation {
        windows: [
            DimSpec::NONE,
            DimSpec::NONE,
            window(100),
            window(50),
            DimSpec::NONE,
            DimSpec::NONE,
        ],
        cost: Cost {
            input,
            output,
            output_cap: 0,
        },
        concurrency: 0,
        permit_id: String::new(),
        slot_ttl_ms: 0,
    };
    let first = r(60, 40);
    let refs = admitted(&s.reserve(&keys, &first).await.unwrap());
    // Input has room for 30 more; output (a max_tokens of 20) does not.
    assert_eq!(
        refused(&s.reserve(&keys, &r(30, 20)).await.unwrap()).0,
        "output_tokens"
    );
    assert_eq!(
        refused(&s.reserve(&keys, &r(41, 1)).await.unwrap()).0,
        "input_tokens"
    );
    // The answer used 5 output tokens: 35 come back to the output window only.
    let used = Settled {
        requests: 1,
        tokens: Cost {
            input: 60,
            output: 5,
            output_cap: 0,
        },
    };
    let corrections = s.settle(&keys, &first, &refs, used, None).await.unwrap();
    assert_eq!(corrections, [0, 0, 0, -35, 0, 0]);
    admitted(&s.reserve(&keys, &r(30, 20)).await.unwrap());
    // 90 input and 25 output used: exactly the rest of each fits, one more does not.
    admitted(&s.reserve(&keys, &r(10, 25)).await.unwrap());
    assert_eq!(
        refused(&s.reserve(&keys, &r(0, 1)).await.unwrap()).0,
        "output_tokens"
    );
}

#[tokio::test]
async fn a_day_window_is_counted_over_its_own_length_beside_the_minutes() {
    let server = RedisServer::start();
    let s = store(&server);
    let keys = ScopeKeys::new("tg", "upstream:daily");
    // 3 requests a (one-second) window; 4 requests and 100 tokens a
    // (five-second) day, in half-second buckets.
    let day = |capacity| DimSpec {
        algorithm: Algorithm::Window { bucket_ms: 500 },
        capacity,
        window_ms: 5_000,
    };
    let r = |tokens| Reservation {
        windows: [
            window(3),
            DimSpec::NONE,
            DimSpec::NONE,
            DimSpec::NONE,
            day(4),
            day(100),
        ],
        cost: Cost {
            input: tokens,
            output: 0,
            output_cap: 0,
        },
        concurrency: 0,
        permit_id: String::new(),
        slot_ttl_ms: 0,
    };
    let first = r(40);
    let refs = admitted(&s.reserve(&keys, &first).await.unwrap());
    admitted(&s.reserve(&keys, &r(10)).await.unwrap());
    admitted(&s.reserve(&keys, &r(10)).await.unwrap());
    assert_eq!(
        refused(&s.reserve(&keys, &r(1)).await.unwrap()).0,
        "requests"
    );
    // The answer used 15 tokens: 25 come back to the day's token window.
    let used = settled(1, 15);
    let corrections = s.settle(&keys, &first, &refs, used, None).await.unwrap();
    assert_eq!(corrections, [0, 0, 0, 0, 0, -25]);
    // The minute's requests have left their window; the day's have not.
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;
    assert_eq!(
        refused(&s.reserve(&keys, &r(66)).await.unwrap()).0,
        "tokens_per_day",
        "35 of 100 tokens used"
    );
    admitted(&s.reserve(&keys, &r(65)).await.unwrap());
    let (dimension, retry_ms) = refused(&s.reserve(&keys, &r(0)).await.unwrap());
    assert_eq!(dimension, "requests_per_day");
    let retry_ms = retry_ms.unwrap();
    assert!(
        (2_000..=5_000).contains(&retry_ms),
        "until the first bucket leaves the day: {retry_ms} ms"
    );
    let stored: Vec<String> = s
        .command(::redis::cmd("KEYS").arg("tg:{upstream:daily}:*"))
        .await
        .unwrap();
    assert!(
        stored.iter().any(|k| k.ends_with(":r_per_day")),
        "{stored:?}"
    );
}
