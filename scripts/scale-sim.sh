#!/usr/bin/env bash
# Scale simulation grid (issue 6, part 4; docs/design/scale.md): runs
# tests/scale.rs's `scale_cell` once per cell, each in its own process, and prints
# a Markdown table for docs/BENCHMARKS.md with memory per configured tenant per
# node derived from the RSS of cells that differ only in T.
#
# Usage: scripts/scale-sim.sh [quick]   (quick: 3 and 5 nodes, T <= 1,000)
# Environment: SCALE_SECS (seconds per phase, default 5), SCALE_RATE (requests/s
# over the whole cluster while active, default 200), SCALE_ACTIVE (default 7).
set -euo pipefail
cd "$(dirname "$0")/.."
export SCALE_ACTIVE=${SCALE_ACTIVE:-7}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cargo test --release --test scale --no-run >/dev/null 2>&1 || cargo test --release --test scale --no-run

cells=()
for mode in gossip lease; do
  if [[ ${1:-} == quick ]]; then
    for n in 3 5; do for t in 1 1000; do cells+=("$mode $n $t"); done; done
  else
    for n in 3 5 16 64; do for t in 1 1000; do cells+=("$mode $n $t"); done; done
    for n in 3 5; do cells+=("$mode $n 10000"); done
    cells+=("$mode 3 100000")
  fi
done
for cell in "${cells[@]}"; do
  read -r mode n t <<<"$cell"
  echo "cell: $mode, $n nodes, $t tenants" >&2
  SCALE_MODE=$mode SCALE_NODES=$n SCALE_TENANTS=$t \
    cargo test --release --test scale -- --ignored --exact scale_cell --nocapture 2>/dev/null |
    sed -n 's/^SCALE_ROW //p' >>"$out" || echo "cell failed: $cell" >&2
done

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["mode"], r["nodes"]): r for r in rows if r["tenants"] == 1}
print("| mode | nodes | tenants (active) | formed (s) | round mean idle / active (ms) | CPU idle / active (cores) | published B/s per node idle / active | wire B/s per node idle / active | memory per configured tenant per node | max lag active (ms) | request p50 / p99 active (ms) | degraded nodes |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    i, a = r["idle"], r["active_phase"]
    b = base.get((r["mode"], r["nodes"]))
    per = "" if b is None or r["tenants"] == 1 else \
        f'{(r["rss_formed_mb"] - b["rss_formed_mb"]) * 1e3 / (r["tenants"] - 1) / r["nodes"]:.2f} KB'
    print(f'| {r["mode"]} | {r["nodes"]} | {r["tenants"]:,} ({r["active"]}) | {r["formed_s"]} | '
          f'{i["round_ms_mean"]} / {a["round_ms_mean"]} | {i["cpu_cores"]} / {a["cpu_cores"]} | '
          f'{i["published_bytes_per_s_per_node"]:.0f} / {a["published_bytes_per_s_per_node"]:.0f} | '
          f'{i["wire_bytes_per_s_per_node"]:.0f} / {a["wire_bytes_per_s_per_node"]:.0f} | {per} | '
          f'{a["max_lag_ms"]} | {r["latency_ms"]["p50"]} / {r["latency_ms"]["p99"]} | {max(i["degraded_nodes"], a["degraded_nodes"])} |')
print(f"\n{len(rows)} cells; active phase: {rows[0]['rate']} req/s over the cluster" if rows else "no cells ran")
PY
