//! # Operations
//!
//! - [`metrics`]: the Prometheus registry and every `tollgate_*` metric.
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`, `/admin/keys/{key}`.

pub mod admin;
pub mod metrics;
