// THC stochastic rounding of 16 rotated values in AVX-512 registers, with the cell table in
// registers (g <= 31): shared by the rounding kernel (codec_simd.cc) and the fused encode
// (rht.cc: the rounding inside the RHT's last pass). Bit-identical to elem::thc_grid and
// elem::thc_round with the 16-bit draws of philox.h.
//
// Private to collectives/codec; included by files that use hwy/foreach_target.h (per-target
// include guard, as Highway's own -inl.h headers).
#if defined(THC_CODEC_THC_ROUND_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef THC_CODEC_THC_ROUND_INL_H_
#undef THC_CODEC_THC_ROUND_INL_H_
#else
#define THC_CODEC_THC_ROUND_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include "collectives/codec/codec_simd.h"
#include "collectives/codec/elem.h"
#include "hwy/highway.h"
#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace thc::codec::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// n floats at p into every cache level, one prefetch per cache line (prefetches never fault).
// prefetcht0, not t1 (towards L2): with t1 the THC encode's first pass still waited for memory
// on the Zen 4 VM (4 KiB pages): ThcEncodePhase phase 1 4.5-4.7 -> 5.0-5.1 GB/s and the whole
// encode 3.6-3.9 -> 4.0-4.1 GB/s with t0 (codec_bench, three interleaved pairs).
HWY_INLINE void PrefetchAhead(const float* p, size_t n) {
  for (size_t k = 0; k < n; k += 16) __builtin_prefetch(p + k, 0, 3);
}

#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128

// The cell table as one word per cell, lo_val | hi_val << 8 | lo_idx << 16 | hi_idx << 24
// (g <= 255: every field fits a byte), and inv_span * 2^16: the rounding gathers two words per
// element instead of one per field (three with packed indices, four with values as well). A
// gather is 5 uops on Intel cores since Skylake but about 40 microcoded ones on AMD's Zen 2 and
// Zen 3 (uops.info), the AVX2 hosts most likely to run this path. inv16 = inv_span * 2^16 is
// exact, and so is the scaling of the product by it (see ThcRegRound).
struct ThcWordTables {
  HWY_ALIGN uint32_t word[256];
  HWY_ALIGN float inv16[256];
  static bool Usable(const kern::ThcTables& tb) { return tb.g <= 255 && tb.t >= 1e-20f; }
  explicit ThcWordTables(const kern::ThcTables& tb) {
    for (int k = 0; k <= tb.g; ++k) {  // entry g: a copy of cell g - 1 (ThcWordRound)
      const elem::ThcCell& c = tb.cells[k < tb.g ? k : tb.g - 1];
      word[k] = static_cast<uint32_t>(c.lo_val) | static_cast<uint32_t>(c.hi_val) << 8 |
                static_cast<uint32_t>(c.lo_idx) << 16 | static_cast<uint32_t>(c.hi_idx) << 24;
      inv16[k] = c.inv_span * 65536.0f;
    }
  }
};

// elem::thc_grid and elem::thc_round of one vector of rotated values w (times enc) with the
// 16-bit draws j (u32 lanes): NaN taken as 0 by a mask (Min/Max's NaN rules differ between
// targets), y clamped to [-t, t]; v = (y + t) g/(2t) >= +0 then needs no clamp to g, nor the cell
// k to [0, g - 1]: v can exceed g by an ulp at most, k = g reads the copy of cell g - 1, and
// every draw goes up there either way, to the same code and value (ThcRegRound::Round).
// Returns the codes (u32 lanes); *value (optional) the integer values.
template <class DF>
struct ThcWordRound {
  using DI = hn::RebindToSigned<DF>;
  using DU = hn::RebindToUnsigned<DF>;
  using VF = hn::Vec<DF>;
  using VI = hn::Vec<DI>;
  const ThcWordTables& tab;
  VF enc, t, negt, g2t, half;
  VI ff;
  ThcWordRound(const ThcWordTables& tables, const kern::ThcTables& tb, float e)
      : tab(tables),
        enc(hn::Set(DF(), e)),
        t(hn::Set(DF(), tb.t)),
        negt(hn::Set(DF(), -tb.t)),
        g2t(hn::Set(DF(), tb.g_over_2t)),
        half(hn::Set(DF(), 0.5f)),
        ff(hn::Set(DI(), 0xFF)) {
    InitRegs(tb);
  }
#if HWY_TARGET == HWY_AVX2
  // g <= 31, where kern::avx2_table_in_registers() says so: both tables in four ymm registers
  // each, entry k taken by vpermd / vpermps (k's low three bits) from each quarter and the
  // quarter chosen by blends on the masks k > 7, k > 15 and k > 23, which the two tables share:
  // eight permutes, six blends and three compares instead of two gathers (codec_simd.h,
  // TableLookup). Measured on a Zen 3 EPYC: THC encode +9-13 % (README, "AMD without AVX-512").
  static constexpr bool kRegCapable = sizeof(VF{}.raw) == 32;
  bool regs = false;
  __m256i wq[4];
  __m256 iq[4];
  HWY_INLINE void InitRegs(const kern::ThcTables& tb) {
    if (!kRegCapable || tb.g > 31 || !kern::avx2_table_in_registers()) return;
    HWY_ALIGN uint32_t wt[32];
    HWY_ALIGN float it[32];
    for (int k = 0; k < 32; ++k) {
      const int c = k <= tb.g ? k : tb.g;  // entries above g: the copy at g (cell g - 1)
      wt[k] = tab.word[c];
      it[k] = tab.inv16[c];
    }
    for (int q = 0; q < 4; ++q) {
      wq[q] = _mm256_load_si256(reinterpret_cast<const __m256i*>(wt + 8 * q));
      iq[q] = _mm256_load_ps(it + 8 * q);
    }
    regs = true;
  }
  HWY_INLINE void LookupRegs(__m256i k, __m256i* word, __m256* inv) const {
    const __m256 m8 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, _mm256_set1_epi32(7)));
    const __m256 m16 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, _mm256_set1_epi32(15)));
    const __m256 m24 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, _mm256_set1_epi32(23)));
    auto pw = [&](int q) { return _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(wq[q], k)); };
    auto pi = [&](int q) { return _mm256_permutevar8x32_ps(iq[q], k); };
    // quarters 0/1 by k > 7, 2/3 by k > 23, then the halves by k > 15
    *word = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_blendv_ps(pw(0), pw(1), m8), _mm256_blendv_ps(pw(2), pw(3), m24), m16));
    *inv = _mm256_blendv_ps(_mm256_blendv_ps(pi(0), pi(1), m8), _mm256_blendv_ps(pi(2), pi(3), m24), m16);
  }
#else
  HWY_INLINE void InitRegs(const kern::ThcTables&) {}
#endif
  // floor(v) of v in [0, 2^31): the plain truncating conversion (hn::ConvertTo adds a fix-up for
  // out-of-range inputs, four more instructions on AVX2).
  HWY_INLINE static VI Floor(VF v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
    if constexpr (sizeof(VF{}.raw) == 32) {
      return VI{_mm256_cvttps_epi32(v.raw)};
    } else if constexpr (sizeof(VF{}.raw) == 16) {
      return VI{_mm_cvttps_epi32(v.raw)};
    }
#endif
    return hn::ConvertTo(DI(), v);
  }
  // Cell k's word and inverse span: from registers where InitRegs put them, else gathered.
  HWY_INLINE void Lookup(VI k, VI* word, VF* inv) const {
#if HWY_TARGET == HWY_AVX2
    if constexpr (kRegCapable) {
      if (regs) return LookupRegs(k.raw, &word->raw, &inv->raw);
    }
#endif
    *word = hn::GatherIndex(DI(), reinterpret_cast<const int32_t*>(tab.word), k);
    *inv = hn::GatherIndex(DF(), tab.inv16, k);
  }
  HWY_INLINE VI Round(VF w, hn::Vec<DU> j, VI* value) const {
    const DF d;
    const DI di;
    auto y = hn::Mul(w, enc);
    y = hn::IfThenElseZero(hn::Eq(y, y), y);
    y = hn::Max(negt, hn::Min(t, y));
    const VF v = hn::Mul(hn::Add(y, t), g2t);
    const VI k = Floor(v);  // v in [0, g + 1 ulp]: truncation = floor
    VI word;
    VF inv;
    Lookup(k, &word, &inv);
    const VF p16 = hn::Mul(hn::Sub(v, hn::ConvertTo(d, hn::And(word, ff))), inv);
    const VF u16 = hn::Add(hn::ConvertTo(d, hn::BitCast(di, j)), half);
    // Going up takes the upper byte of both pairs: the word shifted down by 8 (a variable shift,
    // cheaper than a blend on AVX2), hi_val into bits 0..7, hi_idx into 16..23.
    const DU du;
    const hn::Vec<DU> sh = hn::And(hn::VecFromMask(du, hn::RebindMask(du, hn::Lt(u16, p16))), hn::Set(du, 8u));
    const VI sel = hn::BitCast(di, hn::Shr(hn::BitCast(du, word), sh));
    if (value) *value = hn::And(sel, ff);
    return hn::And(hn::ShiftRight<16>(sel), ff);
  }
};

#endif  // vector targets

#if HWY_TARGET <= HWY_AVX3

// The cell table fits two zmm registers per field: lookups are vpermt2d/ps, not gathers.
// Entries g..31 repeat cell g - 1, which covers k = g (v == g) as thc_round's clamp does.
// inv16 = inv_span * 2^16: u < p  <=>  j + 1/2 < (v - lo) * inv16, both sides scaled exactly by
// 2^16 (v - lo is 0 or far above the denormal range).
struct ThcRegRound {
  __m512 lf0, lf1, iv0, iv1, half, t, negt, g2t, enc;
  __m512i li0, li1, hi0, hi1, pr0, pr1;

  static bool Usable(const kern::ThcTables& tb) { return tb.g <= 31 && tb.t >= 1e-20f; }

  ThcRegRound(const kern::ThcTables& tb, float e) {
    HWY_ALIGN float lo_f[32], inv16[32];
    HWY_ALIGN int32_t lo_i[32], hi_i[32], pair[32];
    for (int k = 0; k < 32; ++k) {
      const elem::ThcCell& c = tb.cells[k < tb.g ? k : tb.g - 1];
      lo_f[k] = static_cast<float>(c.lo_val);
      inv16[k] = c.inv_span * 65536.0f;
      lo_i[k] = c.lo_val;
      hi_i[k] = c.hi_val;
      pair[k] = c.lo_idx | (c.hi_idx << 8);
    }
    lf0 = _mm512_load_ps(lo_f);
    lf1 = _mm512_load_ps(lo_f + 16);
    iv0 = _mm512_load_ps(inv16);
    iv1 = _mm512_load_ps(inv16 + 16);
    li0 = _mm512_load_si512(lo_i);
    li1 = _mm512_load_si512(lo_i + 16);
    hi0 = _mm512_load_si512(hi_i);
    hi1 = _mm512_load_si512(hi_i + 16);
    pr0 = _mm512_load_si512(pair);
    pr1 = _mm512_load_si512(pair + 16);
    half = _mm512_set1_ps(0.5f);
    t = _mm512_set1_ps(tb.t);
    negt = _mm512_set1_ps(-tb.t);
    g2t = _mm512_set1_ps(tb.g_over_2t);
    enc = _mm512_set1_ps(e);
  }

  // thc_grid(w * enc) in five operations: NaN -> 0 by the zeroing mask of the Min, and no Min
  // with g at the end. Without that clamp v = (t + t) * g/(2t) can round to just above g (at
  // most g + 1 ulp, still below 32): k = g then reads the copy of cell g - 1, as thc_round's
  // clamp of k does, and p16 = (v - lo) * inv16 only grows, while with the clamp it is already
  // at least 65535.75 (v - lo = the cell's span, inv16 = 2^16 / span within an ulp): every draw
  // goes up either way, to the same hi code and value. Then the cell k and whether the draws j
  // (u32 lanes) go up.
  HWY_INLINE void Round(__m512 w, __m512i j, __m512i* k, __mmask16* up) const {
    const __m512 y = _mm512_mul_ps(w, enc);
    const __m512 yc = _mm512_max_ps(_mm512_maskz_min_ps(_mm512_cmp_ps_mask(y, y, _CMP_ORD_Q), y, t), negt);
    const __m512 v = _mm512_mul_ps(_mm512_add_ps(yc, t), g2t);
    *k = _mm512_cvttps_epi32(v);  // v in [0, g + 1 ulp]: truncation = floor
    const __m512 lo = _mm512_permutex2var_ps(lf0, *k, lf1);
    const __m512 inv = _mm512_permutex2var_ps(iv0, *k, iv1);
    const __m512 p16 = _mm512_mul_ps(_mm512_sub_ps(v, lo), inv);
    const __m512 u16 = _mm512_add_ps(_mm512_cvtepi32_ps(j), half);
    *up = _mm512_cmp_ps_mask(u16, p16, _CMP_LT_OQ);
  }
  HWY_INLINE __m512i Value(__m512i k, __mmask16 up) const {
    return _mm512_mask_blend_epi32(up, _mm512_permutex2var_epi32(li0, k, li1), _mm512_permutex2var_epi32(hi0, k, hi1));
  }
  // The code in the low byte of each u32 lane (the bytes above are not cleared).
  HWY_INLINE __m512i Code(__m512i k, __mmask16 up) const {
    const __m512i pr = _mm512_permutex2var_epi32(pr0, k, pr1);
    return _mm512_mask_srli_epi32(pr, up, pr, 8);
  }
};

// 16 codes below 16 (Code(): low bytes) -> 8 bytes, element 2i in the low nibble of byte i
// (elem.h's bit order for b = 4): each 64-bit lane gets its odd code shifted down next to the
// even one, then the low byte of each lane.
HWY_INLINE void StorePacked4(__m512i code, uint8_t* HWY_RESTRICT p) {
  const __m512i both = _mm512_or_si512(code, _mm512_srli_epi64(code, 28));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm512_cvtepi64_epi8(both));
}

#endif  // HWY_TARGET <= HWY_AVX3

}  // namespace thc::codec::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
