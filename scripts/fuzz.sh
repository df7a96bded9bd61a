#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo-fuzz, libFuzzer, nightly) of every target in
# fuzz/, or of those named: FUZZ_SECONDS each (default 600). New inputs go to
# fuzz/work/<target> (not committed); the committed seeds in fuzz/corpus/ are
# read only. A crash leaves its input in fuzz/artifacts/<target>/: fix it, then
# add the input to fuzz/corpus/<target>/ so the stable replay
# (tests/it/fuzz_corpus.rs) keeps it fixed. See docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
seconds=${FUZZ_SECONDS:-600}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(request sse cluster_wire config limiter)
for target in "${targets[@]}"; do
  mkdir -p "work/$target"
  echo "== $target: ${seconds}s"
  cargo +nightly fuzz run "$target" "work/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=4096 -print_final_stats=1
done
