//! # tollgate: a clustered gateway for LLM APIs
//!
//! ## Layout
//!
//! - [`config`]: the TOML configuration, strict, with cross-field validation.
//! - [`limiter`]: pure, clock-injected rate-limit algorithms (sliding window, GCRA,
//!   sliding log) with two-phase reservation and exact retry-after.
//! - [`actor`]: per-tenant and per-upstream limiter actors on tokio tasks: lanes,
//!   queues, permits settled exactly once.
//! - [`tokens`]: token counting as OpenAI counts it (tiktoken-rs), shared by the
//!   estimator and the mock upstream.
//! - [`proxy`]: the axum app: OpenAI and Anthropic routes, estimation, routing to
//!   upstreams with fallback and retries, streaming with usage capture.
//! - [`ops`]: metrics, health and admin endpoints.
//! - [`server`]: binds the listener, runs the app, drains on shutdown.
//! - [`listen`]: the inbound listeners: header and body timeouts, connection caps,
//!   the open-file limit.
//! - [`sync`]: joins a cluster and keeps every limit's cluster bound current
//!   (allowances for `local`/`gossip`, leased credit for `lease`).
//! - [`redis`]: the optional Redis strict modes: Lua scripts and their client.
//! - [`up`]: `tollgate up`, a local cluster on 127.0.0.1.
//! - [`mock`]: the mock upstream, a strict and honest stand-in for a provider whose
//!   log is the ground truth.
//! - [`load`]: the LLM-aware load generator behind `tollgate load`.
//! - [`faults`]: deliberate faults for the jepsen harness (feature
//!   `fault-injection`, test builds only).

pub mod actor;
pub(crate) mod api;
pub mod audit;
pub mod clock;
pub mod config;
pub mod faults;
#[doc(hidden)]
pub mod fuzzing;
pub mod limiter;
pub mod listen;
pub mod load;
pub mod mock;
pub mod ops;
pub mod proxy;
pub mod redis;
pub mod server;
pub(crate) mod sync;
pub mod tokens;
pub mod up;
pub mod upstream_http;
