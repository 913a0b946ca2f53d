#!/usr/bin/env bash
# schedwait.sh -- how long the testbed's processes wait for a core: one perf/compare.sh run of one
# config at 1 Gbit/s, sampling /proc/PID/task/*/schedstat (CPU time, run-queue wait) of the ranks
# and thc-aggregator in the testbed's namespaces every 0.2 s. Root (network namespaces).
#
# Usage: perf/model/schedwait.sh [--config thc-agg-switch] [--size 64M] [--iters 5] [--out DIR]
#
# Prints the tool's row and, per process, CPU and run-queue wait from its first to its last sample
# (a rank's include its setup; the aggregator only serves calls: warm-up, timed and check calls,
# iters + 2 in all).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CFG=thc-agg-switch SIZE=64M ITERS=5 OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) CFG="$2"; shift 2 ;;
    --size) SIZE="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2; exit 2 ;;
    *) echo "schedwait.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ $EUID -eq 0 ]] || { echo "schedwait.sh: needs root (network namespaces)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
[[ -n "$OUT" ]] || OUT="$TMP/run"
P=schedw$$
bash "$ROOT/perf/compare.sh" --prefix "$P" --out "$OUT" --rates 1gbit --min-size "$SIZE" --max-size "$SIZE" \
  --iters "$ITERS" --configs "$CFG" > "$TMP/compare.log" 2>&1 &
cpid=$!
declare -A cpu0 wait0 cpu1 wait1 name
while kill -0 "$cpid" 2>/dev/null; do
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$P-" || true); do
    for p in $(ip netns pids "$ns" 2>/dev/null || true); do
      n=$(cat "/proc/$p/comm" 2>/dev/null || true)
      [[ "$n" == thc_allreduce_p || "$n" == thc-aggregator ]] || continue
      read -r a b < <(cat /proc/"$p"/task/*/schedstat 2>/dev/null | awk '{a += $1; b += $2} END {printf "%d %d\n", a, b}') || continue
      [[ -n "${cpu0[$p]:-}" ]] || { cpu0[$p]=$a; wait0[$p]=$b; }
      cpu1[$p]=$a; wait1[$p]=$b; name[$p]=$n
    done
  done
  sleep 0.2
done
wait "$cpid" || { tail -30 "$TMP/compare.log" >&2; exit 1; }
grep -h "float" "$OUT"/raw/*.log | grep -v '^#' || true
for p in "${!name[@]}"; do
  printf '%-16s pid %-7s cpu %6d ms  run-queue wait %6d ms\n' "${name[$p]}" "$p" \
    $(( (cpu1[$p] - cpu0[$p]) / 1000000 )) $(( (wait1[$p] - wait0[$p]) / 1000000 ))
done
