#!/usr/bin/env bash
# Build the libFuzzer targets with clang and fuzz the packet parser and the aggregator state
# machine.
#
#   switch_offload/fuzz/run_fuzz.sh BUILD_DIR SECONDS     open-ended: SECONDS in total (half each),
#                                                         random seeds, new inputs kept in
#                                                         BUILD_DIR/corpus-* across runs
#   switch_offload/fuzz/run_fuzz.sh --ci BUILD_DIR [RUNS] reproducible (what CI runs): fixed seed,
#                                                         a fixed number of inputs per target
#                                                         (default 200000), starting from the
#                                                         checked-in corpus only, so a green run
#                                                         means the same thing every time
#
# Configures switch_offload on its own (its CMakeLists.txt can be a top level), so the rest of the
# project need not build with clang. The checked-in corpus seeds each run; inputs the fuzzer
# finds go to BUILD_DIR/corpus-*, crashes to BUILD_DIR/artifacts. Exit status is non-zero if a
# fuzzer found a crash or a violated invariant. To keep a new finding as a regression test, copy
# it into switch_offload/fuzz/corpus/{packet,engine}/ (the switch_fuzz_corpus_test replays it).
set -euo pipefail
CI=0
if [ "${1:-}" = "--ci" ]; then
  CI=1
  shift
  [ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 --ci BUILD_DIR [RUNS]" >&2; exit 2; }
  BUILD=$1
  RUNS=${2:-200000}
else
  if [ $# -ne 2 ]; then
    echo "usage: $0 BUILD_DIR SECONDS  |  $0 --ci BUILD_DIR [RUNS]" >&2
    exit 2
  fi
  BUILD=$1
  SECONDS_TOTAL=$2
fi
SRC=$(cd "$(dirname "$0")/.." && pwd)   # switch_offload/
CC_BIN=${CC:-clang}
CXX_BIN=${CXX:-clang++}
case "$CXX_BIN" in *clang*) ;; *) CXX_BIN=clang++; CC_BIN=clang ;; esac

cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DTHC_FUZZ=ON -DTHC_BUILD_TESTS=OFF -DTHC_BUILD_PERF=OFF >/dev/null
cmake --build "$BUILD" --target thc_fuzz_packet thc_fuzz_engine -j "$(nproc)"

if [ "$CI" = 1 ]; then
  LIMIT=(-runs="$RUNS" -seed=1)
  WHAT="$RUNS inputs, seed 1"
  rm -rf "$BUILD/artifacts" "$BUILD"/corpus-ci-*
else
  PER=$(( SECONDS_TOTAL / 2 ))
  [ "$PER" -lt 1 ] && PER=1
  LIMIT=(-max_total_time="$PER")
  WHAT="${PER}s"
fi
mkdir -p "$BUILD/artifacts"
status=0
for t in packet engine; do
  scratch="$BUILD/corpus-$t"
  [ "$CI" = 1 ] && scratch="$BUILD/corpus-ci-$t"
  mkdir -p "$scratch"
  echo "=== thc_fuzz_$t: $WHAT ==="
  # New inputs go to the first (scratch) directory; the checked-in corpus is read only.
  if ! "$BUILD/thc_fuzz_$t" "${LIMIT[@]}" -max_len=9200 -print_final_stats=1 \
       -artifact_prefix="$BUILD/artifacts/$t-" "$scratch" "$SRC/fuzz/corpus/$t" 2>&1 | tail -n 25; then
    status=1
  fi
  # A crash makes libFuzzer exit non-zero, but `| tail` hides that: check the artifacts too.
  if ls "$BUILD/artifacts/$t-"* >/dev/null 2>&1; then status=1; fi
done
if [ "$status" -ne 0 ]; then
  echo "fuzzing found problems: see $BUILD/artifacts" >&2
fi
exit "$status"
