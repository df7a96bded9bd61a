//! Health, readiness, metrics and admin endpoints.
