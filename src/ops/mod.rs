//! # Operations
//!
//! - [`metrics`]: the Prometheus registry and every `tollgate_*` metric (the
//!   routes that serve them, `/metrics` and the admin API, are the server's:
//!   `server::admin`).

pub mod metrics;
