use super::*;
use crate::actor::permit::{Permit, SettleWith};
use crate::actor::{Dimension, Lane};
use crate::limiter::{Algorithm, NANOS_PER_SEC};

fn registry(idle_secs: u64) -> (Registry, ScopeId) {
    registry_with(5, 1000, 2, 4, idle_secs)
}

/// A registry of one tenant scope: `requests` and `tokens` per 10 s, `slots`
/// in flight, queues of `max_queue`.
fn registry_with(
    requests: u64,
    tokens: u64,
    slots: u64,
    max_queue: usize,
    idle_secs: u64,
) -> (Registry, ScopeId) {
    let scope = ScopeId::tenant("t");
    let windows = [window(requests), window(tokens), None, None, None, None];
    let registry = registry_over(&scope, windows, Some(slots), max_queue, idle_secs);
    (registry, scope)
}

/// A limit of `capacity` per 10 s.
fn window(capacity: u64) -> Option<LimitSpec> {
    Some(LimitSpec::new(
        capacity,
        10 * NANOS_PER_SEC,
        Algorithm::SlidingWindow,
    ))
}

/// A registry of `scope` alone, with these `windows` and `slots`.
fn registry_over(
    scope: &ScopeId,
    windows: [Option<LimitSpec>; crate::actor::WINDOWS],
    slots: Option<u64>,
    max_queue: usize,
    idle_secs: u64,
) -> Registry {
    let spec = ScopeSpec {
        windows: windows.into(),
        counts_cache_reads: false,
        concurrency: slots,
        adaptive: None,
        allowances: Allowances::default(),
        leased_from: None,
    };
    let defaults = ActorDefaults {
        batch_ceiling: Ceiling::from_share(0.5),
        aging_ns: NANOS_PER_SEC,
        max_queue,
        idle_timeout_ns: idle_secs * NANOS_PER_SEC,
    };
    Registry::new(
        HashMap::from([(scope.clone(), spec)]),
        defaults,
        Clock::start(),
        Arc::new(ActorMetrics::default()),
        None,
    )
    .unwrap()
}

async fn acquire(registry: &Registry, scope: &ScopeId) -> Result<Permit, Refusal> {
    acquire_waiting(registry, scope, 0).await
}

async fn acquire_waiting(
    registry: &Registry,
    scope: &ScopeId,
    max_wait_ns: Nanos,
) -> Result<Permit, Refusal> {
    let (answer, handle) = registry
        .acquire(scope, &request(max_wait_ns))
        .await
        .unwrap();
    answer.map(|grant| Permit::new(&handle, &grant))
}

/// A request that waits up to 30 s, in a task of its own.
fn waiting_in_background(
    registry: &Arc<Registry>,
    scope: &ScopeId,
) -> tokio::task::JoinHandle<Result<Permit, Refusal>> {
    let (registry, scope) = (registry.clone(), scope.clone());
    tokio::spawn(async move { acquire_waiting(&registry, &scope, 30 * NANOS_PER_SEC).await })
}

/// Both slots taken (the permits returned) and a third request queued.
async fn full_with_one_waiting(
    idle_secs: u64,
) -> (
    Arc<Registry>,
    ScopeId,
    [Permit; 2],
    tokio::task::JoinHandle<Result<Permit, Refusal>>,
) {
    let (registry, scope) = registry(idle_secs);
    let registry = Arc::new(registry);
    let a = acquire(&registry, &scope).await.unwrap();
    let b = acquire(&registry, &scope).await.unwrap();
    let waiting = waiting_in_background(&registry, &scope);
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    assert_eq!(registry.status(&scope).await.unwrap().queued, [1, 0]);
    (registry, scope, [a, b], waiting)
}

fn request(max_wait_ns: Nanos) -> AcquireRequest {
    AcquireRequest {
        lane: Lane::Interactive,
        prompt_tokens: 10,
        max_completion_tokens: 10,
        completion_estimate: None,
        model: "m".into(),
        adaptive: false,
        max_wait_ns,
        busy_above: None,
        probe: false,
    }
}

/// The scope's demand so far: requests asked, admitted or not.
async fn requested(registry: &Registry) -> u64 {
    let live = registry.export_live().await;
    live.first().map_or(0, |(_, export)| export.requested[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_is_admitted_only_at_once_and_counted_only_when_admitted() {
    let (registry, scope) = registry(20);
    let registry = Arc::new(registry);
    let probe = AcquireRequest {
        probe: true,
        ..request(30 * NANOS_PER_SEC)
    };
    // Admitted at once: counted as demand like any request.
    let (answer, handle) = registry.acquire(&scope, &probe).await.unwrap();
    let first = Permit::new(&handle, &answer.unwrap());
    assert_eq!(requested(&registry).await, 1);
    let _second = acquire(&registry, &scope).await.unwrap();
    assert_eq!(requested(&registry).await, 2);
    // Full: refused at once despite its 30 s wait, and not counted (the
    // waiting try that may follow counts it).
    let (answer, _) = registry.acquire(&scope, &probe).await.unwrap();
    assert!(answer.is_err());
    assert_eq!(requested(&registry).await, 2);
    // Others waiting ahead: never queued behind them.
    let waiting = waiting_in_background(&registry, &scope);
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let (answer, _) = registry.acquire(&scope, &probe).await.unwrap();
    assert_eq!(
        answer.unwrap_err().blocked.dimension,
        crate::actor::Dimension::Queue
    );
    assert_eq!(registry.status(&scope).await.unwrap().queued, [1, 0]);
    assert_eq!(
        requested(&registry).await,
        3,
        "the waiter counts, the probe not"
    );
    drop(first);
    waiting.await.unwrap().unwrap();
}

/// A caller that goes away while queued behind a slot nobody frees leaves the
/// queue at once: not when a slot comes back, nor at the actor's next
/// periodic look at its queue (a second later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_leaves_while_queued_leaves_the_queue_at_once() {
    let (registry, scope, _held, waiting) = full_with_one_waiting(60).await;
    waiting.abort();
    let _ = waiting.await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(300);
    while registry.status(&scope).await.unwrap().queued != [0, 0] {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the departed caller still queued"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_request_that_finds_nothing_waiting_is_decided_without_the_actor_task() {
    use futures_util::FutureExt;
    let (registry, scope) = registry(20);
    // Ready at its first poll: no message to the actor task, no wake-up of
    // another task (on this one-thread runtime the actor never ran).
    let (answer, handle) = (registry.acquire(&scope, &request(0)).now_or_never())
        .expect("decided in the caller's task")
        .unwrap();
    let grant = answer.unwrap();
    let _b = acquire(&registry, &scope).await.unwrap();
    // A refusal too, when the caller will not wait.
    let (refused, _) = (registry.acquire(&scope, &request(0)).now_or_never())
        .expect("decided in the caller's task")
        .unwrap();
    assert_eq!(
        refused.unwrap_err().blocked.dimension,
        crate::actor::Dimension::Concurrency
    );
    Permit::new(&handle, &grant).settle(SettleWith::Cancel);
    assert_eq!(registry.status(&scope).await.unwrap().in_flight, 1);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_newcomer_never_takes_room_ahead_of_a_request_already_waiting() {
    // Both slots taken: c waits in the queue.
    let (registry, scope, [a, _b], c) = full_with_one_waiting(60).await;
    // A slot frees, and before the actor task has served its queue a newcomer
    // that would fit arrives: it must not take the slot c waits for.
    a.settle(SettleWith::Cancel);
    let newcomer = acquire(&registry, &scope).await;
    assert_eq!(
        newcomer.unwrap_err().blocked.dimension,
        crate::actor::Dimension::Concurrency,
        "the newcomer took the waiting request's slot"
    );
    c.await.unwrap().expect("the waiting request got the slot");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_retired_scope_decides_nothing_and_the_caller_gets_a_fresh_actor() {
    let (registry, scope) = registry(20);
    acquire(&registry, &scope)
        .await
        .unwrap()
        .settle(SettleWith::Cancel);
    let stale = registry.handle(&scope).unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(45)).await;
    assert_eq!(registry.live_actors(), 0, "retired");
    // A caller that took the handle just before: told so, charged nothing.
    let decision = {
        let mut core = stale.shared.lock();
        let now = core.clock().now_ns();
        core.decide_now(now, &request(0))
    };
    assert!(matches!(decision, Decision::Retired));
    let fresh = acquire(&registry, &scope).await.unwrap();
    assert_eq!(registry.live_actors(), 1);
    assert_eq!(registry.status(&scope).await.unwrap().in_flight, 1);
    drop(fresh);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_forward_taken_back_unsent_leaves_the_scope_deciding_and_able_to_retire() {
    let (registry, scope) = registry(20);
    let a = acquire(&registry, &scope).await.unwrap();
    let b = acquire(&registry, &scope).await.unwrap();
    let handle = registry.handle(&scope).unwrap();
    // Told to wait, then the caller goes away before the mailbox took it.
    let forward = {
        let mut core = handle.shared.lock();
        let now = core.clock().now_ns();
        core.decide_now(now, &request(NANOS_PER_SEC))
    };
    assert!(matches!(forward, Decision::Forward(_)));
    drop(Unsent {
        shared: Some(handle.shared()),
    });
    drop(handle);
    a.settle(SettleWith::Cancel);
    b.settle(SettleWith::Cancel);
    // Decided in the caller's task again (nothing counted as on its way) ...
    use futures_util::FutureExt;
    let (answer, handle) = (registry.acquire(&scope, &request(0)).now_or_never())
        .expect("nothing waits")
        .unwrap();
    Permit::new(&handle, &answer.unwrap()).settle(SettleWith::Cancel);
    drop(handle);
    // ... and the scope retires once idle.
    tokio::time::sleep(std::time::Duration::from_secs(45)).await;
    assert_eq!(registry.live_actors(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_racing_on_both_paths_never_exceed_a_limit_and_leave_the_scope_at_rest() {
    use std::sync::atomic::{AtomicU64, Ordering};
    // 400 callers on two workers for 3 slots: the decision in the caller's
    // task, the actor task's queue and releases from every thread race. Two
    // in three wait (up to 5 s, far more than the ~0.2 s all of them need),
    // the rest will not wait at all.
    let (registry, scope) = registry_with(10_000, 1_000_000, 3, 512, 20);
    let registry = Arc::new(registry);
    let held = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let mut callers = tokio::task::JoinSet::new();
    for i in 0..400u64 {
        let (registry, scope) = (registry.clone(), scope.clone());
        let (held, most) = (held.clone(), most.clone());
        callers.spawn(async move {
            let max_wait_ns = if i % 3 == 0 { 0 } else { 5 * NANOS_PER_SEC };
            let Ok(permit) = acquire_waiting(&registry, &scope, max_wait_ns).await else {
                return (max_wait_ns, false, false);
            };
            most.fetch_max(held.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_micros(300 * (i % 4))).await;
            held.fetch_sub(1, Ordering::SeqCst);
            // Half settle with usage; half are dropped before being sent,
            // which cancels them (their request is not counted).
            if i % 2 == 0 {
                permit.settle(SettleWith::Usage {
                    cache_read: 0,
                    prompt: 10,
                    completion: 3,
                });
            } else {
                drop(permit);
            }
            (max_wait_ns, i % 2 == 0, true)
        });
    }
    let (mut waiters, mut waiters_served, mut served, mut charged) = (0, 0, 0, 0);
    while let Some(joined) = callers.join_next().await {
        let (max_wait_ns, settled, admitted) = joined.unwrap();
        served += u64::from(admitted);
        charged += u64::from(admitted && settled);
        if max_wait_ns > 0 {
            waiters += 1;
            waiters_served += u64::from(admitted);
        }
    }
    assert!(most.load(Ordering::SeqCst) <= 3, "more than 3 held at once");
    assert_eq!(waiters_served, waiters, "a waiting caller was never served");
    assert!(served > waiters, "no caller that would not wait was served");
    let status = registry.status(&scope).await.unwrap();
    assert_eq!((status.in_flight, status.queued), (0, [0, 0]));
    assert_eq!(
        status.requests.unwrap().used,
        charged,
        "one request per admission settled with usage"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn callers_waiting_on_an_actor_task_that_stops_ask_again() {
    let (registry, scope, _held, waiting) = full_with_one_waiting(20).await;
    // What the task's guard does however the task ends, a panic included.
    let stale = registry.handle(&scope).unwrap();
    drop(super::super::task::Stopping(stale.shared()));
    // The waiter is not left waiting for its 30 s: it asks again and is
    // served by a fresh actor (which knows nothing of the stopped one's
    // permits, as when the task owned the state and a panic dropped it).
    let served = tokio::time::timeout(std::time::Duration::from_secs(1), waiting).await;
    served.expect("still waiting").unwrap().unwrap();
    let fresh = registry.handle(&scope).unwrap();
    assert!(!Arc::ptr_eq(&fresh.shared, &stale.shared), "a fresh actor");
}

#[tokio::test]
async fn a_grant_whose_caller_went_away_before_taking_it_is_cancelled() {
    let (registry, scope) = registry(20);
    let (answer, handle) = registry.acquire(&scope, &request(0)).await.unwrap();
    let grant = answer.unwrap();
    assert_eq!(registry.status(&scope).await.unwrap().in_flight, 1);
    // The race: the actor's send succeeded, then the caller's future is
    // dropped with the grant still in the channel.
    let (tx, rx) = oneshot::channel();
    tx.send(Ok(grant)).unwrap();
    drop(Unclaimed {
        rx: Some(rx),
        shared: handle.shared(),
    });
    let mut in_flight = 1;
    for _ in 0..200 {
        in_flight = registry.status(&scope).await.unwrap().in_flight;
        if in_flight == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(in_flight, 0, "the charge was undone");
}

#[tokio::test(start_paused = true)]
async fn actors_spawn_lazily_and_retire_only_when_idle_and_at_rest() {
    let (registry, scope) = registry(20);
    assert_eq!(
        registry.live_actors(),
        0,
        "nothing spawned before first use"
    );
    let permit = acquire(&registry, &scope).await.unwrap();
    assert_eq!(registry.live_actors(), 1);
    // Idle time passes while a permit is in flight: the actor must stay.
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    assert_eq!(registry.live_actors(), 1);
    permit.settle(SettleWith::Usage {
        cache_read: 0,
        prompt: 10,
        completion: 5,
    });
    // The window (10 s) empties and the idle timeout (20 s) passes: it retires.
    tokio::time::sleep(std::time::Duration::from_secs(45)).await;
    assert_eq!(registry.live_actors(), 0);
    // And comes back fresh, with nothing lost (the state it dropped was at rest).
    let again = acquire(&registry, &scope).await.unwrap();
    let status = registry.status(&scope).await.unwrap();
    assert_eq!(status.requests.unwrap().used, 1);
    drop(again);
}

#[tokio::test(start_paused = true)]
async fn the_sync_rounds_exports_do_not_keep_an_idle_actor_alive() {
    let (registry, scope) = registry(20);
    let permit = acquire(&registry, &scope).await.unwrap();
    permit.settle(SettleWith::Usage {
        cache_read: 0,
        prompt: 10,
        completion: 5,
    });
    // The cluster's sync engine exports every live actor each round.
    let until = tokio::time::Instant::now() + std::time::Duration::from_secs(45);
    while tokio::time::Instant::now() < until && registry.live_actors() > 0 {
        let _ = registry.export_live().await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(registry.live_actors(), 0, "retired though exported");
}

#[tokio::test(start_paused = true)]
async fn an_answered_permit_counts_a_window_from_its_answer() {
    let (registry, scope) = registry(60);
    let mut permit = acquire(&registry, &scope).await.unwrap();
    // The upstream answers 8 s after admission (a slow way there): the provider
    // counted the request by then, so the charge moves there (with the
    // settlement's message), and the settlement corrects it where it now is.
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    permit.answered();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    permit.settle(SettleWith::Usage {
        cache_read: 0,
        prompt: 10,
        completion: 5,
    });
    // Past admission + W (10 s): still counted.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let status = registry.status(&scope).await.unwrap();
    assert_eq!(status.requests.unwrap().used, 1);
    assert_eq!(status.tokens.unwrap().used, 15);
    // A window after the answer (and its bucket): gone.
    tokio::time::sleep(std::time::Duration::from_secs(7)).await;
    let status = registry.status(&scope).await.unwrap();
    assert_eq!(status.requests.unwrap().used, 0);
    assert_eq!(status.tokens.unwrap().used, 0);
    // `redate_now` moves a held charge at once (a stream that settles late).
    let permit = acquire(&registry, &scope).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    permit.redate_now();
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let status = registry.status(&scope).await.unwrap();
    assert_eq!(
        status.requests.unwrap().used,
        1,
        "past admission + W: moved"
    );
    drop(permit);
}

#[tokio::test(start_paused = true)]
async fn only_requests_waiting_for_a_slot_are_concurrency_demand() {
    let (registry, scope) = registry(60);
    let registry = Arc::new(registry);
    let waiting = |r: &Arc<Registry>| {
        let r = r.clone();
        async move { r.export_live().await[0].1.waiting }
    };
    // Both slots taken: a third request queues for a slot.
    let a = acquire(&registry, &scope).await.unwrap();
    let b = acquire(&registry, &scope).await.unwrap();
    let queued = waiting_in_background(&registry, &scope);
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    assert_eq!(waiting(&registry).await, 1);
    a.settle(SettleWith::Cancel);
    let c = queued.await.unwrap().unwrap();
    assert_eq!(waiting(&registry).await, 0, "served");
    // Now the request window (5) is what holds a queued request back: not
    // slot demand, though a slot is free.
    b.settle(SettleWith::KeepReserved);
    c.settle(SettleWith::KeepReserved);
    for _ in 0..3 {
        acquire(&registry, &scope)
            .await
            .unwrap()
            .settle(SettleWith::KeepReserved);
    }
    let queued = waiting_in_background(&registry, &scope);
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    assert_eq!(registry.status(&scope).await.unwrap().in_flight, 0);
    assert_eq!(
        waiting(&registry).await,
        0,
        "blocked on the window, not a slot"
    );
    queued.abort();
}

#[tokio::test(start_paused = true)]
async fn dropped_permits_settle_once_and_free_their_slot() {
    let (registry, scope) = registry(20);
    let a = acquire(&registry, &scope).await.unwrap();
    let b = acquire(&registry, &scope).await.unwrap();
    let refused = acquire(&registry, &scope).await.unwrap_err();
    assert_eq!(
        refused.blocked.dimension,
        crate::actor::Dimension::Concurrency
    );
    let mut a = a;
    a.sending();
    drop(a); // e.g. the client went away mid-stream
    b.settle(SettleWith::Cancel);
    let status = registry.status(&scope).await.unwrap();
    assert_eq!(status.in_flight, 0);
    // The dropped permit, sent, kept its reservation (1 request, 20 tokens);
    // the cancelled one gave everything back, including its request.
    assert_eq!(status.tokens.unwrap().used, 20);
    assert_eq!(status.requests.unwrap().used, 1);
    // Dropped before it was sent (the client left while it queued): nothing.
    drop(acquire(&registry, &scope).await.unwrap());
    let status = registry.status(&scope).await.unwrap();
    assert_eq!(status.in_flight, 0);
    assert_eq!(status.requests.unwrap().used, 1);
    // Sent and answered with no work done, then dropped between attempts:
    // the request counts, its tokens do not.
    let mut c = acquire(&registry, &scope).await.unwrap();
    c.sending();
    c.drop_as(SettleWith::RefundTokens);
    drop(c);
    let status = registry.status(&scope).await.unwrap();
    assert_eq!(status.tokens.unwrap().used, 20);
    assert_eq!(status.requests.unwrap().used, 2);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_request_whose_wait_is_known_to_outlast_its_deadline_is_refused_at_once() {
    let (registry, scope) = registry(60);
    // Five requests spend the 10 s window of 5; each is settled, so nothing
    // unsettled could free room early.
    for _ in 0..5 {
        let permit = acquire(&registry, &scope).await.unwrap();
        permit.settle(SettleWith::Usage {
            cache_read: 0,
            prompt: 10,
            completion: 10,
        });
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let asked = tokio::time::Instant::now();
    let refused = acquire_waiting(&registry, &scope, 2 * NANOS_PER_SEC)
        .await
        .unwrap_err();
    assert_eq!(
        asked.elapsed(),
        std::time::Duration::ZERO,
        "answered at once"
    );
    assert_eq!(refused.blocked.dimension, Dimension::Requests);
    assert!(
        refused.blocked.retry_after_ns > 2 * NANOS_PER_SEC,
        "the exact wait, past the deadline: {} ns",
        refused.blocked.retry_after_ns
    );
    // A wait that ends before the deadline is waited out, and admitted.
    let waited = acquire_waiting(&registry, &scope, 12 * NANOS_PER_SEC).await;
    assert!(waited.is_ok());
    assert!(asked.elapsed() > std::time::Duration::from_secs(2));
    // While a request is unsettled its settlement may free room sooner: the
    // caller waits its whole wait instead.
    let unsettled = waited.unwrap();
    for _ in 0..4 {
        let permit = acquire(&registry, &scope).await.unwrap();
        permit.settle(SettleWith::Usage {
            cache_read: 0,
            prompt: 10,
            completion: 10,
        });
    }
    let asked = tokio::time::Instant::now();
    let refused = acquire_waiting(&registry, &scope, 2 * NANOS_PER_SEC).await;
    assert!(refused.is_err());
    assert!(
        asked.elapsed() >= std::time::Duration::from_secs(2),
        "waited"
    );
    drop(unsettled);
}

#[tokio::test]
async fn output_windows_charge_max_tokens_where_the_tokens_window_takes_an_estimate() {
    // An upstream of 1,000 tokens and 150 output tokens per window, sent a
    // request whose tenant estimated 10 of its max_tokens 100.
    let scope = ScopeId::upstream("anthropic");
    let windows = [None, window(1_000), None, window(150), None, None];
    let registry = registry_over(&scope, windows, None, 4, 60);
    let ask = AcquireRequest {
        max_completion_tokens: 100,
        completion_estimate: Some(10),
        ..request(0)
    };
    let (answer, handle) = registry.acquire(&scope, &ask).await.unwrap();
    let grant = answer.unwrap();
    assert_eq!((grant.cost.output, grant.cost.output_cap), (10, 100));
    let status = registry.status(&scope).await.unwrap();
    assert_eq!(status.tokens.unwrap().used, 20, "prompt and the estimate");
    assert_eq!(status.output_tokens.unwrap().used, 100, "max_tokens");
    // A second such request fits the tokens window, not the output one.
    let (second, _) = registry.acquire(&scope, &ask).await.unwrap();
    assert_eq!(
        second.unwrap_err().blocked.dimension,
        Dimension::OutputTokens
    );
    // Settled at 7 output tokens: the output window holds the real figure.
    Permit::new(&handle, &grant).settle(SettleWith::Usage {
        prompt: 10,
        cache_read: 0,
        completion: 7,
    });
    let status = registry.status(&scope).await.unwrap();
    assert_eq!(status.output_tokens.unwrap().used, 7);
}
