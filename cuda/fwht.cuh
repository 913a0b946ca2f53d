// Fast Walsh-Hadamard transform building blocks on the GPU.
//
// Bit-exactness with the host: the host FWHT (rht.cc, scalar and Highway) runs the radix-2
// butterflies (a, b) -> (a + b, a - b) stage by stage, h = 1, 2, 4, ... Every output is the same
// chain of float additions whenever the stages run in that order, however they are distributed
// over registers, lanes, shared and global memory. So the GPU keeps that order:
//   bits 0..2 of the element index   in registers (a thread holds 8 consecutive elements),
//   bits 3..7                        across the 32 lanes of a warp (shuffles),
//   bits 8..                         in shared memory, up to 4 bits per round in registers,
//   bits beyond a shared-memory tile in a second (column) pass through global memory.
// Each butterfly is one IEEE add or subtract (no multiplies, so nothing to contract into FMAs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common.cuh"

namespace thc::cuda::detail {

// Stages h = 1, 2, 4 on 8 consecutive elements.
__device__ __forceinline__ void reg_stages8(float v[8]) {
#pragma unroll
  for (int h = 1; h < 8; h <<= 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
    }
  }
}

// Stages h = 8, 16, ..., 128 (lane bit m <-> element bit 3 + log2 m) for the lanes' chunks
// c = 32 * w + lane; only stages inside a transform of `chunks` chunks (a power of two) run.
// All 32 lanes must call it (lanes without data pass zeros).
__device__ __forceinline__ void warp_stages8(float v[8], unsigned lane, uint32_t chunks) {
#pragma unroll
  for (unsigned m = 1; m < 32; m <<= 1) {
    if (m >= chunks) break;
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float p = __shfl_xor_sync(kFullMask, v[k], m);
      // lower lane holds a, upper holds b: lower <- a + b, upper <- a - b
      v[k] = upper ? p - v[k] : v[k] + p;
    }
  }
}

// One shared-memory round: stages on index bits [lo, lo + Q) of sm[0..n), n a power of two.
template <int Q>
__device__ __forceinline__ void smem_round(float* sm, uint32_t n, int lo, unsigned tid, unsigned nt) {
  constexpr int R = 1 << Q;
  const uint32_t groups = n >> Q;
  const uint32_t low_mask = (1u << lo) - 1u;
  for (uint32_t a = tid; a < groups; a += nt) {
    const uint32_t base = (a & low_mask) | ((a >> lo) << (lo + Q));
    float r[R];
#pragma unroll
    for (int j = 0; j < R; ++j) r[j] = sm[base + (static_cast<uint32_t>(j) << lo)];
#pragma unroll
    for (int h = 1; h < R; h <<= 1) {
#pragma unroll
      for (int j = 0; j < R; ++j) {
        if ((j & h) == 0) {
          const float x = r[j], y = r[j + h];
          r[j] = x + y;
          r[j + h] = x - y;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < R; ++j) sm[base + (static_cast<uint32_t>(j) << lo)] = r[j];
  }
}

// Stages on bits [lo, hi) of sm[0..n), ascending. Call with the tile written by all threads and
// synchronised; returns synchronised. lo >= 5 keeps the rounds free of bank conflicts.
__device__ __forceinline__ void smem_stages(float* sm, uint32_t n, int lo, int hi, unsigned tid, unsigned nt) {
  for (int b = lo; b < hi;) {
    const int q = hi - b < 4 ? hi - b : 4;
    switch (q) {
      case 1: smem_round<1>(sm, n, b, tid, nt); break;
      case 2: smem_round<2>(sm, n, b, tid, nt); break;
      case 3: smem_round<3>(sm, n, b, tid, nt); break;
      default: smem_round<4>(sm, n, b, tid, nt); break;
    }
    b += q;
    __syncthreads();
  }
}

__device__ __forceinline__ int ilog2(uint32_t v) { return 31 - __clz(v); }

}  // namespace thc::cuda::detail
