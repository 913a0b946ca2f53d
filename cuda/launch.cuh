// Host-side launch helpers shared by the kernel files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.cuh"

namespace thc::cuda::detail {

// CUB's temporary-storage protocol; a size of 0 would be ambiguous (a null pointer is the
// query), so every entry asks for at least this much.
constexpr size_t kMinTemp = 16;

inline size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// The kernels read and write temporary storage with 16-byte vector accesses; cudaMalloc gives
// 256-byte alignment, a caller carving its own pool might not.
constexpr size_t kTempAlign = 16;

// The second call's checks: enough bytes, aligned for the vector accesses.
inline cudaError_t check_temp(const void* d_temp, size_t have, size_t need) {
  if (have < need) return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(d_temp) % kTempAlign != 0) return cudaErrorMisalignedAddress;
  return cudaSuccess;
}

// Opt-in shared memory per block of the current device (cached per device).
int device_smem_optin();
// Number of SMs of the current device (cached per device).
int device_sms();

// Allow `bytes` of dynamic shared memory for kernel (needed above 48 KiB).
template <class K>
cudaError_t allow_smem(K* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(bytes));
}

inline Geom make_geom(const codec::Layout& lay, uint64_t first_block, uint64_t nblocks) {
  Geom g;
  g.first_block = first_block;
  g.nblocks = nblocks;
  g.lay_nblocks = lay.nblocks;
  g.block = static_cast<uint32_t>(lay.block);
  g.tail_elems = static_cast<uint32_t>(lay.tail_elems);
  g.tail_wire = static_cast<uint32_t>(lay.tail_wire);
  return g;
}

}  // namespace thc::cuda::detail
