#!/usr/bin/env bash
# The README's test command: makes sure the services the tests start are
# installed (redis-server and redis-cli for the Redis strict-mode tests; installed
# with apt-get when missing and allowed), then runs every test of the workspace.
# A missing service is a loud failure, never a silent skip.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
if ((${#missing[@]})); then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "== installing ${missing[*]} (the Redis tests start real servers)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq redis-server redis-tools >/dev/null
  else
    echo "missing: ${missing[*]}; install redis-server and redis-tools (the Redis tests start real servers)" >&2
    exit 1
  fi
fi
exec cargo test --workspace --locked "$@"
