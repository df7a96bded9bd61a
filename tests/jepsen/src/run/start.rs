//! Starting a run's processes in their hosts: Redis (the Redis modes), the
//! mock upstream, and the nodes with their configs.

use super::*;

/// Redis on `host`, every write fsynced: kill -9 and restart keep the
/// windows, as a production Redis with persistence would.
pub(super) fn redis(spec: &RunSpec, host: &Host) -> anyhow::Result<Proc> {
    let args = [
        "--bind",
        &host.ip,
        "--port",
        &REDIS_PORT.to_string(),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        &spec.dir.display().to_string(),
        "--protected-mode",
        "no",
    ]
    .map(String::from)
    .to_vec();
    Proc::start(
        "redis",
        host,
        Path::new("redis-server"),
        args,
        spec.dir.join("redis.log"),
    )
}

/// The mock upstream on `host`, limited to the run's L (and tokens per window
/// with task workers), logging every request to `mock_log`.
pub(super) fn mock(spec: &RunSpec, host: &Host, mock_log: &Path) -> anyhow::Result<Proc> {
    let window_ms = spec.window.as_millis() as u64;
    let (tpm, completion) = match &spec.tasks {
        Some(t) => (t.tpm, t.completion),
        None => (0, (3, 8)),
    };
    let day = spec.day().unwrap_or(crate::checker::Day {
        limit: 0,
        window_ms: window_ms * u64::from(DAY_WINDOWS),
    });
    let mut args = [
        "mock",
        "--rpd",
        &day.limit.to_string(),
        "--day-window-ms",
        &day.window_ms.to_string(),
        "--listen",
        &format!("{}:{MOCK_PORT}", host.ip),
        "--rpm",
        &spec.limit.to_string(),
        "--tpm",
        &tpm.to_string(),
        "--completion-min",
        &completion.0.to_string(),
        "--completion-max",
        &completion.1.to_string(),
        "--window-ms",
        &window_ms.to_string(),
        // Streams last 60-160 ms: a kill lands mid-stream now and then. With a
        // concurrency limit, 0.3-0.8 s: slots are held long enough to matter.
        "--inter-token-ms",
        match (&spec.tasks, spec.concurrency) {
            // Tasks: 200-600 tokens in 0.2-0.6 s, so 12 workers can ask for
            // more than the token budget (the limiter, not latency, binds).
            (Some(_), _) => "1",
            (None, Some(_)) => "100",
            (None, None) => "20",
        },
        "--log",
        &mock_log.display().to_string(),
    ]
    .map(String::from)
    .to_vec();
    if spec.sends_agents() {
        // The Anthropic account: a group of the mock's, counted apart; and the
        // OpenAI account's own model group.
        args.extend([
            "--model-limit".into(),
            format!(
                "claude-*:itpm={},otpm={}",
                workload::ANTHROPIC_ITPM,
                workload::ANTHROPIC_OTPM
            ),
            "--model-limit".into(),
            format!("vision-*:tpm={}", workload::VISION_TPM),
        ]);
    }
    Proc::start("mock", host, &spec.bin, args, spec.dir.join("mock.log"))
}

/// Every node in its host, each with its config written beside the run's
/// files (and its lease audit, in the leased modes).
pub(super) fn nodes(
    spec: &RunSpec,
    hosts: &[Host],
    ips: &[String],
    mock_ip: &str,
    redis_ip: Option<&str>,
) -> anyhow::Result<Vec<Proc>> {
    let mut nodes = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let config = spec.dir.join(format!("n{i}.toml"));
        std::fs::write(&config, node_toml(spec, i, ips, mock_ip, redis_ip))?;
        let mut args = vec![
            "node".into(),
            "--config".into(),
            config.display().to_string(),
        ];
        if let Some(fault) = &spec.fault {
            args.extend(["--fault".into(), fault.clone()]);
        }
        if spec.mode == "lease" || spec.mode == "redis-lease" {
            let audit = spec.dir.join(format!("n{i}.lease.jsonl"));
            args.extend(["--lease-audit".into(), audit.display().to_string()]);
        }
        nodes.push(Proc::start(
            &format!("n{i}"),
            host,
            &spec.bin,
            args,
            spec.dir.join(format!("n{i}.log")),
        )?);
    }
    Ok(nodes)
}
