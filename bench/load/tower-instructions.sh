#!/usr/bin/env bash
# Instructions the tower layer spends on a request, counted by callgrind:
# slidegate-tower's `layer_calls` example (a trivial service behind the
# layer, as the `layer_overhead` criterion group) runs 2,000 and then
# 7,000 calls; the difference of the two totals over 5,000 is the cost of
# a call through the layer, start-up cancelling out. Given two builds of
# the example (before and after a change), prints both, case by case.
#
#   bench/load/tower-instructions.sh EXAMPLE_BIN [OTHER_EXAMPLE_BIN]
#
# Build it with `cargo build --release -p slidegate-tower --example
# layer_calls` (target/release/examples/layer_calls). Needs valgrind.
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# total BIN CALLS CASE: the instructions of one whole run.
total() {
  valgrind --tool=callgrind --callgrind-out-file="$work/out" "$1" "$2" "$3" >/dev/null 2>&1
  grep -m1 '^summary:' "$work/out" | awk '{print $2}'
}

printf '%-8s' case
for bin in "$@"; do printf '  %-24s' "$(basename "$(dirname "$(dirname "$(dirname "$bin")")")")"; done
echo
for case in hot quiet keys refused; do
  printf '%-8s' "$case"
  for bin in "$@"; do
    small=$(total "$bin" 2000 "$case")
    large=$(total "$bin" 7000 "$case")
    printf '  %-24s' "$(( (large - small) / 5000 ))"
  done
  echo
done
