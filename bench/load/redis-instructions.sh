#!/usr/bin/env bash
# Instructions per request inside redis-server for the store's two scripts
# (`scripts::ONE`, `scripts::MULTI`), called as the store calls them (`FCALL`
# of their Redis functions; `evalsha` as the second argument: by `EVALSHA`,
# as the store calls them on a server that will not load a function),
# counted by callgrind, which repeats
# to within about a percent whatever else the machine does. For each case a
# throw-away redis-server runs under valgrind twice, each time warmed with
# 300 calls of the case and then answering 0 and then 1,000 more
# (redis-benchmark, 10 pipelined); the difference of the two totals over
# the requests is a request's cost, start-up and shutdown cancelling out.
#
#   bench/load/redis-instructions.sh [REDIS_SERVER_BIN] [fcall|evalsha]
#
# The limits are `slidegate-bench`'s (10⁶ a second: every request passes);
# the time is the server's. Only servers this script starts, on loopback,
# are called. Needs valgrind and redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/../.."
redis=${1:-redis-server}
how=${2:-fcall}
port=18490
cargo build -q -p slidegate-redis --example script
case $how in
fcall)
  one=$(target/debug/examples/script one-function)
  multi=$(target/debug/examples/script multi-function)
  ;;
evalsha)
  one=$(target/debug/examples/script one)
  multi=$(target/debug/examples/script multi)
  ;;
*)
  echo "error: call by fcall or evalsha, not $how" >&2
  exit 2
  ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if redis-cli -p $port ping >/dev/null 2>&1; then
  echo "error: 127.0.0.1:$port is already served by another process" >&2
  exit 1
fi

# Each limit as the scripts take it: the algorithm and its four figures.
sw8=(w 142858 8 1000000 1)
fw=(f 1000000 1000000 0 0)
gcra=(g 1 1000000 1000000 0)

# total CALLS SCRIPT ARGS...: the instructions of a whole run of the server.
total() {
  local calls=$1 script=$2
  shift 2
  local out="$work/callgrind.out"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$redis" --port $port \
    --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
  local server=$!
  for _ in $(seq 300); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.1; done
  local call
  if [ "$how" = fcall ]; then
    redis-cli -p $port FUNCTION LOAD REPLACE "$script" >/dev/null
    # The library's name, which is its function's: `#!lua name=<name>`.
    call=(FCALL "$(head -1 <<<"$script" | sed 's/.*name=//')")
  else
    call=(EVALSHA "$(redis-cli -p $port SCRIPT LOAD "$script")")
  fi
  for n in 300 "$calls"; do
    if [ "$n" -gt 0 ]; then
      redis-benchmark -p $port -c 1 -P 10 -r 3000 -n "$n" "${call[@]}" "$@" >/dev/null
    fi
  done
  redis-cli -p $port SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait $server 2>/dev/null || true
  awk '/^summary:/ { print $2 }' "$out"
}

# per_request NAME REQUESTS_A_CALL SCRIPT ARGS...
per_request() {
  local name=$1 per=$2
  shift 2
  local none many
  none=$(total 0 "$@")
  many=$(total 1000 "$@")
  printf '%-58s %8d instructions a request\n' "$name" $(((many - none) / (1000 * per)))
}

for limit in sw8 fw gcra; do
  declare -n figures=$limit
  per_request "$limit, a request alone (ONE)" 1 "$one" 1 "sg:$limit:{hot}" "${figures[@]}" -1 1 1
  # MULTI's arguments: no cache, one shape (decides, one limit), one run
  # (its shape), the server's time, the cost.
  per_request "$limit, a request alone (MULTI)" 1 "$multi" 1 "sg:m$limit:{one}" \
    0 1 d 1 "${figures[@]}" 1 1 -1 1
  per_request "$limit, one hot key, a run of 32 (ONE)" 32 "$one" 1 "sg:$limit:{hot}" "${figures[@]}" -1 1 32
  # Caching, and one run of 32 (its shape negated, its length).
  per_request "$limit, one hot key, a run of 32 (MULTI)" 32 "$multi" 1 "sg:m$limit:{hot}" \
    1 1 d 1 "${figures[@]}" 1 -1 32 -1 1
done
# 32 requests on keys drawn from 3,000, each its own shape and run.
keys=() args=(0 32)
for i in $(seq 32); do
  keys+=("sg:many:{__rand_int__}")
  args+=(d 1 "${sw8[@]}")
done
args+=(32)
for i in $(seq 32); do args+=("$i" -1 1); done
per_request "sw8, 32 keys of 3,000 in one call (MULTI)" 32 "$multi" 32 "${keys[@]}" "${args[@]}"
