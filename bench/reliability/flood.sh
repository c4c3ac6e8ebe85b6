#!/usr/bin/env bash
# A flood of distinct keys through `slidegate serve` (gRPC, `remote_address`
# values k0, k1, ..., PER_CALL descriptors per call) with a --memory-mib budget,
# sampling the server's RSS and its store figures; fails if the RSS ever
# went over the budget plus a fixed baseline.
#
#   bench/reliability/flood.sh [KEYS=10000000] [MEMORY_MIB=64] [BASELINE_MIB=32] [PER_CALL=8]
#
# The baseline is what the process holds besides its stores (code, the
# runtime, buffers): about 10 MiB idle (RELIABILITY.md).
source "$(dirname "$0")/common.sh"
keys=${1:-10000000}
mib=${2:-64}
baseline=${3:-32}
per_call=${4:-8}
other=8
config=bench/reliability/flood.yaml
start_server --memory-mib "$mib" --other-memory-mib "$other"
echo "== flood: $keys keys, --memory-mib $mib --other-memory-mib $other (gRPC $grpc, HTTP $http, pid $server)"
$load flood "$grpc" "$http" "$server" "$keys" "$per_call" 32 | tee /dev/stderr > "$log.out"
max=$(sed -n 's/^max_rss_kib=//p' "$log.out"); rm -f "$log.out"
bound=$(( (mib + other + baseline) * 1024 ))
echo "max RSS $((max / 1024)) MiB; bound $((bound / 1024)) MiB (budget $mib + $other MiB, baseline $baseline MiB)"
stop_server
[ "$max" -le "$bound" ] || { echo "RSS over the bound"; exit 1; }
