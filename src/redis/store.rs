//! The Redis client: one multiplexed, reconnecting connection (redis-rs
//! `ConnectionManager`, or a cluster connection for Redis Cluster), every script
//! call bounded by the configured timeout (default 15 ms) and measured
//! (`tollgate_redis_script_seconds{script}`, `tollgate_redis_errors_total`).

use super::keys::ScopeKeys;
use super::scripts;
use crate::ops::metrics::Metrics;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, ScriptInvocation};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tollgate_cluster::lease::line::{SyncReply, SyncRequest};

/// How one window dimension is limited in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Not limited.
    None,
    /// Bucketed sliding window with buckets of `bucket_ms`.
    Window {
        /// Bucket width.
        bucket_ms: u64,
    },
    /// GCRA with a burst of `burst` units.
    Gcra {
        /// Burst (at most the capacity).
        burst: u64,
    },
    /// Exact sliding log.
    Log,
}

/// One window dimension: algorithm, capacity L per `window_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DimSpec {
    /// Algorithm.
    pub algorithm: Algorithm,
    /// Capacity L.
    pub capacity: u64,
    /// Window W.
    pub window_ms: u64,
}

impl DimSpec {
    /// A dimension that is not limited.
    pub const NONE: DimSpec = DimSpec {
        algorithm: Algorithm::None,
        capacity: 0,
        window_ms: 0,
    };

    fn args(&self) -> [String; 4] {
        let (alg, p) = match self.algorithm {
            Algorithm::None => ("none", 0),
            Algorithm::Window { bucket_ms } => ("window", bucket_ms),
            Algorithm::Gcra { burst } => ("gcra", burst),
            Algorithm::Log => ("log", 0),
        };
        [
            alg.to_owned(),
            self.capacity.to_string(),
            self.window_ms.to_string(),
            p.to_string(),
        ]
    }
}

/// One request's reservation on one scope.
#[derive(Debug, Clone)]
pub struct Reservation {
    /// The window dimensions: requests, tokens, input tokens, output tokens,
    /// requests and tokens per day (`crate::actor::Dimension::WINDOWED` order;
    /// [`DimSpec::NONE`] when not limited).
    pub windows: [DimSpec; crate::actor::WINDOWS],
    /// Its tokens: the prompt and the completion estimate.
    pub cost: crate::actor::scope::Cost,
    /// Concurrency cap (0: none).
    pub concurrency: u64,
    /// Semaphore member for this request.
    pub permit_id: String,
    /// Slot ttl: a crashed holder's slot comes back after it.
    pub slot_ttl_ms: u64,
}

impl Reservation {
    /// What the reservation charges `dimension`'s window.
    pub fn cost_on(&self, dimension: crate::actor::Dimension) -> u64 {
        self.cost.on(dimension)
    }
}

/// What a reservation comes to when it is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Requests: 1 if it counts, 0 if it never reached the upstream.
    pub requests: u64,
    /// Its real tokens (input with cache reads where the scope counts them).
    pub tokens: crate::actor::scope::Cost,
}

/// One key's credit line as `lease.lua` enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseLine {
    /// Windowed (requests, tokens) or slots (concurrency).
    pub windowed: bool,
    /// Capacity L.
    pub capacity: u64,
    /// Window W.
    pub window_ms: u64,
    /// Bucket width w.
    pub bucket_ms: u64,
    /// Most credit per holder (stretched to one large request).
    pub max_credit: u64,
    /// Credit life.
    pub ttl_ms: u64,
}

/// A holder's reservation request in `redis-lease`: the share of L it asks Redis
/// to reserve for it (what it spends per window if Redis is lost) and how far
/// beyond it it may commit from room nobody reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserve {
    /// Its demand-weighted share of L (gossip).
    pub share: u64,
    /// Borrowing beyond the reservation.
    pub borrow: u64,
}

/// What a `lease.lua` statement asks besides the statement itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeaseAsk<'a> {
    /// `None`: no reservation and no cap (a bare credit line).
    pub reserve: Option<Reserve>,
    /// Members whose reservations Redis keeps however stale their accounts: those
    /// that announced they lost Redis, and those gossip cannot reach; each with
    /// the floor it is charged if Redis has no account of it (its share here).
    pub held: &'a [(String, u64)],
}

/// `lease.lua`'s answer: the reply and the reservation Redis now holds for the
/// holder (its cut-off share if Redis is lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leased {
    /// Credit, grant and ttl.
    pub reply: SyncReply,
    /// The holder's reservation per window.
    pub reserved: u64,
    /// Redis `TIME` when it answered (Unix ms): against the holder's clock, the
    /// skew the bucket shift corrects (the lease audit records both).
    pub redis_ms: u64,
}

/// What `reserve` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// Charged on every dimension; the refs settle it.
    Admitted {
        /// Per window dimension: its ref (bucket id, log member or "0").
        refs: [String; crate::actor::WINDOWS],
        /// Redis time of the decision (ms).
        now_ms: u64,
    },
    /// Charged nowhere.
    Refused {
        /// `requests`, `tokens`, `input_tokens`, `output_tokens` or
        /// `concurrency`.
        dimension: String,
        /// When trying again can help; `None`: never (cost above the capacity).
        retry_after_ms: Option<u64>,
    },
}

/// Why a Redis call gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No answer within the configured timeout.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// Connection or protocol error.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The script answered something it never answers.
    #[error("unexpected answer from {script}: {detail}")]
    Unexpected {
        /// Which script.
        script: &'static str,
        /// What came back.
        detail: String,
    },
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A Redis server or cluster running tollgate's scripts.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    timeout: Duration,
    metrics: Option<Arc<Metrics>>,
    batches: Arc<super::batch::Batches>,
}

impl RedisStore {
    /// A store on one server at `url` (`redis://host:port/db`). Connects lazily and
    /// reconnects by itself, so a node starts (degraded) while Redis is down.
    pub fn single(
        url: &str,
        timeout: Duration,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let manager = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(RedisStore {
            conn: Conn::Single(manager),
            timeout,
            metrics,
            batches: Arc::default(),
        })
    }

    /// A store on a Redis Cluster reached through `urls` (any of its nodes).
    pub async fn cluster(
        urls: &[String],
        timeout: Duration,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<RedisStore, StoreError> {
        let client = redis::cluster::ClusterClientBuilder::new(urls.to_vec())
            .response_timeout(timeout)
            .connection_timeout(timeout.max(Duration::from_millis(100)))
            .build()?;
        let conn = client.get_async_connection().await?;
        Ok(RedisStore {
            conn: Conn::Cluster(conn),
            timeout,
            metrics,
            batches: Arc::default(),
        })
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The node's metrics, if the store records into them.
    pub fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    async fn run<T: FromRedisValue>(
        &self,
        script: &'static str,
        invocation: ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let call = async {
            match self.conn.clone() {
                Conn::Single(mut c) => invocation.invoke_async(&mut c).await,
                Conn::Cluster(mut c) => invocation.invoke_async(&mut c).await,
            }
        };
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        };
        if let Some(m) = &self.metrics {
            let kind = match &result {
                Ok(_) => None,
                Err(StoreError::Timeout(_)) => Some("timeout"),
                Err(_) => Some("error"),
            };
            m.redis_call(script, started.elapsed().as_secs_f64(), kind);
        }
        result
    }

    pub(super) fn batches(&self) -> &Arc<super::batch::Batches> {
        &self.batches
    }

    /// Reserves one request on every dimension of `keys`' scope, or on none. Sent
    /// at once when no call for the scope is in flight; otherwise batched with
    /// the others that arrive meanwhile ([`super::batch`]), decided as if one at a
    /// time.
    pub async fn reserve(&self, keys: &ScopeKeys, r: &Reservation) -> Result<Reserved, StoreError> {
        super::batch::reserve(self, keys, r).await
    }

    /// Reserves `rs` (same scope, same limits) in one atomic call, decided in
    /// order as separate [`Self::reserve`] calls would be: one answer each.
    pub async fn reserve_many(
        &self,
        keys: &ScopeKeys,
        rs: &[Reservation],
    ) -> Result<Vec<Reserved>, StoreError> {
        let Some(first) = rs.first() else {
            return Ok(Vec::new());
        };
        let mut inv = scripts::RESERVE.prepare_invoke();
        for key in &keys.windows {
            inv.key(key);
        }
        inv.key(&keys.concurrency).arg(rs.len());
        for window in &first.windows {
            inv.arg(&window.args()[..]);
        }
        inv.arg(first.concurrency);
        for r in rs {
            inv.arg(r.cost.tokens())
                .arg(r.cost.input)
                .arg(r.cost_on(crate::actor::Dimension::OutputTokens))
                .arg(&r.permit_id)
                .arg(r.slot_ttl_ms);
        }
        // Batches are measured apart: their latency is one call's for many.
        let label = if rs.len() == 1 {
            "reserve"
        } else {
            "reserve_many"
        };
        let answers: Vec<Vec<redis::Value>> = self.run(label, inv).await?;
        if answers.len() != rs.len() {
            return Err(StoreError::Unexpected {
                script: label,
                detail: format!("{} answers for {} reservations", answers.len(), rs.len()),
            });
        }
        answers.iter().map(|a| parse_reserved(a)).collect()
    }

    /// One reservation, one call.
    pub(super) async fn reserve_one(
        &self,
        keys: &ScopeKeys,
        r: &Reservation,
    ) -> Result<Reserved, StoreError> {
        let mut answers = self.reserve_many(keys, std::slice::from_ref(r)).await?;
        answers.pop().ok_or_else(|| StoreError::Unexpected {
            script: "reserve",
            detail: "no answer".to_owned(),
        })
    }

    /// Settles a reservation: each dimension to its real cost, moved to the bucket
    /// of the upstream's answer when there was one (`answered_ago_ms` before now:
    /// the provider counted the request by then), its slot freed. Returns the
    /// corrections applied `(requests, tokens)`.
    pub async fn settle(
        &self,
        keys: &ScopeKeys,
        r: &Reservation,
        refs: &[String; crate::actor::WINDOWS],
        actual: Settled,
        answered_ago_ms: Option<u64>,
    ) -> Result<Vec<i64>, StoreError> {
        use crate::actor::Dimension;
        let mut inv = scripts::SETTLE.prepare_invoke();
        let permit = if r.concurrency > 0 {
            r.permit_id.as_str()
        } else {
            ""
        };
        for key in &keys.windows {
            inv.key(key);
        }
        inv.key(&keys.concurrency)
            .arg(permit)
            .arg(answered_ago_ms.map_or(-1, |ms| ms.min(i64::MAX as u64) as i64));
        let windows = r.windows.iter().zip(refs).zip(Dimension::WINDOWED);
        for ((window, reference), dimension) in windows {
            let actual = match dimension {
                Dimension::Requests | Dimension::RequestsPerDay => actual.requests,
                _ => actual.tokens.on(dimension),
            };
            inv.arg(&window.args()[..])
                .arg(reference)
                .arg(r.cost_on(dimension))
                .arg(actual);
        }
        self.run("settle", inv).await
    }

    /// Runs a semaphore operation (`acquire`, `heartbeat`, `release`).
    pub async fn semaphore(
        &self,
        key: &str,
        op: &str,
        permit_id: &str,
        cap: u64,
        ttl_ms: u64,
    ) -> Result<i64, StoreError> {
        let mut inv = scripts::SEMAPHORE.prepare_invoke();
        inv.key(key).arg(op).arg(permit_id).arg(cap).arg(ttl_ms);
        self.run("semaphore", inv).await
    }

    /// States `holder`'s credit line for one key to Redis (`redis-lease` mode) and
    /// returns the owner's reply with the holder's reservation, or the script's
    /// refusal (`stale`).
    pub async fn lease(
        &self,
        key: &str,
        holder: &str,
        line: &LeaseLine,
        request: &SyncRequest,
        ask: &LeaseAsk<'_>,
    ) -> Result<Result<Leased, String>, StoreError> {
        let mut inv = scripts::LEASE.prepare_invoke();
        let kind = if line.windowed { "window" } else { "slots" };
        let (reserve, borrow) = match ask.reserve {
            Some(r) => (r.share.min(i64::MAX as u64) as i64, r.borrow),
            None => (-1, 0),
        };
        inv.key(key)
            .arg(holder)
            .arg(kind)
            .arg(line.capacity)
            .arg(line.window_ms)
            .arg(line.bucket_ms)
            .arg(line.max_credit)
            .arg(line.ttl_ms)
            .arg(request.seq)
            .arg(request.remaining)
            .arg(request.want)
            .arg(reserve)
            .arg(borrow)
            .arg(tollgate_cluster::lease::line::SKEW_TOLERANCE_MS)
            .arg(ask.held.len());
        for (member, floor) in ask.held {
            inv.arg(member).arg(*floor);
        }
        for (bucket, cost) in &request.usage {
            inv.arg(*bucket).arg(*cost);
        }
        let answer: Vec<redis::Value> = self.run("lease", inv).await?;
        let int = |v: &redis::Value| redis::from_redis_value_ref::<i64>(v).ok();
        match answer.as_slice() {
            [credit, granted, ttl, reserved, redis_ms] => {
                match (
                    int(credit),
                    int(granted),
                    int(ttl),
                    int(reserved),
                    int(redis_ms),
                ) {
                    (Some(c), Some(g), Some(t), Some(r), Some(now))
                        if c >= 0 && g >= 0 && t > 0 && r >= 0 && now >= 0 =>
                    {
                        Ok(Ok(Leased {
                            reply: SyncReply {
                                credit: c as u64,
                                granted: g as u64,
                                ttl_ms: t as u64,
                                // Cut off from Redis, a holder spends its
                                // reservation (`reserved`), not a told share.
                                cut_off_share: 0,
                            },
                            reserved: r as u64,
                            redis_ms: now as u64,
                        }))
                    }
                    _ => Err(StoreError::Unexpected {
                        script: "lease",
                        detail: format!("{answer:?}"),
                    }),
                }
            }
            [_, reason] => {
                Ok(Err(redis::from_redis_value_ref::<String>(reason)
                    .unwrap_or_else(|_| "refused".into())))
            }
            _ => Err(StoreError::Unexpected {
                script: "lease",
                detail: format!("{answer:?}"),
            }),
        }
    }

    /// Adds `(bucket, cost)` spending into the window `key` (reconciliation),
    /// the buckets on the gateway's clock as it stood at `sent_ms`: Redis shifts
    /// them by how far that clock runs behind its own (beyond the skew
    /// tolerance) and counts one ahead of its current bucket in it. Returns what
    /// was added (buckets that left the window add nothing).
    pub async fn charge(
        &self,
        key: &str,
        (window_ms, bucket_ms): (u64, u64),
        sent_ms: u64,
        pairs: &[(u64, u64)],
    ) -> Result<u64, StoreError> {
        let mut inv = scripts::CHARGE.prepare_invoke();
        inv.key(key)
            .arg(window_ms)
            .arg(bucket_ms)
            .arg(sent_ms)
            .arg(tollgate_cluster::lease::line::SKEW_TOLERANCE_MS);
        for (bucket, cost) in pairs {
            inv.arg(*bucket).arg(*cost);
        }
        self.run("charge", inv).await
    }

    /// Runs a plain command (tests and tools: `SCRIPT FLUSH`, `PING`).
    pub async fn command<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let call = async {
            match self.conn.clone() {
                Conn::Single(mut c) => c.req_packed_command(cmd).await,
                Conn::Cluster(mut c) => c.req_packed_command(cmd).await,
            }
        };
        match tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), call).await {
            Ok(Ok(value)) => redis::from_redis_value(value).map_err(|e| StoreError::Unexpected {
                script: "command",
                detail: e.to_string(),
            }),
            Ok(Err(e)) => Err(StoreError::Redis(e)),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
    }
}

fn parse_reserved(answer: &[redis::Value]) -> Result<Reserved, StoreError> {
    let unexpected = || StoreError::Unexpected {
        script: "reserve",
        detail: format!("{answer:?}"),
    };
    let int = |v: &redis::Value| redis::from_redis_value_ref::<i64>(v).ok();
    let text = |v: &redis::Value| redis::from_redis_value_ref::<String>(v).ok();
    match answer {
        [ok, refs @ .., now] if int(ok) == Some(1) && refs.len() == crate::actor::WINDOWS => {
            let refs: Vec<String> =
                (refs.iter().map(|r| text(r).ok_or_else(unexpected))).collect::<Result<_, _>>()?;
            Ok(Reserved::Admitted {
                refs: refs.try_into().map_err(|_| unexpected())?,
                now_ms: int(now).ok_or_else(unexpected)? as u64,
            })
        }
        [ok, dim, retry] if int(ok) == Some(0) => {
            let retry = int(retry).ok_or_else(unexpected)?;
            Ok(Reserved::Refused {
                dimension: text(dim).ok_or_else(unexpected)?,
                retry_after_ms: u64::try_from(retry).ok(),
            })
        }
        _ => Err(unexpected()),
    }
}
