#!/usr/bin/env bash
# `slidegate simulate`'s two replays on generated access logs of growing
# length: the accuracy replay (`--trace`, every algorithm against the exact
# oracle) and the what-if replay (`--config`, a config's rules through the
# service's engine): peak memory (the process's maximum resident set, from
# /usr/bin/time -v) and lines per second, to show that memory stays flat
# as the log grows. Nothing is sent over a network.
#
#   bench/traces/replay.sh SLIDEGATE_BIN [LINES ...]
#
# LINES defaults to 1000000 3000000 10000000. Each log is nginx's stock
# `main` format, one line every 10 ms on average (10 M lines cover about
# 28 hours), from 100,000 clients of Zipf-like popularity, a tenth of the
# lines on /login; it is written to a temporary folder and removed after.
# Needs python3 and /usr/bin/time (Debian: python3, time).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:?slidegate binary}
shift
sizes=("${@:-1000000 3000000 10000000}")
# shellcheck disable=SC2206
sizes=(${sizes[*]})
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/config.yaml" <<'YAML'
domain: shop
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 60 }
  - key: path
    value: /login
    rate_limit: { unit: second, requests_per_unit: 5 }
YAML
# One replay of the log: its figures on one line.
measure() {
  local name=$1 n=$2 size=$3
  shift 3
  /usr/bin/time -v -o "$dir/time.txt" "$@" >"$dir/out-$name.txt"
  secs=$(awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; print s }' "$dir/time.txt")
  rss=$(awk -F': ' '/Maximum resident set size/ { printf "%.1f", $2 / 1024 }' "$dir/time.txt")
  rate=$(awk -v n="$n" -v s="$secs" 'BEGIN { printf "%.0f", n / s }')
  printf '%-9s %-10s %10s %12s %14s %10s\n' "$name" "$n" "$secs" "$rate" "$rss" "$size"
}
printf '%-9s %-10s %10s %12s %14s %10s\n' replay lines seconds lines/s peak_rss_MiB log_MiB
for n in "${sizes[@]}"; do
  python3 - "$n" >"$dir/access.log" <<'PY'
import random, sys, time
n = int(sys.argv[1])
rng = random.Random(7)
t = 1700000000.0
out = sys.stdout
month = time.strftime
paths = ["/", "/cart", "/search", "/product/%d", "/login"]
buf = []
for i in range(n):
    t += rng.expovariate(100.0)
    c = int(100000 * rng.random() ** 3)
    p = "/login" if rng.random() < 0.1 else paths[rng.randrange(4)].replace("%d", str(rng.randrange(1000)))
    stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(t))
    buf.append(f'10.{c >> 16}.{(c >> 8) & 255}.{c & 255} - - [{stamp}] "GET {p} HTTP/1.1" 200 {rng.randrange(100, 9000)} "-" "bench/1.0" "-"\n')
    if len(buf) == 10000:
        out.write("".join(buf)); buf.clear()
out.write("".join(buf))
PY
  size=$(($(stat -c %s "$dir/access.log") >> 20))
  measure accuracy "$n" "$size" "$bin" simulate --trace "$dir/access.log" --limit 60 --window 1m
  measure what-if "$n" "$size" "$bin" simulate --config "$dir/config.yaml" --domain shop \
    --descriptor remote_address=client --other-descriptor path=path --trace "$dir/access.log"
done
echo
echo "the last replays' reports:"
cat "$dir/out-accuracy.txt" "$dir/out-what-if.txt"
