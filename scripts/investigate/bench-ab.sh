#!/usr/bin/env bash
# A/B of two serving binaries at 64 connections, runs alternated, with the mock
# and the load generator held fixed (one binary), so only the node differs. Prints
# one line per run: binary, req/s, p50, p99 (ms), the node's CPU per request (us,
# utime + stime from /proc), then the medians. Usage:
#   scripts/investigate/bench-ab.sh FIXED_BIN BIN_A BIN_B   (env: ROUNDS=8 SECS=6 CONF=config/bench-lease.toml PORT=8191)
set -euo pipefail
cd "$(dirname "$0")/../.."
fixed=$1; shift
secs=${SECS:-6} conf=${CONF:-config/bench-lease.toml} port=${PORT:-8191}
out=$(mktemp -d)
"$fixed" mock-upstream --listen 127.0.0.1:9190 --completion-tokens 16..16 >/dev/null 2>&1 &
mock=$!
trap 'kill $mock 2>/dev/null; wait 2>/dev/null; rm -rf "$out"' EXIT
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for _ in $(seq "${ROUNDS:-8}"); do
  for bin in "$@"; do
    RUST_LOG=warn "$bin" serve --config "$conf" >/dev/null 2>&1 &
    node=$!
    for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.1; done
    sleep 0.5
    before=$(cpu $node)
    "$fixed" load --url "http://127.0.0.1:$port/v1" --api-key sk-bench --duration "${secs}s" \
      --no-progress --json "$out/run.json" --concurrency 64 >/dev/null
    after=$(cpu $node)
    kill $node; wait $node 2>/dev/null || true
    python3 - "$out/run.json" "$bin" "$before" "$after" <<'PY' | tee -a "$out/lines"
import json, sys
x = json.load(open(sys.argv[1])); n = x["outcomes"]["total"]
ticks = float(sys.argv[4]) - float(sys.argv[3])  # clock ticks of 10 ms
assert x["outcomes"]["ok"] == n, x["outcomes"]
print(sys.argv[2], round(x["throughput"]["ok_per_s"]), x["latency_ms"]["p50"], x["latency_ms"]["p99"], round(ticks * 1e4 / n, 1))
PY
  done
done
python3 - "$out/lines" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, *figures = line.split()
    runs[name].append([float(f) for f in figures])
for name, rows in runs.items():
    med = [statistics.median(r[i] for r in rows) for i in range(4)]
    print(f"median of {len(rows)}: {name}: {med[0]:,.0f} req/s, p50 {med[1]:.2f} ms, p99 {med[2]:.2f} ms, {med[3]:.1f} us CPU per request")
PY
