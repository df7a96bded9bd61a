//! Redis script benchmark: decisions per second and latency of each
//! tollgate script on loopback, side by side with `redis-benchmark`'s raw EVALSHA
//! rate for a trivial script against the same server in the same run; then the
//! O(1) bucketed window against the exact sliding log at 100, 1,000 and 10,000
//! entries per window.
//!
//! Run: `cargo bench --bench redis` (needs redis-server and redis-benchmark; it
//! starts its own server on a free port). `TOLLGATE_BENCH_SECS` sets the seconds
//! per script (default 3); `TOLLGATE_BENCH_ONLY=batched` runs only the baseline
//! and the batched row (for profiling it). Prints markdown tables for
//! docs/BENCHMARKS.md.

#![allow(clippy::too_many_lines)] // a benchmark group reads top to bottom
#![allow(clippy::unwrap_used, clippy::print_stdout)] // a benchmark binary: failing loudly is right

use hdrhistogram::Histogram;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tollgate::actor::scope::Cost;
use tollgate::redis::{Algorithm, DimSpec, RedisStore, Reservation, ScopeKeys, Settled};

const CLIENTS: usize = 50;
const BIG: u64 = 1 << 40;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn dim(algorithm: Algorithm) -> DimSpec {
    DimSpec {
        algorithm,
        capacity: BIG,
        window_ms: 60_000,
    }
}

struct Outcome {
    per_second: f64,
    p50_us: u64,
    p99_us: u64,
}

/// One request's reservation (cost 1 token) under `requests` and `tokens`.
fn one(requests: Algorithm, tokens: Algorithm) -> Reservation {
    Reservation {
        windows: [
            dim(requests),
            dim(tokens),
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
    }
}

/// `CLIENTS` tasks calling `call(client, i)` on one multiplexed connection for `secs`.
async fn run<F, Fut>(secs: f64, call: F) -> Outcome
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3).unwrap();
            let mut i = 0u64;
            while Instant::now() < end {
                let t = Instant::now();
                call(client, i).await;
                h.record(t.elapsed().as_micros() as u64).unwrap();
                i += 1;
            }
            h
        }));
    }
    let mut all = Histogram::<u64>::new(3).unwrap();
    for t in tasks {
        all.add(t.await.unwrap()).unwrap();
    }
    Outcome {
        per_second: all.len() as f64 / secs,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
    }
}

fn redis_benchmark(port: u16, sha: &str) -> f64 {
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-c",
            &CLIENTS.to_string(),
            "-n",
            "200000",
            "-q",
        ])
        .args(["EVALSHA", sha, "0"])
        .output()
        .expect("redis-benchmark (redis-tools) is required");
    let text = String::from_utf8_lossy(&out.stdout);
    // "EVALSHA ...: 123456.79 requests per second, p50=0.199 msec"
    text.rsplit(':')
        .next()
        .and_then(|s| s.split_whitespace().find_map(|w| w.parse::<f64>().ok()))
        .unwrap_or_else(|| panic!("cannot parse redis-benchmark output: {text}"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let secs: f64 = std::env::var("TOLLGATE_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let port = free_port();
    let mut server = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is required");
    let url = format!("redis://127.0.0.1:{port}/");
    let metrics = Arc::new(tollgate::ops::metrics::Metrics::new(false));
    let calls = |script: &str| -> u64 {
        let series = format!("tollgate_redis_script_seconds_count{{script=\"{script}\"}}");
        tollgate::ops::metrics::sample(&metrics.render(), &series).map_or(0, |v| v as u64)
    };
    let store = loop {
        let s = RedisStore::single(&url, Duration::from_secs(1), Some(metrics.clone())).unwrap();
        if s.command::<String>(&redis::cmd("PING")).await.is_ok() {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let sha: String = store
        .command(redis::cmd("SCRIPT").arg("LOAD").arg("return 1"))
        .await
        .unwrap();

    let baseline = redis_benchmark(port, &sha);
    let only_batched = std::env::var("TOLLGATE_BENCH_ONLY").is_ok_and(|v| v == "batched");
    let mut rows = Vec::new();
    for (name, requests, tokens) in [
        (
            "reserve (window, requests + tokens)",
            Algorithm::Window { bucket_ms: 1_000 },
            Algorithm::Window { bucket_ms: 1_000 },
        ),
        (
            "reserve (gcra, requests + tokens)",
            Algorithm::Gcra { burst: BIG },
            Algorithm::Gcra { burst: BIG },
        ),
        (
            "reserve (window requests, log tokens)",
            Algorithm::Window { bucket_ms: 1_000 },
            Algorithm::Log,
        ),
    ] {
        if only_batched {
            break;
        }
        let store = store.clone();
        let outcome = run(secs, move |client, _| {
            let store = store.clone();
            async move {
                let keys = ScopeKeys::new("bench", &format!("tenant:{name}:{client}"));
                store.reserve(&keys, &one(requests, tokens)).await.unwrap();
            }
        })
        .await;
        rows.push((name.to_owned(), outcome));
    }
    // The same reservation with every caller on one scope: a hot tenant. Calls
    // that queue behind the one in flight go out together (`redis::batch`).
    let hot = store.clone();
    let calls_before = calls("reserve") + calls("reserve_many");
    let batched = run(secs, move |_, _| {
        let store = hot.clone();
        async move {
            let keys = ScopeKeys::new("bench", "tenant:hot");
            let window = Algorithm::Window { bucket_ms: 1_000 };
            store.reserve(&keys, &one(window, window)).await.unwrap();
        }
    })
    .await;
    let batch_calls = calls("reserve") + calls("reserve_many") - calls_before;
    let per_call = (batched.per_second * secs) / batch_calls.max(1) as f64;
    rows.push((
        format!(
            "reserve (window, requests + tokens), all callers on one scope: batched, {per_call:.1} per call"
        ),
        batched,
    ));
    let print_rows = |rows: &[(String, Outcome)]| {
        println!(
            "\n### Scripts on loopback ({CLIENTS} concurrent callers, one multiplexed connection, {secs} s each)\n"
        );
        println!(
            "redis-benchmark EVALSHA of `return 1`, same server, same run: **{baseline:.0}/s**\n"
        );
        println!("| script | decisions/s | vs raw EVALSHA | p50 | p99 |");
        println!("|---|---|---|---|---|");
        for (name, o) in rows {
            println!(
                "| {name} | {:.0} | {:.2} | {} us | {} us |",
                o.per_second,
                o.per_second / baseline,
                o.p50_us,
                o.p99_us
            );
        }
    };
    if only_batched {
        print_rows(&rows);
        let _ = server.kill();
        let _ = server.wait();
        return;
    }
    let s2 = store.clone();
    let settle = run(secs, move |client, _| {
        let store = s2.clone();
        async move {
            let keys = ScopeKeys::new("bench", &format!("tenant:settle:{client}"));
            let r = Reservation {
                windows: [
                    dim(Algorithm::Window { bucket_ms: 1_000 }),
                    dim(Algorithm::Window { bucket_ms: 1_000 }),
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
                concurrency: 0,
                permit_id: String::new(),
                slot_ttl_ms: 0,
            };
            let refs = ["0", "0", "0", "0", "0", "0"].map(String::from);
            let actual = Settled {
                requests: 1,
                tokens: Cost {
                    input: 5,
                    output: 0,
                    output_cap: 0,
                },
            };
            store.settle(&keys, &r, &refs, actual, None).await.unwrap();
        }
    })
    .await;
    rows.push(("settle (window, refund)".into(), settle));
    let s3 = store.clone();
    let semaphore = run(secs, move |client, i| {
        let store = s3.clone();
        async move {
            let key = ScopeKeys::new("bench", &format!("tenant:sem:{client}")).concurrency;
            let op = if i % 2 == 0 { "acquire" } else { "release" };
            store.semaphore(&key, op, "p", 1_000, 10_000).await.unwrap();
        }
    })
    .await;
    rows.push(("semaphore (acquire / release)".into(), semaphore));

    print_rows(&rows);

    // O(1) window vs the exact log, one caller, with N entries already in the window.
    println!("\n### Bucketed window vs exact sliding log (one caller; N entries in the window)\n");
    println!("| entries per window | window p50 | log p50 | log / window |");
    println!("|---|---|---|---|");
    for n in [100u64, 1_000, 10_000] {
        let mut p50 = Vec::new();
        for alg in [Algorithm::Window { bucket_ms: 1_000 }, Algorithm::Log] {
            let keys = ScopeKeys::new("bench", &format!("tenant:scale:{n}:{alg:?}"));
            let r = Reservation {
                windows: [
                    DimSpec::NONE,
                    dim(alg),
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
            for _ in 0..n {
                store.reserve(&keys, &r).await.unwrap();
            }
            let mut h = Histogram::<u64>::new(3).unwrap();
            for _ in 0..200 {
                let t = Instant::now();
                store.reserve(&keys, &r).await.unwrap();
                h.record(t.elapsed().as_micros() as u64).unwrap();
            }
            p50.push(h.value_at_quantile(0.5));
        }
        println!(
            "| {n} | {} us | {} us | {:.1}x |",
            p50[0],
            p50[1],
            p50[1] as f64 / p50[0].max(1) as f64
        );
    }
    let _ = server.kill();
    let _ = server.wait();
}
