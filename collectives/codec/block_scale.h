// Per-block scale factors derived from a block's global (MAX-combined) prelude statistic, shared
// by the host codec (Codec::block_scale) and the CUDA kernels. The whole derivation is exact
// IEEE arithmetic (frexp by bit manipulation, one double sqrt and one double division, both
// correctly rounded on CPUs and on GPUs), so host and device get bit-identical scales and the
// codes can agree bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "collectives/codec/elem.h"
#include "collectives/codec/hd.h"

namespace thc::elem {

// Which statistic and scale rule a scheme uses.
enum class ScaleKind : int {
  kRotate = 0,   // THC and uniform THC: stat = RMS over the wire block, RHT-domain scale
  kDnat2 = 1,    // natural dithering, 2-norm: stat = RMS over the wire block
  kCnat = 2,     // natural compression: stat = max |x|
  kDnatInf = 3,  // natural dithering, infinity norm: stat = max |x|
};

THC_HD ScaleKind scale_kind(bool rotates, bool dnat, int dnat_norm) {
  if (rotates) return ScaleKind::kRotate;
  if (!dnat) return ScaleKind::kCnat;
  return dnat_norm == 2 ? ScaleKind::kDnat2 : ScaleKind::kDnatInf;
}

// Whether the prelude statistic of this kind is the RMS (else max |x|).
THC_HD bool stat_is_rms(ScaleKind k) { return k == ScaleKind::kRotate || k == ScaleKind::kDnat2; }

struct Scale {
  bool zero;  // block is all zeros on every worker: decodes to exact zeros
  int exp;    // power-of-two part e
  float enc;  // encode: r = (x * 2^-e) * enc   (THC: after the RHT)
  float dec;  // decode: x = (S-dependent value) * dec * 2^e
};

// std::frexp for finite x > 0, exact for normal and denormal x: x = m * 2^e, m in [0.5, 1).
THC_HD float frexp_pos(float x, int* e) {
  uint32_t b = float_bits(x);
  int bias = 0;
  if ((b & 0x7F800000u) == 0) {  // denormal: scaling by 2^24 is exact and makes it normal
    b = float_bits(x * 16777216.0f);
    bias = -24;
  }
  *e = static_cast<int>((b >> 23) & 0xFFu) - 126 + bias;
  return bits_float((b & 0x807FFFFFu) | (126u << 23));
}

// levels: the natural codes' level count L (ignored for kRotate). wire_elems: the block's wire
// size W (the statistic is the RMS over W, so norm = stat * sqrt(W)).
THC_HD Scale block_scale(ScaleKind kind, int levels, float stat, uint64_t wire_elems) {
  Scale s{false, 0, 0.0f, 0.0f};
  if (!(stat > 0)) {
    s.zero = true;
    return s;
  }
  int e;
  const float m = frexp_pos(stat, &e);
  if (kind == ScaleKind::kRotate || kind == ScaleKind::kDnat2) {
    const double sw = sqrt(static_cast<double>(wire_elems));
    s.exp = e;
    if (kind == ScaleKind::kRotate) {
      s.enc = static_cast<float>(1.0 / (m * sw));  // (H D x * 2^-e) / (m sqrt W) ~ N(0,1)
      s.dec = static_cast<float>(m / sw);          // x = D H y * (m / sqrt W) * 2^e
    } else {
      s.exp = e + 1 - levels;  // unit = norm * 2^(1-L)
      s.enc = static_cast<float>(1.0 / (m * sw));
      s.dec = static_cast<float>(m * sw);
    }
  } else if (kind == ScaleKind::kCnat) {
    const int E = (m == 0.5f) ? e - 1 : e;  // smallest E with stat <= 2^E
    s.exp = E - levels + 1;                 // value 2^(j-1) stands for 2^(exp + j - 1)
    s.enc = 1.0f;
    s.dec = 1.0f;
  } else {  // kDnatInf: unit = stat * 2^(1-L)
    s.exp = e + 1 - levels;
    s.enc = 1.0f / m;
    s.dec = m;
  }
  return s;
}

}  // namespace thc::elem
