#!/usr/bin/env bash
# Build the libFuzzer targets with clang and fuzz the packet parser and the aggregator state
# machine for SECONDS in total (half each).
#
#   switch_offload/fuzz/run_fuzz.sh BUILD_DIR SECONDS
#
# Configures switch_offload on its own (its CMakeLists.txt can be a top level), so the rest of the
# project need not build with clang. The checked-in corpus seeds each run; inputs the fuzzer
# finds go to BUILD_DIR/corpus-*, crashes to BUILD_DIR/artifacts. Exit status is non-zero if a
# fuzzer found a crash or a violated invariant. To keep a new finding as a regression test, copy
# it into switch_offload/fuzz/corpus/{packet,engine}/ (the switch_fuzz_corpus_test replays it).
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
BUILD=$1
SECONDS_TOTAL=$2
SRC=$(cd "$(dirname "$0")/.." && pwd)   # switch_offload/
CC_BIN=${CC:-clang}
CXX_BIN=${CXX:-clang++}
case "$CXX_BIN" in *clang*) ;; *) CXX_BIN=clang++; CC_BIN=clang ;; esac

cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DTHC_FUZZ=ON -DTHC_BUILD_TESTS=OFF -DTHC_BUILD_PERF=OFF >/dev/null
cmake --build "$BUILD" --target thc_fuzz_packet thc_fuzz_engine -j "$(nproc)"

PER=$(( SECONDS_TOTAL / 2 ))
[ "$PER" -lt 1 ] && PER=1
mkdir -p "$BUILD/artifacts"
status=0
for t in packet engine; do
  mkdir -p "$BUILD/corpus-$t"
  echo "=== thc_fuzz_$t for ${PER}s ==="
  # New inputs go to the first (scratch) directory; the checked-in corpus is read only.
  if ! "$BUILD/thc_fuzz_$t" -max_total_time="$PER" -max_len=4096 -print_final_stats=1 \
       -artifact_prefix="$BUILD/artifacts/$t-" "$BUILD/corpus-$t" "$SRC/fuzz/corpus/$t" 2>&1 | tail -n 25; then
    status=1
  fi
  # A crash makes libFuzzer exit non-zero, but `| tail` hides that: check the artifacts too.
  if ls "$BUILD/artifacts/$t-"* >/dev/null 2>&1; then status=1; fi
done
if [ "$status" -ne 0 ]; then
  echo "fuzzing found problems: see $BUILD/artifacts" >&2
fi
exit "$status"
