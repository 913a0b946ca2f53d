// THC (non-uniform and uniform) encode and decode on the GPU: error-feedback add, RHT, scale and
// clamp, stochastic rounding, packing / value form; decode: sums to floats, inverse RHT.
//
// Blocks that fit the shared-memory tile (up to 2^15 floats on sm_80/sm_90) take one fused
// kernel; larger blocks (up to 2^20) take a multi-pass path through a float workspace:
//   contiguous pass  tiles of S = 2^13 consecutive elements: prologue, FWHT bits 0..log2 S - 1
//   column pass      [H = W/S rows][C columns] tiles: FWHT bits log2 S.., epilogue
// Error feedback needs the inverse transform of this rank's own dequantised codes: in the fused
// kernel a second FWHT in shared memory, in the multi-pass path two more passes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/fwht.cuh"
#include "cuda/launch.cuh"

namespace thc::cuda {
namespace detail {
namespace {

enum class Src : int { kInput, kSums, kWs };
enum class Dst : int { kWs, kQuantize, kQuantizeDeq, kResidual, kOutput };

constexpr uint32_t kColTile = 8192;      // elements per column-pass CTA
constexpr unsigned kColThreads = 256;
constexpr unsigned kMaxThreads = 1024;

struct ThcParams {
  DeviceCodec::Desc d;
  Geom g;
  int tile_log2;  // contiguous tile S; = block_log2 in the fused path
  const void* x;
  const float* ef;
  const float* stats;
  const void* sums;
  ValueLayout layout;
  uint8_t* packed;
  void* values;
  float* residual;
  void* out;
  float* ws;
  const uint32_t* check;
  uint32_t* status;
  Rng rng;
  float half_c;   // decode: (g/2) * contributors
  float inv_cnt;  // decode: 1/contributors for the mean, else 1
  bool zero_out;  // decode: no contributors
};

__device__ __forceinline__ int chunk_n(uint32_t m, uint64_t j) {
  return j >= m ? 0 : (m - j >= 8 ? 8 : static_cast<int>(m - j));
}

// Variants of the contiguous kernels (LaunchOpts::kernel_variant, bits), kept side by side until
// a GPU session has timed them (thc_gpu_bench --variants): each gives the same bits as variant 0
// (CodecKernels tests, on the emulator and on a device).
//   kVarSmemSigns  the tile's RHT sign words are drawn once, one Philox call per 128 elements by
//                  the first St/128 threads, into shared memory after the tile; variant 0 has
//                  every thread draw the call of its 8 elements (16 threads draw each call), in
//                  the prologue and again in the epilogue (decode, error feedback)
//   kVarLoadAhead  the encode's first pass loads a thread's next chunk of input before the
//                  arithmetic of this one, so the loads overlap the work instead of waiting for
//                  it (one CTA per SM at block 2^15 leaves nothing else to hide them)
//   kVarHalfThreads  at most 512 threads per CTA (launch bounds 512: up to 128 registers per
//                  thread instead of 64), each thread taking twice the chunks
// Variants apply to float32 inputs (what thc_gpu_bench times); 16-bit inputs run variant 0.
constexpr int kVarSmemSigns = 1;
constexpr int kVarLoadAhead = 2;
constexpr int kVarHalfThreads = 4;
constexpr int kVarAll = 7;

// Whether a contiguous kernel draws its tile's sign words into shared memory: variant bit 1 and
// a kernel that applies signs (the forward prologue, or the inverse epilogue).
template <Src S, Dst D, int V>
constexpr bool kUsesSignWords =
    (V & kVarSmemSigns) != 0 && (S == Src::kInput || D == Dst::kResidual || D == Dst::kOutput);

constexpr unsigned max_threads(int V) { return (V & kVarHalfThreads) ? kMaxThreads / 2 : kMaxThreads; }

// Bytes of dynamic shared memory of a contiguous kernel with tiles of Smax floats.
__host__ __device__ __forceinline__ size_t contig_smem(uint32_t Smax, bool sign_words) {
  const uint32_t words = Smax / 32 < 4 ? 4 : Smax / 32;
  return size_t{4} * Smax + (sign_words ? size_t{4} * words : 0);
}

// Signs of the 8 elements at block offset j: from the tile's sign words (sgn: the tile starts at
// block offset base) or drawn here.
__device__ __forceinline__ void signs8(const ThcParams& p, const BlockCtx& c, uint64_t j, const uint32_t* sgn,
                                       uint32_t base, float v[8]) {
  if (sgn) flip_signs8(sgn[(j - base) >> 5] >> (j & 31), v);
  else apply_signs8(shared_stream(p.rng, c.round), c.blk, j, v);
}

// sgn[4a + w] = word w of the sign draw of group base / 128 + a, for every group of a tile of St
// elements at block offset base (base a multiple of 128 or 0). All threads call it; returns
// synchronised.
__device__ __forceinline__ void draw_tile_signs(const ThcParams& p, const BlockCtx& c, uint32_t base, uint32_t St,
                                                uint32_t* sgn, unsigned tid, unsigned nt) {
  const uint32_t groups = (St + 127) / 128;
  const rng::Stream s = shared_stream(p.rng, c.round);
  const auto key = rng::make_key(s);
  for (uint32_t a = tid; a < groups; a += nt) {
    const auto r = rng::draw4(key, s, rng::kPurposeSigns, c.blk, base / 128 + a);
    sgn[4 * a] = r.v[0];
    sgn[4 * a + 1] = r.v[1];
    sgn[4 * a + 2] = r.v[2];
    sgn[4 * a + 3] = r.v[3];
  }
  __syncthreads();
}

// The encode's input at block offset j (8 elements, zeros past the block's real ones), as loaded.
template <class T>
__device__ __forceinline__ void input_at(const ThcParams& p, const BlockCtx& c, uint64_t j, float v[8]) {
  const uint64_t off = c.local * p.g.block;
  load_x8<T>(static_cast<const T*>(p.x) + off, p.ef ? p.ef + off : nullptr, j, chunk_n(c.m, j), v);
}

// The encode's input chunk `chunk` of a tile at block offset base, as loaded (x + ef), or zeros
// (past the tile's chunks, or a block whose scale is zero).
template <class T>
__device__ __forceinline__ void input_raw(const ThcParams& p, const BlockCtx& c, uint32_t base, uint32_t chunk,
                                          uint32_t chunks, float v[8]) {
  if (chunk >= chunks || c.sc.zero) {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = 0.0f;
    return;
  }
  input_at<T>(p, c, base + 8ull * chunk, v);
}

// The prologue of the forward RHT on a loaded chunk: scale2 by the block's exponent, then the signs.
__device__ __forceinline__ void input_prologue(const ThcParams& p, const BlockCtx& c, uint64_t j, const uint32_t* sgn,
                                               uint32_t base, float v[8]) {
  if (c.sc.zero) return;
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = elem::scale2(v[k], -c.sc.exp);
  signs8(p, c, j, sgn, base, v);
}

// Chunk j (block offset; a tile at base, sign words sgn or nullptr) of the kernel's source.
template <class T, Src S>
__device__ __forceinline__ void load_chunk(const ThcParams& p, const BlockCtx& c, uint64_t j, float v[8],
                                           const uint32_t* sgn, uint32_t base) {
  const uint64_t off = c.local * p.g.block;
  if (S == Src::kWs) {
    load_f8(p.ws + off + j, v);
    return;
  }
  if (S == Src::kInput) {
    if (c.sc.zero) {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = 0.0f;
      return;
    }
    input_at<T>(p, c, j, v);
    input_prologue(p, c, j, sgn, base, v);
    return;
  }
  // Src::kSums: Codec::decode's dequantisation, (S - n g/2) * step * dec / n
  if (c.sc.zero || p.zero_out) {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = 0.0f;
    return;
  }
  load_values8(p.sums, p.d.sum_type, p.layout, off + j, 8, v);
  const float f = c.sc.dec * p.inv_cnt;
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = elem::thc_decode_sum(v[k], p.half_c, p.d.step) * f;
}

// Stochastic rounding of 8 rotated coordinates onto the table; optionally v <- the dequantised
// own contribution (what Codec::encode's residual transforms back).
__device__ __forceinline__ void quantize8(const ThcParams& p, const BlockCtx& c, uint64_t j, float v[8], bool deq) {
  uint8_t idx[8];
  int32_t val[8];
  if (c.sc.zero) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      idx[k] = 0;
      val[k] = 0;
    }
  } else {
    const rng::Stream s = own_stream(p.rng, c.round);
    const auto key = rng::make_key(s);
    const auto r = rng::draw4(key, s, rng::kPurposeRound, c.blk, static_cast<uint32_t>(j / rng::kRoundGroup));
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float u = rng::round_unit(rng::round_bits(r, k));
      const float q = elem::thc_grid(v[k] * c.sc.enc, p.d.t, p.d.g2t, p.d.gf);
      elem::thc_round(q, u, p.d.cells, p.d.g, &idx[k], &val[k]);
    }
  }
  const uint64_t wire = c.local * p.g.block + j;
  if (p.packed) store_packed8(p.packed + wire * p.d.bits / 8, p.d.bits, 8, idx);
  if (p.values) store_values8(p.values, p.d.sum_type, p.layout, wire, 8, val);
  if (deq) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      v[k] = c.sc.zero ? 0.0f : elem::thc_decode_sum(static_cast<float>(val[k]), p.d.half_g, p.d.step) * c.sc.dec;
  }
}

template <class T, Dst D>
__device__ __forceinline__ void finish_chunk(const ThcParams& p, const BlockCtx& c, uint64_t j, float v[8],
                                             const uint32_t* sgn = nullptr, uint32_t base = 0) {
  const uint64_t off = c.local * p.g.block;
  if (D == Dst::kWs) {
    store_f8(p.ws + off + j, v);
  } else if (D == Dst::kQuantize || D == Dst::kQuantizeDeq) {
    quantize8(p, c, j, v, D == Dst::kQuantizeDeq);
    if (D == Dst::kQuantizeDeq) store_f8(p.ws + off + j, v);
  } else if (D == Dst::kResidual) {
    const int n = chunk_n(c.m, j);
    if (!c.ok || n == 0) return;  // a failed call leaves the residual untouched
    float x[8];
    load_x8<T>(static_cast<const T*>(p.x) + off, p.ef ? p.ef + off : nullptr, j, n, x);
    if (!c.sc.zero) {
      signs8(p, c, j, sgn, base, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) x[k] = x[k] - elem::scale2(v[k], c.sc.exp);
    }
    store_out8<float>(p.residual + off, j, n, x);
  } else {  // kOutput
    const int n = chunk_n(c.m, j);
    if (n == 0) return;
    if (!c.ok) {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __int_as_float(0x7FC00000);
    } else if (c.sc.zero || p.zero_out) {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = 0.0f;
    } else {
      signs8(p, c, j, sgn, base, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = elem::scale2(v[k], c.sc.exp);
    }
    store_out8<T>(static_cast<T*>(p.out) + off, j, n, v);
  }
}

__device__ __forceinline__ void report_status(const ThcParams& p) {
  if (p.status && blockIdx.x == 0 && threadIdx.x == 0) {
    const uint32_t s = check_status(p.check);
    if (s) atomicOr(p.status, s);
  }
}

// Contiguous tiles of S = 2^tile_log2 elements (the whole block in the fused path). kTwo: the
// fused error-feedback encode (quantise, then the inverse FWHT of the own dequantised codes).
// V: the variant bits (kVar*).
template <class T, Src S, Dst D, bool kTwo, int V = 0>
__global__ void __launch_bounds__(max_threads(V)) contig_kernel(const ThcParams p) {
  constexpr bool kSigns = kUsesSignWords<S, D, V>;
  constexpr bool kAhead = (V & kVarLoadAhead) != 0 && S == Src::kInput;
  THC_EXTERN_SHARED(float4, smem4);
  float* sm = reinterpret_cast<float*>(smem4);
  __shared__ BlockCtx ctx;
  const uint32_t tiles = p.g.block >> p.tile_log2;
  const uint64_t local = blockIdx.x / tiles;
  const uint32_t tile = blockIdx.x % tiles;
  if (threadIdx.x == 0) ctx = make_ctx(p.g, local, p.d, p.stats, p.check, p.rng);
  if (D == Dst::kOutput && tile == 0) report_status(p);
  __syncthreads();
  const uint32_t St = (1u << p.tile_log2) < ctx.W ? (1u << p.tile_log2) : ctx.W;
  if (tile * St >= ctx.W) return;
  const uint32_t base = tile * St;
  const uint32_t chunks = St / 8;
  const unsigned tid = threadIdx.x, nt = blockDim.x, lane = tid & 31u;
  const int log2St = ilog2(St);
  uint32_t* sgn = nullptr;
  float ahead[8];
  if constexpr (kAhead) input_raw<T>(p, ctx, base, tid, chunks, ahead);  // in flight during the draw
  if constexpr (kSigns) {
    sgn = reinterpret_cast<uint32_t*>(sm + (1u << p.tile_log2));
    draw_tile_signs(p, ctx, base, St, sgn, tid, nt);
  }

  for (uint32_t c0 = 0; c0 < chunks; c0 += nt) {
    const uint32_t c = c0 + tid;
    float v[8];
    if constexpr (kAhead) {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = ahead[k];
      input_raw<T>(p, ctx, base, c + nt, chunks, ahead);  // the next chunk's loads, before this one's work
      if (c < chunks) input_prologue(p, ctx, base + 8ull * c, sgn, base, v);
    } else if (c < chunks) {
      load_chunk<T, S>(p, ctx, base + 8ull * c, v, sgn, base);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = 0.0f;
    }
    reg_stages8(v);
    warp_stages8(v, lane, chunks);
    if (c < chunks) store_f8(sm + 8 * c, v);
  }
  __syncthreads();
  smem_stages(sm, St, 8, log2St, tid, nt);

  for (uint32_t c0 = 0; c0 < chunks; c0 += nt) {
    const uint32_t c = c0 + tid;
    float v[8];
    if (c < chunks) {
      load_f8(sm + 8 * c, v);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = 0.0f;
    }
    if constexpr (kTwo) {
      if (c < chunks) quantize8(p, ctx, base + 8ull * c, v, true);
      reg_stages8(v);
      warp_stages8(v, lane, chunks);
      if (c < chunks) store_f8(sm + 8 * c, v);
    } else {
      if (c < chunks) finish_chunk<T, D>(p, ctx, base + 8ull * c, v, sgn, base);
    }
  }
  if constexpr (kTwo) {
    __syncthreads();
    smem_stages(sm, St, 8, log2St, tid, nt);
    for (uint32_t c = tid; c < chunks; c += nt) {
      float v[8];
      load_f8(sm + 8 * c, v);
      finish_chunk<T, Dst::kResidual>(p, ctx, base + 8ull * c, v, sgn, base);
    }
  }
}

struct ColShape {
  uint32_t St, H, C, ctiles;
};
__host__ __device__ __forceinline__ ColShape col_shape(uint32_t W, int tile_log2) {
  ColShape s;
  s.St = (1u << tile_log2) < W ? (1u << tile_log2) : W;
  s.H = W / s.St;
  s.C = kColTile / s.H < s.St ? kColTile / s.H : s.St;
  s.ctiles = s.St / s.C;
  return s;
}

// Column tiles [H rows][C columns] of a block seen as an H x S matrix (row-major, S = the
// contiguous tile): FWHT stages on the row bits, i.e. the block's index bits log2 S and up.
template <class T, Dst D>
__global__ void __launch_bounds__(kColThreads) column_kernel(const ThcParams p, uint32_t ctiles_full) {
  THC_EXTERN_SHARED(float4, smem4);
  float* sm = reinterpret_cast<float*>(smem4);
  __shared__ BlockCtx ctx;
  const uint64_t local = blockIdx.x / ctiles_full;
  const uint32_t ct = blockIdx.x % ctiles_full;
  if (threadIdx.x == 0) ctx = make_ctx(p.g, local, p.d, p.stats, p.check, p.rng);
  if (D == Dst::kOutput && ct == 0) report_status(p);
  __syncthreads();
  const ColShape sh = col_shape(ctx.W, p.tile_log2);
  if (ct >= sh.ctiles) return;
  const uint32_t c0 = ct * sh.C;
  const uint32_t n = sh.H * sh.C;
  const int logC = ilog2(sh.C);
  const unsigned tid = threadIdx.x, nt = blockDim.x;
  const float* src = p.ws + local * p.g.block;
  for (uint32_t e = 4 * tid; e < n; e += 4 * nt) {
    const uint32_t r = e >> logC, col = e & (sh.C - 1);
    reinterpret_cast<float4*>(sm)[e / 4] = *reinterpret_cast<const float4*>(src + r * sh.St + c0 + col);
  }
  __syncthreads();
  smem_stages(sm, n, logC, logC + ilog2(sh.H), tid, nt);
  for (uint32_t e = 8 * tid; e < n; e += 8 * nt) {
    const uint32_t r = e >> logC, col = e & (sh.C - 1);
    float v[8];
    load_f8(sm + e, v);
    finish_chunk<T, D>(p, ctx, static_cast<uint64_t>(r) * sh.St + c0 + col, v);
  }
}

int smem_log2_limit(const LaunchOpts& o) {
  int l = 15;
  const int optin = device_smem_optin();
  while (l > 8 && (size_t{4} << l) > static_cast<size_t>(optin)) --l;
  if (o.max_smem_log2 > 0 && o.max_smem_log2 < l) l = o.max_smem_log2;
  return l;
}

unsigned contig_threads(uint32_t S, unsigned most = kMaxThreads) {
  const uint32_t c = S / 8;
  return c >= most ? most : (c < 32 ? 32u : c);
}

// Raise the kernel's dynamic shared memory limit to the most any launch on this device uses,
// once per device: cudaFuncSetAttribute is not a stream operation, so it happens before a CUDA
// graph capture (prepare_device) rather than inside one.
template <class T, Src S, Dst D, bool kTwo, int V = 0>
cudaError_t prepare_contig() {
  static std::atomic<uint64_t> done{0};
  int dev = 0;
  THC_CUDA_TRY(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit && (done.load(std::memory_order_acquire) & bit)) return cudaSuccess;
  THC_CUDA_TRY(allow_smem(contig_kernel<T, S, D, kTwo, V>,
                          contig_smem(1u << smem_log2_limit(LaunchOpts()), kUsesSignWords<S, D, V>)));
  done.fetch_or(bit, std::memory_order_release);
  return cudaSuccess;
}

template <class T, Src S, Dst D, bool kTwo, int V = 0>
cudaError_t launch_contig(const ThcParams& p, cudaStream_t stream) {
  const uint32_t Smax = 1u << p.tile_log2;
  const size_t smem = contig_smem(Smax, kUsesSignWords<S, D, V>);
  auto* k = contig_kernel<T, S, D, kTwo, V>;
  if (smem > 48 * 1024) THC_CUDA_TRY((prepare_contig<T, S, D, kTwo, V>()));
  const uint64_t grid = p.g.nblocks * (p.g.block >> p.tile_log2);
  THC_LAUNCH(k, static_cast<unsigned>(grid), contig_threads(Smax, max_threads(V)), smem, stream)(p);
  return cudaGetLastError();
}

template <class T, Dst D>
cudaError_t launch_column(const ThcParams& p, cudaStream_t stream) {
  const ColShape sh = col_shape(p.g.block, p.tile_log2);
  const size_t smem = size_t{4} * sh.H * sh.C;
  auto* k = column_kernel<T, D>;  // at most kColTile floats: under the 48 KiB default
  static_assert(kColTile * 4 <= 48 * 1024, "column tiles must fit the default shared memory");
  const uint64_t grid = p.g.nblocks * sh.ctiles;
  THC_LAUNCH(k, static_cast<unsigned>(grid), kColThreads, smem, stream)(p, sh.ctiles);
  return cudaGetLastError();
}

struct Plan {
  bool fused;
  int tile_log2;
};

Plan plan_for(const codec::Layout& lay, const LaunchOpts& o) {
  int bl = 0;
  while ((uint64_t{1} << bl) < lay.block) ++bl;
  Plan pl;
  const int lim = smem_log2_limit(o);
  pl.fused = bl <= lim;
  int t = o.multipass_tile_log2 > 0 ? o.multipass_tile_log2 : 13;
  if (t > lim) t = lim;
  if (t < 10) t = 10;
  pl.tile_log2 = pl.fused ? bl : (t < bl ? t : bl);
  return pl;
}

// The variant a launch runs: the options' bits, without the shared-memory sign words where the
// tile and its words would not fit the device's opt-in shared memory.
int kernel_variant(const LaunchOpts& o, const Plan& pl) {
  int v = o.kernel_variant & kVarAll;
  if ((v & kVarSmemSigns) && contig_smem(1u << pl.tile_log2, true) > static_cast<size_t>(device_smem_optin()))
    v &= ~kVarSmemSigns;
  return v;
}

template <class T, int V>
cudaError_t encode_typed(ThcParams& p, const Plan& pl, bool ef, cudaStream_t s) {
  if (pl.fused) {
    if (ef) return launch_contig<T, Src::kInput, Dst::kResidual, true, V>(p, s);
    return launch_contig<T, Src::kInput, Dst::kQuantize, false, V>(p, s);
  }
  THC_CUDA_TRY((launch_contig<T, Src::kInput, Dst::kWs, false, V>(p, s)));
  if (!ef) return launch_column<T, Dst::kQuantize>(p, s);
  THC_CUDA_TRY((launch_column<T, Dst::kQuantizeDeq>(p, s)));
  THC_CUDA_TRY((launch_contig<float, Src::kWs, Dst::kWs, false>(p, s)));
  return launch_column<T, Dst::kResidual>(p, s);
}

template <class T, int V>
cudaError_t decode_typed(ThcParams& p, const Plan& pl, cudaStream_t s) {
  if (pl.fused) return launch_contig<T, Src::kSums, Dst::kOutput, false, V>(p, s);
  THC_CUDA_TRY((launch_contig<float, Src::kSums, Dst::kWs, false>(p, s)));
  return launch_column<T, Dst::kOutput>(p, s);
}

// Variants for float32 inputs only (see kVarAll); the decode has no loads to run ahead.
template <class T>
cudaError_t encode_variant(ThcParams& p, const Plan& pl, bool ef, int v, cudaStream_t s) {
  if constexpr (std::is_same_v<T, float>) {
    switch (v) {
      case 1: return encode_typed<T, 1>(p, pl, ef, s);
      case 2: return encode_typed<T, 2>(p, pl, ef, s);
      case 3: return encode_typed<T, 3>(p, pl, ef, s);
      case 4: return encode_typed<T, 4>(p, pl, ef, s);
      case 5: return encode_typed<T, 5>(p, pl, ef, s);
      case 6: return encode_typed<T, 6>(p, pl, ef, s);
      case 7: return encode_typed<T, 7>(p, pl, ef, s);
      default: break;
    }
  }
  return encode_typed<T, 0>(p, pl, ef, s);
}

template <class T>
cudaError_t decode_variant(ThcParams& p, const Plan& pl, int v, cudaStream_t s) {
  if constexpr (std::is_same_v<T, float>) {
    switch (v & (kVarSmemSigns | kVarHalfThreads)) {
      case 1: return decode_typed<T, 1>(p, pl, s);
      case 4: return decode_typed<T, 4>(p, pl, s);
      case 5: return decode_typed<T, 5>(p, pl, s);
      default: break;
    }
  }
  return decode_typed<T, 0>(p, pl, s);
}

template <class T>
cudaError_t prepare_typed() {
  THC_CUDA_TRY((prepare_contig<T, Src::kInput, Dst::kQuantize, false>()));
  THC_CUDA_TRY((prepare_contig<T, Src::kInput, Dst::kResidual, true>()));
  return prepare_contig<T, Src::kSums, Dst::kOutput, false>();
}

}  // namespace

cudaError_t thc_prepare_device() {
#define THC_CASE(E, T) THC_CUDA_TRY(prepare_typed<T>());
  THC_CUDA_FOR_EACH_INTYPE(THC_CASE)
#undef THC_CASE
  return cudaSuccess;
}

cudaError_t thc_encode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                       uint64_t first_block, uint64_t nblocks, const void* x, InType xt, const float* ef,
                       const float* d_stats, const Rng& rng, const EncodeOut& out, const uint32_t* d_check,
                       cudaStream_t stream, const LaunchOpts& opts) {
  const Plan pl = plan_for(lay, opts);
  const int variant = kernel_variant(opts, pl);
  const size_t need = pl.fused ? kMinTemp : std::max(kMinTemp, nblocks * lay.block * sizeof(float));
  if (!d_temp) {
    *temp_bytes = need;
    return cudaSuccess;
  }
  THC_CUDA_TRY(check_temp(d_temp, *temp_bytes, need));
  if (nblocks == 0) return cudaSuccess;
  ThcParams p{};
  p.d = c.desc();
  p.g = make_geom(lay, first_block, nblocks);
  p.tile_log2 = pl.tile_log2;
  p.x = x;
  p.ef = ef;
  p.stats = d_stats;
  p.layout = out.layout;
  p.packed = out.packed;
  p.values = out.values;
  p.residual = out.residual;
  p.ws = static_cast<float*>(d_temp);
  p.check = d_check;
  p.rng = rng;
  const bool with_ef = out.residual != nullptr;
  switch (xt) {
#define THC_CASE(E, T) \
  case E: return encode_variant<T>(p, pl, with_ef, variant, stream);
    THC_CUDA_FOR_EACH_INTYPE(THC_CASE)
#undef THC_CASE
  }
  return cudaErrorInvalidValue;
}

cudaError_t thc_decode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                       uint64_t first_block, uint64_t nblocks, const void* sums, ValueLayout layout,
                       const float* d_stats, const Rng& rng, int contributors, bool mean, void* out, InType ot,
                       const uint32_t* d_check, uint32_t* d_status, cudaStream_t stream, const LaunchOpts& opts) {
  const Plan pl = plan_for(lay, opts);
  const int variant = kernel_variant(opts, pl);
  const size_t need = pl.fused ? kMinTemp : std::max(kMinTemp, nblocks * lay.block * sizeof(float));
  if (!d_temp) {
    *temp_bytes = need;
    return cudaSuccess;
  }
  THC_CUDA_TRY(check_temp(d_temp, *temp_bytes, need));
  if (nblocks == 0) return cudaSuccess;
  ThcParams p{};
  p.d = c.desc();
  p.g = make_geom(lay, first_block, nblocks);
  p.tile_log2 = pl.tile_log2;
  p.sums = sums;
  p.layout = layout;
  p.stats = d_stats;
  p.out = out;
  p.ws = static_cast<float*>(d_temp);
  p.check = d_check;
  p.status = d_status;
  p.rng = rng;
  const float cnt = static_cast<float>(contributors);
  p.half_c = p.d.half_g * cnt;
  p.inv_cnt = mean ? 1.0f / cnt : 1.0f;
  p.zero_out = contributors <= 0;
  switch (ot) {
#define THC_CASE(E, T) \
  case E: return decode_variant<T>(p, pl, variant, stream);
    THC_CUDA_FOR_EACH_INTYPE(THC_CASE)
#undef THC_CASE
  }
  return cudaErrorInvalidValue;
}

}  // namespace detail
}  // namespace thc::cuda
