#!/usr/bin/env bash
# Instructions the tower layer spends on a request, counted by callgrind:
# slidegate-tower's `layer_calls` example (a trivial service behind the
# layer, as the `layer_overhead` criterion group) makes 5,000 calls in
# `run_calls`, whose instructions alone are counted (`--toggle-collect`),
# over 5,000; `bare` is the service without the layer, which the layer's
# cost is over. Given two builds of the example (before and after a change),
# prints both, case by case.
#
#   bench/load/tower-instructions.sh EXAMPLE_BIN [OTHER_EXAMPLE_BIN]
#
# Build it with `cargo build --release -p slidegate-tower --example
# layer_calls` (target/release/examples/layer_calls). Needs valgrind.
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# per_call BIN CASE: the instructions of one call in `run_calls`.
per_call() {
  valgrind --tool=callgrind --toggle-collect='*run_calls*' --callgrind-out-file="$work/out" "$1" 5000 "$2" >/dev/null 2>&1
  echo $(( $(grep -m1 '^summary:' "$work/out" | awk '{print $2}') / 5000 ))
}

printf '%-8s' case
for bin in "$@"; do printf '  %-10s' "$(basename "$(dirname "$bin")")"; done
echo
for case in bare hot quiet keys refused; do
  printf '%-8s' "$case"
  for bin in "$@"; do printf '  %-10s' "$(per_call "$bin" "$case")"; done
  echo
done
