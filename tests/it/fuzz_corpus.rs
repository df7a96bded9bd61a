//! The fuzz targets (`fuzz/targets.rs`) on stable: each target's committed
//! corpus, and mutations of it, through the same functions `cargo fuzz`
//! drives. Coverage-guided runs are `scripts/fuzz.sh` (nightly, docs/fuzzing.md);
//! this is the smoke run CI makes of every target, and it keeps every past
//! finding (saved into the corpus) fixed.

#![allow(clippy::unwrap_used)] // test support: a failed unwrap is a failed test

#[allow(dead_code)] // the replay below reads the table; cargo fuzz calls the rest
#[path = "../../fuzz/targets.rs"]
mod targets;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

/// Mutations of each corpus entry.
const MUTATIONS: usize = 200;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    entries.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

/// One of libFuzzer's simple mutations of `input`, `other` a splice partner.
fn mutate(rng: &mut SmallRng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let at = rng.random_range(0..=out.len());
        match rng.random_range(0..6) {
            0 if at < out.len() => out[at] ^= 1 << rng.random_range(0..8),
            1 if at < out.len() => out[at] = rng.random(),
            2 => out.insert(at, rng.random()),
            3 if at < out.len() => {
                out.remove(at);
            }
            4 => out.truncate(at),
            _ => {
                let from = rng.random_range(0..=other.len());
                out.splice(at.., other[from..].iter().copied());
            }
        }
    }
    out
}

#[test]
fn every_fuzz_target_survives_its_corpus_and_mutations_of_it() {
    for (name, target) in targets::TARGETS {
        let entries = corpus(name);
        assert!(!entries.is_empty(), "no corpus for {name}");
        let mut rng = SmallRng::seed_from_u64(7);
        for (i, entry) in entries.iter().enumerate() {
            target(entry);
            let other = &entries[(i + 1) % entries.len()];
            for _ in 0..MUTATIONS {
                let input = mutate(&mut rng, entry, other);
                let outcome = std::panic::catch_unwind(|| target(&input));
                assert!(outcome.is_ok(), "{name} failed on {input:?}");
            }
        }
    }
}
