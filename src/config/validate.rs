//! Cross-field rules a single field's type cannot express. Each violation names the
//! field by its dotted path so [`super::ConfigError`] can point at it.

use super::Algorithm;
use super::bounds::{self, EncodingName};
use super::{Config, Quota, UpstreamKind, normalize_key_hash};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Dotted path, e.g. `routes[1].upstreams`.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn fail<T>(field: impl Into<String>, reason: impl Into<String>) -> Result<T, Violation> {
    Err(Violation {
        field: field.into(),
        reason: reason.into(),
    })
}

/// Checks every rule; returns the first violation.
pub fn validate(config: &Config) -> Result<(), Violation> {
    validate_server(config)?;
    validate_limits(config)?;
    validate_estimation(config)?;
    validate_tenants(config)?;
    validate_upstreams(config)?;
    validate_routes(config)?;
    if let Some(mock) = &config.builtin_mock {
        validate_quota("builtin_mock", &mock.quota(), config.limits.algorithm)?;
        for (name, value) in [("rpd", mock.rpd), ("tpd", mock.tpd)] {
            if value == Some(0) {
                return fail(
                    format!("builtin_mock.{name}"),
                    "must be at least 1 (omit it for no limit)",
                );
            }
        }
        validate_model_limits("builtin_mock", None, &mock.model_limits, config)?;
        // The mock's groups limit rpm, tpm, itpm and otpm exactly per minute.
        for (i, group) in mock.model_limits.iter().enumerate() {
            let q = &group.quota;
            let foreign = [
                ("concurrency", q.concurrency.is_some()),
                ("algorithm", q.algorithm.is_some()),
                ("burst", q.burst.is_some()),
                ("burst_tokens", q.burst_tokens.is_some()),
                ("input_counts_cache_reads", q.input_counts_cache_reads),
                ("rpd", q.rpd.is_some()),
                ("tpd", q.tpd.is_some()),
            ];
            if let Some((name, _)) = foreign.iter().find(|(_, set)| *set) {
                let why = "the mock's model groups take rpm, tpm, itpm and otpm only";
                return fail(format!("builtin_mock.model_limits[{i}].{name}"), why);
            }
        }
    }
    validate_cluster(config)
}

fn validate_cluster(config: &Config) -> Result<(), Violation> {
    let Some(cluster) = &config.cluster else {
        if config.redis.is_some() {
            return fail(
                "redis",
                "is read only by the redis and redis-lease cluster modes; remove it or add [cluster]",
            );
        }
        return Ok(());
    };
    check_id("cluster.cluster_id", &cluster.cluster_id)?;
    check_id("cluster.node_id", &cluster.node_id)?;
    if !(Duration::from_millis(50)..=Duration::from_secs(1)).contains(&cluster.sync_interval) {
        return fail("cluster.sync_interval", "must be between 50ms and 1s");
    }
    if !(Duration::from_millis(10)..=Duration::from_secs(10)).contains(&cluster.gossip_interval) {
        return fail("cluster.gossip_interval", "must be between 10ms and 10s");
    }
    if !(cluster.phi_threshold > 1.0 && cluster.phi_threshold <= 100.0) {
        return fail("cluster.phi_threshold", "must be in (1, 100]");
    }
    if cluster.gossip_listen.port() == 0 {
        return fail(
            "cluster.gossip_listen",
            "needs a fixed port: peers must be able to dial it",
        );
    }
    check_dialable(
        "cluster.gossip_advertise",
        cluster.gossip_advertise,
        "cluster.gossip_listen",
        cluster.gossip_listen,
    )?;
    // Failure detection takes at most gossip_interval x (2 x phi + 2) (see
    // docs/design/membership.md); a dead member must stay charged at least that long,
    // or a node could be forgotten before every peer has noticed it is gone.
    let detection = cluster
        .gossip_interval
        .mul_f64(2.0 * cluster.phi_threshold + 2.0);
    if cluster.dead_node_grace < detection.max(cluster.gossip_interval * 10) {
        return fail(
            "cluster.dead_node_grace",
            format!(
                "must be at least the failure-detection time ({detection:?} with these settings) and 10 gossip intervals"
            ),
        );
    }
    validate_secrets(cluster)?;
    if cluster.mode == super::SyncMode::Lease {
        validate_rpc(cluster)?;
    }
    if cluster.mode.leases() {
        validate_lease(cluster, detection)?;
    }
    if cluster.lease.spillover && cluster.mode != super::SyncMode::Lease {
        return fail(
            "cluster.lease.spillover",
            "is read only by `lease` mode (it sends requests over the internal RPC); remove it or set [cluster] mode = \"lease\"",
        );
    }
    if cluster.mode.uses_redis() {
        validate_redis(config)?;
    } else if config.redis.is_some() {
        return fail(
            "redis",
            "is read only by the redis and redis-lease cluster modes; remove it or set [cluster] mode",
        );
    }
    validate_cluster_windows(config)
}

/// What the cluster counters need of every limit's window.
fn validate_cluster_windows(config: &Config) -> Result<(), Violation> {
    // Nodes date the buckets they publish by the local limiter's bucket width, and
    // readers by the cluster's, in whole milliseconds: the two agree only when
    // the width is a whole number of milliseconds.
    let limits = &config.limits;
    for (field, window, buckets) in [
        ("limits.buckets", limits.window, limits.buckets),
        ("limits.day_buckets", limits.day_window, limits.day_buckets),
    ] {
        if window.as_nanos() % (u128::from(buckets.max(1)) * 1_000_000) != 0 {
            return fail(
                field,
                "in cluster modes must cut its window into buckets of whole milliseconds",
            );
        }
    }
    // Cluster counters publish the local window's buckets, which only the bucketed
    // sliding window has.
    let sliding =
        |q: &Quota| q.algorithm.unwrap_or(config.limits.algorithm) == Algorithm::SlidingWindow;
    let all_sliding = config.tenants.iter().all(|t| sliding(&t.quota))
        && config.upstreams.iter().all(|u| sliding(&u.quota));
    if !all_sliding {
        return fail(
            "limits.algorithm",
            "cluster modes need `sliding-window` for every limit",
        );
    }
    Ok(())
}

fn validate_rpc(cluster: &super::ClusterConfig) -> Result<(), Violation> {
    let Some(rpc) = cluster.rpc_listen else {
        return fail(
            "cluster.rpc_listen",
            "`lease` mode needs an internal RPC address (TCP, not the proxy port)",
        );
    };
    if rpc.port() == 0 {
        return fail(
            "cluster.rpc_listen",
            "needs a fixed port: peers must be able to dial it",
        );
    }
    check_dialable(
        "cluster.rpc_advertise",
        cluster.rpc_advertise,
        "cluster.rpc_listen",
        rpc,
    )?;
    Ok(())
}

/// The cluster secret: every mode seals its gossip and RPCs with it.
fn validate_secrets(cluster: &super::ClusterConfig) -> Result<(), Violation> {
    use tollgate_cluster::auth::keys::{MAX_ACCEPTED, MIN_SECRET_LEN};
    if cluster
        .secret
        .as_deref()
        .is_none_or(|s| s.len() < MIN_SECRET_LEN)
    {
        return fail(
            "cluster.secret",
            format!(
                "is required, at least {MIN_SECRET_LEN} characters: only its holders take part in the cluster (e.g. \"${{TOLLGATE_CLUSTER_SECRET}}\")"
            ),
        );
    }
    if cluster.accept_secrets.len() > MAX_ACCEPTED {
        return fail(
            "cluster.accept_secrets",
            format!("holds at most {MAX_ACCEPTED} secrets (rotation needs one)"),
        );
    }
    if cluster
        .accept_secrets
        .iter()
        .any(|s| s.len() < MIN_SECRET_LEN)
    {
        return fail(
            "cluster.accept_secrets",
            format!("each secret must be at least {MIN_SECRET_LEN} characters"),
        );
    }
    Ok(())
}

/// The address peers are told to dial (`advertised`, or `listen` when it is
/// unset) must be one they can dial: a wildcard (`0.0.0.0`, `::`) is fine to
/// bind but, announced, reaches each peer's own host (unnoticed on one machine,
/// a silent split across machines), and port 0 is no port.
fn check_dialable(
    advertise_field: &str,
    advertised: Option<SocketAddr>,
    listen_field: &str,
    listen: SocketAddr,
) -> Result<(), Violation> {
    match advertised {
        Some(addr) if addr.ip().is_unspecified() || addr.port() == 0 => fail(
            advertise_field,
            format!(
                "{addr} is not an address peers can dial: give this node's own IP and a fixed port"
            ),
        ),
        Some(_) => Ok(()),
        None if listen.ip().is_unspecified() => fail(
            advertise_field,
            format!(
                "is needed when {listen_field} is a wildcard ({listen}): peers dial the announced address, so give this node's own IP (e.g. \"10.0.0.5:{}\")",
                listen.port()
            ),
        ),
        None => Ok(()),
    }
}

fn validate_lease(cluster: &super::ClusterConfig, detection: Duration) -> Result<(), Violation> {
    let lease = &cluster.lease;
    // A holder cut off by a dead owner must not see its credit end before the
    // cluster has even noticed the death, and a dead holder's credit must not come
    // back to the owner before its death is detected (docs/design/lease.md).
    if lease.ttl < detection || lease.ttl < cluster.sync_interval * 4 {
        return fail(
            "cluster.lease.ttl",
            format!(
                "must be at least the failure-detection time ({detection:?} with these gossip settings) and 4 sync intervals"
            ),
        );
    }
    if lease.ttl > Duration::from_secs(600) {
        return fail("cluster.lease.ttl", "must be at most 10 minutes");
    }
    if !(lease.max_credit > 0.0 && lease.max_credit <= 1.0) {
        return fail("cluster.lease.max_credit", "must be in (0, 1]");
    }
    if !(0.0..=1.0).contains(&lease.max_borrow) {
        return fail(
            "cluster.lease.max_borrow",
            "must be in [0, 1] (0 disables borrowing)",
        );
    }
    if lease.rpc_timeout.is_zero() || lease.rpc_timeout * 2 > lease.ttl {
        return fail(
            "cluster.lease.rpc_timeout",
            "must be > 0 and at most half of cluster.lease.ttl",
        );
    }
    if lease.spillover_wait > Duration::from_secs(10) {
        return fail("cluster.lease.spillover_wait", "must be at most 10 s");
    }
    Ok(())
}

fn validate_redis(config: &Config) -> Result<(), Violation> {
    let Some(redis) = &config.redis else {
        return fail(
            "redis",
            "modes `redis` and `redis-lease` need a [redis] section with `url` or `cluster_urls`",
        );
    };
    match (&redis.url, redis.cluster_urls.is_empty()) {
        (Some(_), false) => {
            return fail("redis.url", "give either `url` or `cluster_urls`, not both");
        }
        (None, true) => return fail("redis.url", "missing: `url` (or `cluster_urls`)"),
        _ => {}
    }
    for (field, url) in (redis.url.iter().map(|u| ("redis.url".to_owned(), u))).chain(
        redis
            .cluster_urls
            .iter()
            .enumerate()
            .map(|(i, u)| (format!("redis.cluster_urls[{i}]"), u)),
    ) {
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return fail(field, format!("{url:?} is not a redis:// URL"));
        }
    }
    if !(Duration::from_millis(1)..=Duration::from_secs(1)).contains(&redis.timeout) {
        return fail("redis.timeout", "must be between 1ms and 1s");
    }
    if !(Duration::from_millis(300)..=Duration::from_secs(600)).contains(&redis.slot_ttl) {
        return fail("redis.slot_ttl", "must be between 300ms and 10min");
    }
    if redis.key_prefix.is_empty() || redis.key_prefix.contains(['{', '}', ' ']) {
        return fail(
            "redis.key_prefix",
            "must be non-empty, without braces or spaces",
        );
    }
    Ok(())
}

fn validate_server(config: &Config) -> Result<(), Violation> {
    let server = &config.server;
    if server.max_body_bytes < 1024 {
        return fail("server.max_body_bytes", "must be at least 1024 bytes");
    }
    if server.max_passthrough_body_bytes < 1024 {
        return fail(
            "server.max_passthrough_body_bytes",
            "must be at least 1024 bytes",
        );
    }
    if server.max_in_flight == 0 {
        return fail("server.max_in_flight", "must be at least 1");
    }
    let most_workers = super::defaults::MAX_WORKER_THREADS;
    if (server.worker_threads).is_some_and(|n| !(1..=most_workers).contains(&n)) {
        return fail(
            "server.worker_threads",
            format!("must be between 1 and {most_workers}"),
        );
    }
    if server.request_timeout < Duration::from_millis(100) {
        return fail("server.request_timeout", "must be at least 100ms");
    }
    for (field, timeout) in [
        ("server.header_timeout", server.header_timeout),
        ("server.body_idle_timeout", server.body_idle_timeout),
    ] {
        if timeout < Duration::from_millis(100) || timeout > Duration::from_secs(3_600) {
            return fail(field, "must be between 100ms and 1h");
        }
    }
    for (field, cap) in [
        ("server.max_connections", server.max_connections),
        (
            "server.max_connections_per_ip",
            server.max_connections_per_ip,
        ),
    ] {
        if cap == Some(0) {
            return fail(field, "must be at least 1 (leave it out for the default)");
        }
    }
    if let Some(tls) = &server.tls {
        for (field, path) in [("server.tls.cert", &tls.cert), ("server.tls.key", &tls.key)] {
            if let Err(e) = std::fs::metadata(path) {
                return fail(field, format!("cannot read {}: {e}", path.display()));
            }
        }
    }
    if server.admin_listen == Some(server.listen) && server.listen.port() != 0 {
        return fail(
            "server.admin_listen",
            "must differ from server.listen (leave it out to serve the admin routes there)",
        );
    }
    if server.admin_token.as_deref().is_some_and(|t| t.len() < 8) {
        return fail("server.admin_token", "must be at least 8 characters");
    }
    let retry = &config.retry;
    if !(1..=10).contains(&retry.max_attempts) {
        return fail("retry.max_attempts", "must be between 1 and 10");
    }
    if retry.backoff_base.is_zero() || retry.backoff_base > retry.backoff_max {
        return fail("retry.backoff_base", "must be > 0 and <= retry.backoff_max");
    }
    Ok(())
}

/// `buckets` cut `window` into 1..=MAX_BUCKETS buckets of at least 1 ms.
fn validate_buckets(field: &str, window: Duration, buckets: u32) -> Result<(), Violation> {
    let most = bounds::MAX_BUCKETS;
    if buckets == 0 || buckets > most || window / buckets < Duration::from_millis(1) {
        return fail(
            field,
            format!("must be in 1..={most} with buckets no narrower than 1ms"),
        );
    }
    Ok(())
}

fn validate_limits(config: &Config) -> Result<(), Violation> {
    let limits = &config.limits;
    if limits.window < Duration::from_secs(1) {
        return fail("limits.window", "must be at least 1s");
    }
    validate_buckets("limits.buckets", limits.window, limits.buckets)?;
    if limits.day_window < limits.window {
        return fail("limits.day_window", "must be at least limits.window");
    }
    validate_buckets("limits.day_buckets", limits.day_window, limits.day_buckets)?;
    if !(limits.batch_share > 0.0 && limits.batch_share <= 1.0) {
        return fail("limits.batch_share", "must be in (0, 1]");
    }
    if limits.max_queue == 0 {
        return fail("limits.max_queue", "must be at least 1");
    }
    if limits.idle_timeout < limits.window {
        return fail(
            "limits.idle_timeout",
            "must be at least limits.window: an actor may only stop once its window has emptied",
        );
    }
    Ok(())
}

fn validate_estimation(config: &Config) -> Result<(), Violation> {
    let est = &config.estimation;
    let most = bounds::MAX_TOKENS_CAP.unsigned_abs();
    if est.default_max_tokens == 0 || est.default_max_tokens > most {
        return fail(
            "estimation.default_max_tokens",
            format!("must be in 1..={most} (what a request may ask)"),
        );
    }
    if !(est.adaptive_headroom >= 1.0 && est.adaptive_headroom <= 10.0) {
        return fail("estimation.adaptive_headroom", "must be in [1.0, 10.0]");
    }
    // The p95 is read from the last ADAPTIVE_SAMPLES completions: a larger minimum
    // would never be reached and `adaptive` would silently stay at max_tokens.
    let most = bounds::ADAPTIVE_SAMPLES;
    if est.adaptive_min_samples == 0 || est.adaptive_min_samples > most {
        return fail(
            "estimation.adaptive_min_samples",
            format!("must be in 1..={most} (the p95 is read from the last {most} completions)"),
        );
    }
    let slots = est.count_memo_slots;
    let (least, most) = bounds::COUNT_MEMO_SLOTS_RANGE;
    if slots != 0 && !(slots.is_power_of_two() && (least..=most).contains(&slots)) {
        return fail(
            "estimation.count_memo_slots",
            format!("must be 0 (off) or a power of two in {least}..={most}, got {slots}"),
        );
    }
    EncodingName::parse(&est.default_encoding)
        .map(|_| ())
        .or_else(|reason| fail("estimation.default_encoding", reason))
}

fn validate_quota(
    path: &str,
    quota: &Quota,
    default_algorithm: Algorithm,
) -> Result<(), Violation> {
    let limits = [
        ("rpm", quota.rpm),
        ("tpm", quota.tpm),
        ("itpm", quota.itpm),
        ("otpm", quota.otpm),
        ("rpd", quota.rpd),
        ("tpd", quota.tpd),
        ("concurrency", quota.concurrency),
    ];
    for (name, value) in limits {
        if value == Some(0) {
            return fail(
                format!("{path}.{name}"),
                "must be at least 1 (omit it for no limit)",
            );
        }
    }
    // The lease and counter arithmetic bounds every amount (a capacity above it
    // passed here and stopped `serve` in a cluster mode, unnamed).
    let most = tollgate_cluster::lease::MAX_AMOUNT;
    for (name, value) in limits {
        if value.is_some_and(|v| v > most) {
            return fail(format!("{path}.{name}"), format!("must be at most {most}"));
        }
    }
    // Each limit has its own burst: one figure for both made any token-bucket
    // tenant with rpm below its requests' token cost refuse them all (413).
    let token_bucket = quota.algorithm.unwrap_or(default_algorithm) == Algorithm::TokenBucket;
    for (name, burst, capacity, limit) in [
        ("burst", quota.burst, quota.rpm, "rpm"),
        ("burst_tokens", quota.burst_tokens, quota.tpm, "tpm"),
    ] {
        let Some(burst) = burst else { continue };
        if !token_bucket {
            return fail(
                format!("{path}.{name}"),
                "applies only to algorithm = \"token-bucket\"",
            );
        }
        let Some(capacity) = capacity else {
            return fail(
                format!("{path}.{name}"),
                format!("is the burst of {limit}, which is not set"),
            );
        };
        if burst == 0 || burst > capacity {
            return fail(
                format!("{path}.{name}"),
                format!("must be between 1 and {limit} ({capacity})"),
            );
        }
    }
    Ok(())
}

/// A scope's model groups: their patterns and names, and each one's limits.
/// `owner`: the scope's key prefix (`upstream-model:<id>`), whose groups' keys
/// must stay within what gossip carries; `None` for the mock's.
fn validate_model_limits(
    path: &str,
    owner: Option<&str>,
    groups: &[super::ModelLimitConfig],
    config: &Config,
) -> Result<(), Violation> {
    super::model_limits::check(path, groups).or_else(|(field, reason)| fail(field, reason))?;
    for (i, group) in groups.iter().enumerate() {
        let at = format!("{path}.model_limits[{i}]");
        validate_quota(&at, &group.quota, config.limits.algorithm)?;
        // The longest key of the group (its daily requests') is shared over
        // gossip, which carries keys of at most MAX_LIMIT_KEY_BYTES: a longer one
        // would stay on its node, unbounded cluster-wide.
        let most = tollgate_cluster::counter::MAX_LIMIT_KEY_BYTES;
        if let Some(owner) = owner {
            let ending = super::model_limits::LONGEST_KEY_ENDING;
            let key = format!("{owner}@{}{ending}", group.group_name());
            if key.len() > most {
                let why = format!(
                    "its keys (e.g. {key:?}) would be {} bytes, above the {most} gossip carries: shorten the group's name or the id",
                    key.len()
                );
                return fail(format!("{at}.name"), why);
            }
        }
    }
    Ok(())
}

fn validate_tenants(config: &Config) -> Result<(), Violation> {
    let mut ids = HashSet::new();
    let mut hashes = HashSet::new();
    for (i, tenant) in config.tenants.iter().enumerate() {
        let path = format!("tenants[{i}]");
        check_id(&format!("{path}.id"), &tenant.id)?;
        if !ids.insert(tenant.id.as_str()) {
            return fail(
                format!("{path}.id"),
                format!("duplicate tenant id {:?}", tenant.id),
            );
        }
        if tenant.api_key_hashes.is_empty() {
            return fail(
                format!("{path}.api_key_hashes"),
                "needs at least one hash (tollgate hash-key)",
            );
        }
        for (k, stored) in tenant.api_key_hashes.iter().enumerate() {
            let hash = normalize_key_hash(stored);
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return fail(
                    format!("{path}.api_key_hashes[{k}]"),
                    "must be a SHA-256 hex digest (64 hex digits, optionally prefixed sha256:); use `tollgate hash-key`",
                );
            }
            if !hashes.insert(hash) {
                return fail(
                    format!("{path}.api_key_hashes[{k}]"),
                    "the same key belongs to two tenants",
                );
            }
        }
        validate_quota(&path, &tenant.quota, config.limits.algorithm)?;
        let owner = format!("tenant-model:{}", tenant.id);
        validate_model_limits(&path, Some(&owner), &tenant.model_limits, config)?;
        // The default too: otherwise a request could wait in the queue past its
        // own deadline instead of getting a 429 with retry-after in time.
        let max_wait = tenant.max_wait.unwrap_or(crate::config::defaults::MAX_WAIT);
        if max_wait > config.server.request_timeout {
            let why = match tenant.max_wait {
                Some(_) => "must not exceed server.request_timeout".to_owned(),
                None => format!(
                    "unset, it is {}s, above server.request_timeout: set it (or raise the timeout)",
                    crate::config::defaults::MAX_WAIT.as_secs()
                ),
            };
            return fail(format!("{path}.max_wait"), why);
        }
    }
    Ok(())
}

fn validate_upstreams(config: &Config) -> Result<(), Violation> {
    let mut ids = HashSet::new();
    for (i, upstream) in config.upstreams.iter().enumerate() {
        let path = format!("upstreams[{i}]");
        check_id(&format!("{path}.id"), &upstream.id)?;
        if !ids.insert(upstream.id.as_str()) {
            return fail(
                format!("{path}.id"),
                format!("duplicate upstream id {:?}", upstream.id),
            );
        }
        match reqwest::Url::parse(&upstream.base_url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            _ => {
                return fail(
                    format!("{path}.base_url"),
                    "must be an absolute http(s) URL",
                );
            }
        }
        // Sent as a header on every request: refused here, not at the first send.
        if let Some(key) = &upstream.api_key
            && (key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()))
        {
            return fail(
                format!("{path}.api_key"),
                "must be printable ASCII without spaces (it is sent as a header)",
            );
        }
        validate_quota(&path, &upstream.quota, config.limits.algorithm)?;
        let owner = format!("upstream-model:{}", upstream.id);
        validate_model_limits(&path, Some(&owner), &upstream.model_limits, config)?;
        if upstream.timeout.is_zero() {
            return fail(format!("{path}.timeout"), "must be greater than 0");
        }
        if upstream.stream_idle_timeout.is_zero() {
            return fail(
                format!("{path}.stream_idle_timeout"),
                "must be greater than 0",
            );
        }
    }
    Ok(())
}

fn validate_routes(config: &Config) -> Result<(), Violation> {
    let known: HashSet<&str> = config.upstreams.iter().map(|u| u.id.as_str()).collect();
    for (i, route) in config.routes.iter().enumerate() {
        let path = format!("routes[{i}]");
        if route.models.is_empty() || route.models.iter().any(|m| m.is_empty()) {
            return fail(
                format!("{path}.models"),
                "needs at least one non-empty model name",
            );
        }
        if route.upstreams.is_empty() {
            return fail(format!("{path}.upstreams"), "needs at least one upstream");
        }
        for (k, id) in route.upstreams.iter().enumerate() {
            if !known.contains(id.as_str()) {
                return fail(
                    format!("{path}.upstreams[{k}]"),
                    format!("no upstream with id {id:?}"),
                );
            }
        }
        if let Some(enc) = &route.encoding {
            EncodingName::parse(enc).or_else(|reason| fail(format!("{path}.encoding"), reason))?;
        }
        let openai = (route.upstreams.iter())
            .filter_map(|id| config.upstreams.iter().find(|u| u.id == *id))
            .any(|u| u.kind == UpstreamKind::Openai);
        if !route.passthrough.is_empty() && !openai {
            return fail(
                format!("{path}.passthrough"),
                "needs an openai upstream in the route to pass requests to",
            );
        }
    }
    Ok(())
}

fn check_id(field: &str, id: &str) -> Result<(), Violation> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        fail(field, "must be 1-64 characters of [A-Za-z0-9-_.]")
    }
}
