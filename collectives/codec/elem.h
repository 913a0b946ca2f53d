// Element math shared by the host codec (scalar and SIMD paths) and the CUDA kernels.
// Pure functions on one element; everything a kernel needs is passed in.
#pragma once

#include <cstdint>
#include <cstring>

#include "collectives/codec/hd.h"

namespace thc::elem {

THC_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
THC_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// 2^e for |e| <= 126 as an exact float.
THC_HD float pow2f(int e) { return bits_float(static_cast<uint32_t>(e + 127) << 23); }

// x * 2^e without intermediate overflow/underflow for |e| <= 252: two exact power-of-two
// multiplications, each representable. This is how per-block scales far outside float's
// comfortable range (denormal or huge inputs) are applied exactly.
THC_HD float scale2(float x, int e) {
  const int h = e / 2;
  return (x * pow2f(h)) * pow2f(e - h);
}

// ---------------------------------------------------------------------------------------------
// THC: one entry per grid cell [k, k+1), k = 0..g-1, precomputed from the table T (sorted,
// values in 0..g, T[0] = 0 and T[last] = g; duplicates allowed). lo/hi are the table values that
// bracket the cell and the (first) indices that carry them.
struct ThcCell {
  int32_t lo_val;
  int32_t hi_val;
  float inv_span;  // 1 / (hi_val - lo_val)
  uint8_t lo_idx;
  uint8_t hi_idx;
  uint8_t pad_[2];
};

// Position of a normalised coordinate y (≈ N(0,1)) on the grid [0, g]: clamp to ±t, then
// v = (y + t) * g / (2t). The prelude rejects non-finite input, but a rank whose prelude did
// not count (a straggler under partial aggregation) can still encode its NaN: it is taken as 0,
// an unbiased zero contribution, so no NaN reaches the integer conversion in thc_round.
THC_HD float thc_grid(float y, float t, float g_over_2t, float g) {
  y = y < -t ? -t : (y > t ? t : (y == y ? y : 0.0f));
  float v = (y + t) * g_over_2t;
  return v < 0.f ? 0.f : (v > g ? g : v);
}

// Unbiased stochastic rounding of grid position v onto the table values: E[value] = v.
THC_HD void thc_round(float v, float u, const ThcCell* cells, int g, uint8_t* idx, int32_t* val) {
  int k = static_cast<int>(v);
  k = k > g - 1 ? g - 1 : k;
  const ThcCell c = cells[k];
  const float p = (v - static_cast<float>(c.lo_val)) * c.inv_span;
  const bool up = u < p;
  *idx = up ? c.hi_idx : c.lo_idx;
  *val = up ? c.hi_val : c.lo_val;
}

// Decoded (normalised, rotated-domain) value of an aggregate S of `count` table values:
// sum_i (T_i - g/2) * step = (S - count*g/2) * step, step = 2t/g.
THC_HD float thc_decode_sum(float s, float count_half_g, float step) { return (s - count_half_g) * step; }

// ---------------------------------------------------------------------------------------------
// Natural codes (Cnat and natural dithering): a ratio r = |x| / unit in [0, 2^(L-1)] is rounded
// without bias to 0 or a power of two 2^(j-1), j = 1..L. Code = sign << (bits-1) | level j,
// integer value ±2^(j-1). Between 0 and 1 (below the window) rounding is linear: 0 or 1.
// In [2^e, 2^(e+1)) the probability of going up is the mantissa fraction (r - 2^e) / 2^e,
// read straight from the float's bits, as in the paper.
// A NaN ratio (see thc_grid) rounds to level 0.
THC_HD void nat_round(float r, bool neg, float u, int levels, int bits, uint8_t* code, int32_t* val) {
  const float rmax = pow2f(levels - 1);
  r = r > rmax ? rmax : (r >= 0.0f ? r : 0.0f);
  int level;
  if (r >= 1.0f) {
    const uint32_t b = float_bits(r);
    const int e = static_cast<int>((b >> 23) & 0xFF) - 127;  // r in [2^e, 2^(e+1))
    const float frac = static_cast<float>(b & 0x7FFFFFu) * (1.0f / 8388608.0f);
    level = e + 1 + (u < frac ? 1 : 0);
  } else {
    level = u < r ? 1 : 0;
  }
  const int32_t mag = level == 0 ? 0 : (int32_t{1} << (level - 1));
  const bool s = neg && level != 0;
  *code = static_cast<uint8_t>((s ? (1u << (bits - 1)) : 0u) | static_cast<uint32_t>(level));
  *val = s ? -mag : mag;
}

// ---------------------------------------------------------------------------------------------
// Bit packing of b-bit codes, LSB-first: code i occupies bits [i*b, i*b+b) of the byte stream,
// where bit j of the stream is bit (j % 8) of byte j / 8. Eight codes always fill exactly b bytes,
// so any run of codes that starts at a multiple of 8 starts on a byte boundary.
THC_HD uint32_t packed_get(const uint8_t* p, uint64_t i, int b) {
  const uint64_t bit = i * static_cast<uint64_t>(b);
  const uint64_t byte = bit >> 3;
  const int sh = static_cast<int>(bit & 7);
  uint32_t w = p[byte];
  if (sh + b > 8) w |= static_cast<uint32_t>(p[byte + 1]) << 8;
  return (w >> sh) & ((1u << b) - 1u);
}

}  // namespace thc::elem
