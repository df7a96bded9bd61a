//! The Redis strict modes when Redis dies, with 3 nodes in one process (real UDP
//! gossip) sharing one real redis-server started (and killed) by the test, in
//! front of one real mock upstream whose counters are the ground truth. Healthy
//! promises are in `tests/it/conformance.rs`.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::cluster::*;
use crate::common::redis::RedisServer;
use crate::common::*;
use std::sync::Arc;
use tokio::time::Instant;

fn redis_toml(
    i: usize,
    ports: &[u16],
    (mode, cut_off): (&str, &str),
    redis_url: &str,
    rpm: u64,
) -> String {
    format!(
        "{}\n[redis]\nurl = \"{redis_url}\"\ntimeout = \"50ms\"\n",
        cluster_toml(i, ports, mode, "full")
            .replace(&format!("rpm = {LIMIT}\n"), &format!("rpm = {rpm}\n"))
            .replace("max_wait = \"0s\"", "max_wait = \"300ms\"")
            .replace(
                "[cluster.lease]\n",
                &format!("[cluster.lease]\ncut_off = \"{cut_off}\"\n")
            ),
    )
}

/// Three nodes in `mode` with the `share` cut-off policy, node i reaching Redis
/// at `redis_url(i)`.
async fn redis_cluster(
    mode: &str,
    redis_url: impl Fn(usize) -> String,
    rpm: u64,
    upstream: &tollgate::mock::MockHandle,
) -> Vec<Arc<Node>> {
    redis_cluster_cut_off((mode, "share"), redis_url, rpm, upstream).await
}

/// Three nodes in `(mode, cut_off policy)`, node i reaching Redis at `redis_url(i)`.
async fn redis_cluster_cut_off(
    mode: (&str, &str),
    redis_url: impl Fn(usize) -> String,
    rpm: u64,
    upstream: &tollgate::mock::MockHandle,
) -> Vec<Arc<Node>> {
    redis_cluster_edited(mode, redis_url, rpm, upstream, |toml| toml).await
}

/// As `redis_cluster_cut_off`, each node's config passed through `edit` first.
async fn redis_cluster_edited(
    mode: (&str, &str),
    redis_url: impl Fn(usize) -> String,
    rpm: u64,
    upstream: &tollgate::mock::MockHandle,
    edit: impl Fn(String) -> String,
) -> Vec<Arc<Node>> {
    let ports: Vec<u16> = (0..3).map(|_| free_udp_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let toml = edit(redis_toml(i, &ports, mode, &redis_url(i), rpm));
        nodes.push(Arc::new(node(&toml, &[upstream]).await));
    }
    for n in &nodes {
        wait_members(n, 3).await;
    }
    nodes
}

/// Redis SIGKILLed mid-load, then restarted: every node keeps serving within its
/// share while it is down, says so, and recovers (within 5 s) once it is back.
async fn redis_dies(mode: &str) {
    const L: u64 = 300;
    let mut redis = RedisServer::start();
    let upstream = mock(|_| {}).await;
    let nodes = redis_cluster(mode, |_| redis.url(), L, &upstream).await;
    let before = load(urls(&nodes), &[10, 10, 10], 1.5).await;
    redis.kill();
    let during = load(urls(&nodes), &[30, 30, 30], 2.0).await;
    let body = admin(&nodes[0], "/admin/cluster").await;
    let degraded = body["cluster"]["degraded"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(degraded.starts_with("redis_unreachable"), "{body}");
    redis.restart();
    // Recovery: probed each sync round (`redis`: local spending reconciled first;
    // `redis-lease`: the next statement carries full usage).
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let body = admin(&nodes[0], "/admin/cluster").await;
        if body["cluster"]["degraded"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "never recovered: {body}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let after = load(urls(&nodes), &[10, 10, 10], 1.5).await;
    let truth = upstream.stats().admitted;
    println!(
        "{mode}, Redis killed then restarted empty: before {before:?}, during {during:?}, after {after:?}; upstream admitted {truth} of L = {L}"
    );
    assert!(
        during.iter().sum::<u64>() > 0,
        "nothing served while Redis was down"
    );
    // Each node spends at most its share (~L/3) of the window while cut off.
    for (i, n) in during.iter().enumerate() {
        assert!(
            before[i] + n <= L / 3 + 5,
            "node {i} spent {} > its share",
            before[i] + n
        );
    }
    assert!(
        after.iter().sum::<u64>() > 0,
        "nothing served after recovery"
    );
    assert!(truth <= L, "admitted {truth} > L = {L}");
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_nodes_keep_serving_their_share_when_redis_dies_and_recover() {
    redis_dies("redis-lease").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_mode_falls_back_to_shares_when_redis_dies_and_reconciles_after() {
    redis_dies("redis").await;
}

/// Node 3 reaches Redis through a relay the test cuts: only it loses Redis.
async fn partial_loss(mode: &str) {
    const L: u64 = 300;
    let redis = RedisServer::start();
    let relay = crate::common::redis::TcpRelay::start(redis.port).await;
    let upstream = mock(|_| {}).await;
    let url = |i: usize| if i == 2 { relay.url() } else { redis.url() };
    let nodes = redis_cluster(mode, url, L, &upstream).await;
    let before = load(urls(&nodes), &[10, 10, 10], 1.5).await;
    relay.cut();
    let during = load(urls(&nodes), &[40, 40, 40], 3.0).await;
    let body = admin(&nodes[2], "/admin/cluster").await;
    let degraded = body["cluster"]["degraded"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let healthy = admin(&nodes[0], "/admin/cluster").await;
    let reservation = cut_off_reservation(&redis).await;
    relay.heal();
    let truth = upstream.stats().admitted;
    println!(
        "{mode}, node 3 cut off from Redis: before {before:?}, during {during:?}; upstream admitted {truth} of L = {L} (excess {})",
        truth.saturating_sub(L)
    );
    assert!(degraded.starts_with("redis_unreachable"), "{body}");
    assert!(
        healthy["cluster"]["degraded"].is_null(),
        "the others still reach Redis: {healthy}"
    );
    assert!(during[2] > 0, "the cut-off node stopped serving");
    // Its share: `redis-lease` the reservation Redis confirmed (its demand-
    // weighted share at the cut, about L/3 here but above it when its demand ran
    // a little higher: 106 against a reservation above 102 in one CI run), per
    // window in all; `redis` the equal share its peers charge it, beyond what it
    // had already reserved in Redis (that stays in Redis, within their cap).
    // Unbounded, it would have admitted all it was sent.
    let (spent, share) = if mode == "redis" {
        (during[2], L / 3 + 2)
    } else {
        let reserved = reservation.expect("Redis holds the cut-off node's account");
        assert!(
            reserved <= L / 2,
            "a reservation of {reserved} for even demand"
        );
        (before[2] + during[2], reserved + 2)
    };
    assert!(
        spent <= share,
        "the cut-off node exceeded its share: {spent} > {share}"
    );
    // The others were charged its share in Redis: together within L. `redis-lease`
    // because Redis keeps its reservation while its account is live, and then
    // because it is held; `redis` because the node spends nothing locally until
    // both peers have confirmed they charge its loss (src/sync/partition/redis_loss.rs).
    assert!(truth <= L, "admitted {truth} > L = {L}");
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}

/// `redis-lease`: the reservation Redis holds for node 3 (`node-2`) on the
/// tenant's requests key, from its account there (`None` in `redis` mode).
async fn cut_off_reservation(redis: &RedisServer) -> Option<u64> {
    let store = direct(redis);
    let keys: Vec<String> = store
        .command(::redis::cmd("KEYS").arg("*:lease:requests"))
        .await
        .unwrap();
    let key = keys.first()?;
    let accounts: std::collections::HashMap<String, String> = store
        .command(::redis::cmd("HGETALL").arg(key))
        .await
        .unwrap();
    let (_, account) = accounts.iter().find(|(id, _)| id.starts_with("node-2/"))?;
    let account: serde_json::Value = serde_json::from_str(account).unwrap();
    account["f"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lost_by_one_node_only_its_share_is_charged_in_redis() {
    partial_loss("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_lease_lost_by_one_node_only_its_share_is_charged_in_redis() {
    partial_loss("redis-lease").await;
}

/// The other cut-off policies in `redis`, for a node that alone lost Redis
/// (docs/config.md, `cut_off`): `fail-closed` admits nothing until Redis is
/// back; `fail-open` admits all it is sent up to the whole limit on its own
/// (its actors' own windows), neither waiting for its peers' confirmation nor
/// held to a share (unsafe, and said so). Its peers keep serving through Redis
/// either way. Returns what node 3 admitted before the cut, and was sent and
/// admitted while cut off, and what the upstream admitted in all.
async fn cut_off_policy(policy: &str) -> (u64, u64, u64, u64) {
    const L: u64 = 300;
    let redis = RedisServer::start();
    let relay = crate::common::redis::TcpRelay::start(redis.port).await;
    let upstream = mock(|_| {}).await;
    let url = |i: usize| if i == 2 { relay.url() } else { redis.url() };
    let nodes = redis_cluster_cut_off(("redis", policy), url, L, &upstream).await;
    let before = load(urls(&nodes), &[10, 10, 10], 1.0).await[2];
    relay.cut();
    // The relay's open connections notice the cut within 5 ms: a Redis call
    // sent before then may still be answered.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    // Node 3 is sent one request after another for 3 s, more than its share
    // (~L/3) of what is left.
    let others = load(urls(&nodes[..2]), &[20, 20], 3.0);
    let cut_off = async {
        let (mut sent, mut admitted) = (0, 0);
        let end = Instant::now() + std::time::Duration::from_secs(3);
        while Instant::now() < end {
            let response = post(&nodes[2], "/chat/completions", chat_body("hi", 5), &[]).await;
            sent += 1;
            admitted += u64::from(response.status() == 200);
        }
        (sent, admitted)
    };
    let (others, (sent, admitted)) = tokio::join!(others, cut_off);
    let body = admin(&nodes[2], "/admin/cluster").await;
    assert!(
        (body["cluster"]["degraded"].as_str()).is_some_and(|d| d.starts_with("redis_unreachable")),
        "{body}"
    );
    relay.heal();
    let truth = upstream.stats().admitted;
    println!(
        "redis, {policy}, node 3 cut off from Redis: it admitted {before} before, {admitted} of {sent} after, the others {others:?}; upstream admitted {truth} of L = {L}"
    );
    assert!(
        others.iter().all(|n| *n > 0),
        "the others stopped serving: {others:?}"
    );
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
    (before, sent, admitted, truth)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fail_closed_admits_nothing_on_a_node_that_lost_redis() {
    const L: u64 = 300;
    let (_, sent, admitted, truth) = cut_off_policy("fail-closed").await;
    assert!(sent > 0);
    assert_eq!(
        admitted, 0,
        "the cut-off node admitted {admitted} of {sent}"
    );
    assert!(truth <= L, "admitted {truth} > L = {L}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fail_open_admits_everything_on_a_node_that_lost_redis() {
    const L: u64 = 300;
    let (before, sent, admitted, _) = cut_off_policy("fail-open").await;
    // Everything, up to what its own windows allow (all of L on this node
    // alone, within a request or two of the window's edge), and beyond any
    // share (`share` holds it to about L/3, `partial_loss`).
    assert!(before + admitted <= L, "{before} + {admitted} > L = {L}");
    let all = sent.min(L - before);
    assert!(
        admitted + 2 >= all,
        "the cut-off node admitted {admitted} of {sent}: too few"
    );
    assert!(
        admitted > L / 3 + 20,
        "admitted only {admitted}: too few sent to tell a share from none"
    );
}

/// A store straight to `redis`, for reading what the nodes left there.
fn direct(redis: &RedisServer) -> tollgate::redis::store::RedisStore {
    let timeout = std::time::Duration::from_secs(2);
    tollgate::redis::store::RedisStore::single(&redis.url(), timeout, None).unwrap()
}

/// The concurrency slots held in `redis`: members of every semaphore key.
async fn slots_held(redis: &RedisServer) -> u64 {
    let store = direct(redis);
    let keys: Vec<String> = store
        .command(::redis::cmd("KEYS").arg("*:c"))
        .await
        .unwrap();
    let mut held = 0;
    for key in keys {
        held += store
            .command::<u64>(::redis::cmd("ZCARD").arg(&key))
            .await
            .unwrap();
    }
    held
}

/// Three `redis` nodes limiting the tenant to 8 slots (ttl 60 s), their Redis
/// calls timing out after `timeout`, warmed up through Redis: each request took
/// a slot and its settlement freed it.
async fn slot_cluster(
    redis: &RedisServer,
    upstream: &tollgate::mock::MockHandle,
    timeout: &str,
) -> Vec<Arc<Node>> {
    let nodes = redis_cluster_edited(
        ("redis", "share"),
        |_| redis.url(),
        300,
        upstream,
        |toml| {
            toml.replace("rpm = 300\n", "rpm = 300\nconcurrency = 8\n")
                .replace(
                    "timeout = \"50ms\"\n",
                    &format!("timeout = \"{timeout}\"\nslot_ttl = \"60s\"\n"),
                )
        },
    )
    .await;
    let served = load(urls(&nodes), &[10, 10, 10], 0.5).await;
    assert!(served.iter().all(|n| *n > 0), "{served:?}");
    let deadline = Instant::now() + std::time::Duration::from_secs(3);
    while slots_held(redis).await > 0 {
        assert!(Instant::now() < deadline, "settled slots still held");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    nodes
}

/// Redis stalls (SIGSTOP) under a request: its reservation times out at the
/// node, which goes on without it, but Redis runs it when it resumes and takes
/// the request's concurrency slot, which nothing would settle. The node
/// remembers such slots and releases them in its next sync round in which
/// Redis answers, seconds later, not a slot ttl (60 s here) later
/// (docs/design/redis.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_taken_by_a_reservation_that_timed_out_is_released_once_redis_answers() {
    const RELEASED: &str = "tollgate_redis_orphaned_slots_released_total";
    let redis = RedisServer::start();
    let upstream = mock(|_| {}).await;
    let nodes = slot_cluster(&redis, &upstream, "50ms").await;

    redis.pause(true);
    let stalled = {
        let node = nodes[0].clone();
        tokio::spawn(async move {
            post(&node, "/chat/completions", chat_body("hi", 5), &[])
                .await
                .status()
        })
    };
    // Well past the 50 ms timeout: the node has given up on the reservation.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    redis.pause(false);
    let status = stalled.await.unwrap();

    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let (released, held) = loop {
        let released = tollgate::ops::metrics::sample(&metrics(&nodes[0]).await, RELEASED);
        let held = slots_held(&redis).await;
        if released.is_some_and(|n| n >= 1.0) && held == 0 || Instant::now() > deadline {
            break (released, held);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    println!(
        "the stalled request ended {status}; node 1 released {released:?} slots; {held} held in redis"
    );
    // The release found the slot taken (it counts only slots that were there).
    assert!(
        released.is_some_and(|n| n >= 1.0),
        "no slot released: {released:?}"
    );
    assert_eq!(held, 0, "a slot is still held in redis");
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}

/// The tenant's requests in the current window as Redis counts them (the window
/// HASH's running sum).
async fn requests_in_redis(redis: &RedisServer) -> u64 {
    let store = direct(redis);
    let sum: Option<u64> = store
        .command(::redis::cmd("HGET").arg("tg:{tenant:t}:r").arg("s"))
        .await
        .unwrap();
    sum.unwrap_or(0)
}

/// A client that leaves while its reservation is on its way to Redis: Redis,
/// stalled for 300 ms, still admits it within the node's 1 s timeout, after the
/// request is gone. The node cancels that admission (the request and its slot),
/// instead of leaving the slot held for a slot ttl (60 s here) and the request
/// counted for a window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_whose_client_left_mid_call_is_cancelled_in_redis() {
    let redis = RedisServer::start();
    let upstream = mock(|_| {}).await;
    let nodes = slot_cluster(&redis, &upstream, "1s").await;
    let before = requests_in_redis(&redis).await;
    assert!(before > 0);

    redis.pause(true);
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(100))
        .build()
        .unwrap();
    let gone = impatient
        .post(format!("{}/chat/completions", nodes[0].url()))
        .bearer_auth(KEY)
        .json(&chat_body("hi", 5))
        .send()
        .await;
    assert!(gone.unwrap_err().is_timeout());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    redis.pause(false);

    let deadline = Instant::now() + std::time::Duration::from_secs(3);
    let (held, requests) = loop {
        let (held, requests) = (slots_held(&redis).await, requests_in_redis(&redis).await);
        if held == 0 && requests == before || Instant::now() > deadline {
            break (held, requests);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    println!(
        "after the client left: {held} slots held, {requests} requests counted (before: {before})"
    );
    assert_eq!(held, 0, "the abandoned admission's slot is held");
    assert_eq!(requests, before, "the abandoned admission is counted");
    assert_eq!(
        upstream.stats().admitted,
        before,
        "the abandoned request was sent"
    );
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}

/// Three `redis` nodes limiting the tenant to 8 slots (ttl 900 ms, so a
/// heartbeat every 300 ms), in front of a mock streaming `tokens` tokens at 100
/// ms each.
async fn stream_slot_cluster(
    redis: &RedisServer,
    tokens: u64,
) -> (tollgate::mock::MockHandle, Vec<Arc<Node>>) {
    let upstream = mock(|m| {
        m.inter_token_ms = 100;
        m.completion_min_tokens = tokens;
        m.completion_max_tokens = tokens;
    })
    .await;
    let nodes = redis_cluster_edited(
        ("redis", "share"),
        |_| redis.url(),
        300,
        &upstream,
        |toml| {
            toml.replace("rpm = 300\n", "rpm = 300\nconcurrency = 8\n")
                .replace(
                    "timeout = \"50ms\"\n",
                    "timeout = \"50ms\"\nslot_ttl = \"900ms\"\n",
                )
        },
    )
    .await;
    (upstream, nodes)
}

/// A running stream's slot that Redis loses (a stall past its ttl, a restart
/// with nothing kept) is held again at the next heartbeat, even if that takes
/// it over C: the stream runs whatever Redis remembers. Were the heartbeat's "no
/// longer held" answer ignored, other nodes could take the slot and concurrency
/// would go over C until the stream ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_streams_slot_lost_by_redis_is_held_again_at_its_heartbeat() {
    let redis = RedisServer::start();
    let (upstream, nodes) = stream_slot_cluster(&redis, 60).await;
    let mut body = chat_body("a long story", 60);
    body["stream"] = serde_json::json!(true);
    let mut stream = post(&nodes[0], "/chat/completions", body, &[]).await;
    assert_eq!(stream.status(), 200);
    assert!(stream.chunk().await.unwrap().is_some());
    assert_eq!(slots_held(&redis).await, 1);
    // Redis forgets every slot (as a restart with nothing persisted would).
    let store = direct(&redis);
    let keys: Vec<String> = store
        .command(::redis::cmd("KEYS").arg("*:c"))
        .await
        .unwrap();
    for key in &keys {
        let _: u64 = store.command(::redis::cmd("DEL").arg(key)).await.unwrap();
    }
    assert_eq!(slots_held(&redis).await, 0);
    // Within a heartbeat (every 300 ms) the running stream's slot is back.
    let deadline = Instant::now() + std::time::Duration::from_secs(2);
    while slots_held(&redis).await != 1 {
        assert!(
            Instant::now() < deadline,
            "the running stream's slot never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    drop(stream);
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}

/// A stream admitted on the fallback while Redis is lost holds its slot in Redis
/// as soon as Redis is back (before the node uses Redis again), for as long as it
/// runs, and gives it back when it ends. A fallback stream that never took a
/// slot would let other nodes fill theirs after recovery, and concurrency would
/// go over C until it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_admitted_while_redis_was_lost_holds_its_slot_once_redis_is_back() {
    let mut redis = RedisServer::start();
    let (upstream, nodes) = stream_slot_cluster(&redis, 80).await;
    redis.kill();
    // Admitted locally once every peer confirms charging the loss.
    let mut body = chat_body("a long story", 80);
    body["stream"] = serde_json::json!(true);
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let mut stream = loop {
        let answer = post(&nodes[0], "/chat/completions", body.clone(), &[]).await;
        if answer.status() == 200 {
            break answer;
        }
        assert!(
            Instant::now() < deadline,
            "nothing admitted on the fallback"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(stream.chunk().await.unwrap().is_some());
    redis.restart();
    // Back: the running stream's slot is held (within a probe round).
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    while slots_held(&redis).await != 1 {
        assert!(
            Instant::now() < deadline,
            "the fallback stream's slot was never held in Redis"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Still held two slot ttls on: its heartbeat keeps it.
    tokio::time::sleep(std::time::Duration::from_millis(1_800)).await;
    assert_eq!(
        slots_held(&redis).await,
        1,
        "the slot lapsed while the stream ran"
    );
    // Read to its end: the slot is given back.
    while stream.chunk().await.unwrap().is_some() {}
    let deadline = Instant::now() + std::time::Duration::from_secs(3);
    while slots_held(&redis).await != 0 {
        assert!(
            Instant::now() < deadline,
            "the ended stream's slot stayed held"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    stop_all(nodes).await;
    upstream.shutdown().await.unwrap();
}
