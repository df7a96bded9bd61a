#!/usr/bin/env bash
# End-to-end benchmark: clients straight to the mock vs through one tollgate node
# with limits on, side by side in one run, on this machine. Prints a Markdown table
# for docs/BENCHMARKS.md. Usage: scripts/bench-e2e.sh [seconds per run, default 10]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
bin=${TOLLGATE_BIN:-target/release/tollgate}
[[ -x $bin ]] || cargo build --release --bin tollgate
out=$(mktemp -d)
"$bin" mock-upstream --listen 127.0.0.1:9190 --completion-tokens 16..16 >/dev/null 2>&1 &
mock=$!
RUST_LOG=warn "$bin" serve --config config/bench.toml >/dev/null 2>&1 &
node=$!
trap 'kill $mock $node 2>/dev/null; wait 2>/dev/null; rm -rf "$out"' EXIT
for _ in $(seq 50); do curl -sf http://127.0.0.1:8190/readyz >/dev/null && break; sleep 0.1; done

run() { # name url extra-args...
  local name=$1 url=$2; shift 2
  "$bin" load --url "$url" --api-key sk-bench --duration "${secs}s" --no-progress --json "$out/$name.json" "$@" >/dev/null
}
run direct-64 http://127.0.0.1:9190/v1 --concurrency 64
run gateway-64 http://127.0.0.1:8190/v1 --concurrency 64
run direct-1k http://127.0.0.1:9190/v1 --rate 1000
run gateway-1k http://127.0.0.1:8190/v1 --rate 1000
run direct-c1 http://127.0.0.1:9190/v1 --concurrency 1
run gateway-c1 http://127.0.0.1:8190/v1 --concurrency 1

python3 - "$out" <<'PY'
import json, sys, os
d = sys.argv[1]
s = {n[:-5]: json.load(open(os.path.join(d, n))) for n in os.listdir(d)}
def rps(x): return x["throughput"]["ok_per_s"]
def pct(x, p): return x["latency_ms"][p]
print("| measure | direct to mock | through tollgate | tollgate / direct |")
print("|---|---|---|---|")
for tag, label in [("64", "64 connections, closed loop: req/s"), ("1k", "1,000 req/s open loop: p99 ms"), ("c1", "1 connection: p50 ms")]:
    a, b = s["direct-" + tag], s["gateway-" + tag]
    if tag == "64":
        va, vb = rps(a), rps(b)
    elif tag == "1k":
        va, vb = pct(a, "p99"), pct(b, "p99")
    else:
        va, vb = pct(a, "p50"), pct(b, "p50")
    print(f"| {label} | {va:.3f} | {vb:.3f} | {vb / va:.3f} |")
for tag in ["1k", "c1"]:
    a, b = s["direct-" + tag], s["gateway-" + tag]
    print(f"\nadded latency ({tag}): p50 {pct(b,'p50')-pct(a,'p50'):.3f} ms, p99 {pct(b,'p99')-pct(a,'p99'):.3f} ms")
for n in sorted(s):
    print(n, json.dumps(s[n]["outcomes"]))
PY
