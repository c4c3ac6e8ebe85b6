#!/usr/bin/env bash
# Instructions per decision of slidegate serve and (when a build of it is
# given) Limitador's server, counted by callgrind, which repeats to within
# a fraction of a percent whatever else the machine does. Each server runs
# under valgrind twice, answering 2,000 and then 7,000 calls on one
# connection (gRPC: h2load, 10 streams in flight; HTTP/1.1: h2load --h1,
# one at a time); the difference of the two totals over 5,000 is the cost
# of a call, start-up and shutdown cancelling out.
#
#   bench/load/instructions.sh SLIDEGATE_BIN [LIMITADOR_BIN]
#
# slidegate serves bench/load/edge.yaml with one worker; Limitador its
# in-memory store with the same limit (as bench/load/peers.sh). Only
# servers this script starts, on loopback, are loaded. Needs valgrind and
# h2load (Debian: valgrind, nghttp2-client).
set -euo pipefail
cd "$(dirname "$0")/../.."
slidegate=${1:?slidegate binary}
limitador=${2:-}
http=127.0.0.1:18480
grpc=127.0.0.1:18481
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source bench/load/common.sh
# shellcheck disable=SC2059 # the bodies are formats
printf "$sg_body" 0 >"$work/sg.json"
# shellcheck disable=SC2059
printf "$li_body" 0 >"$work/li.json"

# total SERVER(slidegate|limitador) API(grpc|http) CALLS: the instructions
# of one server's whole run.
total() {
  local out="$work/callgrind.out"
  if curl -s -o /dev/null "http://$http/"; then
    echo "error: $http is already served by another process" >&2
    exit 1
  fi
  case $1 in
  slidegate)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$slidegate" serve \
      --config bench/load/edge.yaml --http "$http" --grpc "$grpc" \
      --memory-mib 64 --other-memory-mib 8 --workers 1 >/dev/null 2>&1 &
    ;;
  limitador)
    valgrind --tool=callgrind --callgrind-out-file="$out" "$limitador" \
      -b 127.0.0.1 -p "${grpc##*:}" -B 127.0.0.1 -P "${http##*:}" \
      bench/load/limitador.yaml memory -c 200000 >/dev/null 2>&1 &
    ;;
  esac
  local server=$!
  # Up when both ports answer (under valgrind one may open well after the other).
  for _ in $(seq 600); do
    curl -s -o /dev/null "http://$http/" && (: </dev/tcp/127.0.0.1/"${grpc##*:}") 2>/dev/null && break
    kill -0 $server 2>/dev/null || { echo "error: $1 did not start" >&2; exit 1; }
    sleep 0.1
  done
  local answered
  case $2 in
  grpc)
    answered=$(h2load -n "$3" -c 1 -m 10 -H 'content-type: application/grpc' -H 'te: trailers' \
      -d bench/load/grpc-hot.bin "http://$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" |
      awk '/^requests:/ { print $8 }')
    ;;
  http)
    local path=/json body="$work/sg.json"
    if [ "$1" = limitador ]; then path=/check_and_report body="$work/li.json"; fi
    answered=$(h2load --h1 -n "$3" -c 1 -m 1 -H 'content-type: application/json' -d "$body" \
      "http://$http$path" | awk '/^status codes:/ { print $3 }')
    ;;
  esac
  kill -INT $server
  wait $server 2>/dev/null || true
  if [ "$answered" != "$3" ]; then
    echo "error: $1 $2 answered $answered of $3 calls with success" >&2
    exit 1
  fi
  awk '/^summary:/ { print $2 }' "$out"
}

per_call() { # SERVER API
  local few many
  few=$(total "$1" "$2" 2000)
  many=$(total "$1" "$2" 7000)
  printf '%-10s %-5s %8d instructions per call\n' "$1" "$2" $(((many - few) / 5000))
}

for api in grpc http; do
  per_call slidegate $api
  if [ -n "$limitador" ]; then per_call limitador $api; fi
done
