//! Integration tests (placeholder).
