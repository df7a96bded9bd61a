//! `cargo fuzz run sse`: [`targets::sse`](../targets.rs).

#![no_main]

#[allow(dead_code)] // each binary runs one target
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::sse(data));
