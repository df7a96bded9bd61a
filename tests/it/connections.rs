//! A node as a real process whose open-file limit is lower than the
//! connections an attacker holds: idle and trickling connections from other
//! addresses do not stop it serving (the listener's caps and timeouts,
//! src/listen/).

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use crate::common::*;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

/// The node's open-file limit, soft and hard.
const NOFILE: u32 = 256;

async fn connect_from(source: &str, to: SocketAddr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    tokio::time::timeout(Duration::from_secs(1), socket.connect(to))
        .await
        .ok()?
        .ok()
}

/// Whether the peer has closed `tcp` (read EOF or reset, or only a refusal
/// answer before the close) within `wait`.
async fn closed_within(tcp: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// A chat completion through the node at `base` is answered 200.
async fn chat_served(client: &reqwest::Client, base: &str) {
    let chat = client
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&chat_body("hi", 5))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200, "{}", chat.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_trickling_connections_beyond_the_descriptor_limit_do_not_stop_a_node() {
    // This process opens more sockets than the node may.
    tollgate::listen::nofile::raise_to_hard().unwrap();
    let upstream = mock(|_| {}).await;
    let toml = format!(
        "admin_token = \"{ADMIN}\"\nheader_timeout = \"2s\"\nmax_connections_per_ip = 16\n{}",
        single("rpm = 100000")
            .replace("{MOCK}", &upstream.base_url())
            .replace("{HASH}", &key_hash())
    );
    let node = crate::common::served::serve_with_nofile(&toml, NOFILE).await;
    let addr: SocketAddr = format!("127.0.0.1:{}", node.port).parse().unwrap();
    // 300 idle connections from one address, 40 trickling a header from
    // another: more than the node's 256 descriptors.
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.extend(connect_from("127.0.0.2", addr).await);
    }
    let mut trickling = Vec::new();
    for _ in 0..40 {
        trickling.extend(connect_from("127.0.0.3", addr).await);
    }
    let trickle = async {
        for byte in b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n" {
            for tcp in trickling.iter_mut() {
                let _ = tcp.write_all(&[*byte]).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // Meanwhile a client of its own keeps being served, health checks and
    // requests alike.
    let served = async {
        // A node out of descriptors never answers: fail rather than hang.
        let client = (reqwest::Client::builder())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let mut answered = 0;
        for _ in 0..10 {
            let health = client
                .get(format!("http://{addr}/healthz"))
                .send()
                .await
                .unwrap();
            assert_eq!(health.status(), 200);
            chat_served(&client, &format!("http://{addr}")).await;
            answered += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        answered
    };
    let ((), answered) = tokio::join!(trickle, served);
    assert_eq!(answered, 10);
    // Each address held at most its 16, the rest refused and closed; the
    // header timeout then closed the ones it held.
    let mut still_open = 0;
    for tcp in idle.iter_mut().chain(trickling.iter_mut()) {
        if !closed_within(tcp, Duration::from_secs(4)).await {
            still_open += 1;
        }
    }
    assert_eq!(still_open, 0, "connections outlived the header timeout");
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let refused = tollgate::ops::metrics::sample(
        &metrics,
        "tollgate_connections_refused_total{listener=\"proxy\",reason=\"per_ip\"}",
    )
    .unwrap_or(0.0);
    assert!(
        refused >= 300.0,
        "per-address refusals: {refused}\n{metrics}"
    );
    let limit = tollgate::ops::metrics::sample(&metrics, "tollgate_open_files_limit").unwrap();
    assert_eq!(limit, f64::from(NOFILE));
    upstream.shutdown().await.unwrap();
}

/// TLS on the proxy listener and the admin routes on a listener of their
/// own: the API is served over TLS only, `/metrics` and `/admin/*` move to
/// the admin listener (TLS too), `/healthz` answers on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_serves_tls_and_the_admin_routes_on_their_own_listener() {
    let certs = crate::common::certs::make_certs();
    let upstream = mock(|_| {}).await;
    let admin_port = crate::common::cluster::free_tcp_port();
    let toml = format!(
        "admin_token = \"{ADMIN}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\n\n[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n{}",
        certs.cert.display(),
        certs.key.display(),
        single("rpm = 100")
            .replace("{MOCK}", &upstream.base_url())
            .replace("{HASH}", &key_hash())
    );
    let node = crate::common::served::serve(&toml, |_| {}).await;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&certs.ca).unwrap()).unwrap();
    let client = (reqwest::Client::builder())
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let proxy = format!("https://localhost:{}", node.port);
    let admin = format!("https://localhost:{admin_port}");
    chat_served(&client, &proxy).await;
    // No plain HTTP on a TLS listener.
    let plain = reqwest::get(format!("http://127.0.0.1:{}/healthz", node.port)).await;
    assert!(plain.is_err() || plain.unwrap().status() != 200);
    let status = |url: String| {
        let client = client.clone();
        async move {
            client
                .get(url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(status(format!("{proxy}/healthz")).await, 200);
    assert_eq!(status(format!("{proxy}/metrics")).await, 404);
    assert_eq!(status(format!("{proxy}/admin/cluster")).await, 404);
    assert_eq!(status(format!("{admin}/healthz")).await, 200);
    assert_eq!(status(format!("{admin}/readyz")).await, 200);
    let metrics = (client.get(format!("{admin}/metrics")).send().await)
        .and_then(reqwest::Response::error_for_status)
        .unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains("tollgate_connections_open{listener=\"admin\"}"),
        "{metrics}"
    );
    upstream.shutdown().await.unwrap();
}
