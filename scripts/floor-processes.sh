# Sourced by bench-floor.sh and bench-cores.sh: builds the release binary and
# examples/bare_proxy.rs, starts the mock upstream (port 9190), the bare proxy
# (8192) and a lease-mode node (8191, config/bench-lease.toml), waits for both
# proxies, and stops everything on exit. Sets bin, out (a scratch directory),
# mock, proxy and lease (pids), and cpu PID (utime + stime, clock ticks).
target=${CARGO_TARGET_DIR:-target}
cargo build --release --bin tollgate --example bare_proxy >&2
bin=$target/release/tollgate bare=$target/release/examples/bare_proxy
out=$(mktemp -d)
"$bin" mock-upstream --listen 127.0.0.1:9190 --completion-tokens 16..16 >/dev/null 2>&1 &
mock=$!
"$bare" 127.0.0.1:8192 http://127.0.0.1:9190 >/dev/null 2>&1 &
proxy=$!
RUST_LOG=warn "$bin" serve --config config/bench-lease.toml >/dev/null 2>&1 &
lease=$!
trap 'kill $mock $proxy $lease 2>/dev/null; wait 2>/dev/null; rm -rf "$out"' EXIT
for port in 8191 8192; do
  for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done
done
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
