//! `bench --quick` in CI: the small accuracy-against-throughput matrix
//! runs end to end with real processes, every cell serves, every synced mode keeps
//! its promise and publishes its sync traffic. (That `local full` overshoots is
//! proven by `promises.rs`, and shows here too; it is not asserted, being the
//! baseline.) Then the
//! seed scenario's quick cells: the uncoordinated workers meet the provider's
//! 429s, lease mode with either estimate meets none and completes tasks. Needs
//! root, like the rest of the harness. Its cells take subnets 68-82.

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
    let results = run(&spec).await.unwrap();
    let table = std::fs::read_to_string(spec.dir.join("results.md")).unwrap();
    println!("{table}");
    let cells = &results.matrix;
    assert_eq!(cells.len(), spec.modes.len() * spec.patterns.len());
    for cell in cells {
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
    assert_eq!(results.seed.len(), spec.seed_cells.len());
    for seed in &results.seed {
        let name = format!("seed scenario {} {}", seed.mode, seed.estimate);
        assert!(
            seed.tasks_per_window > 0.0,
            "{name} completed nothing: {table}"
        );
        if seed.mode == "direct" {
            assert!(seed.upstream_429s > 0, "{name} met no 429: {table}");
        } else {
            assert_eq!(seed.promise_kept, Some(true), "{name}: {table}");
            assert_eq!(seed.upstream_429s, 0, "{name}: {table}");
        }
    }
    for svg in ["accuracy-vs-throughput.svg", "latency-cdf-uniform-3n.svg"] {
        let picture = std::fs::read_to_string(spec.dir.join(svg)).unwrap();
        assert!(
            picture.contains("<circle") || picture.contains("<polyline"),
            "{svg}"
        );
    }
}
