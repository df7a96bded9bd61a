//! Actor round trip: admit on a tenant actor through the registry and settle the
//! permit, the work every proxied request does per scope. Criterion reports the mean;
//! a second pass records each round trip in an HDR histogram and prints p50/p99/p99.9,
//! since the target (p99 < 10 us) is about the tail. The two-worker pass runs twice:
//! on the purely monotonic clock and on the wall-following node clock a running
//! node uses (actor/wall.rs), with the cost of one clock reading of each.
//! Run: `cargo bench --bench actor`.

use criterion::{Criterion, criterion_group, criterion_main};
use hdrhistogram::Histogram;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tollgate::actor::clock::Clock;
use tollgate::actor::registry::ActorDefaults;
use tollgate::actor::task::AcquireRequest;
use tollgate::actor::{Lane, Permit, Registry, ScopeId, ScopeSpec, SettleWith};
use tollgate::limiter::{Algorithm, Ceiling, LimitSpec, NANOS_PER_SEC};
use tollgate::ops::metrics::Metrics;

fn registry(clock: Clock) -> (Registry, ScopeId) {
    let scope = ScopeId::tenant("bench");
    let limit = |capacity| {
        Some(LimitSpec::new(
            capacity,
            60 * NANOS_PER_SEC,
            Algorithm::SlidingWindow,
        ))
    };
    let spec = ScopeSpec {
        requests: limit(1 << 40),
        tokens: limit(1 << 50),
        concurrency: Some(1 << 20),
        adaptive: None,
        allowances: Default::default(),
        leased_from: None,
    };
    let defaults = ActorDefaults {
        batch_ceiling: Ceiling::from_share(0.6),
        aging_ns: 5 * NANOS_PER_SEC,
        max_queue: 1024,
        idle_timeout_ns: 120 * NANOS_PER_SEC,
    };
    let registry = Registry::new(
        HashMap::from([(scope.clone(), spec)]),
        defaults,
        clock,
        Arc::new(Metrics::new(false)),
        None,
    )
    .expect("valid bench spec");
    (registry, scope)
}

async fn round_trip(registry: &Registry, scope: &ScopeId, model: &Arc<str>) {
    let (answer, handle) = registry
        .acquire(scope, |reply| AcquireRequest {
            lane: Lane::Interactive,
            prompt_tokens: 100,
            max_completion_tokens: 200,
            model: model.clone(),
            adaptive: false,
            max_wait_ns: 0,
            busy_above: None,
            reply,
        })
        .await
        .expect("actor reachable");
    let grant = answer.expect("roomy limits admit");
    Permit::new(&handle, &grant).settle(SettleWith::Usage {
        prompt: 100,
        completion: 50,
    });
}

/// Measures on `rt`: criterion's mean, then an HDR pass for the tail.
fn measure(c: &mut Criterion, name: &str, rt: &tokio::runtime::Runtime, clock: fn() -> Clock) {
    let (registry, scope) = rt.block_on(async { registry(clock()) });
    let model: Arc<str> = "gpt-4o-mini".into();
    let registry = Arc::new(registry);
    // The measured loop runs in a spawned task, as request handlers do: `block_on`
    // alone would drive it from the bench's own thread, outside the runtime's
    // workers, and every message would cross threads for that reason only.
    let on_worker = |iters: u64| {
        let (registry, scope, model) = (registry.clone(), scope.clone(), model.clone());
        rt.block_on(async move {
            tokio::spawn(async move {
                let start = Instant::now();
                for _ in 0..iters {
                    round_trip(&registry, &scope, &model).await;
                }
                start.elapsed()
            })
            .await
            .expect("bench task")
        })
    };
    c.bench_function(&format!("actor/acquire+settle round trip/{name}"), |b| {
        b.iter_custom(on_worker)
    });
    let (registry2, scope2, model2) = (registry.clone(), scope.clone(), model.clone());
    let histogram = rt.block_on(async move {
        tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new(3).expect("histogram");
            for _ in 0..200_000 {
                let start = Instant::now();
                round_trip(&registry2, &scope2, &model2).await;
                let _ = histogram.record(start.elapsed().as_nanos() as u64);
            }
            histogram
        })
        .await
        .expect("bench task")
    });
    println!(
        "actor round trip ({name}) over 200000: p50 {:.2} us, p99 {:.2} us, p99.9 {:.2} us",
        histogram.value_at_quantile(0.5) as f64 / 1000.0,
        histogram.value_at_quantile(0.99) as f64 / 1000.0,
        histogram.value_at_quantile(0.999) as f64 / 1000.0,
    );
}

fn actor(c: &mut Criterion) {
    // The actor's own cost: caller and actor on one thread, no cross-thread wake-up.
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    measure(c, "current-thread", &single, Clock::start);
    // As the node runs it: two workers, so a message may wake the other thread.
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    measure(c, "multi-thread-2", &multi, Clock::start);
    // As a running node keeps time: following the wall clock's steps.
    measure(
        c,
        "multi-thread-2, wall-following clock",
        &multi,
        Clock::following_wall,
    );
    // One reading of each clock, what every admission and settlement takes.
    for (name, clock) in [
        ("monotonic", Clock::start as fn() -> Clock),
        ("wall-following", Clock::following_wall),
    ] {
        let clock = multi.block_on(async { clock() });
        c.bench_function(&format!("clock/now_ns/{name}"), |b| {
            b.iter(|| std::hint::black_box(clock.now_ns()))
        });
    }
}

fn config() -> Criterion {
    Criterion::default()
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
}

criterion_group! { name = benches; config = config(); targets = actor }
criterion_main!(benches);
