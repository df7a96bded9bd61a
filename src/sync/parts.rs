//! The parts of a node that cluster sync works on, as narrow shared handles. The
//! server builds them once with the node and hands the same handles to the
//! request path, so sync never sees the request path itself: a request a peer
//! spills here reaches the proxy through [`SpilledRequests`], a callback the
//! server wires in.

use super::lease::owner::OwnerBook;
use super::spill::Board;
use super::status::ClusterStatus;
use crate::actor::credit::CreditTable;
use crate::actor::{Binding, Registry};
use crate::config::{LimitDefaults, RedisConfig};
use crate::ops::metrics::Metrics;
use crate::redis::gate::RedisGate;
use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::future::BoxFuture;
use parking_lot::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use tokio::sync::Notify;

/// Serves a request a peer spilled here: the API's name from the route
/// (`chat`, `messages`, ...), the request's headers and body. Answers 404 for an
/// API it does not know.
pub(crate) type SpilledRequests =
    Arc<dyn Fn(String, HeaderMap, Body) -> BoxFuture<'static, Response> + Send + Sync>;

/// What sync reads and writes of its node.
pub struct NodeParts {
    /// The node's limiter actors (exports, wake-ups, the clock).
    pub registry: Arc<Registry>,
    /// The keys whose cluster bound sync maintains.
    pub bindings: Arc<[Binding]>,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// The limits' window and buckets.
    pub limits: LimitDefaults,
    /// `[redis]`, for the Redis modes.
    pub redis: Option<RedisConfig>,
    /// Leased modes: the credit of each key used here.
    pub credits: Option<Arc<CreditTable>>,
    /// Rung by an actor that runs low on credit: wakes the holder loop.
    pub credit_wake: Arc<Notify>,
    /// Set for good once a newer process runs under this node's `node_id`: the
    /// request path then admits nothing more.
    pub superseded: Arc<AtomicBool>,
    /// Spillover's board, which each round's room is written to.
    pub spill: Option<Arc<Board>>,
    /// Serves requests peers spill here (spillover on).
    pub spilled: Option<SpilledRequests>,
    /// The largest request body the proxy reads (a spilled one's bound too).
    pub max_body_bytes: usize,
    /// What `/admin/cluster` shows.
    pub cluster_status: Option<Arc<Mutex<ClusterStatus>>>,
    /// `lease` mode: the lines this node owns, set once the cluster starts.
    pub lease_book: Arc<OnceLock<Arc<OwnerBook>>>,
    /// `redis` mode: the gate every admission goes through, set once the
    /// cluster starts.
    pub redis_gate: Arc<OnceLock<Arc<RedisGate>>>,
}
