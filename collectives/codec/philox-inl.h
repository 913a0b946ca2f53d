// Philox4x32-10 on SIMD lanes (Highway), bit-identical to r123::Philox4x32 as used by philox.h:
// lane j computes the counter whose c0 is (first group + j); c1..c3 and the key are those of
// rng::make_ctr / rng::make_key, so the key and counter layout stay defined in philox.h only.
//
// Private to collectives/codec; included by files that use hwy/foreach_target.h (per-target
// include guard, as Highway's own -inl.h headers).
#if defined(THC_CODEC_PHILOX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef THC_CODEC_PHILOX_INL_H_
#undef THC_CODEC_PHILOX_INL_H_
#else
#define THC_CODEC_PHILOX_INL_H_
#endif

#include <cstdint>

#include "collectives/codec/philox.h"
#include "hwy/highway.h"
#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace thc::codec::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;

// The constant parts of one (key, counter) family: everything but c0.
struct PhiloxFamily {
  uint32_t k0, k1;
  uint32_t c1, c2, c3;
  uint32_t ks0[10], ks1[10];  // key schedule: the key of each round
  // Only word 0 of the counter varies within a family, so some words of the first rounds are
  // family constants (Philox10Q2): round 0 computes c2 * M1 and round 1 the product by M0 of
  // round 0's first word from constants alone. What is left of them:
  uint32_t r0c;  // round 0: word 2 = hi(c0 M0) ^ r0c
  uint32_t r1a;  // round 1: word 0 = hi(w2 M1) ^ r1a
  uint32_t r1c;  // round 1: word 2 = lo(c0 M0) ^ r1c; its word 3 is r1e
  uint32_t r1e;
  uint32_t r2c;  // round 2: word 2 = hi(w0 M0) ^ r2c (r1e ^ the round key)
};

HWY_INLINE PhiloxFamily MakeFamily(const rng::Stream& s, uint32_t purpose, uint64_t block) {
  const auto key = rng::make_key(s);
  const auto ctr = rng::make_ctr(s, purpose, block, 0);
  PhiloxFamily f{key.v[0], key.v[1], ctr.v[1], ctr.v[2], ctr.v[3], {}, {}, 0, 0, 0, 0, 0};
  for (int r = 0; r < 10; ++r) {  // the key bump between rounds (PHILOX_W32_0 / _1)
    f.ks0[r] = f.k0 + static_cast<uint32_t>(r) * 0x9E3779B9u;
    f.ks1[r] = f.k1 + static_cast<uint32_t>(r) * 0xBB67AE85u;
  }
  // Round 0: (hi1, lo1) = c2 * M1 gives words 0 and 1 of its output.
  const uint64_t p1 = uint64_t{f.c2} * kPhiloxM1;
  const uint32_t a1 = static_cast<uint32_t>(p1 >> 32) ^ f.c1 ^ f.ks0[0];
  const uint32_t b1 = static_cast<uint32_t>(p1);
  f.r0c = f.c3 ^ f.ks1[0];
  // Round 1: (hi0, lo0) = a1 * M0 gives its word 3 and part of word 2.
  const uint64_t p0 = uint64_t{a1} * kPhiloxM0;
  f.r1a = b1 ^ f.ks0[1];
  f.r1c = static_cast<uint32_t>(p0 >> 32) ^ f.ks1[1];
  f.r1e = static_cast<uint32_t>(p0);
  f.r2c = f.r1e ^ f.ks1[2];
  return f;
}

// hi and lo 32 bits of the 64-bit product a * m, per u32 lane (m the same in every lane).
template <class D, class V = hn::Vec<D>>
HWY_INLINE void MulHiLo(D d, V a, V m, V* hi, V* lo) {
  const hn::RepartitionToWide<D> dw;
  const auto even = hn::MulEven(a, m);                                            // lanes 0, 2, ..
  const auto odd = hn::MulEven(hn::BitCast(d, hn::ShiftRight<32>(hn::BitCast(dw, a))), m);  // 1, 3, ..
  *lo = hn::OddEven(hn::BitCast(d, hn::ShiftLeft<32>(odd)), hn::BitCast(d, even));
  *hi = hn::OddEven(hn::BitCast(d, odd), hn::BitCast(d, hn::ShiftRight<32>(even)));
}

// Philox4x32-10 of Lanes(d) counters (c0 + lane, c1, c2, c3) under one key; words out in x0..x3.
template <class D, class V = hn::Vec<D>>
HWY_INLINE void Philox10(D d, const PhiloxFamily& f, uint32_t c0, V* x0, V* x1, V* x2, V* x3) {
  const V m0 = hn::Set(d, 0xD2511F53u);
  const V m1 = hn::Set(d, 0xCD9E8D57u);
  V a = hn::Add(hn::Iota(d, 0), hn::Set(d, c0));
  V b = hn::Set(d, f.c1);
  V c = hn::Set(d, f.c2);
  V e = hn::Set(d, f.c3);
  uint32_t k0 = f.k0, k1 = f.k1;
  for (int r = 0; r < 10; ++r) {
    V hi0, lo0, hi1, lo1;
    MulHiLo(d, a, m0, &hi0, &lo0);
    MulHiLo(d, c, m1, &hi1, &lo1);
    a = hn::Xor(hn::Xor(hi1, b), hn::Set(d, k0));
    b = lo1;
    c = hn::Xor(hn::Xor(hi0, e), hn::Set(d, k1));
    e = lo0;
    k0 += 0x9E3779B9u;  // the key bump between rounds (PHILOX_W32_0 / _1)
    k1 += 0xBB67AE85u;
  }
  *x0 = a;
  *x1 = b;
  *x2 = c;
  *x3 = e;
}

// ---------------------------------------------------------------------------------------------
// Philox on 64-bit lanes: one counter per u64 lane, every 32-bit word in the low half of a lane
// (high halves are don't-care: MulEven reads low halves only). A round is then two 32x32->64
// multiplies, two dword swaps and two three-way XORs, with no even/odd recombination; K
// independent counter vectors run side by side to hide the multiply latency.
template <class D64, class V = hn::Vec<D64>>
HWY_INLINE V MulLo32(D64 /*d64*/, V a, V m) {
  const hn::Repartition<uint32_t, D64> d32;
  return hn::MulEven(hn::BitCast(d32, a), hn::BitCast(d32, m));
}
template <class D64, class V = hn::Vec<D64>>
HWY_INLINE V HiToLo(D64 d64, V p) {  // low dword := high dword of each lane
  const hn::Repartition<uint32_t, D64> d32;
  return hn::BitCast(d64, hn::Shuffle2301(hn::BitCast(d32, p)));
}

// One Philox round on one counter vector (state a, b, c, e; round keys k0, k1 in every dword).
template <class D64, class V = hn::Vec<D64>>
HWY_INLINE void PhiloxRoundQ(D64 d64, V& a, V& b, V& c, V& e, V m0, V m1, V k0, V k1) {
  const V p0 = MulLo32(d64, a, m0);
  const V p1 = MulLo32(d64, c, m1);
  a = hn::Xor3(HiToLo(d64, p1), b, k0);
  b = p1;
  c = hn::Xor3(HiToLo(d64, p0), e, k1);
  e = p0;
}

// Philox4x32-10 of two counter vectors side by side, given the products c0 * M0 of their first
// words (64-bit lanes; c1..c3 and the key schedule of f). Rounds 0 to 2 skip what is constant in
// a family (PhiloxFamily: one product fewer in each of rounds 0 and 1, the XORs with constants
// folded); rounds 3 to 9 are PhiloxRoundQ. Written out without arrays so that the state stays in
// registers.
template <class D64, class V = hn::Vec<D64>>
HWY_INLINE void Philox10Q2(D64 d64, const PhiloxFamily& f, V p0a, V p0b, V* x0, V* x1, V* x2, V* x3, V* y0,
                           V* y1, V* y2, V* y3) {
  const hn::Repartition<uint32_t, D64> d32;
  const V m0 = hn::Set(d64, kPhiloxM0);
  const V m1 = hn::Set(d64, kPhiloxM1);
  auto k32 = [&](uint32_t k) { return hn::BitCast(d64, hn::Set(d32, k)); };
  // Round 0: words 0 and 1 are constants (consumed by r1a / r1c), word 3 is lo(c0 M0).
  V c = hn::Xor(HiToLo(d64, p0a), k32(f.r0c)), e = p0a;
  V c2 = hn::Xor(HiToLo(d64, p0b), k32(f.r0c)), e2 = p0b;
  // Round 1: the product of word 0 is constant.
  V p1 = MulLo32(d64, c, m1), p1b = MulLo32(d64, c2, m1);
  V a = hn::Xor(HiToLo(d64, p1), k32(f.r1a)), b = p1;
  V a2 = hn::Xor(HiToLo(d64, p1b), k32(f.r1a)), b2 = p1b;
  c = hn::Xor(e, k32(f.r1c));
  c2 = hn::Xor(e2, k32(f.r1c));
  // Round 2: word 3 of round 1 is the constant r1e.
  {
    const V q0 = MulLo32(d64, a, m0), q1 = MulLo32(d64, c, m1);
    const V q0b = MulLo32(d64, a2, m0), q1b = MulLo32(d64, c2, m1);
    const V k0 = k32(f.ks0[2]);
    a = hn::Xor3(HiToLo(d64, q1), b, k0);
    b = q1;
    c = hn::Xor(HiToLo(d64, q0), k32(f.r2c));
    e = q0;
    a2 = hn::Xor3(HiToLo(d64, q1b), b2, k0);
    b2 = q1b;
    c2 = hn::Xor(HiToLo(d64, q0b), k32(f.r2c));
    e2 = q0b;
  }
  HWY_UNROLL(7)
  for (int r = 3; r < 10; ++r) {
    const V k0 = k32(f.ks0[r]);
    const V k1 = k32(f.ks1[r]);
    PhiloxRoundQ(d64, a, b, c, e, m0, m1, k0, k1);
    PhiloxRoundQ(d64, a2, b2, c2, e2, m0, m1, k0, k1);
  }
  *x0 = a;
  *x1 = b;
  *x2 = c;
  *x3 = e;
  *y0 = a2;
  *y1 = b2;
  *y2 = c2;
  *y3 = e2;
}

// Philox results (low dwords of x0..x3) of the counters of one vector -> two u32 vectors in
// group order, given the lane assignment of PhiloxElems4.
template <class D32, class V = hn::Vec<hn::Repartition<uint64_t, D32>>>
HWY_INLINE void PhiloxToElems(D32 d32, V x0, V x1, V x2, V x3, hn::Vec<D32>* lo, hn::Vec<D32>* hi) {
  const hn::Repartition<uint64_t, D32> d64;
  // (word0, word1) and (word2, word3) of each lane's counter as one 64-bit lane each.
  const V a = hn::BitCast(d64, hn::OddEven(hn::BitCast(d32, hn::ShiftLeft<32>(x1)), hn::BitCast(d32, x0)));
  const V b = hn::BitCast(d64, hn::OddEven(hn::BitCast(d32, hn::ShiftLeft<32>(x3)), hn::BitCast(d32, x2)));
  *lo = hn::BitCast(d32, hn::InterleaveLower(d64, a, b));
  *hi = hn::BitCast(d32, hn::InterleaveUpper(d64, a, b));
}

#if HWY_TARGET <= HWY_AVX3
// 512-bit vectors: PhiloxRound16 reorders the words itself (vpermt2w), with consecutive counters.
template <class D64>
constexpr bool kPhiloxZmm = sizeof(hn::Vec<D64>{}.raw) == 64;
#else
template <class D64>
constexpr bool kPhiloxZmm = false;
#endif

// Counter pattern of PhiloxElems4: lane l -> (l >> 1) + (l & 1) N64 / 2 (kPhiloxZmm: l).
template <class D64>
HWY_INLINE hn::Vec<D64> PhiloxLanePattern(D64 d64) {
  if constexpr (kPhiloxZmm<D64>) return hn::Iota(d64, 0);
  const size_t N64 = hn::Lanes(d64);
  const auto io = hn::Iota(d64, 0);
  const auto one = hn::Set(d64, 1);
  return hn::Add(hn::ShiftRight<1>(io), hn::IfThenElseZero(hn::Eq(hn::And(io, one), one), hn::Set(d64, N64 / 2)));
}

// The words of the Lanes(d32) groups g0 .. g0 + Lanes(d32) - 1 of the family, in order: the
// concatenation r0 r1 r2 r3 holds word w of group g0 + i at position 4 i + w (what draw4 returns
// for each group, one after the other). Counter lanes are assigned so that one 64-bit interleave
// per output vector puts the words in place: in counter vector k, lane 2i holds group
// g0 + k N64 + i and lane 2i + 1 group g0 + k N64 + N64 / 2 + i (N64 = Lanes(d32) / 2).
// pat = PhiloxLanePattern.
template <class D32, class V32 = hn::Vec<D32>>
HWY_INLINE void PhiloxElems4(D32 d32, const PhiloxFamily& f, hn::Vec<hn::Repartition<uint64_t, D32>> pat,
                             uint32_t g0, V32* r0, V32* r1, V32* r2, V32* r3) {
  const hn::Repartition<uint64_t, D32> d64;
  const size_t N64 = hn::Lanes(d64);
  using V = hn::Vec<decltype(d64)>;
  // (pat + g) * M0 = pat * M0 + g * M0: all below 2^64, one add per counter vector.
  const V patm = MulLo32(d64, pat, hn::Set(d64, kPhiloxM0));
  const V p0a = hn::Add(patm, hn::Set(d64, uint64_t{g0} * kPhiloxM0));
  const V p0b = hn::Add(patm, hn::Set(d64, (uint64_t{g0} + N64) * kPhiloxM0));
  V x0, x1, x2, x3, y0, y1, y2, y3;
  Philox10Q2(d64, f, p0a, p0b, &x0, &x1, &x2, &x3, &y0, &y1, &y2, &y3);
  PhiloxToElems(d32, x0, x1, x2, x3, r0, r1);
  PhiloxToElems(d32, y0, y1, y2, y3, r2, r3);
}

#if HWY_TARGET <= HWY_AVX3
// PhiloxRound16 on 512-bit vectors: the four words w0..w3 of one counter vector (counter lane q
// = group g + q) -> fn(q0 + t, draws of the 16 elements of groups g + 2t, g + 2t + 1), t = 0..3.
// Words 0 and 1 of each lane joined into one 64-bit lane (a dword shuffle merged under a mask)
// hold the draws of the group's elements 0..3 as u16 4q .. 4q + 3, words 2 and 3 those of
// elements 4..7; one two-source u16 permute per 16 elements picks them in element order into
// the even u16 of each u32 lane, zeroing the odd ones.
// kHigh: into the odd u16 instead, the even ones 0x8000 (u32 lanes j 2^16 + 2^15): the permute
// takes the lanes it does not select from its index vector, whose even u16 hold 0x8000.
template <class D32, bool kHigh, class F, class V>
HWY_INLINE void PhiloxEmitZmm(F& fn, size_t q0, V w0, V w1, V w2, V w3) {
  alignas(64) static constexpr uint16_t kIdxLo[32] = {0, 0, 1, 0, 2, 0, 3, 0, 32, 0, 33, 0, 34, 0, 35, 0,
                                                      4, 0, 5, 0, 6, 0, 7, 0, 36, 0, 37, 0, 38, 0, 39, 0};
  constexpr uint16_t h = 0x8000;
  alignas(64) static constexpr uint16_t kIdxHi[32] = {h, 0, h, 1, h, 2, h, 3, h, 32, h, 33, h, 34, h, 35,
                                                      h, 4, h, 5, h, 6, h, 7, h, 36, h, 37, h, 38, h, 39};
  const uint16_t* kIdx = kHigh ? kIdxHi : kIdxLo;
  const __m512i a = _mm512_mask_shuffle_epi32(w0.raw, 0xAAAA, w1.raw, _MM_PERM_CDAB);
  const __m512i b = _mm512_mask_shuffle_epi32(w2.raw, 0xAAAA, w3.raw, _MM_PERM_CDAB);
  const __m512i idx0 = _mm512_load_si512(kIdx);
  // Two groups further: u16 4q + 8 (kHigh: in the odd u16 only, the even ones stay 0x8000).
  const __m512i eight = kHigh ? _mm512_set1_epi32(8 << 16) : _mm512_set1_epi16(8);
  const __m512i idx1 = _mm512_add_epi16(idx0, eight), idx2 = _mm512_add_epi16(idx1, eight);
  const __m512i idx3 = _mm512_add_epi16(idx2, eight);
  if constexpr (kHigh) {
    const __mmask32 odd = 0xAAAAAAAAu;
    fn(q0 + 0, hn::Vec<D32>{_mm512_mask2_permutex2var_epi16(a, idx0, odd, b)});
    fn(q0 + 1, hn::Vec<D32>{_mm512_mask2_permutex2var_epi16(a, idx1, odd, b)});
    fn(q0 + 2, hn::Vec<D32>{_mm512_mask2_permutex2var_epi16(a, idx2, odd, b)});
    fn(q0 + 3, hn::Vec<D32>{_mm512_mask2_permutex2var_epi16(a, idx3, odd, b)});
  } else {
    const __mmask32 even = 0x55555555u;
    fn(q0 + 0, hn::Vec<D32>{_mm512_maskz_permutex2var_epi16(even, a, idx0, b)});
    fn(q0 + 1, hn::Vec<D32>{_mm512_maskz_permutex2var_epi16(even, a, idx1, b)});
    fn(q0 + 2, hn::Vec<D32>{_mm512_maskz_permutex2var_epi16(even, a, idx2, b)});
    fn(q0 + 3, hn::Vec<D32>{_mm512_maskz_permutex2var_epi16(even, a, idx3, b)});
  }
}
#endif

// Stochastic-rounding bits (philox.h: 16 bits per element, rng::kRoundGroup = 8 elements per
// call) of 8 Lanes(d32) consecutive elements starting at element 8 g0, zero-extended into u32
// lanes: f(q, j) for q = 0..7, j holding the bits of elements 8 g0 + q Lanes(d32) .. + Lanes(d32)
// - 1 in lane order. The words PhiloxElems4 returns, read as little-endian u16, are already the
// draws in element order: each word vector is split into its lower and upper halves and
// widened. pat = PhiloxLanePattern.
// kHigh: the draws shifted up by 16 bits, plus one half (u32 lanes j 2^16 + 2^15).
template <bool kHigh = false, class D32, class F>
HWY_INLINE void PhiloxRound16(D32 d32, const PhiloxFamily& f, hn::Vec<hn::Repartition<uint64_t, D32>> pat,
                              uint32_t g0, F&& fn) {
#if HWY_TARGET <= HWY_AVX3
  if constexpr (kPhiloxZmm<hn::Repartition<uint64_t, D32>>) {
    // Counter lane q holds group g0 + q (+ 8 in the second vector); PhiloxEmitZmm orders them.
    const hn::Repartition<uint64_t, D32> d64;
    using V = hn::Vec<decltype(d64)>;
    const V patm = MulLo32(d64, pat, hn::Set(d64, kPhiloxM0));
    const V p0a = hn::Add(patm, hn::Set(d64, uint64_t{g0} * kPhiloxM0));
    const V p0b = hn::Add(patm, hn::Set(d64, (uint64_t{g0} + 8) * kPhiloxM0));
    V x0, x1, x2, x3, y0, y1, y2, y3;
    Philox10Q2(d64, f, p0a, p0b, &x0, &x1, &x2, &x3, &y0, &y1, &y2, &y3);
    PhiloxEmitZmm<D32, kHigh>(fn, 0, x0, x1, x2, x3);
    PhiloxEmitZmm<D32, kHigh>(fn, 4, y0, y1, y2, y3);
    return;
  }
#endif
  const hn::Repartition<uint16_t, D32> d16;
  const hn::Half<decltype(d16)> dh;
  hn::Vec<D32> r0, r1, r2, r3;
  PhiloxElems4(d32, f, pat, g0, &r0, &r1, &r2, &r3);
  auto up = [d32](hn::Vec<D32> v) { return kHigh ? hn::Or(hn::ShiftLeft<16>(v), hn::Set(d32, 0x8000u)) : v; };
  fn(0, up(hn::PromoteTo(d32, hn::LowerHalf(dh, hn::BitCast(d16, r0)))));
  fn(1, up(hn::PromoteTo(d32, hn::UpperHalf(dh, hn::BitCast(d16, r0)))));
  fn(2, up(hn::PromoteTo(d32, hn::LowerHalf(dh, hn::BitCast(d16, r1)))));
  fn(3, up(hn::PromoteTo(d32, hn::UpperHalf(dh, hn::BitCast(d16, r1)))));
  fn(4, up(hn::PromoteTo(d32, hn::LowerHalf(dh, hn::BitCast(d16, r2)))));
  fn(5, up(hn::PromoteTo(d32, hn::UpperHalf(dh, hn::BitCast(d16, r2)))));
  fn(6, up(hn::PromoteTo(d32, hn::LowerHalf(dh, hn::BitCast(d16, r3)))));
  fn(7, up(hn::PromoteTo(d32, hn::UpperHalf(dh, hn::BitCast(d16, r3)))));
}

// Words of groups [g0, g0 + Lanes(d)) in element order: out[4 j + k] = word k of group g0 + j
// (4 Lanes(d) words), i.e. exactly what draw4 returns for those groups, concatenated.
template <class D>
HWY_INLINE void PhiloxGroups(D d, const PhiloxFamily& f, uint32_t g0, uint32_t* HWY_RESTRICT out) {
  hn::Vec<D> x0, x1, x2, x3;
  Philox10(d, f, g0, &x0, &x1, &x2, &x3);
  hn::StoreInterleaved4(x0, x1, x2, x3, d, out);
}

// Sign bits (bit 31 set where the RHT flips the sign) of Lanes(d) elements starting at element
// i of a run whose sign words are `words` (bit e & 31 of words[e >> 5] belongs to element e, the
// RHT's order). Lanes(d) must divide 32 and i be a multiple of Lanes(d).
template <class D>
HWY_INLINE hn::Vec<D> SignBits(D d, const uint32_t* HWY_RESTRICT words, uint64_t i) {
  const hn::Vec<D> w = hn::Set(d, words[i >> 5]);
  const hn::Vec<D> sh = hn::Sub(hn::Set(d, static_cast<uint32_t>(31 - (i & 31))), hn::Iota(d, 0));
  return hn::And(hn::Shl(w, sh), hn::Set(d, 0x80000000u));
}

constexpr size_t kMaxU32 = HWY_MAX_BYTES / 4;  // most u32 lanes of any vector of this target

// Sign words of the RHT for the elements [base, base + 128 Lanes(du)) of a block, base a multiple
// of 128: one Philox call covers 128 elements (4 words), Lanes(du) calls run side by side.
template <class DU>
HWY_INLINE void SignWords(DU du, const PhiloxFamily& fam, uint64_t base, uint32_t* HWY_RESTRICT words) {
  PhiloxGroups(du, fam, static_cast<uint32_t>(base / 128), words);
}

// Scalar form of SignBits for element j of the run.
HWY_INLINE uint32_t ScalarSignBit(const uint32_t* words, uint64_t j) {
  return ((words[j >> 5] >> (j & 31)) & 1u) << 31;
}
#endif  // vector targets

}  // namespace thc::codec::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
