//! Decision round trip: admit on a tenant scope through the registry and settle the
//! permit, the work every proxied request does per scope. With nothing waiting,
//! both happen in the caller's task under the scope's lock (actor/state.rs); the
//! actor task is not involved. Criterion reports the mean; a second pass records
//! each round trip in an HDR histogram and prints p50/p99/p99.9, since the target
//! (p99 < 10 us) is about the tail. The two-worker pass runs on the purely
//! monotonic clock and on the wall-following node clock a running node uses
//! (src/clock/wall.rs), then with the scope bound as `gossip` (allowances) and as
//! `lease` (credit held) bind it, with the cost of one clock reading of each clock.
//! Last, the quota shapes side by side on the same clock and runtime: a scope
//! limiting requests and tokens (two windows), one limiting requests, tokens,
//! input and output tokens per minute and requests and tokens per day (six),
//! and a request admitted on a model group's scope and then its owner's (two
//! scopes).
//! Run: `cargo bench --bench actor`.

use criterion::{Criterion, criterion_group, criterion_main};
use hdrhistogram::Histogram;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tollgate::actor::credit::{Credit, CreditRecipe, Credits};
use tollgate::actor::metrics::ActorMetrics;
use tollgate::actor::registry::ActorDefaults;
use tollgate::actor::scope::{Allowance, Allowances};
use tollgate::actor::task::AcquireRequest;
use tollgate::actor::{Dimension, Lane, Permit, Registry, ScopeId, ScopeSpec, SettleWith, WINDOWS};
use tollgate::clock::Clock;
use tollgate::limiter::{Algorithm, Ceiling, LimitSpec, NANOS_PER_SEC};
use tollgate_cluster::counter::{Window, Windows};

/// The day window of the daily dimensions.
const DAY_MS: u64 = 86_400_000;
use tollgate_cluster::lease::budget::CutOffPolicy;
use tollgate_cluster::lease::line::SyncReply;

/// How the cluster binds the measured scope.
#[derive(Clone, Copy)]
enum Bound {
    /// Local limits only.
    Local,
    /// `gossip`: a cluster allowance per dimension (one atomic load each).
    Gossip,
    /// `lease`: credit per dimension, granted by an owner and held (a lock each).
    Lease,
}

/// The measured scope's shape.
#[derive(Clone, Copy)]
enum Shape {
    /// Requests and tokens windows, and a concurrency limit.
    TwoWindows,
    /// Requests, tokens, input and output tokens per minute, requests and
    /// tokens per day, and concurrency.
    SixWindows,
    /// Two windows, the request admitted on a model group's scope (two
    /// windows too) first.
    WithModelGroup,
}

impl Shape {
    fn windows(self) -> usize {
        match self {
            Shape::SixWindows => 6,
            Shape::TwoWindows | Shape::WithModelGroup => 2,
        }
    }
}

/// A credit holding `amount` for the whole run, as a reply from its owner leaves it.
fn held_credit(key: &str, slots: bool, amount: u64, clock: Clock) -> Credit {
    let recipe = Arc::new(CreditRecipe {
        windows: Windows::new(
            Window::try_new(60_000, 60).expect("window"),
            Window::try_new(DAY_MS, 24).expect("day window"),
        ),
        policy: CutOffPolicy::Share,
        wake: Arc::default(),
    });
    let credit = Credit::new(key.into(), slots, recipe);
    let now_ms = clock.now_ns() / 1_000_000;
    credit.with(|budget| {
        let statement = budget.snapshot(amount, now_ms);
        let reply = SyncReply {
            credit: amount,
            granted: amount,
            ttl_ms: 1 << 40,
            cut_off_share: 0,
        };
        budget.apply(&statement, &reply, now_ms);
    });
    credit
}

fn allowances(bound: Bound, clock: Clock, windows: usize) -> Allowances {
    let amounts: [Option<u64>; WINDOWS] = std::array::from_fn(|i| (i < windows).then_some(1 << 50));
    match bound {
        Bound::Local => Allowances::default(),
        Bound::Gossip => Allowances {
            windows: amounts.map(|a| a.map(Allowance::new)),
            concurrency: Some(Allowance::new(1 << 20)),
            ..Allowances::default()
        },
        Bound::Lease => Allowances {
            credits: Credits::new(
                std::array::from_fn(|i| {
                    let key = format!("tenant:bench:{}", Dimension::WINDOWED[i].as_str());
                    amounts[i].map(|amount| held_credit(&key, false, amount, clock))
                }),
                Some(held_credit(
                    "tenant:bench:concurrency",
                    true,
                    1 << 20,
                    clock,
                )),
            ),
            ..Allowances::default()
        },
    }
}

/// The measured registry: the tenant's scope, and with [`Shape::WithModelGroup`]
/// its model group's (admitted first).
fn registry(clock: Clock, bound: Bound, shape: Shape) -> (Registry, ScopeId, Option<ScopeId>) {
    let scope = ScopeId::tenant("bench");
    let windows = shape.windows();
    let spec = ScopeSpec {
        windows: std::array::from_fn(|i| {
            let window_ns = match Dimension::WINDOWED[i].is_daily() {
                true => DAY_MS * 1_000_000,
                false => 60 * NANOS_PER_SEC,
            };
            (i < windows).then(|| {
                let mut spec = LimitSpec::new(1 << 50, window_ns, Algorithm::SlidingWindow);
                spec.buckets = if window_ns == 60 * NANOS_PER_SEC {
                    60
                } else {
                    24
                };
                spec
            })
        })
        .into(),
        counts_cache_reads: false,
        concurrency: Some(1 << 20),
        adaptive: None,
        allowances: allowances(bound, clock, windows),
        leased_from: None,
    };
    let mut specs = HashMap::from([(scope.clone(), spec.clone())]);
    let group = matches!(shape, Shape::WithModelGroup).then(|| {
        let group = ScopeId::model_group(&scope, "gpt-4o-mini");
        specs.insert(group.clone(), spec);
        group
    });
    let defaults = ActorDefaults {
        batch_ceiling: Ceiling::from_share(0.6),
        aging_ns: 5 * NANOS_PER_SEC,
        max_queue: 1024,
        idle_timeout_ns: 120 * NANOS_PER_SEC,
    };
    let registry = Registry::new(
        specs,
        defaults,
        clock,
        Arc::new(ActorMetrics::default()),
        None,
    )
    .expect("valid bench spec");
    (registry, scope, group)
}

/// Admits on the group's scope (if any) and then the tenant's, and settles
/// both, as `proxy::admit` and `Permit::holding` do.
async fn round_trip(registry: &Registry, scopes: &(ScopeId, Option<ScopeId>), model: &Arc<str>) {
    let inner = match &scopes.1 {
        Some(group) => Some(admit(registry, group, model).await),
        None => None,
    };
    let permit = admit(registry, &scopes.0, model).await;
    let permit = match inner {
        Some(inner) => permit.holding(inner),
        None => permit,
    };
    permit.settle(SettleWith::Usage {
        prompt: 100,
        cache_read: 0,
        completion: 50,
    });
}

async fn admit(registry: &Registry, scope: &ScopeId, model: &Arc<str>) -> Permit {
    let (answer, handle) = registry
        .acquire(
            scope,
            &AcquireRequest {
                lane: Lane::Interactive,
                prompt_tokens: 100,
                max_completion_tokens: 200,
                completion_estimate: None,
                model: model.clone(),
                adaptive: false,
                max_wait_ns: 0,
                busy_above: None,
                probe: false,
            },
        )
        .await
        .expect("actor reachable");
    let grant = answer.expect("roomy limits admit");
    Permit::new(&handle, &grant)
}

/// Measures on `rt`: criterion's mean, then an HDR pass for the tail.
fn measure(
    c: &mut Criterion,
    name: &str,
    rt: &tokio::runtime::Runtime,
    clock: fn() -> Clock,
    (bound, shape): (Bound, Shape),
) {
    let (registry, scope, group) = rt.block_on(async { registry(clock(), bound, shape) });
    let scope = (scope, group);
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
    measure(
        c,
        "current-thread",
        &single,
        Clock::start,
        (Bound::Local, Shape::TwoWindows),
    );
    // As the node runs it: two workers, so a message may wake the other thread.
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    measure(
        c,
        "multi-thread-2",
        &multi,
        Clock::start,
        (Bound::Local, Shape::TwoWindows),
    );
    // As a running node keeps time: following the wall clock's steps.
    let wall = Clock::following_wall;
    measure(
        c,
        "multi-thread-2, wall-following clock",
        &multi,
        wall,
        (Bound::Local, Shape::TwoWindows),
    );
    // As a cluster node decides: `gossip` allowances, `lease` credit.
    measure(
        c,
        "multi-thread-2, wall clock, gossip",
        &multi,
        wall,
        (Bound::Gossip, Shape::TwoWindows),
    );
    measure(
        c,
        "multi-thread-2, wall clock, lease",
        &multi,
        wall,
        (Bound::Lease, Shape::TwoWindows),
    );
    // The quota shapes, side by side with the two-window scope above.
    for (name, bound, shape) in [
        ("wall clock, six windows", Bound::Local, Shape::SixWindows),
        (
            "wall clock, lease, six windows",
            Bound::Lease,
            Shape::SixWindows,
        ),
        (
            "wall clock, with a model group",
            Bound::Local,
            Shape::WithModelGroup,
        ),
    ] {
        measure(
            c,
            &format!("multi-thread-2, {name}"),
            &multi,
            wall,
            (bound, shape),
        );
    }
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
