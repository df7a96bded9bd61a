//! tollgate's integration tests, linked once into one binary: each module is one
//! area, run against real sockets, the real mock upstream (its log is the ground
//! truth) and real Redis servers the tests start. `cargo test --test it MODULE::`
//! runs one area. `tests/scale.rs` stays a binary of its own: it counts the
//! process's heap with a global allocator, which other tests would disturb.

#![allow(clippy::too_many_lines)] // a test reads top to bottom as one story

#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod cluster_lease;
mod cluster_redis;
mod cluster_spill;
mod conformance;
mod connections;
mod estimates;
mod fuzz_corpus;
mod layers;
mod mock_upstream;
mod ops;
mod product_words;
mod proxy_apis;
mod proxy_bad_input;
mod proxy_distrust;
mod proxy_limits;
mod proxy_sdk;
mod redis_scripts;
mod upstream_tls;
