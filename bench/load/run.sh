#!/usr/bin/env bash
# The service's load benchmark: a release build of `slidegate serve` on
# loopback, driven by wrk (HTTP/1.1 keep-alive, POST /v1/check) and h2load
# (gRPC ShouldRateLimit) on the same machine, then by the in-repo gRPC load
# generator for latency percentiles and many keys. Every run is bounded
# (10 s or 300,000 calls). Needs wrk and h2load (Debian: wrk, nghttp2-client).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --release -p slidegate-cli
cargo build -q --release -p slidegate-server --example grpc_load
http=127.0.0.1:18080
grpc=127.0.0.1:18081
target/release/slidegate serve --config bench/load/edge.yaml --http "$http" --grpc "$grpc" \
  --memory-mib 64 --other-memory-mib 8 2>/dev/null &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf "http://$http/healthz" >/dev/null && break; sleep 0.1; done
metric() { curl -s "http://$http/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
echo "== HTTP POST /v1/check, one hot key (wrk -t2 -c64 -d10s)"
wrk -t2 -c64 -d10s --latency -s bench/load/hot.lua "http://$http/v1/check" | grep -E "Requests/sec|50%|99%|Non-2xx"
echo "== HTTP POST /v1/check, 100,000 keys (wrk -t2 -c64 -d10s)"
wrk -t2 -c64 -d10s --latency -s bench/load/many.lua "http://$http/v1/check" | grep -E "Requests/sec|50%|99%|Non-2xx"
echo "== gRPC ShouldRateLimit, one hot key (h2load -c64 -m10 -t2, 300,000 calls)"
h2load -n 300000 -c 64 -m 10 -t 2 -H 'content-type: application/grpc' -H 'te: trailers' \
  -d bench/load/grpc-hot.bin "http://$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" \
  | grep -E "finished in|status codes"
echo "== gRPC ShouldRateLimit through the tonic load generator (4 connections, 64 in flight, 10 s)"
target/release/examples/grpc_load "$grpc" 1 10 4 64
target/release/examples/grpc_load "$grpc" 100000 10 4 64
keys=$(metric slidegate_keys); capacity=$(metric slidegate_key_capacity); bytes=$(metric slidegate_store_bytes)
rss=$(ps -o rss= -p $server)
echo "== memory: $keys keys held, capacity $capacity, store $bytes bytes ($((bytes / capacity)) bytes per key at capacity), RSS $((rss / 1024)) MiB"
