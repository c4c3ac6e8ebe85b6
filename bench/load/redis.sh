#!/usr/bin/env bash
# `slidegate serve --redis` with batching on and off, taking turns, on a
# throw-away redis-server this script starts on loopback: decisions/s,
# latency, the server's CPU time per decision (utime + stime from
# /proc/PID/stat over the calls answered) and redis-server's (used_cpu_user
# + used_cpu_sys from INFO cpu over the same calls), and the machine's
# (every process's busy time from /proc/stat, the load generator's among
# them, with how many cores were busy on average). Every run is bounded
# (100,000 gRPC calls, 5 s of wrk).
#
#   bench/load/redis.sh SLIDEGATE_BIN [ROUNDS] [LIMITADOR_BIN]
#
# With LIMITADOR_BIN (`limitador-server` built from its public repository,
# as bench/load/peers.sh says), each round also runs Limitador's own
# `redis` store on the same Redis and limit, and slidegate (batching on)
# on the same HTTP load as Limitador: `POST /json` against its
# `/check_and_report`, 100,000 keys drawn at random.
#
# Needs redis-server, h2load and wrk (Debian: redis-server, nghttp2-client,
# wrk). Only servers this script starts, on loopback, are loaded.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:?slidegate binary}
rounds=${2:-3}
limitador=${3:-}
http=127.0.0.1:18280
grpc=127.0.0.1:18281
port=18279
hz=$(getconf CLK_TCK)
if redis-cli -p $port PING >/dev/null 2>&1; then
  echo "error: 127.0.0.1:$port is already taken" >&2
  exit 1
fi
redis-server --bind 127.0.0.1 --port $port --save "" --appendonly no >/dev/null &
redis=$!
work=$(mktemp -d)
trap 'kill $redis 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do redis-cli -p $port PING >/dev/null 2>&1 && break; sleep 0.05; done

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
redis_cpu() { redis-cli -p $port INFO cpu | awk -F: '/^used_cpu_(user|sys):/ { s += $2 } END { printf "%.6f", s }'; }

# The machine's busy and idle ticks so far, all CPUs (/proc/stat).
machine_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }

# report LABEL LOAD CALLS RATE LATENCY SERVER_TICKS REDIS_SECONDS BUSY_TICKS IDLE_TICKS:
# the machine's line is every process's CPU over the load (the load
# generator's among them), and how many of the cores were busy.
report() {
  awk -v l="$1" -v n="$2" -v c="$3" -v r="$4" -v lat="$5" -v t="$6" -v rs="$7" -v b="$8" -v i="$9" \
    -v hz="$hz" -v cores="$(nproc)" 'BEGIN {
    printf "%s %-8s %9.0f calls/s  %-14s  server %6.2f us/decision  redis %6.2f us/decision  machine %6.2f us/decision, %.2f of %d cores busy\n",
      l, n, r, lat, t / hz * 1e6 / c, rs * 1e6 / c, b / hz * 1e6 / c, cores * b / (b + i), cores }'
}

source bench/load/common.sh
wrk_script "$work/sg.lua" /json "$sg_body" 100000
wrk_script "$work/li.lua" /check_and_report "$li_body" 100000

# round LABEL SERVER HTTP_NAME WRK_SCRIPT HTTP_PATH: one round of both
# loads on a fresh server (SERVER: slidegate with batching on, or off
# (--no-redis-batching), or
# limitador): gRPC ShouldRateLimit on one hot key, 640 calls in flight,
# then 5 s of wrk over HTTP, 64 connections.
round() {
  local label=$1
  if curl -s -o /dev/null "http://$http/"; then
    echo "error: $http is already served by another process" >&2
    exit 1
  fi
  redis-cli -p $port FLUSHALL >/dev/null
  if [ "$2" = limitador ]; then
    "$limitador" -b 127.0.0.1 -p "${grpc##*:}" -B 127.0.0.1 -P "${http##*:}" \
      bench/load/limitador.yaml redis "redis://127.0.0.1:$port" >/dev/null 2>&1 &
  else
    local batching=()
    [ "$2" = off ] && batching=(--no-redis-batching)
    "$bin" serve --config bench/load/edge.yaml --http "$http" --grpc "$grpc" \
      --redis "redis://127.0.0.1:$port" "${batching[@]}" 2>/dev/null &
  fi
  local server=$!
  for _ in $(seq 200); do curl -s -o /dev/null "http://$http/" && break; sleep 0.05; done
  if ! kill -0 $server 2>/dev/null; then
    echo "error: the $2 server did not start" >&2
    exit 1
  fi
  local before after rbefore rafter out calls rate lat
  before=$(cpu_ticks $server); rbefore=$(redis_cpu); read -r mbusy midle < <(machine_ticks)
  out=$(h2load -n 100000 -c 64 -m 10 -t 2 -H 'content-type: application/grpc' -H 'te: trailers' \
    -d bench/load/grpc-hot.bin "http://$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
  after=$(cpu_ticks $server); rafter=$(redis_cpu); read -r mbusy2 midle2 < <(machine_ticks)
  calls=$(echo "$out" | awk '/^requests:/ { print $8 }')
  rate=$(echo "$out" | awk '/^finished in/ { print $4 }')
  lat=$(echo "$out" | awk '/^time for request:/ { print $6 }')
  report "$label" grpc "$calls" "$rate" "mean $lat" $((after - before)) "$(echo "$rafter - $rbefore" | bc -l)" \
    $((mbusy2 - mbusy)) $((midle2 - midle))
  before=$(cpu_ticks $server); rbefore=$(redis_cpu); read -r mbusy midle < <(machine_ticks)
  out=$(wrk -t2 -c64 -d5s --latency -s "$4" "http://$http$5")
  after=$(cpu_ticks $server); rafter=$(redis_cpu); read -r mbusy2 midle2 < <(machine_ticks)
  if echo "$out" | grep -q "Non-2xx"; then
    echo "error: the $2 server answered non-2xx statuses" >&2
    exit 1
  fi
  calls=$(echo "$out" | awk '/ requests in / { print $1 }')
  rate=$(echo "$out" | awk '/Requests\/sec/ { print $2 }')
  lat=$(echo "$out" | awk '/^ +99%/ { print $2 }')
  report "$label" "$3" "$calls" "$rate" "p99 $lat" $((after - before)) "$(echo "$rafter - $rbefore" | bc -l)" \
    $((mbusy2 - mbusy)) $((midle2 - midle))
  kill $server
  wait $server 2>/dev/null || true
}

# Batching on and off over the ad-hoc API (bench/load/many.lua: 100,000
# keys through POST /v1/check); with Limitador, both services on /json and
# /check_and_report over 100,000 keys.
for r in $(seq "$rounds"); do
  round "on   r$r" on 100k bench/load/many.lua /v1/check
  round "off  r$r" off 100k bench/load/many.lua /v1/check
  if [ -n "$limitador" ]; then
    round "sg   r$r" on json100k "$work/sg.lua" /
    round "li   r$r" limitador json100k "$work/li.lua" /
  fi
done
