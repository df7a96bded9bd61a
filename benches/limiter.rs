//! Decision cost of the limiter core, side by side with `governor` (a published
//! limiter crate) and a `Mutex<HashMap<String, u64>>` counter (the naive baseline).
//!
//! Our limiters get time from a counter (no clock read in the measured loop);
//! governor reads its own clock (quanta), which is part of its decision cost.
//! Run: `cargo bench --bench limiter` (about a minute; `-- --quick` for less).

mod common;

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Mutex;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use tollgate::limiter::{Algorithm, Ceiling, LimitSpec, Limiter, NANOS_PER_SEC, Nanos};

/// Keys in the keyed benchmarks (a tenant map of moderate size).
const KEYS: usize = 1_000;
/// Clock step per decision: 1 µs.
const STEP_NS: Nanos = 1_000;

/// A limiter that always admits 1 at one decision per µs: capacity far above the rate.
/// The sliding log's window is 10 ms so it holds ~10k live entries in steady state.
fn roomy(algorithm: Algorithm) -> Limiter {
    let window_ns = match algorithm {
        Algorithm::SlidingLog => NANOS_PER_SEC / 100,
        _ => 60 * NANOS_PER_SEC,
    };
    let spec = LimitSpec::new(1 << 40, window_ns, algorithm);
    Limiter::try_new(spec).expect("valid bench spec")
}

/// A full limiter (60 per minute) and the instant it is full at. The sliding window
/// fills at one admission per second, so every bucket is live; the exact log fills
/// at two per second (at one per second the oldest entry would leave exactly as the
/// next arrives, and it would never fill); the token bucket refills at one per
/// second, so it is drained by a burst at one instant instead.
fn full(algorithm: Algorithm) -> (Limiter, Nanos) {
    let mut limiter = Limiter::try_new(LimitSpec::new(60, 60 * NANOS_PER_SEC, algorithm))
        .expect("valid bench spec");
    let step = match algorithm {
        Algorithm::SlidingWindow => NANOS_PER_SEC,
        Algorithm::SlidingLog => NANOS_PER_SEC / 2,
        Algorithm::TokenBucket => 0,
    };
    let mut now = 0;
    while limiter.reserve(now, 1, Ceiling::FULL).is_ok() {
        now += step;
    }
    (limiter, now)
}

fn ours(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    for (name, algorithm) in [
        ("sliding-window", Algorithm::SlidingWindow),
        ("token-bucket", Algorithm::TokenBucket),
        ("sliding-log", Algorithm::SlidingLog),
    ] {
        let mut limiter = roomy(algorithm);
        let mut now: Nanos = 0;
        group.bench_function(format!("ours/{name}/reserve-admit"), |b| {
            b.iter(|| {
                now += STEP_NS;
                black_box(limiter.reserve(black_box(now), 1, Ceiling::FULL))
            })
        });
        let (limiter, at) = full(algorithm);
        assert!(
            limiter.check(at, 1, Ceiling::FULL).is_err(),
            "{name} must deny"
        );
        group.bench_function(format!("ours/{name}/check-denied"), |b| {
            b.iter(|| black_box(limiter.check(black_box(at), 1, Ceiling::FULL)))
        });
    }
    let keys: Vec<String> = (0..KEYS).map(|i| format!("tenant:{i}:tokens")).collect();
    let mut map: HashMap<String, Limiter> = keys
        .iter()
        .map(|k| (k.clone(), roomy(Algorithm::SlidingWindow)))
        .collect();
    let (mut now, mut i) = (0, 0);
    group.bench_function("ours/keyed-hashmap/sliding-window-reserve", |b| {
        b.iter(|| {
            now += STEP_NS;
            i = (i + 1) % KEYS;
            let limiter = map.get_mut(keys[i].as_str()).expect("key present");
            black_box(limiter.reserve(now, 1, Ceiling::FULL))
        })
    });
    group.finish();
}

fn governor_and_baseline(c: &mut Criterion) {
    let mut group = c.benchmark_group("decision");
    let roomy = Quota::per_minute(NonZeroU32::MAX);
    let direct = RateLimiter::direct(roomy);
    group.bench_function("governor/direct/check-admit", |b| {
        b.iter(|| black_box(direct.check()))
    });
    let denying = RateLimiter::direct(Quota::per_minute(NonZeroU32::MIN));
    let _ = denying.check();
    group.bench_function("governor/direct/check-denied", |b| {
        b.iter(|| black_box(denying.check()))
    });
    let keys: Vec<String> = (0..KEYS).map(|i| format!("tenant:{i}:tokens")).collect();
    let keyed = RateLimiter::keyed(roomy);
    let mut i = 0;
    group.bench_function("governor/keyed/check_key-admit", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(keyed.check_key(&keys[i]))
        })
    });
    let counters: Mutex<HashMap<String, u64>> =
        Mutex::new(keys.iter().map(|k| (k.clone(), 0)).collect());
    group.bench_function("baseline/mutex-hashmap/increment", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let mut map = counters.lock().expect("not poisoned");
            if let Some(n) = map.get_mut(keys[i].as_str()) {
                *n += 1;
            }
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = common::short_runs();
    targets = ours, governor_and_baseline
}
criterion_main!(benches);
