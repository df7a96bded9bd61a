//! Integration tests: the generator against a tiny axum server on 127.0.0.1:0 that
//! counts what it saw with atomics and a log of arrivals, so every figure the summary
//! reports is checked against the server's own count.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::serve::ListenerExt as _;
use bytes::Bytes;
use clap::Parser;
use tokio::time::Instant;

use super::request::{MAX_WAIT_HEADER, PRIORITY_HEADER, WORKER_HEADER};
use super::*;

/// What the server answers to the `n`-th request overall, the `k`-th of its worker.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reply {
    Ok,
    Status(u16),
    Limited { retry_after_ms: u64 },
}

type Policy = Box<dyn Fn(u64, u64) -> Reply + Send + Sync>;

#[derive(Debug, Clone)]
struct Arrival {
    worker: Option<u64>,
    at: Instant,
    replied_at: Instant,
    reply: Reply,
}

/// Every arrival, and how many requests each worker (by header) has sent so far.
#[derive(Default)]
struct Log {
    arrivals: Vec<Arrival>,
    per_worker: HashMap<Option<u64>, u64>,
}

struct Srv {
    policy: Policy,
    /// Delay before an ok answer (non-stream) or between stream parts.
    delay: Duration,
    log: Mutex<Log>,
    ok: AtomicU64,
    limited: AtomicU64,
    errors: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    /// Requests whose auth, priority and max-wait headers were all as the test set them.
    good_headers: AtomicU64,
    /// Stream requests that asked for usage (`stream_options.include_usage`).
    asked_usage: AtomicU64,
}

impl Srv {
    fn new(
        delay: Duration,
        policy: impl Fn(u64, u64) -> Reply + Send + Sync + 'static,
    ) -> Arc<Srv> {
        Arc::new(Srv {
            policy: Box::new(policy),
            delay,
            log: Mutex::default(),
            ok: AtomicU64::new(0),
            limited: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            good_headers: AtomicU64::new(0),
            asked_usage: AtomicU64::new(0),
        })
    }

    fn total(&self) -> u64 {
        self.ok.load(Ordering::SeqCst)
            + self.limited.load(Ordering::SeqCst)
            + self.errors.load(Ordering::SeqCst)
    }

    fn arrivals(&self) -> Vec<Arrival> {
        self.log.lock().arrivals.clone()
    }
}

async fn serve(srv: Arc<Srv>) -> String {
    let app = Router::new()
        .route("/v1/chat/completions", post(handle))
        .route("/v1/messages", post(handle))
        .with_state(srv);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // TCP_NODELAY, or a response written in parts stalls ~40 ms on delayed ACKs.
    let listener = listener.tap_io(|tcp| tcp.set_nodelay(true).unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

async fn handle(State(srv): State<Arc<Srv>>, headers: HeaderMap, body: Bytes) -> Response {
    let at = Instant::now();
    let now_in = srv.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    srv.max_in_flight.fetch_max(now_in, Ordering::SeqCst);
    let worker = headers
        .get(WORKER_HEADER)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let (index, reply) = {
        let mut log = srv.log.lock();
        let n = log.arrivals.len();
        let k = log.per_worker.entry(worker).or_insert(0);
        let reply = (srv.policy)(n as u64, *k);
        *k += 1;
        log.arrivals.push(Arrival {
            worker,
            at,
            replied_at: at,
            reply,
        });
        (n, reply)
    };
    check_headers(&srv, &headers);
    let response = respond(&srv, reply, &headers, &body).await;
    srv.log.lock().arrivals[index].replied_at = Instant::now();
    srv.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}

fn check_headers(srv: &Srv, headers: &HeaderMap) {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let auth = get("authorization") == "Bearer sk-test"
        || (get("x-api-key") == "sk-test" && get("anthropic-version") == "2023-06-01");
    if auth && get(PRIORITY_HEADER) == "batch" && get(MAX_WAIT_HEADER) == "250" {
        srv.good_headers.fetch_add(1, Ordering::SeqCst);
    }
}

async fn respond(srv: &Srv, reply: Reply, headers: &HeaderMap, body: &[u8]) -> Response {
    let status = |code: u16| Response::builder().status(code);
    match reply {
        Reply::Limited { retry_after_ms } => {
            srv.limited.fetch_add(1, Ordering::SeqCst);
            let secs = retry_after_ms.div_ceil(1000).to_string();
            let resp = status(429)
                .header("retry-after-ms", retry_after_ms.to_string())
                .header("retry-after", secs)
                .body(Body::from(r#"{"error":{"type":"rate_limit_exceeded"}}"#));
            resp.unwrap()
        }
        Reply::Status(code) => {
            srv.errors.fetch_add(1, Ordering::SeqCst);
            status(code).body(Body::from("{}")).unwrap()
        }
        Reply::Ok => {
            srv.ok.fetch_add(1, Ordering::SeqCst);
            let n = srv.ok.load(Ordering::SeqCst);
            let (prompt, completion) = (10 + n % 3, 5 + n % 2);
            srv.prompt_tokens.fetch_add(prompt, Ordering::SeqCst);
            srv.completion_tokens
                .fetch_add(completion, Ordering::SeqCst);
            let req: serde_json::Value = serde_json::from_slice(body).unwrap();
            let anthropic = headers.contains_key("x-api-key");
            if req["stream"] == true {
                if req["stream_options"]["include_usage"] == true {
                    srv.asked_usage.fetch_add(1, Ordering::SeqCst);
                }
                return sse(srv.delay, anthropic, prompt, completion);
            }
            tokio::time::sleep(srv.delay).await;
            let body = if anthropic {
                format!(
                    r#"{{"type":"message","usage":{{"input_tokens":{prompt},"output_tokens":{completion}}}}}"#
                )
            } else {
                format!(
                    r#"{{"id":"c","choices":[{{"message":{{"content":"hi"}}}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion}}}}}"#
                )
            };
            status(200)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap()
        }
    }
}

/// A stream whose first part comes at once and the rest (with usage) after `delay`.
fn sse(delay: Duration, anthropic: bool, prompt: u64, completion: u64) -> Response {
    let (first, rest) = if anthropic {
        (
            format!(
                "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":{prompt},\"output_tokens\":1}}}}}}\n\n"
            ),
            format!(
                "event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{completion}}}}}\n\nevent: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n"
            ),
        )
    } else {
        (
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n".to_owned(),
            format!(
                "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion}}}}}\n\ndata: [DONE]\n\n"
            ),
        )
    };
    let parts = vec![
        (Duration::ZERO, Bytes::from(first)),
        (delay, Bytes::from(rest)),
    ];
    let stream = futures_util::stream::unfold(parts.into_iter(), |mut parts| async move {
        let (wait, bytes) = parts.next()?;
        tokio::time::sleep(wait).await;
        Some((Ok::<_, Infallible>(bytes), parts))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    load: LoadArgs,
}

fn args(url: &str, extra: &[&str]) -> LoadArgs {
    let base = [
        "load",
        "--url",
        url,
        "--api-key",
        "sk-test",
        "--no-progress",
    ];
    Cli::try_parse_from(base.iter().chain(extra)).unwrap().load
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_counts_match_the_server_and_requests_is_exact() {
    let srv = Srv::new(Duration::ZERO, |n, _| match n % 10 {
        3 => Reply::Limited { retry_after_ms: 5 },
        6 => Reply::Status(500),
        8 if n % 20 == 8 => Reply::Status(400),
        _ => Reply::Ok,
    });
    let url = serve(srv.clone()).await;
    let extra = [
        "--requests",
        "203",
        "--concurrency",
        "8",
        "--priority",
        "batch",
        "--max-wait-ms",
        "250",
    ];
    let s = run(args(&url, &extra)).await.unwrap();
    let o = s.outcomes;
    assert_eq!(srv.total(), 203, "--requests 203 must send exactly 203");
    assert_eq!((o.total, o.dropped, o.transport_error), (203, 0, 0));
    assert_eq!(o.ok, srv.ok.load(Ordering::SeqCst));
    assert_eq!(o.rate_limited, srv.limited.load(Ordering::SeqCst));
    assert_eq!(
        o.client_error + o.server_error,
        srv.errors.load(Ordering::SeqCst)
    );
    assert_eq!(
        (o.rate_limited, o.server_error, o.client_error),
        (20, 20, 10)
    );
    assert_eq!(s.tokens.prompt, srv.prompt_tokens.load(Ordering::SeqCst));
    assert_eq!(
        s.tokens.completion,
        srv.completion_tokens.load(Ordering::SeqCst)
    );
    assert_eq!(s.tokens.ok_without_usage, 0);
    assert_eq!(s.latency_ms.unwrap().count, o.ok);
    assert_eq!(s.rate_limited_latency_ms.unwrap().count, o.rate_limited);
    assert_eq!(s.backoff.waits, o.rate_limited, "every 429 is waited out");
    assert!(s.backoff.total_s >= 0.005 * o.rate_limited as f64);
    assert_eq!(srv.good_headers.load(Ordering::SeqCst), 203);
    assert!(srv.max_in_flight.load(Ordering::SeqCst) <= 8);
    assert!(s.ttfb_ms.is_none());
}

/// Each worker's second request is refused with a 150 ms retry-after; returns, per
/// worker, how long after that 429 left the server its next request arrived.
async fn gaps_after_429(extra: &[&str]) -> (Summary, Vec<Duration>) {
    let srv = Srv::new(Duration::ZERO, |_, k| {
        if k == 1 {
            Reply::Limited {
                retry_after_ms: 150,
            }
        } else {
            Reply::Ok
        }
    });
    let url = serve(srv.clone()).await;
    // Enough requests that every worker sends again after its 429, however the
    // shared budget is split between fast and waiting workers.
    let mut argv = vec!["--concurrency", "4", "--requests", "200"];
    argv.extend_from_slice(extra);
    let s = run(args(&url, &argv)).await.unwrap();
    let arrivals = srv.arrivals();
    let mut gaps = Vec::new();
    for worker in 0..4 {
        let mine: Vec<&Arrival> = arrivals
            .iter()
            .filter(|a| a.worker == Some(worker))
            .collect();
        let pos = mine
            .iter()
            .position(|a| matches!(a.reply, Reply::Limited { .. }));
        let Some(pos) = pos else { continue };
        let next = mine.get(pos + 1).expect("worker sent again after its 429");
        gaps.push(next.at.saturating_duration_since(mine[pos].replied_at));
    }
    (s, gaps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured_by_each_worker() {
    let (s, gaps) = gaps_after_429(&[]).await;
    assert_eq!(gaps.len(), 4, "each worker got its 429: {gaps:?}");
    for gap in &gaps {
        assert!(
            *gap >= Duration::from_millis(150),
            "a worker came back after {gap:?}"
        );
    }
    assert_eq!(s.backoff.waits, 4);
    assert!(
        s.backoff.total_s >= 0.6 && s.backoff.total_s < 1.0,
        "{}",
        s.backoff.total_s
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_retry_after_comes_back_at_once() {
    let (s, gaps) = gaps_after_429(&["--ignore-retry-after"]).await;
    assert_eq!(gaps.len(), 4, "{gaps:?}");
    assert!(
        gaps.iter().all(|g| *g < Duration::from_millis(100)),
        "{gaps:?}"
    );
    assert_eq!(s.backoff.waits, 0);
    assert!(!s.run.honour_retry_after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_sends_about_the_target_rate() {
    let srv = Srv::new(Duration::ZERO, |_, _| Reply::Ok);
    let url = serve(srv.clone()).await;
    let s = run(args(&url, &["--rate", "200", "--duration", "1s"]))
        .await
        .unwrap();
    let o = s.outcomes;
    assert_eq!(o.total, 200, "1 s at 200/s is 200 slots");
    assert_eq!(o.sent(), srv.total());
    assert!(o.ok >= 190, "{o:?}");
    let arrivals = srv.arrivals();
    let first = arrivals.iter().map(|a| a.at).min().unwrap();
    let last = arrivals.iter().map(|a| a.at).max().unwrap();
    let span = last.saturating_duration_since(first);
    assert!(
        span >= Duration::from_millis(900),
        "paced, not a burst: {span:?}"
    );
    let in_first_half = arrivals
        .iter()
        .filter(|a| a.at < first + Duration::from_millis(500))
        .count();
    assert!(
        (80..=120).contains(&in_first_half),
        "{in_first_half} in the first 0.5 s"
    );
    assert!(
        (s.throughput.requests_per_s - 200.0).abs() < 30.0,
        "{:?}",
        s.throughput
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_drops_slots_when_in_flight_is_full() {
    let srv = Srv::new(Duration::from_millis(200), |_, _| Reply::Ok);
    let url = serve(srv.clone()).await;
    let argv = [
        "--rate",
        "100",
        "--duration",
        "500ms",
        "--max-in-flight",
        "5",
    ];
    let s = run(args(&url, &argv)).await.unwrap();
    let o = s.outcomes;
    assert_eq!(o.total, 50);
    assert_eq!(o.sent(), srv.total());
    assert!(srv.max_in_flight.load(Ordering::SeqCst) <= 5);
    assert!(o.dropped >= 25, "{o:?}");
    assert!(o.sent() >= 5, "{o:?}");
}

/// A generator that falls behind its schedule charges the lateness to the
/// latency (no coordinated omission): one thread, blocked for 60 ms while slots
/// fall due, sends them late, and the server's instant answers read >= ~60 ms.
#[tokio::test]
async fn open_loop_latency_runs_from_each_slots_due_time() {
    let srv = Srv::new(Duration::ZERO, |_, _| Reply::Ok);
    let url = serve(srv.clone()).await;
    tokio::spawn(async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Blocks the runtime's only thread: the schedule cannot send meanwhile.
        std::thread::sleep(Duration::from_millis(60));
    });
    let s = run(args(&url, &["--rate", "100", "--duration", "1s"]))
        .await
        .unwrap();
    // (No check on `dropped`: a VM stall on top of the block could push a slot past
    // the 100 ms it may be late, and that is not what this test is about.)
    let latency = s.latency_ms.unwrap();
    // The first slot due in the block (slots 10 ms apart) leaves 50-60 ms late,
    // less the 2 ms timer grain: at least 48 ms; timed from the send, ~1 ms.
    assert!(
        latency.max >= 40.0,
        "the stalled slots' lateness: {latency:?}"
    );
    assert!(latency.p50 < 20.0, "on-time slots: {latency:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_pauses_the_schedule_on_retry_after() {
    let srv = Srv::new(Duration::ZERO, |n, _| {
        if n == 0 {
            Reply::Limited {
                retry_after_ms: 300,
            }
        } else {
            Reply::Ok
        }
    });
    let url = serve(srv.clone()).await;
    let s = run(args(&url, &["--rate", "100", "--duration", "1s"]))
        .await
        .unwrap();
    let arrivals = srv.arrivals();
    let refused = arrivals[0].replied_at;
    let quiet_from = refused + Duration::from_millis(20);
    let quiet_to = refused + Duration::from_millis(300);
    let early: Vec<_> = arrivals
        .iter()
        .filter(|a| a.at > quiet_from && a.at < quiet_to)
        .collect();
    assert!(early.is_empty(), "sent during the pause: {early:?}");
    assert_eq!(s.outcomes.rate_limited, 1);
    assert!(s.backoff.waits >= 1);
    assert!(s.backoff.total_s >= 0.25, "{:?}", s.backoff);
    // The schedule restarted after the pause: about 70 slots fit in what is left.
    assert!((55..=80).contains(&s.outcomes.total), "{:?}", s.outcomes);
    assert_eq!(s.outcomes.dropped, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_stream_measures_ttfb_and_reads_usage_from_sse() {
    let srv = Srv::new(Duration::from_millis(40), |_, _| Reply::Ok);
    let url = serve(srv.clone()).await;
    let s = run(args(
        &url,
        &["--stream", "--requests", "6", "--concurrency", "3"],
    ))
    .await
    .unwrap();
    assert_eq!(s.outcomes.ok, 6);
    assert_eq!(srv.asked_usage.load(Ordering::SeqCst), 6);
    assert_eq!(s.tokens.prompt, srv.prompt_tokens.load(Ordering::SeqCst));
    assert_eq!(
        s.tokens.completion,
        srv.completion_tokens.load(Ordering::SeqCst)
    );
    let (ttfb, total) = (s.ttfb_ms.unwrap(), s.latency_ms.unwrap());
    assert_eq!(ttfb.count, 6);
    assert!(total.p50 >= 40.0, "{total:?}");
    assert!(ttfb.max < total.p50, "ttfb {ttfb:?} vs total {total:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_send_its_headers_and_read_stream_and_json_usage() {
    let srv = Srv::new(Duration::from_millis(5), |_, _| Reply::Ok);
    let url = serve(srv.clone()).await;
    let extra = [
        "--api",
        "messages",
        "--priority",
        "batch",
        "--max-wait-ms",
        "250",
    ];
    let mut streamed = extra.to_vec();
    streamed.extend(["--stream", "--requests", "4"]);
    let s = run(args(&url, &streamed)).await.unwrap();
    assert_eq!(s.outcomes.ok, 4);
    assert_eq!(s.tokens.prompt, srv.prompt_tokens.load(Ordering::SeqCst));
    assert_eq!(
        s.tokens.completion,
        srv.completion_tokens.load(Ordering::SeqCst)
    );
    let mut plain = extra.to_vec();
    plain.extend(["--requests", "3"]);
    let s = run(args(&url, &plain)).await.unwrap();
    assert_eq!(s.outcomes.ok, 3);
    assert_eq!(s.tokens.ok_without_usage, 0);
    assert_eq!(srv.good_headers.load(Ordering::SeqCst), 7);
    assert_eq!(
        srv.asked_usage.load(Ordering::SeqCst),
        0,
        "no stream_options for Anthropic"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_refused_and_timeouts_are_transport_errors() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let s = run(args(&closed, &["--requests", "3", "--concurrency", "1"]))
        .await
        .unwrap();
    assert_eq!((s.outcomes.transport_error, s.outcomes.total), (3, 3));
    let srv = Srv::new(Duration::from_secs(5), |_, _| Reply::Ok);
    let url = serve(srv.clone()).await;
    let started = Instant::now();
    let s = run(args(&url, &["--requests", "2", "--timeout", "100ms"]))
        .await
        .unwrap();
    assert_eq!(s.outcomes.transport_error, 2);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(s.latency_ms.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_summary_parses_back_and_the_table_shows_it() {
    let srv = Srv::new(Duration::ZERO, |n, _| {
        if n % 4 == 0 {
            Reply::Limited { retry_after_ms: 1 }
        } else {
            Reply::Ok
        }
    });
    let url = serve(srv.clone()).await;
    let s = run(args(
        &url,
        &["--requests", "40", "--concurrency", "2", "--seed", "7"],
    ))
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("summary.json");
    write_json(&s, &path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let back: Summary = serde_json::from_str(&text).unwrap();
    assert_eq!(back.outcomes, s.outcomes);
    assert_eq!(back.tokens, s.tokens);
    assert_eq!(back.run.seed, 7);
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["outcomes"]["rate_limited"], 10);
    assert_eq!(value["run"]["mode"], "closed");
    assert_eq!(value["run"]["api"], "chat");
    assert!(value["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    let table = render_table(&s);
    assert!(table.contains("rate_limited"), "{table}");
    assert!(table.contains("25.00%"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_early_and_keeps_what_was_sent() {
    let started = Instant::now();
    for argv in [
        &["--duration", "60s"][..],
        &["--rate", "50", "--duration", "60s"][..],
    ] {
        // Every other answer asks for a 30 s wait, which the stop must cut short.
        let srv = Srv::new(Duration::ZERO, |n, _| {
            if n % 2 == 1 {
                Reply::Limited {
                    retry_after_ms: 30_000,
                }
            } else {
                Reply::Ok
            }
        });
        let url = serve(srv.clone()).await;
        let shutdown = tokio::time::sleep(Duration::from_millis(300));
        let s = run_until(args(&url, argv), shutdown).await.unwrap();
        assert!(s.interrupted);
        assert!(s.outcomes.sent() > 0);
        assert_eq!(s.outcomes.sent(), srv.total());
        assert!(s.backoff.waits > 0, "{:?}", s.backoff);
        assert!(render_table(&s).contains("(interrupted)"));
    }
    // Two runs of 60 s, each with 30 s retry-after waits, ended in well under 3 s.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// Process CPU time (user + system) from /proc/self/stat, in clock ticks (1/100 s).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Not a pass/fail test: prints what the generator reaches against a minimal
/// in-process server, and the CPU the whole process (server included) spent per
/// request. Run with `cargo test [--release] -p tollgate --lib throughput_probe --
/// --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement, not a check; slow in debug builds"]
async fn throughput_probe() {
    const BODY: &str =
        r#"{"id":"c","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":5}}"#;
    let app = Router::new().route(
        "/v1/chat/completions",
        post(|| async { ([("content-type", "application/json")], BODY) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let listener = listener.tap_io(|tcp| tcp.set_nodelay(true).unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for argv in [
        &["--concurrency", "64", "--duration", "3s"][..],
        &["--rate", "5000", "--duration", "3s"][..],
    ] {
        let ticks = cpu_ticks();
        let s = run(args(&url, argv)).await.unwrap();
        let cpu_us = (cpu_ticks() - ticks) as f64 * 10_000.0;
        println!("{}", render_table(&s));
        let per_request = cpu_us / s.outcomes.sent().max(1) as f64;
        println!("process CPU per request (client + server): {per_request:.1} us\n");
    }
}
