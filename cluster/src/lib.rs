//! # tollgate-cluster
//!
//! The cluster layer: how tollgate nodes find each other and share what
//! they spent, so every tenant and upstream limit holds cluster-wide without Redis.
//!
//! - [`membership`]: chitchat (pinned 0.13.0): node id with generation, cluster id,
//!   seeds re-resolved by DNS, phi-accrual failure detection, node metadata, and the
//!   replicated per-node key-value state the counters live in.
//! - [`counter`]: CRDT usage counters: each node's single-writer per-bucket
//!   consumption per key, published coalesced into a fixed ring of keys; global
//!   usage is the sum over live members. Pure.
//! - [`share`]: demand-weighted shares of a capacity that always sum to it. Pure.
//! - [`lease`]: `lease` mode's core: rendezvous ownership, the owner's credit line
//!   per key and holder, and the holder's budget with its cut-off policy. Pure.

pub mod auth;
pub mod counter;
pub mod lease;
pub mod maps;
pub mod membership;
pub mod share;

/// chitchat itself, for its transports (`UdpTransport`, `ChannelTransport`).
pub use chitchat;
