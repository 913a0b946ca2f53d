#!/usr/bin/env bash
# ompi_wait.sh -- what Open MPI's ring steps wait for on the testbed: the float32 and bf16 rings
# (coll_tuned_allreduce_algorithm 4) at 1 Gbit/s with TCP's slow start after idle on and off in every
# namespace, and with Open MPI busy-polling or yielding the core while it waits.
#
# Usage (root: network namespaces):
#   perf/model/ompi_wait.sh [--out DIR] [--variants "busy ssai0 yield"] [--min-size 256K] [--max-size 16M]
#                           [--factor 4] [--iters 10] [--bin-dir DIR]
#
#   busy   the testbed as compare.sh runs it (Open MPI busy-polls: each emulated host declares one
#          slot, so Open MPI does not see that its 4 ranks share this machine's cores)
#   ssai0  busy, with net.ipv4.tcp_slow_start_after_idle=0 in every namespace of the testbed
#   yield  --mca mpi_yield_when_idle 1 (compare.sh --mpi-yield)
#
# Prints per variant, scheme and size: the time per call (slowest rank, mean of --iters) and the CPU
# per call per rank (user+sys); then each host's TCP counters over the variant (nstat: retransmissions,
# tail-loss probes, delayed ACKs) and, a few seconds into its first run, cwnd, ssthresh, rtt and rto
# of every established connection (ss -ti). Raw logs in DIR.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=""
VARIANTS="busy ssai0 yield"
MIN=256K MAX=16M FACTOR=4 ITERS=10
BIN="$ROOT/build/perf/allreduce_perf"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --variants) VARIANTS="$2"; shift 2 ;;
    --min-size) MIN="$2"; shift 2 ;;
    --max-size) MAX="$2"; shift 2 ;;
    --factor) FACTOR="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --bin-dir) BIN="$2"; shift 2 ;;
    --inside) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
    *) echo "ompi_wait.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for v in $VARIANTS; do
  [[ $v == busy || $v == ssai0 || $v == yield ]] || { echo "ompi_wait.sh: unknown variant '$v'" >&2; exit 2; }
done
TOOL="$BIN/thc_allreduce_perf"
[[ -x "$TOOL" ]] || { echo "ompi_wait.sh: $TOOL not built" >&2; exit 2; }

if [[ -z "${THC_TESTBED_PREFIX:-}" ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "ompi_wait.sh: the testbed needs root" >&2; exit 2; }
  OUT=${OUT:-ompi-wait-$(date +%Y%m%d-%H%M%S)}
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  exec bash "$ROOT/perf/testbed/netns_cluster.sh" --hosts 4 --rate 1gbit --prefix "ow$$" -- \
    bash "$0" --out "$OUT" --variants "$VARIANTS" --min-size "$MIN" --max-size "$MAX" --factor "$FACTOR" \
    --iters "$ITERS" --bin-dir "$BIN" --inside
fi

# Inside the testbed's h0.
ALL_NS=$(ip netns list | awk '{print $1}' | grep "^$THC_TESTBED_PREFIX-")
HOST_NS=$(grep -- "-h[0-9]*$" <<<"$ALL_NS")
for var in $VARIANTS; do
  ssai=1 extra=()
  [[ $var == ssai0 ]] && ssai=0
  [[ $var == yield ]] && extra=(--mca mpi_yield_when_idle 1)
  for ns in $ALL_NS; do ip netns exec "$ns" sysctl -qw net.ipv4.tcp_slow_start_after_idle=$ssai; done
  for ns in $HOST_NS; do ip netns exec "$ns" nstat -n > /dev/null; done
  first=1
  for s in none bf16; do
    if (( first )); then
      ( sleep 3
        for ns in $HOST_NS; do
          echo "$ns: $(ip netns exec "$ns" ss -tin state established | grep -o 'cwnd:[0-9]*\|ssthresh:[0-9]*\|rto:[0-9.]*\|rtt:[0-9.]*/' | tr '\n' ' ')"
        done ) > "$OUT/$var.ss" &
      first=0
    fi
    # shellcheck disable=SC2086
    mpirun -np 4 $THC_TESTBED_MPIRUN_ARGS "${extra[@]+"${extra[@]}"}" \
      --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 \
      "$TOOL" -b "$MIN" -e "$MAX" -f "$FACTOR" -n "$ITERS" -w 2 -c 0 --scheme "$s" > "$OUT/${var}_$s.log" 2>&1 \
      || { echo "ompi_wait.sh: $var $s failed:" >&2; tail -20 "$OUT/${var}_$s.log" >&2; exit 1; }
    wait
    echo "== $var $s-ring (load $(cut -d' ' -f1-3 /proc/loadavg))"
    awk '/^ +[0-9]/ { printf "%10s B  %9.1f ms", $1, $5 / 1000 } /cpu:/ { printf "   cpu %s ms per rank\n", $3 }' "$OUT/${var}_$s.log"
  done
  for ns in $HOST_NS; do
    echo "nstat $ns: $(ip netns exec "$ns" nstat 2>/dev/null | awk '/TcpRetransSegs|TCPLossProbes|DelayedACK/ {printf "%s=%s ", $1, $2}')"
  done
  echo "ss (a few seconds into the first run):"
  cat "$OUT/$var.ss"
done
