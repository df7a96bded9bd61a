//! Placeholder for the load generator (`tollgate load`).
