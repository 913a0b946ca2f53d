// Prelude: each block's statistic (RMS over the wire size, or max |x|) of x (+ error feedback),
// the non-finite flag and the call digest, laid out for one MAX allreduce.
//
// Deterministic: partial sums over fixed 4096-element segments reduce in a fixed tree, then a
// second kernel adds the segments in order. The host sums the same double products
// sequentially, so the float RMS can differ from Codec::prelude in its last bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>

#include "cuda/common.cuh"
#include "cuda/launch.cuh"

namespace thc::cuda {
namespace detail {
namespace {

constexpr unsigned kPreThreads = 256;
constexpr uint32_t kPreSeg = 4096;  // elements per partial (2 chunks of 8 per thread)

struct Part {
  double s;
  float mx;
  uint32_t bad;
};

template <class T>
__global__ void __launch_bounds__(kPreThreads)
    prelude_part_kernel(const T* __restrict__ x, const float* __restrict__ ef, Geom g, uint32_t parts, Part* out) {
  const uint64_t local = blockIdx.x / parts;
  const uint32_t part = blockIdx.x % parts;
  const uint32_t m = g.elems(local);
  const uint64_t base = static_cast<uint64_t>(part) * kPreSeg;
  if (base >= m) return;  // uniform: the finalize reads only the segments that exist
  const uint64_t off = local * g.block;
  double s = 0;
  float mx = 0;
  uint32_t bad = 0;
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const uint64_t j = base + 8ull * (threadIdx.x + q * kPreThreads);
    const int n = j >= m ? 0 : (m - j >= 8 ? 8 : static_cast<int>(m - j));
    if (n == 0) continue;
    float v[8];
    load_x8<T>(x + off, ef ? ef + off : nullptr, j, n, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (k < n) {
        const double d = static_cast<double>(v[k]);
        s += d * d;
        const float a = fabsf(v[k]);
        bad |= !(a <= FLT_MAX) ? 1u : 0u;
        mx = a > mx ? a : mx;
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    s += __shfl_xor_sync(kFullMask, s, o);
    const float om = __shfl_xor_sync(kFullMask, mx, o);
    mx = om > mx ? om : mx;
    bad |= __shfl_xor_sync(kFullMask, bad, o);
  }
  __shared__ Part warps[kPreThreads / 32];
  const unsigned w = threadIdx.x / 32, lane = threadIdx.x & 31u;
  if (lane == 0) warps[w] = Part{s, mx, bad};
  __syncthreads();
  if (threadIdx.x == 0) {
    Part r = warps[0];
    for (unsigned i = 1; i < kPreThreads / 32; ++i) {
      r.s += warps[i].s;
      r.mx = warps[i].mx > r.mx ? warps[i].mx : r.mx;
      r.bad |= warps[i].bad;
    }
    out[blockIdx.x] = r;
  }
}

__global__ void __launch_bounds__(256)
    prelude_final_kernel(const Part* __restrict__ in, Geom g, uint32_t parts, bool rms, float* stats,
                         uint32_t* check, uint32_t d0, uint32_t d1) {
  const uint64_t local = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  if (check && local == 0) {
    check[1] = d0;
    check[2] = d1;
    check[3] = ~d0;
    check[4] = ~d1;
  }
  if (local >= g.nblocks) return;
  const uint32_t m = g.elems(local);
  const uint32_t used = (m + kPreSeg - 1) / kPreSeg;
  double s = 0;
  float mx = 0;
  uint32_t bad = 0;
  for (uint32_t i = 0; i < used; ++i) {
    const Part pt = in[local * parts + i];
    s += pt.s;
    mx = pt.mx > mx ? pt.mx : mx;
    bad |= pt.bad;
  }
  // Codec::prelude: L2 kinds are bad when the double sum is not finite, max kinds when some |x|
  // is not <= FLT_MAX; both happen exactly when some element is NaN or infinite.
  if (rms) {
    bad = s <= DBL_MAX ? 0u : 1u;  // s >= 0: fails for Inf and NaN only
    stats[local] = static_cast<float>(sqrt(s / static_cast<double>(g.wire(local))));
  } else {
    stats[local] = mx;
  }
  if (bad && check) atomicOr(check, 1u);
}

template <class T>
cudaError_t launch_prelude(const void* x, const float* ef, const Geom& g, uint32_t parts, bool rms, Part* tmp,
                           float* stats, uint32_t* check, uint64_t digest, cudaStream_t stream) {
  if (check) THC_CUDA_TRY(cudaMemsetAsync(check, 0, sizeof(uint32_t), stream));
  THC_LAUNCH(prelude_part_kernel<T>, static_cast<unsigned>(g.nblocks * parts), kPreThreads, 0, stream)(
      static_cast<const T*>(x), ef, g, parts, tmp);
  THC_CUDA_TRY(cudaGetLastError());
  const unsigned grid = static_cast<unsigned>((g.nblocks + 255) / 256);
  THC_LAUNCH(prelude_final_kernel, grid, 256, 0, stream)(tmp, g, parts, rms, stats, check,
                                                        static_cast<uint32_t>(digest),
                                                        static_cast<uint32_t>(digest >> 32));
  return cudaGetLastError();
}

}  // namespace
}  // namespace detail

cudaError_t prelude(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                    const void* x, InType xt, const float* ef, float* d_stats, uint32_t* d_check, uint64_t digest,
                    cudaStream_t stream) {
  using namespace detail;
  const uint32_t parts = static_cast<uint32_t>((lay.block + kPreSeg - 1) / kPreSeg);
  const size_t need = std::max(kMinTemp, lay.nblocks * parts * sizeof(Part));
  if (!d_temp) {
    *temp_bytes = need;
    return cudaSuccess;
  }
  THC_CUDA_TRY(check_temp(d_temp, *temp_bytes, need));
  const Geom g = make_geom(lay, 0, lay.nblocks);
  if (lay.nblocks == 0) {
    // count 0: no statistics; the check still says "finite, this digest"
    if (!d_check) return cudaSuccess;
    THC_CUDA_TRY(cudaMemsetAsync(d_check, 0, sizeof(uint32_t), stream));
    THC_LAUNCH(prelude_final_kernel, 1, 32, 0, stream)(static_cast<Part*>(d_temp), g, parts, false, d_stats,
                                                      d_check, static_cast<uint32_t>(digest),
                                                      static_cast<uint32_t>(digest >> 32));
    return cudaGetLastError();
  }
  const bool rms = elem::stat_is_rms(c.desc().kind);
  Part* tmp = static_cast<Part*>(d_temp);
  switch (xt) {
#define THC_CASE(E, T) \
  case E: return launch_prelude<T>(x, ef, g, parts, rms, tmp, d_stats, d_check, digest, stream);
    THC_CUDA_FOR_EACH_INTYPE(THC_CASE)
#undef THC_CASE
  }
  return cudaErrorInvalidValue;
}

}  // namespace thc::cuda
