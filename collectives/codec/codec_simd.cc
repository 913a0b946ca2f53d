// The codec's hot loops: Highway SIMD kernels (dynamic dispatch) and their scalar references.
// See codec_simd.h for the contract: bit-identical results, per-element operations of elem.h in
// the same order, no FMA contraction.
//
// Where the time goes (per element, 2^16 blocks, AVX-512): the prelude's one streaming read,
// the RHT (rht.cc: register-tiled FWHT passes with the prescale and signs fused in), and the
// rounding, whose cost is mostly Philox (one counter per 8 elements: 16-bit draws, philox.h).
// The rounding kernels generate their draws in registers (philox-inl.h: PhiloxRound16, 64-bit
// lanes, put in element order by one u16 permute per 16 elements on AVX-512) and consume them
// without a trip through memory; THC looks its cell fields up with two-register permutes when
// g <= 31 (vpermt2d/ps), else gathers them from the Codec's ThcCell array (16-byte records,
// gather indices 4k + field); Cnat works on the input's bits (exponent and mantissa) where the
// scale allows. The rounding kernels' reads of the input carry a software prefetch
// (kPrefetchFloats), the prelude's do not.

// GCC 12's AVX-512 intrinsics (permutes, shuffles, conversions) start from _mm512_undefined_*,
// which trips a false -Wmaybe-uninitialized, or -Wuninitialized once inlined into a lambda (GCC
// bug 105593, fixed in 12.3 / 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "collectives/codec/codec_simd.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "collectives/codec/codec_simd.h"
#include "collectives/codec/elem.h"
#include "collectives/codec/load_float-inl.h"
#include "collectives/codec/philox-inl.h"
#include "collectives/codec/thc_round-inl.h"
#include "common/lookup32_u16-inl.h"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace thc::codec::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

const char* KernelTargetImpl() { return hwy::TargetName(HWY_TARGET); }

#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128
// Fallback targets: the scalar reference.
void PrescaleSignsImpl(const float* x, uint64_t elems, uint64_t wire, int e, const rng::Stream& shared,
                       uint64_t blk, float* work) {
  kern::prescale_signs_scalar(x, elems, wire, e, shared, blk, work);
}
void SignsPostscaleImpl(const float* work, uint64_t m, int e, const rng::Stream& shared, uint64_t blk,
                        const float* sub, float* out) {
  kern::signs_postscale_scalar(work, m, e, shared, blk, sub, out);
}
void ThcQuantizeImpl(const float* work, uint64_t n, float enc, const kern::ThcTables& tb, const rng::Stream& own,
                     uint64_t blk, uint8_t* idx, int32_t* val, const float*) {
  kern::thc_quantize_scalar(work, n, enc, tb, own, blk, idx, val);
}
void NatQuantizeImpl(const float* x, uint64_t n, int e, float enc, int levels, int bits, const rng::Stream& own,
                     uint64_t blk, uint8_t* idx, int32_t* val, uint8_t* packed, const float* add, float* staged) {
  if (add) {
    kern::add_pair_scalar(x, add, n, staged);
    x = staged;
  }
  kern::nat_quantize_scalar(x, n, e, enc, levels, bits, own, blk, idx, val);
  if (packed) kern::pack_bits_scalar(idx, n, bits, packed);
}
void ThcDequantImpl(IntType t, const void* sums, uint64_t off, uint64_t n, float half, float step, float f,
                    float* work) {
  kern::thc_dequant_scalar(t, sums, off, n, half, step, f, work);
}
void NatDequantImpl(IntType t, const void* sums, uint64_t off, uint64_t n, float f, int e, const float* sub,
                    float* out, bool /*stream*/) {
  kern::nat_dequant_scalar(t, sums, off, n, f, e, sub, out);
}
void StoreValuesImpl(IntType t, void* base, uint64_t off, const int32_t* v, uint64_t n) {
  kern::store_values_scalar(t, base, off, v, n);
}
double SumSquaresImpl(const float* x, uint64_t n) { return kern::sum_squares_scalar(x, n); }
float MaxAbsImpl(const float* x, uint64_t n, bool* bad) { return kern::max_abs_scalar(x, n, bad); }
double SumSquaresSumImpl(const float* x, const float* add, uint64_t n) { return kern::sum_squares_sum_scalar(x, add, n); }
float MaxAbsSumImpl(const float* x, const float* add, uint64_t n, bool* bad) {
  return kern::max_abs_sum_scalar(x, add, n, bad);
}
void ScaleByImpl(float* x, uint64_t n, float s) { kern::scale_by_scalar(x, n, s); }
void AddPairImpl(const float* a, const float* b, uint64_t n, float* out) { kern::add_pair_scalar(a, b, n, out); }
void PackBitsImpl(const uint8_t* codes, uint64_t n, int bits, uint8_t* out) {
  kern::pack_bits_scalar(codes, n, bits, out);
}
void UnpackBitsImpl(const uint8_t* packed, uint64_t n, int bits, uint8_t* codes) {
  kern::unpack_bits_scalar(packed, n, bits, codes);
}
void LookupAdd4U8Impl(const uint8_t* table, const uint8_t* packed, uint64_t n, uint8_t* d) {
  kern::lookup_add4_u8_scalar(table, packed, n, d);
}
void LookupAdd32U16Impl(const uint16_t* table, const uint8_t* codes, uint64_t n, uint16_t* d) {
  kern::lookup_add32_u16_scalar(table, codes, n, d);
}

#else  // vector targets

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;

// A rounded product, opaque to the compiler. GCC contracts a * b - c into an FMA by default in
// C++ (-ffp-contract=fast) when the target has FMA, as these AVX2/AVX-512 targets do; the scalar
// reference rounds the product first, which differs when the product is inexact (denormal
// results). Every product that feeds an add or subtract goes through here. (Products that are
// exact anyway, like float squares in double or x * 2^16, need no barrier.)
template <class V>
HWY_INLINE V Rounded(V v) {
#if HWY_COMPILER_GCC || HWY_COMPILER_CLANG
  if constexpr (sizeof(v.raw) == 64) {
    asm("" : "+v"(v.raw));
  } else {
    asm("" : "+x"(v.raw));
  }
#endif
  return v;
}
HWY_INLINE float Rounded(float v) {
#if HWY_COMPILER_GCC || HWY_COMPILER_CLANG
  asm("" : "+x"(v));
#endif
  return v;
}

void PrescaleSignsImpl(const float* HWY_RESTRICT x, uint64_t elems, uint64_t wire, int e,
                       const rng::Stream& shared, uint64_t blk, float* HWY_RESTRICT work) {
  const DF d;
  const DU du;
  const size_t N = hn::Lanes(d);
  const uint64_t span = 128 * N;
  const PhiloxFamily fam = MakeFamily(shared, rng::kPurposeSigns, blk);
  const int h = e / 2;
  const float p1 = elem::pow2f(h), p2 = elem::pow2f(e - h);
  const auto v1 = hn::Set(d, p1), v2 = hn::Set(d, p2);
  HWY_ALIGN uint32_t words[4 * kMaxU32];
  for (uint64_t base = 0; base < wire; base += span) {
    SignWords(du, fam, base, words);
    const uint64_t end = wire - base < span ? wire : base + span;
    uint64_t i = base;
    for (; i + N <= end && i + N <= elems; i += N) {
      const auto v = hn::Mul(hn::Mul(hn::LoadU(d, x + i), v1), v2);
      hn::StoreU(hn::Xor(v, hn::BitCast(d, SignBits(du, words, i - base))), d, work + i);
    }
    for (; i < end && i < elems; ++i)  // the vector that straddles elems
      work[i] = elem::bits_float(elem::float_bits(elem::scale2(x[i], e)) ^ ScalarSignBit(words, i - base));
    for (; i < end && (i % N) != 0; ++i) work[i] = elem::bits_float(ScalarSignBit(words, i - base));
    for (; i + N <= end; i += N) hn::StoreU(hn::BitCast(d, SignBits(du, words, i - base)), d, work + i);
    for (; i < end; ++i) work[i] = elem::bits_float(ScalarSignBit(words, i - base));
  }
}

void SignsPostscaleImpl(const float* HWY_RESTRICT work, uint64_t m, int e, const rng::Stream& shared,
                        uint64_t blk, const float* HWY_RESTRICT sub, float* HWY_RESTRICT out) {
  const DF d;
  const DU du;
  const size_t N = hn::Lanes(d);
  const uint64_t span = 128 * N;
  const PhiloxFamily fam = MakeFamily(shared, rng::kPurposeSigns, blk);
  const int h = e / 2;
  const float p1 = elem::pow2f(h), p2 = elem::pow2f(e - h);
  const auto v1 = hn::Set(d, p1), v2 = hn::Set(d, p2);
  HWY_ALIGN uint32_t words[4 * kMaxU32];
  for (uint64_t base = 0; base < m; base += span) {
    SignWords(du, fam, base, words);
    const uint64_t end = m - base < span ? m : base + span;
    uint64_t i = base;
    if (sub) {
      for (; i + N <= end; i += N) {
        auto v = hn::Xor(hn::LoadU(d, work + i), hn::BitCast(d, SignBits(du, words, i - base)));
        v = Rounded(hn::Mul(hn::Mul(v, v1), v2));
        hn::StoreU(hn::Sub(hn::LoadU(d, sub + i), v), d, out + i);
      }
    } else {
      for (; i + N <= end; i += N) {
        auto v = hn::Xor(hn::LoadU(d, work + i), hn::BitCast(d, SignBits(du, words, i - base)));
        hn::StoreU(hn::Mul(hn::Mul(v, v1), v2), d, out + i);
      }
    }
    for (; i < end; ++i) {
      const float v = Rounded(elem::scale2(elem::bits_float(elem::float_bits(work[i]) ^ ScalarSignBit(words, i - base)), e));
      out[i] = sub ? sub[i] - v : v;
    }
  }
}

// The per-vector bodies of the rounding loops are lambdas called 8 times per step of draws;
// GCC does not always inline them on its own, and a call per 16 elements costs more than the body.
#if HWY_COMPILER_GCC || HWY_COMPILER_CLANG
#define THC_LAMBDA_INLINE __attribute__((always_inline))
#else
#define THC_LAMBDA_INLINE
#endif

// Reads of the input by the rounding kernels run a software prefetch this many floats ahead,
// which keeps the hardware prefetchers' stream going across the pauses between blocks. Prefetches
// past the end of an array are harmless (no fault), and mostly hit the next block. The prelude's
// plain streaming reads (sum_squares, max_abs) run without: on the 2-core AVX-512 VM the hardware
// prefetchers alone read 64 MB 7-25 % faster than with software prefetches in the way.
constexpr size_t kPrefetchFloats = 4096;


// Draws of the own stream come straight from Philox in registers, in element order
// (PhiloxRound16): eight vectors of 16-bit draws j per step. The scalar reference compares
// u = (2 j + 1) 2^-17 with a probability p; the kernels compare j + 1/2 (exact) with p 2^16
// (an exact scaling), which is the same test.

#if HWY_TARGET <= HWY_AVX3
#define THC_HAVE_AVX512 1
#else
#define THC_HAVE_AVX512 0
#endif

// Codes 0..255 in i32 lanes -> bytes.
HWY_INLINE void StoreCodes(hn::Vec<DI> code, uint8_t* HWY_RESTRICT p) {
#if THC_HAVE_AVX512
  if constexpr (sizeof(code.raw) == 64) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(code.raw));  // truncation
    return;
  }
#endif
  const DI di;
  const hn::Rebind<uint8_t, DI> d8;
  hn::StoreU(hn::DemoteTo(d8, code), d8, p);
}

// Elements [i, n) (fewer than one step of draws; i a multiple of 8) element by element; the
// 16-bit draws j generated in registers for groups from i / 8 and stored.
template <class F>
HWY_INLINE void TailWithDraws(const PhiloxFamily& fam, uint64_t i, uint64_t n, F&& per_elem) {
  const DU du;
  const size_t N = hn::Lanes(du);
  HWY_ALIGN uint32_t draws[8 * kMaxU32];
  for (; i < n; i += 8 * N) {
    PhiloxRound16(du, fam, PhiloxLanePattern(hn::Repartition<uint64_t, DU>()), static_cast<uint32_t>(i / 8),
                  [&](size_t q, hn::Vec<DU> j) THC_LAMBDA_INLINE { hn::Store(j, du, draws + q * N); });
    const uint64_t m = n - i < 8 * N ? n - i : 8 * N;
    for (uint64_t k = 0; k < m; ++k) per_elem(i + k, draws[k]);
  }
}

void ThcQuantizeImpl(const float* HWY_RESTRICT work, uint64_t n, float enc, const kern::ThcTables& tb,
                     const rng::Stream& own, uint64_t blk, uint8_t* HWY_RESTRICT idx, int32_t* HWY_RESTRICT val,
                     const float* prefetch) {
  const DF d;
  const DU du;
  const DI di;
  const size_t N = hn::Lanes(d);
  const size_t step = 8 * N;
  const PhiloxFamily fam = MakeFamily(own, rng::kPurposeRound, blk);
  const auto pat = PhiloxLanePattern(hn::Repartition<uint64_t, DU>());
  const auto venc = hn::Set(d, enc);
  const auto t = hn::Set(d, tb.t), negt = hn::Set(d, -tb.t);
  const auto g2t = hn::Set(d, tb.g_over_2t), gf = hn::Set(d, tb.gf);
  // v = thc_grid(work * enc): NaN taken as 0 (a mask, not Min/Max, whose NaN rules differ
  // between targets), y clamped to [-t, t], then v = (y + t) * g/(2t) >= +0 (y >= -t), clamped
  // to g.
  auto grid = [&](uint64_t i) {
    auto y = hn::Mul(hn::LoadU(d, work + i), venc);
    y = hn::IfThenElseZero(hn::Eq(y, y), y);
    y = hn::Max(negt, hn::Min(t, y));
    return hn::Min(gf, hn::Mul(hn::Add(y, t), g2t));
  };
  uint64_t i = 0;
#if THC_HAVE_AVX512
  if (ThcRegRound::Usable(tb)) {
    const ThcRegRound rr(tb, enc);
    auto one = [&](uint64_t j, hn::Vec<DU> r) THC_LAMBDA_INLINE {
      __m512i k;
      __mmask16 up;
      rr.Round(_mm512_loadu_ps(work + j), r.raw, &k, &up);
      if (val) _mm512_storeu_si512(val + j, rr.Value(k, up));
      if (idx) _mm_storeu_si128(reinterpret_cast<__m128i*>(idx + j), _mm512_cvtepi32_epi8(rr.Code(k, up)));
    };
    if constexpr (sizeof(hn::Vec<DF>{}.raw) == 64) {
      for (; i + step <= n; i += step) {
        if (prefetch) PrefetchAhead(prefetch + i, step);
        PhiloxRound16(du, fam, pat, static_cast<uint32_t>(i / 8), [&](size_t q, hn::Vec<DU> j) THC_LAMBDA_INLINE { one(i + q * N, j); });
      }
    }
  }
#endif
  if (ThcWordTables::Usable(tb)) {
    // Gather path, two gathers per vector (ThcWordTables).
    const ThcWordTables tab(tb);
    const ThcWordRound<DF> wr(tab, tb, enc);
    auto one = [&](uint64_t j, hn::Vec<DU> r) THC_LAMBDA_INLINE {
      hn::Vec<DI> value;
      const auto code = wr.Round(hn::LoadU(d, work + j), r, val ? &value : nullptr);
      if (val) hn::StoreU(value, di, val + j);
      if (idx) StoreCodes(code, idx + j);
    };
    for (; i + step <= n; i += step) {
      if (prefetch) PrefetchAhead(prefetch + i, step);
      PhiloxRound16(du, fam, pat, static_cast<uint32_t>(i / 8), [&](size_t q, hn::Vec<DU> j) THC_LAMBDA_INLINE { one(i + q * N, j); });
    }
  } else {
    // Gather path for g > 255: cell fields straight from the ThcCell array (words 4k + field).
    const auto gm1 = hn::Set(di, tb.g - 1), zi = hn::Zero(di), ff = hn::Set(di, 0xFF);
    const auto* base_i = reinterpret_cast<const int32_t*>(tb.cells);
    const auto* base_f = reinterpret_cast<const float*>(tb.cells);
    const auto o1 = hn::Set(di, 1), o2 = hn::Set(di, 2), o3 = hn::Set(di, 3);
    const auto s16 = hn::Set(d, 65536.0f), halff = hn::Set(d, 0.5f);
    auto one = [&](uint64_t j, hn::Vec<DU> r) THC_LAMBDA_INLINE {
      const auto v = grid(j);
      const auto k = hn::Max(hn::Min(hn::ConvertTo(di, v), gm1), zi);  // Max: NaN-safe
      const auto k4 = hn::ShiftLeft<2>(k);
      const auto lo = hn::GatherIndex(di, base_i, k4);
      const auto inv = hn::GatherIndex(d, base_f, hn::Add(k4, o2));
      const auto p = hn::Mul(hn::Sub(v, hn::ConvertTo(d, lo)), inv);
      const auto u16 = hn::Add(hn::ConvertTo(d, hn::BitCast(di, r)), halff);
      const auto upi = hn::RebindMask(di, hn::Lt(u16, hn::Mul(p, s16)));
      if (val) {
        const auto hi = hn::GatherIndex(di, base_i, hn::Add(k4, o1));
        hn::StoreU(hn::IfThenElse(upi, hi, lo), di, val + j);
      }
      if (idx) {
        const auto pr = hn::GatherIndex(di, base_i, hn::Add(k4, o3));
        StoreCodes(hn::And(hn::IfThenElse(upi, hn::ShiftRight<8>(pr), pr), ff), idx + j);
      }
    };
    for (; i + step <= n; i += step) {
      if (prefetch) PrefetchAhead(prefetch + i, step);
      PhiloxRound16(du, fam, pat, static_cast<uint32_t>(i / 8), [&](size_t q, hn::Vec<DU> j) THC_LAMBDA_INLINE { one(i + q * N, j); });
    }
  }
  TailWithDraws(fam, i, n, [&](uint64_t j, uint32_t r) {
    const float vv = elem::thc_grid(work[j] * enc, tb.t, tb.g_over_2t, tb.gf);
    uint8_t z;
    int32_t q;
    elem::thc_round(vv, rng::round_unit(r), tb.cells, tb.g, &z, &q);
    if (idx) idx[j] = z;
    if (val) val[j] = q;
  });
}

void PackBitsImpl(const uint8_t* HWY_RESTRICT codes, uint64_t n, int bits, uint8_t* HWY_RESTRICT out);

#if HWY_TARGET <= HWY_AVX2 && HWY_ARCH_X86
// The byte shuffle of the register packers: a 128-bit lane's two qwords each hold 8 codes of b
// bits in their low b bytes; this gathers those 2 b bytes at the lane's start (zeros after).
HWY_INLINE __m128i PackLaneShuffle(int bits) {
  alignas(16) int8_t sel[16];
  for (int k = 0; k < 16; ++k) sel[k] = k < bits ? static_cast<int8_t>(k) : k < 2 * bits ? static_cast<int8_t>(8 + k - bits) : -1;
  return _mm_load_si128(reinterpret_cast<const __m128i*>(sel));
}
#endif

#if THC_HAVE_AVX512
// Bit packing of codes still in registers (u32 lanes, codes < 2^b, b = 1..7), with the same
// result as PackBitsImpl: the 64 codes of four vectors become bytes in element order (two
// saturating packs interleave them per 128-bit lane in dwords of four; one dword permute
// restores the order), then PackBitsImpl's multiply-adds and byte shuffle leave the 2b bytes of
// each 128-bit lane at its start, and one u16 permute joins the four lanes into 8b contiguous
// bytes, stored under a byte mask (nothing written past them).
struct PackRegs {
  __m512i mul1, mul2, lo32, sh, shuf, perm_d, perm_w;
  __mmask64 keep;
  uint64_t b;

  explicit PackRegs(int bits) : b(static_cast<uint64_t>(bits)) {
    mul1 = _mm512_set1_epi16(static_cast<short>((1 << bits) << 8 | 1));
    mul2 = _mm512_set1_epi32((1 << (2 * bits)) << 16 | 1);
    lo32 = _mm512_set1_epi64(0xFFFFFFFFll);
    sh = _mm512_set1_epi64(4 * bits);
    shuf = _mm512_broadcast_i32x4(PackLaneShuffle(bits));
    alignas(64) int32_t pd[16];
    for (int o = 0; o < 16; ++o) pd[o] = 4 * (o % 4) + o / 4;  // dword 4 v + L <- 4 L + v
    perm_d = _mm512_load_si512(pd);
    alignas(64) int16_t pw[32];
    for (int u = 0; u < 32; ++u) pw[u] = static_cast<int16_t>(u < 4 * bits ? 8 * (u / bits) + u % bits : 0);
    perm_w = _mm512_load_si512(pw);
    keep = (uint64_t{1} << (8 * bits)) - 1;
  }
  HWY_INLINE void Pack64(__m512i c0, __m512i c1, __m512i c2, __m512i c3, uint8_t* HWY_RESTRICT out) const {
    const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
    const __m512i c = _mm512_permutexvar_epi32(perm_d, bytes);
    const __m512i d = _mm512_madd_epi16(_mm512_maddubs_epi16(mul1, c), mul2);
    const __m512i q = _mm512_or_si512(_mm512_and_si512(d, lo32), _mm512_sllv_epi64(_mm512_srli_epi64(d, 32), sh));
    const __m512i v = _mm512_permutexvar_epi16(perm_w, _mm512_shuffle_epi8(q, shuf));
    _mm512_mask_storeu_epi8(out, keep, v);
  }
  // 128 codes (8 vectors) -> 16 b bytes at out.
  HWY_INLINE void Pack128(const __m512i (&c)[8], uint8_t* HWY_RESTRICT out) const {
    Pack64(c[0], c[1], c[2], c[3], out);
    Pack64(c[4], c[5], c[6], c[7], out + 8 * b);
  }
};
#endif

#if HWY_TARGET == HWY_AVX2
// Codes 0..255 of four vectors (u32 lanes) -> 32 bytes in element order: two saturating packs
// leave dword 4 L + v (v = vector, L = 128-bit lane) holding codes 4 L..4 L + 3 of vector v, and
// one dword permute puts them back in order.
HWY_INLINE __m256i CodeBytes32(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  const __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
  return _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// PackRegs on 256-bit vectors: 64 codes (8 vectors of 8, codes < 2^b, b = 1..7) -> 8 b bytes at
// out, the same bytes as PackBitsImpl. Each qword of CodeBytes32's result becomes 8 codes in its
// low b bytes (PackBitsImpl's multiply-adds), a byte shuffle gathers each 128-bit lane's 2 b bytes
// at its start, and the four lanes are stored 2 b bytes apart as 16-byte stores, each overwriting
// the previous one's tail: the last one writes 16 - 2 b bytes past the 8 b, which the caller's
// loop bound keeps inside the block's packed bytes (a later step overwrites them).
struct PackRegs2 {
  __m256i mul1, mul2, lo32, shuf;
  __m128i sh;
  uint64_t b;

  explicit PackRegs2(int bits) : b(static_cast<uint64_t>(bits)) {
    mul1 = _mm256_set1_epi16(static_cast<short>((1 << bits) << 8 | 1));
    mul2 = _mm256_set1_epi32((1 << (2 * bits)) << 16 | 1);
    lo32 = _mm256_set1_epi64x(0xFFFFFFFFll);
    sh = _mm_cvtsi32_si128(4 * bits);
    shuf = _mm256_broadcastsi128_si256(PackLaneShuffle(bits));
  }
  HWY_INLINE __m256i Lanes(__m256i bytes) const {
    const __m256i d = _mm256_madd_epi16(_mm256_maddubs_epi16(mul1, bytes), mul2);
    const __m256i q = _mm256_or_si256(_mm256_and_si256(d, lo32), _mm256_sll_epi64(_mm256_srli_epi64(d, 32), sh));
    return _mm256_shuffle_epi8(q, shuf);
  }
  HWY_INLINE void Pack64(const __m256i (&c)[8], uint8_t* HWY_RESTRICT out) const {
    const __m256i v = Lanes(CodeBytes32(c[0], c[1], c[2], c[3]));
    const __m256i w = Lanes(CodeBytes32(c[4], c[5], c[6], c[7]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(v));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * b), _mm256_extracti128_si256(v, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 4 * b), _mm256_castsi256_si128(w));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 6 * b), _mm256_extracti128_si256(w, 1));
  }
};
#endif

// kAdd: error feedback's x + add, summed as read (add_pair's bits) and stored to staged; a
// template parameter, so that the loops without it stay as they were.
template <bool kAdd>
HWY_INLINE void NatQuantizeT(const float* HWY_RESTRICT x, uint64_t n, int e, float enc, int levels, int bits,
                             const rng::Stream& own, uint64_t blk, uint8_t* HWY_RESTRICT idx,
                             int32_t* HWY_RESTRICT val, uint8_t* HWY_RESTRICT packed, const float* HWY_RESTRICT add,
                             float* HWY_RESTRICT staged) {
  const DF d;
  // The input at j: x, or x + add, also stored to staged.
  auto input = [&](uint64_t j) THC_LAMBDA_INLINE {
    if constexpr (!kAdd) {
      return hn::LoadU(d, x + j);
    } else {
      const auto s = hn::Add(hn::LoadU(d, x + j), hn::LoadU(d, add + j));
      hn::StoreU(s, d, staged + j);
      return s;
    }
  };
  const DU du;
  const DI di;
  const size_t N = hn::Lanes(d);
  const size_t step = 8 * N;
  const PhiloxFamily fam = MakeFamily(own, rng::kPurposeRound, blk);
  const auto pat = PhiloxLanePattern(hn::Repartition<uint64_t, DU>());
  const int h = e / 2;
  const auto v1 = hn::Set(d, elem::pow2f(h)), v2 = hn::Set(d, elem::pow2f(e - h)), venc = hn::Set(d, enc);
  const auto rmax = hn::Set(d, elem::pow2f(levels - 1)), onef = hn::Set(d, 1.0f), zero = hn::Zero(d);
  const auto s16 = hn::Set(d, 65536.0f), halff = hn::Set(d, 0.5f);
  const auto oi = hn::Set(di, 1), zi = hn::Zero(di), mant = hn::Set(di, 0x7FFFFF), o64 = hn::Set(di, 64);
  const auto m126 = hn::Set(di, 126), m125 = hn::Set(di, 125);
  const auto sgn = hn::Set(di, 1 << (bits - 1));
  // nat_round with the 16-bit draws j: u = (2 j + 1) 2^-17 exactly, so for r >= 1
  // u < frac = mant 2^-23  <=>  (2 j + 1) 2^6 = j 2^7 + 64 < mant, and for r < 1
  // u < r  <=>  j + 1/2 < r 2^16 (scaling by 2^16 is exact). Level for r >= 1: exponent + 1
  // (+1 when going up).
  // x * 1 is x for every float but NaN, which never gets here: Cnat (enc = 1) skips the product.
  const bool scale_enc = enc != 1.0f;
  auto one = [&](uint64_t j, hn::Vec<DU> rd) THC_LAMBDA_INLINE {
    if (j % 16 == 0) {
      hwy::Prefetch(x + j + kPrefetchFloats);
      if constexpr (kAdd) hwy::Prefetch(add + j + kPrefetchFloats);
    }
    const auto a = input(j);
    auto r = hn::Mul(hn::Mul(hn::Abs(a), v1), v2);
    if (scale_enc) r = hn::Mul(r, venc);
    r = hn::IfThenElseZero(hn::Ge(r, zero), hn::Min(rmax, r));  // NaN -> 0, as nat_round
    const auto u = hn::BitCast(di, rd);
    const auto rb = hn::BitCast(di, r);
    const auto ex8 = hn::ShiftRight<23>(rb);  // r >= 0: the biased exponent
    const auto upf = hn::Lt(hn::Or(hn::ShiftLeft<7>(u), o64), hn::And(rb, mant));
    const auto big = hn::IfThenElse(upf, hn::Sub(ex8, m125), hn::Sub(ex8, m126));
    const auto ups = hn::RebindMask(di, hn::Lt(hn::Add(hn::ConvertTo(d, u), halff), hn::Mul(r, s16)));
    const auto level = hn::IfThenElse(hn::RebindMask(di, hn::Ge(r, onef)), big, hn::IfThenElseZero(ups, oi));
#if THC_HAVE_AVX512
    if constexpr (sizeof(level.raw) == 64) {
      if (!val) {
        // The sign bit stands for a < 0: they differ only at -0, whose level is 0. One masked
        // test gives s = negative and level != 0, one masked or the code.
        const __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(a.raw));
        const __mmask16 sm = _mm512_mask_test_epi32_mask(neg, level.raw, level.raw);
        if (idx) StoreCodes(hn::Vec<DI>{_mm512_mask_or_epi32(level.raw, sm, level.raw, sgn.raw)}, idx + j);
        return;
      }
    }
#endif
    const auto nz = hn::Gt(level, zi);
    const auto s = hn::And(hn::RebindMask(di, hn::Lt(a, zero)), nz);
    if (val) {
      const auto mag = hn::IfThenElseZero(nz, hn::Shl(oi, hn::Max(hn::Sub(level, oi), zi)));
      hn::StoreU(hn::IfThenElse(s, hn::Neg(mag), mag), di, val + j);
    }
    if (idx) StoreCodes(hn::Or(hn::IfThenElseZero(s, sgn), level), idx + j);
  };
  uint64_t i = 0, i0 = 0;  // i0: codes before it are already in packed
#if THC_HAVE_AVX512
  if (sizeof(hn::Vec<DF>{}.raw) == 64 && enc == 1.0f && e >= -127 && e <= 95) {
    // Cnat (no factor besides 2^e) on the input's bits: for r = |x| 2^e >= 1, i.e. |x| >= 2^-e
    // (a normal x for e <= 126, so r is exact and keeps x's mantissa), the level is
    // exponent(x) + e - 126 (+1 when going up: (2 j + 1) 2^6 < mant, i.e.
    // j 2^16 + 2^15 < mant 2^9), at most L: the clamp r -> 2^(L-1) gives exactly L, and so do
    // larger exponents and +inf. Below 1: up iff (j + 1/2) 2^16 < r 2^32 = |x| 2^(e+32), one
    // product (it differs from scale2's two only for r far below 2^-17, where both are false).
    // NaN: level 0 (not counted as r >= 1; its float compare is false). The draws come as
    // j 2^16 + 2^15 (PhiloxRound16<true>), which both tests share.
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i c = _mm512_set1_epi32(e - 126), lv = _mm512_set1_epi32(levels), one1 = _mm512_set1_epi32(1);
    const __m512i inf = _mm512_set1_epi32(0x7F800000);
    const __m512i t1 = _mm512_set1_epi32(static_cast<int>(elem::float_bits(elem::pow2f(-e))));
    const __m512 s32 = _mm512_set1_ps(elem::pow2f(e + 32));
    auto one_bits = [&](uint64_t j, hn::Vec<DU> rd) THC_LAMBDA_INLINE {
      hwy::Prefetch(x + j + kPrefetchFloats);
      if constexpr (kAdd) hwy::Prefetch(add + j + kPrefetchFloats);
      const __m512i bx = _mm512_castps_si512(input(j).raw);
      const __m512i ax = _mm512_and_si512(bx, absm);
      const __m512i jx = rd.raw;
      const __mmask16 up = _mm512_cmplt_epu32_mask(jx, _mm512_slli_epi32(bx, 9));
      __m512i lvl = _mm512_add_epi32(_mm512_srli_epi32(ax, 23), c);
      lvl = _mm512_min_epi32(_mm512_mask_add_epi32(lvl, up, lvl, one1), lv);
      const __mmask16 big = _mm512_mask_cmpge_epu32_mask(_mm512_cmple_epu32_mask(ax, inf), ax, t1);
      const __mmask16 ups =
          _mm512_cmp_ps_mask(_mm512_cvtepu32_ps(jx), _mm512_mul_ps(_mm512_castsi512_ps(ax), s32), _CMP_LT_OQ);
      // Big lanes hold lvl >= 1, the others 0: max(., 1) under ups raises only the latter.
      const __m512i zb = _mm512_maskz_mov_epi32(big, lvl);
      const __m512i level = _mm512_mask_max_epi32(zb, ups, zb, one1);
      // The sign bit stands for a < 0: they differ only at -0 and NaN, whose level is 0.
      const __mmask16 sm = _mm512_mask_test_epi32_mask(_mm512_movepi32_mask(bx), level, level);
      if (val) {
        // +-2^(level-1), 0 for level 0 (a shift count of 32 gives 0).
        const __m512i mag = _mm512_sllv_epi32(one1, _mm512_mask_sub_epi32(_mm512_set1_epi32(32), _mm512_test_epi32_mask(level, level), level, one1));
        _mm512_storeu_si512(val + j, _mm512_mask_sub_epi32(mag, sm, _mm512_setzero_si512(), mag));
      }
      return _mm512_mask_or_epi32(level, sm, level, sgn.raw);
    };
    if (packed && bits < 8) {
      // The 128 codes of a step packed in registers (Pack128), not stored as bytes and packed
      // by a second pass over them.
      const PackRegs pr(bits);
      for (; i + step <= n; i += step) {
        __m512i c[8];
        PhiloxRound16<true>(du, fam, pat, static_cast<uint32_t>(i / 8),
                            [&](size_t q, hn::Vec<DU> j) THC_LAMBDA_INLINE { c[q] = one_bits(i + q * N, j); });
        pr.Pack128(c, packed + i / 8 * static_cast<uint64_t>(bits));
      }
      i0 = i;
    }
    for (; i + step <= n; i += step)
      PhiloxRound16<true>(du, fam, pat, static_cast<uint32_t>(i / 8), [&](size_t q, hn::Vec<DU> j) THC_LAMBDA_INLINE {
        const __m512i code = one_bits(i + q * N, j);
        if (idx) StoreCodes(hn::Vec<DI>{code}, idx + i + q * N);
      });
  }
#endif
#if HWY_TARGET == HWY_AVX2
  if (enc == 1.0f && e >= -127 && e <= 95) {
    // The AVX-512 loop above on 8 lanes, with AVX2's operations: no mask registers, so
    // comparisons give all-ones lanes (a level goes up by subtracting one), no unsigned compare
    // or conversion, so the draws enter as jr = j 2^7 + 2^6 < 2^23: going up at r >= 1 is
    // (2 j + 1) 2^6 < mant, and at r < 1 jr < |x| 2^(e+23) (exact scalings of the tests above
    // wherever the product is normal; where it is not, both sides say no).
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), mantm = _mm256_set1_epi32(0x7FFFFF);
    const __m256i c = _mm256_set1_epi32(e - 126), lv = _mm256_set1_epi32(levels), one1 = _mm256_set1_epi32(1);
    const __m256i inf = _mm256_set1_epi32(0x7F800000), half7 = _mm256_set1_epi32(64);
    const __m256i t1m = _mm256_set1_epi32(static_cast<int>(elem::float_bits(elem::pow2f(-e))) - 1);
    const __m256i sgnv = _mm256_set1_epi32(1 << (bits - 1)), zero = _mm256_setzero_si256();
    const __m256 s23 = _mm256_set1_ps(elem::pow2f(e + 23));
    auto one_bits = [&](uint64_t j, __m256i draw) THC_LAMBDA_INLINE {
      if ((j & 15) == 0) {
        hwy::Prefetch(x + j + kPrefetchFloats);
        if constexpr (kAdd) hwy::Prefetch(add + j + kPrefetchFloats);
      }
      const __m256i bx = _mm256_castps_si256(input(j).raw);
      const __m256i ax = _mm256_and_si256(bx, absm);
      const __m256i jr = _mm256_or_si256(_mm256_slli_epi32(draw, 7), half7);
      const __m256i up = _mm256_cmpgt_epi32(_mm256_and_si256(bx, mantm), jr);
      __m256i lvl = _mm256_add_epi32(_mm256_srli_epi32(ax, 23), c);
      lvl = _mm256_min_epi32(_mm256_sub_epi32(lvl, up), lv);
      // Not r >= 1: NaN (above inf) or |x| < 2^-e.
      const __m256i small = _mm256_or_si256(_mm256_cmpgt_epi32(ax, inf), _mm256_cmpgt_epi32(t1m, ax));
      const __m256 ups = _mm256_cmp_ps(_mm256_cvtepi32_ps(jr), _mm256_mul_ps(_mm256_castsi256_ps(ax), s23), _CMP_LT_OQ);
      // Big lanes hold lvl >= 1 (and ups true), the others 0 or ups' 1.
      const __m256i level =
          _mm256_max_epi32(_mm256_andnot_si256(small, lvl), _mm256_srli_epi32(_mm256_castps_si256(ups), 31));
      if (val) {
        // 2^(level-1), 0 for level 0 (a count of 2^32 - 1), negated where the sign bit is set
        // (vpsignd: x = 0 gives 0, and -0 or a negative NaN has level 0).
        const __m256i mag = _mm256_sllv_epi32(one1, _mm256_sub_epi32(level, one1));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(val + j), _mm256_sign_epi32(mag, bx));
      }
      // The sign bit stands for a < 0: they differ only at -0 and NaN, whose level is 0.
      const __m256i sm = _mm256_andnot_si256(_mm256_cmpeq_epi32(level, zero), _mm256_srai_epi32(bx, 31));
      return _mm256_or_si256(level, _mm256_and_si256(sm, sgnv));
    };
    if (packed && bits < 8) {
      // The 64 codes of a step packed in registers while the last store stays inside the
      // block's whole packed bytes; the rest from idx below.
      const PackRegs2 pr(bits);
      const uint64_t b = static_cast<uint64_t>(bits), full = n / 8 * b;
      for (; i + step <= n && i / 8 * b + 6 * b + 16 <= full; i += step) {
        __m256i cs[8];
        PhiloxRound16(du, fam, pat, static_cast<uint32_t>(i / 8),
                      [&](size_t q, hn::Vec<DU> j) THC_LAMBDA_INLINE { cs[q] = one_bits(i + q * N, j.raw); });
        pr.Pack64(cs, packed + i / 8 * b);
      }
      i0 = i;
    }
    for (; i + step <= n; i += step) {
      __m256i cs[8];
      PhiloxRound16(du, fam, pat, static_cast<uint32_t>(i / 8),
                    [&](size_t q, hn::Vec<DU> j) THC_LAMBDA_INLINE { cs[q] = one_bits(i + q * N, j.raw); });
      if (idx) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + i), CodeBytes32(cs[0], cs[1], cs[2], cs[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + i + 32), CodeBytes32(cs[4], cs[5], cs[6], cs[7]));
      }
    }
  }
#endif
  for (; i + step <= n; i += step)
    PhiloxRound16(du, fam, pat, static_cast<uint32_t>(i / 8), [&](size_t q, hn::Vec<DU> j) THC_LAMBDA_INLINE { one(i + q * N, j); });
  TailWithDraws(fam, i, n, [&](uint64_t j, uint32_t r) {
    float a = x[j];
    if constexpr (kAdd) staged[j] = a = a + add[j];
    const float rr = elem::scale2(std::fabs(a), e) * enc;
    uint8_t z;
    int32_t q;
    elem::nat_round(rr, a < 0, rng::round_unit(r), levels, bits, &z, &q);
    if (idx) idx[j] = z;
    if (val) val[j] = q;
  });
  // What the fused loop left (i0 a multiple of 8: whole bytes of packed) from idx.
  if (packed && i0 < n) PackBitsImpl(idx + i0, n - i0, bits, packed + i0 / 8 * static_cast<uint64_t>(bits));
}
void NatQuantizeImpl(const float* HWY_RESTRICT x, uint64_t n, int e, float enc, int levels, int bits,
                     const rng::Stream& own, uint64_t blk, uint8_t* HWY_RESTRICT idx, int32_t* HWY_RESTRICT val,
                     uint8_t* HWY_RESTRICT packed, const float* HWY_RESTRICT add, float* HWY_RESTRICT staged) {
  if (add) {
    NatQuantizeT<true>(x, n, e, enc, levels, bits, own, blk, idx, val, packed, add, staged);
  } else {
    NatQuantizeT<false>(x, n, e, enc, levels, bits, own, blk, idx, val, packed, nullptr, nullptr);
  }
}
template <typename T>
void ThcDequantT(const T* HWY_RESTRICT s, uint64_t n, float half, float step, float f, float* HWY_RESTRICT w) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const auto vh = hn::Set(d, half), vs = hn::Set(d, step), vf = hn::Set(d, f);
  uint64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::Mul(hn::Sub(LoadAsFloat(d, s + i), vh), vs), vf), d, w + i);
  for (; i < n; ++i) w[i] = elem::thc_decode_sum(static_cast<float>(s[i]), half, step) * f;
}

void ThcDequantImpl(IntType t, const void* sums, uint64_t off, uint64_t n, float half, float step, float f,
                    float* work) {
  switch (t) {
    case IntType::kU8: return ThcDequantT(static_cast<const uint8_t*>(sums) + off, n, half, step, f, work);
    case IntType::kU16: return ThcDequantT(static_cast<const uint16_t*>(sums) + off, n, half, step, f, work);
    case IntType::kU32: return ThcDequantT(static_cast<const uint32_t*>(sums) + off, n, half, step, f, work);
    case IntType::kI8: return ThcDequantT(static_cast<const int8_t*>(sums) + off, n, half, step, f, work);
    case IntType::kI16: return ThcDequantT(static_cast<const int16_t*>(sums) + off, n, half, step, f, work);
    case IntType::kI32: return ThcDequantT(static_cast<const int32_t*>(sums) + off, n, half, step, f, work);
  }
}

template <typename T>
void NatDequantT(const T* HWY_RESTRICT s, uint64_t n, float f, int e, const float* HWY_RESTRICT sub,
                 float* HWY_RESTRICT out, bool stream) {
  const DF d;
  const size_t N = hn::Lanes(d);
  const int h = e / 2;
  const auto v1 = hn::Set(d, elem::pow2f(h)), v2 = hn::Set(d, elem::pow2f(e - h)), vf = hn::Set(d, f);
  uint64_t i = 0;
  auto scalar = [&](uint64_t k) {
    const float v = Rounded(elem::scale2(static_cast<float>(s[k]) * f, e));
    out[k] = sub ? sub[k] - v : v;
  };
  if (stream && !sub) {
    // Non-temporal stores need aligned vectors: the head element by element up to the first.
    for (; i < n && reinterpret_cast<uintptr_t>(out + i) % (N * sizeof(float)) != 0; ++i) scalar(i);
    for (; i + N <= n; i += N) hn::Stream(hn::Mul(hn::Mul(hn::Mul(LoadAsFloat(d, s + i), vf), v1), v2), d, out + i);
    for (; i < n; ++i) scalar(i);
    hwy::FlushStream();  // the streamed lines are ordered before anything this thread stores next
    return;
  }
  if (sub) {
    for (; i + N <= n; i += N)
      hn::StoreU(hn::Sub(hn::LoadU(d, sub + i), Rounded(hn::Mul(hn::Mul(hn::Mul(LoadAsFloat(d, s + i), vf), v1), v2))),
                 d, out + i);
  } else {
    for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::Mul(hn::Mul(LoadAsFloat(d, s + i), vf), v1), v2), d, out + i);
  }
  for (; i < n; ++i) scalar(i);
}

void NatDequantImpl(IntType t, const void* sums, uint64_t off, uint64_t n, float f, int e, const float* sub,
                    float* out, bool stream) {
  switch (t) {
    case IntType::kU8: return NatDequantT(static_cast<const uint8_t*>(sums) + off, n, f, e, sub, out, stream);
    case IntType::kU16: return NatDequantT(static_cast<const uint16_t*>(sums) + off, n, f, e, sub, out, stream);
    case IntType::kU32: return NatDequantT(static_cast<const uint32_t*>(sums) + off, n, f, e, sub, out, stream);
    case IntType::kI8: return NatDequantT(static_cast<const int8_t*>(sums) + off, n, f, e, sub, out, stream);
    case IntType::kI16: return NatDequantT(static_cast<const int16_t*>(sums) + off, n, f, e, sub, out, stream);
    case IntType::kI32: return NatDequantT(static_cast<const int32_t*>(sums) + off, n, f, e, sub, out, stream);
  }
}

// int32 -> 8 or 16 bits with two's-complement truncation (static_cast), as unsigned bytes.
template <typename T>
void StoreNarrow(const int32_t* HWY_RESTRICT v, uint64_t n, T* HWY_RESTRICT out) {
  const DI di;
  const hn::Rebind<T, DI> dt;
  const size_t N = hn::Lanes(di);
  const auto mask = hn::Set(di, static_cast<int32_t>((uint32_t{1} << (8 * sizeof(T))) - 1));
  uint64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::DemoteTo(dt, hn::And(hn::LoadU(di, v + i), mask)), dt, out + i);
  for (; i < n; ++i) out[i] = static_cast<T>(v[i]);
}

void StoreValuesImpl(IntType t, void* base, uint64_t off, const int32_t* v, uint64_t n) {
  switch (t) {
    case IntType::kU8:
    case IntType::kI8: return StoreNarrow(v, n, static_cast<uint8_t*>(base) + off);
    case IntType::kU16:
    case IntType::kI16: return StoreNarrow(v, n, static_cast<uint16_t*>(base) + off);
    case IntType::kU32:
    case IntType::kI32:
      if (n) std::memcpy(static_cast<int32_t*>(base) + off, v, n * sizeof(int32_t));
      return;
  }
}

// 16 packed bytes (32 indices) per step in 128-bit vectors: nibbles split, both looked up in
// the 16-entry table with one byte shuffle each, interleaved back into element order, added.
void LookupAdd4U8Impl(const uint8_t* HWY_RESTRICT table, const uint8_t* HWY_RESTRICT packed, uint64_t n,
                      uint8_t* HWY_RESTRICT d) {
  const hn::Full128<uint8_t> d8;
  const hn::Full128<uint16_t> d16;
  const auto tbl = hn::LoadU(d8, table);
  const auto low = hn::Set(d8, 0x0F);
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const auto p = hn::LoadU(d8, packed + i / 2);
    const auto lo = hn::TableLookupBytes(tbl, hn::And(p, low));
    const auto hi = hn::TableLookupBytes(tbl, hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(d16, p))), low));
    hn::StoreU(hn::Add(hn::LoadU(d8, d + i), hn::InterleaveLower(d8, lo, hi)), d8, d + i);
    hn::StoreU(hn::Add(hn::LoadU(d8, d + i + 16), hn::InterleaveUpper(d8, lo, hi)), d8, d + i + 16);
  }
  if (i < n) kern::lookup_add4_u8_scalar(table, packed + i / 2, n - i, d + i);
}

// 16 codes per step (common/lookup32_u16-inl.h), added.
void LookupAdd32U16Impl(const uint16_t* HWY_RESTRICT table, const uint8_t* HWY_RESTRICT codes, uint64_t n,
                        uint16_t* HWY_RESTRICT d) {
  const simd::HWY_NAMESPACE::Lookup32U16 lut(table);
  const hn::Full128<uint16_t> d16;
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    hn::Vec<decltype(d16)> a, b;
    lut.Get(codes + i, &a, &b);
    hn::StoreU(hn::Add(hn::LoadU(d16, d + i), a), d16, d + i);
    hn::StoreU(hn::Add(hn::LoadU(d16, d + i + 8), b), d16, d + i + 8);
  }
  if (i < n) kern::lookup_add32_u16_scalar(table, codes + i, n - i, d + i);
}

// kAdd: of x[i] + add[i], each sum rounded to float before it is squared.
template <bool kAdd>
double SumSquaresT(const float* HWY_RESTRICT x, const float* HWY_RESTRICT add, uint64_t n) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;  // Lanes(dd) floats
  const size_t Nd = hn::Lanes(dd);
  if (Nd > 8 || 16 % Nd != 0) return kAdd ? kern::sum_squares_sum_scalar(x, add, n) : kern::sum_squares_scalar(x, n);
  const size_t K = 16 / Nd;
  auto a0 = hn::Zero(dd), a1 = hn::Zero(dd), a2 = hn::Zero(dd), a3 = hn::Zero(dd);
  auto a4 = hn::Zero(dd), a5 = hn::Zero(dd), a6 = hn::Zero(dd), a7 = hn::Zero(dd);
  const uint64_t n16 = n & ~uint64_t{15};
  // Squares of floats are exact in double, so a fused multiply-add here changes nothing.
  auto sq = [&](uint64_t i) {
    auto f = hn::LoadU(dfh, x + i);
    if constexpr (kAdd) f = hn::Add(f, hn::LoadU(dfh, add + i));
    const auto v = hn::PromoteTo(dd, f);
    return hn::Mul(v, v);
  };
  for (uint64_t i = 0; i < n16; i += 16) {
    a0 = hn::Add(a0, sq(i));
    a1 = hn::Add(a1, sq(i + Nd));
    if (K > 2) {
      a2 = hn::Add(a2, sq(i + 2 * Nd));
      a3 = hn::Add(a3, sq(i + 3 * Nd));
    }
    if (K > 4) {
      a4 = hn::Add(a4, sq(i + 4 * Nd));
      a5 = hn::Add(a5, sq(i + 5 * Nd));
      a6 = hn::Add(a6, sq(i + 6 * Nd));
      a7 = hn::Add(a7, sq(i + 7 * Nd));
    }
  }
  HWY_ALIGN double p[16];
  hn::Store(a0, dd, p);
  hn::Store(a1, dd, p + Nd);
  if (K > 2) {
    hn::Store(a2, dd, p + 2 * Nd);
    hn::Store(a3, dd, p + 3 * Nd);
  }
  if (K > 4) {
    hn::Store(a4, dd, p + 4 * Nd);
    hn::Store(a5, dd, p + 5 * Nd);
    hn::Store(a6, dd, p + 6 * Nd);
    hn::Store(a7, dd, p + 7 * Nd);
  }
  for (uint64_t i = n16; i < n; ++i) {
    const float v = kAdd ? x[i] + add[i] : x[i];
    p[i & 15] += static_cast<double>(v) * v;
  }
  for (int j = 0; j < 8; ++j) p[j] += p[j + 8];
  for (int j = 0; j < 4; ++j) p[j] += p[j + 4];
  for (int j = 0; j < 2; ++j) p[j] += p[j + 2];
  return p[0] + p[1];
}
double SumSquaresImpl(const float* HWY_RESTRICT x, uint64_t n) { return SumSquaresT<false>(x, nullptr, n); }
double SumSquaresSumImpl(const float* HWY_RESTRICT x, const float* HWY_RESTRICT add, uint64_t n) {
  return SumSquaresT<true>(x, add, n);
}

// max |x| on the bit patterns: for non-NaN floats, |x| orders as its bits (unsigned), and
// every NaN is above +inf's 0x7F800000. Four independent unsigned-max chains; a block that holds
// a NaN (maximum bits above +inf) takes the scalar reference, which skips NaN.
template <bool kAdd>
float MaxAbsT(const float* HWY_RESTRICT x, const float* HWY_RESTRICT add, uint64_t n, bool* bad) {
  const DF df;
  const DU du;
  const size_t N = hn::Lanes(du);
  const auto absm = hn::Set(du, 0x7FFFFFFFu);
  auto m0 = hn::Zero(du), m1 = hn::Zero(du), m2 = hn::Zero(du), m3 = hn::Zero(du);
  // |x[i] (+ add[i])| as bits
  auto absbits = [&](uint64_t i) {
    auto f = hn::LoadU(df, x + i);
    if constexpr (kAdd) f = hn::Add(f, hn::LoadU(df, add + i));
    return hn::And(hn::BitCast(du, f), absm);
  };
  uint64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    m0 = hn::Max(m0, absbits(i));
    m1 = hn::Max(m1, absbits(i + N));
    m2 = hn::Max(m2, absbits(i + 2 * N));
    m3 = hn::Max(m3, absbits(i + 3 * N));
  }
  for (; i + N <= n; i += N) m0 = hn::Max(m0, absbits(i));
  uint32_t m = hn::GetLane(hn::MaxOfLanes(du, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3))));
  for (; i < n; ++i) {
    const float v = kAdd ? x[i] + add[i] : x[i];
    const uint32_t a = elem::float_bits(v) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  if (m > 0x7F800000u)  // some NaN
    return kAdd ? kern::max_abs_sum_scalar(x, add, n, bad) : kern::max_abs_scalar(x, n, bad);
  *bad = m == 0x7F800000u;
  return elem::bits_float(m);
}
float MaxAbsImpl(const float* HWY_RESTRICT x, uint64_t n, bool* bad) { return MaxAbsT<false>(x, nullptr, n, bad); }
float MaxAbsSumImpl(const float* HWY_RESTRICT x, const float* HWY_RESTRICT add, uint64_t n, bool* bad) {
  return MaxAbsT<true>(x, add, n, bad);
}

void ScaleByImpl(float* HWY_RESTRICT x, uint64_t n, float s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const auto vs = hn::Set(df, s);
  uint64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(hn::LoadU(df, x + i), vs), df, x + i);
  if (i < n) kern::scale_by_scalar(x + i, n - i, s);
}

// (No HWY_RESTRICT: out may be a or b.)
void AddPairImpl(const float* a, const float* b, uint64_t n, float* out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  uint64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto v0 = hn::Add(hn::LoadU(df, a + i), hn::LoadU(df, b + i));
    const auto v1 = hn::Add(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N));
    hn::StoreU(v0, df, out + i);
    hn::StoreU(v1, df, out + i + N);
  }
  for (; i + N <= n; i += N) hn::StoreU(hn::Add(hn::LoadU(df, a + i), hn::LoadU(df, b + i)), df, out + i);
  if (i < n) kern::add_pair_scalar(a + i, b + i, n - i, out + i);
}

// Bit packing. b = 4: two codes per byte with vectors; other widths: 8 codes <-> b bytes with
// BMI2 pext/pdep (AVX2 and later targets); b = 8: a copy. Tails go to the scalar reference, which
// starts on a byte boundary because 8 codes fill exactly b bytes.
#if HWY_TARGET <= HWY_AVX2 && HWY_ARCH_X86
#define THC_HAVE_PEXT 1
#else
#define THC_HAVE_PEXT 0
#endif

HWY_INLINE uint64_t ByteMask(int bits) { return 0x0101010101010101ull * ((1u << bits) - 1u); }

void PackBitsImpl(const uint8_t* HWY_RESTRICT codes, uint64_t n, int bits, uint8_t* HWY_RESTRICT out) {
  if (n == 0) return;
  if (bits == 8) {
    std::memcpy(out, codes, n);
    return;
  }
  uint64_t i = 0;
  if (bits == 4) {
    const hn::ScalableTag<int16_t> d16;  // i16 -> u8 demotion (u16 -> u8 is not in Highway 1.0)
    const hn::Rebind<uint8_t, decltype(d16)> d8;
    const size_t N = hn::Lanes(d16);
    const auto lo = hn::Set(d16, 0x000F), hi = hn::Set(d16, 0x00F0);
    for (; i + 2 * N <= n; i += 2 * N) {
      const auto v = hn::LoadU(d16, reinterpret_cast<const int16_t*>(codes + i));
      const auto b = hn::Or(hn::And(v, lo), hn::And(hn::ShiftRight<4>(v), hi));  // 0..255
      hn::StoreU(hn::DemoteTo(d8, b), d8, out + i / 2);
    }
  }
#if THC_HAVE_AVX512
  else if constexpr (sizeof(hn::Vec<DF>{}.raw) == 64) {
    // 64 codes -> 8 b bytes per step (b = 1..7, codes < 2^b): pairs of bytes to 2b-bit words
    // (multiply-add by 1 and 2^b), pairs of words to 4b-bit dwords (by 1 and 2^2b), pairs of
    // dwords to 8b-bit qwords (the high dword shifted down next to the low one): each qword then
    // holds 8 codes in its low b bytes, LSB-first as elem.h's bit order. A byte shuffle gathers
    // the 2b bytes of each 128-bit lane at its start, and the four lanes are stored 2b bytes apart
    // as 16-byte stores, each overwriting the previous one's tail; the last store's tail stays
    // inside this call's full output bytes (the pext loop below takes the rest).
    const __m512i mul1 = _mm512_set1_epi16(static_cast<short>((1 << bits) << 8 | 1));
    const __m512i mul2 = _mm512_set1_epi32((1 << (2 * bits)) << 16 | 1);
    const __m512i lo32 = _mm512_set1_epi64(0xFFFFFFFFll);
    const __m512i sh = _mm512_set1_epi64(4 * bits);
    const __m512i shuf = _mm512_broadcast_i32x4(PackLaneShuffle(bits));
    const uint64_t full = n / 8 * static_cast<uint64_t>(bits);
    const uint64_t b = static_cast<uint64_t>(bits);
    for (; i + 64 <= n && i / 8 * b + 6 * b + 16 <= full; i += 64) {
      const __m512i c = _mm512_loadu_si512(codes + i);
      const __m512i d = _mm512_madd_epi16(_mm512_maddubs_epi16(mul1, c), mul2);
      const __m512i q = _mm512_or_si512(_mm512_and_si512(d, lo32), _mm512_sllv_epi64(_mm512_srli_epi64(d, 32), sh));
      const __m512i v = _mm512_shuffle_epi8(q, shuf);
      uint8_t* o = out + i / 8 * b;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm512_castsi512_si128(v));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * b), _mm512_extracti32x4_epi32(v, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 4 * b), _mm512_extracti32x4_epi32(v, 2));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 6 * b), _mm512_extracti32x4_epi32(v, 3));
    }
  }
#endif
#if THC_HAVE_PEXT
  if (bits != 4) {
    const uint64_t mask = ByteMask(bits);
    // 8 codes -> `bits` bytes, stored as a whole 8-byte word while that stays inside this call's
    // full output bytes (the word's zero upper bytes are overwritten by the next groups).
    const uint64_t full = n / 8 * static_cast<uint64_t>(bits);
    for (; i + 8 <= n && i / 8 * bits + 8 <= full; i += 8) {
      uint64_t w;
      std::memcpy(&w, codes + i, 8);
      const uint64_t p = _pext_u64(w, mask);
      std::memcpy(out + i / 8 * bits, &p, 8);
    }
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, codes + i, 8);
      const uint64_t p = _pext_u64(w, mask);
      std::memcpy(out + i / 8 * bits, &p, static_cast<size_t>(bits));
    }
  }
#endif
  if (i < n) kern::pack_bits_scalar(codes + i, n - i, bits, out + i / 8 * bits);
}

void UnpackBitsImpl(const uint8_t* HWY_RESTRICT packed, uint64_t n, int bits, uint8_t* HWY_RESTRICT codes) {
  if (n == 0) return;
  if (bits == 8) {
    std::memcpy(codes, packed, n);
    return;
  }
  uint64_t i = 0;
  if (bits == 4) {
    const hn::ScalableTag<uint16_t> d16;
    const hn::Rebind<uint8_t, decltype(d16)> d8;
    const size_t N = hn::Lanes(d16);
    const auto lo = hn::Set(d16, 0x000F), hi = hn::Set(d16, 0x0F00);
    for (; i + 2 * N <= n; i += 2 * N) {
      const auto b = hn::PromoteTo(d16, hn::LoadU(d8, packed + i / 2));
      const auto v = hn::Or(hn::And(b, lo), hn::And(hn::ShiftLeft<4>(b), hi));
      hn::StoreU(v, d16, reinterpret_cast<uint16_t*>(codes + i));
    }
  }
#if THC_HAVE_PEXT
  else {
    const uint64_t mask = ByteMask(bits);
    // Whole 8-byte loads while they stay inside the full input bytes (pdep ignores the rest).
    const uint64_t full = n / 8 * static_cast<uint64_t>(bits);
    for (; i + 8 <= n && i / 8 * bits + 8 <= full; i += 8) {
      uint64_t p;
      std::memcpy(&p, packed + i / 8 * bits, 8);
      const uint64_t w = _pdep_u64(p, mask);
      std::memcpy(codes + i, &w, 8);
    }
    for (; i + 8 <= n; i += 8) {
      uint64_t p = 0;
      std::memcpy(&p, packed + i / 8 * bits, static_cast<size_t>(bits));
      const uint64_t w = _pdep_u64(p, mask);
      std::memcpy(codes + i, &w, 8);
    }
  }
#endif
  if (i < n) kern::unpack_bits_scalar(packed + i / 8 * bits, n - i, bits, codes + i);
}
#undef THC_HAVE_PEXT

#endif  // vector targets

}  // namespace thc::codec::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace thc::codec::kern {

static_assert(sizeof(elem::ThcCell) == 16 && offsetof(elem::ThcCell, lo_val) == 0 &&
                  offsetof(elem::ThcCell, hi_val) == 4 && offsetof(elem::ThcCell, inv_span) == 8 &&
                  offsetof(elem::ThcCell, lo_idx) == 12 && offsetof(elem::ThcCell, hi_idx) == 13,
              "the SIMD THC rounding gathers ThcCell fields as 32-bit words 4k + {0, 1, 2, 3}");

HWY_EXPORT(KernelTargetImpl);
HWY_EXPORT(PrescaleSignsImpl);
HWY_EXPORT(SignsPostscaleImpl);
HWY_EXPORT(ThcQuantizeImpl);
HWY_EXPORT(NatQuantizeImpl);
HWY_EXPORT(ThcDequantImpl);
HWY_EXPORT(NatDequantImpl);
HWY_EXPORT(StoreValuesImpl);
HWY_EXPORT(SumSquaresImpl);
HWY_EXPORT(MaxAbsImpl);
HWY_EXPORT(SumSquaresSumImpl);
HWY_EXPORT(MaxAbsSumImpl);
HWY_EXPORT(ScaleByImpl);
HWY_EXPORT(AddPairImpl);
HWY_EXPORT(PackBitsImpl);
HWY_EXPORT(UnpackBitsImpl);
HWY_EXPORT(LookupAdd4U8Impl);
HWY_EXPORT(LookupAdd32U16Impl);

const char* kernel_target() { return HWY_DYNAMIC_DISPATCH(KernelTargetImpl)(); }

namespace {
std::atomic<int> g_table_lookup{static_cast<int>(TableLookup::kAuto)};
bool cpu_is_amd() {
#if HWY_ARCH_X86
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}
}  // namespace

void set_avx2_table_lookup(TableLookup mode) { g_table_lookup.store(static_cast<int>(mode)); }
bool avx2_table_in_registers() {
  static const bool amd = cpu_is_amd();
  switch (static_cast<TableLookup>(g_table_lookup.load(std::memory_order_relaxed))) {
    case TableLookup::kGather: return false;
    case TableLookup::kRegisters: return true;
    default: return amd;
  }
}

void prescale_signs(const float* x, uint64_t elems, uint64_t wire, int e, const rng::Stream& shared,
                    uint64_t blk, float* work) {
  HWY_DYNAMIC_DISPATCH(PrescaleSignsImpl)(x, elems, wire, e, shared, blk, work);
}
void signs_postscale(const float* work, uint64_t m, int e, const rng::Stream& shared, uint64_t blk,
                     const float* sub, float* out) {
  HWY_DYNAMIC_DISPATCH(SignsPostscaleImpl)(work, m, e, shared, blk, sub, out);
}
void thc_quantize(const float* work, uint64_t n, float enc, const ThcTables& tb, const rng::Stream& own,
                  uint64_t blk, uint8_t* idx, int32_t* val, const float* prefetch) {
  HWY_DYNAMIC_DISPATCH(ThcQuantizeImpl)(work, n, enc, tb, own, blk, idx, val, prefetch);
}
void nat_quantize(const float* x, uint64_t n, int e, float enc, int levels, int bits, const rng::Stream& own,
                  uint64_t blk, uint8_t* idx, int32_t* val, uint8_t* packed, const float* add, float* staged) {
  HWY_DYNAMIC_DISPATCH(NatQuantizeImpl)(x, n, e, enc, levels, bits, own, blk, idx, val, packed, add, staged);
}
void thc_dequant(IntType t, const void* sums, uint64_t off, uint64_t n, float half, float step, float f,
                 float* work) {
  HWY_DYNAMIC_DISPATCH(ThcDequantImpl)(t, sums, off, n, half, step, f, work);
}
void nat_dequant(IntType t, const void* sums, uint64_t off, uint64_t n, float f, int e, const float* sub,
                 float* out, bool stream) {
  HWY_DYNAMIC_DISPATCH(NatDequantImpl)(t, sums, off, n, f, e, sub, out, stream);
}
void store_values(IntType t, void* base, uint64_t off, const int32_t* v, uint64_t n) {
  HWY_DYNAMIC_DISPATCH(StoreValuesImpl)(t, base, off, v, n);
}
double sum_squares(const float* x, uint64_t n) { return HWY_DYNAMIC_DISPATCH(SumSquaresImpl)(x, n); }
float max_abs(const float* x, uint64_t n, bool* bad) { return HWY_DYNAMIC_DISPATCH(MaxAbsImpl)(x, n, bad); }
double sum_squares_sum(const float* x, const float* add, uint64_t n) {
  return HWY_DYNAMIC_DISPATCH(SumSquaresSumImpl)(x, add, n);
}
float max_abs_sum(const float* x, const float* add, uint64_t n, bool* bad) {
  return HWY_DYNAMIC_DISPATCH(MaxAbsSumImpl)(x, add, n, bad);
}
void scale_by(float* x, uint64_t n, float s) { HWY_DYNAMIC_DISPATCH(ScaleByImpl)(x, n, s); }
void add_pair(const float* a, const float* b, uint64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(AddPairImpl)(a, b, n, out);
}
void pack_bits_simd(const uint8_t* codes, uint64_t n, int bits, uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(PackBitsImpl)(codes, n, bits, out);
}
void unpack_bits_simd(const uint8_t* packed, uint64_t n, int bits, uint8_t* codes) {
  HWY_DYNAMIC_DISPATCH(UnpackBitsImpl)(packed, n, bits, codes);
}
void lookup_add4_u8(const uint8_t* table, const uint8_t* packed, uint64_t n, uint8_t* d) {
  HWY_DYNAMIC_DISPATCH(LookupAdd4U8Impl)(table, packed, n, d);
}
void lookup_add32_u16(const uint16_t* table, const uint8_t* codes, uint64_t n, uint16_t* d) {
  HWY_DYNAMIC_DISPATCH(LookupAdd32U16Impl)(table, codes, n, d);
}

// ---------------------------------------------------------------------------------------------
// Scalar references: the per-element code of elem.h, element by element.

namespace {
// Sign bit (bit 31) of element j of block blk's RHT diagonal; r holds the draw of group j / 128.
inline uint32_t sign_bit(const r123::Philox4x32::ctr_type& r, uint64_t j) {
  return ((r.v[(j & 127) >> 5] >> (j & 31)) & 1u) << 31;
}
}  // namespace

void prescale_signs_scalar(const float* x, uint64_t elems, uint64_t wire, int e, const rng::Stream& shared,
                           uint64_t blk, float* work) {
  for (uint64_t i = 0; i < elems; ++i) work[i] = elem::scale2(x[i], e);
  for (uint64_t i = elems; i < wire; ++i) work[i] = 0.0f;
  apply_signs_scalar(work, wire, shared, blk);
}

void signs_postscale_scalar(const float* work, uint64_t m, int e, const rng::Stream& shared, uint64_t blk,
                            const float* sub, float* out) {
  const auto key = rng::make_key(shared);
  r123::Philox4x32::ctr_type r{};
  for (uint64_t i = 0; i < m; ++i) {
    if ((i & 127) == 0) r = rng::draw4(key, shared, rng::kPurposeSigns, blk, static_cast<uint32_t>(i / 128));
    const float v = elem::scale2(elem::bits_float(elem::float_bits(work[i]) ^ sign_bit(r, i)), e);
    out[i] = sub ? sub[i] - v : v;
  }
}

void thc_quantize_scalar(const float* work, uint64_t n, float enc, const ThcTables& tb, const rng::Stream& own,
                         uint64_t blk, uint8_t* idx, int32_t* val) {
  const auto key = rng::make_key(own);
  for (uint64_t i = 0; i < n; i += rng::kRoundGroup) {
    const auto r = rng::draw4(key, own, rng::kPurposeRound, blk, static_cast<uint32_t>(i / rng::kRoundGroup));
    for (uint32_t k = 0; k < rng::kRoundGroup && i + k < n; ++k) {
      const float v = elem::thc_grid(work[i + k] * enc, tb.t, tb.g_over_2t, tb.gf);
      uint8_t z;
      int32_t q;
      elem::thc_round(v, rng::round_unit(rng::round_bits(r, k)), tb.cells, tb.g, &z, &q);
      if (idx) idx[i + k] = z;
      if (val) val[i + k] = q;
    }
  }
}

void nat_quantize_scalar(const float* x, uint64_t n, int e, float enc, int levels, int bits,
                         const rng::Stream& own, uint64_t blk, uint8_t* idx, int32_t* val) {
  const auto key = rng::make_key(own);
  for (uint64_t i = 0; i < n; i += rng::kRoundGroup) {
    const auto r = rng::draw4(key, own, rng::kPurposeRound, blk, static_cast<uint32_t>(i / rng::kRoundGroup));
    for (uint32_t k = 0; k < rng::kRoundGroup && i + k < n; ++k) {
      const float a = x[i + k];
      const float rr = elem::scale2(std::fabs(a), e) * enc;
      uint8_t z;
      int32_t q;
      elem::nat_round(rr, a < 0, rng::round_unit(rng::round_bits(r, k)), levels, bits, &z, &q);
      if (idx) idx[i + k] = z;
      if (val) val[i + k] = q;
    }
  }
}

namespace {
template <typename T>
void thc_dequant_t(const T* s, uint64_t n, float half, float step, float f, float* w) {
  for (uint64_t i = 0; i < n; ++i) w[i] = elem::thc_decode_sum(static_cast<float>(s[i]), half, step) * f;
}
template <typename T>
void nat_dequant_t(const T* s, uint64_t n, float f, int e, const float* sub, float* out) {
  for (uint64_t i = 0; i < n; ++i) {
    const float v = elem::scale2(static_cast<float>(s[i]) * f, e);
    out[i] = sub ? sub[i] - v : v;
  }
}
template <typename T>
void store_t(void* base, uint64_t off, const int32_t* v, uint64_t n) {
  T* p = static_cast<T*>(base) + off;
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<T>(v[i]);
}
}  // namespace

void thc_dequant_scalar(IntType t, const void* sums, uint64_t off, uint64_t n, float half, float step, float f,
                        float* work) {
  switch (t) {
    case IntType::kU8: return thc_dequant_t(static_cast<const uint8_t*>(sums) + off, n, half, step, f, work);
    case IntType::kU16: return thc_dequant_t(static_cast<const uint16_t*>(sums) + off, n, half, step, f, work);
    case IntType::kU32: return thc_dequant_t(static_cast<const uint32_t*>(sums) + off, n, half, step, f, work);
    case IntType::kI8: return thc_dequant_t(static_cast<const int8_t*>(sums) + off, n, half, step, f, work);
    case IntType::kI16: return thc_dequant_t(static_cast<const int16_t*>(sums) + off, n, half, step, f, work);
    case IntType::kI32: return thc_dequant_t(static_cast<const int32_t*>(sums) + off, n, half, step, f, work);
  }
}

void nat_dequant_scalar(IntType t, const void* sums, uint64_t off, uint64_t n, float f, int e, const float* sub,
                        float* out) {
  switch (t) {
    case IntType::kU8: return nat_dequant_t(static_cast<const uint8_t*>(sums) + off, n, f, e, sub, out);
    case IntType::kU16: return nat_dequant_t(static_cast<const uint16_t*>(sums) + off, n, f, e, sub, out);
    case IntType::kU32: return nat_dequant_t(static_cast<const uint32_t*>(sums) + off, n, f, e, sub, out);
    case IntType::kI8: return nat_dequant_t(static_cast<const int8_t*>(sums) + off, n, f, e, sub, out);
    case IntType::kI16: return nat_dequant_t(static_cast<const int16_t*>(sums) + off, n, f, e, sub, out);
    case IntType::kI32: return nat_dequant_t(static_cast<const int32_t*>(sums) + off, n, f, e, sub, out);
  }
}

void lookup_add4_u8_scalar(const uint8_t* table, const uint8_t* packed, uint64_t n, uint8_t* d) {
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t b = packed[i / 2];
    d[i] = static_cast<uint8_t>(d[i] + table[(i & 1) ? (b >> 4) : (b & 0xF)]);
  }
}

void lookup_add32_u16_scalar(const uint16_t* table, const uint8_t* codes, uint64_t n, uint16_t* d) {
  for (uint64_t i = 0; i < n; ++i) d[i] = static_cast<uint16_t>(d[i] + table[codes[i]]);
}

void store_values_scalar(IntType t, void* base, uint64_t off, const int32_t* v, uint64_t n) {
  switch (t) {
    case IntType::kU8: return store_t<uint8_t>(base, off, v, n);
    case IntType::kU16: return store_t<uint16_t>(base, off, v, n);
    case IntType::kU32: return store_t<uint32_t>(base, off, v, n);
    case IntType::kI8: return store_t<int8_t>(base, off, v, n);
    case IntType::kI16: return store_t<int16_t>(base, off, v, n);
    case IntType::kI32: return store_t<int32_t>(base, off, v, n);
  }
}

double sum_squares_scalar(const float* x, uint64_t n) {
  double p[16] = {};
  for (uint64_t i = 0; i < n; ++i) p[i & 15] += static_cast<double>(x[i]) * x[i];
  for (int j = 0; j < 8; ++j) p[j] += p[j + 8];
  for (int j = 0; j < 4; ++j) p[j] += p[j + 4];
  for (int j = 0; j < 2; ++j) p[j] += p[j + 2];
  return p[0] + p[1];
}

void scale_by_scalar(float* x, uint64_t n, float s) {
  for (uint64_t i = 0; i < n; ++i) x[i] *= s;
}
void add_pair_scalar(const float* a, const float* b, uint64_t n, float* out) {
  for (uint64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

float max_abs_scalar(const float* x, uint64_t n, bool* bad) {
  float mx = 0;
  bool b = false;
  for (uint64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    b |= !(a <= 3.402823466e38f);
    mx = a > mx ? a : mx;
  }
  *bad = b;
  return mx;
}

double sum_squares_sum_scalar(const float* x, const float* add, uint64_t n) {
  double p[16] = {};
  for (uint64_t i = 0; i < n; ++i) {
    const float v = x[i] + add[i];
    p[i & 15] += static_cast<double>(v) * v;
  }
  for (int j = 0; j < 8; ++j) p[j] += p[j + 8];
  for (int j = 0; j < 4; ++j) p[j] += p[j + 4];
  for (int j = 0; j < 2; ++j) p[j] += p[j + 2];
  return p[0] + p[1];
}

float max_abs_sum_scalar(const float* x, const float* add, uint64_t n, bool* bad) {
  float mx = 0;
  bool b = false;
  for (uint64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i] + add[i]);
    b |= !(a <= 3.402823466e38f);
    mx = a > mx ? a : mx;
  }
  *bad = b;
  return mx;
}

void pack_bits_scalar(const uint8_t* codes, uint64_t n, int bits, uint8_t* out) {
  if (n == 0) return;
  if (bits == 8) {
    std::memcpy(out, codes, n);
    return;
  }
  const uint64_t nbytes = (n * bits + 7) / 8;
  std::memset(out, 0, nbytes);
  uint64_t acc = 0;
  int nacc = 0;
  uint64_t o = 0;
  for (uint64_t i = 0; i < n; ++i) {
    acc |= static_cast<uint64_t>(codes[i]) << nacc;
    nacc += bits;
    while (nacc >= 8) {
      out[o++] = static_cast<uint8_t>(acc);
      acc >>= 8;
      nacc -= 8;
    }
  }
  if (nacc > 0) out[o] = static_cast<uint8_t>(acc);
}

void unpack_bits_scalar(const uint8_t* packed, uint64_t n, int bits, uint8_t* codes) {
  if (n == 0) return;
  if (bits == 8) {
    std::memcpy(codes, packed, n);
    return;
  }
  const uint32_t mask = (1u << bits) - 1u;
  uint64_t acc = 0;
  int nacc = 0;
  uint64_t in = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (nacc < bits) {
      acc |= static_cast<uint64_t>(packed[in++]) << nacc;
      nacc += 8;
    }
    codes[i] = static_cast<uint8_t>(acc & mask);
    acc >>= bits;
    nacc -= bits;
  }
}

}  // namespace thc::codec::kern
#endif  // HWY_ONCE
