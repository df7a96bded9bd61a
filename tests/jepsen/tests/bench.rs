//! `bench --quick` in CI (issue 6): the small accuracy-against-throughput matrix
//! runs end to end with real processes, every cell serves, every synced mode keeps
//! its promise and publishes its sync traffic. (That `local full` overshoots is
//! proven by `promises.rs`; here its overshoot is small, because every node cools
//! the upstream down on the mock's first 429 or `remaining: 0` header.) Needs
//! root, like the rest of the harness. Its cells take subnets 68-79.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

use std::path::PathBuf;
use tollgate_jepsen::bench::{BenchSpec, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quick_matrix_measures_every_mode() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bench-quick");
    let spec = BenchSpec::quick(
        PathBuf::from(env!("CARGO_BIN_EXE_tollgate-jepsen")),
        dir,
        68,
    );
    let cells = run(&spec).await.unwrap();
    let table = std::fs::read_to_string(spec.dir.join("results.md")).unwrap();
    println!("{table}");
    assert_eq!(cells.len(), spec.modes.len() * spec.patterns.len());
    for cell in &cells {
        let name = format!("{} {}", cell.mode, cell.pattern);
        assert!(cell.requests_per_s > 0.0, "{name} served nothing: {table}");
        if cell.mode != "local-full" {
            assert!(cell.promise_kept, "{name} broke its promise: {table}");
        }
        if cell.mode == "gossip" || cell.mode.contains("lease") {
            assert!(
                cell.sync_bytes_per_s > 0.0,
                "{name} published nothing: {table}"
            );
        }
    }
}
