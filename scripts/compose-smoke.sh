#!/usr/bin/env bash
# Runs docker-compose.yml's cluster without a container engine: the mock and the
# three nodes, with config/compose/node*.toml unchanged, each in a network
# namespace holding its compose IP (172.28.0.10-13) on a bridge, and `mock`
# resolved as compose's DNS would (/etc/netns/NAME/hosts). Then checks what a
# user of the compose file would: three members announcing their own IPs for
# gossip and RPC, and the demo tenant's 60 requests/min held across the nodes
# together (at most 60 reach the mock of 90 sent round-robin, at least 45).
# Needs root and iproute2; exits non-zero on any failed check.
#
#   scripts/compose-smoke.sh            # builds target/debug/tollgate first
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "compose-smoke: needs root (network namespaces)" >&2; exit 1; }
command -v ip >/dev/null || { echo "compose-smoke: needs iproute2" >&2; exit 1; }

cargo build --quiet --locked --bin tollgate
bin="$PWD/target/debug/tollgate"
logs=$(mktemp -d)
export TOLLGATE_CLUSTER_SECRET=compose-smoke-secret-0123
export TOLLGATE_ADMIN_TOKEN=admin-demo

names=(mock node1 node2 node3)
cleanup() {
  # Every process in the namespaces: asked to stop (the nodes drain), then
  # killed after 5 s; a namespace outliving its processes would keep its veth.
  for sig in TERM KILL; do
    for n in "${names[@]}"; do
      ip netns pids "tgc-$n" 2>/dev/null | xargs -r kill -s $sig 2>/dev/null || true
    done
    for _ in $(seq 50); do
      left=0
      for n in "${names[@]}"; do
        [ -n "$(ip netns pids "tgc-$n" 2>/dev/null)" ] && left=1
      done
      [ $left = 0 ] && break
      sleep 0.1
    done
  done
  for i in "${!names[@]}"; do
    ip netns del "tgc-${names[$i]}" 2>/dev/null || true
    ip link del "tgcv$i" 2>/dev/null || true
    rm -rf "/etc/netns/tgc-${names[$i]}"
  done
  ip link del tgcbr 2>/dev/null || true
}
trap cleanup EXIT
cleanup

ip link add tgcbr type bridge
ip addr add 172.28.0.1/24 dev tgcbr
ip link set tgcbr up
for i in "${!names[@]}"; do
  n=${names[$i]}
  ns="tgc-$n"
  ip netns add "$ns"
  ip link add "tgcv$i" type veth peer name eth0 netns "$ns"
  ip link set "tgcv$i" master tgcbr
  ip link set "tgcv$i" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip addr add "172.28.0.1$i/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n172.28.0.10 mock\n' >"/etc/netns/$ns/hosts"
done

# The services' commands, as docker-compose.yml gives them.
ip netns exec tgc-mock "$bin" mock-upstream --listen 0.0.0.0:9090 --rpm 120 --tpm 40000 --concurrency 8 \
  >"$logs/mock.log" 2>&1 &
for i in 1 2 3; do
  ip netns exec "tgc-node$i" "$bin" serve --config "config/compose/node$i.toml" >"$logs/node$i.log" 2>&1 &
done

fail() {
  echo "compose-smoke: FAILED: $*" >&2
  tail -n 20 "$logs"/*.log >&2
  exit 1
}
admin() { curl -sf -H "Authorization: Bearer $TOLLGATE_ADMIN_TOKEN" "http://172.28.0.1$1:8080$2"; }

# Every node sees three members, each announcing its own compose IP for gossip
# (the member id ends in its gossip address) and for the RPC.
announced() {
  local body
  body=$(admin "$1" /admin/cluster 2>/dev/null) || return 1
  [ "$(grep -o '@172\.28\.0\.1[123]:7946"' <<<"$body" | sort -u | wc -l)" = 3 ] &&
    [ "$(grep -o '"rpc_addr":"172\.28\.0\.1[123]:7947"' <<<"$body" | sort -u | wc -l)" = 3 ]
}
for _ in $(seq 100); do
  ok=1
  for i in 1 2 3; do
    announced "$i" || ok=0
  done
  [ $ok = 1 ] && break
  sleep 0.2
done
[ $ok = 1 ] || fail "the cluster did not form with every node's announced addresses"
echo "compose-smoke: 3 members, each announcing 172.28.0.1x:7946 (gossip) and :7947 (RPC)"

# 90 requests round-robin over the nodes, without waiting in the queue.
codes=()
for k in $(seq 0 89); do
  i=$((k % 3 + 1))
  codes+=("$(curl -s -o /dev/null -w '%{http_code}' "http://172.28.0.1$i:8080/v1/chat/completions" \
    -H 'Authorization: Bearer sk-demo' -H 'Content-Type: application/json' -H 'x-tollgate-max-wait-ms: 0' \
    -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}')")
done
served=$(printf '%s\n' "${codes[@]}" | grep -c '^200$' || true)
refused=$(printf '%s\n' "${codes[@]}" | grep -c '^429$' || true)
stats=$(curl -sf http://172.28.0.10:9090/stats) || fail "the mock's /stats did not answer"
admitted=$(grep -o '"admitted":[0-9]*' <<<"$stats" | head -1 | cut -d: -f2)
[ -n "$admitted" ] || fail "no admitted count in the mock's /stats: $stats"
echo "compose-smoke: 90 sent, $served served, $refused refused (429); the mock admitted $admitted"
[ $((served + refused)) = 90 ] || fail "answers other than 200 and 429: ${codes[*]}"
[ "$admitted" = "$served" ] || fail "the mock admitted $admitted but clients got $served answers"
[ "$admitted" -le 60 ] || fail "the cluster let $admitted through a 60/min tenant"
# Sent one at a time without queueing, a node may refuse while another holds
# the room: well over half of 60 is what sharing it at all looks like.
[ "$admitted" -ge 45 ] || fail "only $admitted of the tenant's 60 were served"
echo "compose-smoke: ok"
