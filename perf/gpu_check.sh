#!/usr/bin/env bash
# perf/gpu_check.sh -- the GPU check of thc's CUDA codec, NCCL-like API and NCCL plugin, in one command.
#
#   bash perf/gpu_check.sh            (outputs under $OUT if set, else ./gpu_check_out)
#
# Made for a machine with one GPU (an H200), nvcc, CMake, Ninja, Python and no internet, where the
# Debian development packages thc uses may be missing. It fits in about 8 minutes:
#   1. probes the dependencies and says exactly what is missing;
#   2. configures (CUDA arch 90, Release, THC_BUILD_PERF=OFF) and builds only the GPU targets;
#   3. runs the GPU tests (codec kernels against the host codec, the NCCL API on one rank);
#   4. runs several MPI processes sharing the GPU through THC_Allreduce on device buffers (GPU codec,
#      compressed integers staged through pinned host memory into MPI), if mpirun exists;
#   5. times every kernel against a device-to-device copy of the same bytes (thc_gpu_bench, which
#      first checks parity with the host codec, so it verifies even without GoogleTest), THC with
#      every kernel variant (LaunchOpts::kernel_variant 1-7, rows "... v<bits>") beside the default;
#   6. runs unmodified NCCL over thc's net plugin (libnccl-net-thc.so): nccl-tests' all_reduce_perf
#      (built from the third-party tree into a scratch folder) and thc_allreduce_perf --nccl, with
#      THC_GPU_CHECK_NCCL_NP ranks on the one GPU (a distinct NCCL_HOSTID each, so that NCCL sees
#      separate nodes and connects them through the plugin), a thc-aggregator on loopback and
#      NCCL_NET_PLUGIN=thc NCCL_COLLNET_ENABLE=1 NCCL_DEBUG=INFO; asserts from NCCL's log that the
#      plugin and CollNet were used and from the tools that the results are right (exact with
#      CollNet off, within the NMSE bound with it on); then CollNet with THC_COLLNET_AGGREGATOR=peers
#      (no aggregator: the ranks reduce among themselves over UCX);
#   6b. drives the plugin's CollNet on device buffers without NCCL (collnet_device_check): bit-identical
#      to host buffers, the refusals, and the time per call and PCIe bytes of the device path against
#      the host-staged path NCCL takes without it;
#   7. prints a short table last.
#
# Fallbacks when a dependency is missing (nothing can be downloaded):
#   Random123 (librandom123-dev)  header-only and only Philox4x32-10 is used: a bit-identical
#                                 stand-in header is written (checked against the Random123
#                                 known-answer vectors before use)
#   CLI11 (libcli11-dev)          only the command-line tools need it, and they are not built: a
#                                 placeholder header satisfies the configure step
#   GoogleTest (libgtest-dev)     tests off (THC_BUILD_TESTS=OFF): no gtest suites, but the bench's
#                                 parity check and the MPI check still verify the kernels
#   Highway (libhwy-dev)          the host codec needs it. If the build has a THC_WITH_HWY switch
#                                 it is turned off; otherwise the host codec, the parity checks
#                                 and the timings cannot be built: the kernels are compiled for
#                                 sm_90 with nvcc (a compile check) and the rest is reported as
#                                 NOT VERIFIED
#   MPI                           steps 4 and 6 are skipped
#   NCCL                          the NCCL API and its tests are not built (THC_WITH_NCCL=AUTO),
#                                 step 6 is skipped
#   UCX (libucx-dev)              the plugin is not built: step 6 is skipped
#   nccl-tests sources            (THC_NCCL_TESTS_DIR, else shared/third_party/nccl-tests next to
#                                 or above the repository, else /work/shared/...): step 6 runs
#                                 thc_allreduce_perf --nccl only
#
# Prebuilt: THC_GPU_BUNDLE=gpu_bundle/thc-gpu-bundle.tar.xz (made here by perf/gpu_bundle.sh, with
# every library and Open MPI inside) skips steps 1-2 and runs the same checks on the bundle's
# programs: what a bare GPU machine without thc's Debian packages needs to check everything.
# Environment: OUT (outputs), THC_GPU_BUILD (build folder, default $TMPDIR/thc-gpu-build),
# THC_GPU_CHECK_NP (MPI processes, default 4), THC_GPU_CHECK_NCCL_NP (NCCL ranks, default the same),
# THC_NCCL_TESTS_DIR (nccl-tests sources), THC_GPU_BENCH_COUNT (floats, default 2^26),
# THC_GPU_CHECK_TEST_TIMEOUT (seconds per gtest binary, default 200), THC_GPU_CHECK_MPS (1: also the
# net-only NCCL jobs under CUDA MPS when nvidia-cuda-mps-control exists; 0: not), THC_GPU_CHECK_NCCL_TIMEOUT
# (seconds per NCCL job, default 150),
# THC_GPU_CHECK_COLLNET_RANKS / THC_GPU_CHECK_COLLNET_COUNT (step 6b: ranks, default 4; floats, default 2^24),
# THC_GPU_CHECK_PRETEND_MISSING (e.g. "random123 gtest cli11 hwy mpi": test the fallbacks).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$PWD/gpu_check_out}
BUILD=${THC_GPU_BUILD:-${TMPDIR:-/tmp}/thc-gpu-build}
NP=${THC_GPU_CHECK_NP:-4}
BENCH_COUNT=${THC_GPU_BENCH_COUNT:-67108864}
JOBS=$(nproc 2>/dev/null || echo 8)
START=$(date +%s)
mkdir -p "$OUT" "$BUILD"
: > "$OUT/summary.txt"
export PATH="/usr/local/cuda/bin:$PATH"

declare -a STEP_NAMES=() STEP_STATUS=() STEP_DETAIL=()
elapsed() { echo $(( $(date +%s) - START )); }
log() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$OUT/summary.txt"; }
step() { STEP_NAMES+=("$1"); STEP_STATUS+=("$2"); STEP_DETAIL+=("$3"); log "$1: $2 -- $3"; }

# ---- 0. the machine ---------------------------------------------------------------------------
{
  echo "date: $(date -u)"; uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi
  command -v nvcc >/dev/null && nvcc --version
  cmake --version | head -1
  ninja --version 2>/dev/null | sed 's/^/ninja /'
  command -v mpirun >/dev/null && mpirun --version 2>&1 | head -1
} > "$OUT/machine.txt" 2>&1
GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
log "root $ROOT, build $BUILD, outputs $OUT, GPU: ${GPU:-none found by nvidia-smi}"
if ! command -v nvcc >/dev/null; then
  step "toolchain" "FAILED" "nvcc not found (looked in PATH and /usr/local/cuda/bin)"
  exit 1
fi

# ---- 1-2. with THC_GPU_BUNDLE: the programs come built (perf/gpu_bundle.sh) ------------------
if [ -n "${THC_GPU_BUNDLE:-}" ]; then
  BUN="$BUILD/bundle"
  rm -rf "$BUN"
  mkdir -p "$BUN"
  if ! xz -dc "$THC_GPU_BUNDLE" | tar -C "$BUN" -xf -; then
    step "bundle" "FAILED" "cannot unpack $THC_GPU_BUNDLE"
    exit 1
  fi
  cp "$BUN/MANIFEST" "$OUT/bundle_manifest.txt"
  # Open MPI, PMIx and UCX modules sit at their Debian paths under $BUN/usr: relocate them.
  export OPAL_PREFIX="$BUN/usr" PMIX_PREFIX="$BUN/usr/lib/x86_64-linux-gnu/pmix2" \
         PMIX_MCA_mca_base_component_path="$BUN/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix" UCX_MODULE_DIR="$BUN/lib/ucx"
  export PATH="$BUN/usr/bin:$PATH"
  # One node, no ssh, maybe no cross-memory attach in the sandbox: the plainest local launch.
  export OMPI_MCA_plm=isolated OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp \
         OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mca_base_component_show_load_errors=0 \
         PMIX_MCA_pcompress_base_silence_warning=1
  # NCCL is not in the bundle (200 MB): the machine's own, from CUDA's folder or a Python wheel.
  NCCL_DIR=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/libnccl.so.2" ] && { NCCL_DIR=$d; break; }
  done
  if [ -z "$NCCL_DIR" ]; then
    f=$(find /usr /opt -name 'libnccl.so.2' 2>/dev/null | head -1)
    [ -n "$f" ] && NCCL_DIR=$(dirname "$f")
  fi
  export LD_LIBRARY_PATH="$BUN/lib:$BUN/usr/lib/x86_64-linux-gnu/openmpi/lib${NCCL_DIR:+:$NCCL_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  missing=$(for f in "$BUN"/bin/*; do ldd "$f" 2>/dev/null | grep 'not found' | sed "s|^|$(basename "$f"): |"; done | sort -u)
  echo "$missing" > "$OUT/bundle_ldd.txt"
  dep() {
    case "$1" in
      nccl) [ -n "$NCCL_DIR" ] ;;
      *) return 0 ;;
    esac
  }
  if [ -n "$missing" ]; then
    step "bundle" "partial" "libraries not found: $(echo "$missing" | tr '\n' ';' | cut -c1-160) (bundle_ldd.txt)"
  else
    step "bundle" "ok" "$(head -1 "$BUN/MANIFEST"); NCCL from ${NCCL_DIR:-nowhere}"
  fi
  HAVE_GTEST=1
  BUILT_OK=1
  B="$BUN/bin"
  PLUGIN="$B/libnccl-net-thc.so"
  AGG_BIN="$B/thc-aggregator"
  PERF_BIN="$B/thc_allreduce_perf"
else
# ---- 1. dependency probe ----------------------------------------------------------------------
PROBE="$BUILD/probe"
mkdir -p "$PROBE"
cat > "$PROBE/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(thc_probe LANGUAGES C CXX)
find_package(hwy QUIET)
find_path(R123 Random123/philox.h)
find_package(GTest QUIET)
find_package(CLI11 CONFIG QUIET)
find_path(CLI11_H CLI/CLI.hpp)
set(MPI_CXX_SKIP_MPICXX ON)
find_package(MPI COMPONENTS C QUIET)
find_path(NCCL_H nccl.h HINTS /usr/local/cuda/include)
find_library(NCCL_L nccl HINTS /usr/local/cuda/lib64)
set(r "")
if(hwy_FOUND)
  string(APPEND r "hwy=1\n")
else()
  string(APPEND r "hwy=0\n")
endif()
if(R123)
  string(APPEND r "random123=1\n")
else()
  string(APPEND r "random123=0\n")
endif()
if(GTest_FOUND)
  string(APPEND r "gtest=1\n")
else()
  string(APPEND r "gtest=0\n")
endif()
if(CLI11_FOUND OR CLI11_H)
  string(APPEND r "cli11=1\n")
else()
  string(APPEND r "cli11=0\n")
endif()
if(MPI_C_FOUND)
  string(APPEND r "mpi=1\n")
else()
  string(APPEND r "mpi=0\n")
endif()
if(NCCL_H AND NCCL_L)
  string(APPEND r "nccl=1\n")
else()
  string(APPEND r "nccl=0\n")
endif()
file(WRITE ${CMAKE_BINARY_DIR}/deps.txt "${r}")
EOF
cmake -S "$PROBE" -B "$PROBE/b" > "$OUT/probe.log" 2>&1
# THC_GPU_CHECK_PRETEND_MISSING="random123 gtest ..." exercises the fallbacks where all is installed.
dep() {
  case " ${THC_GPU_CHECK_PRETEND_MISSING:-} " in *" $1 "*) return 1 ;; esac
  grep -q "^$1=1" "$PROBE/b/deps.txt" 2>/dev/null
}
cp "$PROBE/b/deps.txt" "$OUT/deps.txt" 2>/dev/null
MISSING=()
dep hwy || MISSING+=("Highway (libhwy-dev: hwyConfig.cmake)")
dep random123 || MISSING+=("Random123 (librandom123-dev: Random123/philox.h)")
dep gtest || MISSING+=("GoogleTest (libgtest-dev: GTestConfig.cmake)")
dep cli11 || MISSING+=("CLI11 (libcli11-dev: CLI/CLI.hpp)")
dep mpi || MISSING+=("MPI (mpicc/mpirun, e.g. libopenmpi-dev)")
dep nccl || MISSING+=("NCCL (nccl.h and libnccl in /usr/local/cuda)")
if [ ${#MISSING[@]} -eq 0 ]; then
  step "dependencies" "ok" "Highway, Random123, GoogleTest, CLI11, MPI and NCCL found"
else
  step "dependencies" "partial" "missing: $(IFS=';'; echo "${MISSING[*]}")"
fi

SHIM="$BUILD/shim"
mkdir -p "$SHIM/Random123" "$SHIM/CLI"
# THC_BUILD_PERF for thc_allreduce_perf (only the listed targets are built); UCX on if found, for
# the NCCL plugin.
CMAKE_ARGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DTHC_BUILD_PERF=ON
            -DTHC_WITH_CUDA=ON -DTHC_WITH_DPDK=OFF)

if ! dep random123; then
  cat > "$SHIM/Random123/philox.h" <<'EOF'
/* Stand-in for Random123's Philox4x32-10 (only what thc uses), written by perf/gpu_check.sh
 * because librandom123-dev is missing. Same algorithm and constants as Random123 (Salmon et al.,
 * SC'11), so the same outputs; host and CUDA device. */
#ifndef THC_R123_SHIM_PHILOX_H_
#define THC_R123_SHIM_PHILOX_H_
#include <stdint.h>
#if defined(__CUDACC__)
#define THC_R123_HD __host__ __device__ __forceinline__
#else
#define THC_R123_HD inline
#endif
namespace r123 {
struct r123array2x32 { uint32_t v[2]; };
struct r123array4x32 { uint32_t v[4]; };
THC_R123_HD uint32_t thc_mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}
template <unsigned R>
struct Philox4x32_R {
  typedef r123array4x32 ctr_type;
  typedef r123array2x32 key_type;
  THC_R123_HD ctr_type operator()(ctr_type c, key_type k) const {
    for (unsigned r = 0; r < R; ++r) {
      if (r) { k.v[0] += 0x9E3779B9u; k.v[1] += 0xBB67AE85u; }
      uint32_t hi0, hi1;
      const uint32_t lo0 = thc_mulhilo32(0xD2511F53u, c.v[0], &hi0);
      const uint32_t lo1 = thc_mulhilo32(0xCD9E8D57u, c.v[2], &hi1);
      const ctr_type o = {{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
      c = o;
    }
    return c;
  }
};
typedef Philox4x32_R<10> Philox4x32;
}  // namespace r123
#endif
EOF
  # Random123's known-answer vectors for philox4x32-10
  cat > "$SHIM/kat.cc" <<'EOF'
#include <cstdio>
#include "Random123/philox.h"
int main() {
  r123::Philox4x32 p;
  r123::Philox4x32::ctr_type c0 = {{0, 0, 0, 0}};
  r123::Philox4x32::key_type k0 = {{0, 0}};
  r123::Philox4x32::ctr_type c1 = {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
  r123::Philox4x32::key_type k1 = {{0xa4093822u, 0x299f31d0u}};
  const auto a = p(c0, k0), b = p(c1, k1);
  const bool ok = a.v[0] == 0x6627e8d5u && a.v[1] == 0xe169c58du && a.v[2] == 0xbc57ac4cu && a.v[3] == 0x9b00dbd8u &&
                  b.v[0] == 0xd16cfe09u && b.v[1] == 0x94fdccebu && b.v[2] == 0x5001e420u && b.v[3] == 0x24126ea1u;
  std::printf("%s\n", ok ? "kat ok" : "kat MISMATCH");
  return ok ? 0 : 1;
}
EOF
  if ${CXX:-c++} -std=c++17 -I"$SHIM" "$SHIM/kat.cc" -o "$SHIM/kat" >> "$OUT/probe.log" 2>&1 && "$SHIM/kat" >> "$OUT/probe.log"; then
    CMAKE_ARGS+=(-DRANDOM123_INCLUDE_DIR="$SHIM")
    step "fallback Random123" "ok" "using the Philox4x32-10 stand-in $SHIM/Random123/philox.h (known-answer test passed)"
  else
    step "fallback Random123" "FAILED" "the stand-in failed its known-answer test (see probe.log)"
  fi
fi
if ! dep cli11; then
  printf '#error "CLI11 is not installed; placeholder from perf/gpu_check.sh (the CLI tools are not built)"\n' > "$SHIM/CLI/CLI.hpp"
  CMAKE_ARGS+=(-DCLI11_INCLUDE_DIR="$SHIM")
  step "fallback CLI11" "ok" "placeholder header; the command-line tools are not built"
fi
HAVE_GTEST=1
if ! dep gtest; then
  HAVE_GTEST=0
  CMAKE_ARGS+=(-DTHC_BUILD_TESTS=OFF)
  step "fallback GoogleTest" "partial" "THC_BUILD_TESTS=OFF: no gtest suites; the bench's parity check and the MPI check verify instead"
fi
HWY_OK=1
if ! dep hwy; then
  if grep -q "THC_WITH_HWY" "$ROOT/CMakeLists.txt"; then
    CMAKE_ARGS+=(-DTHC_WITH_HWY=OFF)
    step "fallback Highway" "partial" "THC_WITH_HWY=OFF: scalar host codec"
  else
    HWY_OK=0
  fi
fi
dep mpi || CMAKE_ARGS+=(-DTHC_WITH_MPI=OFF)

# ---- 2. configure and build -------------------------------------------------------------------
TARGETS=(thc_cuda)
BUILT_OK=0
if [ $HWY_OK -eq 1 ]; then
  log "configure: cmake ${CMAKE_ARGS[*]}"
  if cmake -S "$ROOT" -B "$BUILD/b" "${CMAKE_ARGS[@]}" > "$OUT/configure.log" 2>&1; then
    AVAIL=$(ninja -C "$BUILD/b" -t targets all 2>/dev/null | sed -n 's/^\([A-Za-z0-9_.-]*\): .*/\1/p' | sort -u)
    for t in thc_gpu_bench cuda_kernels_test cuda_nccl_test cuda_engine_device_test thc_gpu_mpi_check \
             cuda_mpi_device_test cuda_shared_test nccl-net-thc collnet_device_check; do
      echo "$AVAIL" | grep -qx "$t" && TARGETS+=("$t")
    done
    # the aggregator and the perf tool need CLI11 (not the placeholder)
    if dep cli11; then
      for t in thc-aggregator thc_allreduce_perf; do
        echo "$AVAIL" | grep -qx "$t" && TARGETS+=("$t")
      done
    fi
    if ! echo "$AVAIL" | grep -qx thc_cuda; then
      step "configure" "FAILED" "no thc_cuda target: is cuda/ added to the build (THC_WITH_CUDA_ENABLED)? see configure.log"
    else
      step "configure" "ok" "targets: ${TARGETS[*]}"
      if timeout 330 ninja -C "$BUILD/b" -j "$JOBS" "${TARGETS[@]}" > "$OUT/build.log" 2>&1; then
        BUILT_OK=1
        step "build" "ok" "$(grep -c 'warning' "$OUT/build.log" || true) warnings (build.log)"
      else
        step "build" "FAILED" "$(grep -m1 -E 'error|FAILED' "$OUT/build.log" | cut -c1-200) (build.log)"
      fi
    fi
  else
    step "configure" "FAILED" "$(grep -m1 -iE 'error' "$OUT/configure.log" | cut -c1-200) (configure.log)"
  fi
else
  # Without Highway the host codec cannot be built: compile-check the kernels with nvcc only.
  log "Highway is missing and the build has no THC_WITH_HWY switch: compile check of the kernels only"
  ok=1
  SHIM_INC=()
  dep random123 || SHIM_INC=("-I$SHIM")
  for f in device_codec prelude thc_kernels nat_kernels; do
    nvcc -std=c++17 -arch=sm_90 -fmad=false -c "$ROOT/cuda/$f.cu" -o "$BUILD/$f.o" -I"$ROOT" -I"$ROOT/include" \
      "${SHIM_INC[@]}" >> "$OUT/build.log" 2>&1 || ok=0
  done
  if [ $ok -eq 1 ]; then
    step "build" "partial" "kernels compile for sm_90; host codec, tests and timings NOT VERIFIED (need libhwy-dev)"
  else
    step "build" "FAILED" "kernels do not compile (build.log)"
  fi
fi
B="$BUILD/b/tests/cuda"
fi

# ---- 3. GPU tests -----------------------------------------------------------------------------
if [ $BUILT_OK -eq 1 ] && [ $HAVE_GTEST -eq 1 ]; then
  for t in cuda_shared_test cuda_kernels_test cuda_nccl_test cuda_engine_device_test; do
    exe="$B/$t"
    [ -x "$exe" ] || continue
    timeout "${THC_GPU_CHECK_TEST_TIMEOUT:-200}" "$exe" --gtest_brief=1 --gtest_color=no --gtest_output="xml:$OUT/$t.xml" > "$OUT/$t.log" 2>&1
    rc=$?
    passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$OUT/$t.log" | grep -oE '[0-9]+$' || echo 0)
    failed=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$OUT/$t.log" | grep -oE '[0-9]+' | head -1 || echo 0)
    skipped=$(grep -oE '\[  SKIPPED \] [0-9]+' "$OUT/$t.log" | grep -oE '[0-9]+$' || echo 0)
    if [ $rc -eq 0 ]; then
      step "$t" "ok" "${passed:-0} passed, ${skipped:-0} skipped"
    elif [ $rc -eq 124 ]; then
      step "$t" "FAILED" "timed out after ${THC_GPU_CHECK_TEST_TIMEOUT:-200} s ($t.log)"
    else
      step "$t" "FAILED" "${failed:-?} failed, ${passed:-0} passed ($t.log)"
    fi
  done
fi

# ---- 4. several processes sharing the GPU through MPI ---------------------------------------
if [ $BUILT_OK -eq 1 ]; then
  if command -v mpirun >/dev/null && [ -x "$B/thc_gpu_mpi_check" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    for scheme in thc cnat; do
      timeout 120 mpirun --oversubscribe -np "$NP" "$B/thc_gpu_mpi_check" 4194321 "$scheme" > "$OUT/mpi_$scheme.log" 2>&1
      rc=$?
      line=$(grep -m1 '^thc_gpu_mpi_check' "$OUT/mpi_$scheme.log" | sed 's/^thc_gpu_mpi_check: //' | cut -c1-160)
      if [ $rc -eq 77 ]; then
        step "mpi np=$NP $scheme" "skipped" "no CUDA device"
      elif [ $rc -eq 0 ] && grep -q "RESULT ok" "$OUT/mpi_$scheme.log"; then
        step "mpi np=$NP $scheme" "ok" "$line"
      else
        step "mpi np=$NP $scheme" "FAILED" "rc=$rc ${line:-see mpi_$scheme.log}"
      fi
    done
    # the device path's MPI tests (gtest): device buffers give the bits host buffers give
    if [ -x "$B/cuda_mpi_device_test" ]; then
      timeout 120 mpirun --oversubscribe -np 2 -x THC_SEED=4242 -x THC_BLOCK=1024 -x THC_CHUNK_BYTES=8192 \
        "$B/cuda_mpi_device_test" --gtest_brief=1 --gtest_color=no > "$OUT/cuda_mpi_device_test.log" 2>&1
      rc=$?
      passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$OUT/cuda_mpi_device_test.log" | grep -oE '[0-9]+$' || echo 0)
      if [ $rc -eq 77 ]; then
        step "cuda_mpi_device_test np=2" "skipped" "every test skipped (no CUDA device)"
      elif [ $rc -eq 0 ]; then
        step "cuda_mpi_device_test np=2" "ok" "${passed:-0} passed"
      else
        step "cuda_mpi_device_test np=2" "FAILED" "rc=$rc (cuda_mpi_device_test.log)"
      fi
    fi
    # device buffers timed: the single allreduce's device path and the reduce-scatter on the
    # engine's stream path (the device codec per shard), 2 ranks sharing the GPU, NMSE checked
    perf_bin=${PERF_BIN:-$BUILD/b/perf/allreduce_perf/thc_allreduce_perf}
    if [ -x "$perf_bin" ]; then
      for op in allreduce reduce_scatter; do
        timeout 120 mpirun --oversubscribe -np 2 "$perf_bin" --device --op "$op" -b 1M -e 64M -f 4 -n 5 -w 2 -c 1 \
          --nmse-bound 0.1 > "$OUT/perf_device_$op.log" 2>&1
        rc=$?
        bw=$(grep -m1 'Avg bus bandwidth' "$OUT/perf_device_$op.log" | awk '{print $NF}')
        big=$(awk '$1 == 67108864 {print $5 " us"}' "$OUT/perf_device_$op.log" | head -1)
        if [ $rc -eq 0 ] && grep -q "Worst NMSE .* OK" "$OUT/perf_device_$op.log"; then
          step "perf --device $op np=2" "ok" "64 MB: ${big:-?}; avg busbw ${bw:-?} GB/s; $(grep -m1 'Worst NMSE' "$OUT/perf_device_$op.log")"
        else
          step "perf --device $op np=2" "FAILED" "rc=$rc (perf_device_$op.log)"
        fi
      done
    fi
  else
    step "mpi" "skipped" "$(command -v mpirun >/dev/null || echo 'no mpirun; ')$( [ -x "$B/thc_gpu_mpi_check" ] || echo 'thc_gpu_mpi_check not built (no MPI at configure)')"
  fi
fi

# ---- 5. kernel timings ------------------------------------------------------------------------
if [ $BUILT_OK -eq 1 ] && [ -x "$B/thc_gpu_bench" ]; then
  timeout 150 "$B/thc_gpu_bench" --count "$BENCH_COUNT" --iters 20 --blocks 10,15,16,20 --variants 0,1,2,3,4,5,6,7 \
    --csv "$OUT/bench.csv" \
    > "$OUT/bench.txt" 2>&1
  rc=$?
  if [ $rc -eq 77 ]; then
    step "bench" "skipped" "no CUDA device"
  elif [ $rc -eq 0 ]; then
    step "bench" "ok" "$(grep -m1 '^parity with the host codec' "$OUT/bench.txt")"
  else
    step "bench" "FAILED" "rc=$rc $(grep -m1 -E '^parity with|error|:[0-9]+:' "$OUT/bench.txt" | cut -c1-160) (bench.txt)"
  fi
fi

# ---- 5b. the plugin without NCCL (bundle only): UCX and the aggregator client as NCCL's proxy
# would drive them, so that a failure in step 6 can be told apart from a broken UCX here.
if [ $BUILT_OK -eq 1 ] && [ -n "${BUN:-}" ] && [ -x "$BUN/bin/nccl_plugin_conformance" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  timeout 120 mpirun --oversubscribe --bind-to none -np 2 -x THC_AGGREGATOR_BIN="$BUN/bin/thc-aggregator" \
    "$BUN/bin/nccl_plugin_conformance" "$BUN/bin/libnccl-net-thc.so" --version 11 --suite net,collnet,bw \
    > "$OUT/plugin_conformance.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    bw=$(awk '$1 == 4194304 {print $4}' "$OUT/plugin_conformance.log" | head -1)
    step "plugin conformance np=2" "ok" "v11 net+collnet without NCCL; 4 MiB messages ${bw:-?} GB/s (plugin_conformance.log)"
  else
    step "plugin conformance np=2" "FAILED" "rc=$rc $(grep -m1 -iE 'error|fail' "$OUT/plugin_conformance.log" | cut -c1-140)"
  fi
fi

# ---- 6. NCCL over the thc net plugin ------------------------------------------------------------
NCCL_NP=${THC_GPU_CHECK_NCCL_NP:-$NP}
PLUGIN=${PLUGIN:-$BUILD/b/nccl_plugin/libnccl-net-thc.so}
AGG_BIN=${AGG_BIN:-$BUILD/b/switch_offload/thc-aggregator}
PERF_BIN=${PERF_BIN:-$BUILD/b/perf/allreduce_perf/thc_allreduce_perf}
nccl_tests_dir() {
  local d
  for d in "${THC_NCCL_TESTS_DIR:-}" "$ROOT/shared/third_party/nccl-tests" "$ROOT/../shared/third_party/nccl-tests" \
           /work/shared/third_party/nccl-tests; do
    if [ -n "$d" ] && [ -f "$d/src/Makefile" ]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}
# One NCCL job: NCCL_NP ranks sharing the GPU, each its own "node" (NCCL_HOSTID), the plugin found by
# name (NCCL_NET_PLUGIN=thc, libnccl-net-thc.so on LD_LIBRARY_PATH) as a user would set it up.
# NCCL_TESTS_DEVICE=0: nccl-tests would otherwise give each process of the host its own GPU.
#   nccl_job NAME COLLNET(0|1) SECONDS COMMAND...   -> $OUT/nccl_NAME.log, returns the exit status
nccl_job() {
  local name=$1 collnet=$2 secs=$3
  shift 3
  local algo=Ring
  [ "$collnet" = 1 ] && algo=CollNetChain,CollNetDirect,Ring
  # shellcheck disable=SC2016  # $OMPI_COMM_WORLD_RANK expands in each rank's shell, not here
  timeout "${THC_GPU_CHECK_NCCL_TIMEOUT:-$secs}" mpirun --oversubscribe --bind-to none -np "$NCCL_NP" \
    -x LD_LIBRARY_PATH="$(dirname "$PLUGIN"):/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}" \
    -x NCCL_NET_PLUGIN="${NCCL_JOB_PLUGIN:-thc}" -x NCCL_NET="${NCCL_JOB_NET:-THC}" \
    -x NCCL_COLLNET_ENABLE="$collnet" -x NCCL_ALGO="$algo" \
    -x THC_COLLNET_AGGREGATOR="${NCCL_JOB_AGG-$AGG_URL}" -x THC_AGGREGATOR_KEY_FILE -x THC_TIMEOUT_MS=30000 \
    -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS="${NCCL_JOB_SUBSYS:-INIT,NET,COLL,ENV}" -x NCCL_TESTS_DEVICE=0 \
    bash -c 'NCCL_HOSTID="thc-gpu-check-$OMPI_COMM_WORLD_RANK" exec "$@"' nccl-rank "$@" \
    > "$OUT/nccl_$name.log" 2>&1
}
# What NCCL's log (and the plugin's lines in it) says about a job.
nccl_evidence() {
  local log=$1 e=""
  grep -qE "Loaded net plugin THC|Using network THC" "$log" && e+="net=THC "
  grep -q "Loaded collnet plugin THC" "$log" && e+="collnet-plugin "
  grep -q "NET/THC device .* connection: UCX lanes" "$log" && e+="ucx "
  grep -q "NET/THC CollNet: rank .* joined job" "$log" && e+="collnet-job "
  grep -q "NET/THC CollNet: rank .* peers over UCX" "$log" && e+="collnet-peers "
  grep -qE "NET/THC CollNet rank .* first .* allreduce" "$log" && e+="collnet-allreduce "
  echo "${e% }"
}
# nccl-tests with CollNet on: NAME (log nccl_NAME.log), LABEL (its step), AGG
# (THC_COLLNET_AGGREGATOR), the evidence the plugin's log must show besides an allreduce, a note.
collnet_tests() {
  local name=$1 label=$2 agg=$3 want=$4 note=$5 rc ev bw
  NCCL_JOB_AGG="$agg" nccl_job "$name" 1 150 "$NT_BIN" -b 1M -e 32M -f 4 -n 5 -w 2 -c 0
  rc=$?
  ev=$(nccl_evidence "$OUT/nccl_$name.log")
  bw=$(grep -m1 'Avg bus bandwidth' "$OUT/nccl_$name.log" | awk '{print $NF}')
  if [ $rc -eq 0 ] && [[ "$ev" == *"$want"*collnet-allreduce* ]]; then
    step "nccl-tests $label np=$NCCL_NP" "ok" "${note}avg busbw ${bw:-?} GB/s; log: $ev"
  else
    step "nccl-tests $label np=$NCCL_NP" "FAILED" "rc=$rc; log: ${ev:-no plugin lines}; $(nccl_first_error "$OUT/nccl_$name.log") (nccl_$name.log)"
  fi
}
# The first line of a job's log that says what went wrong.
nccl_first_error() {
  grep -m1 -E "NCCL WARN|Test failure|CUDA failure|FAILED|error|Error" "$1" | cut -c1-140
}
if [ $BUILT_OK -eq 1 ]; then
  if [ -z "$GPU" ]; then
    step "nccl plugin" "skipped" "no CUDA device (nvidia-smi found none)"
  elif [ ! -f "$PLUGIN" ]; then
    step "nccl plugin" "skipped" "libnccl-net-thc.so not built (needs UCX: libucx-dev)"
  elif ! command -v mpirun >/dev/null || ! dep mpi; then
    step "nccl plugin" "skipped" "no MPI (mpirun) to start the NCCL ranks"
  elif ! dep nccl; then
    step "nccl plugin" "skipped" "no NCCL"
  elif [ ! -x "$AGG_BIN" ] || [ ! -x "$PERF_BIN" ]; then
    step "nccl plugin" "skipped" "thc-aggregator / thc_allreduce_perf not built (need CLI11: libcli11-dev)"
  else
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    rm -f "$OUT/aggregator.port"
    export THC_AGGREGATOR_KEY_FILE="$OUT/aggregator.keys"
    "$AGG_BIN" --key-file "$THC_AGGREGATOR_KEY_FILE" --create-key-file --port 0 --port-file "$OUT/aggregator.port" \
      --bind 127.0.0.1 --threads 2 --stats-interval 0 \
      > "$OUT/aggregator.log" 2>&1 &
    AGG_PID=$!
    for _ in $(seq 100); do
      [ -s "$OUT/aggregator.port" ] && break
      sleep 0.1
    done
    AGG_URL="udp://127.0.0.1:$(cat "$OUT/aggregator.port" 2>/dev/null)"
    log "thc-aggregator (pid $AGG_PID) at $AGG_URL; NCCL ranks: $NCCL_NP on one GPU"

    NT_BIN=""
    if [ -n "${BUN:-}" ] && [ -x "$BUN/bin/all_reduce_perf" ]; then
      NT_BIN="$BUN/bin/all_reduce_perf"
      step "nccl-tests build" "ok" "all_reduce_perf from the bundle (built with MPI=1 where the bundle was made)"
    elif NT_DIR=$(nccl_tests_dir); then
      # Built into a scratch folder: the third-party tree stays untouched.
      NT_BUILD="$BUILD/nccl-tests"
      mkdir -p "$NT_BUILD"
      MPI_HOME=$(dirname "$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')")
      if timeout 300 make -j "$JOBS" -C "$NT_DIR/src" BUILDDIR="$NT_BUILD" MPI=1 MPI_HOME="$MPI_HOME" \
           CUDA_HOME=/usr/local/cuda NCCL_HOME=/usr/local/cuda NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 \
           "$NT_BUILD/all_reduce_perf" > "$OUT/nccl_tests_build.log" 2>&1; then
        NT_BIN="$NT_BUILD/all_reduce_perf"
        step "nccl-tests build" "ok" "all_reduce_perf from $NT_DIR (nccl_tests_build.log)"
      else
        step "nccl-tests build" "FAILED" "$(grep -m1 -iE 'error' "$OUT/nccl_tests_build.log" | cut -c1-150) (nccl_tests_build.log)"
      fi
    else
      step "nccl-tests build" "skipped" "nccl-tests sources not found (set THC_NCCL_TESTS_DIR)"
    fi

    if [ -n "$NT_BIN" ]; then
      # CollNet off: NCCL's ring runs over the plugin's UCX transport; nccl-tests checks exactly.
      # No aggregator either (the net-only use): the plugin's CollNet has no device, and NCCL's
      # teardown must not touch it (NCCL 2.28.3 faulted in ncclCommDestroy when it had a ctx).
      NCCL_JOB_AGG="" nccl_job tests_net 0 150 "$NT_BIN" -b 1M -e 32M -f 4 -n 5 -w 2 -c 1
      rc=$?
      ev=$(nccl_evidence "$OUT/nccl_tests_net.log")
      bw=$(grep -m1 'Avg bus bandwidth' "$OUT/nccl_tests_net.log" | awk '{print $NF}')
      if [ $rc -eq 0 ] && grep -q "Out of bounds values : 0 OK" "$OUT/nccl_tests_net.log" && [[ "$ev" == *net=THC* ]]; then
        step "nccl-tests net np=$NCCL_NP" "ok" "exact; avg busbw ${bw:-?} GB/s; log: $ev"
      else
        step "nccl-tests net np=$NCCL_NP" "FAILED" "rc=$rc; log: ${ev:-no plugin lines}; $(nccl_first_error "$OUT/nccl_tests_net.log") (nccl_tests_net.log)"
      fi
      # The same job over NCCL's own socket transport (no plugin): the reference for the plugin's
      # busbw on this machine (ranks sharing one GPU time-slice it, which bounds both).
      NCCL_JOB_PLUGIN=none NCCL_JOB_NET=Socket nccl_job tests_socket 0 150 "$NT_BIN" -b 1M -e 32M -f 4 -n 5 -w 2 -c 1
      rc=$?
      sbw=$(grep -m1 'Avg bus bandwidth' "$OUT/nccl_tests_socket.log" | awk '{print $NF}')
      if [ $rc -eq 0 ] && grep -q "Out of bounds values : 0 OK" "$OUT/nccl_tests_socket.log" && grep -q "Using network Socket" "$OUT/nccl_tests_socket.log"; then
        step "nccl-tests socket np=$NCCL_NP" "ok" "NCCL's own socket transport, exact; avg busbw ${sbw:-?} GB/s (THC net: ${bw:-?})"
      else
        step "nccl-tests socket np=$NCCL_NP" "FAILED" "rc=$rc; $(nccl_first_error "$OUT/nccl_tests_socket.log") (nccl_tests_socket.log)"
      fi
      # CollNet on: compressed sums are not exact, so no -c check here (thc_allreduce_perf measures
      # the error below); the log must show the plugin's CollNet at work: at the aggregator, then
      # without one (THC_COLLNET_AGGREGATOR=peers: the ranks reduce among themselves over UCX).
      collnet_tests tests_collnet "collnet" "$AGG_URL" collnet-job ""
      collnet_tests tests_collnet_peers "collnet peers" peers collnet-peers "no aggregator; "
    fi

    # The same two net-only jobs with CUDA MPS running: without it the ranks sharing the GPU
    # time-slice it and every transport looks alike; with it the plugin's transport speed shows.
    if [ -n "$NT_BIN" ] && command -v nvidia-cuda-mps-control >/dev/null && [ "${THC_GPU_CHECK_MPS:-1}" = 1 ]; then
      export CUDA_MPS_PIPE_DIRECTORY="$BUILD/mps" CUDA_MPS_LOG_DIRECTORY="$BUILD/mps-log"
      mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
      if nvidia-cuda-mps-control -d > "$OUT/mps.log" 2>&1; then
        NCCL_JOB_SUBSYS=INIT,NET,ENV NCCL_JOB_AGG="" nccl_job mps_net 0 120 "$NT_BIN" -b 1M -e 64M -f 4 -n 10 -w 3 -c 1
        rc1=$?
        NCCL_JOB_SUBSYS=INIT,NET,ENV NCCL_JOB_PLUGIN=none NCCL_JOB_NET=Socket nccl_job mps_socket 0 120 "$NT_BIN" -b 1M -e 64M -f 4 -n 10 -w 3 -c 1
        rc2=$?
        echo quit | nvidia-cuda-mps-control >> "$OUT/mps.log" 2>&1
        big() { awk '$1 == 67108864 && $3 == "float" {print $8}' "$1" | head -1; }
        avg() { grep -m1 'Avg bus bandwidth' "$1" | awk '{print $NF}'; }
        if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && grep -q "Out of bounds values : 0 OK" "$OUT/nccl_mps_net.log" &&
           grep -q "Out of bounds values : 0 OK" "$OUT/nccl_mps_socket.log"; then
          step "nccl-tests MPS np=$NCCL_NP" "ok" "busbw at 64 MB: THC net $(big "$OUT/nccl_mps_net.log"), NCCL socket $(big "$OUT/nccl_mps_socket.log") GB/s; avg 1-64 MB $(avg "$OUT/nccl_mps_net.log") vs $(avg "$OUT/nccl_mps_socket.log")"
        else
          step "nccl-tests MPS np=$NCCL_NP" "FAILED" "rc=$rc1/$rc2; $(nccl_first_error "$OUT/nccl_mps_net.log") (nccl_mps_net.log, nccl_mps_socket.log)"
        fi
        unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      else
        step "nccl-tests MPS" "skipped" "nvidia-cuda-mps-control -d failed (mps.log)"
      fi
    fi

    # thc_allreduce_perf --nccl with CollNet on: ncclAllReduce on device buffers, NMSE checked.
    nccl_job perf_collnet 1 150 "$PERF_BIN" --nccl -b 1M -e 32M -f 4 -n 5 -w 2 -c 1 --nmse-bound 0.1
    rc=$?
    ev=$(nccl_evidence "$OUT/nccl_perf_collnet.log")
    nmse=$(grep -m1 'Worst NMSE' "$OUT/nccl_perf_collnet.log" | sed 's/.*: *//')
    if [ $rc -eq 0 ] && grep -q "Worst NMSE .* OK" "$OUT/nccl_perf_collnet.log" && [[ "$ev" == *collnet-allreduce* ]]; then
      step "thc_allreduce_perf --nccl" "ok" "NMSE ${nmse}; log: $ev"
    else
      step "thc_allreduce_perf --nccl" "FAILED" "rc=$rc NMSE ${nmse:-?}; log: ${ev:-no plugin lines}; $(nccl_first_error "$OUT/nccl_perf_collnet.log") (nccl_perf_collnet.log)"
    fi

    kill -TERM "$AGG_PID" 2>/dev/null
    wait "$AGG_PID" 2>/dev/null
    elems=$(grep -o 'elements=[0-9]*' "$OUT/aggregator.log" | tail -1 | cut -d= -f2)
    if [ "${elems:-0}" -gt 0 ]; then
      step "thc-aggregator" "ok" "aggregated ${elems} elements for NCCL's CollNet"
    else
      step "thc-aggregator" "FAILED" "aggregated nothing: CollNet never reached it (aggregator.log)"
    fi
    {
      echo "# NCCL's plugin-related lines, first job of each kind"
      for f in "$OUT"/nccl_*.log; do
        [ -f "$f" ] || continue
        echo "== $(basename "$f")"
        grep -E "NET/Plugin|Using network|NET/THC|CollNet|Out of bounds|Avg bus|Worst NMSE" "$f" | head -40
      done
    } > "$OUT/nccl_summary.txt"
  fi
fi

# ---- 6b. the plugin's CollNet on device buffers, without NCCL -----------------------------------
# collnet_device_check drives libnccl-net-thc.so's CollNet as NCCL's proxy would, with ranks as
# threads sharing the GPU and a thc-aggregator on loopback: device buffers (NCCL_PTR_CUDA: GPU
# codec, only the codes cross PCIe) must give the bits host buffers give, the refusals must hold,
# then the time per call of the device path against the host-staged path (float32 copied to
# pinned memory, host codec, copied back) and the bytes per element each moves across PCIe.
CN_BIN="$B/collnet_device_check"
if [ $BUILT_OK -eq 1 ] && [ -x "$CN_BIN" ] && [ -f "$PLUGIN" ] && [ -x "$AGG_BIN" ]; then
  THC_AGGREGATOR_BIN="$AGG_BIN" timeout 240 "$CN_BIN" "$PLUGIN" --ranks "${THC_GPU_CHECK_COLLNET_RANKS:-4}" \
    --iters 10 --count "${THC_GPU_CHECK_COLLNET_COUNT:-16777216}" > "$OUT/collnet_device.log" 2>&1
  rc=$?
  if [ $rc -eq 77 ]; then
    step "collnet device path" "skipped" "no CUDA device"
  elif [ $rc -eq 0 ] && grep -q "RESULT ok" "$OUT/collnet_device.log"; then
    td=$(awk '/device path \(GPU codec/ {print $(NF-3)}' "$OUT/collnet_device.log")
    th=$(awk '/host-staged \(float32/ {print $(NF-6)}' "$OUT/collnet_device.log")
    step "collnet device path" "ok" "bit-identical to host buffers; ms/call device ${td:-?} vs host-staged ${th:-?} (collnet_device.log)"
  else
    step "collnet device path" "FAILED" "rc=$rc $(grep -m1 -E 'FAIL' "$OUT/collnet_device.log" | cut -c1-140) (collnet_device.log)"
  fi
elif [ $BUILT_OK -eq 1 ]; then
  step "collnet device path" "skipped" "collnet_device_check, the plugin or thc-aggregator not built"
fi

# ---- 7. the table -----------------------------------------------------------------------------
{
  echo
  echo "==== thc GPU check: ${GPU:-unknown GPU}, $(elapsed) s ===="
  printf '%-28s %-8s %s\n' "step" "status" "detail"
  for i in "${!STEP_NAMES[@]}"; do
    printf '%-28s %-8s %s\n' "${STEP_NAMES[$i]}" "${STEP_STATUS[$i]}" "$(echo "${STEP_DETAIL[$i]}" | cut -c1-110)"
  done
  if grep -q '^ *bytes  *msgs' "$OUT/plugin_conformance.log" 2>/dev/null; then
    echo
    echo "plugin net without NCCL (2 ranks, ring stream):"
    sed -n '/^ *bytes  *msgs/,/^#/p' "$OUT/plugin_conformance.log" | grep -v '^#'
  fi
  if grep -q '^TIMING' "$OUT/collnet_device.log" 2>/dev/null; then
    echo
    sed -n '/^TIMING/,/^PCIe bytes/p' "$OUT/collnet_device.log"
  fi
  if [ -f "$OUT/bench.txt" ]; then
    echo
    sed -n '/^kernel /,$p' "$OUT/bench.txt" | grep -v '^parity'
  fi
  echo "outputs: $OUT"
} | tee -a "$OUT/summary.txt"

for s in "${STEP_STATUS[@]}"; do
  [ "$s" = "FAILED" ] && exit 1
done
exit 0
