// Fast Walsh-Hadamard transform, scalar reference and a Highway SIMD version.
//
// Shape of the SIMD version (cache and register aware):
//  * AVX-512 targets, n >= 128: the first pass runs stages h = 1..8 inside each zmm register
//    (a lane permute and a multiply-add by +-1, exact) and h = 16..64 across 8 registers, so a
//    128-float chunk takes its first 7 stages in one load and one store; every further pass runs
//    up to 4 stages (radix 16) on 16 registers loaded at stride h. The chunk pass and the stages
//    h = 128..1024 run tile by tile (2048 floats, 8 KiB: the tile stays in L1 between them);
//    the stages above go over the whole block. A 2^14 block (64 KiB) takes the tiles and one
//    pass of 3 stages, a 2^16 block the tiles and 2 passes.
//    The codec's kernels fuse their element-wise prologue (prescale and signs; THC decode: the
//    dequantisation) into the first pass and their epilogue into the last: signs, postscale and
//    residual (kern::rotate_inverse, kern::thc_decode_block, whose large results leave as
//    non-temporal stores), or THC's rounding and 4-bit packing (kern::thc_encode_block), which
//    then needs no store of the rotated block and no second pass over it.
//  * AVX2, n >= 64: the same passes on ymm registers (RegOps): stages h = 1, 2, 4 inside a
//    register, h = 8..32 across 8 registers (a 64-float chunk), later passes of at most 3 stages
//    (radix 8: 16 ymm registers), the same fused prologues and epilogues (THC's rounding with its
//    cell table gathered, g <= 255) except the non-temporal stores.
//  * other targets: stages h = 1 and 2 inside 128-bit vectors with lane shuffles; stages with
//    4 <= h < 2^12 on L1-sized tiles (2^13 floats), so a tile stays in cache while all its
//    small stages run; the remaining large stages fused two at a time (radix 4).
// Every butterfly computes a + b and a - b of the same operands as fwht_scalar, so the result is
// bit-identical whatever the order of the passes.
// GCC 12's AVX-512 intrinsics (permutes, shuffles, conversions) start from _mm512_undefined_*,
// which trips a false -Wmaybe-uninitialized (GCC bug 105593, fixed in 12.3 / 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "collectives/codec/rht.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "collectives/codec/codec_simd.h"
#include "collectives/codec/elem.h"
#include "collectives/codec/load_float-inl.h"
#include "collectives/codec/philox-inl.h"
#include "collectives/codec/thc_round-inl.h"
#include "hwy/cache_control.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif
#include "collectives/codec/rht.h"
#include "common/simd_cap.h"  // THC_SIMD

HWY_BEFORE_NAMESPACE();
namespace thc::codec::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
void ApplySignsImpl(float* x, uint64_t n, const rng::Stream& shared, uint64_t blk) {
  kern::apply_signs_scalar(x, n, shared, blk);
}
#else
// Sign flips as XOR of bit 31, with the sign words of 128 Lanes elements drawn at once.
void ApplySignsImpl(float* HWY_RESTRICT x, uint64_t n, const rng::Stream& shared, uint64_t blk) {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const size_t N = hn::Lanes(d);
  const uint64_t span = 128 * N;
  const PhiloxFamily fam = MakeFamily(shared, rng::kPurposeSigns, blk);
  HWY_ALIGN uint32_t words[4 * kMaxU32];
  for (uint64_t base = 0; base < n; base += span) {
    SignWords(du, fam, base, words);
    const uint64_t end = n - base < span ? n : base + span;
    uint64_t i = base;
    for (; i + N <= end; i += N)
      hn::StoreU(hn::Xor(hn::LoadU(d, x + i), hn::BitCast(d, SignBits(du, words, i - base))), d, x + i);
    for (; i < end; ++i) {
      uint32_t u;
      std::memcpy(&u, &x[i], 4);
      u ^= ScalarSignBit(words, i - base);
      std::memcpy(&x[i], &u, 4);
    }
  }
}
#endif

#if HWY_TARGET == HWY_SCALAR
void FwhtImpl(float* x, uint64_t n) { fwht_scalar(x, n); }
void RotateForwardImpl(const float* x, uint64_t elems, uint64_t n, int e, const rng::Stream& shared, uint64_t blk,
                       float* work) {
  kern::rotate_forward_scalar(x, elems, n, e, shared, blk, work);
}
void RotateInverseImpl(float* work, uint64_t n, uint64_t m, int e, const rng::Stream& shared, uint64_t blk,
                       const float* sub, float* out) {
  kern::rotate_inverse_scalar(work, n, m, e, shared, blk, sub, out);
}
void ThcDecodeBlockImpl(IntType t, const void* sums, uint64_t off, uint64_t n, uint64_t m, float half, float step,
                        float f, int e, const rng::Stream& shared, uint64_t blk, const float* sub, float* out,
                        float* work, bool) {
  kern::thc_decode_block_scalar(t, sums, off, n, m, half, step, f, e, shared, blk, sub, out, work);
}
void ThcEncodeBlockImpl(const float* x, const float* add, float* staged, uint64_t elems, uint64_t n, int e,
                        const rng::Stream& shared, uint64_t blk, float enc, const kern::ThcTables& tb,
                        const rng::Stream& own, float* work, uint8_t* idx, uint8_t* packed4, int32_t* val,
                        const float*, const float*) {
  kern::thc_encode_block_scalar(x, add, staged, elems, n, e, shared, blk, enc, tb, own, work, idx, packed4, val);
}
#else
constexpr uint64_t kTile = uint64_t{1} << 13;

// One radix-2 stage of stride h over x[0..n), vectors of tag d (h a multiple of Lanes(d)).
template <class D>
HWY_INLINE void Stage(D d, float* HWY_RESTRICT x, uint64_t n, uint64_t h) {
  const size_t L = hn::Lanes(d);
  for (uint64_t i = 0; i < n; i += 2 * h) {
    for (uint64_t j = i; j < i + h; j += L) {
      const auto a = hn::LoadU(d, x + j);
      const auto b = hn::LoadU(d, x + j + h);
      hn::StoreU(hn::Add(a, b), d, x + j);
      hn::StoreU(hn::Sub(a, b), d, x + j + h);
    }
  }
}

// Two fused stages (h and 2h) over x[0..n): each element is read and written once.
template <class D>
HWY_INLINE void Stage4(D d, float* HWY_RESTRICT x, uint64_t n, uint64_t h) {
  const size_t L = hn::Lanes(d);
  for (uint64_t i = 0; i < n; i += 4 * h) {
    for (uint64_t j = i; j < i + h; j += L) {
      const auto a = hn::LoadU(d, x + j);
      const auto b = hn::LoadU(d, x + j + h);
      const auto c = hn::LoadU(d, x + j + 2 * h);
      const auto e = hn::LoadU(d, x + j + 3 * h);
      const auto s0 = hn::Add(a, b), d0 = hn::Sub(a, b);
      const auto s1 = hn::Add(c, e), d1 = hn::Sub(c, e);
      hn::StoreU(hn::Add(s0, s1), d, x + j);
      hn::StoreU(hn::Add(d0, d1), d, x + j + h);
      hn::StoreU(hn::Sub(s0, s1), d, x + j + 2 * h);
      hn::StoreU(hn::Sub(d0, d1), d, x + j + 3 * h);
    }
  }
}

// Stages h = 1 and 2 inside each group of 4 lanes.
HWY_INLINE void SmallStages(float* HWY_RESTRICT x, uint64_t n) {
  const hn::Full128<float> d4;
  alignas(16) static constexpr float kSign1[4] = {1.f, -1.f, 1.f, -1.f};
  alignas(16) static constexpr float kSign2[4] = {1.f, 1.f, -1.f, -1.f};
  const auto sign1 = hn::Load(d4, kSign1);
  const auto sign2 = hn::Load(d4, kSign2);
  for (uint64_t i = 0; i < n; i += 4) {
    auto v = hn::LoadU(d4, x + i);
    // [a,b,c,d] * [1,-1,1,-1] + [b,a,d,c] = [a+b, a-b, c+d, c-d]
    v = hn::MulAdd(v, sign1, hn::Shuffle2301(v));
    v = hn::MulAdd(v, sign2, hn::Shuffle1032(v));
    hn::StoreU(v, d4, x + i);
  }
}

void TileStages(float* HWY_RESTRICT x, uint64_t n) {
  const hn::ScalableTag<float> d;
  const hn::Full128<float> d4;
  const uint64_t L = hn::Lanes(d);
  SmallStages(x, n);
  for (uint64_t h = 4; h < n; h *= 2) {
    if (h < L) {
      Stage(d4, x, n, h);
    } else {
      Stage(d, x, n, h);
    }
  }
}

void FwhtGeneric(float* HWY_RESTRICT x, uint64_t n) {
  if (n < 4) {
    fwht_scalar(x, n);
    return;
  }
  const hn::ScalableTag<float> d;
  const uint64_t tile = n < kTile ? n : kTile;
  for (uint64_t t = 0; t < n; t += tile) TileStages(x + t, tile);
  uint64_t h = tile;
  for (; 4 * h <= n; h *= 4) Stage4(d, x, n, h);
  if (h < n) Stage(d, x, n, h);
}

#if HWY_TARGET <= HWY_AVX3 || HWY_TARGET == HWY_AVX2
// ---------------------------------------------------------------------------------------------
// FWHT in register passes (see the top of the file): the vector type (this target's full
// vector, raw) and its few operations; RegOps below adds what differs between the widths.
struct RegArith {
  using D = hn::ScalableTag<float>;
  using V = decltype(hn::Zero(D()).raw);
  static HWY_INLINE hn::Vec<D> W(V v) { return hn::Vec<D>{v}; }
  static HWY_INLINE V Load(const float* p) { return hn::LoadU(D(), p).raw; }
  static HWY_INLINE void Store(float* p, V v) { hn::StoreU(W(v), D(), p); }
  static HWY_INLINE V One() { return hn::Set(D(), 1.0f).raw; }
  static HWY_INLINE V Add(V a, V b) { return hn::Add(W(a), W(b)).raw; }
  // a - b as -(b * 1) + a: one rounding, like a - b, on the multiply-add units (CrossStages).
  static HWY_INLINE V SubByFma(V a, V b, V one) { return hn::NegMulAdd(W(b), W(one), W(a)).raw; }
  static HWY_INLINE V Zero() { return hn::Zero(D()).raw; }
  static HWY_INLINE V Set1(float f) { return hn::Set(D(), f).raw; }
  static HWY_INLINE V Mul(V a, V b) { return hn::Mul(W(a), W(b)).raw; }
  static HWY_INLINE V Sub(V a, V b) { return hn::Sub(W(a), W(b)).raw; }
  // Keeps a product from being contracted with a following add into an FMA (see codec_simd.cc).
  static HWY_INLINE V Rounded(V v) {
    if constexpr (sizeof(V) == 64) {
      asm("" : "+v"(v));
    } else {
      asm("" : "+x"(v));
    }
    return v;
  }
};
#endif

#if HWY_TARGET <= HWY_AVX3
#define THC_FWHT_AVX512 1
#define THC_FWHT_REG 1
// AVX-512: 16 floats per zmm, stages h = 1, 2, 4, 8 inside a register, radix up to 16 (32 zmm).
//
// Stages inside one register: v * (+-1) + (v with lanes j, j ^ h swapped) gives x[j] + x[j+h]
// in the low lane of each pair and x[j-h] - x[j] in the high one; the product by +-1 is exact,
// so the multiply-add rounds once, exactly like the scalar a + b and a - b.
struct RegOps : RegArith {
  static constexpr uint64_t kLanes = 16;
  static constexpr int kMaxRadix = 4;
  struct Signs {
    __m512 s1, s2, s4, s8;
  };
  static HWY_INLINE Signs MakeSigns() {
    alignas(64) float a[4][16];
    for (int j = 0; j < 16; ++j) {
      a[0][j] = (j & 1) ? -1.f : 1.f;
      a[1][j] = (j & 2) ? -1.f : 1.f;
      a[2][j] = (j & 4) ? -1.f : 1.f;
      a[3][j] = (j & 8) ? -1.f : 1.f;
    }
    return {_mm512_load_ps(a[0]), _mm512_load_ps(a[1]), _mm512_load_ps(a[2]), _mm512_load_ps(a[3])};
  }
  static HWY_INLINE V InReg(V v, const Signs& c) {
    v = _mm512_fmadd_ps(v, c.s1, _mm512_permute_ps(v, 0xB1));             // h = 1: lanes [1,0,3,2]
    v = _mm512_fmadd_ps(v, c.s2, _mm512_permute_ps(v, 0x4E));             // h = 2: lanes [2,3,0,1]
    v = _mm512_fmadd_ps(v, c.s4, _mm512_shuffle_f32x4(v, v, 0xB1));       // h = 4: blocks [1,0,3,2]
    return _mm512_fmadd_ps(v, c.s8, _mm512_shuffle_f32x4(v, v, 0x4E));    // h = 8: blocks [2,3,0,1]
  }
  static HWY_INLINE __mmask16 FirstLanes(uint64_t k) {
    return k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << k) - 1u);
  }
  // The first k lanes (k <= kLanes) at p, zeros above; stores of the first k lanes.
  static HWY_INLINE V LoadN(const float* p, uint64_t k) { return _mm512_maskz_loadu_ps(FirstLanes(k), p); }
  static HWY_INLINE void StoreN(float* p, uint64_t k, V v) { _mm512_mask_storeu_ps(p, FirstLanes(k), v); }
  // The RHT's sign flips from a SignBitmap: element i's sign flips where bit i is set.
  struct Flipper {
    const uint16_t* masks;
    __m512 sign;
    explicit Flipper(const uint32_t* bitmap)
        : masks(reinterpret_cast<const uint16_t*>(bitmap)), sign(_mm512_set1_ps(-0.0f)) {}
    HWY_INLINE V operator()(uint64_t i, V v) const {
      return _mm512_mask_xor_ps(v, _load_mask16(const_cast<__mmask16*>(masks + (i >> 4))), v, sign);
    }
  };
};
#elif HWY_TARGET == HWY_AVX2
#define THC_FWHT_AVX512 0
#define THC_FWHT_REG 1
// AVX2: 8 floats per ymm, stages h = 1, 2, 4 inside a register, radix up to 8 (16 ymm: a radix-16
// pass would spill). The same butterflies, so the same bits, as every other target.
struct RegOps : RegArith {
  static constexpr uint64_t kLanes = 8;
  static constexpr int kMaxRadix = 3;
  struct Signs {
    __m256 s1, s2, s4;
  };
  static HWY_INLINE Signs MakeSigns() {
    alignas(32) float a[3][8];
    for (int j = 0; j < 8; ++j) {
      a[0][j] = (j & 1) ? -1.f : 1.f;
      a[1][j] = (j & 2) ? -1.f : 1.f;
      a[2][j] = (j & 4) ? -1.f : 1.f;
    }
    return {_mm256_load_ps(a[0]), _mm256_load_ps(a[1]), _mm256_load_ps(a[2])};
  }
  static HWY_INLINE V InReg(V v, const Signs& c) {
    v = _mm256_fmadd_ps(v, c.s1, _mm256_permute_ps(v, 0xB1));            // h = 1: lanes [1,0,3,2]
    v = _mm256_fmadd_ps(v, c.s2, _mm256_permute_ps(v, 0x4E));            // h = 2: lanes [2,3,0,1]
    return _mm256_fmadd_ps(v, c.s4, _mm256_permute2f128_ps(v, v, 0x01));  // h = 4: halves swapped
  }
  static HWY_INLINE __m256i FirstLanes(uint64_t k) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k < 8 ? k : 8)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  // Masked lanes are neither read nor written (no fault past an array's end).
  static HWY_INLINE V LoadN(const float* p, uint64_t k) { return _mm256_maskload_ps(p, FirstLanes(k)); }
  static HWY_INLINE void StoreN(float* p, uint64_t k, V v) { _mm256_maskstore_ps(p, FirstLanes(k), v); }
  // Bit j of the bitmap's byte for lanes i..i+7 shifted to bit 31 of lane j, then the XOR.
  struct Flipper {
    const uint8_t* bytes;
    __m256 sign;
    __m256i shifts;
    explicit Flipper(const uint32_t* bitmap)
        : bytes(reinterpret_cast<const uint8_t*>(bitmap)),
          sign(_mm256_set1_ps(-0.0f)),
          shifts(_mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24)) {}
    HWY_INLINE V operator()(uint64_t i, V v) const {
      const __m256i bits = _mm256_sllv_epi32(_mm256_set1_epi32(bytes[i >> 3]), shifts);
      return _mm256_xor_ps(v, _mm256_and_ps(_mm256_castsi256_ps(bits), sign));
    }
  };
};
#else
#define THC_FWHT_AVX512 0
#define THC_FWHT_REG 0
#endif

#if THC_FWHT_REG
using RegV = RegOps::V;
// Floats of a chunk pass: 8 registers.
constexpr uint64_t kChunk = 8 * RegOps::kLanes;

// R stages across 2^R registers: stage s pairs register m with m + 2^s. The difference goes
// to the multiply-add units as -(b * 1) + a (the product is exact, so it rounds once, like
// a - b): on Zen 4 that took the THC encode's cached-block row 5.0-5.4 -> 5.5-5.7 GB/s and
// ThcDecodeHot 9.3 -> 9.6-9.8 GB/s; sums on those units too were slower (5.0-5.3 / 8.6).
template <int R>
HWY_INLINE void CrossStages(RegV (&v)[1 << R]) {
  const RegV one = RegOps::One();
  HWY_UNROLL(4)
  for (int s = 0; s < R; ++s) {
    HWY_UNROLL(16)
    for (int m = 0; m < (1 << R); ++m) {
      if (m & (1 << s)) continue;
      const RegV a = v[m], b = v[m + (1 << s)];
      v[m] = RegOps::Add(a, b);
      v[m + (1 << s)] = RegOps::SubByFma(a, b, one);
    }
  }
}

// First pass: stages h = 1 .. kChunk / 2 on each chunk of kChunk floats (8 registers); load(i)
// returns the register of input floats at element i (the pass may read its input from
// elsewhere and transform it on the way in).
template <class Load>
HWY_INLINE void ChunkPass(float* HWY_RESTRICT x, uint64_t n, const Load& load) {
  const RegOps::Signs c = RegOps::MakeSigns();
  for (uint64_t i = 0; i < n; i += kChunk) {
    RegV v[8];
    HWY_UNROLL(8)
    for (int k = 0; k < 8; ++k) v[k] = RegOps::InReg(load(i + RegOps::kLanes * k), c);
    CrossStages<3>(v);
    HWY_UNROLL(8)
    for (int k = 0; k < 8; ++k) RegOps::Store(x + i + RegOps::kLanes * k, v[k]);
  }
}

// A pass of R stages h0 .. 2^(R-1) h0; store(i, v) receives the final register at element i.
template <int R, class Store>
HWY_INLINE void RadixPass(float* HWY_RESTRICT x, uint64_t n, uint64_t h0, const Store& store) {
  const uint64_t span = h0 << R;
  for (uint64_t b = 0; b < n; b += span) {
    for (uint64_t j = b; j < b + h0; j += RegOps::kLanes) {
      RegV v[1 << R];
      HWY_UNROLL(16)
      for (int m = 0; m < (1 << R); ++m) v[m] = RegOps::Load(x + j + m * h0);
      CrossStages<R>(v);
      HWY_UNROLL(16)
      for (int m = 0; m < (1 << R); ++m) store(j + m * h0, v[m]);
    }
  }
}

template <class Store>
HWY_INLINE void RadixPassR(int r, float* HWY_RESTRICT x, uint64_t n, uint64_t h0, const Store& store) {
  switch (r) {
    case 1: return RadixPass<1>(x, n, h0, store);
    case 2: return RadixPass<2>(x, n, h0, store);
    case 3: return RadixPass<3>(x, n, h0, store);
    default:
      if constexpr (RegOps::kMaxRadix >= 4) return RadixPass<4>(x, n, h0, store);
  }
}

// A pass's results stored back where they were read.
struct InPlace {
  float* x;
  HWY_INLINE void operator()(uint64_t i, RegV v) const { RegOps::Store(x + i, v); }
};

// Stages h = h0 .. top / 2 over x[0..n) (top a power of two, at most n), in passes of at most
// kMaxRadix stages, sized as evenly as possible; the last pass hands its results to last_store,
// the others store in place. top = n: every stage after a first pass of span h0.
template <class Store>
HWY_INLINE void StagePasses(float* HWY_RESTRICT x, uint64_t n, uint64_t h0, uint64_t top, const Store& last_store) {
  int rest = 0;
  while ((h0 << rest) < top) ++rest;
  const int passes = (rest + RegOps::kMaxRadix - 1) / RegOps::kMaxRadix;
  uint64_t h = h0;
  const InPlace in_place{x};
  for (int p = 0; p < passes; ++p) {
    const int r = (rest + (passes - p) - 1) / (passes - p);  // ceil(rest / passes left)
    if (p + 1 < passes) {
      RadixPassR(r, x, n, h, in_place);
    } else {
      RadixPassR(r, x, n, h, last_store);
    }
    rest -= r;
    h <<= r;
  }
}

// Floats of the tiles of FirstPass: 8 KiB, a quarter of the L1 data cache of the machines measured.
constexpr uint64_t kL1Tile = 2048;

// Span of FirstPass (a power of two, kChunk .. kL1Tile): its stages h = 1 .. span / 2 stay
// within tiles of that many floats; limit (>= kChunk): the most the caller lets it take.
HWY_INLINE uint64_t FirstSpan(uint64_t limit) { return limit < kL1Tile ? limit : kL1Tile; }

// Stages h = 1 .. span / 2 (span = FirstSpan(limit)), tile by tile: on each tile of span floats
// the chunk pass, then the tile's remaining stages (one radix-16 pass on AVX-512, two on AVX2)
// while it is still in L1. A block larger than L1 (2^14 floats: 64 KiB) then goes through L1
// once for these stages instead of once per pass. Returns span.
template <class Load>
HWY_INLINE uint64_t FirstPass(float* HWY_RESTRICT x, uint64_t n, uint64_t limit, const Load& load) {
  const uint64_t span = FirstSpan(limit);
  for (uint64_t t = 0; t < n; t += span) {
    float* const xt = x + t;
    ChunkPass(xt, span, [&](uint64_t i) __attribute__((always_inline)) { return load(t + i); });
    if (span > kChunk) StagePasses(xt, span, kChunk, span, InPlace{xt});
  }
  return span;
}
#endif

#if THC_FWHT_REG
// Sign bitmap of a block's RHT diagonal: bit i & 31 of word i >> 5 set where element i flips
// (the order of apply_signs); SignWords draws the words of 128 Lanes elements at once (2048 on
// AVX-512, 1024 on AVX2), so room for max(n, that) / 32 words.
HWY_INLINE const uint32_t* SignBitmap(const rng::Stream& shared, uint64_t blk, uint64_t n) {
  static thread_local std::vector<uint32_t> words;
  const hn::ScalableTag<uint32_t> du;
  const uint64_t span = 128 * hn::Lanes(du);
  const uint64_t need = (n < span ? span : n) / 32;
  if (words.size() < need) words.resize(need);
  const PhiloxFamily fam = MakeFamily(shared, rng::kPurposeSigns, blk);
  for (uint64_t base = 0; base < n; base += span) SignWords(du, fam, base, words.data() + base / 32);
  return words.data();
}

// Loads of the first pass are lambdas called 8 times per chunk; they must not become calls.
#define THC_RHT_LAMBDA_INLINE __attribute__((always_inline))
#endif

void FwhtImpl(float* HWY_RESTRICT x, uint64_t n) {
#if THC_FWHT_REG
  if (n >= kChunk) {
    const uint64_t span = FirstPass(x, n, n, [x](uint64_t i) { return RegOps::Load(x + i); });
    StagePasses(x, n, span, n, InPlace{x});
    return;
  }
#endif
  FwhtGeneric(x, n);
}

#if THC_FWHT_REG
// The first pass of the forward RHT (n >= kChunk): work = stages h = 1 .. span / 2 of D scale2(x, e),
// zero-padded from elems to n; returns span (FirstPass).
// The first pass's input: x, or with add the sum x + add, which is also stored to staged (error
// feedback's x = grad + e, computed as kern::add_pair does, bit for bit, so that the engine need
// not stage it in a pass of its own). Whole(i): a register of a whole block (the streams are
// prefetched 4096 floats ahead); Part(i, elems): a register of a partial one, zero past elems.
template <bool kAdd>
struct FirstInput {
  const float* x;
  const float* add;
  float* staged;
  HWY_INLINE RegV Whole(uint64_t i) const {
    hwy::Prefetch(x + i + 4096);
    if constexpr (!kAdd) {
      return RegOps::Load(x + i);
    } else {
      hwy::Prefetch(add + i + 4096);
      const RegV s = RegOps::Add(RegOps::Load(x + i), RegOps::Load(add + i));
      RegOps::Store(staged + i, s);
      return s;
    }
  }
  HWY_INLINE RegV Part(uint64_t i, uint64_t elems) const {
    if (i >= elems) return RegOps::Zero();
    const uint64_t k = elems - i;  // lanes to read (all of them from kLanes on)
    if constexpr (!kAdd) {
      return RegOps::LoadN(x + i, k);
    } else {
      const RegV s = RegOps::Add(RegOps::LoadN(x + i, k), RegOps::LoadN(add + i, k));
      RegOps::StoreN(staged + i, k, s);
      return s;
    }
  }
};

template <bool kAdd>
HWY_INLINE uint64_t ForwardFirstPass(const FirstInput<kAdd>& in, uint64_t elems, uint64_t n, uint64_t limit, int e,
                                     const rng::Stream& shared, uint64_t blk, float* HWY_RESTRICT work) {
  const RegOps::Flipper flip(SignBitmap(shared, blk, n));
  const int h = e / 2;
  const RegV p1 = RegOps::Set1(elem::pow2f(h)), p2 = RegOps::Set1(elem::pow2f(e - h));
  if (elems == n && e >= -1 && e <= 126) {
    // A whole block scaled by 2^e with e in [-1, 126]: one product, the same as scale2's two.
    // Up (e >= 0) both are exact or overflow alike; e = -1 is a single product in scale2 too.
    const RegV p = RegOps::Set1(elem::pow2f(e));
    return FirstPass(work, n, limit,
                     [&](uint64_t i) THC_RHT_LAMBDA_INLINE { return flip(i, RegOps::Mul(in.Whole(i), p)); });
  } else if (elems == n) {
    return FirstPass(work, n, limit, [&](uint64_t i) THC_RHT_LAMBDA_INLINE {
      return flip(i, RegOps::Mul(RegOps::Mul(in.Whole(i), p1), p2));
    });
  } else {
    return FirstPass(work, n, limit, [&](uint64_t i) THC_RHT_LAMBDA_INLINE {
      return flip(i, RegOps::Mul(RegOps::Mul(in.Part(i, elems), p1), p2));  // scale2, then the sign flip (exact)
    });
  }
}

// The passes between a first pass of span h0 (FirstPass with limit n / 8) and a last pass of
// three stages (n >= 1024): stages h = h0 .. n / 16, in place.
HWY_INLINE void MiddlePasses(float* HWY_RESTRICT work, uint64_t n, uint64_t h0) {
  StagePasses(work, n, h0, n / 8, InPlace{work});
}
#endif

// work = H D scale2(x, e) (zero-padded from elems to n): prescale_signs + fwht.
void RotateForwardImpl(const float* HWY_RESTRICT x, uint64_t elems, uint64_t n, int e, const rng::Stream& shared,
                       uint64_t blk, float* HWY_RESTRICT work) {
#if THC_FWHT_REG
  if (n >= kChunk) {
    const uint64_t span = ForwardFirstPass(FirstInput<false>{x, nullptr, nullptr}, elems, n, n, e, shared, blk, work);
    StagePasses(work, n, span, n, InPlace{work});
    return;
  }
#endif
  kern::prescale_signs(x, elems, n, e, shared, blk, work);
  FwhtImpl(work, n);
}

#if THC_FWHT_REG && !THC_FWHT_AVX512
// The Philox words of four counter lanes (x0..x3: word w in the low dword of each 64-bit lane)
// -> for each lane q, the 16-bit draws of its group's 8 elements in element order (u16 k of
// words 0..3 read as little-endian, philox.h), zero-extended into the u32 lanes of out[q].
HWY_INLINE void RowDraws(__m256i x0, __m256i x1, __m256i x2, __m256i x3, __m256i* out) {
  const __m256i a = _mm256_blend_epi32(x0, _mm256_slli_epi64(x1, 32), 0xAA);  // (w0, w1) per lane
  const __m256i b = _mm256_blend_epi32(x2, _mm256_slli_epi64(x3, 32), 0xAA);  // (w2, w3)
  const __m256i even = _mm256_unpacklo_epi64(a, b);  // lanes 0 | 2
  const __m256i odd = _mm256_unpackhi_epi64(a, b);   // lanes 1 | 3
  out[0] = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(even));
  out[1] = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(odd));
  out[2] = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(even, 1));
  out[3] = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(odd, 1));
}

// 8 codes below 16 (u32 lanes, nothing above the code) -> 4 bytes, element 2i in the low nibble
// of byte i (elem.h's bit order for b = 4).
HWY_INLINE void StorePacked4x8(__m256i code, uint8_t* HWY_RESTRICT p) {
  const __m256i both = _mm256_or_si256(code, _mm256_srli_epi64(code, 28));  // byte 0 of each u64 lane
  const __m256i pick = _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i two = _mm256_shuffle_epi8(both, pick);  // bytes 0, 1 of each 128-bit lane
  const __m128i four = _mm_unpacklo_epi16(_mm256_castsi256_si128(two), _mm256_extracti128_si256(two, 1));
  const uint32_t w = static_cast<uint32_t>(_mm_cvtsi128_si32(four));
  std::memcpy(p, &w, 4);
}
#endif

// THC encode of one block: rotate_forward, then thc_quantize, and for packed4 the codes packed
// as 4-bit (idx then only scratch). On AVX-512 with the cell table in registers the rounding
// runs inside the RHT's last pass (three stages, rows h0 = n / 8 apart): each step's 8 vectors
// of 16 rotated values are rounded as they leave the butterflies, with the draws of their 16
// groups from one pair of Philox counter vectors (counter lane q of vector c: row 4c + q / 2,
// group q % 2 of its two), instead of a store and a second pass that reads them back. On AVX2
// the same with 8 vectors of 8 (one group per row) and the cell table gathered (ThcWordRound).
void ThcEncodeBlockImpl(const float* HWY_RESTRICT x, const float* HWY_RESTRICT add, float* HWY_RESTRICT staged,
                        uint64_t elems, uint64_t n, int e, const rng::Stream& shared, uint64_t blk, float enc,
                        const kern::ThcTables& tb, const rng::Stream& own, float* HWY_RESTRICT work,
                        uint8_t* HWY_RESTRICT idx, uint8_t* HWY_RESTRICT packed4, int32_t* HWY_RESTRICT val,
                        const float* prefetch, const float* prefetch_add) {
#if THC_FWHT_AVX512
  if (n >= 1024 && ThcRegRound::Usable(tb)) {
    const uint64_t h1 = add ? ForwardFirstPass(FirstInput<true>{x, add, staged}, elems, n, n / 8, e, shared, blk, work)
                            : ForwardFirstPass(FirstInput<false>{x, nullptr, nullptr}, elems, n, n / 8, e, shared, blk,
                                               work);
    MiddlePasses(work, n, h1);
    const ThcRegRound rr(tb, enc);
    const uint64_t h0 = n / 8;
    const PhiloxFamily fam = MakeFamily(own, rng::kPurposeRound, blk);
    const hn::ScalableTag<uint32_t> d32;
    const hn::Repartition<uint64_t, decltype(d32)> d64;
    using V = hn::Vec<decltype(d64)>;
    // c0 of counter lane q: (row 4c + q / 2) h0 / 8 + q % 2, plus the step's j / 8; times M0.
    const V io = hn::Iota(d64, 0);
    const V base = hn::Add(hn::Mul(hn::ShiftRight<1>(io), hn::Set(d64, h0 / 8)), hn::And(io, hn::Set(d64, 1)));
    const V m0 = hn::Set(d64, kPhiloxM0);
    const V patm0 = MulLo32(d64, base, m0);
    const V patm1 = MulLo32(d64, hn::Add(base, hn::Set(d64, 4 * (h0 / 8))), m0);
    for (uint64_t j = 0; j < h0; j += 16) {
      if (prefetch) PrefetchAhead(prefetch + 8 * j, 128);
      if (prefetch_add) PrefetchAhead(prefetch_add + 8 * j, 128);
      __m512 v[8];
      HWY_UNROLL(8)
      for (int r = 0; r < 8; ++r) v[r] = _mm512_loadu_ps(work + j + r * h0);
      CrossStages<3>(v);
      const V gm = hn::Set(d64, (j / 8) * uint64_t{kPhiloxM0});
      V x0, x1, x2, x3, y0, y1, y2, y3;
      Philox10Q2(d64, fam, hn::Add(patm0, gm), hn::Add(patm1, gm), &x0, &x1, &x2, &x3, &y0, &y1, &y2, &y3);
      auto round = [&](size_t r, hn::Vec<decltype(d32)> draws) THC_RHT_LAMBDA_INLINE {
        const uint64_t i = j + r * h0;
        __m512i k;
        __mmask16 up;
        rr.Round(v[r], draws.raw, &k, &up);
        if (val) _mm512_storeu_si512(val + i, rr.Value(k, up));
        if (packed4) {
          StorePacked4(rr.Code(k, up), packed4 + i / 2);
        } else if (idx) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(idx + i), _mm512_cvtepi32_epi8(rr.Code(k, up)));
        }
      };
      PhiloxEmitZmm<decltype(d32), false>(round, 0, x0, x1, x2, x3);
      PhiloxEmitZmm<decltype(d32), false>(round, 4, y0, y1, y2, y3);
    }
    return;
  }
#endif
#if THC_FWHT_REG && !THC_FWHT_AVX512
  if (n >= 1024 && ThcWordTables::Usable(tb)) {
    // AVX2: the same fusion, with ThcWordRound's two gathers per vector. A step is 8 rows of 8
    // elements, one group of each row: counter lane q of vector c is row 4c + q.
    const uint64_t h1 = add ? ForwardFirstPass(FirstInput<true>{x, add, staged}, elems, n, n / 8, e, shared, blk, work)
                            : ForwardFirstPass(FirstInput<false>{x, nullptr, nullptr}, elems, n, n / 8, e, shared, blk,
                                               work);
    MiddlePasses(work, n, h1);
    const ThcWordTables tab(tb);
    const ThcWordRound<RegArith::D> wr(tab, tb, enc);
    const uint64_t h0 = n / 8;
    const PhiloxFamily fam = MakeFamily(own, rng::kPurposeRound, blk);
    const hn::ScalableTag<uint32_t> d32;
    const hn::Repartition<uint64_t, decltype(d32)> d64;
    using V = hn::Vec<decltype(d64)>;
    const V m0 = hn::Set(d64, kPhiloxM0);
    const V rows = MulLo32(d64, hn::Iota(d64, 0), hn::Set(d64, h0 / 8));  // group of row q at j = 0
    const V patm0 = MulLo32(d64, rows, m0);
    const V patm1 = MulLo32(d64, hn::Add(rows, hn::Set(d64, 4 * (h0 / 8))), m0);
    const hn::Rebind<uint8_t, decltype(d32)> d8;
    const hn::RebindToSigned<RegArith::D> di;
    // kPacked: packed4 the only output (the engine's form), without a test per row for the others.
    auto steps = [&](auto packed_only) THC_RHT_LAMBDA_INLINE {
      constexpr bool kPacked = decltype(packed_only)::value;
      for (uint64_t j = 0; j < h0; j += 8) {
        if (prefetch) PrefetchAhead(prefetch + 8 * j, 64);
        if (prefetch_add) PrefetchAhead(prefetch_add + 8 * j, 64);
        RegV v[8];
        HWY_UNROLL(8)
        for (int r = 0; r < 8; ++r) v[r] = RegOps::Load(work + j + r * h0);
        CrossStages<3>(v);
        const V gm = hn::Set(d64, (j / 8) * uint64_t{kPhiloxM0});
        V x0, x1, x2, x3, y0, y1, y2, y3;
        Philox10Q2(d64, fam, hn::Add(patm0, gm), hn::Add(patm1, gm), &x0, &x1, &x2, &x3, &y0, &y1, &y2, &y3);
        __m256i draws[8];
        RowDraws(x0.raw, x1.raw, x2.raw, x3.raw, draws);
        RowDraws(y0.raw, y1.raw, y2.raw, y3.raw, draws + 4);
        HWY_UNROLL(8)
        for (int r = 0; r < 8; ++r) {
          const uint64_t i = j + r * h0;
          const hn::Vec<decltype(d32)> dr{draws[r]};
          if constexpr (kPacked) {
            StorePacked4x8(wr.Round(RegArith::W(v[r]), dr, nullptr).raw, packed4 + i / 2);
          } else {
            hn::Vec<decltype(di)> value;
            const auto code = wr.Round(RegArith::W(v[r]), dr, val ? &value : nullptr);
            if (val) hn::StoreU(value, di, val + i);
            if (packed4) {
              StorePacked4x8(code.raw, packed4 + i / 2);
            } else if (idx) {
              hn::StoreU(hn::DemoteTo(d8, code), d8, idx + i);
            }
          }
        }
      }
    };
    if (packed4 && !val) {
      steps(std::true_type{});
    } else {
      steps(std::false_type{});
    }
    return;
  }
#endif
#if THC_FWHT_REG
  if (n >= kChunk) {  // the rotation in register passes, g + e summed in its first pass
    const uint64_t span = add ? ForwardFirstPass(FirstInput<true>{x, add, staged}, elems, n, n, e, shared, blk, work)
                              : ForwardFirstPass(FirstInput<false>{x, nullptr, nullptr}, elems, n, n, e, shared, blk,
                                                 work);
    StagePasses(work, n, span, n, InPlace{work});
  } else
#endif
  {
    if (add) {  // staged first (no fused first pass on this target)
      kern::add_pair(x, add, elems, staged);
      x = staged;
    }
    RotateForwardImpl(x, elems, n, e, shared, blk, work);
  }
  kern::thc_quantize(work, n, enc, tb, own, blk, idx, val, prefetch);
  if (packed4) kern::pack_bits_simd(idx, n, 4, packed4);
}

// The final stores of the inverse RHT: out[i] = scale2(D v, e) for i < m, or sub[i] - that.
#if THC_FWHT_REG
struct InverseStore {
  RegOps::Flipper flip;
  RegV p1, p2;
  uint64_t m;
  const float* sub;
  float* out;
  // D v scaled by 2^e: the sign flip (exact), then scale2's two products.
  HWY_INLINE RegV Final(uint64_t i, RegV v) const {
    return RegOps::Rounded(RegOps::Mul(RegOps::Mul(flip(i, v), p1), p2));
  }
  HWY_INLINE void operator()(uint64_t i, RegV v) const {
    if (i >= m) return;
    v = Final(i, v);
    if (i + RegOps::kLanes <= m) {
      if (sub) v = RegOps::Sub(RegOps::Load(sub + i), v);
      RegOps::Store(out + i, v);
    } else {
      if (sub) v = RegOps::Sub(RegOps::LoadN(sub + i, m - i), v);
      RegOps::StoreN(out + i, m - i, v);
    }
  }
};

HWY_INLINE InverseStore MakeInverseStore(const rng::Stream& shared, uint64_t blk, uint64_t n, uint64_t m, int e,
                                         const float* sub, float* out) {
  const int h = e / 2;
  return InverseStore{RegOps::Flipper(SignBitmap(shared, blk, n)), RegOps::Set1(elem::pow2f(h)),
                      RegOps::Set1(elem::pow2f(e - h)), m, sub, out};
}
#endif

#if THC_FWHT_AVX512

// The last three stages (h0 = n / 8 .. n / 2) of a whole block whose result goes to out with
// non-temporal stores of whole 64-byte lines, whatever out's alignment: each of the 8 rows of
// the pass writes h0 consecutive floats, 16 per step, and the line that a step completes is
// joined from the previous step's vector and this one's (one two-source permute); the partial
// lines at the two ends of a row take masked ordinary stores (their other floats belong to the
// neighbouring rows).
HWY_INLINE void StreamLastPass(float* HWY_RESTRICT x, uint64_t n, const InverseStore& st) {
  const uint64_t h0 = n / 8;
  float* const out = st.out;
  const uint64_t d = (reinterpret_cast<uintptr_t>(out) / sizeof(float)) % 16;  // floats past a line start
  if (d == 0) {
    for (uint64_t j = 0; j < h0; j += 16) {
      __m512 v[8];
      HWY_UNROLL(8)
      for (int r = 0; r < 8; ++r) v[r] = _mm512_loadu_ps(x + j + r * h0);
      CrossStages<3>(v);
      HWY_UNROLL(8)
      for (int r = 0; r < 8; ++r) _mm512_stream_ps(out + j + r * h0, st.Final(j + r * h0, v[r]));
    }
    return;
  }
  // Line lanes 0..d-1 are the previous vector's lanes 16-d..15, lanes d..15 this one's 0..15-d.
  // The line where row r - 1 ends and row r starts joins row r - 1's last vector with row r's
  // first, kept until then; only the block's first and last lines are partial (ordinary masked
  // stores: few, as each waits for its line from memory).
  const __m512i join = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                        _mm512_set1_epi32(static_cast<int>(16 - d)));
  const __mmask16 head = static_cast<__mmask16>((1u << (16 - d)) - 1u);  // lanes of the first partial line
  __m512 prev[8], first[8];
  for (uint64_t j = 0; j < h0; j += 16) {
    __m512 v[8];
    HWY_UNROLL(8)
    for (int r = 0; r < 8; ++r) v[r] = _mm512_loadu_ps(x + j + r * h0);
    CrossStages<3>(v);
    HWY_UNROLL(8)
    for (int r = 0; r < 8; ++r) {
      const uint64_t i = j + r * h0;
      const __m512 w = st.Final(i, v[r]);
      if (j == 0) {
        first[r] = w;
      } else {
        _mm512_stream_ps(out + i - d, _mm512_permutex2var_ps(prev[r], join, w));
      }
      prev[r] = w;
    }
  }
  _mm512_mask_storeu_ps(out, head, first[0]);
  HWY_UNROLL(7)
  for (int r = 1; r < 8; ++r) _mm512_stream_ps(out + r * h0 - d, _mm512_permutex2var_ps(prev[r - 1], join, first[r]));
  _mm512_mask_storeu_ps(out + n - 16, static_cast<__mmask16>(~head), prev[7]);
}
#endif

// out[i] = scale2(D (H work)[i], e) for i < m, or sub[i] - that: fwht + signs_postscale.
void RotateInverseImpl(float* HWY_RESTRICT work, uint64_t n, uint64_t m, int e, const rng::Stream& shared,
                       uint64_t blk, const float* HWY_RESTRICT sub, float* HWY_RESTRICT out) {
#if THC_FWHT_REG
  if (n >= 2 * kChunk) {
    // limit n / 2: at least one later pass, which writes out.
    const uint64_t span = FirstPass(work, n, n / 2, [work](uint64_t i) { return RegOps::Load(work + i); });
    StagePasses(work, n, span, n, MakeInverseStore(shared, blk, n, m, e, sub, out));
    return;
  }
#endif
  FwhtImpl(work, n);
  kern::signs_postscale(work, m, e, shared, blk, sub, out);
}

#if THC_FWHT_REG
// The decode's first pass prefetches the sums this many bytes ahead (into the next block's at the
// end of one): the hardware prefetchers alone left the 64 MB THC decode about 6 % slower on the
// AVX-512 VM (2^14 blocks of u8 sums; 1024 bytes ahead gained less).
constexpr uint64_t kSumsPrefetchBytes = 4096;

template <typename T>
void ThcDecodeBlockT(const T* HWY_RESTRICT s, uint64_t n, uint64_t m, float half, float step, float f, int e,
                     const rng::Stream& shared, uint64_t blk, const float* HWY_RESTRICT sub, float* HWY_RESTRICT out,
                     float* HWY_RESTRICT work, bool stream) {
  const RegV vh = RegOps::Set1(half), vs = RegOps::Set1(step), vf = RegOps::Set1(f);
  // thc_dequant in the first pass's loads: (float(s) - half) * step * f, no product followed by
  // an add, so nothing for the compiler to contract.
  // limit: a last pass of three stages for the streamed form (n >= 1024), and at least one
  // later pass (which writes out) for any n.
  const uint64_t span = FirstPass(work, n, n >= 1024 ? n / 8 : n / 2, [&](uint64_t i) THC_RHT_LAMBDA_INLINE {
    if ((i * sizeof(T)) % 64 == 0) hwy::Prefetch(s + i + kSumsPrefetchBytes / sizeof(T));
    return RegOps::Mul(RegOps::Mul(RegOps::Sub(LoadAsFloat(RegArith::D(), s + i).raw, vh), vs), vf);
  });
  const InverseStore st = MakeInverseStore(shared, blk, n, m, e, sub, out);
#if THC_FWHT_AVX512
  if (stream && m == n && !sub && n >= 1024) {
    // Stages up to h = n / 16 in place, the last three streamed out.
    MiddlePasses(work, n, span);
    StreamLastPass(work, n, st);
    _mm_sfence();  // the streamed lines are ordered before anything this thread stores next
    return;
  }
#else
  (void)stream;
#endif
  StagePasses(work, n, span, n, st);
}
#endif

// thc_dequant of n sums then rotate_inverse into out[0..m) (THC decode, and the residual).
void ThcDecodeBlockImpl(IntType t, const void* sums, uint64_t off, uint64_t n, uint64_t m, float half, float step,
                        float f, int e, const rng::Stream& shared, uint64_t blk, const float* HWY_RESTRICT sub,
                        float* HWY_RESTRICT out, float* HWY_RESTRICT work, bool stream) {
#if THC_FWHT_REG
  if (n >= 2 * kChunk) {
    switch (t) {
      case IntType::kU8:
        return ThcDecodeBlockT(static_cast<const uint8_t*>(sums) + off, n, m, half, step, f, e, shared, blk, sub, out,
                               work, stream);
      case IntType::kU16:
        return ThcDecodeBlockT(static_cast<const uint16_t*>(sums) + off, n, m, half, step, f, e, shared, blk, sub, out,
                               work, stream);
      case IntType::kU32:
        return ThcDecodeBlockT(static_cast<const uint32_t*>(sums) + off, n, m, half, step, f, e, shared, blk, sub, out,
                               work, stream);
      case IntType::kI8:
        return ThcDecodeBlockT(static_cast<const int8_t*>(sums) + off, n, m, half, step, f, e, shared, blk, sub, out,
                               work, stream);
      case IntType::kI16:
        return ThcDecodeBlockT(static_cast<const int16_t*>(sums) + off, n, m, half, step, f, e, shared, blk, sub, out,
                               work, stream);
      case IntType::kI32:
        return ThcDecodeBlockT(static_cast<const int32_t*>(sums) + off, n, m, half, step, f, e, shared, blk, sub, out,
                               work, stream);
    }
  }
#endif
  (void)stream;
  kern::thc_dequant(t, sums, off, n, half, step, f, work);
  RotateInverseImpl(work, n, m, e, shared, blk, sub, out);
}
#endif

}  // namespace thc::codec::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace thc::codec {

HWY_EXPORT(FwhtImpl);
HWY_EXPORT(TargetNameImpl);
HWY_EXPORT(ApplySignsImpl);
HWY_EXPORT(RotateForwardImpl);
HWY_EXPORT(RotateInverseImpl);
HWY_EXPORT(ThcDecodeBlockImpl);
HWY_EXPORT(ThcEncodeBlockImpl);

void fwht(float* x, uint64_t n) { HWY_DYNAMIC_DISPATCH(FwhtImpl)(x, n); }

void fwht_scalar(float* x, uint64_t n) {
  for (uint64_t h = 1; h < n; h *= 2) {
    for (uint64_t i = 0; i < n; i += 2 * h) {
      for (uint64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

void kern::rotate_forward(const float* x, uint64_t elems, uint64_t wire, int e, const rng::Stream& shared,
                          uint64_t blk, float* work) {
  HWY_DYNAMIC_DISPATCH(RotateForwardImpl)(x, elems, wire, e, shared, blk, work);
}
void kern::rotate_forward_scalar(const float* x, uint64_t elems, uint64_t wire, int e, const rng::Stream& shared,
                                 uint64_t blk, float* work) {
  prescale_signs_scalar(x, elems, wire, e, shared, blk, work);
  fwht_scalar(work, wire);
}
void kern::rotate_inverse(float* work, uint64_t wire, uint64_t m, int e, const rng::Stream& shared, uint64_t blk,
                          const float* sub, float* out) {
  HWY_DYNAMIC_DISPATCH(RotateInverseImpl)(work, wire, m, e, shared, blk, sub, out);
}
void kern::rotate_inverse_scalar(float* work, uint64_t wire, uint64_t m, int e, const rng::Stream& shared,
                                 uint64_t blk, const float* sub, float* out) {
  fwht_scalar(work, wire);
  signs_postscale_scalar(work, m, e, shared, blk, sub, out);
}

void kern::thc_encode_block(const float* x, const float* add, float* staged, uint64_t elems, uint64_t wire, int e,
                            const rng::Stream& shared, uint64_t blk, float enc, const ThcTables& tb,
                            const rng::Stream& own, float* work, uint8_t* idx, uint8_t* packed4, int32_t* val,
                            const float* prefetch, const float* prefetch_add) {
  HWY_DYNAMIC_DISPATCH(ThcEncodeBlockImpl)(x, add, staged, elems, wire, e, shared, blk, enc, tb, own, work, idx,
                                           packed4, val, prefetch, prefetch_add);
}
void kern::thc_encode_block_scalar(const float* x, const float* add, float* staged, uint64_t elems, uint64_t wire,
                                   int e, const rng::Stream& shared, uint64_t blk, float enc, const ThcTables& tb,
                                   const rng::Stream& own, float* work, uint8_t* idx, uint8_t* packed4,
                                   int32_t* val) {
  if (add) {
    add_pair_scalar(x, add, elems, staged);
    x = staged;
  }
  rotate_forward_scalar(x, elems, wire, e, shared, blk, work);
  thc_quantize_scalar(work, wire, enc, tb, own, blk, idx, val);
  if (packed4) pack_bits_scalar(idx, wire, 4, packed4);
}
void kern::thc_decode_block(IntType t, const void* sums, uint64_t off, uint64_t wire, uint64_t m, float half,
                            float step, float f, int e, const rng::Stream& shared, uint64_t blk, const float* sub,
                            float* out, float* work, bool stream) {
  HWY_DYNAMIC_DISPATCH(ThcDecodeBlockImpl)(t, sums, off, wire, m, half, step, f, e, shared, blk, sub, out, work, stream);
}
void kern::thc_decode_block_scalar(IntType t, const void* sums, uint64_t off, uint64_t wire, uint64_t m, float half,
                                   float step, float f, int e, const rng::Stream& shared, uint64_t blk,
                                   const float* sub, float* out, float* work) {
  thc_dequant_scalar(t, sums, off, wire, half, step, f, work);
  rotate_inverse_scalar(work, wire, m, e, shared, blk, sub, out);
}

void apply_signs(float* x, uint64_t n, const rng::Stream& shared, uint64_t block) {
  HWY_DYNAMIC_DISPATCH(ApplySignsImpl)(x, n, shared, block);
}

void kern::apply_signs_scalar(float* x, uint64_t n, const rng::Stream& shared, uint64_t block) {
  const auto key = rng::make_key(shared);
  for (uint64_t g = 0; g * 128 < n; ++g) {
    const auto r = rng::draw4(key, shared, rng::kPurposeSigns, block, static_cast<uint32_t>(g));
    const uint64_t base = g * 128;
    const uint64_t m = n - base < 128 ? n - base : 128;
    for (uint64_t j = 0; j < m; ++j) {
      const uint32_t bit = (r.v[j >> 5] >> (j & 31)) & 1u;
      uint32_t u;
      std::memcpy(&u, &x[base + j], 4);
      u ^= bit << 31;
      std::memcpy(&x[base + j], &u, 4);
    }
  }
}

void rht_forward(float* x, uint64_t n, const rng::Stream& shared, uint64_t block) {
  apply_signs(x, n, shared, block);
  fwht(x, n);
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (uint64_t i = 0; i < n; ++i) x[i] *= s;
}

void rht_inverse(float* x, uint64_t n, const rng::Stream& shared, uint64_t block) {
  fwht(x, n);
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (uint64_t i = 0; i < n; ++i) x[i] *= s;
  apply_signs(x, n, shared, block);
}

const char* simd_target() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }


}  // namespace thc::codec
#endif
