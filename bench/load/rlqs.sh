#!/usr/bin/env bash
# The rate limit quota service (RLQS) of slidegate serve under 1,000
# Envoys' rate_limit_quota filters, beside its ShouldRateLimit path as the
# reference: the server's CPU per bucket report against its CPU per
# decision, taking turns, a fresh server each run.
#
#   bench/load/rlqs.sh [SLIDEGATE_BIN] [RUNS] [ROUNDS]
#
# An RLQS run: `slidegate-bench rlqs` opens 1,000 StreamRateLimitQuotas
# streams over 20 HTTP/2 connections (50 streams each, under the server's
# default cap of 100), each with 100 bucket ids of its own
# ({route: checkout, tenant: s<stream>-b<n>}, 100,000 buckets in all, each
# matching one quota_buckets rule of 100,000 a minute); every stream sends
# its first report (every bucket new), then ROUNDS (default 10) rounds of
# its report of 100 buckets (time_elapsed 5 s), each waiting for its
# answer of 100 actions. An RLS run: h2load, 200,000 ShouldRateLimit calls
# on one hot key (-c64 -m10 -t2, bench/load/grpc-hot.bin), as
# bench/load/peers.sh. RUNS (default 3) of each, alternating.
#
# CPU is the server's utime + stime from /proc/PID/stat (clock ticks,
# getconf CLK_TCK) over the load; the RLQS figure is over the rounds alone
# (what a bucket costs every 5 s for as long as it lives) and, in
# brackets, over the whole run with the streams opened and the buckets
# created. Max RSS is the server's VmHWM. Medians of the runs; the ratio
# is each RLQS run's over the RLS run after it.
#
# SLIDEGATE_BIN defaults to a release build of slidegate-cli (built here);
# the load client is a release build of slidegate-bench (built here). Only
# the servers this script starts, on loopback, are loaded; every process
# it starts is ended on exit. Needs h2load and jq (Debian: nghttp2-client,
# jq).
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
slidegate=${1:-}
runs=${2:-3}
rounds=${3:-10}
if [ -z "$slidegate" ]; then
  cargo build -q --release -p slidegate-cli
  slidegate=$target/release/slidegate
fi
cargo build -q --release -p slidegate-bench
bench=$target/release/slidegate-bench
http=127.0.0.1:18780
grpc=127.0.0.1:18781
hz=$(getconf CLK_TCK)
work=$(mktemp -d)
server=
cleanup() {
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# One config folder for both loads: the RLS domain of edge.yaml, and the
# quota domain of the RLQS load.
mkdir "$work/config"
cp bench/load/edge.yaml "$work/config/edge.yaml"
cat >"$work/config/quota.yaml" <<'YAML'
domain: rlqs_bench
quota_buckets:
  - name: checkout
    bucket_id: { route: checkout, tenant: "*" }
    rate_limit: { unit: minute, requests_per_unit: 100000 }
YAML

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hwm_mib() { awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }
per() { # TICKS COUNT: µs per count
  awk -v t="$1" -v c="$2" -v hz="$hz" 'BEGIN { printf "%.3f", t / hz * 1e6 / c }'
}

start_server() {
  if curl -s -o /dev/null "http://$http/"; then
    echo "error: $http is already served by another process" >&2
    exit 1
  fi
  "$slidegate" serve --config "$work/config" --http "$http" --grpc "$grpc" \
    --memory-mib 64 --other-memory-mib 8 --rlqs-max-buckets 250000 2>"$work/server.log" &
  server=$!
  for _ in $(seq 200); do
    if curl -sf -o /dev/null "http://$http/readyz"; then return 0; fi
    kill -0 "$server" 2>/dev/null || break
    sleep 0.05
  done
  echo "error: the server did not become ready" >&2
  cat "$work/server.log" >&2
  exit 1
}

stop_server() {
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=
}

# rlqs_run N: appends "CPU_ROUNDS CPU_WHOLE REPORTS_PER_S HWM" to rlqs.txt.
rlqs_run() {
  start_server
  local before after out
  before=$(ticks "$server")
  out=$(timeout 300 "$bench" rlqs --grpc "$grpc" --streams 1000 --buckets 100 --rounds "$rounds" \
    --connections 20 --domain rlqs_bench --route checkout --server-pid "$server" --format json)
  after=$(ticks "$server")
  local hwm first rounds_reports rate cpu_rounds cpu_whole tb
  hwm=$(hwm_mib "$server")
  stop_server
  first=$(jq '.first.bucket_reports' <<<"$out")
  rounds_reports=$(jq '.rounds.bucket_reports' <<<"$out")
  tb=$(jq '.first.actions.token_bucket + .rounds.actions.token_bucket' <<<"$out")
  if [ "$tb" != "$((first + rounds_reports))" ]; then
    echo "warning: $tb token buckets for $((first + rounds_reports)) bucket reports:" \
      "$(jq -c '[.first.actions, .rounds.actions]' <<<"$out")" >&2
  fi
  if [ "$(jq '.closed_cleanly' <<<"$out")" != 1000 ]; then
    echo "warning: $(jq '.closed_cleanly' <<<"$out") of 1000 streams ended cleanly" >&2
  fi
  rate=$(jq '.rounds.bucket_reports_per_second | floor' <<<"$out")
  cpu_rounds=$(printf '%.3f' "$(jq '.rounds.server_cpu_us_per_bucket_report' <<<"$out")")
  cpu_whole=$(per $((after - before)) $((first + rounds_reports)))
  printf '%-7s %-58s %10s /s  cpu %7s µs (whole run %s)  p99 %s ms  max RSS %s MiB\n' \
    "rlqs $1" "bucket reports (1000 streams x 100 buckets, $rounds rounds)" "$rate" "$cpu_rounds" \
    "$cpu_whole" "$(printf '%.1f' "$(jq '.rounds.p99_ms' <<<"$out")")" "$hwm"
  echo "$cpu_rounds $cpu_whole $rate $hwm" >>"$work/rlqs.txt"
}

# rls_run N: appends "CPU DECISIONS_PER_S HWM" to rls.txt.
rls_run() {
  start_server
  local before after out calls rate cpu hwm
  before=$(ticks "$server")
  out=$(timeout 120 h2load -n 200000 -c 64 -m 10 -t 2 -H 'content-type: application/grpc' -H 'te: trailers' \
    -d bench/load/grpc-hot.bin "http://$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
  after=$(ticks "$server")
  hwm=$(hwm_mib "$server")
  stop_server
  calls=$(awk '/^requests:/ { print $8 }' <<<"$out")
  if [ "$calls" != 200000 ]; then
    echo "error: ShouldRateLimit answered $calls of 200000 calls with success" >&2
    exit 1
  fi
  rate=$(awk '/^finished in/ { printf "%d", $4 }' <<<"$out")
  cpu=$(per $((after - before)) "$calls")
  printf '%-7s %-58s %10s /s  cpu %7s µs  max RSS %s MiB\n' \
    "rls $1" "ShouldRateLimit decisions (h2load -c64 -m10, one key)" "$rate" "$cpu" "$hwm"
  echo "$cpu $rate $hwm" >>"$work/rls.txt"
}

for r in $(seq "$runs"); do
  rlqs_run "r$r"
  rls_run "r$r"
done

median() { # FILE COLUMN
  awk -v c="$2" '{ print $c }' "$1" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
ratios=$(paste -d' ' "$work/rlqs.txt" "$work/rls.txt" | awk '{ printf "%.2f\n", $1 / $5 }')
ratio=$(sort -g <<<"$ratios" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
echo "== medians of $runs runs"
printf 'RLQS: %s µs of server CPU per bucket report over the rounds (whole run %s), %s bucket reports/s, max RSS %s MiB\n' \
  "$(median "$work/rlqs.txt" 1)" "$(median "$work/rlqs.txt" 2)" "$(median "$work/rlqs.txt" 3)" "$(median "$work/rlqs.txt" 4)"
printf 'RLS:  %s µs of server CPU per ShouldRateLimit decision, %s decisions/s, max RSS %s MiB\n' \
  "$(median "$work/rls.txt" 1)" "$(median "$work/rls.txt" 2)" "$(median "$work/rls.txt" 3)"
printf 'ratio, CPU per bucket report / CPU per decision: %s (runs: %s)\n' "$ratio" "$(paste -sd' ' <<<"$ratios" | sed 's/ /, /g')"
