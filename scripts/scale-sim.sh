#!/usr/bin/env bash
# Scale simulation grid (docs/design/scale.md): runs
# tests/scale.rs's `scale_cell` once per cell, each in its own process, and prints
# a Markdown table for docs/BENCHMARKS.md with memory per configured tenant per
# node derived from the cells that differ only in T (resident set and live heap).
#
# Usage: scripts/scale-sim.sh [quick|once]
#   quick: 3 and 5 nodes, T <= 1,000
#   once:  "used once, now idle": 3 and 5 nodes, T = 1 and 1,000, every tenant
#          used on every node, then at rest for two 5 s windows, a 5 s actor
#          idle timeout and 12 s; memory per tenant before use, while used, after
#   crash: owner crash at 3, 5 and 16 nodes (100 tenants, 7 active): the last
#          node killed under load; time to detection and to new owners
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
  if [[ ${1:-} == crash ]]; then
    for n in 3 5 16; do cells+=("$mode $n 100"); done
  elif [[ ${1:-} == quick || ${1:-} == once ]]; then
    for n in 3 5; do for t in 1 1000; do cells+=("$mode $n $t"); done; done
  else
    for n in 3 5 16 64; do for t in 1 1000; do cells+=("$mode $n $t"); done; done
    for n in 3 5; do cells+=("$mode $n 10000"); done
    cells+=("$mode 3 100000")
  fi
done
if [[ ${1:-} == once ]]; then
  # Every tenant on every node at least once: 3,000-5,000 pairs at 1,000 req/s
  # send one request each within the 5 s active phase.
  # As many senders in the T = 1 cells as in the T = 1,000 ones, so that both
  # keep about as many requests in flight (tests/scale.rs, `drive`).
  export SCALE_QUIET=1 SCALE_WINDOW_SECS=5 SCALE_IDLE_SECS=5 SCALE_RATE=1000 SCALE_ACTIVE=1000000
  export SCALE_SENDERS=1000
  # Past the deleted rings' tombstones (dead_node_grace, 60 s by default).
  export SCALE_GRACE_SECS=${SCALE_GRACE_SECS:-10}
fi
if [[ ${1:-} == crash ]]; then
  export SCALE_CRASH=1
fi
for cell in "${cells[@]}"; do
  read -r mode n t <<<"$cell"
  echo "cell: $mode, $n nodes, $t tenants" >&2
  SCALE_MODE=$mode SCALE_NODES=$n SCALE_TENANTS=$t \
    cargo test --release --test scale -- --ignored --exact scale_cell --nocapture 2>/dev/null |
    sed -n 's/^SCALE_ROW //p' >>"$out" || echo "cell failed: $cell" >&2
done

python3 - "$out" "${1:-}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["mode"], r["nodes"]): r for r in rows if r["tenants"] == 1}
def per(r, field):
    b = base.get((r["mode"], r["nodes"]))
    if b is None or r["tenants"] == 1:
        return ""
    return f'{(r[field] - b[field]) * 1e3 / (r["tenants"] - 1) / r["nodes"]:.2f} KB'
if sys.argv[2] == "crash":
    print("| mode | nodes | tenants (active) | detected (s) | new owners, no survivor cut off (s) | requests failed | request p50 / p99 / max during (ms) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["crash"]
        l = c["latency_ms"]
        print(f'| {r["mode"]} | {r["nodes"]} | {r["tenants"]:,} ({r["active"]}) | {c["detected_s"]} | '
              f'{c["handed_over_s"]} | {c["failed_requests"]} | {l["p50"]} / {l["p99"]} / {l["max"]} |')
    sys.exit(0)
if sys.argv[2] == "once":
    print("| mode | nodes | tenants | live heap per tenant per node: configured (2 s after forming) / configured, at rest / used (active) / used once, now idle | resident per tenant per node: configured / now idle | published B/s per node: active / now idle | per-key entries held now idle (all nodes) | degraded nodes |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = r["quiet"]
        b = base.get((r["mode"], r["nodes"]))
        if b is None or r["tenants"] == 1:
            continue
        d = (r["tenants"] - 1) * r["nodes"] / 1e3
        idle_heap = f'{(q["heap_mb"] - b["quiet"]["heap_mb"]) / d:.2f} KB'
        idle_rss = f'{(q["rss_mb"] - b["quiet"]["rss_mb"]) / d:.2f} KB'
        print(f'| {r["mode"]} | {r["nodes"]} | {r["tenants"]:,} | {per(r, "heap_formed_mb")} / '
              f'{per(r, "heap_rest_mb")} / {per(r, "heap_active_mb")} / {idle_heap} | {per(r, "rss_formed_mb")} / {idle_rss} | '
              f'{r["active_phase"]["published_bytes_per_s_per_node"]:.0f} / '
              f'{q["phase"]["published_bytes_per_s_per_node"]:.0f} | '
              f'{sum(n for h in q["held"] for n in h.values())} | '
              f'{max(r["idle"]["degraded_nodes"], q["phase"]["degraded_nodes"])} |')
    print(f"\n{len(rows)} cells; rested {rows[0]['quiet']['rested_s']} s after use" if rows else "no cells ran")
    sys.exit(0)
print("| mode | nodes | tenants (active) | formed (s) | round mean idle / active (ms) | CPU idle / active (cores) | published B/s per node idle / active | wire B/s per node idle / active | memory per configured tenant per node: resident / live heap | max lag active (ms) | request p50 / p99 active (ms) | degraded nodes |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    i, a = r["idle"], r["active_phase"]
    print(f'| {r["mode"]} | {r["nodes"]} | {r["tenants"]:,} ({r["active"]}) | {r["formed_s"]} | '
          f'{i["round_ms_mean"]} / {a["round_ms_mean"]} | {i["cpu_cores"]} / {a["cpu_cores"]} | '
          f'{i["published_bytes_per_s_per_node"]:.0f} / {a["published_bytes_per_s_per_node"]:.0f} | '
          f'{i["wire_bytes_per_s_per_node"]:.0f} / {a["wire_bytes_per_s_per_node"]:.0f} | '
          f'{per(r, "rss_formed_mb")} / {per(r, "heap_formed_mb")} | '
          f'{a["max_lag_ms"]} | {r["latency_ms"]["p50"]} / {r["latency_ms"]["p99"]} | {max(i["degraded_nodes"], a["degraded_nodes"])} |')
print(f"\n{len(rows)} cells; active phase: {rows[0]['rate']} req/s over the cluster" if rows else "no cells ran")
PY
