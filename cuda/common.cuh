// Device helpers shared by the codec kernels: element loads and stores in the input types, the
// value form in every sum type and layout, b-bit packing of 8-code chunks, the per-block context.
//
// The unit of work is a chunk of 8 consecutive wire elements starting at a multiple of 8: one
// Philox call (stochastic rounding draws 16 bits per element, rng::kRoundGroup = 8), exactly b bytes of
// packed b-bit codes (elem.h: eight codes always fill b whole bytes), 4 words of kPairs values.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "collectives/codec/block_scale.h"
#include "collectives/codec/elem.h"
#include "collectives/codec/philox.h"
#include "cuda/thc_cuda.h"

// Kernel launches and dynamic shared memory go through these two macros so that the kernels can
// also be compiled by a host compiler against the test emulator (tests/cuda/emu), which runs
// them on the CPU: there THC_CUDA_EMULATION is defined and cuda_emu.h supplies the runtime.
#if defined(THC_CUDA_EMULATION)
#define THC_LAUNCH(kernel, grid, block, smem, stream) ::thc_emu::launch(kernel, grid, block, smem, stream)
#define THC_EXTERN_SHARED(T, name) T* name = ::thc_emu::dynamic_smem<T>()
#else
#define THC_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define THC_EXTERN_SHARED(T, name) extern __shared__ T name[]
#endif

#define THC_CUDA_TRY(expr)                 \
  do {                                     \
    const cudaError_t thc_e_ = (expr);     \
    if (thc_e_ != cudaSuccess) return thc_e_; \
  } while (0)

// The one list of types the kernels are instantiated for (CUB's habit): every dispatch from a
// runtime type to a template goes through these, so adding a type is one line here.
//   X(InType enumerator, element type)           inputs and outputs
//   X(codec::IntType enumerator, integer type)   sums
#define THC_CUDA_FOR_EACH_INTYPE(X) \
  X(InType::kF32, float)            \
  X(InType::kF16, __half)           \
  X(InType::kBF16, __nv_bfloat16)
#define THC_CUDA_FOR_EACH_SUMTYPE(X)  \
  X(codec::IntType::kU8, uint8_t)     \
  X(codec::IntType::kU16, uint16_t)   \
  X(codec::IntType::kU32, uint32_t)   \
  X(codec::IntType::kI8, int8_t)      \
  X(codec::IntType::kI16, int16_t)    \
  X(codec::IntType::kI32, int32_t)

namespace thc::cuda::detail {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// ---- input / output element types ----------------------------------------------------------
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ bool aligned(const void* p, unsigned a) {
  return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
}

// v[k] = float(x[j + k]) (+ ef[j + k]) for k < n, 0 for n <= k < 8. Mirrors the host engine's
// load_as_float: float inputs without error feedback are copied, others get "+ add" (0 if none).
template <class T>
__device__ __forceinline__ void load_x8(const T* __restrict__ x, const float* __restrict__ ef,
                                        uint64_t j, int n, float v[8]) {
  const T* p = x + j;
  if (n == 8 && aligned(p, 8 * sizeof(T))) {
    if (sizeof(T) == 4) {
      const float4 a = reinterpret_cast<const float4*>(p)[0];
      const float4 b = reinterpret_cast<const float4*>(p)[1];
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
      v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
      const uint4 a = *reinterpret_cast<const uint4*>(p);
      T h[8];
      memcpy(static_cast<void*>(h), &a, sizeof a);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = to_float(h[k]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = k < n ? to_float(p[k]) : 0.0f;
  }
  if (ef) {
    const float* e = ef + j;
    if (n == 8 && aligned(e, 32)) {
      const float4 a = reinterpret_cast<const float4*>(e)[0];
      const float4 b = reinterpret_cast<const float4*>(e)[1];
      v[0] += a.x; v[1] += a.y; v[2] += a.z; v[3] += a.w;
      v[4] += b.x; v[5] += b.y; v[6] += b.z; v[7] += b.w;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (k < n) v[k] += e[k];
    }
  } else if (sizeof(T) != 4) {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] += 0.0f;  // the host adds 0 to converted 16-bit inputs
  }
}

// One float of x (+ ef) exactly as load_x8 computes it.
template <class T>
__device__ __forceinline__ float load_x1(const T* __restrict__ x, const float* __restrict__ ef, uint64_t j) {
  float v = to_float(x[j]);
  if (ef) v += ef[j];
  else if (sizeof(T) != 4) v += 0.0f;
  return v;
}

template <class T>
__device__ __forceinline__ void store_out8(T* __restrict__ out, uint64_t j, int n, const float v[8]) {
  T* p = out + j;
  if (n == 8 && aligned(p, 8 * sizeof(T))) {
    if (sizeof(T) == 4) {
      reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      T h[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) h[k] = from_float<T>(v[k]);
      uint4 a;
      memcpy(&a, static_cast<const void*>(h), sizeof a);
      *reinterpret_cast<uint4*>(p) = a;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < n) p[k] = from_float<T>(v[k]);
  }
}

__device__ __forceinline__ void store_f8(float* __restrict__ p, const float v[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void load_f8(const float* __restrict__ p, float v[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0];
  const float4 b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// ---- value form -----------------------------------------------------------------------------
template <class T>
__device__ __forceinline__ void store_native8(void* base, uint64_t i, int n, const int32_t val[8]) {
  T* p = static_cast<T*>(base) + i;
  if (n == 8 && aligned(p, 8 * sizeof(T)) && sizeof(T) <= 2) {
    T t[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) t[k] = static_cast<T>(val[k]);
    if (sizeof(T) == 1) {
      uint2 w;
      memcpy(&w, t, sizeof w);
      *reinterpret_cast<uint2*>(p) = w;
    } else {
      uint4 w;
      memcpy(&w, t, sizeof w);
      *reinterpret_cast<uint4*>(p) = w;
    }
  } else if (n == 8 && aligned(p, 32)) {
    reinterpret_cast<int4*>(p)[0] = make_int4(val[0], val[1], val[2], val[3]);
    reinterpret_cast<int4*>(p)[1] = make_int4(val[4], val[5], val[6], val[7]);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (k < n) p[k] = static_cast<T>(val[k]);
  }
}

// kPairs: word p = v[2p] + 65536 v[2p+1] (mod 2^32); i is even.
__device__ __forceinline__ void store_pairs8(void* base, uint64_t i, int n, const int32_t val[8]) {
  uint32_t* p = static_cast<uint32_t*>(base) + i / 2;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int32_t lo = 2 * k < n ? val[2 * k] : 0;
    const int32_t hi = 2 * k + 1 < n ? val[2 * k + 1] : 0;
    w[k] = static_cast<uint32_t>(lo) + (static_cast<uint32_t>(hi) << 16);
  }
  if (n == 8 && aligned(p, 16)) {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (2 * k < n) p[k] = w[k];
  }
}

__device__ __forceinline__ void store_values8(void* base, codec::IntType t, ValueLayout l, uint64_t i,
                                              int n, const int32_t val[8]) {
  switch (t) {
    case codec::IntType::kU8: store_native8<uint8_t>(base, i, n, val); break;
    case codec::IntType::kI8: store_native8<int8_t>(base, i, n, val); break;
    case codec::IntType::kU16:
      if (l == ValueLayout::kPairs) store_pairs8(base, i, n, val);
      else store_native8<uint16_t>(base, i, n, val);
      break;
    case codec::IntType::kI16:
      if (l == ValueLayout::kPairs) store_pairs8(base, i, n, val);
      else store_native8<int16_t>(base, i, n, val);
      break;
    case codec::IntType::kU32: store_native8<uint32_t>(base, i, n, val); break;
    case codec::IntType::kI32: store_native8<int32_t>(base, i, n, val); break;
  }
}

template <class T>
__device__ __forceinline__ void load_native8(const void* base, uint64_t i, int n, float v[8]) {
  const T* p = static_cast<const T*>(base) + i;
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = k < n ? static_cast<float>(p[k]) : 0.0f;
}

template <bool Signed>
__device__ __forceinline__ void load_pairs8(const void* base, uint64_t i, int n, float v[8]) {
  const uint32_t* p = static_cast<const uint32_t*>(base) + i / 2;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t w = 2 * k < n ? p[k] : 0u;
    if (Signed) {
      const int32_t lo = static_cast<int16_t>(static_cast<uint16_t>(w & 0xFFFFu));
      const int32_t hi = static_cast<int32_t>(w - static_cast<uint32_t>(lo)) >> 16;
      v[2 * k] = static_cast<float>(lo);
      v[2 * k + 1] = static_cast<float>(hi);
    } else {
      v[2 * k] = static_cast<float>(w & 0xFFFFu);
      v[2 * k + 1] = static_cast<float>(w >> 16);
    }
  }
#pragma unroll
  for (int k = 0; k < 8; ++k)
    if (k >= n) v[k] = 0.0f;
}

// v[k] = float(sum k) for k < n. Integer -> float rounds to nearest like the host's static_cast.
__device__ __forceinline__ void load_values8(const void* base, codec::IntType t, ValueLayout l, uint64_t i,
                                             int n, float v[8]) {
  switch (t) {
    case codec::IntType::kU8: load_native8<uint8_t>(base, i, n, v); break;
    case codec::IntType::kI8: load_native8<int8_t>(base, i, n, v); break;
    case codec::IntType::kU16:
      if (l == ValueLayout::kPairs) load_pairs8<false>(base, i, n, v);
      else load_native8<uint16_t>(base, i, n, v);
      break;
    case codec::IntType::kI16:
      if (l == ValueLayout::kPairs) load_pairs8<true>(base, i, n, v);
      else load_native8<int16_t>(base, i, n, v);
      break;
    case codec::IntType::kU32: load_native8<uint32_t>(base, i, n, v); break;
    case codec::IntType::kI32: load_native8<int32_t>(base, i, n, v); break;
  }
}

// ---- b-bit packing (elem.h order: LSB first) -------------------------------------------------
// Writes the ceil(n*b/8) bytes holding codes[0..n) at p (p = packed + i*b/8, i a multiple of 8).
__device__ __forceinline__ void store_packed8(uint8_t* p, int b, int n, const uint8_t codes[8]) {
  uint64_t acc = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    if (k < n) acc |= static_cast<uint64_t>(codes[k]) << (k * b);
  const int nbytes = (n * b + 7) / 8;
  if (nbytes == b && b == 4 && aligned(p, 4)) {
    *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(acc);
  } else if (nbytes == b && b == 8 && aligned(p, 8)) {
    *reinterpret_cast<uint64_t*>(p) = acc;
  } else if (nbytes == b && b == 2 && aligned(p, 2)) {
    *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(acc);
  } else {
    for (int k = 0; k < nbytes; ++k) p[k] = static_cast<uint8_t>(acc >> (8 * k));
  }
}

__device__ __forceinline__ void load_packed8(const uint8_t* p, int b, uint32_t codes[8]) {
  uint64_t acc = 0;
  if (b == 4 && aligned(p, 4)) {
    acc = *reinterpret_cast<const uint32_t*>(p);
  } else if (b == 8 && aligned(p, 8)) {
    acc = *reinterpret_cast<const uint64_t*>(p);
  } else {
    for (int k = 0; k < b; ++k) acc |= static_cast<uint64_t>(p[k]) << (8 * k);
  }
  const uint32_t mask = (1u << b) - 1u;
#pragma unroll
  for (int k = 0; k < 8; ++k) codes[k] = static_cast<uint32_t>(acc >> (k * b)) & mask;
}

// ---- per-block context -----------------------------------------------------------------------
// Geometry of a launch over blocks [first_block, first_block + nblocks) of a layout.
struct Geom {
  uint64_t first_block;
  uint64_t nblocks;      // in this launch
  uint64_t lay_nblocks;  // in the whole call (the last one is the tail)
  uint32_t block;        // B
  uint32_t tail_elems;
  uint32_t tail_wire;
  __device__ __forceinline__ uint64_t blk(uint64_t local) const { return first_block + local; }
  __device__ __forceinline__ uint32_t wire(uint64_t local) const {
    return blk(local) + 1 == lay_nblocks ? tail_wire : block;
  }
  __device__ __forceinline__ uint32_t elems(uint64_t local) const {
    return blk(local) + 1 == lay_nblocks ? tail_elems : block;
  }
};

struct BlockCtx {
  uint64_t blk;    // global block index
  uint64_t local;  // index inside the launch (offsets of x, stats and wire buffers)
  uint32_t W;      // wire elements
  uint32_t m;      // real elements
  elem::Scale sc;
  bool ok;         // the call check passed (or there is none)
  uint32_t round;
};

// Whether the MAX-combined check words report a consistent, finite call; and the status bits.
__device__ __forceinline__ uint32_t check_status(const uint32_t* check) {
  if (!check) return 0;
  uint32_t s = 0;
  if (check[0] != 0) s |= kStatusNonFinite;
  if (check[1] != ~check[3] || check[2] != ~check[4]) s |= kStatusMismatch;
  return s;
}

__device__ __forceinline__ BlockCtx make_ctx(const Geom& g, uint64_t local, const DeviceCodec::Desc& d,
                                             const float* stats, const uint32_t* check, const Rng& rng) {
  BlockCtx c;
  c.local = local;
  c.blk = g.blk(local);
  c.W = g.wire(local);
  c.m = g.elems(local);
  c.sc = elem::block_scale(d.kind, d.levels, stats[local], c.W);
  c.ok = check_status(check) == 0;
  c.round = rng.round_ptr ? *rng.round_ptr : rng.round;
  return c;
}

__device__ __forceinline__ rng::Stream shared_stream(const Rng& r, uint32_t round) {
  return rng::Stream{r.seed, rng::kSharedStream, round};
}
__device__ __forceinline__ rng::Stream own_stream(const Rng& r, uint32_t round) {
  return rng::Stream{r.seed, r.rank + 1, round};
}

// RHT signs of the 8 elements j..j+7 (j a multiple of 8) of block blk: bit j % 128 of the
// group j / 128 draw (rht.cc apply_signs), applied by flipping the float's sign bit.
// Flips v[k] where bit k of `word` is set (word: the sign word shifted down to element j).
__device__ __forceinline__ void flip_signs8(uint32_t word, float v[8]) {
#pragma unroll
  for (int k = 0; k < 8; ++k)
    v[k] = __uint_as_float(__float_as_uint(v[k]) ^ (((word >> k) & 1u) << 31));
}

__device__ __forceinline__ void apply_signs8(const rng::Stream& s, uint64_t blk, uint64_t j, float v[8]) {
  const auto key = rng::make_key(s);
  const auto r = rng::draw4(key, s, rng::kPurposeSigns, blk, static_cast<uint32_t>(j / 128));
  flip_signs8(r.v[(j & 127) >> 5] >> (j & 31), v);
}

}  // namespace thc::cuda::detail
