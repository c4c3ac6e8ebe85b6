#!/usr/bin/env bash
# Instructions per decision of the library against governor (its default
# features: the quanta clock), counted by callgrind, which repeats whatever
# else the machine does. Each case runs the `decisions` example of
# slidegate-memory twice, at 1,000,000 and 2,000,000 decisions; the
# difference of the two totals over 1,000,000 is a decision's cost (the
# clock read included), start-up cancelling out.
#
#   bench/load/library-instructions.sh [CASE...]
#
# CASE as the example takes it: a name and its words, quoted, such as
# "sw8 refused" or "gcra headers"; by default every direct and keyed case,
# admitted and refused, yes-or-no and with the headers' figures. Needs
# valgrind. Builds the example in release (the workspace's fat LTO).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --quiet -p slidegate-memory --example decisions
bin=${CARGO_TARGET_DIR:-target}/release/examples/decisions
if [ $# -eq 0 ]; then
  set -- governor sw2 sw8 fixed gcra \
    "governor refused" "sw2 refused" "sw8 refused" "gcra refused" \
    "governor headers" "sw2 headers" "sw8 headers" "fixed headers" "gcra headers" \
    "governor refused headers" "sw2 refused headers" "sw8 refused headers" "gcra refused headers" \
    governor-keyed keyed "governor-keyed refused" "keyed refused" \
    "governor-keyed headers" "keyed headers" "governor-keyed refused headers" "keyed refused headers"
fi
# total COUNT CASE WORDS...: the instructions of one whole run.
total() {
  local count=$1 name=$2
  shift 2
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$name" "$count" "$@" 2>&1 |
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf '%-28s %s\n' case "instructions a decision"
for case in "$@"; do
  # shellcheck disable=SC2086 # a case is its words
  set -- $case
  small=$(total 1000000 "$@")
  large=$(total 2000000 "$@")
  printf '%-28s %d\n' "$case" $(((large - small) / 1000000))
done
