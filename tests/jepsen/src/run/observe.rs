//! What a run observes besides the clients' history: the clients themselves,
//! every node's view of the members while it runs, its permits and lease audit
//! after, the mock upstream's log, and the faults as intervals.

use super::*;

/// The clients: the seed scenario's task workers (which also return their
/// tasks), or the request clients.
pub(super) fn load(
    spec: &RunSpec,
    ips: Vec<String>,
    mock_ip: &str,
    started: Instant,
    end: Instant,
) -> impl std::future::Future<Output = (Vec<Op>, Option<Vec<tasks::Task>>)> + use<> {
    let mock_url = format!("http://{mock_ip}:{MOCK_PORT}");
    let tasks = spec.tasks.clone();
    let shape = Shape {
        pattern: spec.pattern,
        tenants: spec.tenants.max(1),
        capacity_per_s: spec.limit as f64 / spec.window.as_secs_f64(),
        stream_share: 0.3,
        batch_share: 0.3,
        agent_share: if spec.sends_agents() { 0.5 } else { 0.0 },
        seed: spec.seed,
        loops: spec.loops,
    };
    async move {
        match tasks {
            Some(t) => {
                let (ops, done) = tasks::run(t, ips, mock_url, started, end).await;
                (ops, Some(done))
            }
            None => (workload::run(ips, shape, started, end).await, None),
        }
    }
}

/// Each node's permits once the workload is over, from its `/metrics` (`None`: it
/// does not answer). Settlement runs off the request path: waits up to 10 s for
/// each node's figures to agree before taking them as they are.
pub(super) async fn settlements(ips: &[String], dir: &Path) -> Vec<Option<checker::Settlements>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap_or_default();
    let mut out = Vec::new();
    for (node, ip) in ips.iter().enumerate() {
        let url = format!("http://{ip}:{PROXY_PORT}/metrics");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut figures = None;
        loop {
            if let Ok(r) = client.get(&url).send().await
                && let Ok(text) = r.text().await
            {
                figures = Some(parse_settlements(&text));
                // Kept with the run (the benchmark reads sync bytes from it).
                let _ = std::fs::write(dir.join(format!("n{node}.metrics.txt")), &text);
            }
            let done = figures
                .is_none_or(|f: checker::Settlements| f.admitted == f.settled && f.in_flight == 0);
            if done || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        out.push(figures);
    }
    out
}

/// Every node's lease audit (`lease` and `redis-lease`): the grants of all, and each node's
/// spends. A line cut short by a kill -9 is skipped.
pub(super) fn read_lease_audit(spec: &RunSpec) -> checker::LeaseAudit {
    let mut audit = checker::LeaseAudit::default();
    for node in 0..spec.nodes {
        let path = spec.dir.join(format!("n{node}.lease.jsonl"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<checker::LeaseEvent>(line) else {
                continue;
            };
            match event.ev.as_str() {
                "grant" => audit.grants.push(event),
                "spend" => audit.spends.push((node, event)),
                // `redis-lease` statements: for the analysis, not judged.
                _ => {}
            }
        }
    }
    audit
}

/// The figures of [`checker::Settlements`] in a Prometheus text exposition.
pub(super) fn parse_settlements(text: &str) -> checker::Settlements {
    let mut f = checker::Settlements {
        admitted: 0,
        settled: 0,
        in_flight: 0,
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let value = value as u64;
        if name.starts_with("tollgate_decisions_total{") && name.contains(r#"outcome="admitted""#) {
            f.admitted += value;
        } else if name.starts_with("tollgate_settlements_total{") {
            f.settled += value;
        } else if name == "tollgate_in_flight_requests" {
            f.in_flight = value;
        }
    }
    f
}

/// Every node's `/admin/cluster` every 250 ms until `end`: how many members it
/// sees live (for the convergence check), `None` when it does not answer.
pub(super) async fn monitor(
    ips: Vec<String>,
    mock_ip: String,
    started: Instant,
    end: Instant,
) -> (Vec<Sample>, Vec<UpstreamSample>) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap_or_default();
    let mut samples = Vec::new();
    let mut upstream = Vec::new();
    while Instant::now() < end {
        // The ground truth for slots: what the mock is serving right now.
        let url = format!("http://{mock_ip}:{MOCK_PORT}/stats");
        let in_flight = match client.get(&url).send().await {
            Ok(r) => (r.bytes().await.ok())
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|b| b["in_flight"].as_u64()),
            Err(_) => None,
        };
        upstream.push(UpstreamSample {
            at_ms: started.elapsed().as_millis() as u64,
            in_flight,
        });
        for (node, ip) in ips.iter().enumerate() {
            let url = format!("http://{ip}:{PROXY_PORT}/admin/cluster");
            let members = match client.get(&url).bearer_auth("jepsen-admin").send().await {
                Ok(r) if r.status().is_success() => (r.bytes().await.ok())
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|b| {
                        let members = b["cluster"]["members"].as_array()?.iter();
                        // `node/generation@address`: the node name.
                        (members.map(|m| {
                            m["id"]
                                .as_str()
                                .map(|id| id.split('/').next().unwrap_or(id).to_owned())
                        }))
                        .collect::<Option<Vec<String>>>()
                    }),
                _ => None,
            };
            samples.push(Sample {
                at_ms: started.elapsed().as_millis() as u64,
                node,
                members,
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (samples, upstream)
}

/// How soon a killed node's slots must be usable again (the README's modes
/// table), plus what the harness adds: survivors' clients may be waiting out a
/// retry-after (<= 2 s) and sampling is every 250 ms.
pub(super) fn slots_back_within(spec: &RunSpec) -> anyhow::Result<u64> {
    let config = tollgate::config::Config::load(&spec.dir.join("n0.toml"))?;
    let cluster = config.cluster.context("node configs have a [cluster]")?;
    let promise = match spec.mode.as_str() {
        // Declared dead: its in-flight count is dropped at once; the freed slots
        // are then shared by the survivors' demand, each reading its own as its
        // peers have it (2 x gossip interval + sync interval late,
        // docs/design/cluster.md, "Demand"). Both terms count: a CI run can take
        // 4,324 ms, of which detection itself is 0.5 s.
        "gossip" | "local-split" | "local-full" => {
            failure_detection_ms(&spec.dir.join("n0.toml"))?
                + (cluster.gossip_interval * 2 + cluster.sync_interval).as_millis() as u64
        }
        // Its credit (and the slots it held) lapse with the lease ttl.
        "lease" | "redis-lease" => cluster.lease.ttl.as_millis() as u64,
        // Its semaphore entries expire with the slot ttl.
        _ => REDIS_SLOT_TTL.as_millis() as u64,
    };
    Ok(promise + 2_500)
}

/// A node's failure-detection time, from the config the harness wrote for it.
pub(super) fn failure_detection_ms(config: &Path) -> anyhow::Result<u64> {
    let config = tollgate::config::Config::load(config)?;
    let cluster = config.cluster.context("node configs have a [cluster]")?;
    Ok((cluster.gossip_interval)
        .mul_f64(2.0 * cluster.phi_threshold + 2.0)
        .as_millis() as u64)
}

pub(super) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The faults as intervals: each start paired with its nemesis's end (or the run's
/// end), with the groups that must keep serving through it.
pub(super) fn intervals(events: &[Event], nodes: usize, run_ms: u64) -> Vec<Interval> {
    let everyone: Vec<usize> = (0..nodes).collect();
    let others = |n: usize| everyone.iter().copied().filter(|m| *m != n).collect();
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let sides = match &e.step.action {
            Action::Cut(_) => nemesis::sides(&e.step.action, nodes).unwrap_or_default(),
            // The island may rightly serve nothing: in `redis` a node that can
            // neither reach Redis nor hear its peers confirm they charge its loss
            // fails closed. The rest must keep serving.
            Action::Island(n) => vec![others(*n)],
            Action::Kill(n) | Action::Stop(n) => vec![others(*n)],
            Action::Skew(_) | Action::WallStep => vec![everyone.clone()],
            Action::Lossy(_) | Action::KillRedis | Action::Slow => vec![everyone.clone()],
            _ => continue,
        };
        let to_ms = (events[i + 1..].iter())
            .find(|later| later.step.nemesis == e.step.nemesis)
            .map_or(run_ms, |later| later.at_ms);
        let healed = matches!(e.step.action, Action::Cut(_) | Action::Island(_)) && to_ms < run_ms;
        let down = match e.step.action {
            Action::Kill(n) | Action::Stop(n) => Some(n),
            _ => None,
        };
        let slack_ms = match e.step.action {
            Action::Skew(_) => nemesis::SKEW_SECONDS.unsigned_abs() * 1_000,
            _ => 0,
        };
        out.push(Interval {
            from_ms: e.at_ms,
            to_ms,
            label: e.what.clone(),
            sides,
            healed,
            down,
            slack_ms,
        });
    }
    out
}

pub(super) fn read_mock_log(path: &Path) -> anyhow::Result<Vec<MockLine>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad mock log line {l:?}")))
        .collect()
}

pub(super) async fn wait_ready(ips: &[String], deadline: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let end = Instant::now() + deadline;
    for ip in ips {
        loop {
            let url = format!("http://{ip}:{PROXY_PORT}/admin/cluster");
            let ok = match client.get(&url).bearer_auth("jepsen-admin").send().await {
                Ok(r) if r.status().is_success() => {
                    let body: serde_json::Value =
                        serde_json::from_slice(&r.bytes().await.unwrap_or_default())
                            .unwrap_or_default();
                    body["cluster"]["members"].as_array().map_or(0, Vec::len) == ips.len()
                }
                _ => false,
            };
            if ok {
                break;
            }
            if Instant::now() > end {
                bail!("node {ip} never became ready with {} members", ips.len());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
