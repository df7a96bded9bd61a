//! The configs a run writes for its nodes: each node's TOML, and the tenants'
//! limits in it.

use super::*;

pub(super) fn node_toml(
    spec: &RunSpec,
    i: usize,
    ips: &[String],
    mock_ip: &str,
    redis_ip: Option<&str>,
) -> String {
    let (mode, share) = match spec.mode.as_str() {
        // `direct`: the clients bypass the nodes, which are left idle.
        "local-full" | "direct" => ("local", "full"),
        "local-split" => ("local", "split"),
        other => (other, "full"),
    };
    let seeds: Vec<String> = (ips.iter().enumerate())
        .filter(|(j, _)| *j != i)
        .map(|(_, ip)| format!("\"{ip}:{GOSSIP_PORT}\""))
        .collect();
    let ip = &ips[i];
    let window = spec.window.as_millis();
    format!(
        r#"[server]
listen = "{ip}:{PROXY_PORT}"
admin_token = "jepsen-admin"

[limits]
window = "{window}ms"
buckets = {buckets}{day_window}

[cluster]
cluster_id = "jepsen"
node_id = "n{i}"
gossip_listen = "{ip}:{GOSSIP_PORT}"
rpc_listen = "{ip}:{RPC_PORT}"
secret = "jepsen-cluster-secret-0123"
seeds = [{seeds}]
mode = "{mode}"
local_share = "{share}"{sync_interval}

[[upstreams]]
id = "mock"
kind = "openai"
base_url = "http://{mock_ip}:{MOCK_PORT}/v1"{upstream_limit}
{anthropic}
[[routes]]
models = ["*"]
upstreams = ["mock"]
{tenants}{lease}{redis}{estimation}"#,
        seeds = seeds.join(", "),
        sync_interval = (spec.tuning.sync_interval)
            .map_or(String::new(), |i| format!("\nsync_interval = \"{}ms\"", i.as_millis())),
        buckets = spec.buckets,
        // The day's buckets as wide as the window's.
        day_window = spec.day().map_or(String::new(), |day| format!(
            "\nday_window = \"{}ms\"\nday_buckets = {}",
            day.window_ms,
            spec.buckets * DAY_WINDOWS
        )),
        upstream_limit = match (&spec.tasks, spec.tenants) {
            (Some(t), _) => format!("\nrpm = {}\ntpm = {}", spec.limit, t.tpm),
            (None, 0 | 1) => String::new(),
            (None, _) => format!("\nrpm = {}", spec.limit),
        } + &day_quota(spec, spec.tenants > 1) + &vision_toml(spec),
        tenants = (0..spec.tenants)
            .map(|k| format!(
                "\n[[tenants]]\nid = \"t{k}\"\napi_key_hashes = [\"sha256:{}\"]\nrpm = {}{}\nmax_wait = \"{}\"\n{}",
                tollgate::config::hash_api_key(&workload::tenant_key(k)),
                tenant_limit(spec),
                day_quota(spec, spec.tenants <= 1),
                // Task workers wait in the queue rather than retry (backpressure).
                // So do clients under a concurrency limit: in `gossip` a node with no
                // slot gets a freed one once its waiting shows in the demand its
                // peers see (2 x gossip + sync, then a round and the actor's 250 ms
                // re-check: ~0.85 s), and a 500 ms wait expires first about half the
                // time (a survivor may be refused three times in a row: 5.9 s).
                match spec.tuning.max_wait {
                    Some(wait) => format!("{}ms", wait.as_millis()),
                    None if spec.tasks.is_some() || spec.concurrency.is_some() => "2s".into(),
                    None => "500ms".into(),
                },
                spec.concurrency.map_or(String::new(), |c| format!("concurrency = {c}\n")),
            ))
            .collect::<String>(),
        anthropic = anthropic_toml(spec, mock_ip),
        lease = lease_toml(spec),
        redis = redis_ip.map_or(String::new(), |ip| format!(
            "\n[redis]\nurl = \"redis://{ip}:{REDIS_PORT}/\"\ntimeout = \"50ms\"\nslot_ttl = \"{}ms\"\n",
            REDIS_SLOT_TTL.as_millis()
        )),
        estimation = spec.tasks.as_ref().map_or(String::new(), |t| format!(
            "\n[estimation]\ncompletion = \"{}\"\n",
            t.estimate
        )),
    )
}

/// Each tenant's requests per window: L alone; 2L/T each when several share an
/// upstream limited to L (demand from the tenants together exceeds it).
pub fn tenant_limit(spec: &RunSpec) -> u64 {
    match spec.tenants {
        0 | 1 => spec.limit,
        t => (2 * spec.limit / t as u64).max(1),
    }
}

/// The daily quota's line (`rpd`) where `here` holds it, in a daily run.
fn day_quota(spec: &RunSpec, here: bool) -> String {
    match spec.day() {
        Some(day) if here => format!("\nrpd = {}", day.limit),
        _ => String::new(),
    }
}

/// With agents' traffic: the OpenAI account's `vision-*` model group, limited
/// apart within the account (the mock's own group alike).
fn vision_toml(spec: &RunSpec) -> String {
    if !spec.sends_agents() {
        return String::new();
    }
    format!(
        "\n\n[[upstreams.model_limits]]\nmodels = [\"vision-*\"]\ntpm = {}",
        workload::VISION_TPM
    )
}

/// With agents' traffic: the mock's Anthropic account (its `claude-*` group,
/// limited to input and output tokens per window), routed first.
fn anthropic_toml(spec: &RunSpec, mock_ip: &str) -> String {
    if !spec.sends_agents() {
        return String::new();
    }
    format!(
        "\n[[upstreams]]\nid = \"anthropic\"\nkind = \"anthropic\"\nbase_url = \"http://{mock_ip}:{MOCK_PORT}/v1\"\nitpm = {}\notpm = {}\n\n[[routes]]\nmodels = [\"claude-*\"]\nupstreams = [\"anthropic\"]\n",
        workload::ANTHROPIC_ITPM,
        workload::ANTHROPIC_OTPM
    )
}

pub(super) fn lease_toml(spec: &RunSpec) -> String {
    let mut out = String::new();
    if let Some(policy) = &spec.cut_off {
        out.push_str(&format!("cut_off = \"{policy}\"\n"));
    }
    if let Some(borrow) = spec.max_borrow {
        out.push_str(&format!("max_borrow = {borrow}\n"));
    }
    if spec.spillover {
        out.push_str("spillover = true\n");
    }
    if out.is_empty() {
        return out;
    }
    format!("\n[cluster.lease]\n{out}")
}
