//! Spillover (`cluster.lease.spillover`, docs/design/spillover.md) with real
//! nodes over real UDP gossip and the real internal RPC, in front of one real mock
//! upstream whose count is the ground truth: a request refused for want of its
//! node's share is served by a peer with room, the cluster still never exceeds L,
//! a spilled request is never spilled again, and the spill route wants the
//! cluster's secret.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::cluster::*;
use crate::common::*;
use std::time::Duration;
use tokio::time::Instant;

/// What the busy node's clients send, and which limit binds.
#[derive(Debug, Clone, Copy, Default)]
struct Shape {
    /// Streamed answers (SSE).
    stream: bool,
    /// L = 30 on the upstream and 100 on the tenant, not 30 on the tenant: a
    /// refusal then comes from the upstream's admission, after the tenant's.
    upstream_limited: bool,
    /// Anthropic's Messages API instead of OpenAI's chat completions.
    anthropic: bool,
}

impl Shape {
    /// The path, body and extra headers of one of the busy node's requests.
    fn request(
        self,
    ) -> (
        &'static str,
        serde_json::Value,
        &'static [(&'static str, &'static str)],
    ) {
        if self.anthropic {
            let body = serde_json::json!({"model": "claude-3-5-haiku", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}]});
            return ("/messages", body, &[("anthropic-version", "2023-06-01")]);
        }
        let mut body = chat_body("hi", 5);
        body["stream"] = serde_json::json!(self.stream);
        ("/chat/completions", body, &[])
    }

    /// The peer's count of this shape's spilled requests it served.
    fn received_200(self) -> String {
        let api = if self.anthropic { "messages" } else { "chat" };
        format!("tollgate_spill_received_total{{api=\"{api}\",status=\"200\"}}")
    }
}

/// Node `i` of a 2-node `lease` cluster on `ports`, spillover on or off.
/// Requests wait up to 200 ms for credit.
fn spill_toml(i: usize, ports: &[u16], spillover: bool, shape: Shape) -> String {
    let toml = cluster_toml(i, ports, "lease", "full")
        .replace("max_wait = \"0s\"", "max_wait = \"200ms\"")
        .replace(
            "rpc_timeout = \"200ms\"",
            &format!("rpc_timeout = \"200ms\"\nspillover = {spillover}"),
        );
    if !shape.upstream_limited {
        return toml;
    }
    let openai = "id = \"mock\"\nkind = \"openai\"\nbase_url = \"{MOCK}\"\n";
    assert!(toml.contains(openai) && toml.contains(&format!("rpm = {LIMIT}\n")));
    toml.replace(&format!("rpm = {LIMIT}\n"), "rpm = 100\n")
        .replace(openai, &format!("{openai}rpm = {LIMIT}\n"))
}

/// The nodes and their cluster's id.
async fn nodes(spillover: [bool; 2], upstream: &tollgate::mock::MockHandle) -> (Vec<Node>, String) {
    shaped_nodes(spillover, Shape::default(), upstream).await
}

/// [`nodes`] of `shape`.
async fn shaped_nodes(
    spillover: [bool; 2],
    shape: Shape,
    upstream: &tollgate::mock::MockHandle,
) -> (Vec<Node>, String) {
    let ports = [free_udp_port(), free_udp_port()];
    let mut nodes = Vec::new();
    for (i, on) in spillover.into_iter().enumerate() {
        nodes.push(node(&spill_toml(i, &ports, on, shape), &[upstream]).await);
    }
    for n in &nodes {
        wait_members(n, 2).await;
    }
    (nodes, format!("test-{}", ports[0]))
}

const SPILLED_SERVED: &str = "tollgate_spilled_total{outcome=\"served\"}";
const SPILLED_FAILED: &str = "tollgate_spilled_total{outcome=\"failed\"}";
const RECEIVED_200: &str = "tollgate_spill_received_total{api=\"chat\",status=\"200\"}";

/// `series`' value in a node's `/metrics` text (0 when absent).
fn count(text: &str, series: &str) -> u64 {
    (text.lines())
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().unwrap())
}

/// A node's `tollgate_spilled_total` lines.
fn spilled_lines(text: &str) -> Vec<String> {
    (text.lines())
        .filter(|l| l.starts_with("tollgate_spilled_total{"))
        .map(str::to_owned)
        .collect()
}

/// A spill hop to `peer` made by hand, as node-0 sends one: tagged with the
/// keys of `cluster_id` under `secret`, naming `header_cluster` as its cluster.
fn spilled_by_hand(
    peer: &str,
    (cluster_id, secret): (&str, &str),
    header_cluster: &str,
    extra: &[(&str, &str)],
    body: &serde_json::Value,
) -> reqwest::RequestBuilder {
    let bearer = format!("Bearer {KEY}");
    let mut headers = vec![
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
        ("x-tollgate-cluster-id", header_cluster),
        ("x-tollgate-spilled-from", "node-0"),
    ];
    headers.extend_from_slice(extra);
    let path = "/internal/v1/spill/chat";
    let body = serde_json::to_vec(body).unwrap();
    rpc_post(peer, path, (cluster_id, secret), &headers, body)
}

/// The internal RPC address of `node`'s peer (a 2-node cluster).
async fn rpc_addr_of_peer(node: &Node) -> String {
    let cluster = admin(node, "/admin/cluster").await;
    (cluster["cluster"]["members"].as_array().unwrap().iter())
        .find(|m| m["is_self"] == false)
        .unwrap()["rpc_addr"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Sends one request to `node` until it is served (a cluster just formed may
/// refuse while its owners settle).
async fn served_once(node: &Node) {
    for _ in 0..50 {
        if post(node, "/chat/completions", chat_body("hi", 5), &[])
            .await
            .status()
            == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no request was served in 5 s");
}

/// What one run's requests at the busy node came to.
#[derive(Debug, Default)]
struct Run {
    /// Answered 200 by the busy node itself.
    served_here: u64,
    /// Answered 200 by the peer (`x-tollgate-served-by`).
    served_by_peer: u64,
    /// Refused (429).
    refused: u64,
    /// What the mock admitted in all.
    upstream: u64,
    /// Spills with no answer from the peer (the client got the busy node's 429).
    failed: u64,
    /// What the busy node's tenant actor counts used in the window.
    tenant_used_here: u64,
    /// What it served, and so charged, by the clients' and the metrics' count.
    tenant_charged_here: u64,
}

/// Both nodes get 5 requests (each has demand: shares split L = 30 between them),
/// then the first node alone gets 45 more from 5 client loops. Its share grows
/// with its demand to about 20 of 30; the peer keeps a share of about 10 (twice
/// its demand) with 5 of it used, which only spillover can serve.
async fn busy_first_node(spillover: [bool; 2]) -> Run {
    busy_first_node_shaped(spillover, Shape::default()).await
}

/// [`busy_first_node`] with the clients and limits of `shape`.
async fn busy_first_node_shaped(spillover: [bool; 2], shape: Shape) -> Run {
    let upstream = mock(|_| {}).await;
    let (nodes, _) = shaped_nodes(spillover, shape, &upstream).await;
    for _ in 0..5 {
        for n in &nodes {
            served_once(n).await;
        }
    }
    // Let the peers see both demands (two sync rounds and gossip).
    tokio::time::sleep(Duration::from_millis(500)).await;
    // What the formation's refusals may have spilled already.
    let sent_before = metrics(&nodes[0]).await;
    let failed_before = count(&sent_before, SPILLED_FAILED);
    let sent_before = count(&sent_before, SPILLED_SERVED);
    let received_before = metrics(&nodes[1]).await;
    let peer_spilled_before = spilled_lines(&received_before);
    let received_before = count(&received_before, &shape.received_200());
    let busy = std::sync::Arc::new(nodes);
    let mut loops = Vec::new();
    for _ in 0..5 {
        let busy = busy.clone();
        loops.push(tokio::spawn(async move {
            let mut run = Run::default();
            let (path, body, headers) = shape.request();
            for _ in 0..9 {
                let answer = post(&busy[0], path, body.clone(), headers).await;
                match answer.status().as_u16() {
                    200 if answer.headers().get("x-tollgate-served-by").is_some() => {
                        assert_eq!(answer.headers()["x-tollgate-served-by"], "node-1");
                        let text = answer.text().await.unwrap();
                        if shape.stream {
                            // Streamed through the hop whole, to its end.
                            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
                        } else if shape.anthropic {
                            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
                            assert_eq!(json["type"], "message", "{json}");
                            assert!(json["content"][0]["text"].is_string(), "{json}");
                        } else {
                            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
                            assert!(json["choices"][0]["message"]["content"].is_string());
                        }
                        run.served_by_peer += 1;
                    }
                    200 => run.served_here += 1,
                    429 => {
                        let body: serde_json::Value = answer.json().await.unwrap();
                        if shape.anthropic {
                            assert_eq!(body["type"], "error", "{body}");
                            assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
                        } else {
                            assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
                        }
                        run.refused += 1;
                    }
                    other => panic!("unexpected status {other}"),
                }
            }
            run
        }));
    }
    let mut run = Run::default();
    for l in loops {
        let part = l.await.unwrap();
        run.served_here += part.served_here;
        run.served_by_peer += part.served_by_peer;
        run.refused += part.refused;
    }
    let Ok(nodes) = std::sync::Arc::try_unwrap(busy) else {
        panic!("a client loop still holds the nodes")
    };
    let sent = metrics(&nodes[0]).await;
    let received = metrics(&nodes[1]).await;
    run.upstream = upstream.stats().admitted;
    // The busy node's tenant charged only what it served itself (5 warm-up
    // requests and its own 200s): a request spilled after its upstream refused
    // it had its tenant charge cancelled here first (the peer charged it).
    let tenant = nodes[0].key("tenant:t").await;
    run.tenant_used_here = tenant["requests"]["used"].as_u64().unwrap();
    // What it charged: its 5 warm-up requests less those the peer served for it,
    // its own 200s since, and the peer's warm-up requests it served for the peer.
    run.tenant_charged_here = (5 + run.served_here + count(&sent, RECEIVED_200))
        .checked_sub(sent_before)
        .unwrap();
    run.failed = count(&sent, SPILLED_FAILED) - failed_before;
    println!("spillover {spillover:?}: {run:?}");
    // Each node's metrics agree with what the clients saw.
    assert_eq!(
        count(&sent, SPILLED_SERVED) - sent_before,
        run.served_by_peer
    );
    assert_eq!(
        count(&received, &shape.received_200()) - received_before,
        run.served_by_peer
    );
    println!(
        "spills refused by the peer: {}, no peer with room: {}",
        count(&sent, "tollgate_spilled_total{outcome=\"refused\"}"),
        count(&sent, "tollgate_spilled_total{outcome=\"no_peer\"}")
    );
    // The peer's clients sent nothing meanwhile, and what it received it never
    // spilled on.
    assert_eq!(spilled_lines(&received), peer_spilled_before);
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_for_want_of_its_nodes_share_is_served_by_a_peer_with_room() {
    let (off, on) = off_then_on(Shape::default()).await;
    assert!(
        on.upstream > off.upstream,
        "spillover served no more: {} against {}",
        on.upstream,
        off.upstream
    );
}

/// The busy-node scenario of `shape` without spillover, then with it: without,
/// the peer's room is stranded; with it, some is used; either way the cluster
/// stays within L.
async fn off_then_on(shape: Shape) -> (Run, Run) {
    let off = busy_first_node_shaped([false, false], shape).await;
    let on = busy_first_node_shaped([true, true], shape).await;
    assert_eq!(off.served_by_peer, 0);
    assert!(on.served_by_peer > 0, "nothing was spilled: {on:?}");
    for run in [&off, &on] {
        assert!(
            run.upstream <= LIMIT,
            "{} sent of L = {LIMIT}",
            run.upstream
        );
    }
    (off, on)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spill_route_wants_a_tag_under_the_cluster_secret_and_serves_a_spilled_request() {
    let upstream = mock(|_| {}).await;
    let (nodes, cluster_id) = nodes([true, true], &upstream).await;
    // Credit at the peer first: a spilled request waits at most its max wait.
    served_once(&nodes[1]).await;
    let before = upstream.stats().admitted;
    let peer = rpc_addr_of_peer(&nodes[0]).await;
    let spill = |secret: &str, id: &str| {
        spilled_by_hand(&peer, (&cluster_id, secret), id, &[], &chat_body("hi", 5)).send()
    };
    let wrong = spill("not-the-secret-at-all", &cluster_id).await.unwrap();
    assert_eq!(wrong.status(), 401);
    let other_cluster = spill(SECRET, "another-cluster").await.unwrap();
    assert_eq!(other_cluster.status(), 401);
    let refusals = metrics(&nodes[1]).await;
    for reason in ["wrong_secret", "cluster_id"] {
        let series = format!("tollgate_internal_rpc_refused_total{{reason=\"{reason}\"}}");
        assert_eq!(count(&refusals, &series), 1, "{reason}: {refusals}");
    }
    assert_eq!(
        upstream.stats().admitted,
        before,
        "a refused spill reached the upstream"
    );
    let right = spill(SECRET, &cluster_id).await.unwrap();
    assert_eq!(right.status(), 200);
    assert_eq!(right.headers()["x-tollgate-served-by"], "node-1");
    let body: serde_json::Value = right.json().await.unwrap();
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );
    assert_eq!(upstream.stats().admitted, before + 1);
    // Spend the rest of L (the upstream's count is the truth: one 429 at the
    // peer only says its share was spent then, and shares follow demand), then
    // spill it one more: it refuses, and does not spill a spilled request on
    // (without that rule it would look for room at the first node, and count
    // it). The peer's own clients' refusals may spill to the first node
    // meanwhile.
    let spent = Instant::now() + Duration::from_secs(20);
    while upstream.stats().admitted < LIMIT {
        assert!(Instant::now() < spent, "L was never spent");
        let answer = post(&nodes[1], "/chat/completions", chat_body("hi", 5), &[]).await;
        if answer.status() != 200 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let before = spilled_lines(&metrics(&nodes[1]).await);
    let refused = spill(SECRET, &cluster_id).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["x-tollgate-served-by"], "node-1");
    let peer_metrics = metrics(&nodes[1]).await;
    assert_eq!(spilled_lines(&peer_metrics), before);
    assert!(
        peer_metrics.contains("tollgate_spill_received_total{api=\"chat\",status=\"429\"} 1"),
        "{peer_metrics}"
    );
    let path = "/internal/v1/spill/images";
    let unknown = rpc_post(&peer, path, (&cluster_id, SECRET), &[], Vec::new())
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// A peer with spillover off publishes no `m:spills`: the busy node never sends
/// it a request (it would find no spill route there) and answers its own 429,
/// in OpenAI's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_spillover_off_is_never_sent_a_request() {
    let run = busy_first_node([true, false]).await;
    assert_eq!(run.served_by_peer, 0);
    assert_eq!(run.failed, 0, "a hop was tried: {run:?}");
    assert!(run.refused > 0, "{run:?}");
    assert!(run.upstream <= LIMIT);
}

/// Streamed answers spilled to the peer reach the client whole (SSE through the
/// hop, to `data: [DONE]`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spilled_streams_reach_the_client_whole() {
    let shape = Shape {
        stream: true,
        ..Shape::default()
    };
    let run = busy_first_node_shaped([true, true], shape).await;
    assert!(run.served_by_peer > 0, "nothing was spilled: {run:?}");
    assert!(run.upstream <= LIMIT);
}

/// Anthropic's Messages API spills as OpenAI's does: the peer's answer reaches
/// the client in Anthropic's shape, and so does the busy node's own 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_requests_spill_in_their_own_shape() {
    let shape = Shape {
        anthropic: true,
        ..Shape::default()
    };
    let run = busy_first_node_shaped([true, true], shape).await;
    assert!(run.served_by_peer > 0, "nothing was spilled: {run:?}");
    assert!(run.upstream <= LIMIT);
}

/// A spilled request is served only within what its sender had left of its
/// time: the sender answers its client by then, so the peer must not hold an
/// upstream call past it (it ran to its own `request_timeout` before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spilled_request_is_served_only_within_its_senders_time_left() {
    // Every answer takes 2 s to start.
    let upstream = mock(|c| c.latency_ms = 2_000).await;
    let (nodes, cluster_id) = nodes([true, true], &upstream).await;
    // Credit at the peer first: a spilled request waits at most its max wait.
    served_once(&nodes[1]).await;
    let peer = rpc_addr_of_peer(&nodes[0]).await;
    let started = Instant::now();
    let time_left = [("x-tollgate-spill-time-left-ms", "400")];
    let body = chat_body("hi", 5);
    let answer = spilled_by_hand(&peer, (&cluster_id, SECRET), &cluster_id, &time_left, &body)
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(answer.headers()["x-tollgate-served-by"], "node-1");
    assert_eq!(answer.status(), 504, "{:?}", answer.text().await);
    assert!(
        took < Duration::from_millis(1_500),
        "answered after {took:?}"
    );
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// A draining peer (stopping gracefully, a stream still in flight) refuses
/// spilled requests with a bare 503, no `x-tollgate-served-by`: not a client's
/// answer, so its sender answers its own client instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_peer_refuses_spills_without_serving_them() {
    // Streams of 5 tokens at 1 s each: the peer drains for about 5 s.
    let upstream = mock(|c| c.inter_token_ms = 1_000).await;
    let (mut nodes, cluster_id) = nodes([true, true], &upstream).await;
    // Credit at the peer first (a 5 s answer).
    served_once(&nodes[1]).await;
    let warmed = upstream.stats().admitted;
    let peer = rpc_addr_of_peer(&nodes[0]).await;
    let mut body = chat_body("hi", 5);
    body["stream"] = serde_json::json!(true);
    let url = format!("{}/chat/completions", nodes[1].url());
    let stream = tokio::spawn(async move {
        let answer = reqwest::Client::new()
            .post(url)
            .bearer_auth(KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        (answer.status(), answer.text().await.unwrap())
    });
    // The stream is in flight at the peer once the upstream has it.
    let started = Instant::now() + Duration::from_secs(5);
    while upstream.stats().admitted == warmed {
        assert!(
            Instant::now() < started,
            "the stream never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nodes[1].begin_stop();
    tokio::time::sleep(Duration::from_millis(200)).await;
    refused_bare(&peer, &cluster_id, &upstream, "a draining peer").await;
    // The stream in flight still ends whole.
    let (status, text) = stream.await.unwrap();
    assert_eq!(status, 200);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// A hop that fails after its request went out (the peer may have served it:
/// here it surely did) is sent nowhere again: its client gets this node's own
/// 429 at once, neither a wait and a serving here nor a second hop. The peer
/// advertises its internal RPC (`cluster.rpc_advertise`) at a proxy that
/// delivers every spilled request and cuts the connection as the peer answers;
/// its lease statements pass through the same proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hop_cut_after_delivery_gets_this_nodes_429_at_once_and_is_never_sent_again() {
    let upstream = mock(|_| {}).await;
    let ports = [free_udp_port(), free_udp_port()];
    // The busy node waits up to 2 s for credit: a request it kept after a cut
    // hop would be answered after that wait (or served here).
    let busy = spill_toml(0, &ports, true, Shape::default())
        .replace("max_wait = \"200ms\"", "max_wait = \"2s\"");
    let peer = spill_toml(1, &ports, true, Shape::default());
    let rpc_line = (peer.lines())
        .find(|l| l.starts_with("rpc_listen = "))
        .unwrap()
        .to_owned();
    let rpc: std::net::SocketAddr = rpc_line["rpc_listen = ".len()..]
        .trim_matches('"')
        .parse()
        .unwrap();
    let proxy = crate::common::cutting_proxy::CuttingProxy::start(rpc).await;
    let peer = peer.replace(
        &rpc_line,
        &format!("{rpc_line}\nrpc_advertise = \"{}\"", proxy.addr),
    );
    let nodes = vec![
        node(&busy, &[&upstream]).await,
        node(&peer, &[&upstream]).await,
    ];
    for n in &nodes {
        wait_members(n, 2).await;
    }
    // Peers dial the advertised address, not the one the peer listens on.
    assert_eq!(rpc_addr_of_peer(&nodes[0]).await, proxy.addr.to_string());
    // Demand on both nodes (the peer's share keeps room it does not use); the
    // statements through the proxy are what serve these.
    for _ in 0..5 {
        for n in &nodes {
            served_once(n).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cut_before = proxy.cut().len();
    let admitted_before = upstream.stats().admitted;
    let sent_before = metrics(&nodes[0]).await;
    let received_before = count(&metrics(&nodes[1]).await, RECEIVED_200);
    // The busy node alone, one request at a time, each told apart by its text,
    // until two hops were cut.
    let mut answers = Vec::new();
    for i in 0..40 {
        let text = format!("cut-probe-{i}-end");
        let answer = post(&nodes[0], "/chat/completions", chat_body(&text, 5), &[]).await;
        let status = answer.status().as_u16();
        let body: serde_json::Value = answer.json().await.unwrap();
        answers.push((text, status, Instant::now(), body));
        if proxy.cut().len() >= cut_before + 2 {
            break;
        }
    }
    let cut = proxy.cut()[cut_before..].to_vec();
    assert!(!cut.is_empty(), "no hop was cut: {answers:?}");
    for (cut_at, request) in &cut {
        let (text, status, answered_at, body) = (answers.iter())
            .find(|(text, ..)| request.contains(text.as_str()))
            .unwrap_or_else(|| panic!("a cut hop no client sent: {request}"));
        assert_eq!(*status, 429, "{text}: {body}");
        assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
        // At once after the cut, not after a wait here (a hop at once on a
        // refusal, before the wait, is the case this tells apart).
        let after = answered_at.saturating_duration_since(*cut_at);
        assert!(
            after < Duration::from_millis(1_000),
            "{text}: answered {after:?} after its hop was cut"
        );
        let hops = cut
            .iter()
            .filter(|(_, r)| r.contains(text.as_str()))
            .count();
        assert_eq!(hops, 1, "{text} was sent to the peer {hops} times");
    }
    let sent = metrics(&nodes[0]).await;
    assert_eq!(
        count(&sent, SPILLED_FAILED) - count(&sent_before, SPILLED_FAILED),
        cut.len() as u64,
        "each cut hop counted failed"
    );
    // The peer served each one (it answered 200 into the cut connection).
    let received = count(&metrics(&nodes[1]).await, RECEIVED_200) - received_before;
    assert_eq!(received, cut.len() as u64);
    // The upstream saw each request once: every 200 a client got, plus the cut
    // hops the peer served and nobody read.
    let client_200s = answers.iter().filter(|(_, s, ..)| *s == 200).count() as u64;
    assert_eq!(
        upstream.stats().admitted - admitted_before,
        client_200s + cut.len() as u64
    );
    println!(
        "{} requests: {client_200s} served, {} hops cut; answers to the cut ones: {:?}",
        answers.len(),
        cut.len(),
        (cut.iter())
            .map(|(at, r)| {
                let (t, s, answered, _) = (answers.iter())
                    .find(|(t, ..)| r.contains(t.as_str()))
                    .unwrap();
                (t, s, answered.saturating_duration_since(*at))
            })
            .collect::<Vec<_>>()
    );
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// A spill sent by hand to `peer` is refused with a bare 503 (no
/// `x-tollgate-served-by`: not the client's answer) and sends nothing upstream.
async fn refused_bare(
    peer: &str,
    cluster_id: &str,
    upstream: &tollgate::mock::MockHandle,
    who: &str,
) {
    let admitted = upstream.stats().admitted;
    let body = chat_body("hi", 5);
    let answer = spilled_by_hand(peer, (cluster_id, SECRET), cluster_id, &[], &body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 503, "{who}");
    assert!(
        answer.headers().get("x-tollgate-served-by").is_none(),
        "{who} gave its refusal as the client's answer"
    );
    assert_eq!(upstream.stats().admitted, admitted, "{who} served a spill");
}

/// [`nodes`] with spillover on both, the peer's `[server]` given `settings`.
async fn nodes_with_peer_server(
    settings: &str,
    upstream: &tollgate::mock::MockHandle,
) -> (Vec<Node>, String) {
    let ports = [free_udp_port(), free_udp_port()];
    let busy = spill_toml(0, &ports, true, Shape::default());
    let peer = format!(
        "[server]\n{settings}\n{}",
        spill_toml(1, &ports, true, Shape::default())
    );
    let nodes = vec![
        node(&busy, &[upstream]).await,
        node(&peer, &[upstream]).await,
    ];
    for n in &nodes {
        wait_members(n, 2).await;
    }
    (nodes, format!("test-{}", ports[0]))
}

/// A peer at its in-flight limit refuses a spill with a bare 503 (not the
/// client's answer), so the sender may still serve it or answer its own 429
/// with a wait; before, the client got the peer's "in-flight limit" 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_at_its_in_flight_limit_refuses_spills_without_serving_them() {
    // Every answer takes 1 s to start.
    let upstream = mock(|c| c.latency_ms = 1_000).await;
    let (nodes, cluster_id) = nodes_with_peer_server("max_in_flight = 1", &upstream).await;
    served_once(&nodes[1]).await;
    // The peer's one slot, taken by its own client's request.
    let url = format!("{}/chat/completions", nodes[1].url());
    let holding =
        tokio::spawn(async move { post_url(&url, "", chat_body("hi", 5)).await.status() });
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.stats().in_flight == 0 {
        assert!(
            Instant::now() < deadline,
            "the peer's own request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let peer = rpc_addr_of_peer(&nodes[0]).await;
    refused_bare(
        &peer,
        &cluster_id,
        &upstream,
        "a peer at its in-flight limit",
    )
    .await;
    assert_eq!(holding.await.unwrap(), 200);
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// A stream spilled to `nodes[1]` (as a hop sends it, by hand), read whole in
/// the background once the peer's upstream has it: its status and text.
async fn spilled_stream_in_flight(
    nodes: &[Node],
    cluster_id: &str,
    upstream: &tollgate::mock::MockHandle,
) -> tokio::task::JoinHandle<(u16, String)> {
    served_once(&nodes[1]).await;
    let admitted = upstream.stats().admitted;
    let peer = rpc_addr_of_peer(&nodes[0]).await;
    let mut body = chat_body("hi", 5);
    body["stream"] = serde_json::json!(true);
    let cluster_id = cluster_id.to_owned();
    let stream = tokio::spawn(async move {
        let answer = spilled_by_hand(&peer, (&cluster_id, SECRET), &cluster_id, &[], &body)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.text().await.unwrap_or_default())
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while upstream.stats().admitted == admitted {
        assert!(
            Instant::now() < deadline,
            "the spilled stream never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stream
}

/// A node stopping lets requests peers spilled to it end within its
/// `server.shutdown_grace`, as its own clients' requests do (they share it),
/// before it gives its credit back and leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_lets_a_spilled_stream_end_before_it_leaves() {
    // Streams of 5 tokens at 300 ms each.
    let upstream = mock(|c| c.inter_token_ms = 300).await;
    let (mut nodes, cluster_id) = nodes([true, true], &upstream).await;
    let stream = spilled_stream_in_flight(&nodes, &cluster_id, &upstream).await;
    let started = Instant::now();
    nodes.pop().unwrap().stop().await;
    let (status, text) = stream.await.unwrap();
    assert_eq!(status, 200);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "stopped in {:?}, before the stream could end",
        started.elapsed()
    );
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// ... and no longer: a spilled stream that outlasts the grace does not hold
/// the stop (the internal RPC server's graceful stop would wait for it without
/// bound: 5 s here against a 1 s grace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spilled_stream_does_not_hold_a_stopping_node_past_its_grace() {
    // Streams of 5 tokens at 1 s each.
    let upstream = mock(|c| c.inter_token_ms = 1_000).await;
    let (mut nodes, cluster_id) =
        nodes_with_peer_server("shutdown_grace = \"1s\"", &upstream).await;
    let _stream = spilled_stream_in_flight(&nodes, &cluster_id, &upstream).await;
    let started = Instant::now();
    nodes.pop().unwrap().stop().await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(3_000),
        "the stop took {took:?} with a 5 s spilled stream and a 1 s grace"
    );
    for n in nodes {
        n.stop().await;
    }
    upstream.shutdown().await.unwrap();
}

/// With the upstream's limit the binding one, a request its upstream refused
/// after its wait spills, its tenant charge here cancelled first: the busy node
/// serves its share, the peer its room, the cluster stays within L, and the busy
/// node's tenant counts only what it served itself (a warm-up request either
/// node spilled to the other counts where it was served).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_its_upstream_refused_spills_with_its_tenant_charge_cancelled() {
    let shape = Shape {
        upstream_limited: true,
        ..Shape::default()
    };
    let (off, on) = off_then_on(shape).await;
    for run in [&off, &on] {
        assert_eq!(run.tenant_used_here, run.tenant_charged_here, "{run:?}");
    }
}
