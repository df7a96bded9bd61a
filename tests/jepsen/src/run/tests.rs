use super::*;

/// A saved spec without `buckets` (`--replay` of an old run).
const OLD_SPEC: &str = r#"{"mode":"lease","nemesis":["none"],"nodes":3,
    "duration":{"secs":20,"nanos":0},"seed":7,"limit":40,
    "window":{"secs":5,"nanos":0},"tenants":1,"cut_off":null,"max_borrow":null,
    "fault":null,"subnet":100,"bin":"/x","dir":"/y"}"#;

#[test]
fn a_node_runs_the_specs_buckets_and_old_specs_the_harnesss() {
    let mut spec: RunSpec = serde_json::from_str(OLD_SPEC).expect("old spec");
    assert_eq!(spec.buckets, STRESS_BUCKETS);
    let ips = ["10.0.0.1".to_owned(), "10.0.0.2".to_owned()];
    let buckets_of = |spec: &RunSpec| {
        let text = node_toml(spec, 0, &ips, "10.0.0.9", None);
        let config = tollgate::config::Config::from_toml(&text, "n0.toml").expect("config");
        config.limits.buckets
    };
    assert_eq!(buckets_of(&spec), STRESS_BUCKETS);
    spec.buckets = 50;
    assert_eq!(buckets_of(&spec), 50);
}

#[test]
fn a_daily_run_gives_the_upstream_a_days_quota_and_agents_an_anthropic_account() {
    let mut spec: RunSpec = serde_json::from_str(OLD_SPEC).expect("old spec");
    assert!(!spec.daily, "old specs have none");
    spec.daily = true;
    let ips = ["10.0.0.1".to_owned(), "10.0.0.2".to_owned()];
    let text = node_toml(&spec, 0, &ips, "10.0.0.9", None);
    let config = tollgate::config::Config::from_toml(&text, "n0.toml").expect("config");
    assert_eq!(config.limits.day_window, Duration::from_secs(20));
    assert_eq!(
        config.limits.day_window / config.limits.day_buckets,
        Duration::from_millis(500)
    );
    assert_eq!(config.tenants[0].quota.rpd, Some(80), "one tenant holds L");
    assert_eq!(config.upstreams[0].quota.rpd, None);
    assert_eq!(config.upstreams.len(), 1, "no agents, no Anthropic account");
    spec.agents = true;
    let text = node_toml(&spec, 0, &ips, "10.0.0.9", None);
    let config = tollgate::config::Config::from_toml(&text, "n0.toml").expect("config");
    let anthropic = &config.upstreams[1];
    assert_eq!(anthropic.quota.itpm, Some(workload::ANTHROPIC_ITPM));
    assert_eq!(anthropic.quota.otpm, Some(workload::ANTHROPIC_OTPM));
    assert_eq!(config.routes[0].models, ["claude-*"], "routed before `*`");
    let vision = &config.upstreams[0].model_limits[0];
    assert_eq!(vision.models, ["vision-*"]);
    assert_eq!(vision.quota.tpm, Some(workload::VISION_TPM));
}

#[test]
fn settlements_are_read_from_the_metrics_text() {
    let text = r#"# HELP tollgate_decisions Limiter decisions by scope, outcome and reason.
# TYPE tollgate_decisions counter
tollgate_decisions_total{scope="tenant",outcome="admitted",reason=""} 12
tollgate_decisions_total{scope="upstream",outcome="admitted",reason=""} 11
tollgate_decisions_total{scope="tenant",outcome="refused",reason="requests"} 40
tollgate_settlements_total{scope="tenant",how="usage"} 10
tollgate_settlements_total{scope="tenant",how="cancel"} 2
tollgate_settlements_total{scope="upstream",how="usage"} 11
tollgate_in_flight_requests 0
"#;
    assert_eq!(
        parse_settlements(text),
        checker::Settlements {
            admitted: 23,
            settled: 23,
            in_flight: 0
        }
    );
}
