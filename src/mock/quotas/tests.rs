use super::*;
use crate::mock::headers::rate_limit_headers;

const WINDOW: u64 = 1000;

/// A mock with the window of these tests and `model_limits`, nothing else limited.
fn config(model_limits: Vec<ModelLimits>) -> MockConfig {
    MockConfig {
        window_ms: WINDOW,
        model_limits,
        ..MockConfig::default()
    }
}

/// A group of `models` limiting nothing yet.
fn group(models: &[&str]) -> ModelLimits {
    ModelLimits {
        models: models.iter().map(|m| (*m).to_owned()).collect(),
        ..ModelLimits::default()
    }
}

fn tokens(n: u64) -> Cost {
    Cost {
        tokens: n,
        ..Cost::default()
    }
}

fn output(n: u64) -> Cost {
    Cost {
        output: n,
        ..Cost::default()
    }
}

fn admitted(verdict: Verdict) -> (Option<usize>, View) {
    match verdict {
        Verdict::Admitted { group, view } => (group, view),
        Verdict::Refused(r) => panic!("expected an admission, got {r:?}"),
    }
}

fn refused(verdict: Verdict) -> Refused {
    match verdict {
        Verdict::Refused(refused) => refused,
        Verdict::Admitted { view, .. } => panic!("expected a refusal, got {view:?}"),
    }
}

#[test]
fn a_groups_tpm_refuses_while_the_account_has_room_and_charges_nothing() {
    let mut q = Quotas::new(&MockConfig {
        rpm: 100,
        tpm: 10_000,
        ..config(vec![ModelLimits {
            tpm: 100,
            ..group(&["gpt-4o"])
        }])
    });
    let (g, view) = admitted(q.try_admit(0, "gpt-4o", tokens(60), 0));
    assert_eq!(g, Some(0));
    // The group limits TPM: the headers carry its figures; RPM stays the account's.
    let shown = |v: View| (v.limits.tpm, v.usage.tokens, v.limits.rpm, v.usage.requests);
    assert_eq!(shown(view), (100, 60, 100, 1));
    let r = refused(q.try_admit(10, "gpt-4o", tokens(50), 0));
    assert_eq!(
        (r.scope, r.kind, r.retry_after_ms),
        (Scope::Group, LimitKind::Tokens, Some(990))
    );
    assert_eq!((r.limits.tpm, r.usage.tokens), (100, 60));
    assert_eq!(shown(r.view), (100, 60, 100, 1));
    // Nothing reached the account: outside the group it holds the first request only.
    let (g, view) = admitted(q.try_admit(20, "gpt-4o-mini", tokens(50), 0));
    assert_eq!(g, None);
    assert_eq!(shown(view), (10_000, 110, 100, 2));
    assert_eq!(q.account().peaks().tokens, 110);
    // Nor the group: once the first leaves, the whole TPM is free.
    let (_, view) = admitted(q.try_admit(1000, "gpt-4o", tokens(100), 0));
    assert_eq!(shown(view), (100, 100, 100, 2));
}

#[test]
fn a_request_in_no_group_meets_only_the_account_limits() {
    let mut q = Quotas::new(&MockConfig {
        rpm: 3,
        ..config(vec![ModelLimits {
            rpm: 1,
            ..group(&["gpt-4o"])
        }])
    });
    for t in 0..3 {
        let (g, view) = admitted(q.try_admit(t, "claude-sonnet-4-5", tokens(1), 0));
        assert_eq!((g, view.limits.rpm, view.usage.requests), (None, 3, t + 1));
    }
    let r = refused(q.try_admit(3, "claude-sonnet-4-5", tokens(1), 0));
    assert_eq!(
        (r.scope, r.kind, r.retry_after_ms),
        (Scope::Account, LimitKind::Requests, Some(997))
    );
    // An empty group does not lift the account's limit for its models.
    let r = refused(q.try_admit(4, "gpt-4o", tokens(1), 0));
    assert_eq!((r.scope, r.retry_after_ms), (Scope::Account, Some(996)));
    let (g, view) = admitted(q.try_admit(1000, "gpt-4o", tokens(1), 0));
    assert_eq!((g, view.limits.rpm, view.usage.requests), (Some(0), 1, 1));
    // The group is full while the account has room.
    let r = refused(q.try_admit(1001, "gpt-4o", tokens(1), 0));
    assert_eq!(
        (r.scope, r.kind, r.retry_after_ms),
        (Scope::Group, LimitKind::Requests, Some(999))
    );
    admitted(q.try_admit(1001, "claude-sonnet-4-5", tokens(1), 0));
}

#[test]
fn a_request_belongs_to_the_first_group_that_matches() {
    let groups = vec![
        ModelLimits {
            rpm: 1,
            ..group(&["gpt-4o-mini"])
        },
        ModelLimits {
            rpm: 2,
            ..group(&["gpt-4o", "gpt-4o-*"])
        },
        ModelLimits {
            rpm: 5,
            ..group(&["*"])
        },
    ];
    let mut q = Quotas::new(&config(groups.clone()));
    // gpt-4o-mini also matches `gpt-4o-*` and `*`: the first group takes it.
    assert_eq!(q.group_of("gpt-4o-mini"), Some(0));
    assert_eq!(q.group_of("gpt-4o"), Some(1));
    assert_eq!(q.group_of("gpt-4o-2024-08-06"), Some(1));
    assert_eq!(q.group_of("claude-sonnet-4-5"), Some(2));
    admitted(q.try_admit(0, "gpt-4o-mini", tokens(1), 0));
    let r = refused(q.try_admit(1, "gpt-4o-mini", tokens(1), 0));
    assert_eq!(
        (r.scope, r.limits.rpm, r.usage.requests),
        (Scope::Group, 1, 1)
    );
    // Its admission was charged to its group only: group 1 still takes two.
    for t in [2, 3] {
        let (g, view) = admitted(q.try_admit(t, "gpt-4o-2024-08-06", tokens(1), 0));
        assert_eq!(
            (g, view.limits.rpm, view.usage.requests),
            (Some(1), 2, t - 1)
        );
    }
    assert_eq!(
        refused(q.try_admit(4, "gpt-4o", tokens(1), 0)).scope,
        Scope::Group
    );
    // Without the catch-all, an unmatched model is in no group.
    let q = Quotas::new(&config(groups[..2].to_vec()));
    assert_eq!(q.group_of("claude-sonnet-4-5"), None);
}

#[test]
fn rpd_refuses_with_an_exact_retry_and_the_headers_stay_per_minute() {
    let mut q = Quotas::new(&MockConfig {
        rpm: 10,
        rpd: 2,
        day_window_ms: 10_000,
        ..config(Vec::new())
    });
    admitted(q.try_admit(0, "m", tokens(100), 0));
    admitted(q.try_admit(3000, "m", tokens(100), 0));
    let r = refused(q.try_admit(5000, "m", tokens(100), 0));
    assert_eq!(
        (r.scope, r.kind, r.retry_after_ms),
        (Scope::Day, LimitKind::Requests, Some(5000))
    );
    assert_eq!((r.limits.rpm, r.usage.requests), (2, 2));
    // No per-day headers: the view is the minute's, empty by now.
    assert_eq!((r.view.limits.rpm, r.view.usage.requests), (10, 0));
    // One millisecond early is still refused; on time is admitted.
    let r = refused(q.try_admit(9999, "m", tokens(100), 0));
    assert_eq!(r.retry_after_ms, Some(1));
    let (_, view) = admitted(q.try_admit(10_000, "m", tokens(100), 0));
    assert_eq!(view.usage.requests, 1);
}

#[test]
fn tpd_refuses_with_an_exact_retry_or_none_when_too_large() {
    let mut q = Quotas::new(&MockConfig {
        tpd: 1000,
        day_window_ms: 10_000,
        ..config(Vec::new())
    });
    admitted(q.try_admit(0, "m", tokens(600), 0));
    let r = refused(q.try_admit(100, "m", tokens(500), 0));
    assert_eq!(
        (r.scope, r.kind, r.retry_after_ms),
        (Scope::Day, LimitKind::Tokens, Some(9900))
    );
    assert_eq!((r.limits.tpm, r.usage.tokens), (1000, 600));
    let r = refused(q.try_admit(100, "m", tokens(1001), 0));
    assert_eq!((r.scope, r.retry_after_ms), (Scope::Day, None));
    admitted(q.try_admit(100, "m", tokens(400), 0));
}

#[test]
fn the_output_correction_reaches_the_group_and_the_account() {
    let mut q = Quotas::new(&MockConfig {
        otpm: 1000,
        ..config(vec![ModelLimits {
            otpm: 100,
            ..group(&["claude-*"])
        }])
    });
    // max_tokens 80; the answer will be 10 tokens long.
    let (g, view) = admitted(q.try_admit(0, "claude-x", output(80), 0));
    assert_eq!(
        (g, view.limits.otpm, view.usage.output_tokens),
        (Some(0), 100, 80)
    );
    let r = refused(q.try_admit(10, "claude-x", output(30), 0));
    assert_eq!(
        (r.scope, r.kind, r.retry_after_ms),
        (Scope::Group, LimitKind::OutputTokens, Some(990))
    );
    q.correct_output(0, g, 70);
    let (_, view) = admitted(q.try_admit(20, "claude-x", output(30), 0));
    assert_eq!(view.usage.output_tokens, 40);
    // The account was corrected too: it holds 10 + 30, plus 5 now.
    let (_, view) = admitted(q.try_admit(30, "gpt-4o", output(5), 0));
    assert_eq!((view.limits.otpm, view.usage.output_tokens), (1000, 45));
}

#[test]
fn the_headers_take_the_groups_figures_only_where_it_limits() {
    let limits = Limits {
        rpm: 100,
        tpm: 1000,
        itpm: 0,
        otpm: 0,
        concurrency: 0,
        window_ms: WINDOW,
    };
    let account = View {
        limits,
        usage: WindowUsage {
            requests: 5,
            tokens: 50,
            reset_ms: 900,
            tokens_reset_ms: 900,
            ..WindowUsage::default()
        },
    };
    let group = View {
        limits: Limits {
            rpm: 10,
            tpm: 0,
            ..limits
        },
        usage: WindowUsage {
            requests: 2,
            tokens: 20,
            reset_ms: 400,
            tokens_reset_ms: 400,
            ..WindowUsage::default()
        },
    };
    assert_eq!(View::merge(account, None), account);
    let merged = View::merge(account, Some(group));
    let headers = rate_limit_headers(merged.limits, merged.usage);
    let get = |name: &str| headers[name].to_str().unwrap().to_owned();
    assert_eq!(get("x-ratelimit-limit-requests"), "10");
    assert_eq!(get("x-ratelimit-remaining-requests"), "8");
    assert_eq!(get("x-ratelimit-reset-requests"), "400ms");
    assert_eq!(get("x-ratelimit-limit-tokens"), "1000");
    assert_eq!(get("x-ratelimit-remaining-tokens"), "950");
    assert_eq!(get("x-ratelimit-reset-tokens"), "900ms");
}

/// One admission of the naive model.
#[derive(Clone, Copy, Debug)]
struct Naive {
    at: u64,
    in_group: bool,
    cost: Cost,
    real_output: u64,
    ends: u64,
    corrected: bool,
}

/// `[rpm, tpm, itpm, otpm]` of the account, the group and the day (`[rpd, tpd, 0, 0]`).
const ACCOUNT: [u64; 4] = [30, 2400, 1400, 900];
const GROUP: [u64; 4] = [10, 700, 0, 300];
const DAY: [u64; 4] = [80, 6000, 0, 0];
const CONCURRENCY: u64 = 8;
const DAY_MS: u64 = 4000;

fn trace_config() -> MockConfig {
    let [rpm, tpm, itpm, otpm] = ACCOUNT;
    let [group_rpm, group_tpm, group_itpm, group_otpm] = GROUP;
    MockConfig {
        rpm,
        tpm,
        itpm,
        otpm,
        concurrency: CONCURRENCY,
        rpd: DAY[0],
        tpd: DAY[1],
        day_window_ms: DAY_MS,
        ..config(vec![ModelLimits {
            rpm: group_rpm,
            tpm: group_tpm,
            itpm: group_itpm,
            otpm: group_otpm,
            ..group(&["g-*"])
        }])
    }
}

/// One quota of the naive model.
#[derive(Clone, Copy, Debug)]
struct NaiveQuota {
    scope: Scope,
    limits: [u64; 4],
    window: u64,
}

/// The quotas a request meets, in the order refusals are reported.
fn met(in_group: bool) -> Vec<NaiveQuota> {
    let quota = |scope, limits, window| NaiveQuota {
        scope,
        limits,
        window,
    };
    let mut quotas = vec![quota(Scope::Account, ACCOUNT, WINDOW)];
    if in_group {
        quotas.push(quota(Scope::Group, GROUP, WINDOW));
    }
    quotas.push(quota(Scope::Day, DAY, DAY_MS));
    quotas
}

/// What a request costing `cost` charges `scope`, `[requests, tokens, input,
/// output]`, with `output` as the output charge (the day charges none).
fn charge(scope: Scope, cost: Cost, output: u64) -> [u64; 4] {
    let output = if scope == Scope::Day { 0 } else { output };
    [1, cost.tokens, cost.input, output]
}

/// What quota `q` holds at `at`, with the corrections of the answers ended by `known`.
fn sums(admitted: &[Naive], q: NaiveQuota, at: u64, known: u64) -> [u64; 4] {
    let mut sums = [0; 4];
    let held = (admitted.iter())
        .filter(|a| at - a.at < q.window && (q.scope != Scope::Group || a.in_group));
    for a in held {
        let output = if a.ends <= known {
            a.real_output
        } else {
            a.cost.output
        };
        for (sum, add) in sums.iter_mut().zip(charge(q.scope, a.cost, output)) {
            *sum += add;
        }
    }
    sums
}

fn fits_all(admitted: &[Naive], in_group: bool, at: u64, known: u64, cost: Cost) -> bool {
    met(in_group).into_iter().all(|q| {
        let (held, adds) = (
            sums(admitted, q, at, known),
            charge(q.scope, cost, cost.output),
        );
        (0..4).all(|i| q.limits[i] == 0 || held[i] + adds[i] <= q.limits[i])
    })
}

fn dimension(kind: LimitKind) -> usize {
    match kind {
        LimitKind::Requests => 0,
        LimitKind::Tokens => 1,
        LimitKind::InputTokens => 2,
        LimitKind::OutputTokens => 3,
        LimitKind::Concurrency => unreachable!("concurrency is not a window"),
    }
}

fn figures(usage: WindowUsage) -> [u64; 4] {
    [
        usage.requests,
        usage.tokens,
        usage.input_tokens,
        usage.output_tokens,
    ]
}

/// The headers' view after an admission: the account's sums and limits, the
/// group's where the group limits.
fn check_view(admitted: &[Naive], now: u64, in_group: bool, view: View) {
    let quotas = met(in_group);
    let (mut usage, mut limits) = (sums(admitted, quotas[0], now, now), ACCOUNT);
    if in_group {
        let group = sums(admitted, quotas[1], now, now);
        for i in (0..4).filter(|&i| GROUP[i] > 0) {
            (usage[i], limits[i]) = (group[i], GROUP[i]);
        }
    }
    assert_eq!(figures(view.usage), usage, "now={now}");
    let l = view.limits;
    assert_eq!([l.rpm, l.tpm, l.itpm, l.otpm], limits, "now={now}");
}

/// A refusal is right: concurrency exactly when full; the quota and limit named
/// are over; no retry exactly when the request alone is over that limit; otherwise
/// the retry is the first millisecond at which every quota has room, corrections
/// frozen as of now.
fn check_refusal(admitted: &[Naive], now: u64, in_group: bool, cost: Cost, r: &Refused) {
    let in_flight = admitted.iter().filter(|a| a.ends > now).count() as u64;
    let full = in_flight >= CONCURRENCY;
    assert_eq!(r.kind == LimitKind::Concurrency, full, "now={now} {r:?}");
    if full {
        assert_eq!((r.scope, r.retry_after_ms), (Scope::Account, None));
        return;
    }
    let q = (met(in_group).into_iter())
        .find(|q| q.scope == r.scope)
        .expect("the refusing quota is one the request meets");
    let held = sums(admitted, q, now, now);
    assert_eq!(figures(r.usage), held, "now={now} {r:?}");
    let i = dimension(r.kind);
    let (limit, amount) = (q.limits[i], charge(q.scope, cost, cost.output)[i]);
    assert!(limit > 0 && held[i] + amount > limit, "now={now} {r:?}");
    let Some(wait) = r.retry_after_ms else {
        assert!(amount > limit, "now={now} {r:?}");
        return;
    };
    assert!(
        fits_all(admitted, in_group, now + wait, now, cost),
        "now={now} {r:?}"
    );
    assert!(
        !fits_all(admitted, in_group, now + wait - 1, now, cost),
        "now={now} {r:?}"
    );
}

/// Brute-force replay over an account, a model group and a day window: every
/// decision, the headers' view, every refusal's quota, limit and retry, and the
/// account's peaks equal a naive window sum, output corrections included.
#[test]
fn matches_a_naive_model_with_a_group_and_a_day_window() {
    use rand::{Rng, SeedableRng};
    let seed = 11;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut q = Quotas::new(&trace_config());
    let mut admitted: Vec<Naive> = Vec::new();
    let (mut peaks, mut refusals) = ([0u64; 4], [0u64; 3]);
    let mut now = 0;
    for _ in 0..5000 {
        now += rng.random_range(0..40);
        // Answers that ended by now give back what their estimate overcharged.
        for a in (admitted.iter_mut()).filter(|a| !a.corrected && a.ends <= now) {
            let excess = a.cost.output - a.real_output;
            q.correct_output(a.at, a.in_group.then_some(0), excess);
            a.corrected = true;
        }
        let (prompt, real) = (rng.random_range(1..80), rng.random_range(0..60));
        let estimate = if rng.random_bool(0.5) {
            real + rng.random_range(0..420)
        } else {
            real
        };
        let cost = Cost {
            tokens: prompt + real,
            input: prompt,
            output: estimate,
        };
        let model = ["g-a", "g-b", "other", "g"][rng.random_range(0..4)];
        let in_group = model.starts_with("g-");
        let in_flight = admitted.iter().filter(|a| a.ends > now).count() as u64;
        let expect = in_flight < CONCURRENCY && fits_all(&admitted, in_group, now, now, cost);
        match q.try_admit(now, model, cost, in_flight) {
            Verdict::Admitted { group, view } => {
                assert!(expect, "seed={seed} now={now}: admitted");
                assert_eq!(group, in_group.then_some(0), "now={now}");
                admitted.push(Naive {
                    at: now,
                    in_group,
                    cost,
                    real_output: real,
                    // At least 1 ms: an answer ends after its admission.
                    ends: now + rng.random_range(1..150),
                    corrected: false,
                });
                check_view(&admitted, now, in_group, view);
                let account = sums(&admitted, met(false)[0], now, now);
                for (peak, sum) in peaks.iter_mut().zip(account) {
                    *peak = (*peak).max(sum);
                }
            }
            Verdict::Refused(r) => {
                assert!(!expect, "seed={seed} now={now}: refused by {r:?}");
                check_refusal(&admitted, now, in_group, cost, &r);
                refusals[r.scope as usize] += 1;
            }
        }
    }
    let p = q.account().peaks();
    assert_eq!(
        [p.requests, p.tokens, p.input_tokens, p.output_tokens],
        peaks
    );
    assert!(
        admitted.len() > 500,
        "the trace barely admits: {}",
        admitted.len()
    );
    // Each quota refused some: the trace exercises all three.
    assert!(refusals.iter().all(|&n| n > 0), "{refusals:?}");
}
