//! # Operations
//!
//! - [`metrics`]: the Prometheus registry and every `tollgate_*` metric (the
//!   routes that serve them, `/metrics` and the admin API, are the server's:
//!   `server::admin`).
//! - [`connections`]: the listeners' connections and the descriptor limit.

pub mod connections;
pub mod metrics;
