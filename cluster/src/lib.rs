//! # tollgate-cluster
//!
//! Home of the cluster layer (issue 3): membership over chitchat, CRDT usage
//! counters, the lease ledger and the sync-mode trait. It holds no code yet, on
//! purpose: a single node (the `tollgate` crate) does not depend on it, and nothing
//! here pretends to work before it is built and tested.
