#!/usr/bin/env bash
# Instructions per proxied request, counted by callgrind: a measure the VM's
# speed does not move (wall-clock runs here spread by 10-40% between hours), so
# two builds can be compared side by side to within a fraction of a percent.
# Each binary in turn serves as a lease-mode node (config/bench-lease.toml, one
# tokio worker) under valgrind; the mock upstream runs natively. After 500
# warm-up requests the counters are zeroed, then N requests (64 connections) are
# counted: user-space work only (the kernel's share of a request is not seen).
# Usage: scripts/investigate/bench-instructions.sh BINARY... [--requests N, default 3000] [--rounds R, default 2]
# e.g.   git worktree add /tmp/base HEAD~1 && cargo build --release --manifest-path /tmp/base/Cargo.toml
#        scripts/investigate/bench-instructions.sh /tmp/base/target/release/tollgate target/release/tollgate
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "valgrind not installed (apt-get install valgrind)" >&2; exit 1; }
command -v callgrind_control >/dev/null || { echo "callgrind_control not installed (valgrind)" >&2; exit 1; }
bins=() n=3000 rounds=2
while (($#)); do
  case $1 in
    --requests) n=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) [[ -x $1 ]] || { echo "not an executable: $1" >&2; exit 1; }; bins+=("$(realpath "$1")"); shift ;;
  esac
done
((${#bins[@]})) || { sed -n 2,12p "$0" >&2; exit 1; }
cargo build --release --bin tollgate >&2
load=target/release/tollgate
export TOKIO_WORKER_THREADS=1
out=$(mktemp -d)
"$load" mock-upstream --listen 127.0.0.1:9190 --completion-tokens 16..16 >/dev/null 2>&1 &
mock=$!
node=
trap 'kill $mock $node 2>/dev/null; wait 2>/dev/null; rm -rf "$out"' EXIT
send() { "$load" load --url http://127.0.0.1:8191/v1 --api-key sk-bench --concurrency 64 --no-progress "$@" >/dev/null; }
echo "| binary | round | instructions per request |"
echo "|---|---|---|"
for round in $(seq "$rounds"); do
  for bin in "${bins[@]}"; do
    RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
      "$bin" serve --config config/bench-lease.toml >"$out/valgrind.log" 2>&1 &
    node=$!
    for _ in $(seq 300); do curl -s -o /dev/null http://127.0.0.1:8191/ && break; sleep 0.2; done
    send --requests 500
    callgrind_control -z "$node" >/dev/null
    send --requests "$n" --json "$out/run.json"
    callgrind_control -d "$node" >/dev/null
    kill "$node"; wait "$node" 2>/dev/null || true; node=
    ir=$(grep -h -E "^(summary|totals):" "$out"/cg.*.1 | head -1 | awk '{print $2}')
    rm -f "$out"/cg.*
    python3 - "$out/run.json" "$n" "$ir" "$bin" "$round" <<'PY'
import json, sys
run, n, ir, name, round_ = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
o = json.load(open(run))["outcomes"]
assert o["ok"] == o["total"] == n, o  # every counted request served
print(f"| {name} | {round_} | {ir / n:,.0f} |")
PY
  done
done
