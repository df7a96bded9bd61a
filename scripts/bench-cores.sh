#!/usr/bin/env bash
# The one-node latency target (docs/BENCHMARKS.md) with the two cores shared or
# split. The same processes (the mock, examples/bare_proxy.rs, a lease-mode node;
# each on one tokio worker, as is the load generator) serve every run; between
# runs only their CPU affinity changes:
#   shared: every process may run on both cores (what bench-e2e.sh measures);
#   split:  the proxy or node alone on core 1, the mock and the generator on core 0
#           (`taskset`), so the node never waits behind them for a core.
# Each round runs, for both layouts and both paths, 64 connections closed loop
# and 15,000 req/s open loop with at most 64 in flight (latency from each slot's
# due time). Prints a Markdown table for docs/BENCHMARKS.md (medians, ranges).
# Usage: scripts/bench-cores.sh [rounds, default 4] [seconds per run, default 6]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-4} secs=${2:-6}
(($(nproc) >= 2)) || { echo "needs two cores" >&2; exit 1; }
command -v taskset >/dev/null || { echo "taskset not installed (util-linux)" >&2; exit 1; }
export TOKIO_WORKER_THREADS=1
source scripts/floor-processes.sh
pin() { taskset -a -p -c "$2" "$1" >/dev/null; } # every thread of process $1
for _ in $(seq "$rounds"); do
  for layout in shared split; do
    if [[ $layout == split ]]; then gen_cores=0 middle_cores=1; else gen_cores=0,1 middle_cores=0,1; fi
    pin $mock "$gen_cores"; pin $proxy "$middle_cores"; pin $lease "$middle_cores"
    for path in bare:8192:$proxy lease:8191:$lease; do
      IFS=: read -r name port middle <<<"$path"
      for shape in closed open; do
        args=(--concurrency 64)
        [[ $shape == open ]] && args=(--rate 15000 --max-in-flight 64)
        n0=$(cpu "$middle")
        taskset -c "$gen_cores" "$bin" load --url "http://127.0.0.1:$port/v1" --api-key sk-bench \
          --duration "${secs}s" --no-progress --json "$out/run.json" "${args[@]}" >/dev/null
        n1=$(cpu "$middle")
        python3 - "$out/run.json" "$layout" "$name" "$shape" "$n0" "$n1" >>"$out/rows" <<'PY'
import json, sys
x = json.load(open(sys.argv[1])); o = x["outcomes"]
n0, n1 = map(float, sys.argv[5:])
ok = o["ok"]; assert ok + o.get("dropped", 0) == o["total"], o
us = (n1 - n0) * 1e4 / ok  # clock ticks of 10 ms per request served
print(*sys.argv[2:5], x["throughput"]["ok_per_s"], x["latency_ms"]["p50"], x["latency_ms"]["p99"],
      100 * o.get("dropped", 0) / o["total"], us)
PY
      done
    done
  done
done
python3 - "$out/rows" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    layout, name, shape, *f = line.split(); rows[layout, name, shape].append([float(v) for v in f])
label = {"bare": "bare proxy", "lease": "lease node"}
print("| path | load | cores | req/s | p50 ms | p99 ms (median, range) | slots dropped % | proxy or node µs/req |")
print("|---|---|---|---|---|---|---|---|")
med = lambda rs, i, fmt: fmt.format(statistics.median(r[i] for r in rs))
span = lambda rs, i, fmt: fmt.format(min(r[i] for r in rs)) + "-" + fmt.format(max(r[i] for r in rs))
for name in ["bare", "lease"]:
    for shape in ["closed", "open"]:
        for layout in ["shared", "split"]:
            rs = rows[layout, name, shape]
            load = "64 connections" if shape == "closed" else "15,000 req/s, <= 64 in flight"
            print(f"| {label[name]} | {load} | {layout} | {med(rs, 0, '{:,.0f}')} | {med(rs, 1, '{:.2f}')} | "
                  f"{med(rs, 2, '{:.2f}')} ({span(rs, 2, '{:.2f}')}) | {span(rs, 3, '{:.1f}')} | {med(rs, 4, '{:.1f}')} |")
PY
