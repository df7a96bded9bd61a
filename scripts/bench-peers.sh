#!/usr/bin/env bash
# Peer benchmark: clients straight to the mock vs through one tollgate node vs through
# one LiteLLM proxy (1 worker, scripts/peers/litellm-single.yaml), same mock, same run,
# this machine. Prints a Markdown table. Needs LiteLLM in a venv:
#   python3 -m venv /opt/litellm-venv && /opt/litellm-venv/bin/pip install 'litellm[proxy]'
# Usage: scripts/bench-peers.sh [seconds per run, default 10] [open-loop req/s, default 25]
# Keep the open-loop rate below what one LiteLLM worker sustains (the 64-connection
# row; ~45 req/s on a 2-core box) or its row measures queueing, not added latency.
# Env: TOLLGATE_BIN, LITELLM_BIN (default /opt/litellm-venv/bin/litellm),
#      LITELLM_PORT (default 4190), LITELLM_WORKERS (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
rate=${2:-25}
bin=${TOLLGATE_BIN:-target/release/tollgate}
litellm=${LITELLM_BIN:-/opt/litellm-venv/bin/litellm}
lport=${LITELLM_PORT:-4190}
workers=${LITELLM_WORKERS:-1}
[[ -x $bin ]] || cargo build --release --bin tollgate
[[ -x $litellm ]] || { echo "no LiteLLM at $litellm (see the header of $0)" >&2; exit 1; }
out=$(mktemp -d)
"$bin" mock-upstream --listen 127.0.0.1:9190 --completion-tokens 16..16 >/dev/null 2>&1 &
mock=$!
RUST_LOG=warn "$bin" serve --config config/bench.toml >/dev/null 2>&1 &
node=$!
# LITELLM_LOG=ERROR also sets uvicorn's log level (no access log); the local cost map
# avoids fetching model prices from GitHub at start-up; telemetry is off by default
# (no destination) and LITELLM_TELEMETRY_DISABLED pins it off.
LITELLM_LOG=ERROR LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY_DISABLED=true \
  "$litellm" --config scripts/peers/litellm-single.yaml --host 127.0.0.1 --port "$lport" \
  --num_workers "$workers" >"$out/litellm.log" 2>&1 &
lite=$!
trap 'kill $mock $node $lite 2>/dev/null; wait 2>/dev/null; rm -rf "$out"' EXIT
for _ in $(seq 50); do curl -sf http://127.0.0.1:8190/readyz >/dev/null && break; sleep 0.1; done
for _ in $(seq 240); do curl -sf "http://127.0.0.1:$lport/health/liveliness" >/dev/null && break; sleep 0.5; done
curl -sf "http://127.0.0.1:$lport/health/liveliness" >/dev/null || { tail -30 "$out/litellm.log" >&2; exit 1; }

declare -A urls=([direct]=http://127.0.0.1:9190/v1 [tollgate]=http://127.0.0.1:8190/v1 [litellm]=http://127.0.0.1:$lport/v1)
run() { # name url extra-args...
  local name=$1 url=$2; shift 2
  "$bin" load --url "$url" --api-key sk-bench --no-progress --json "$out/$name.json" "$@" >/dev/null
}
# Warm up every path (Python imports and first-call set-up would otherwise land in the
# first measured run); not measured.
for t in direct tollgate litellm; do
  "$bin" load --url "${urls[$t]}" --api-key sk-bench --no-progress --concurrency 4 --requests 200 >/dev/null
done
for t in direct tollgate litellm; do run "$t-64" "${urls[$t]}" --duration "${secs}s" --concurrency 64; done
for t in direct tollgate litellm; do run "$t-c1" "${urls[$t]}" --duration "${secs}s" --concurrency 1; done
for t in direct tollgate litellm; do run "$t-open" "${urls[$t]}" --duration "${secs}s" --rate "$rate"; done

python3 - "$out" "$rate" "$workers" <<'PY'
import json, sys, os
d, rate, workers = sys.argv[1], sys.argv[2], sys.argv[3]
s = {n[:-5]: json.load(open(os.path.join(d, n))) for n in os.listdir(d) if n.endswith(".json")}
T = ["direct", "tollgate", "litellm"]
def lat(x, p):
    l = x["latency_ms"]
    return l[p] if l else float("nan")
print(f"| measure | direct to mock | through tollgate | through LiteLLM ({workers} worker) |")
print("|---|---|---|---|")
def row(label, f):
    print(f"| {label} | " + " | ".join(f(t) for t in T) + " |")
row("64 connections, closed loop: ok req/s", lambda t: f"{s[t+'-64']['throughput']['ok_per_s']:.1f}")
row("64 connections: p50 / p99 ms", lambda t: f"{lat(s[t+'-64'],'p50'):.2f} / {lat(s[t+'-64'],'p99'):.2f}")
row("1 connection, closed loop: ok req/s", lambda t: f"{s[t+'-c1']['throughput']['ok_per_s']:.1f}")
row("1 connection: p50 / p99 ms", lambda t: f"{lat(s[t+'-c1'],'p50'):.3f} / {lat(s[t+'-c1'],'p99'):.3f}")
row("1 connection: added p50 / p99 ms vs direct", lambda t: f"{lat(s[t+'-c1'],'p50')-lat(s['direct-c1'],'p50'):+.3f} / {lat(s[t+'-c1'],'p99')-lat(s['direct-c1'],'p99'):+.3f}")
row(f"{rate} req/s open loop: ok req/s", lambda t: f"{s[t+'-open']['throughput']['ok_per_s']:.1f}")
row(f"{rate} req/s open loop: p50 / p99 ms", lambda t: f"{lat(s[t+'-open'],'p50'):.3f} / {lat(s[t+'-open'],'p99'):.3f}")
row(f"{rate} req/s open loop: added p50 / p99 ms vs direct", lambda t: f"{lat(s[t+'-open'],'p50')-lat(s['direct-open'],'p50'):+.3f} / {lat(s[t+'-open'],'p99')-lat(s['direct-open'],'p99'):+.3f}")
print()
for n in sorted(s):
    o = {k: v for k, v in s[n]["outcomes"].items() if v}
    print(n, json.dumps(o))
PY
