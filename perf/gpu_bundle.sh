#!/usr/bin/env bash
# perf/gpu_bundle.sh -- pack the GPU check's programs, built on this machine, with every shared
# library they need, for a GPU machine that has the CUDA driver but none of thc's Debian packages.
#
#   bash perf/gpu_bundle.sh [BUILD_DIR [NCCL_TESTS_BUILD_DIR]]     -> gpu_bundle/thc-gpu-bundle.tar.xz
#   (BUILD_DIR: a CUDA-enabled build, default ./build; NCCL_TESTS_BUILD_DIR: scratch folder for
#   nccl-tests, default /tmp/nt-build, built there from THC_NCCL_TESTS_DIR or
#   ../shared/third_party/nccl-tests when it holds no all_reduce_perf yet)
#   THC_GPU_BUNDLE=gpu_bundle/thc-gpu-bundle.tar.xz bash perf/gpu_check.sh      (on the GPU machine)
#
# Why: a lent GPU machine here has nvcc, CMake and PyTorch but no Highway, GoogleTest, CLI11, Open
# MPI, UCX or libsodium, and nothing can be installed there. Built there, the check loses its tests,
# its MPI steps and the NCCL plugin. Built here (nvcc 13 compiles sm_90 code here; only running it
# needs the GPU), everything is checked there and the device time goes to running, not compiling.
#
# What goes in (paths inside the archive):
#   bin/         the GPU tests and tools, stripped: cuda_*_test, thc_gpu_bench, thc_gpu_mpi_check, collnet_device_check,
#                thc-aggregator, thc_allreduce_perf, libnccl-net-thc.so, nccl_plugin_conformance
#                (the plugin driven as NCCL's proxy would, without NCCL), and nccl-tests'
#                all_reduce_perf (MPI=1, sm_90)
#   lib/         every library those programs and Open MPI's components load, found by ldd, except
#                the C runtime (glibc, libstdc++, libgcc_s), the CUDA driver (libcuda) and NCCL
#                (libnccl.so.2 is 200 MB; the GPU machine's own NCCL is used, see gpu_check.sh)
#   lib/ucx/     UCX's transport modules (UCX looks for them beside libucs.so)
#   usr/...      Open MPI 4.1 (orterun, orted, components, help files) and PMIx at their Debian
#                paths, relocated there by OPAL_PREFIX and PMIX_PREFIX (gpu_check.sh sets them)
#   MANIFEST     the commit, the build flags and the file list
#
# The archive must stay under the device tool's 64 MiB carry limit; the script says its size.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
NT_BUILD=${2:-/tmp/nt-build}
DEST=$ROOT/gpu_bundle
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$DEST" "$STAGE/bin" "$STAGE/lib"

grep -q '^/gpu_bundle/$' "$ROOT/.gitignore" 2>/dev/null ||
  { echo "gpu_bundle.sh: add /gpu_bundle/ to .gitignore first (the archive must never be committed)" >&2; exit 2; }

TARGETS=(cuda_shared_test cuda_kernels_test cuda_nccl_test cuda_engine_device_test cuda_mpi_device_test
         thc_gpu_bench thc_gpu_mpi_check nccl-net-thc nccl_plugin_conformance thc-aggregator thc_allreduce_perf
         collnet_device_check)
echo "gpu_bundle: building ${TARGETS[*]} in $BUILD"
ninja -C "$BUILD" "${TARGETS[@]}" > "$STAGE/build.log" 2>&1 || { tail -30 "$STAGE/build.log"; exit 1; }
grep -q 'sm_90\|90-real\|CMAKE_CUDA_ARCHITECTURES:STRING=.*90' "$BUILD/CMakeCache.txt" ||
  grep -q 'set(CMAKE_CUDA_ARCHITECTURES "80-virtual;90-real")' "$ROOT/CMakeLists.txt" ||
  { echo "gpu_bundle: $BUILD is not built for sm_90" >&2; exit 1; }

copy_bin() {  # copy_bin FILE -> bin/, stripped
  cp -L "$1" "$STAGE/bin/"
  strip --strip-unneeded "$STAGE/bin/$(basename "$1")" 2>/dev/null || true
}
for t in cuda_shared_test cuda_kernels_test cuda_nccl_test cuda_engine_device_test cuda_mpi_device_test \
         thc_gpu_bench thc_gpu_mpi_check collnet_device_check; do
  copy_bin "$BUILD/tests/cuda/$t"
done
copy_bin "$BUILD/tests/nccl_plugin/nccl_plugin_conformance"
copy_bin "$BUILD/nccl_plugin/libnccl-net-thc.so"
copy_bin "$BUILD/switch_offload/thc-aggregator"
copy_bin "$BUILD/perf/allreduce_perf/thc_allreduce_perf"
# nccl-tests' all_reduce_perf, built from the third-party tree into a scratch folder (never into the
# tree), with MPI so that one process per rank can run under mpirun there.
NT_SRC=""
for d in "${THC_NCCL_TESTS_DIR:-}" "$ROOT/shared/third_party/nccl-tests" "$ROOT/../shared/third_party/nccl-tests"; do
  [ -n "$d" ] && [ -f "$d/src/Makefile" ] && { NT_SRC=$d; break; }
done
if [ ! -x "$NT_BUILD/all_reduce_perf" ] && [ -n "$NT_SRC" ]; then
  echo "gpu_bundle: building nccl-tests' all_reduce_perf from $NT_SRC into $NT_BUILD"
  mkdir -p "$NT_BUILD"
  make -j "$(nproc)" -C "$NT_SRC/src" BUILDDIR="$NT_BUILD" MPI=1 MPI_HOME=/usr/lib/x86_64-linux-gnu/openmpi \
    CUDA_HOME=/usr/local/cuda NCCL_HOME=/usr/local/cuda NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 \
    "$NT_BUILD/all_reduce_perf" > "$STAGE/nccl_tests_build.log" 2>&1 || { tail -20 "$STAGE/nccl_tests_build.log"; exit 1; }
fi
if [ -x "$NT_BUILD/all_reduce_perf" ]; then
  copy_bin "$NT_BUILD/all_reduce_perf"
else
  echo "gpu_bundle: no nccl-tests sources (THC_NCCL_TESTS_DIR) and no all_reduce_perf in $NT_BUILD: left out"
fi

# Open MPI and PMIx at their Debian paths (relocated at run time).
ML=/usr/lib/x86_64-linux-gnu
for d in "$ML/openmpi/lib" "$ML/pmix2" /usr/share/openmpi; do
  mkdir -p "$STAGE$(dirname "$d")"
  cp -rL "$d" "$STAGE$d"
done
rm -rf "$STAGE$ML/openmpi/lib/pkgconfig" "$STAGE$ML/openmpi/lib/"*java* "$STAGE$ML/openmpi/lib/"*usempi* \
       "$STAGE$ML/openmpi/lib/"*mpifh* "$STAGE$ML/openmpi/lib/"liboshmem*
# UCX looks for its transport modules in ucx/ beside libucs.so (which goes to lib/).
cp -rL "$ML/ucx" "$STAGE/lib/ucx"
mkdir -p "$STAGE/usr/bin"
cp -L /usr/bin/orterun /usr/bin/orted "$STAGE/usr/bin/"
ln -s orterun "$STAGE/usr/bin/mpirun"
ln -s orterun "$STAGE/usr/bin/mpiexec"

# Every library any of those ELF files loads, except the C runtime, the CUDA driver and NCCL.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl\.so)'
mapfile -t elfs < <(find "$STAGE" -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c 'head -c4 "$1" | grep -q ELF && echo "$1"' _ {} \;)
declare -A seen=()
queue=("${elfs[@]}" "$BUILD/libthc.so.0" "$BUILD/cuda/libthc_cuda.so.0")
while [ ${#queue[@]} -gt 0 ]; do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  while read -r name path; do
    if [ -z "$path" ] || [ ! -f "$path" ]; then continue; fi
    [[ $name =~ $skip ]] && continue
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    cp -L "$path" "$STAGE/lib/$name"
    strip --strip-unneeded "$STAGE/lib/$name" 2>/dev/null || true
    queue+=("$path")
  done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" {print $1, $3}')
done

{
  echo "thc commit: $(git -C "$ROOT" rev-parse HEAD)$(git -C "$ROOT" diff --quiet || echo ' (with uncommitted changes)')"
  echo "built: $(date -u) on $(uname -n), $(grep -m1 '^PRETTY_NAME=' /etc/os-release | cut -d= -f2-), $(nvcc --version 2>/dev/null | tail -1)"
  grep -E '^(CMAKE_BUILD_TYPE|CMAKE_CUDA_ARCHITECTURES|THC_WITH_[A-Z]+):' "$BUILD/CMakeCache.txt" || true
  echo "files:"
  (cd "$STAGE" && find . -type f -o -type l | sort)
} > "$STAGE/MANIFEST"
rm -f "$STAGE/build.log" "$STAGE/nccl_tests_build.log"
tar -C "$STAGE" -cf - . | xz -T0 -6 > "$DEST/thc-gpu-bundle.tar.xz"
size=$(stat -c %s "$DEST/thc-gpu-bundle.tar.xz")
echo "gpu_bundle: $DEST/thc-gpu-bundle.tar.xz, $((size / 1048576)) MiB ($(find "$STAGE" -type f | wc -l) files)"
[ "$size" -lt $((60 * 1048576)) ] || { echo "gpu_bundle: over 60 MiB, the device tool carries 64 MiB with the tree" >&2; exit 1; }
