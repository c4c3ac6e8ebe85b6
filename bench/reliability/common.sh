# Sourced by flood.sh and soak.sh: builds the release binary and the load
# tool, and starts `slidegate serve` on free loopback ports (port 0; the
# addresses are read from the line it prints), stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
# One invocation (the same features every time, so nothing rebuilds).
cargo build -q --release -p slidegate-cli -p slidegate-server --bins --examples
load=target/release/examples/reliability_load
log=$(mktemp)
# start_server ARGS...: sets $server (pid), $http and $grpc.
start_server() {
  target/release/slidegate serve --config "${config:-bench/load/edge.yaml}" --http 127.0.0.1:0 --grpc 127.0.0.1:0 \
    --reload-every 0s "$@" 2>"$log" &
  server=$!
  trap 'kill $server 2>/dev/null || true; rm -f "$log"' EXIT
  for _ in $(seq 100); do grep -q "^slidegate: HTTP on" "$log" && break; sleep 0.1; done
  line=$(grep "^slidegate: HTTP on" "$log")
  http=$(echo "$line" | sed -E 's/.*HTTP on ([^,]+),.*/\1/')
  grpc=$(echo "$line" | sed -E 's/.*gRPC on (.*)$/\1/')
}
# stop_server: SIGTERM, then the exit status and whether it panicked.
stop_server() {
  kill -TERM $server
  status=0; wait $server || status=$?
  echo "server exit status: $status"
  if grep -q panicked "$log"; then echo "the server panicked:"; cat "$log"; exit 1; fi
  [ "$status" = 0 ]
}
