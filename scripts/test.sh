#!/usr/bin/env bash
# The README's test command: makes sure what the tests start is installed
# (redis-server and redis-cli for the Redis strict-mode tests; iproute2 and
# iptables for the jepsen harness's namespaces, libfaketime for its clock
# skew, openssl for the TLS upstream test's certificates; installed with apt-get when
# missing and allowed), then runs every test of the workspace and the
# docker-compose cluster's smoke run (scripts/compose-smoke.sh).
# A missing service is a loud failure, never a silent skip.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v ip >/dev/null || missing+=(iproute2)
command -v iptables >/dev/null || missing+=(iptables)
# curl: the compose smoke run's clients.
command -v curl >/dev/null || missing+=(curl)
# openssl: the test CA and certificate of tests/it/upstream_tls.rs.
command -v openssl >/dev/null || missing+=(openssl)
# libfaketime: the jepsen harness's clock-skew nemesis.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || missing+=(faketime)
if ((${#missing[@]})); then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "== installing ${missing[*]} (the Redis tests start real servers)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "missing: ${missing[*]}; install them (the Redis tests start real servers; the jepsen harness needs iproute2, iptables and faketime, and root; the TLS test needs openssl)" >&2
    exit 1
  fi
fi
cargo test --workspace --locked "$@"
# docker-compose.yml's cluster with its configs unchanged, in network namespaces
# (no container engine on the test machines); skipped when a filter was given.
if (($# == 0)); then
  scripts/compose-smoke.sh
fi
