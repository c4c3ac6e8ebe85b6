#!/usr/bin/env bash
# slidegate serve beside Limitador's server (when a build of it is given),
# taking turns, a fresh server each round: for each load, decisions/s, the
# p99 latency, and the server's CPU time per decision (utime + stime from
# /proc/PID/stat over the calls answered). The load generators are separate
# processes on the same cores (h2load, wrk; Debian: nghttp2-client, wrk)
# and the in-repo gRPC generator (`grpc_load`); every run is bounded
# (5 s, or 200,000 calls).
#
#   bench/load/peers.sh SLIDEGATE_BIN [LIMITADOR_BIN] [ROUNDS]
#
# LIMITADOR_BIN is `limitador-server` built from its public repository
# (its build needs Debian's libclang-dev, clang and protobuf-compiler),
# run with its in-memory store on the same limit: 10⁹ a second per
# `remote_address` of domain (namespace) `edge_proxy`, so that every call
# is counted and admitted. Only servers this script starts, on loopback,
# are loaded.
set -euo pipefail
cd "$(dirname "$0")/../.."
slidegate=${1:?slidegate binary}
limitador=${2:-}
rounds=${3:-3}
http=127.0.0.1:18380
grpc=127.0.0.1:18381
hz=$(getconf CLK_TCK)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo build -q --release -p slidegate-server --example grpc_load
grpc_load=target/release/examples/grpc_load

source bench/load/common.sh
# wrk scripts: one hot key, and 100,000 keys drawn at random.
wrk_script "$work/sg-hot.lua" /json "$sg_body" 1
wrk_script "$work/sg-many.lua" /json "$sg_body" 100000
wrk_script "$work/li-hot.lua" /check_and_report "$li_body" 1
wrk_script "$work/li-many.lua" /check_and_report "$li_body" 100000

# The server's CPU ticks: user + system, and system alone, as "TOTAL:SYSTEM".
cpu_ticks() { awk '{ print $14 + $15 ":" $15 }' "/proc/$1/stat"; }
# The ticks between two readings of cpu_ticks, as "TOTAL SYSTEM".
ticks_between() { echo "$((${2%%:*} - ${1%%:*})) $((${2##*:} - ${1##*:}))"; }
cpu_per() { # TICKS CALLS
  awk -v t="$1" -v c="$2" -v hz="$hz" 'BEGIN { if (c > 0) printf "%.2f", t / hz * 1e6 / c; else print "-" }'
}

# line LABEL LOAD CALLS_PER_S P99 "TICKS SYSTEM_TICKS" CALLS
line() {
  local ticks=${5% *} system=${5#* }
  printf "%-16s %-34s %10.0f calls/s  p99 %10s  cpu %6s us/decision (system %s)\n" \
    "$1" "$2" "$3" "$4" "$(cpu_per "$ticks" "$6")" "$(cpu_per "$system" "$6")"
}

wrk_load() { # LABEL LOAD SCRIPT PID
  local before after out
  before=$(cpu_ticks "$4")
  out=$(wrk -t2 -c64 -d5s --latency -s "$3" "http://$http/")
  after=$(cpu_ticks "$4")
  local calls rps p99
  calls=$(echo "$out" | awk '/ requests in / { print $1 }')
  rps=$(echo "$out" | awk '/Requests\/sec/ { print $2 }')
  p99=$(echo "$out" | awk '/^ +99%/ { print $2 }')
  if echo "$out" | grep -q "Non-2xx"; then
    echo "error: $1 answered non-2xx statuses to $2" >&2
    exit 1
  fi
  line "$1" "$2" "$rps" "$p99" "$(ticks_between "$before" "$after")" "$calls"
}

grpc_loads() { # LABEL PID
  local before after out calls rps
  before=$(cpu_ticks "$2")
  out=$(h2load -n 200000 -c 64 -m 10 -t 2 -H 'content-type: application/grpc' -H 'te: trailers' \
    -d bench/load/grpc-hot.bin "http://$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
  after=$(cpu_ticks "$2")
  calls=$(echo "$out" | awk '/^requests:/ { print $8 }')
  rps=$(echo "$out" | awk '/^finished in/ { print $4 }')
  line "$1" "gRPC hot key (h2load -c64 -m10)" "$rps" "-" "$(ticks_between "$before" "$after")" "$calls"
  for keys in 1 100000; do
    before=$(cpu_ticks "$2")
    out=$("$grpc_load" "$grpc" "$keys" 5 4 64)
    after=$(cpu_ticks "$2")
    calls=$(echo "$out" | awk '{ print $1 }')
    rps=$(echo "$out" | sed -E 's/.*: ([0-9]+) calls\/s.*/\1/')
    p99=$(echo "$out" | sed -E 's/.*p99 ([0-9.]+) ms.*/\1ms/')
    line "$1" "gRPC $keys keys (grpc_load 4x64)" "$rps" "$p99" "$(ticks_between "$before" "$after")" "$calls"
  done
}

wait_up() { # PID
  for _ in $(seq 200); do
    if curl -s -o /dev/null "http://$http/"; then return 0; fi
    kill -0 "$1" 2>/dev/null || break
    sleep 0.05
  done
  echo "error: the server did not start" >&2
  exit 1
}

busy() {
  if curl -s -o /dev/null "http://$http/"; then
    echo "error: $http is already served by another process" >&2
    exit 1
  fi
}

run_slidegate() { # LABEL
  busy
  "$slidegate" serve --config bench/load/edge.yaml --http "$http" --grpc "$grpc" \
    --memory-mib 64 --other-memory-mib 8 2>/dev/null &
  local server=$!
  wait_up $server
  grpc_loads "$1" $server
  wrk_load "$1" "HTTP /json hot key (wrk -c64)" "$work/sg-hot.lua" $server
  wrk_load "$1" "HTTP /json 100000 keys (wrk -c64)" "$work/sg-many.lua" $server
  kill $server
  wait $server 2>/dev/null || true
}

run_limitador() { # LABEL
  busy
  # `memory -c`: a counter cache large enough for the 100,000 keys (its
  # default is sized from the free memory).
  "$limitador" -b 127.0.0.1 -p "${grpc##*:}" -B 127.0.0.1 -P "${http##*:}" \
    bench/load/limitador.yaml memory -c 200000 >/dev/null 2>&1 &
  local server=$!
  wait_up $server
  grpc_loads "$1" $server
  wrk_load "$1" "HTTP check_and_report hot key" "$work/li-hot.lua" $server
  wrk_load "$1" "HTTP check_and_report 100000 keys" "$work/li-many.lua" $server
  kill $server
  wait $server 2>/dev/null || true
}

for r in $(seq "$rounds"); do
  run_slidegate "slidegate r$r"
  if [ -n "$limitador" ]; then
    run_limitador "limitador r$r"
  fi
done
