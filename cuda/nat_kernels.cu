// Natural compression (Cnat) and natural dithering (Dnat) on the GPU. No rotation: every element
// is independent, so one thread encodes or decodes a chunk of 8 with elem.h's nat_round.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/launch.cuh"

namespace thc::cuda {
namespace detail {
namespace {

constexpr unsigned kNatThreads = 256;
constexpr uint32_t kNatTile = 8 * kNatThreads;  // elements per CTA

struct NatParams {
  DeviceCodec::Desc d;
  Geom g;
  uint32_t tiles;  // CTAs per full block
  const void* x;
  const float* ef;
  const float* stats;
  const void* sums;
  ValueLayout layout;
  uint8_t* packed;
  void* values;
  float* residual;
  void* out;
  const uint32_t* check;
  uint32_t* status;
  Rng rng;
  float inv_cnt;
  bool zero_out;
};

__device__ __forceinline__ int chunk_n(uint32_t m, uint64_t j) {
  return j >= m ? 0 : (m - j >= 8 ? 8 : static_cast<int>(m - j));
}

template <class T>
__global__ void __launch_bounds__(kNatThreads) nat_encode_kernel(const NatParams p) {
  __shared__ BlockCtx ctx;
  const uint64_t local = blockIdx.x / p.tiles;
  const uint32_t tile = blockIdx.x % p.tiles;
  if (threadIdx.x == 0) ctx = make_ctx(p.g, local, p.d, p.stats, p.check, p.rng);
  __syncthreads();
  const uint64_t j = static_cast<uint64_t>(tile) * kNatTile + 8u * threadIdx.x;
  const int n = chunk_n(ctx.m, j);
  if (n == 0) return;
  const uint64_t off = local * p.g.block;
  float x[8];
  load_x8<T>(static_cast<const T*>(p.x) + off, p.ef ? p.ef + off : nullptr, j, n, x);
  uint8_t code[8];
  int32_t val[8];
  if (ctx.sc.zero) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      code[k] = 0;
      val[k] = 0;
    }
  } else {
    const rng::Stream s = own_stream(p.rng, ctx.round);
    const auto key = rng::make_key(s);
    const auto r = rng::draw4(key, s, rng::kPurposeRound, ctx.blk, static_cast<uint32_t>(j / rng::kRoundGroup));
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      code[k] = 0;
      val[k] = 0;
      if (k < n) {
        const float a = x[k];
        const float rr = elem::scale2(fabsf(a), -ctx.sc.exp) * ctx.sc.enc;
        elem::nat_round(rr, a < 0, rng::round_unit(rng::round_bits(r, k)), p.d.levels, p.d.bits, &code[k], &val[k]);
      }
    }
  }
  const uint64_t wire = off + j;
  if (p.packed) store_packed8(p.packed + wire * p.d.bits / 8, p.d.bits, n, code);
  if (p.values) store_values8(p.values, p.d.sum_type, p.layout, wire, n, val);
  if (p.residual && ctx.ok) {
    if (!ctx.sc.zero) {
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = x[k] - elem::scale2(static_cast<float>(val[k]) * ctx.sc.dec, ctx.sc.exp);
    }
    store_out8<float>(p.residual + off, j, n, x);
  }
}

template <class T>
__global__ void __launch_bounds__(kNatThreads) nat_decode_kernel(const NatParams p) {
  __shared__ BlockCtx ctx;
  const uint64_t local = blockIdx.x / p.tiles;
  const uint32_t tile = blockIdx.x % p.tiles;
  if (threadIdx.x == 0) {
    ctx = make_ctx(p.g, local, p.d, p.stats, p.check, p.rng);
    if (p.status && blockIdx.x == 0) {
      const uint32_t s = check_status(p.check);
      if (s) atomicOr(p.status, s);
    }
  }
  __syncthreads();
  const uint64_t j = static_cast<uint64_t>(tile) * kNatTile + 8u * threadIdx.x;
  const int n = chunk_n(ctx.m, j);
  if (n == 0) return;
  const uint64_t off = local * p.g.block;
  float v[8];
  if (!ctx.ok) {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = __int_as_float(0x7FC00000);
  } else if (ctx.sc.zero || p.zero_out) {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = 0.0f;
  } else {
    load_values8(p.sums, p.d.sum_type, p.layout, off + j, n, v);
    const float f = ctx.sc.dec * p.inv_cnt;
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = elem::scale2(v[k] * f, ctx.sc.exp);
  }
  store_out8<T>(static_cast<T*>(p.out) + off, j, n, v);
}

template <class T>
cudaError_t launch_encode(const NatParams& p, cudaStream_t s) {
  THC_LAUNCH(nat_encode_kernel<T>, static_cast<unsigned>(p.g.nblocks * p.tiles), kNatThreads, 0, s)(p);
  return cudaGetLastError();
}
template <class T>
cudaError_t launch_decode(const NatParams& p, cudaStream_t s) {
  THC_LAUNCH(nat_decode_kernel<T>, static_cast<unsigned>(p.g.nblocks * p.tiles), kNatThreads, 0, s)(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t nat_encode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                       uint64_t first_block, uint64_t nblocks, const void* x, InType xt, const float* ef,
                       const float* d_stats, const Rng& rng, const EncodeOut& out, const uint32_t* d_check,
                       cudaStream_t stream) {
  if (!d_temp) {
    *temp_bytes = kMinTemp;
    return cudaSuccess;
  }
  if (nblocks == 0) return cudaSuccess;
  NatParams p{};
  p.d = c.desc();
  p.g = make_geom(lay, first_block, nblocks);
  p.tiles = static_cast<uint32_t>((lay.block + kNatTile - 1) / kNatTile);
  p.x = x;
  p.ef = ef;
  p.stats = d_stats;
  p.layout = out.layout;
  p.packed = out.packed;
  p.values = out.values;
  p.residual = out.residual;
  p.check = d_check;
  p.rng = rng;
  switch (xt) {
#define THC_CASE(E, T) \
  case E: return launch_encode<T>(p, stream);
    THC_CUDA_FOR_EACH_INTYPE(THC_CASE)
#undef THC_CASE
  }
  return cudaErrorInvalidValue;
}

cudaError_t nat_decode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                       uint64_t first_block, uint64_t nblocks, const void* sums, ValueLayout layout,
                       const float* d_stats, const Rng& rng, int contributors, bool mean, void* out, InType ot,
                       const uint32_t* d_check, uint32_t* d_status, cudaStream_t stream) {
  if (!d_temp) {
    *temp_bytes = kMinTemp;
    return cudaSuccess;
  }
  if (nblocks == 0) return cudaSuccess;
  NatParams p{};
  p.d = c.desc();
  p.g = make_geom(lay, first_block, nblocks);
  p.tiles = static_cast<uint32_t>((lay.block + kNatTile - 1) / kNatTile);
  p.sums = sums;
  p.layout = layout;
  p.stats = d_stats;
  p.out = out;
  p.check = d_check;
  p.status = d_status;
  p.rng = rng;
  const float cnt = static_cast<float>(contributors);
  p.inv_cnt = mean ? 1.0f / cnt : 1.0f;
  p.zero_out = contributors <= 0;
  switch (ot) {
#define THC_CASE(E, T) \
  case E: return launch_decode<T>(p, stream);
    THC_CUDA_FOR_EACH_INTYPE(THC_CASE)
#undef THC_CASE
  }
  return cudaErrorInvalidValue;
}

}  // namespace detail
}  // namespace thc::cuda
