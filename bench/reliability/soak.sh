#!/usr/bin/env bash
# The soak: measures the service's capacity (grpc_load, closed loop, 10 s,
# 100,000 keys, 64 calls in flight), then runs an open-loop load at half of
# it for SECONDS (default 600), a line a minute: calls, errors, p50, p99,
# max, RSS, keys held.
#
#   bench/reliability/soak.sh [SECONDS=600] [RATE=half the measured capacity]
source "$(dirname "$0")/common.sh"
seconds=${1:-600}
start_server --memory-mib 64 --other-memory-mib 8
if [ -n "${2:-}" ]; then
  rate=$2
else
  echo "== capacity (grpc_load, 100,000 keys, 10 s, 4 connections, 64 in flight)"
  out=$(target/release/examples/grpc_load "$grpc" 100000 10 4 64); echo "$out"
  rate=$(echo "$out" | sed -E 's/.*: ([0-9]+) calls\/s.*/\1/')
  rate=$((rate / 2))
fi
echo "== soak at $rate calls/s for $seconds s (gRPC $grpc, pid $server)"
$load soak "$grpc" "$http" "$server" "$rate" "$seconds" 100000 60 64
stop_server
