//! The configuration file's shape: one struct per TOML table, defaults in one place
//! ([`defaults`]), unknown fields rejected. Field units are in names or documented.
//! Cross-field rules live in [`super::validate`]. Reference: `docs/config.md`.

use super::Algorithm;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;

/// Default values, kept in one place so docs and code agree.
pub mod defaults {
    use std::time::Duration;
    /// Proxy listen address.
    pub const LISTEN: &str = "127.0.0.1:8080";
    /// Largest accepted request body (4 MiB).
    pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
    /// Largest body a passed-through request streams (512 MiB, OpenAI's file
    /// limit).
    pub const MAX_PASSTHROUGH_BODY_BYTES: u64 = 512 * 1024 * 1024;
    /// Requests in flight across the node before new ones get 503.
    pub const MAX_IN_FLIGHT: usize = 4096;
    /// Most worker threads `server.worker_threads` may ask for.
    pub const MAX_WORKER_THREADS: usize = 1024;
    /// Time graceful shutdown waits for in-flight requests.
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
    /// Overall deadline of one request (queueing, retries and upstream time).
    pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
    /// How long an idle upstream connection is kept for reuse (reqwest's default).
    pub const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
    /// How long a client may take to send a request's header, from its
    /// connection's start or its last answer's end (so also the idle
    /// keep-alive timeout).
    pub const HEADER_TIMEOUT: Duration = Duration::from_secs(15);
    /// How long a request body may send nothing while it is read.
    pub const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
    /// Limit window.
    pub const WINDOW: Duration = Duration::from_secs(60);
    /// Buckets per sliding window.
    pub const BUCKETS: u32 = 60;
    /// Window the `rpd`/`tpd` figures apply to.
    pub const DAY_WINDOW: Duration = Duration::from_secs(24 * 3600);
    /// Buckets per day window (an hour each).
    pub const DAY_BUCKETS: u32 = 24;
    /// Share of a key's capacity the batch lane may use.
    pub const BATCH_SHARE: f64 = 0.6;
    /// Head start interactive waiters get over batch waiters.
    pub const BATCH_AGING: Duration = Duration::from_secs(5);
    /// Waiters per scope (tenant or upstream) before new ones are refused.
    pub const MAX_QUEUE: usize = 1024;
    /// Idle time before an actor at rest stops (never below the window).
    pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
    /// Completion tokens assumed when a request gives no max_tokens.
    pub const DEFAULT_MAX_TOKENS: u64 = 4096;
    /// Multiplier on the p95 completion length for the adaptive policy.
    pub const ADAPTIVE_HEADROOM: f64 = 1.2;
    /// Completions seen before the adaptive policy trusts its p95.
    pub const ADAPTIVE_MIN_SAMPLES: usize = 20;
    /// Slots of the token count memo (8 B each: 512 KB).
    pub const COUNT_MEMO_SLOTS: usize = 65_536;
    /// Wait cap when a tenant sets none.
    pub const MAX_WAIT: Duration = Duration::from_secs(30);
    /// Time to response headers from an upstream, per attempt.
    pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(120);
    /// Longest silence inside a streamed response before it is cut.
    pub const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
    /// Attempts per request across upstreams and retries.
    pub const MAX_ATTEMPTS: u32 = 3;
    /// Cool-down after an upstream 429 that gave no retry-after.
    pub const COOLDOWN: Duration = Duration::from_secs(1);
}

/// The whole file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listen addresses, admin token, bounds.
    #[serde(default)]
    pub server: ServerConfig,
    /// Defaults for every limit (algorithm, window, lanes, queues).
    #[serde(default)]
    pub limits: LimitDefaults,
    /// How prompt and completion tokens are estimated before the upstream answers.
    #[serde(default)]
    pub estimation: EstimationConfig,
    /// Upstream retries.
    #[serde(default)]
    pub retry: RetryConfig,
    /// Callers and their limits.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Provider deployments and their quotas.
    #[serde(default)]
    pub upstreams: Vec<UpstreamConfig>,
    /// Model name -> ordered upstream list.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Start an in-process mock upstream (the demo uses it).
    #[serde(default)]
    pub builtin_mock: Option<BuiltinMockConfig>,
    /// Join a cluster: share every limit with the other nodes (absent: one node).
    #[serde(default)]
    pub cluster: Option<ClusterConfig>,
    /// `[redis]`: the server (or cluster) of the Redis strict modes.
    #[serde(default)]
    pub redis: Option<RedisConfig>,
}

/// How a node learns what the rest of the cluster spent. Each mode makes a written
/// promise about the cluster-wide total admitted per window (L = a key's capacity,
/// N = live nodes); `docs/design/cluster.md` has the arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SyncMode {
    /// Each node counts alone. Promise: `full` <= N x L (a baseline, not a limit);
    /// `split` <= L (each node gets L/N of the live members). Same in a partition.
    Local,
    /// Nodes publish per-bucket usage as CRDT counters over gossip; a node may spend
    /// its demand-weighted share of the global headroom. Promise: <= L x (1 + e), e
    /// from gossip lag, measured and reported; unreachable members are charged their
    /// last published usage until the failure detector removes them.
    Gossip,
    /// The key's owner (rendezvous hashing over live members) grants credit that
    /// holders spend locally and renew off the request path. Promise: <= L; in a
    /// partition <= L + the borrowed credit outstanding at the cut (0 with
    /// `max_borrow = 0`, the default). The cluster default.
    #[default]
    Lease,
    /// Strict: one atomic Lua call per reservation and per settlement. Promise:
    /// <= L; a node that loses Redis falls back to its share and says so over
    /// gossip. Needs `[redis]`.
    Redis,
    /// Credit carved from Redis by a Lua script, spent locally. Promise: <= L; a
    /// node that loses Redis spends its credit, then its share, and says so over
    /// gossip so peers charge it there. Needs `[redis]`.
    RedisLease,
}

impl SyncMode {
    /// Whether the mode needs `[redis]`.
    pub fn uses_redis(self) -> bool {
        matches!(self, SyncMode::Redis | SyncMode::RedisLease)
    }

    /// Whether keys are bounded by leased credit (`lease`, `redis-lease`).
    pub fn leases(self) -> bool {
        matches!(self, SyncMode::Lease | SyncMode::RedisLease)
    }
}

/// `[redis]`: where the Redis strict modes keep their state.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// One server: `redis://host:port/db` (`${ENV}` is expanded, for passwords).
    #[serde(default)]
    pub url: Option<String>,
    /// A Redis Cluster: any of its nodes (`redis://host:port`).
    #[serde(default)]
    pub cluster_urls: Vec<String>,
    /// Longest wait for one script call; beyond it the node degrades to its share.
    #[serde(default = "default_redis_timeout", with = "super::duration")]
    pub timeout: Duration,
    /// Prefix of every key tollgate writes.
    #[serde(default = "default_redis_prefix")]
    pub key_prefix: String,
    /// `redis` mode: a concurrency slot's ttl; running requests renew it every
    /// third of it, so a crashed node's slots come back within it.
    #[serde(default = "default_slot_ttl", with = "super::duration")]
    pub slot_ttl: Duration,
}

fn default_slot_ttl() -> Duration {
    Duration::from_secs(10)
}

fn default_redis_timeout() -> Duration {
    Duration::from_millis(15)
}

fn default_redis_prefix() -> String {
    "tg".to_owned()
}

/// What `local` mode gives each node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LocalShare {
    /// Every node enforces the full capacity (<= N x L cluster-wide).
    #[default]
    Full,
    /// Every node enforces an equal share of the capacity among live members.
    Split,
}

/// `[cluster]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Nodes only gossip with nodes of the same cluster id.
    pub cluster_id: String,
    /// This node's stable name, unique in the cluster.
    pub node_id: String,
    /// UDP address gossip binds.
    pub gossip_listen: SocketAddr,
    /// Address peers dial (default: `gossip_listen`), as written: `${ENV}` is
    /// expanded (a pod announcing `"${POD_IP}:7946"`).
    #[serde(default, rename = "gossip_advertise")]
    pub gossip_advertise_text: Option<String>,
    /// `gossip_advertise` expanded and parsed (set by [`super::Config::from_toml`]).
    #[serde(skip)]
    pub gossip_advertise: Option<SocketAddr>,
    /// Internal RPC address (TCP) for lease statements, announced in node metadata;
    /// never the public proxy port. Required in `lease` mode.
    #[serde(default)]
    pub rpc_listen: Option<SocketAddr>,
    /// Address peers dial for the internal RPC (default: `rpc_listen`), announced
    /// in node metadata, as written (`${ENV}` expanded): set it when
    /// `rpc_listen` is a wildcard (`0.0.0.0` in a container) or peers reach this
    /// node through another address (NAT).
    #[serde(default, rename = "rpc_advertise")]
    pub rpc_advertise_text: Option<String>,
    /// `rpc_advertise` expanded and parsed (set by [`super::Config::from_toml`]).
    #[serde(skip)]
    pub rpc_advertise: Option<SocketAddr>,
    /// Shared secret (`${ENV}` is expanded), at least 16 characters, required:
    /// every gossip datagram and internal RPC is sealed with a key derived from
    /// it, and only its holders take part in the cluster.
    #[serde(default)]
    pub secret: Option<String>,
    /// Secrets accepted besides `secret` but never sent with (at most 3, each
    /// `${ENV}`-expanded): rotating the secret without an outage
    /// (docs/design/cluster-trust.md).
    #[serde(default)]
    pub accept_secrets: Vec<String>,
    /// Seed nodes as `host:port`; DNS names are re-resolved (a Kubernetes headless
    /// service works).
    #[serde(default)]
    pub seeds: Vec<String>,
    /// Gossip round interval.
    #[serde(default = "default_gossip_interval", with = "super::duration")]
    pub gossip_interval: Duration,
    /// Phi-accrual failure detector threshold (higher = slower, fewer false alarms).
    #[serde(default = "default_phi_threshold")]
    pub phi_threshold: f64,
    /// How long a dead member's state is kept before it is garbage-collected.
    #[serde(default = "default_dead_node_grace", with = "super::duration")]
    pub dead_node_grace: Duration,
    /// Sync mode.
    #[serde(default)]
    pub mode: SyncMode,
    /// `local` mode's share.
    #[serde(default)]
    pub local_share: LocalShare,
    /// How often usage is published (coalesced) and allowances recomputed.
    #[serde(default = "default_sync_interval", with = "super::duration")]
    pub sync_interval: Duration,
    /// `lease` mode's knobs.
    #[serde(default)]
    pub lease: LeaseConfig,
}

/// `[cluster.lease]`: how credit is leased (docs/design/lease.md).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseConfig {
    /// How long a credit lives without a new statement: a crashed holder's credit
    /// and slots come back within it. At least the failure-detection time.
    #[serde(with = "super::duration")]
    pub ttl: Duration,
    /// Most credit one holder holds at once, as a fraction of L (0 < x <= 1). A
    /// new owner charges each holder that stays silent this much.
    pub max_credit: f64,
    /// How far a holder may commit beyond its demand-weighted share, as a fraction
    /// of L (0 disables borrowing; then a partition never exceeds L). Borrowing
    /// only happens while every member is live.
    pub max_borrow: f64,
    /// What a holder does when its owner cannot be reached once its credit ends.
    pub cut_off: CutOff,
    /// Timeout of one statement round trip to an owner.
    #[serde(with = "super::duration")]
    pub rpc_timeout: Duration,
    /// Spillover: a request this node would refuse for want of its own share is
    /// sent, over the internal RPC, to a peer whose share has room by the
    /// gossiped figures (docs/design/spillover.md). Off by default.
    pub spillover: bool,
    /// How long a spilled request may wait at the peer for credit.
    #[serde(with = "super::duration")]
    pub spillover_wait: Duration,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig {
            ttl: Duration::from_secs(3),
            max_credit: 0.25,
            max_borrow: 0.0,
            cut_off: CutOff::Share,
            rpc_timeout: Duration::from_millis(250),
            spillover: false,
            spillover_wait: Duration::from_millis(250),
        }
    }
}

/// A cut-off holder's policy (docs/design/lease.md, "Shares, borrowing and
/// partitions").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CutOff {
    /// At most its own share of L per window (the share frozen at the cut): safe.
    #[default]
    Share,
    /// Nothing beyond its credit: safe, unavailable under a cut.
    FailClosed,
    /// Unlimited: unsafe, the cluster total is unbounded during a cut.
    FailOpen,
}

fn default_gossip_interval() -> Duration {
    Duration::from_millis(100)
}

fn default_phi_threshold() -> f64 {
    8.0
}

fn default_dead_node_grace() -> Duration {
    Duration::from_secs(60)
}

fn default_sync_interval() -> Duration {
    Duration::from_millis(200)
}

/// `[server]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Public proxy address (`host:port`).
    pub listen: SocketAddr,
    /// Bearer token for `/admin/*`; `${ENV}` is expanded. Absent: admin API disabled.
    pub admin_token: Option<String>,
    /// Largest request body accepted, in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Largest body a passed-through request may stream (an upload), in bytes.
    pub max_passthrough_body_bytes: u64,
    /// Requests in flight on this node before new ones get 503.
    pub max_in_flight: usize,
    /// How long shutdown waits for in-flight requests to finish.
    #[serde(with = "super::duration")]
    pub shutdown_grace: Duration,
    /// Overall deadline for one request: queueing, retries and upstream time.
    #[serde(with = "super::duration")]
    pub request_timeout: Duration,
    /// How long an idle connection to an upstream is kept for reuse (0: none is
    /// kept). Below the provider's own keep-alive timeout, a reused connection is
    /// never one the provider is closing; each one kept holds its buffers.
    #[serde(with = "super::duration")]
    pub upstream_idle_timeout: Duration,
    /// How long a client may take to send a request's header, from its
    /// connection's start or its last answer's end: a half-sent header, or an
    /// idle keep-alive connection, is closed after it.
    #[serde(with = "super::duration")]
    pub header_timeout: Duration,
    /// How long a request body may send nothing while the node reads it.
    #[serde(with = "super::duration")]
    pub body_idle_timeout: Duration,
    /// Client connections open at once (one more gets 503 and is closed).
    /// Absent: what the open-file limit allows, each connection counted with
    /// the upstream connection its request may open.
    pub max_connections: Option<usize>,
    /// Client connections open at once from one address. Absent: no cap (a
    /// node behind a load balancer sees one address for everyone).
    pub max_connections_per_ip: Option<usize>,
    /// TLS on the proxy listener (and the admin one): PEM files read at start.
    pub tls: Option<TlsFiles>,
    /// A listener of its own for `/healthz`, `/readyz`, `/metrics` and
    /// `/admin/*` (the proxy's then keeps `/healthz` and `/readyz` only), so
    /// probes and scrapes never wait behind client connections.
    pub admin_listen: Option<SocketAddr>,
    /// Log format: `text` or `json`.
    pub log_format: LogFormat,
    /// Add a `tenant` label to metrics (off by default: unbounded label sets).
    pub metrics_tenant_labels: bool,
    /// Tokio worker threads serving this node. Absent: tokio's own choice
    /// (`TOKIO_WORKER_THREADS` from the environment, else one per core).
    pub worker_threads: Option<usize>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            // The literal is a valid socket address.
            listen: defaults::LISTEN
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080))),
            admin_token: None,
            max_body_bytes: defaults::MAX_BODY_BYTES,
            max_passthrough_body_bytes: defaults::MAX_PASSTHROUGH_BODY_BYTES,
            max_in_flight: defaults::MAX_IN_FLIGHT,
            shutdown_grace: defaults::SHUTDOWN_GRACE,
            request_timeout: defaults::REQUEST_TIMEOUT,
            upstream_idle_timeout: defaults::UPSTREAM_IDLE_TIMEOUT,
            header_timeout: defaults::HEADER_TIMEOUT,
            body_idle_timeout: defaults::BODY_IDLE_TIMEOUT,
            max_connections: None,
            max_connections_per_ip: None,
            tls: None,
            admin_listen: None,
            log_format: LogFormat::Text,
            metrics_tenant_labels: false,
            worker_threads: None,
        }
    }
}

/// `[server.tls]`: a certificate chain and its key, PEM.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The chain, leaf first.
    pub cert: std::path::PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[limits]`: defaults for every tenant and upstream limit.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitDefaults {
    /// Algorithm for request and token limits.
    pub algorithm: Algorithm,
    /// Window the `rpm`/`tpm` figures apply to.
    #[serde(with = "super::duration")]
    pub window: Duration,
    /// Buckets per window (`sliding-window` only); a bucket is window/buckets wide.
    pub buckets: u32,
    /// Window the `rpd`/`tpd` figures apply to (a day; shorter in tests).
    #[serde(with = "super::duration")]
    pub day_window: Duration,
    /// Buckets per day window; a day bucket is day_window/day_buckets wide.
    pub day_buckets: u32,
    /// Fraction of each capacity the batch lane may use (0.0-1.0].
    pub batch_share: f64,
    /// How much earlier an interactive waiter is served than a batch waiter that
    /// arrived at the same time; a batch waiter older than this overtakes new
    /// interactive ones (aging, so batch never starves).
    #[serde(with = "super::duration")]
    pub batch_aging: Duration,
    /// Waiters per tenant or upstream before new arrivals are refused at once.
    pub max_queue: usize,
    /// Idle time before a tenant or upstream actor whose state is at rest stops.
    #[serde(with = "super::duration")]
    pub idle_timeout: Duration,
}

impl Default for LimitDefaults {
    fn default() -> Self {
        LimitDefaults {
            algorithm: Algorithm::SlidingWindow,
            window: defaults::WINDOW,
            buckets: defaults::BUCKETS,
            day_window: defaults::DAY_WINDOW,
            day_buckets: defaults::DAY_BUCKETS,
            batch_share: defaults::BATCH_SHARE,
            batch_aging: defaults::BATCH_AGING,
            max_queue: defaults::MAX_QUEUE,
            idle_timeout: defaults::IDLE_TIMEOUT,
        }
    }
}

impl LimitDefaults {
    /// The windows the cluster counts keys over: the base window, and the day
    /// window for the daily dimensions' keys (`..._per_day`), or why one cannot
    /// be used.
    pub fn cluster_windows(
        &self,
    ) -> Result<tollgate_cluster::counter::Windows, tollgate_cluster::counter::WindowError> {
        use tollgate_cluster::counter::{Window, Windows};
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let base = Window::try_new(ms(self.window), self.buckets)?;
        let day = Window::try_new(ms(self.day_window), self.day_buckets)?;
        Ok(Windows::new(base, day))
    }
}

/// Completion estimate policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CompletionPolicy {
    /// Reserve the request's max_tokens (an upper bound: never under-reserves).
    #[default]
    MaxTokens,
    /// Reserve min(max_tokens, p95 of recent completions x headroom) per tenant and
    /// model; under-reservations become settlement debt, which is reported.
    Adaptive,
}

/// `[estimation]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EstimationConfig {
    /// Completion estimate policy.
    pub completion: CompletionPolicy,
    /// Completion tokens assumed when a request sets no max_tokens.
    pub default_max_tokens: u64,
    /// Adaptive: multiplier on the p95 completion length.
    pub adaptive_headroom: f64,
    /// Adaptive: completions observed before the p95 is used.
    pub adaptive_min_samples: usize,
    /// Encoding for models tiktoken does not know: `cl100k_base`, `o200k_base` or
    /// `chars-per-token:<ratio>`.
    pub default_encoding: String,
    /// Slots of the node's token count memo (`tokens::CountMemo`); 0 turns it off.
    pub count_memo_slots: usize,
}

impl Default for EstimationConfig {
    fn default() -> Self {
        EstimationConfig {
            completion: CompletionPolicy::MaxTokens,
            default_max_tokens: defaults::DEFAULT_MAX_TOKENS,
            adaptive_headroom: defaults::ADAPTIVE_HEADROOM,
            adaptive_min_samples: defaults::ADAPTIVE_MIN_SAMPLES,
            default_encoding: "cl100k_base".to_owned(),
            count_memo_slots: defaults::COUNT_MEMO_SLOTS,
        }
    }
}

/// `[retry]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Upstream attempts per request, first one included.
    pub max_attempts: u32,
    /// Full-jitter backoff base: attempt n sleeps uniform(0, min(max, base x 2^n)).
    #[serde(with = "super::duration")]
    pub backoff_base: Duration,
    /// Full-jitter backoff ceiling.
    #[serde(with = "super::duration")]
    pub backoff_max: Duration,
    /// Cool-down after an upstream 429 that named no retry-after.
    #[serde(with = "super::duration")]
    pub cooldown: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: defaults::MAX_ATTEMPTS,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            cooldown: defaults::COOLDOWN,
        }
    }
}

/// The limits a tenant or upstream may set; absent = unlimited.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Requests per window.
    pub rpm: Option<u64>,
    /// Tokens (prompt + completion) per window.
    pub tpm: Option<u64>,
    /// Input (prompt) tokens per window: Anthropic's ITPM. Charged the prompt
    /// estimate at admission, settled to the provider's input count.
    pub itpm: Option<u64>,
    /// Output (completion) tokens per window: Anthropic's OTPM. Charged
    /// `max_tokens` (or the adaptive estimate) at admission, settled to the
    /// provider's output count.
    pub otpm: Option<u64>,
    /// Requests per day window (`limits.day_window`), beside the minute's.
    pub rpd: Option<u64>,
    /// Tokens (prompt + completion) per day window.
    pub tpd: Option<u64>,
    /// Whether prompt-cache reads (Anthropic's `cache_read_input_tokens`) count
    /// as input tokens here (`itpm`, `tpm`). Anthropic leaves them out of ITPM
    /// for most models; set it for the models whose limits count them.
    #[serde(default)]
    pub input_counts_cache_reads: bool,
    /// Requests in flight at once.
    pub concurrency: Option<u64>,
    /// Algorithm override for this scope's request and token limits.
    pub algorithm: Option<Algorithm>,
    /// Burst of the request limit for `token-bucket` (default: rpm).
    pub burst: Option<u64>,
    /// Burst of the token limit for `token-bucket` (default: tpm).
    pub burst_tokens: Option<u64>,
}

/// `[[tenants]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Tenant id, used in keys (`tenant:<id>:tokens`) and logs.
    pub id: String,
    /// SHA-256 of each API key, hex, optionally prefixed `sha256:`
    /// (`tollgate hash-key` prints it). Plain keys are never stored.
    pub api_key_hashes: Vec<String>,
    /// The tenant's limits.
    #[serde(flatten)]
    pub quota: Quota,
    /// Longest a request may queue; caps `x-tollgate-max-wait-ms` and is the default
    /// when the header is absent.
    #[serde(default, with = "super::duration::option")]
    pub max_wait: Option<Duration>,
    /// Quotas for some of its models, within its own.
    #[serde(default)]
    pub model_limits: Vec<super::ModelLimitConfig>,
}

/// Provider API flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpstreamKind {
    /// Any OpenAI-compatible server (`/chat/completions`, `/completions`, ...).
    Openai,
    /// Anthropic's Messages API (`/messages`).
    Anthropic,
}

/// `[[upstreams]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Upstream id, used in routes, keys (`upstream:<id>:requests`) and metrics.
    pub id: String,
    /// API flavour.
    pub kind: UpstreamKind,
    /// Base URL including the version path, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Provider key; `${ENV_VAR}` is expanded at load time (never logged).
    #[serde(default)]
    pub api_key: Option<String>,
    /// The provider's quota for this deployment.
    #[serde(flatten)]
    pub quota: Quota,
    /// Time to response headers, per attempt.
    #[serde(default = "default_upstream_timeout", with = "super::duration")]
    pub timeout: Duration,
    /// Longest silence inside a streamed response before it is cut.
    #[serde(default = "default_stream_idle_timeout", with = "super::duration")]
    pub stream_idle_timeout: Duration,
    /// The provider's limits for some of its models, within the account's.
    #[serde(default)]
    pub model_limits: Vec<super::ModelLimitConfig>,
}

fn default_upstream_timeout() -> Duration {
    defaults::UPSTREAM_TIMEOUT
}

fn default_stream_idle_timeout() -> Duration {
    defaults::STREAM_IDLE_TIMEOUT
}

/// `[[routes]]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Model names served by this route; a trailing `*` matches a prefix, `*` alone
    /// matches every model. The first matching route wins.
    pub models: Vec<String>,
    /// Upstream ids in preference order (fallbacks after the first).
    pub upstreams: Vec<String>,
    /// Encoding for prompt estimates on this route (overrides tiktoken's model
    /// table and `estimation.default_encoding`).
    #[serde(default)]
    pub encoding: Option<String>,
    /// Provider endpoints passed through unmetered to this route's first
    /// OpenAI upstream (the first route listing a family serves it).
    #[serde(default)]
    pub passthrough: Vec<super::Passthrough>,
}

/// `[builtin_mock]`: an in-process mock upstream, for the demo and tests.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BuiltinMockConfig {
    /// Where the mock listens; upstreams point their base_url at it.
    pub listen: SocketAddr,
    /// The mock's own requests per minute (its "provider quota"; absent: none).
    #[serde(default)]
    pub rpm: Option<u64>,
    /// Its tokens per minute.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Its input tokens per minute (Anthropic's ITPM).
    #[serde(default)]
    pub itpm: Option<u64>,
    /// Its output tokens per minute (Anthropic's OTPM), charged `max_tokens`
    /// on arrival and corrected to the output when the answer ends.
    #[serde(default)]
    pub otpm: Option<u64>,
    /// Its requests in flight at once.
    #[serde(default)]
    pub concurrency: Option<u64>,
    /// Its requests per day (beside the minute).
    #[serde(default)]
    pub rpd: Option<u64>,
    /// Its tokens per day.
    #[serde(default)]
    pub tpd: Option<u64>,
    /// Its limits for some models, within its own (their `name` is unused).
    #[serde(default)]
    pub model_limits: Vec<super::ModelLimitConfig>,
    /// Time to first byte, in milliseconds.
    #[serde(default)]
    pub latency_ms: u64,
}

impl BuiltinMockConfig {
    /// Its limits as a quota. (The mock's limits are exact and fixed per minute:
    /// a gateway scope's `algorithm` and `burst` do not apply, so they are not
    /// fields here and a config setting them is refused.)
    pub fn quota(&self) -> Quota {
        Quota {
            rpm: self.rpm,
            tpm: self.tpm,
            itpm: self.itpm,
            otpm: self.otpm,
            rpd: self.rpd,
            tpd: self.tpd,
            concurrency: self.concurrency,
            ..Quota::default()
        }
    }
}
