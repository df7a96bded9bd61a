use super::*;

fn admitted(ts_ms: u64) -> MockLine {
    MockLine {
        ts_ms,
        outcome: "admitted".into(),
        reason: None,
        prompt_tokens: 10,
        completion_tokens: 5,
        model: None,
    }
}

fn op(node: usize, invoke_ms: u64, status: Option<u16>) -> Op {
    Op {
        node,
        invoke_ms,
        complete_ms: status.map(|_| invoke_ms + 5),
        status,
        ..Op::default()
    }
}

fn case<'a>(mode: &'a str, faults: &'a [Interval]) -> Case<'a> {
    Case {
        mode,
        nemeses: &[],
        nodes: 3,
        limit: 10,
        tenant_limits: &[10],
        window_ms: 1_000,
        t0_unix_ms: 0,
        faults,
        samples: &[],
        converge_within_ms: 1_000,
        settlements: &[Some(Settlements {
            admitted: 4,
            settled: 4,
            in_flight: 0,
        })],
        run_ms: 2_000,
        token_limit: None,
        day: None,
        slots: None,
        audit: None,
        clock_slack_ms: 0,
    }
}

#[test]
fn a_daily_quota_is_judged_over_the_day_window_beside_the_windows() {
    // 8 requests a second apart: never more than 1 in a 1 s window, 8 in the
    // 10 s day window.
    let lines: Vec<MockLine> = (0..8).map(|i| admitted(i * 1_000)).collect();
    let day_check = |limit| {
        let case = Case {
            day: Some(Day {
                limit,
                window_ms: 10_000,
            }),
            ..case("lease", &[])
        };
        check(&case, &lines, &[])
    };
    assert!(day_check(8).iter().all(|c| c.ok), "{:?}", day_check(8));
    let over = day_check(7);
    let day = (over.iter())
        .find(|c| c.name.contains("per day window"))
        .expect("judged");
    assert!(!day.ok && day.detail.contains("peak 8 requests"), "{day:?}");
    assert!(over[0].ok, "the window's own check passes: {:?}", over[0]);
    // Without a daily quota there is no day check.
    let none = check(&case("lease", &[]), &lines, &[]);
    assert!(none.iter().all(|c| !c.name.contains("per day window")));
}

#[test]
fn tokens_are_judged_against_the_token_limit_when_there_is_one() {
    // Two requests of 10 + 5 tokens in one window: 30 tokens.
    let lines = [admitted(100), admitted(200)];
    let token_check = |limit| {
        let case = Case {
            token_limit: limit,
            ..case("lease", &[])
        };
        check(&case, &lines, &[])
            .into_iter()
            .find(|c| c.name.starts_with("tokens sent"))
    };
    assert!(token_check(None).is_none());
    assert!(token_check(Some(30)).is_some_and(|c| c.ok));
    let over = token_check(Some(29)).expect("judged");
    assert!(
        !over.ok && over.detail.contains("peak 30 tokens"),
        "{over:?}"
    );
}

#[test]
fn lease_credit_must_not_be_spent_after_it_lapsed() {
    let grant = |seq, until_ms| LeaseEvent {
        ev: "grant".into(),
        key: "tenant:t0:requests".into(),
        holder: Some("n1/17@10.0.0.2:7200".into()),
        seq,
        until_ms: Some(until_ms),
        ..LeaseEvent::default()
    };
    let spend = |seq, at_ms| {
        (
            1,
            LeaseEvent {
                ev: "spend".into(),
                key: "tenant:t0:requests".into(),
                seq,
                at_ms: Some(at_ms),
                ..LeaseEvent::default()
            },
        )
    };
    let audit = |spends: Vec<(usize, LeaseEvent)>| LeaseAudit {
        grants: vec![grant(10, 3_010), grant(20, 3_020)],
        spends,
    };
    let ok = conservation(
        &audit(vec![spend(10, 3_000), spend(20, 3_019), spend(30, 9_999)]),
        0,
    );
    assert!(ok.ok && ok.detail.starts_with("2 spends"), "{ok:?}");
    assert!(ok.detail.contains("1 without"), "{ok:?}");
    let late = conservation(&audit(vec![spend(10, 3_010)]), 0);
    assert!(!late.ok && late.detail.contains("0 ms after"), "{late:?}");
    // Another node's statement with the same seq is not its grant.
    let other = audit(vec![(0, spend(10, 5_000).1)]);
    assert!(conservation(&other, 0).detail.starts_with("not judged"));
    // Clocks set apart on purpose are forgiven up to the slack.
    assert!(conservation(&audit(vec![spend(10, 4_000)]), 2_000).ok);
}

#[test]
fn a_killed_nodes_slots_must_come_back_within_the_bound() {
    let kill = Interval {
        from_ms: 1_000,
        to_ms: 10_000,
        label: "kill -9 n2".into(),
        sides: vec![vec![0, 1]],
        healed: false,
        down: Some(2),
        slack_ms: 0,
    };
    let at = |at_ms, n| UpstreamSample {
        at_ms,
        in_flight: Some(n),
    };
    // Full (2) before the kill does not count, nor right after it (the killed
    // node's streams still open); back to 2 at 2500 ms: 1500 ms.
    let upstream = [
        at(900, 2),
        at(1_000, 2),
        at(1_250, 1),
        at(2_000, 1),
        at(2_500, 2),
    ];
    let slots = |back_within_ms| Slots {
        limit: 2,
        back_within_ms,
        upstream: &upstream,
    };
    let ok = ghost_slots(std::slice::from_ref(&kill), &slots(2_000), 10_000);
    assert!(ok.ok && ok.detail.contains("within 1500 ms"), "{ok:?}");
    let late = ghost_slots(std::slice::from_ref(&kill), &slots(1_000), 10_000);
    assert!(
        !late.ok && late.detail.contains("kill -9 n2: 1500 ms"),
        "{late:?}"
    );
    // Never back, with time left in the run: a ghost slot.
    let never = [at(1_250, 1), at(5_000, 1)];
    let stuck = Slots {
        limit: 2,
        back_within_ms: 2_000,
        upstream: &never,
    };
    let c = ghost_slots(std::slice::from_ref(&kill), &stuck, 10_000);
    assert!(!c.ok && c.detail.contains("never"), "{c:?}");
    // A pause is no kill: its streams are still open at the upstream.
    let pause = Interval {
        label: "pause n2".into(),
        ..kill.clone()
    };
    assert!(ghost_slots(&[pause], &stuck, 10_000).ok);
}

#[test]
fn utilisation_counts_only_healthy_time() {
    // 2 s run, W = 1 s, L = 10; a fault 500-1000 ms counts until 2000 ms:
    // healthy 0-500 ms (half a window): not judged.
    let cut = [Interval {
        from_ms: 500,
        to_ms: 1_000,
        label: "cut".into(),
        sides: vec![],
        healed: true,
        down: None,
        slack_ms: 0,
    }];
    let lines: Vec<MockLine> = (0..10).map(|i| admitted(i * 40)).collect();
    assert_eq!(healthy_utilisation(&case("lease", &cut), &lines), None);
    // No fault: 10 sent in 2 s of L = 10 per second is 0.5.
    let u = healthy_utilisation(&case("lease", &[]), &lines).unwrap();
    assert!((u - 0.5).abs() < 1e-9, "{u}");
    let checks = check(&case("lease", &[]), &lines, &[]);
    let c = checks
        .iter()
        .find(|c| c.name == "utilisation when healthy")
        .unwrap();
    assert!(!c.ok && c.detail.starts_with("0.50"), "{c:?}");
    // Twice as many: 1.0, and it passes.
    let full: Vec<MockLine> = (0..20).map(|i| admitted(i * 100)).collect();
    let checks = check(&case("lease", &[]), &full, &[]);
    assert!(checks.iter().all(|c| c.ok), "{checks:?}");
}

#[test]
fn every_admission_must_be_settled_on_the_nodes_that_answer() {
    let done = Settlements {
        admitted: 7,
        settled: 7,
        in_flight: 0,
    };
    let ok = settlement(&[Some(done), None]);
    assert!(ok.ok, "{ok:?}");
    assert!(ok.detail.contains("n1 down at the end"), "{ok:?}");
    let open = Settlements {
        settled: 6,
        in_flight: 1,
        ..done
    };
    let bad = settlement(&[Some(done), Some(open)]);
    assert!(!bad.ok);
    assert!(
        bad.detail
            .contains("n1: 7 admitted, 6 settled, 1 in flight"),
        "{bad:?}"
    );
    assert!(!settlement(&[None, None]).ok, "nothing judged is no pass");
}

#[test]
fn the_peak_is_over_any_window_not_fixed_ones() {
    // 3 at the end of one fixed window and 3 at the start of the next: 6 in
    // one sliding window of 1000 ms.
    let lines: Vec<MockLine> = [900, 950, 990, 1000, 1010, 1050].map(admitted).to_vec();
    let peak = window_peak(&lines, 1_000);
    assert_eq!(peak.requests, 6);
    assert_eq!(peak.tokens, 90);
    // An entry exactly W older has left the window.
    let lines: Vec<MockLine> = [0, 1_000].map(admitted).to_vec();
    assert_eq!(window_peak(&lines, 1_000).requests, 1);
}

#[test]
fn checks_fail_on_overshoot_429s_lost_operations_and_starved_sides() {
    let lines: Vec<MockLine> = (0..12).map(|i| admitted(i * 10)).collect();
    let mut refused = admitted(500);
    refused.outcome = "refused".into();
    refused.reason = Some("requests".into());
    // n2 asked during the cut and got nothing; n0 was served.
    let ops = vec![op(0, 0, Some(200)), op(1, 0, None), op(2, 1_150, Some(429))];
    let cut = [Interval {
        from_ms: 100,
        to_ms: 2_000,
        label: "cut n0-n2".into(),
        sides: vec![vec![0, 1], vec![2]],
        healed: false,
        down: None,
        slack_ms: 0,
    }];
    let mut all = lines.clone();
    all.push(refused);
    let checks = check(&case("lease", &cut), &all, &ops);
    let failed: Vec<&str> = (checks.iter())
        .filter(|c| !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        failed,
        [
            "sent to the upstream per window <= promise",
            "upstream 429s",
            "nothing lost",
            "every side keeps serving through each fault"
        ],
        "{checks:?}"
    );
    assert!(
        checks[0].detail.contains("served in it: n0 1, n1 0, n2 0"),
        "{checks:?}"
    );
    assert!(
        checks[0].detail.contains("cut n0-n2 (100-2000 ms)"),
        "{checks:?}"
    );
    assert!(
        checks[4]
            .detail
            .contains("{n2} during cut n0-n2 (100-2000 ms): refused at 1150"),
        "{checks:?}"
    );
    // local full promises N x L: 12 <= 30, and upstream 429s are expected there.
    let checks = check(&case("local-full", &[]), &all, &ops[..1]);
    assert!(checks.iter().all(|c| c.ok), "{checks:?}");
    // Less than a window into the fault, nothing is judged.
    assert!(starved(&cut, &[op(2, 900, Some(429))], 1_000).is_empty());
    assert_eq!(starved(&cut, &[op(2, 1_100, Some(429))], 1_000).len(), 1);
    assert!(starved(&cut, &[op(2, 1_100, Some(200))], 1_000).is_empty());
    // Served within the window before the refusal: alive.
    let spent_early = [op(2, 400, Some(200)), op(2, 1_300, Some(429))];
    assert!(starved(&cut, &spent_early, 1_000).is_empty());
    let long_ago = [op(2, 200, Some(200)), op(2, 1_300, Some(429))];
    assert_eq!(starved(&cut, &long_ago, 1_000).len(), 1);
    // A node that was down is not starved by the cut: it was not there.
    let killed = [
        cut[0].clone(),
        Interval {
            from_ms: 500,
            to_ms: 1_200,
            label: "kill -9 n2".into(),
            sides: vec![vec![0, 1]],
            healed: false,
            down: Some(2),
            slack_ms: 0,
        },
    ];
    assert!(starved(&killed, &long_ago, 1_000).is_empty());
    // A clock 500 ms behind keeps usage counting 500 ms longer: judged from a
    // window and the slack in, against a window and the slack before.
    let mut skewed = cut.clone();
    skewed[0].slack_ms = 500;
    assert!(starved(&skewed, &[op(2, 1_300, Some(429))], 1_000).is_empty());
    assert!(starved(&skewed, &long_ago, 1_000).is_empty());
    let longer_ago = [op(2, 200, Some(200)), op(2, 1_800, Some(429))];
    assert_eq!(starved(&skewed, &longer_ago, 1_000).len(), 1);
}

#[test]
fn convergence_is_the_slowest_node_to_see_everyone_after_a_heal() {
    let cut = [Interval {
        from_ms: 0,
        to_ms: 1_000,
        label: "cut".into(),
        sides: vec![vec![0], vec![1]],
        healed: true,
        down: None,
        slack_ms: 0,
    }];
    let sample = |at_ms, node, members: Option<usize>| Sample {
        at_ms,
        node,
        members: members.map(|n| (0..n).map(|i| format!("n{i}")).collect()),
    };
    let samples = [
        sample(900, 0, Some(2)),
        sample(1_100, 0, Some(1)),
        sample(1_300, 0, Some(2)),
        sample(1_200, 1, None),
        sample(1_700, 1, Some(2)),
    ];
    assert_eq!(convergence(&cut, &samples, 2), Ok(700));
    let err = convergence(&cut, &samples[..3], 2).unwrap_err();
    assert!(err.contains("n1 never saw all 2 members up"), "{err}");
    // A node killed before the heal is not waited for.
    let killed = [
        cut[0].clone(),
        Interval {
            from_ms: 500,
            to_ms: 5_000,
            label: "kill -9 n1".into(),
            sides: vec![vec![0]],
            healed: false,
            down: Some(1),
            slack_ms: 0,
        },
    ];
    let alone = [sample(1_200, 0, Some(1))];
    assert_eq!(convergence(&killed, &alone, 2), Ok(200));
    let mut c = case("lease", &cut);
    c.nodes = 2;
    c.samples = &samples;
    let views = |c: &Case<'_>| {
        let checks = check(c, &[], &[]);
        checks
            .into_iter()
            .find(|c| c.name.starts_with("views"))
            .unwrap()
    };
    assert!(views(&c).ok, "700 ms within 1000 ms");
    c.converge_within_ms = 500;
    assert!(!views(&c).ok, "700 ms beyond 500 ms");
}

#[test]
fn each_tenant_is_held_to_its_own_limit() {
    let mut lines: Vec<MockLine> = Vec::new();
    for i in 0..6 {
        let mut l = admitted(i * 10);
        l.model = Some(crate::workload::tenant_model(usize::from(i % 2 == 0)));
        lines.push(l);
    }
    let limits = [3, 2];
    let mut two = case("lease", &[]);
    two.tenant_limits = &limits;
    let checks = check(&two, &lines, &[]);
    let by_name = |n: &str| checks.iter().find(|c| c.name.starts_with(n)).unwrap().ok;
    assert!(by_name("sent to the upstream"), "6 <= 10: {checks:?}");
    assert!(by_name("tenant t0"), "3 <= 3: {checks:?}");
    assert!(!by_name("tenant t1"), "3 > 2: {checks:?}");
}

#[test]
fn every_limit_the_upstream_refuses_on_is_a_429_and_bad_input_is_not() {
    let refused = |reason: &str| {
        let mut line = admitted(0);
        line.outcome = "refused".into();
        line.reason = Some(reason.into());
        line
    };
    let limits = [
        "requests",
        "tokens",
        "input_tokens",
        "output_tokens",
        "concurrency",
        "requests_per_day",
        "tokens_per_day",
    ];
    let lines: Vec<MockLine> = limits.iter().map(|r| refused(r)).collect();
    assert_eq!(upstream_429s(&lines), 7);
    // Each was sent by the gateway: its overshoot, in the window's peak too.
    assert_eq!(window_peak(&lines, 1_000).requests, 7);
    assert_eq!(upstream_429s(&[refused("invalid")]), 0);
}
