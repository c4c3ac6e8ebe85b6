#!/usr/bin/env bash
# Two builds of `slidegate serve` side by side, taking turns: decisions/s,
# latency and the server's CPU time per decision (utime + stime from
# /proc/PID/stat over the calls answered). The load generators are separate
# processes (wrk, h2load; Debian: wrk, nghttp2-client) on the same two
# cores; every run is bounded (5 s, or 200,000 calls).
#
#   bench/load/compare.sh BASELINE_BIN CANDIDATE_BIN [ROUNDS]
#
# Only servers this script starts, on loopback, are loaded.
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${1:?baseline binary}
cand=${2:?candidate binary}
rounds=${3:-3}
http=127.0.0.1:18180
grpc=127.0.0.1:18181
hz=$(getconf CLK_TCK)
json=$(mktemp)
trap 'rm -f "$json"' EXIT
cat >"$json" <<'EOF'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"domain":"edge_proxy","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}'
EOF

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# wrk_round LABEL NAME SCRIPT PATH PID: 5 s of wrk on PATH, with the
# server's CPU per decision.
wrk_round() {
  local label=$1 name=$2 script=$3 path=$4 server=$5 before after out
  before=$(cpu_ticks "$server")
  out=$(wrk -t2 -c64 -d5s --latency -s "$script" "http://$http$path")
  after=$(cpu_ticks "$server")
  echo "$out" | awk -v l="$label" -v n="$name" -v t=$((after - before)) -v hz="$hz" '
    / requests in / { calls = $1 }
    /Requests\/sec/ { rps = $2 }
    /^ +99%/ { p99 = $2 }
    END { printf "%s %-5s %10.0f calls/s  p99  %8s  cpu %6.2f us/decision\n", l, n, rps, p99, t / hz * 1e6 / calls }'
}

# run LABEL BIN: one round of the three loads on a fresh server.
run() {
  local label=$1 bin=$2
  if curl -sf "http://$http/healthz" >/dev/null; then
    echo "error: $http is already served by another process" >&2
    exit 1
  fi
  "$bin" serve --config bench/load/edge.yaml --http "$http" --grpc "$grpc" \
    --memory-mib 64 --other-memory-mib 8 2>/dev/null &
  local server=$!
  for _ in $(seq 100); do curl -sf "http://$http/healthz" >/dev/null && break; sleep 0.05; done
  if ! kill -0 $server 2>/dev/null; then
    echo "error: $bin serve did not start" >&2
    exit 1
  fi
  local before after out calls
  # gRPC ShouldRateLimit, one hot key.
  before=$(cpu_ticks $server)
  out=$(h2load -n 200000 -c 64 -m 10 -t 2 -H 'content-type: application/grpc' -H 'te: trailers' \
    -d bench/load/grpc-hot.bin "http://$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
  after=$(cpu_ticks $server)
  calls=$(echo "$out" | awk '/^requests:/ { print $6 }')
  echo "$out" | awk -v l="$label" -v c="$calls" -v t=$((after - before)) -v hz="$hz" '
    /^finished in/ { rps = $4 }
    /^time for request:/ { mean = $6 }
    END { printf "%s grpc  %10.0f calls/s  mean %8s  cpu %6.2f us/decision\n", l, rps, mean, t / hz * 1e6 / c }'
  # HTTP POST /json and POST /v1/check, one hot key.
  wrk_round "$label" json "$json" /json $server
  wrk_round "$label" check bench/load/hot.lua /v1/check $server
  kill $server
  wait $server 2>/dev/null || true
}

for r in $(seq "$rounds"); do
  run "base  r$r" "$base"
  run "cand  r$r" "$cand"
done
