#!/usr/bin/env bash
# straggler.sh -- partial aggregation as a user sees it, on the emulated cluster: 4 workers (one per
# testbed host, 1 Gbit/s links), thc-aggregator where the switch is, 64 MB float32 per call.
# Three scenarios, each a fresh job:
#   straggler  quorum 3 of 4; the last worker sleeps 2 s before its second call: how long do the
#              other three wait in that call?
#   dead       quorum 3 of 4; the last worker dies (exits without leaving) after its first call:
#              do the others go on, and how long does their next call take?
#   noquorum   no quorum; the last worker dies: the others must fail with THC_ERR_TIMEOUT within
#              THC_TIMEOUT_MS (here 5000 ms) + 1 s, not hang.
#
#   perf/straggler.sh [--rate 1gbit] [--count 16777216] [--bin-dir build] [--scheme thc]
# Needs root (network namespaces). Prints each worker's lines and a summary.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
RATE=1gbit
COUNT=16777216
BIN=""
SCHEME=thc
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rate) RATE="$2"; shift 2 ;;
    --count) COUNT="$2"; shift 2 ;;
    --bin-dir) BIN="$2"; shift 2 ;;
    --scheme) SCHEME="$2"; shift 2 ;;
    --inside) shift; break ;;
    *) echo "straggler.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ "${1:-}" != run ]]; then
  [[ -n "$BIN" ]] || BIN="$ROOT/build"
  BIN=$(cd "$BIN" && pwd)
  for f in "$BIN/perf/aggregator_bench/thc_straggler_bench" "$BIN/switch_offload/thc-aggregator"; do
    [[ -x "$f" ]] || { echo "straggler.sh: $f not built" >&2; exit 2; }
  done
  exec bash "$HERE/testbed/netns_cluster.sh" --hosts 4 --rate "$RATE" --switch-ip --prefix "thcstr$$" -- \
    bash "$HERE/straggler.sh" --inside run "$BIN" "$COUNT" "$SCHEME"
fi
BIN=$2 COUNT=$3 SCHEME=$4
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$TMP"' EXIT
export THC_AGGREGATOR_KEY_FILE="$TMP/keys"
ip netns exec "$THC_TESTBED_BRIDGE_NS" "$BIN/switch_offload/thc-aggregator" --key-file "$THC_AGGREGATOR_KEY_FILE" \
  --create-key-file --bind "$THC_TESTBED_SWITCH_IP" --port 9471 --stats-interval 0 --port-file "$TMP/port" \
  >"$TMP/agg.log" 2>&1 &
AGG=$!
while [[ ! -s "$TMP/port" ]]; do sleep 0.1; done
URL="udp://$THC_TESTBED_SWITCH_IP:9471"

scenario() {  # NAME JOB ARGS...
  local name=$1 job=$2; shift 2
  local pids=() r
  for r in 0 1 2 3; do
    ip netns exec "${THC_TESTBED_PREFIX}-h$r" "$BIN/perf/aggregator_bench/thc_straggler_bench" --aggregator "$URL" \
      --rank $r --world 4 --job "$job" --count "$COUNT" --scheme "$SCHEME" "$@" >"$TMP/$name.$r" 2>&1 &
    pids+=($!)
  done
  for r in 0 1 2 3; do wait "${pids[$r]}" || true; done
  echo "== $name ($*)"
  cat "$TMP/$name".{0,1,2,3} | sort -k4,4n -k2,2n
}
scenario straggler 201 --quorum 3 --calls 3 --straggle-ms 2000
scenario dead 202 --quorum 3 --calls 3 --die
scenario noquorum 203 --calls 2 --die --timeout-ms 5000
kill -TERM "$AGG"; wait "$AGG" || true
echo "== aggregator"
tail -1 "$TMP/agg.log" | tr ' ' '\n' | grep -E "^(partial_completions|late_not_counted|left_behind|stuck_completions|retransmissions)="
echo "== summary (call 2 of the first three ranks: the call the last one was late for, or died before)"
for s in straggler dead noquorum; do
  awk -v s=$s '$1 == "rank" && $2 < 3 && $4 == 2 { printf "%s rank %s: %s in %s ms\n", s, $2, $6, $8 }' "$TMP/$s".{0,1,2}
done
