#!/usr/bin/env bash
# What a new key's state costs redis-server to read and write, by the form
# the state takes, counted by callgrind (instructions per request, as
# bench/load/redis-instructions.sh counts them: a throw-away server under
# valgrind answers 300 and then 0 or 2,000 more calls, on keys drawn from a
# million, so nearly every call meets a key of its own; the difference of
# the two totals over 2,000). Each form is a script of the writes alone,
# the figures of a sliding window's first request (its newest bucket, its
# count, its expiry):
#
#   hash      the scripts' form: HGETALL, HSET of the bucket and `n`, PEXPIRE,
#             the figures passed as Lua numbers (as the scripts pass them)
#   hash-format  the same with the figures made text by the script
#             (string.format '%d')
#   hash-text the same with the figures written as literal text: what the
#             numbers' formatting costs, as a bound (a script must make its
#             text somehow)
#   packed    one string: GET, then SET .. PX of the figures packed as
#             64-bit integers (struct.pack), no hash and no number text
#   none      a script that returns at once: the call's own cost
#
#   bench/load/redis-state.sh [REDIS_SERVER_BIN]
#
# Only the server this script starts, on loopback, is called. Needs valgrind
# and redis-benchmark.
set -euo pipefail
redis=${1:-redis-server}
port=18491
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if redis-cli -p $port ping >/dev/null 2>&1; then
  echo "error: 127.0.0.1:$port is already served by another process" >&2
  exit 1
fi

# total CALLS SCRIPT: the instructions of a whole run of the server.
total() {
  local calls=$1 script=$2 out="$work/callgrind.out"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$redis" --port $port \
    --bind 127.0.0.1 --save '' --appendonly no >/dev/null 2>&1 &
  local server=$!
  for _ in $(seq 300); do redis-cli -p $port ping >/dev/null 2>&1 && break; sleep 0.1; done
  local sha
  sha=$(redis-cli -p $port SCRIPT LOAD "$script")
  for n in 300 "$calls"; do
    if [ "$n" -gt 0 ]; then
      redis-benchmark -p $port -c 1 -P 10 -r 1000000 -n "$n" EVALSHA "$sha" 1 'k:__rand_int__' >/dev/null
    fi
  done
  redis-cli -p $port SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait $server 2>/dev/null || true
  awk '/^summary:/ { print $2 }' "$out"
}

# per_request NAME SCRIPT
per_request() {
  local a b
  a=$(total 0 "$2")
  b=$(total 2000 "$2")
  printf '%-12s %8d instructions a request\n' "$1" $(((b - a) / 2000))
}

figures="local bucket, count, ttl = 1733240000, 1, 2000"
per_request hash "$figures
redis.call('HGETALL', KEYS[1])
redis.call('HSET', KEYS[1], 'n', bucket, bucket, count)
redis.call('PEXPIRE', KEYS[1], ttl)
return 1"
per_request hash-format "$figures
local function int(x) return string.format('%d', x) end
redis.call('HGETALL', KEYS[1])
redis.call('HSET', KEYS[1], 'n', int(bucket), int(bucket), int(count))
redis.call('PEXPIRE', KEYS[1], int(ttl))
return 1"
per_request hash-text "redis.call('HGETALL', KEYS[1])
redis.call('HSET', KEYS[1], 'n', '1733240000', '1733240000', '1')
redis.call('PEXPIRE', KEYS[1], '2000')
return 1"
per_request packed "$figures
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], struct.pack('<i8i8', bucket, count), 'PX', ttl)
return 1"
per_request none "return 1"
