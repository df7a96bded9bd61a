//! The listener over real sockets: what it closes, when, and what it refuses.

use super::*;
use axum::routing::{get, post};
use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tokio::time::Instant;

const SHORT: Duration = Duration::from_millis(300);

fn limits() -> Limits {
    Limits {
        header_timeout: SHORT,
        body_idle_timeout: SHORT,
        max_connections: 64,
        max_per_ip: None,
    }
}

/// [`limits`] with a header timeout no test here waits out.
fn patient() -> Limits {
    Limits {
        header_timeout: Duration::from_secs(30),
        ..limits()
    }
}

struct Serving {
    addr: SocketAddr,
    stats: Arc<Stats>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn serving(limits: Limits) -> Serving {
    let router = Router::new()
        .route("/ok", get(|| async { "ok" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(400)).await;
                "slow"
            }),
        )
        .route(
            "/len",
            post(|body: bytes::Bytes| async move { body.len().to_string() }),
        );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(Stats::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(
        listener,
        router,
        limits,
        Arc::clone(&stats),
        None,
        async {
            let _ = stopped.await;
        },
    ));
    Serving {
        addr,
        stats,
        stop,
        task,
    }
}

/// Reads until the peer closes (or 5 s pass); returns what came and when the
/// close did (`None`: still open).
async fn read_to_close(tcp: &mut TcpStream) -> (String, Option<Instant>) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                return (String::from_utf8_lossy(&out).into(), Some(Instant::now()));
            }
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&out).into(), None),
        }
    }
}

async fn get_ok(addr: SocketAddr) -> String {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    read_to_close(&mut tcp).await.0
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_timeout() {
    let s = serving(limits()).await;
    let opened = Instant::now();
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    let (got, closed) = read_to_close(&mut tcp).await;
    let took = closed.expect("never closed") - opened;
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(took >= SHORT && took < SHORT * 4, "closed after {took:?}");
}

#[tokio::test]
async fn a_trickled_header_is_cut_at_the_header_timeout() {
    let s = serving(limits()).await;
    let opened = Instant::now();
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    let header = b"GET /ok HTTP/1.1\r\nhost: x\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut cut = false;
    for byte in header {
        if tcp.write_all(&[*byte]).await.is_err() {
            cut = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        if opened.elapsed() > SHORT * 4 {
            break;
        }
    }
    let (got, closed) = read_to_close(&mut tcp).await;
    assert!(cut || closed.is_some(), "still open after trickling: {got}");
    assert!(
        !got.contains("200 OK"),
        "a trickled header was served: {got}"
    );
    if let Some(closed) = closed {
        assert!(
            closed - opened < SHORT * 5,
            "closed after {:?}",
            closed - opened
        );
    }
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_header_timeout() {
    let s = serving(limits()).await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let answered = Instant::now();
    let (got, closed) = read_to_close(&mut tcp).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let idle = closed.expect("kept open") - answered;
    assert!(idle < SHORT * 4, "idle for {idle:?}");
}

#[tokio::test]
async fn past_the_cap_a_connection_is_answered_503_and_closed_then_served_once_one_ends() {
    let s = serving(Limits {
        max_connections: 2,
        ..patient()
    })
    .await;
    let held = [
        TcpStream::connect(s.addr).await.unwrap(),
        TcpStream::connect(s.addr).await.unwrap(),
    ];
    // Accepted in order: wait until both count.
    while s.stats.open.load(Ordering::Relaxed) < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = get_ok(s.addr).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("retry-after: 1"), "{refused}");
    assert!(
        refused.contains("\"code\":\"too_many_connections\""),
        "{refused}"
    );
    assert_eq!(s.stats.refused_at_cap.load(Ordering::Relaxed), 1);
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.stats.open.load(Ordering::Relaxed) > 0 {
        assert!(
            Instant::now() < deadline,
            "the closed connections still count"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(get_ok(s.addr).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn one_address_past_its_cap_is_refused_while_another_is_served() {
    let s = serving(Limits {
        max_per_ip: Some(1),
        ..patient()
    })
    .await;
    let _held = TcpStream::connect(s.addr).await.unwrap();
    while s.stats.open.load(Ordering::Relaxed) < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(get_ok(s.addr).await.starts_with("HTTP/1.1 503"));
    assert_eq!(s.stats.refused_per_ip.load(Ordering::Relaxed), 1);
    // Another loopback address (Linux routes all of 127/8 to lo).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = socket.connect(s.addr).await.unwrap();
    other
        .write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let (got, _) = read_to_close(&mut other).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
}

#[tokio::test]
async fn a_body_that_stalls_ends_its_request_after_the_body_idle_timeout() {
    let s = serving(patient()).await;
    let mut tcp = TcpStream::connect(s.addr).await.unwrap();
    tcp.write_all(b"POST /len HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"a\":")
        .await
        .unwrap();
    let sent = Instant::now();
    let (got, closed) = read_to_close(&mut tcp).await;
    let ended = closed.unwrap_or_else(Instant::now) - sent;
    assert!(!got.contains("200 OK"), "a stalled body was served: {got}");
    assert!(
        got.starts_with("HTTP/1.1 4") || closed.is_some(),
        "neither answered nor closed: {got}"
    );
    assert!(ended < SHORT * 4, "ended after {ended:?}");
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish_and_closes_the_rest() {
    let s = serving(patient()).await;
    let mut idle = TcpStream::connect(s.addr).await.unwrap();
    let mut busy = TcpStream::connect(s.addr).await.unwrap();
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.stop.send(()).unwrap();
    let (answer, closed) = read_to_close(&mut busy).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("slow"), "{answer}");
    assert!(closed.is_some(), "kept open after its answer");
    let (nothing, closed) = read_to_close(&mut idle).await;
    assert!(nothing.is_empty() && closed.is_some(), "{nothing}");
    tokio::time::timeout(Duration::from_secs(5), s.task)
        .await
        .expect("serve returned")
        .unwrap();
    assert!(TcpStream::connect(s.addr).await.is_err(), "still accepting");
}

#[test]
fn the_default_cap_leaves_room_for_upstream_connections_and_the_nodes_own() {
    assert_eq!(Limits::connections_for(1_024), 448);
    assert_eq!(Limits::connections_for(65_536), 32_704);
    assert_eq!(Limits::connections_for(100), 16, "a floor");
}
