//! # tollgate: a clustered gateway for LLM APIs
//!
//! ## Layout
//!
//! - [`limiter`]: pure, clock-injected rate-limit algorithms (sliding window, GCRA,
//!   sliding log) with two-phase reservation and exact retry-after.
//! - [`tokens`]: token counting as OpenAI counts it (tiktoken-rs), shared by the
//!   estimator and the mock upstream.
//! - [`mock`]: the mock upstream, a strict and honest stand-in for a provider whose
//!   log is the ground truth.
//! - [`load`]: the LLM-aware load generator behind `tollgate load`.

pub mod limiter;
pub mod load;
pub mod mock;
pub mod tokens;
