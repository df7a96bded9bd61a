#!/usr/bin/env bash
# Where the time of a one-worker lease node, its mock upstream and the load
# generator goes at 64 connections on shared cores (the processes of
# scripts/floor-processes.sh, its bare proxy stopped), from the kernel's
# scheduler: each worker thread's share of the run on a core, how often and how
# long it waited runnable for a core (preempted: the tail a busy neighbour
# causes) and how often and how long it slept (nothing to do: waiting on the
# others). Records only `sched:sched_switch`, system-wide, for the middle
# seconds of the load (needs root and perf).
# Usage: scripts/investigate/bench-sched.sh [seconds recorded, default 4]
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v perf >/dev/null || { echo "perf not installed (apt-get install linux-perf)" >&2; exit 1; }
secs=${1:-4}
export TOKIO_WORKER_THREADS=1
source scripts/floor-processes.sh
node=$lease
kill $proxy # idle: only the node is measured here
"$bin" load --url http://127.0.0.1:8191/v1 --api-key sk-bench --duration "$((secs + 4))s" \
  --no-progress --json "$out/load.json" --concurrency 64 >/dev/null &
gen=$!
sleep 2
# Each process's threads, read while all three run (the generator exits first).
threads() { ls "/proc/$1/task" | paste -sd, -; }
tids="$(threads $mock) $(threads $node) $(threads $gen)"
perf record -q -o "$out/perf.data" -e sched:sched_switch -a -- sleep "$secs" 2>/dev/null
wait $gen
perf script -i "$out/perf.data" -F time,trace 2>/dev/null >"$out/switches"
python3 - "$out/switches" "$out/load.json" $tids <<'PY'
import json, re, sys
path, load, *tids = sys.argv[1:]
switch = re.compile(r"\s*([\d.]+):.* prev_pid=(\d+) .*prev_state=(\S+) ==> .* next_pid=(\d+)")
events = [(float(m[1]), int(m[2]), m[3][0], int(m[4])) for m in map(switch.match, open(path)) if m]
span = events[-1][0] - events[0][0]
# Each process's worker: the thread of it switched most (one worker each).
counts = {}
for _, prev, _, nxt in events:
    for tid in (prev, nxt):
        counts[tid] = counts.get(tid, 0) + 1
workers = {
    name: max(map(int, group.split(",")), key=lambda t: counts.get(t, 0))
    for name, group in zip(["mock", "node", "generator"], tids)
}
x = json.load(open(load))
print(f"load: {x['throughput']['ok_per_s']:,.0f} req/s, p50 {x['latency_ms']['p50']} ms, "
      f"p99 {x['latency_ms']['p99']} ms (perf recording {span:.1f} s of it)")
print("| worker | on a core % | preempted /s | preempted ms/s | preempted > 1 ms | longest ms | slept /s | slept > 1 ms | longest ms |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ["node", "mock", "generator"]:
    tid = workers[name]
    out = inn = None
    on = 0.0
    gaps = {"R": [], "S": []}
    for t, prev, state, nxt in events:
        if prev == tid:
            out = (t, "R" if state == "R" else "S")
            if inn is not None:
                on += t - inn
                inn = None
        if nxt == tid:
            if out:
                gaps[out[1]].append(t - out[0])
            inn = t
    r, s = sorted(gaps["R"]), sorted(gaps["S"])
    longest = lambda g: f"{g[-1] * 1e3:.2f}" if g else "-"
    print(f"| {name} | {100 * on / span:.0f} | {len(r) / span:.0f} | {1e3 * sum(r) / span:.1f} | "
          f"{sum(g > 1e-3 for g in r)} | {longest(r)} | {len(s) / span:.0f} | {sum(g > 1e-3 for g in s)} | {longest(s)} |")
PY
