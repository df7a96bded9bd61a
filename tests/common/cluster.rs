//! Cluster test support: 3-node clusters over real UDP gossip (or chitchat's
//! in-memory transport), admin reads, and client load spread over the nodes.

use super::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

pub(crate) const LIMIT: u64 = 30;

/// The shared secret of test clusters.
pub(crate) const SECRET: &str = "test-cluster-secret-0123456789";

/// A POST to a node's internal RPC at `rpc` (`host:port`) on `path`, tagged as
/// a member of `cluster_id` holding `secret` would tag it.
pub(crate) fn rpc_post(
    rpc: &str,
    path: &str,
    (cluster_id, secret): (&str, &str),
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> reqwest::RequestBuilder {
    use tollgate_cluster::auth::rpc::{Request, RpcSigner};
    use tollgate_cluster::auth::{ClusterKeys, keys::Channel, unix_ms};
    let keys = ClusterKeys::new(cluster_id, secret, &[], Channel::Rpc).unwrap();
    let pairs: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    let request = Request {
        to: rpc,
        path,
        headers: &pairs,
        body: &body,
    };
    let (auth, _) = RpcSigner::new(keys).sign(&request, unix_ms());
    let mut request = reqwest::Client::new()
        .post(format!("http://{rpc}{path}"))
        .header("x-tollgate-auth", auth);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(body)
}

/// A port for a socket a node binds later (its RPC listener, its gossip socket).
/// Taken below the kernel's ephemeral range (32768-60999 by default) and never
/// twice in this process: a port from `bind(0)` could be handed to another
/// test's `bind(0)` listener before the node binds it ("Address already in use"
/// for a lease RPC port). Each test process gets its own 500-port block.
fn reserved_port(free: impl Fn(u16) -> bool) -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 24) as u16 * 500;
    for _ in 0..500 {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 500;
        if free(port) {
            return port;
        }
    }
    panic!("no free port in 20000-32000 for this test process");
}

pub(crate) fn free_tcp_port() -> u16 {
    reserved_port(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
}

pub(crate) fn free_udp_port() -> u16 {
    reserved_port(|p| std::net::UdpSocket::bind(("127.0.0.1", p)).is_ok())
}

/// Node `i`'s config: gossip on `ports[i]`, a free RPC port, the shared secret,
/// 50 ms gossip (failure detection under 1 s) and a 1 s lease ttl.
pub(crate) fn cluster_toml(i: usize, ports: &[u16], mode: &str, share: &str) -> String {
    let seeds: Vec<String> = ports
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, p)| format!("\"127.0.0.1:{p}\""))
        .collect();
    format!(
        r#"{}
[cluster]
cluster_id = "test-{}"
node_id = "node-{i}"
gossip_listen = "127.0.0.1:{}"
rpc_listen = "127.0.0.1:{}"
secret = "{SECRET}"
seeds = [{}]
gossip_interval = "50ms"
sync_interval = "100ms"
mode = "{mode}"
local_share = "{share}"

[cluster.lease]
ttl = "1s"
rpc_timeout = "200ms"
"#,
        single(&format!("rpm = {LIMIT}\nmax_wait = \"0s\"")),
        ports[0],
        ports[i],
        free_tcp_port(),
        seeds.join(", ")
    )
}

pub(crate) async fn cluster(
    mode: &str,
    share: &str,
    upstream: &tollgate::mock::MockHandle,
) -> Vec<Arc<Node>> {
    let ports: Vec<u16> = (0..3).map(|_| free_udp_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(Arc::new(
            node(&cluster_toml(i, &ports, mode, share), &[upstream]).await,
        ));
    }
    // Wait until every node sees all three members.
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in &nodes {
        loop {
            let body = admin(n, "/admin/cluster").await;
            if body["cluster"]["members"]
                .as_array()
                .is_some_and(|m| m.len() == 3)
            {
                break;
            }
            assert!(Instant::now() < deadline, "cluster did not form: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    nodes
}

pub(crate) async fn admin(node: &Node, path: &str) -> serde_json::Value {
    let response = reqwest::Client::new()
        .get(format!("http://{}{path}", node.addr))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    json(response).await
}

/// Each node sends at its own rate (fail fast) for `seconds`; returns admissions.
pub(crate) async fn uneven_demand(nodes: &[Arc<Node>], per_second: [u64; 3], seconds: u64) -> u64 {
    let mut tasks = Vec::new();
    for (node, rate) in nodes.iter().zip(per_second) {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            let gap = Duration::from_millis(1000 / rate);
            let end = Instant::now() + Duration::from_secs(seconds);
            while Instant::now() < end {
                if post(&node, "/chat/completions", chat_body("hi", 5), &[])
                    .await
                    .status()
                    == 200
                {
                    admitted += 1;
                }
                tokio::time::sleep(gap).await;
            }
            admitted
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

pub(crate) async fn stop_all(nodes: Vec<Arc<Node>>) {
    for n in nodes {
        if let Ok(n) = Arc::try_unwrap(n) {
            n.stop().await;
        }
    }
}

pub(crate) fn allowance(body: &serde_json::Value, key: &str) -> u64 {
    body["allowances"][key]["allowance"]
        .as_u64()
        .unwrap_or_else(|| panic!("no allowance for {key}: {body}"))
}

/// The view every node has of `key`'s global usage.
pub(crate) async fn views(nodes: &[Node], key: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for n in nodes {
        out.push(
            admin(n, "/admin/cluster").await["cluster"]["global_usage"][key]
                .as_u64()
                .unwrap_or(0),
        );
    }
    out
}

pub(crate) async fn members_seen(node: &Node) -> usize {
    admin(node, "/admin/cluster").await["cluster"]["members"]
        .as_array()
        .map_or(0, |m| m.len())
}

/// Three nodes gossiping over chitchat's in-memory transport (logical ports, never
/// bound), each config made by `toml(i, ports)`; returns once all see three members.
pub(crate) async fn channel_cluster(
    ports: [u16; 3],
    toml: impl Fn(usize, &[u16]) -> String,
    upstream: &tollgate::mock::MockHandle,
) -> (
    tollgate_cluster::chitchat::transport::ChannelTransport,
    Vec<Arc<Node>>,
) {
    use tollgate_cluster::chitchat::transport::{ChannelTransport, Transport};
    let transport = ChannelTransport::default();
    let mut nodes = Vec::new();
    for i in 0..3 {
        let shared: Arc<dyn Transport> = Arc::new(transport.clone());
        let node = node_with_transport(&toml(i, &ports), &[upstream], Some(shared)).await;
        nodes.push(Arc::new(node));
    }
    for n in &nodes {
        wait_members(n, 3).await;
    }
    (transport, nodes)
}

/// Cuts node 3 off from nodes 1 and 2 and waits until both sides noticed.
pub(crate) async fn cut_off_third(
    transport: &tollgate_cluster::chitchat::transport::ChannelTransport,
    ports: [u16; 3],
    nodes: &[Arc<Node>],
) {
    let addr = |i: usize| std::net::SocketAddr::from(([127, 0, 0, 1], ports[i]));
    transport.remove_link(addr(2), addr(0)).await;
    transport.remove_link(addr(2), addr(1)).await;
    let cut = Instant::now() + Duration::from_secs(10);
    while members_seen(&nodes[0]).await != 2 || members_seen(&nodes[2]).await != 1 {
        assert!(Instant::now() < cut, "the cut was never detected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Undoes [`cut_off_third`].
pub(crate) async fn heal_third(
    transport: &tollgate_cluster::chitchat::transport::ChannelTransport,
    ports: [u16; 3],
) {
    let addr = |i: usize| std::net::SocketAddr::from(([127, 0, 0, 1], ports[i]));
    transport.add_link(addr(2), addr(0)).await;
    transport.add_link(addr(2), addr(1)).await;
}

/// Waits until the in-memory gossip socket on `port` is closed. A crashed
/// node's chitchat runs in a task of its own, which ends a moment after the
/// node's task is aborted (later on a loaded machine), and until then a
/// successor on the same address fails to start ("Address not available":
/// without this wait, `in_gossip_a_successor_charges_what_the_survivors_charge`
/// fails 2 in 14 runs beside two busy loops).
pub(crate) async fn wait_gossip_released(
    transport: &tollgate_cluster::chitchat::transport::ChannelTransport,
    port: u16,
) {
    use tollgate_cluster::chitchat::transport::Transport;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(10);
    // An open socket is closed again as it drops.
    while transport.open(addr).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the crashed node's gossip socket on {addr} was never closed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `node` sees `n` live members (10 s at most).
pub(crate) async fn wait_members(node: &Node, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while members_seen(node).await != n {
        assert!(Instant::now() < deadline, "never saw {n} members");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each of `urls` (nodes' `/v1` URLs) sends at its rate for `seconds`, one request
/// at a time; returns admissions per URL.
pub(crate) async fn load(urls: Vec<String>, per_second: &[u64], seconds: f64) -> Vec<u64> {
    let mut tasks = Vec::new();
    for (url, rate) in urls.into_iter().zip(per_second) {
        let gap = Duration::from_millis(1000 / rate);
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            while Instant::now() < end {
                let response = post_url(&url, "/chat/completions", chat_body("hi", 5)).await;
                if response.status() == 200 {
                    admitted += 1;
                }
                tokio::time::sleep(gap).await;
            }
            admitted
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// The `/v1` URLs of `nodes`.
pub(crate) fn urls<N: std::borrow::Borrow<Node>>(nodes: &[N]) -> Vec<String> {
    nodes.iter().map(|n| n.borrow().url()).collect()
}

/// A bare membership (no gateway) as `node-1` of generation `generation` on
/// `ports[1]`, seeded by the node on `ports[0]` and in its cluster, announcing
/// `metadata`: a member the node trusts and reads (gossip every 50 ms, sealed
/// under the cluster secret).
pub(crate) async fn bare_member(
    ports: &[u16],
    generation: u64,
    metadata: tollgate_cluster::membership::NodeMetadata,
) -> tollgate_cluster::membership::Membership {
    let transport = sealed_gossip(&format!("test-{}", ports[0]), SECRET);
    bare_member_over(ports, "node-1", generation, metadata, &transport).await
}

/// The gossip transport of a member of `cluster_id` holding `secret`.
pub(crate) fn sealed_gossip(
    cluster_id: &str,
    secret: &str,
) -> tollgate_cluster::auth::transport::SealedUdpTransport {
    use tollgate_cluster::auth::{ClusterKeys, Refusals, keys::Channel};
    let keys = ClusterKeys::new(cluster_id, secret, &[], Channel::Gossip).unwrap();
    tollgate_cluster::auth::transport::SealedUdpTransport::new(
        keys,
        Arc::new(Refusals::new(|_| {})),
    )
}

/// As [`bare_member`], as `node_id`, gossiping over `transport`.
pub(crate) async fn bare_member_over(
    ports: &[u16],
    node_id: &str,
    generation: u64,
    metadata: tollgate_cluster::membership::NodeMetadata,
    transport: &dyn tollgate_cluster::chitchat::transport::Transport,
) -> tollgate_cluster::membership::Membership {
    use tollgate_cluster::membership::{Membership, MembershipConfig};
    let gossip = std::net::SocketAddr::from(([127, 0, 0, 1], ports[1]));
    let cluster_id = format!("test-{}", ports[0]);
    let mut config = MembershipConfig::new(cluster_id, node_id, generation, gossip, metadata);
    config.seeds = vec![format!("127.0.0.1:{}", ports[0])];
    config.gossip_interval = Duration::from_millis(50);
    Membership::start(config, transport).await.unwrap()
}
