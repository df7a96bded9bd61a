#!/usr/bin/env bash
# The end-to-end floor: 64 connections straight to the mock, through a bare
# axum + hyper proxy (examples/bare_proxy.rs: the node's parts doing nothing
# else), and through a lease-mode node, runs alternated, with each process's CPU
# per request (utime + stime from /proc). Prints a Markdown table for
# docs/BENCHMARKS.md. Usage: scripts/investigate/bench-floor.sh [rounds, default 3] [seconds, default 6]
# GENERATOR=wrk drives the same requests with wrk (2 threads, 64 connections;
# apt-get install wrk) instead of `tollgate load`, a leaner client, to show what
# the generator's own CPU costs the paths it shares the cores with.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3} secs=${2:-6} generator=${GENERATOR:-tollgate}
[[ $generator == tollgate || $generator == wrk ]] || { echo "GENERATOR: tollgate or wrk" >&2; exit 2; }
[[ $generator == tollgate ]] || command -v wrk >/dev/null || { echo "wrk not installed" >&2; exit 1; }
source scripts/floor-processes.sh
for _ in $(seq "$rounds"); do
  for path in direct:9190:0 bare:8192:$proxy lease:8191:$lease; do
    IFS=: read -r name port middle <<<"$path"
    m0=$(cpu $mock); n0=0; [[ $middle != 0 ]] && n0=$(cpu "$middle")
    if [[ $generator == wrk ]]; then
      wrk -t2 -c64 -d"${secs}s" -s scripts/investigate/wrk/chat.lua "http://127.0.0.1:$port/v1/chat/completions" \
        >"$out/wrk.txt" &
    else
      "$bin" load --url "http://127.0.0.1:$port/v1" --api-key sk-bench --duration "${secs}s" \
        --no-progress --json "$out/run.json" --concurrency 64 >/dev/null &
    fi
    load=$!
    sleep 0.1; l0=$(cpu $load); t0=$(date +%s.%N)
    sleep "$(awk "BEGIN { print $secs - 0.4 }")"
    l1=$(cpu $load); t1=$(date +%s.%N)
    wait $load
    m1=$(cpu $mock); n1=0; [[ $middle != 0 ]] && n1=$(cpu "$middle")
    if [[ $generator == wrk ]]; then
      # The same fields as `tollgate load --json` writes, from wrk's summary line.
      read -r _ n s p50 p99 failed < <(grep '^WRK ' "$out/wrk.txt")
      ok=$((n - failed))
      echo "{\"outcomes\": {\"ok\": $ok, \"total\": $n}, \"throughput\": {\"ok_per_s\": $(awk "BEGIN { print $ok / $s }")}, \"latency_ms\": {\"p50\": $p50, \"p99\": $p99}}" >"$out/run.json"
    fi
    python3 - "$out/run.json" "$name" "$m0" "$m1" "$n0" "$n1" "$l0" "$l1" "$t0" "$t1" >>"$out/rows" <<'PY'
import json, sys
x = json.load(open(sys.argv[1])); n = x["outcomes"]["total"]; r = x["throughput"]["ok_per_s"]
assert x["outcomes"]["ok"] == n, x["outcomes"]
m0, m1, n0, n1, l0, l1, t0, t1 = map(float, sys.argv[3:])
us = lambda ticks, count: ticks * 1e4 / count  # clock ticks of 10 ms
print(sys.argv[2], r, x["latency_ms"]["p50"], x["latency_ms"]["p99"], us(m1 - m0, n), us(n1 - n0, n), us(l1 - l0, r * (t1 - t0)))
PY
  done
done
python3 - "$out/rows" "$generator" <<'PY'
import collections, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, *f = line.split(); rows[name].append([float(v) for v in f])
label = {"direct": "load -> mock", "bare": "load -> bare proxy -> mock", "lease": "load -> lease node -> mock"}
print(f"Generator: {sys.argv[2]}\n")
print("| path | req/s | p50 ms | p99 ms | mock µs/req | proxy or node µs/req | load generator µs/req |")
print("|---|---|---|---|---|---|---|")
span = lambda rs, i, fmt: (fmt.format(min(r[i] for r in rs)) + "-" + fmt.format(max(r[i] for r in rs)))
for name in ["direct", "bare", "lease"]:
    rs = rows[name]
    middle = "-" if name == "direct" else span(rs, 4, "{:.1f}")
    print(f"| {label[name]} | {span(rs, 0, '{:,.0f}')} | {span(rs, 1, '{:.2f}')} | {span(rs, 2, '{:.2f}')} | {span(rs, 3, '{:.1f}')} | {middle} | {span(rs, 5, '{:.1f}')} |")
PY
