#!/usr/bin/env bash
# LiteLLM's multi-instance rate limiting, judged by what the provider receives:
# N LiteLLM proxies (1 worker each) share one Redis and one deployment with rpm = L
# (scripts/peers/litellm-cluster.yaml); open-loop load at MULT x L is spread evenly over
# them, clients ignoring retry-after; the mock upstream has NO limit and logs every
# request it receives (JSONL), so its log is exactly what LiteLLM let through.
# Prints per-UTC-minute counts (LiteLLM's own window), the peak in any sliding 60 s
# window, and how many a sliding-window provider with the same limit L would refuse.
# Usage: scripts/peers/litellm-cluster.sh [seconds, default 70] [MULT, default 4]
# Env: L (override the yaml's rpm), INSTANCES (default 3), ALIGN (UTC second of the
#      minute to start the load at, default 30; "none" = start at once), KEEP=1 keeps
#      the work dir, TOLLGATE_BIN, LITELLM_BIN.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-70}
mult=${2:-4}
n=${INSTANCES:-3}
align=${ALIGN:-30}
bin=${TOLLGATE_BIN:-target/release/tollgate}
litellm=${LITELLM_BIN:-/opt/litellm-venv/bin/litellm}
[[ -x $bin ]] || cargo build --release --bin tollgate
[[ -x $litellm ]] || { echo "no LiteLLM at $litellm (see scripts/bench-peers.sh)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server missing (apt-get install -y redis-server)" >&2; exit 1; }
out=$(mktemp -d)
limit=${L:-$(sed -n 's/^ *rpm: *\([0-9][0-9]*\).*/\1/p' scripts/peers/litellm-cluster.yaml | head -1)}
sed "s/^\( *rpm: *\)[0-9][0-9]*/\1$limit/" scripts/peers/litellm-cluster.yaml >"$out/litellm.yaml"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
redis_port=$(free_port)
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  if [[ ${KEEP:-0} == 1 ]]; then echo "work dir kept: $out" >&2; else rm -rf "$out"; fi
}
trap cleanup EXIT

redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no >"$out/redis.log" 2>&1 &
pids+=($!)
"$bin" mock-upstream --listen 127.0.0.1:9191 --completion-tokens 16..16 --rpm 0 --log "$out/mock.jsonl" \
  >"$out/mock.out" 2>&1 &
pids+=($!)
ports=()
for i in $(seq "$n"); do
  port=$(free_port)
  ports+=("$port")
  LITELLM_BENCH_REDIS_PORT=$redis_port LITELLM_LOG=ERROR LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY_DISABLED=true \
    "$litellm" --config "$out/litellm.yaml" --host 127.0.0.1 --port "$port" --num_workers 1 \
    >"$out/litellm-$i.log" 2>&1 &
  pids+=($!)
done
for port in "${ports[@]}"; do
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$port/health/liveliness" >/dev/null && break; sleep 0.5; done
  curl -sf "http://127.0.0.1:$port/health/liveliness" >/dev/null || { tail -30 "$out"/litellm-*.log >&2; exit 1; }
done
redis-cli -p "$redis_port" ping >/dev/null

if [[ $align != none ]]; then # start at a fixed second of the UTC minute: LiteLLM's
  # window is the calendar minute, so the phase decides how the boundary falls.
  python3 -c "import time; now = time.time(); time.sleep((int($align) - now % 60) % 60)"
fi
start_ms=$(date +%s%3N)
per=$(python3 -c "print($mult * $limit / 60 / $n)")
echo "L=$limit rpm, $n LiteLLM instances sharing redis :$redis_port, load ${mult}x L = $per req/s per instance for ${secs}s, start $(date -u +%H:%M:%S.%3N) UTC" >&2
lp=()
for i in $(seq "$n"); do
  "$bin" load --url "http://127.0.0.1:${ports[$((i - 1))]}/v1" --api-key sk-bench --rate "$per" \
    --duration "${secs}s" --ignore-retry-after --no-progress --json "$out/load-$i.json" >/dev/null &
  lp+=($!)
done
wait "${lp[@]}"
sleep 1 # let the mock's log writer flush the last lines

python3 - "$out" "$limit" "$mult" "$n" "$start_ms" "$secs" <<'PY'
import json, sys, os, glob, collections, datetime
d, L, mult, n, start_ms, secs = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
lines = [json.loads(l) for l in open(os.path.join(d, "mock.jsonl")) if l.strip()]
ts = sorted(x["ts_ms"] for x in lines if x["outcome"] == "admitted")
refused = collections.Counter(x["reason"] for x in lines if x["outcome"] == "refused")
W = 60_000
# peak in any sliding 60 s window [t, t + 60 s)
peak, j = 0, 0
for i in range(len(ts)):
    while ts[i] - ts[j] >= W:
        j += 1
    peak = max(peak, i - j + 1)
# a provider with a sliding 60 s window and limit L: which of these would it refuse?
served, would_429 = collections.deque(), 0
for t in ts:
    while served and t - served[0] >= W:
        served.popleft()
    if len(served) < L:
        served.append(t)
    else:
        would_429 += 1
clients = collections.Counter()
for f in glob.glob(os.path.join(d, "load-*.json")):
    for k, v in json.load(open(f))["outcomes"].items():
        clients[k] += v
per_min = collections.Counter(t // W for t in ts)
end_ms = start_ms + secs * 1000
print(f"| LiteLLM 1.108.7 x{n}, shared Redis, rpm L = {L}, load {mult}x L | value |")
print("|---|---|")
print(f"| offered load | {mult} x L = {float(mult) * L:.0f} per minute |")
print(f"| client requests sent / 200 / 429 / other | {clients['total'] - clients['dropped']} / {clients['ok']} / {clients['rate_limited']} / "
      f"{clients['client_error'] + clients['server_error'] + clients['transport_error']} |")
print(f"| received by the mock (unlimited) | {len(ts)} (mock refusals: {dict(refused) or 0}) |")
for m in sorted(per_min):
    full = m * W >= start_ms and (m + 1) * W <= end_ms
    hh = datetime.datetime.fromtimestamp(m * 60, datetime.timezone.utc).strftime("%H:%M")
    print(f"| received in UTC minute {hh} ({'full' if full else 'partial'} minute of the run): count = utilisation of L | "
          f"{per_min[m]} = {per_min[m] / L:.2f} L |")
print(f"| peak in any sliding 60 s window | {peak} = {peak / L:.2f} L |")
print(f"| a sliding-window provider with limit L would refuse | {would_429} of {len(ts)} |")
print(f"| received / (L x run minutes) (can exceed 1: fixed windows) | {len(ts) / (L * secs / 60):.2f} |")
PY
