#!/usr/bin/env bash
# Install dependencies, then build and run the whole test suite twice: a normal build, and a
# build under AddressSanitizer + UndefinedBehaviorSanitizer. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
JOBS=$(nproc)

echo "=== build (RelWithDebInfo) ==="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTHC_BUILD_TESTS=ON -DTHC_BUILD_PERF=ON -DTHC_SANITIZE=OFF
cmake --build build -j "$JOBS"
echo "=== tests ==="
ctest --test-dir build --output-on-failure --no-tests=error -j "$JOBS" --timeout 900

echo "=== fuzzing the aggregator's packet parser and state machine (reproducible: fixed seed and input count) ==="
./switch_offload/fuzz/run_fuzz.sh --ci build-fuzz "${THC_FUZZ_RUNS:-200000}"

echo "=== build (ASan + UBSan) ==="
# CUDA kernels cannot run here and nvcc does not take the sanitizer flags: the sanitizer build is
# CPU-only. Huge-memory tests are left to the normal build.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTHC_SANITIZE=ON -DTHC_WITH_CUDA=OFF -DTHC_BUILD_PERF=OFF -DTHC_BUILD_TESTS=ON
cmake --build build-asan -j "$JOBS"
echo "=== tests under ASan + UBSan ==="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure --no-tests=error -j "$JOBS" --timeout 900 -LE huge
