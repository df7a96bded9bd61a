use super::charge::settled;
use super::*;

/// A gate over one tenant limiting requests (12 per window) and slots (3), its
/// store pointing nowhere (lazy: nothing connects in these tests; it needs a
/// runtime to exist).
fn gate() -> (RedisGate, ScopeId) {
    gate_over(&[
        (Dimension::Requests, "t:r", 12),
        (Dimension::Concurrency, "t:c", 3),
    ])
}

/// A gate over tenant `acme` with `limits` (dimension, key, capacity).
fn gate_over(limits: &[(Dimension, &str, u64)]) -> (RedisGate, ScopeId) {
    let store = RedisStore::single("redis://127.0.0.1:1/", Duration::from_millis(5), None).unwrap();
    let scope = ScopeId::tenant("acme");
    let limits: Vec<_> = (limits.iter())
        .map(|(dimension, key, capacity)| Binding {
            key: Arc::from(*key),
            scope: scope.clone(),
            dimension: *dimension,
            capacity: *capacity,
            allowance: None,
            counts_cache_reads: false,
            leased: false,
        })
        .collect();
    let gate = RedisGate::new(
        store,
        "tg",
        &limits,
        tollgate_cluster::counter::Window::try_new(60_000, 60)
            .expect("window")
            .into(),
        Duration::from_secs(10),
        "n1".into(),
    );
    (gate, scope)
}

/// A request of `n` prompt tokens.
fn tokens(n: u64) -> Cost {
    Cost {
        input: n,
        output: 0,
        output_cap: 0,
    }
}

fn fallback(charged: u64) -> HashMap<String, Fallback> {
    let entry = |own| Fallback {
        allowance: Allowance::new(u64::MAX),
        own,
        charged,
    };
    [
        ("t:r".to_owned(), entry(charged)),
        ("t:c".to_owned(), entry(1)),
    ]
    .into()
}

#[tokio::test]
async fn a_lost_node_spends_nothing_until_its_loss_is_confirmed_then_its_share() {
    let (gate, scope) = gate();
    let limits = &gate.scopes[&scope];
    gate.set_fallback(fallback(4));
    assert_eq!(
        gate.record_local(limits, tokens(1)),
        Ok(false),
        "healthy: not local"
    );
    gate.on_lost("test");
    let epoch = gate.lost_since();
    assert!(epoch > 0);
    let unconfirmed = gate.record_local(limits, tokens(1)).unwrap_err();
    assert_eq!(unconfirmed.retry_after, Some(UNCONFIRMED_RETRY));
    // A confirmation of another loss does not count.
    gate.set_confirmed(epoch - 1);
    assert!(gate.record_local(limits, tokens(1)).is_err());
    gate.set_confirmed(epoch);
    for _ in 0..4 {
        assert_eq!(gate.record_local(limits, tokens(1)), Ok(true));
    }
    let full = gate.record_local(limits, tokens(1)).unwrap_err();
    assert_eq!(full.dimension, "requests");
    assert!(
        full.retry_after.unwrap() > UNCONFIRMED_RETRY,
        "until it leaves the window"
    );
}

#[tokio::test]
async fn a_request_above_the_lost_nodes_share_but_within_the_limit_is_told_to_retry() {
    let (gate, scope) = gate_over(&[(Dimension::Tokens, "t:t", 100)]);
    let limits = &gate.scopes[&scope];
    let share = Fallback {
        allowance: Allowance::new(u64::MAX),
        own: 30,
        charged: 30,
    };
    gate.set_fallback([("t:t".to_owned(), share)].into());
    gate.on_lost("test");
    gate.set_confirmed(gate.lost_since());
    // 50 tokens: more than the 30 this node may spend while Redis is lost,
    // within the tenant's 100 once it is back. (Told "never", the client got a
    // 413 for a request that fits.)
    let above_share = gate.record_local(limits, tokens(50)).unwrap_err();
    assert_eq!(above_share.retry_after, Some(LOWERED_RETRY));
    // 150: above the limit itself, never.
    assert_eq!(
        gate.record_local(limits, tokens(150))
            .unwrap_err()
            .retry_after,
        None
    );
    assert_eq!(gate.record_local(limits, tokens(30)), Ok(true));
}

#[tokio::test]
async fn a_new_loss_never_reuses_an_earlier_epoch() {
    let (gate, _) = gate();
    gate.on_lost("first");
    let first = gate.lost_since();
    gate.on_lost("again, same loss");
    assert_eq!(gate.lost_since(), first);
    // Back (as the probe does), then lost again within the same millisecond
    // or after a clock step back.
    gate.lost_since.store(0, Ordering::Relaxed);
    gate.last_epoch.store(u64::MAX / 2, Ordering::Relaxed);
    gate.on_lost("second");
    assert_eq!(gate.lost_since(), u64::MAX / 2 + 1);
}

#[tokio::test]
async fn reservations_ask_for_the_caps_peers_losses_lowered() {
    let (gate, scope) = gate();
    let limits = &gate.scopes[&scope];
    let mut reservation = gate.reservation(limits, tokens(10), "p".into());
    assert!(gate.at_current_caps(limits, &mut reservation));
    assert_eq!(
        (reservation.windows[0].capacity, reservation.concurrency),
        (12, 3)
    );
    assert!(!RedisGate::lowered(limits, &reservation));
    // The same reservation, asked again after peers' losses lowered the caps.
    gate.set_caps([("t:r".to_owned(), 8), ("t:c".to_owned(), 2)].into());
    assert!(gate.at_current_caps(limits, &mut reservation));
    assert_eq!(
        (reservation.windows[0].capacity, reservation.concurrency),
        (8, 2)
    );
    assert!(RedisGate::lowered(limits, &reservation));
    // Every slot charged to lost peers: not asked (0 would mean no limit).
    gate.set_caps([("t:c".to_owned(), 0)].into());
    assert!(!gate.at_current_caps(limits, &mut reservation));
    // A cap is never raised above the configured capacity; back to it.
    gate.set_caps([("t:r".to_owned(), 99)].into());
    assert!(gate.at_current_caps(limits, &mut reservation));
    assert_eq!(
        (reservation.windows[0].capacity, reservation.concurrency),
        (12, 3)
    );
}

#[test]
fn redis_settles_to_the_figures_the_local_scope_settles_to() {
    let reserved = Cost {
        input: 100,
        output: 40,
        output_cap: 200,
    };
    let usage = SettleWith::Usage {
        prompt: 90,
        cache_read: 900,
        completion: 7,
    };
    // Cache reads count as input only where the scope says so.
    assert_eq!(settled(usage, reserved, false).tokens.input, 90);
    let counted = settled(usage, reserved, true);
    assert_eq!((counted.requests, counted.tokens.input), (1, 990));
    assert_eq!(
        counted.tokens.on(Dimension::OutputTokens),
        7,
        "the real output"
    );
    let kept = settled(SettleWith::KeepReserved, reserved, false);
    assert_eq!(
        kept.tokens.on(Dimension::OutputTokens),
        200,
        "max_tokens kept"
    );
    assert_eq!(settled(SettleWith::Cancel, reserved, false).requests, 0);
    assert_eq!(
        settled(SettleWith::RefundTokens, reserved, false),
        Settled {
            requests: 1,
            tokens: Cost::default()
        }
    );
}
