//! # tollgate-jepsen
//!
//! A partition-testing harness: real tollgate nodes as
//! separate processes, each in its own Linux network namespace on a bridge the
//! harness creates and always tears down, in front of a real mock upstream whose
//! JSONL log is the ground truth; a skewed, bursty, multi-tenant workload recorded
//! as a history; a seeded nemesis schedule (partitions, kill -9, SIGSTOP, restart,
//! packet loss, Redis kill); and a pure checker of each mode's promise. See
//! docs/jepsen.md.
//!
//! - [`hosts`]: namespaces, veths, the bridge, cuts.
//! - [`procs`]: node and mock processes (kill -9, pause, restart, stop).
//! - [`nemesis`]: the faults, scheduled from the seed on one timeline.
//! - [`intruder`]: the `intruder` nemesis's processes without the secret.
//! - [`workload`]: the clients (tenants, streams, lanes, retry-after).
//! - [`tasks`]: the seed scenario's task workers.
//! - [`run`]: one run, end to end, and its report.
//! - [`checker`]: the checks, pure.
//! - [`timeline`]: the run's timeline picture (SVG).
//! - [`bench`]: accuracy against throughput over a matrix of runs.

pub mod bench;
pub mod checker;
pub mod hosts;
pub mod intruder;
pub mod nemesis;
pub mod procs;
pub mod run;
pub mod tasks;
pub mod timeline;
pub mod workload;
