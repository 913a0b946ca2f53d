// The codec's SIMD kernels must reproduce the scalar reference bit for bit (codes, packed bytes,
// values, residuals, decodes): the CPU and GPU paths rely on the same per-element math (elem.h).
//
// Two levels, each run on every Highway target compiled in and supported by this CPU
// (hwy::SetSupportedTargetsForTest; EMU128 = the scalar reference itself):
//  * Codec end to end against a golden model: the original scalar encode/decode written out here
//    with elem.h, philox draw4, fwht_scalar and the scalar sign flips;
//  * each kernel of codec_simd.h against its *_scalar reference, on crafted edge values.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/codec/codec_simd.h"
#include "collectives/codec/elem.h"
#include "collectives/codec/rht.h"
#include "tests/hwy_targets.h"

namespace thc::codec {
namespace {

// Every Highway target this CPU runs (tests/hwy_targets.h).
template <class F>
void for_each_target(F f) {
  thc::test::for_each_hwy_target(f, kern::kernel_target);
}

// Both cell-table lookups of THC's rounding on AVX2 (kern::TableLookup: the table in registers,
// and gathered); the other targets ignore the mode. Back to the CPU's default afterwards.
template <class F>
void for_each_table_lookup(F f) {
  for (const auto mode : {kern::TableLookup::kRegisters, kern::TableLookup::kGather}) {
    SCOPED_TRACE(mode == kern::TableLookup::kRegisters ? "AVX2 table in registers" : "AVX2 table gathered");
    kern::set_avx2_table_lookup(mode);
    f();
    if (::testing::Test::HasFatalFailure()) break;
  }
  kern::set_avx2_table_lookup(kern::TableLookup::kAuto);
}

bool same_bits(const void* a, const void* b, size_t bytes) { return bytes == 0 || std::memcmp(a, b, bytes) == 0; }

// First differing float, for messages.
std::string first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (elem::float_bits(a[i]) != elem::float_bits(b[i]))
      return "at " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " + std::to_string(b[i]);
  return a.size() == b.size() ? "none" : "sizes differ";
}

// ---------------------------------------------------------------------------------------------
// Inputs, including the edge values the kernels must agree on.

enum class Input { kGauss, kZeros, kDenormal, kHuge, kPow2, kMixed };
const char* input_name(Input k) {
  switch (k) {
    case Input::kGauss: return "gauss";
    case Input::kZeros: return "zeros";
    case Input::kDenormal: return "denormal";
    case Input::kHuge: return "huge";
    case Input::kPow2: return "pow2";
    case Input::kMixed: return "mixed";
  }
  return "?";
}

std::vector<float> make_input(Input kind, uint64_t n, uint32_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-20, 20);
  std::vector<float> x(n);
  for (uint64_t i = 0; i < n; ++i) {
    const float sign = (gen() & 1) ? -1.0f : 1.0f;
    switch (kind) {
      case Input::kGauss: x[i] = nd(gen); break;
      case Input::kZeros: x[i] = (gen() & 1) ? 0.0f : -0.0f; break;
      case Input::kDenormal:
        x[i] = sign * std::numeric_limits<float>::denorm_min() * static_cast<float>(gen() % 100000);
        break;
      case Input::kHuge: x[i] = sign * 1e37f * (1.0f + 33.0f * static_cast<float>(gen() % 1000) / 1000.0f); break;
      case Input::kPow2: x[i] = sign * std::ldexp(1.0f, ex(gen)); break;
      case Input::kMixed: {
        const uint64_t r = gen() % 16;
        if (r == 0) x[i] = 0.0f;
        else if (r == 1) x[i] = -0.0f;
        else if (r == 2) x[i] = sign * std::numeric_limits<float>::denorm_min() * 3.0f;
        else if (r == 3) x[i] = sign * 1e30f;
        else if (r == 4) x[i] = sign * std::ldexp(1.0f, ex(gen));
        else x[i] = nd(gen);
        break;
      }
    }
  }
  // Mixed: a whole zero stretch (zero blocks at small block sizes).
  if (kind == Input::kMixed && n > 3000)
    for (uint64_t i = 1024; i < 2048; ++i) x[i] = 0.0f;
  return x;
}

// ---------------------------------------------------------------------------------------------
// Golden model: the original scalar codec loops.

void golden_apply_signs(float* x, uint64_t n, const rng::Stream& shared, uint64_t block) {
  const auto key = rng::make_key(shared);
  for (uint64_t g = 0; g * 128 < n; ++g) {
    const auto r = rng::draw4(key, shared, rng::kPurposeSigns, block, static_cast<uint32_t>(g));
    const uint64_t base = g * 128;
    const uint64_t m = n - base < 128 ? n - base : 128;
    for (uint64_t j = 0; j < m; ++j) {
      const uint32_t bit = (r.v[j >> 5] >> (j & 31)) & 1u;
      x[base + j] = elem::bits_float(elem::float_bits(x[base + j]) ^ (bit << 31));
    }
  }
}

// Rounding uniform of element k (0..7) of a group (philox.h, written out here independently):
// the call's 128 bits as eight little-endian u16 j, u = (2 j + 1) / 2^17.
float golden_unit(const r123::Philox4x32::ctr_type& r, uint64_t k) {
  const uint32_t word = r.v[k / 2];
  const uint32_t j = (k % 2 == 0) ? (word & 0xFFFFu) : (word >> 16);
  return static_cast<float>(2 * j + 1) / 131072.0f;
}

void golden_pack(const uint8_t* codes, uint64_t n, int bits, uint8_t* out) {
  if (n == 0) return;
  if (bits == 8) {
    std::memcpy(out, codes, n);
    return;
  }
  std::memset(out, 0, (n * bits + 7) / 8);
  uint64_t acc = 0, o = 0;
  int nacc = 0;
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

// Prelude statistic in the documented summation order (codec_simd.h: 16 partial sums).
bool golden_prelude(const Codec& c, const float* x, uint64_t count, float* stats) {
  const Layout l = c.layout(count);
  const Params& P = c.params();
  const bool l2 = c.rotates() || (P.scheme == Scheme::kDnat && P.dnat_norm == 2);
  bool finite = true;
  for (uint64_t b = 0; b < l.nblocks; ++b) {
    const float* p = x + b * l.block;
    const uint64_t m = l.elems(b);
    if (l2) {
      double part[16] = {};
      for (uint64_t i = 0; i < m; ++i) part[i % 16] += static_cast<double>(p[i]) * p[i];
      for (int j = 0; j < 8; ++j) part[j] += part[j + 8];
      for (int j = 0; j < 4; ++j) part[j] += part[j + 4];
      for (int j = 0; j < 2; ++j) part[j] += part[j + 2];
      const double s = part[0] + part[1];
      if (!std::isfinite(s)) finite = false;
      stats[b] = static_cast<float>(std::sqrt(s / static_cast<double>(l.wire(b))));
    } else {
      float mx = 0;
      for (uint64_t i = 0; i < m; ++i) {
        const float a = std::fabs(p[i]);
        if (!(a <= 3.402823466e38f)) finite = false;
        mx = a > mx ? a : mx;
      }
      stats[b] = mx;
    }
  }
  return finite;
}

struct GoldenEncoded {
  std::vector<uint8_t> idx;  // wire codes
  std::vector<int32_t> val;  // wire values
  std::vector<uint8_t> packed;
  std::vector<float> residual;
};

GoldenEncoded golden_encode(const Codec& c, const Layout& lay, const float* x, const float* stats,
                            const CallRng& rng) {
  GoldenEncoded ge;
  ge.idx.assign(lay.wire_count, 0);
  ge.val.assign(lay.wire_count, 0);
  ge.residual.assign(lay.count, 0.0f);
  const uint64_t B = lay.block;
  const rng::Stream own = rng.own();
  const auto key = rng::make_key(own);
  std::vector<float> work(B);
  const float t = static_cast<float>(c.t_p());
  const float g = static_cast<float>(c.granularity());
  const float g2t = static_cast<float>(c.granularity() / (2.0 * c.t_p()));
  uint64_t off = 0;
  for (uint64_t blk = 0; blk < lay.nblocks; ++blk) {
    const uint64_t m = lay.elems(blk), w = lay.wire(blk);
    const float* xb = x + blk * B;
    uint8_t* idx = ge.idx.data() + off;
    int32_t* val = ge.val.data() + off;
    float* res = ge.residual.data() + blk * B;
    const auto bs = c.block_scale(stats[blk], w);
    if (bs.zero) {
      for (uint64_t i = 0; i < m; ++i) res[i] = xb[i];
      off += w;
      continue;
    }
    if (c.rotates()) {
      for (uint64_t i = 0; i < m; ++i) work[i] = elem::scale2(xb[i], -bs.exp);
      std::fill(work.begin() + m, work.begin() + w, 0.0f);
      golden_apply_signs(work.data(), w, rng.shared(), blk);
      fwht_scalar(work.data(), w);
      for (uint64_t i = 0; i < w; i += 8) {
        const auto r = rng::draw4(key, own, rng::kPurposeRound, blk, static_cast<uint32_t>(i / 8));
        for (uint64_t k = 0; k < 8 && i + k < w; ++k) {
          const float v = elem::thc_grid(work[i + k] * bs.enc, t, g2t, g);
          elem::thc_round(v, golden_unit(r, k), c.cells().data(), c.granularity(), &idx[i + k], &val[i + k]);
        }
      }
      const float step = static_cast<float>(2.0 * c.t_p() / c.granularity());
      const float half = 0.5f * static_cast<float>(c.granularity());
      for (uint64_t i = 0; i < w; ++i)
        work[i] = elem::thc_decode_sum(static_cast<float>(val[i]), half, step) * bs.dec;
      fwht_scalar(work.data(), w);
      golden_apply_signs(work.data(), w, rng.shared(), blk);
      for (uint64_t i = 0; i < m; ++i) res[i] = xb[i] - elem::scale2(work[i], bs.exp);
    } else {
      for (uint64_t i = 0; i < m; i += 8) {
        const auto r = rng::draw4(key, own, rng::kPurposeRound, blk, static_cast<uint32_t>(i / 8));
        for (uint64_t k = 0; k < 8 && i + k < m; ++k) {
          const float a = xb[i + k];
          const float rr = elem::scale2(std::fabs(a), -bs.exp) * bs.enc;
          elem::nat_round(rr, a < 0, golden_unit(r, k), c.levels(), c.index_bits(), &idx[i + k], &val[i + k]);
        }
      }
      for (uint64_t i = 0; i < m; ++i)
        res[i] = xb[i] - elem::scale2(static_cast<float>(val[i]) * bs.dec, bs.exp);
    }
    off += w;
  }
  ge.packed.assign(c.packed_bytes(lay.wire_count), 0);
  off = 0;
  for (uint64_t blk = 0; blk < lay.nblocks; ++blk) {
    golden_pack(ge.idx.data() + off, lay.wire(blk), c.index_bits(), ge.packed.data() + off * c.index_bits() / 8);
    off += lay.wire(blk);
  }
  return ge;
}

std::vector<float> golden_decode(const Codec& c, const Layout& lay, const void* sums, const float* stats,
                                 const CallRng& rng, int contributors, bool mean) {
  std::vector<float> out(lay.count);
  const uint64_t B = lay.block;
  std::vector<float> work(B);
  const float cnt = static_cast<float>(contributors);
  const float inv_cnt = mean ? 1.0f / cnt : 1.0f;
  uint64_t off = 0;
  for (uint64_t blk = 0; blk < lay.nblocks; ++blk) {
    const uint64_t m = lay.elems(blk), w = lay.wire(blk);
    float* ob = out.data() + blk * B;
    const auto bs = c.block_scale(stats[blk], w);
    if (bs.zero || contributors <= 0) {
      std::fill(ob, ob + m, 0.0f);
      off += w;
      continue;
    }
    for (uint64_t i = 0; i < w; ++i) work[i] = static_cast<float>(load_int(c.sum_type(), sums, off + i));
    if (c.rotates()) {
      const float step = static_cast<float>(2.0 * c.t_p() / c.granularity());
      const float half = 0.5f * static_cast<float>(c.granularity()) * cnt;
      const float f = bs.dec * inv_cnt;
      for (uint64_t i = 0; i < w; ++i) work[i] = elem::thc_decode_sum(work[i], half, step) * f;
      fwht_scalar(work.data(), w);
      golden_apply_signs(work.data(), w, rng.shared(), blk);
      for (uint64_t i = 0; i < m; ++i) ob[i] = elem::scale2(work[i], bs.exp);
    } else {
      const float f = bs.dec * inv_cnt;
      for (uint64_t i = 0; i < m; ++i) ob[i] = elem::scale2(work[i] * f, bs.exp);
    }
    off += w;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// End to end: Codec (dispatching) against the golden model.

struct Case {
  Params p;
  int workers;
  std::string name;
};

Params thc(int bits, int g, int block_log2 = 10, Scheme s = Scheme::kThc) {
  Params p;
  p.scheme = s;
  p.bits = bits;
  p.granularity = g;
  p.block_log2 = block_log2;
  return p;
}
Params nat(Scheme s, int width, int levels = 0, int norm = 2, int block_log2 = 10) {
  Params p;
  p.scheme = s;
  p.nat_width = width;
  p.nat_levels = levels;
  p.dnat_norm = norm;
  p.block_log2 = block_log2;
  return p;
}

std::vector<Case> all_cases() {
  std::vector<Case> cs;
  const int thc_g[8][2] = {{1, 3}, {3, 10}, {7, 20}, {15, 30}, {31, 60}, {63, 100}, {127, 200}, {255, 300}};
  for (int b = 1; b <= 8; ++b) {
    for (int g : thc_g[b - 1]) cs.push_back({thc(b, g), 3, "thc b=" + std::to_string(b) + " g=" + std::to_string(g)});
    cs.push_back({thc(b, 0, 10, Scheme::kUniformThc), 3, "uhc b=" + std::to_string(b)});
  }
  {
    Params dup = thc(4, 16);  // a table with a repeated value
    dup.table = {0, 2, 3, 4, 5, 6, 7, 8, 8, 9, 10, 11, 12, 13, 14, 16};
    cs.push_back({dup, 3, "thc duplicate table"});
    cs.push_back({thc(4, 30), 9, "thc u16 sums"});
    Params wide = thc(2, 4000);  // n g > 65535: 32-bit sums
    wide.table = {0, 1300, 2700, 4000};
    cs.push_back({wide, 20, "thc u32 sums"});
  }
  for (int width : {8, 16, 32}) {
    cs.push_back({nat(Scheme::kCnat, width), 3, "cnat w=" + std::to_string(width)});
    cs.push_back({nat(Scheme::kDnat, width, 0, 2), 3, "dnat p=2 w=" + std::to_string(width)});
    cs.push_back({nat(Scheme::kDnat, width, 0, 0), 3, "dnat p=inf w=" + std::to_string(width)});
  }
  cs.push_back({nat(Scheme::kCnat, 16, 3), 2, "cnat L=3"});
  cs.push_back({nat(Scheme::kDnat, 16, 8, 2), 2, "dnat p=2 L=8"});
  cs.push_back({nat(Scheme::kDnat, 16, 1, 0), 2, "dnat p=inf L=1"});
  cs.push_back({nat(Scheme::kCnat, 32, 0, 2), 1, "cnat n=1 w=32"});
  return cs;
}

// Encode every worker in all forms, compare with the golden model, aggregate, decode, compare.
void check_case(const Case& cs, uint64_t count, Input kind, uint32_t seed) {
  const Codec c(cs.p, cs.workers);
  const Layout l = c.layout(count);
  const int W = cs.workers < 3 ? cs.workers : 3;  // workers actually simulated
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < W; ++r) xs.push_back(make_input(kind, count, seed + static_cast<uint32_t>(r)));

  std::vector<float> stats(l.nblocks, 0.0f), s(l.nblocks), gs(l.nblocks);
  for (const auto& x : xs) {
    const bool ok = c.prelude(x.data(), count, s.data());
    const bool gok = golden_prelude(c, x.data(), count, gs.data());
    ASSERT_EQ(ok, gok);
    ASSERT_TRUE(same_bits(s.data(), gs.data(), s.size() * 4)) << "prelude " << first_diff(s, gs);
    for (uint64_t b = 0; b < l.nblocks; ++b) stats[b] = std::max(stats[b], s[b]);
  }

  const size_t ws = int_size(c.sum_type());
  std::vector<int64_t> total(l.wire_count, 0);
  for (int r = 0; r < W; ++r) {
    const CallRng rng{0x1234567890abcdefull, static_cast<uint32_t>(r), 7};
    const GoldenEncoded ge = golden_encode(c, l, xs[r].data(), stats.data(), rng);
    // All forms at once.
    std::vector<uint8_t> packed(c.packed_bytes(l.wire_count) + 8, 0xAB), vals(l.wire_count * ws + 8, 0xCD);
    std::vector<float> res(count);
    Codec::EncodeOut out;
    out.packed = packed.data();
    out.values = vals.data();
    out.residual = res.data();
    c.encode(l, 0, l.nblocks, xs[r].data(), stats.data(), rng, out);
    ASSERT_TRUE(same_bits(packed.data(), ge.packed.data(), ge.packed.size())) << "packed bytes";
    for (size_t i = ge.packed.size(); i < packed.size(); ++i) ASSERT_EQ(packed[i], 0xAB) << "wrote past the end";
    for (uint64_t i = 0; i < l.wire_count; ++i) {
      ASSERT_EQ(elem::packed_get(packed.data(), i, c.index_bits()), ge.idx[i]) << "code " << i;
      // Value form: the golden int32 value through static_cast to the sum type.
      std::vector<uint8_t> one(8);
      store_int(c.sum_type(), one.data(), 0, ge.val[i]);
      ASSERT_TRUE(same_bits(vals.data() + i * ws, one.data(), ws)) << "value " << i;
    }
    for (size_t i = l.wire_count * ws; i < vals.size(); ++i) ASSERT_EQ(vals[i], 0xCD) << "wrote past the end";
    ASSERT_TRUE(same_bits(res.data(), ge.residual.data(), count * 4)) << "residual " << first_diff(res, ge.residual);
    // One form at a time (the codec skips what is not asked for), in two calls of block ranges.
    std::vector<uint8_t> packed2(c.packed_bytes(l.wire_count)), vals2(l.wire_count * ws);
    Codec::EncodeOut o1, o2;
    o1.packed = packed2.data();
    o2.values = vals2.data();
    c.encode(l, 0, l.nblocks, xs[r].data(), stats.data(), rng, o1);
    const uint64_t half = l.nblocks / 2;
    c.encode(l, 0, half, xs[r].data(), stats.data(), rng, o2);
    Codec::EncodeOut o3;
    o3.values = vals2.data() + half * l.block * ws;
    c.encode(l, half, l.nblocks - half, xs[r].data() + half * l.block, stats.data() + half, rng, o3);
    ASSERT_TRUE(same_bits(packed2.data(), ge.packed.data(), ge.packed.size())) << "packed only";
    ASSERT_TRUE(same_bits(vals2.data(), vals.data(), vals2.size())) << "values only / split";
    for (uint64_t i = 0; i < l.wire_count; ++i) total[i] += load_int(c.sum_type(), vals.data(), i);
  }
  std::vector<uint8_t> sums(l.wire_count * ws);
  for (uint64_t i = 0; i < l.wire_count; ++i) store_int(c.sum_type(), sums.data(), i, total[i]);
  const CallRng drng{0x1234567890abcdefull, 0, 7};
  for (int contributors : {W, W > 1 ? W - 1 : W}) {
    for (bool mean : {true, false}) {
      std::vector<float> dec(count);
      c.decode(l, 0, l.nblocks, sums.data(), stats.data(), drng, contributors, mean, dec.data());
      const auto gd = golden_decode(c, l, sums.data(), stats.data(), drng, contributors, mean);
      ASSERT_TRUE(same_bits(dec.data(), gd.data(), count * 4))
          << "decode contributors=" << contributors << " mean=" << mean << " " << first_diff(dec, gd);
    }
  }
}

// One test per case (each its own process under ctest): the whole grid under ASan in a Debug
// build takes minutes in one process, and the cases are independent.
class CodecGolden : public ::testing::TestWithParam<size_t> {};
INSTANTIATE_TEST_SUITE_P(SimdBitIdentity, CodecGolden, ::testing::Range(size_t{0}, all_cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& pi) {
                           std::string n = all_cases()[pi.param].name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return std::to_string(pi.param) + "_" + n;
                         });

TEST_P(CodecGolden, MatchesGoldenScalarModel) {
  const Case cs = all_cases()[GetParam()];
  for_each_target([&] {
    for (uint64_t count : {uint64_t{1}, uint64_t{63}, uint64_t{1024}, uint64_t{1025}, uint64_t{70000}}) {
      for (Input kind : {Input::kGauss, Input::kMixed}) {
        SCOPED_TRACE(cs.name + " count=" + std::to_string(count) + " input=" + input_name(kind));
        check_case(cs, count, kind, 17);
        if (HasFatalFailure()) return;
      }
    }
  });
}

TEST(SimdBitIdentity, EdgeInputs) {
  std::vector<Case> cases = {{thc(4, 30), 3, "thc"},
                             {thc(2, 3, 10, Scheme::kUniformThc), 3, "uhc"},
                             {nat(Scheme::kCnat, 16), 3, "cnat"},
                             {nat(Scheme::kDnat, 16, 0, 2), 3, "dnat p=2"},
                             {nat(Scheme::kDnat, 8, 0, 0), 3, "dnat p=inf"}};
  for_each_target([&] {
    for (const Case& cs : cases) {
      for (Input kind : {Input::kZeros, Input::kDenormal, Input::kHuge, Input::kPow2, Input::kMixed}) {
        for (uint64_t count : {uint64_t{63}, uint64_t{1025}, uint64_t{5000}}) {
          SCOPED_TRACE(cs.name + " count=" + std::to_string(count) + " input=" + input_name(kind));
          check_case(cs, count, kind, 5);
          if (HasFatalFailure()) return;
        }
      }
    }
  });
}

TEST(SimdBitIdentity, LargeBlocks) {
  // Default-size and large RHT blocks, with a short tail block.
  std::vector<Case> cases = {{thc(4, 30, 16), 4, "thc 2^16"}, {thc(4, 30, 14), 4, "thc 2^14"},
                             {nat(Scheme::kCnat, 16, 0, 2, 16), 4, "cnat 2^16"}};
  for_each_target([&] {
    for (const Case& cs : cases) {
      SCOPED_TRACE(cs.name);
      check_case(cs, 70000, Input::kGauss, 9);
      if (HasFatalFailure()) return;
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Kernels against their scalar references.

// The rounding tables of a THC codec, as the codec hands them to the kernels.
kern::ThcTables thc_tables(const Codec& c) {
  kern::ThcTables tb{};
  tb.cells = c.cells().data();
  tb.g = c.granularity();
  tb.t = static_cast<float>(c.t_p());
  tb.gf = static_cast<float>(c.granularity());
  tb.g_over_2t = static_cast<float>(c.granularity() / (2.0 * c.t_p()));
  return tb;
}

// g = 30 and 31 take the register-table path on AVX-512 (cells in two registers) and, in its
// register mode, on AVX2 (four registers per field); 32 and 60 the gather path; every target
// must agree with the scalar reference either way.
class ThcQuantizeGrid : public ::testing::TestWithParam<std::pair<int, int>> {};
INSTANTIATE_TEST_SUITE_P(SimdKernels, ThcQuantizeGrid,
                         ::testing::Values(std::make_pair(4, 30), std::make_pair(5, 31), std::make_pair(5, 32),
                                           std::make_pair(5, 60), std::make_pair(2, 3),
                                           // The largest cell table of one word per cell (codes up
                                           // to 255 in its top byte), and the first beyond it.
                                           std::make_pair(8, 255), std::make_pair(8, 256)));

TEST_P(ThcQuantizeGrid, OnGridPointsAndClampEdges) {
  const Codec c(thc(GetParam().first, GetParam().second), 4);
  const kern::ThcTables tb = thc_tables(c);
  // Rotated values whose grid position is (within an ulp) every integer k, midpoints, +-t and
  // beyond, zeros of both signs, denormals; enc = 1.
  std::vector<float> w;
  for (int k = 0; k <= tb.g; ++k) {
    const float y = static_cast<float>(k) / tb.g_over_2t - tb.t;
    w.push_back(y);
    w.push_back(std::nextafter(y, 10.0f));
    w.push_back(std::nextafter(y, -10.0f));
    w.push_back((static_cast<float>(k) + 0.5f) / tb.g_over_2t - tb.t);
  }
  for (float v : {tb.t, -tb.t, std::nextafter(tb.t, 10.f), std::nextafter(-tb.t, -10.f), 1e30f, -1e30f, 0.0f, -0.0f,
                  1e-40f, -1e-40f, 3.4e38f, -3.4e38f})
    w.push_back(v);
  while (w.size() % 64) w.push_back(0.25f);
  for_each_table_lookup([&] {
    for_each_target([&] {
      for (uint64_t blk : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 33) + 3}) {
        const rng::Stream own{99, 3, 11};
        std::vector<uint8_t> i1(w.size()), i2(w.size());
        std::vector<int32_t> v1(w.size()), v2(w.size());
        kern::thc_quantize(w.data(), w.size(), 1.0f, tb, own, blk, i1.data(), v1.data());
        kern::thc_quantize_scalar(w.data(), w.size(), 1.0f, tb, own, blk, i2.data(), v2.data());
        ASSERT_EQ(i1, i2);
        ASSERT_EQ(v1, v2);
        std::vector<uint8_t> i3(w.size());
        kern::thc_quantize(w.data(), w.size(), 1.0f, tb, own, blk, i3.data(), nullptr);
        ASSERT_EQ(i3, i2);
        // A length that ends inside a step of draws (the tail path).
        const uint64_t n = w.size() - 20;
        std::vector<uint8_t> i4(n), i5(n);
        std::vector<int32_t> v4(n), v5(n);
        kern::thc_quantize(w.data(), n, 0.875f, tb, own, blk, i4.data(), v4.data());
        kern::thc_quantize_scalar(w.data(), n, 0.875f, tb, own, blk, i5.data(), v5.data());
        ASSERT_EQ(i4, i5);
        ASSERT_EQ(v4, v5);
      }
    });
  });
}

// A straggler's NaN (its prelude left out under partial aggregation) reaches the rounding: it
// must be an unbiased zero on every path (scalar, SIMD, and the CUDA kernels, which share
// elem.h), never static_cast<int>(NaN).
TEST_P(ThcQuantizeGrid, NonFiniteRotatedValuesRoundLikeTheirClampOrZero) {
  const Codec c(thc(GetParam().first, GetParam().second), 4);
  const kern::ThcTables tb = thc_tables(c);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> w(256, 0.0f);
  for (size_t i = 0; i < w.size(); i += 4) {
    w[i] = nan;
    w[i + 1] = -nan;
    w[i + 2] = inf;
    w[i + 3] = -inf;
  }
  const rng::Stream own{7, 1, 2};
  std::vector<uint8_t> z0(w.size());
  std::vector<int32_t> q0(w.size());
  {
    // Reference: NaN as 0, infinities as +-t.
    std::vector<float> ref(w.size());
    for (size_t i = 0; i < w.size(); ++i) ref[i] = w[i] != w[i] ? 0.0f : (w[i] > 0 ? tb.t : -tb.t);
    kern::thc_quantize_scalar(ref.data(), ref.size(), 1.0f, tb, own, 3, z0.data(), q0.data());
  }
  for_each_table_lookup([&] {
    for_each_target([&] {
      for (uint64_t n : {w.size(), w.size() - 12}) {
        std::vector<uint8_t> z1(n), z2(n);
        std::vector<int32_t> q1(n), q2(n);
        kern::thc_quantize_scalar(w.data(), n, 1.0f, tb, own, 3, z2.data(), q2.data());
        kern::thc_quantize(w.data(), n, 1.0f, tb, own, 3, z1.data(), q1.data());
        ASSERT_EQ(z1, z2);
        ASSERT_EQ(q1, q2);
        ASSERT_EQ(z2, std::vector<uint8_t>(z0.begin(), z0.begin() + n));
        ASSERT_EQ(q2, std::vector<int32_t>(q0.begin(), q0.begin() + n));
      }
    });
  });
}

TEST(SimdKernels, NatQuantizeOfNaNIsZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x(100, nan);
  for (size_t i = 0; i < x.size(); i += 2) x[i] = -nan;
  for_each_target([&] {
    for (uint64_t n : {x.size(), x.size() - 3}) {
      const rng::Stream own{42, 2, 1};
      std::vector<uint8_t> i1(n), i2(n);
      std::vector<int32_t> v1(n), v2(n);
      kern::nat_quantize(x.data(), n, 0, 1.0f, 13, 5, own, 9, i1.data(), v1.data());
      kern::nat_quantize_scalar(x.data(), n, 0, 1.0f, 13, 5, own, 9, i2.data(), v2.data());
      ASSERT_EQ(i1, i2);
      ASSERT_EQ(v1, v2);
      for (int32_t v : v2) ASSERT_EQ(v, 0);
    }
  });
}

TEST(SimdKernels, NatQuantizeOnPowersOfTwoAndWindowEdges) {
  std::vector<float> x;
  for (int e = -30; e <= 30; ++e) {
    const float p = std::ldexp(1.0f, e);
    for (float v : {p, std::nextafter(p, 0.0f), std::nextafter(p, 1e30f), 1.5f * p}) {
      x.push_back(v);
      x.push_back(-v);
    }
  }
  for (float v : {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f, 3.4e38f, -3.4e38f}) x.push_back(v);
  for_each_target([&] {
    for (int levels : {1, 2, 7, 15, 31}) {
      for (int e : {-127, -40, -3, 0, 5, 95, 96, 100}) {
        for (uint64_t n : {x.size(), x.size() - 3, uint64_t{5}}) {
          for (float enc : {0.75f, 1.0f}) {  // 1: Cnat, whose kernel skips the product
            const int bits = 6;
            const rng::Stream own{42, 2, 1};
            std::vector<uint8_t> i1(n), i2(n), i3(n);
            std::vector<int32_t> v1(n), v2(n);
            kern::nat_quantize(x.data(), n, e, enc, levels, bits, own, 9, i1.data(), v1.data());
            kern::nat_quantize_scalar(x.data(), n, e, enc, levels, bits, own, 9, i2.data(), v2.data());
            ASSERT_EQ(i1, i2) << "levels " << levels << " e " << e << " n " << n << " enc " << enc;
            ASSERT_EQ(v1, v2) << "levels " << levels << " e " << e << " n " << n << " enc " << enc;
            kern::nat_quantize(x.data(), n, e, enc, levels, bits, own, 9, i3.data(), nullptr);  // codes only
            ASSERT_EQ(i3, i2) << "levels " << levels << " e " << e << " n " << n << " enc " << enc;
            // Error feedback's x + add, summed as read: the codes of the staged sum, and the sum.
            std::vector<float> add(n), staged(n + 16, 9.0f), ref(n + 16, 9.0f);
            for (uint64_t k = 0; k < n; ++k) add[k] = x[(k * 7) % n] * 0.25f;
            kern::add_pair_scalar(x.data(), add.data(), n, ref.data());
            kern::nat_quantize(x.data(), n, e, enc, levels, bits, own, 9, i1.data(), v1.data(), nullptr, add.data(),
                               staged.data());
            kern::nat_quantize_scalar(ref.data(), n, e, enc, levels, bits, own, 9, i2.data(), v2.data());
            ASSERT_EQ(i1, i2) << "add: levels " << levels << " e " << e << " n " << n << " enc " << enc;
            ASSERT_EQ(v1, v2) << "add: levels " << levels << " e " << e << " n " << n << " enc " << enc;
            ASSERT_TRUE(same_bits(staged.data(), ref.data(), (n + 16) * 4)) << "add: " << first_diff(staged, ref);
          }
        }
      }
    }
  });
}

// nat_quantize at its rounding thresholds: each element placed exactly on, one ulp below or one
// ulp above the point where its own draw j decides (u = (2 j + 1) 2^-17 against the fraction of
// r = |x| 2^e: the mantissa (2 j + 1) 2^6 + d for r >= 1, r 2^16 = j + 1/2 (+- 1 ulp) below 1), so
// a kernel whose comparison is off by one in either direction differs from the reference.
TEST(SimdKernels, NatQuantizeAtTheDrawThresholds) {
  const rng::Stream own{7, 3, 2};
  const uint64_t blk = 5, n = 4096;
  const auto key = rng::make_key(own);
  for_each_target([&] {
    for (int e : {-100, -3, 0, 7, 90}) {
      std::vector<float> x(n);
      for (uint64_t k = 0; k < n; ++k) {
        const auto r = rng::draw4(key, own, rng::kPurposeRound, blk, static_cast<uint32_t>(k / rng::kRoundGroup));
        const uint32_t j = rng::round_bits(r, static_cast<uint32_t>(k % rng::kRoundGroup));
        const int d = static_cast<int>(k % 3) - 1;  // -1, 0, +1
        float rr;
        if ((k / 3) % 2 == 0) {
          // r in [2^m, 2^(m+1)) with mantissa (2 j + 1) 2^6 + d.
          const int m = static_cast<int>(k % 5);
          rr = elem::bits_float(static_cast<uint32_t>(127 + m) << 23 | static_cast<uint32_t>(static_cast<int>((2 * j + 1) << 6) + d));
        } else {
          const float t = static_cast<float>(2 * j + 1) * (1.0f / 131072.0f);  // exact
          rr = d < 0 ? std::nextafter(t, 0.0f) : d > 0 ? std::nextafter(t, 1.0f) : t;
        }
        const float v = std::ldexp(rr, -e);
        x[k] = (k / 6) % 2 ? -v : v;
      }
      for (int levels : {4, 15}) {
        const int bits = 5;
        std::vector<uint8_t> i1(n), i2(n), p1((n * bits + 7) / 8), p2(p1.size());
        std::vector<int32_t> v1(n), v2(n);
        kern::nat_quantize(x.data(), n, e, 1.0f, levels, bits, own, blk, i1.data(), v1.data());
        kern::nat_quantize_scalar(x.data(), n, e, 1.0f, levels, bits, own, blk, i2.data(), v2.data());
        ASSERT_EQ(i1, i2) << "e " << e << " levels " << levels;
        ASSERT_EQ(v1, v2) << "e " << e << " levels " << levels;
        kern::nat_quantize(x.data(), n, e, 1.0f, levels, bits, own, blk, i1.data(), nullptr, p1.data());
        kern::pack_bits_scalar(i2.data(), n, bits, p2.data());
        ASSERT_EQ(p1, p2) << "packed: e " << e << " levels " << levels;
      }
    }
  });
}

// nat_quantize with packed: the same bytes as the scalar codes packed by pack_bits_scalar, for
// every width below 8 (the AVX-512 kernel packs 128 codes at a time in registers, the rest from
// idx), codes with and without values, and nothing written past the packed bytes.
TEST(SimdKernels, NatQuantizePackedMatchesScalarPack) {
  for_each_target([&] {
    for (Input kind : {Input::kGauss, Input::kMixed, Input::kPow2, Input::kZeros}) {
      for (uint64_t n : {uint64_t{5}, uint64_t{128}, uint64_t{1000}, uint64_t{1024}, uint64_t{16384}, uint64_t{16389}}) {
        const auto x = make_input(kind, n, 11);
        for (int bits = 2; bits <= 8; ++bits) {
          const int levels = std::min((1 << (bits - 1)) - 1, 30);  // values +-2^(level-1) fit in int32
          for (int e : {-3, 0, 7}) {
            for (bool with_val : {false, true}) {
              const rng::Stream own{42, 3, 5};
              std::vector<uint8_t> i1(n), i2(n);
              std::vector<int32_t> v1(n), v2(n);
              const uint64_t bytes = (n * static_cast<uint64_t>(bits) + 7) / 8;
              std::vector<uint8_t> p1(bytes + 64, 0xA5), p2(bytes, 0);
              // (with values: also error feedback's x + add, summed as read, against the staged sum)
              std::vector<float> add(with_val ? n : 0), staged(n), ref(x.begin(), x.end());
              for (uint64_t k = 0; k < add.size(); ++k) add[k] = static_cast<float>(k % 5) - 2.0f;
              if (with_val) kern::add_pair_scalar(x.data(), add.data(), n, ref.data());
              kern::nat_quantize(x.data(), n, e, 1.0f, levels, bits, own, 9, i1.data(), with_val ? v1.data() : nullptr,
                                 p1.data(), with_val ? add.data() : nullptr, with_val ? staged.data() : nullptr);
              kern::nat_quantize_scalar(ref.data(), n, e, 1.0f, levels, bits, own, 9, i2.data(), v2.data());
              if (with_val) {
                ASSERT_TRUE(same_bits(staged.data(), ref.data(), n * 4)) << first_diff(staged, ref);
              }
              kern::pack_bits_scalar(i2.data(), n, bits, p2.data());
              const std::string what = std::string(input_name(kind)) + " n " + std::to_string(n) + " bits " +
                                       std::to_string(bits) + " e " + std::to_string(e) + " val " +
                                       std::to_string(with_val);
              ASSERT_EQ(std::vector<uint8_t>(p1.begin(), p1.begin() + bytes), p2) << what;
              for (uint64_t k = bytes; k < p1.size(); ++k) ASSERT_EQ(p1[k], 0xA5) << what << " guard byte " << k;
              if (with_val) {
                ASSERT_EQ(v1, v2) << what;
              }
            }
          }
        }
      }
    }
  });
}

TEST(SimdKernels, SignsMatchTheScalarRht) {
  for_each_target([&] {
    for (uint64_t n : {uint64_t{1}, uint64_t{5}, uint64_t{64}, uint64_t{127}, uint64_t{128}, uint64_t{1000},
                       uint64_t{4096}, uint64_t{70001}}) {
      const rng::Stream shared{7, rng::kSharedStream, 3};
      auto x = make_input(Input::kMixed, n, 3);
      auto y = x;
      apply_signs(x.data(), n, shared, 12);
      kern::apply_signs_scalar(y.data(), n, shared, 12);
      ASSERT_TRUE(same_bits(x.data(), y.data(), n * 4)) << "apply_signs n=" << n;
      golden_apply_signs(y.data(), n, shared, 12);
      apply_signs(x.data(), n, shared, 12);
      ASSERT_TRUE(same_bits(x.data(), y.data(), n * 4)) << "apply_signs twice n=" << n;
      for (int e : {-130, -1, 0, 3, 126}) {
        const auto src = make_input(Input::kMixed, n, 4);
        for (uint64_t wire : {n, n + 37}) {
          std::vector<float> a(wire), b(wire);
          kern::prescale_signs(src.data(), n, wire, e, shared, 12, a.data());
          kern::prescale_signs_scalar(src.data(), n, wire, e, shared, 12, b.data());
          ASSERT_TRUE(same_bits(a.data(), b.data(), wire * 4)) << "prescale n=" << n << " e=" << e;
        }
        std::vector<float> a(n), b(n);
        kern::signs_postscale(src.data(), n, e, shared, 12, nullptr, a.data());
        kern::signs_postscale_scalar(src.data(), n, e, shared, 12, nullptr, b.data());
        ASSERT_TRUE(same_bits(a.data(), b.data(), n * 4)) << "postscale n=" << n << " e=" << e;
        kern::signs_postscale(src.data(), n, e, shared, 12, x.data(), a.data());
        kern::signs_postscale_scalar(src.data(), n, e, shared, 12, x.data(), b.data());
        ASSERT_TRUE(same_bits(a.data(), b.data(), n * 4)) << "postscale-sub n=" << n << " e=" << e;
      }
    }
  });
}

// The fused RHT kernels (prescale + signs + FWHT; FWHT + signs + postscale [+ residual]) against
// the composition of the scalar references, for every pass layout of the register FWHT
// (2^6 .. 2^20: one pass, first pass plus 1..4 later passes of 1..4 stages) and ragged tails.
TEST(SimdKernels, RotateMatchesScalarComposition) {
  for_each_target([&] {
    for (int lg : {6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20}) {
      const uint64_t wire = uint64_t{1} << lg;
      const rng::Stream shared{7, rng::kSharedStream, 5};
      const auto x = make_input(lg % 2 ? Input::kMixed : Input::kGauss, wire, 6);
      const auto sub = make_input(Input::kGauss, wire, 8);
      for (uint64_t elems : {wire, wire - 1, wire / 2 + 3, uint64_t{1}}) {
        for (int e : {-130, -2, 0, 100}) {
          if (lg >= 16 && e != -2) continue;  // large sizes: one scale is enough
          std::vector<float> a(wire), b(wire);
          kern::rotate_forward(x.data(), elems, wire, e, shared, 21, a.data());
          kern::rotate_forward_scalar(x.data(), elems, wire, e, shared, 21, b.data());
          ASSERT_TRUE(same_bits(a.data(), b.data(), wire * 4))
              << "forward 2^" << lg << " elems " << elems << " e " << e << ": " << first_diff(a, b);
          for (const float* sb : {static_cast<const float*>(nullptr), sub.data()}) {
            std::vector<float> wa = x, wb = x, oa(wire, 7.0f), ob(wire, 7.0f);
            kern::rotate_inverse(wa.data(), wire, elems, e, shared, 21, sb, oa.data());
            kern::rotate_inverse_scalar(wb.data(), wire, elems, e, shared, 21, sb, ob.data());
            ASSERT_TRUE(same_bits(oa.data(), ob.data(), wire * 4))
                << "inverse 2^" << lg << " m " << elems << " e " << e << (sb ? " sub" : "") << ": "
                << first_diff(oa, ob);
          }
        }
      }
    }
  });
}

// The fused THC encode of a block (rounding inside the RHT's last pass: AVX-512 when the cell
// table fits registers, g <= 31, AVX2 with it gathered, g <= 255; other cases and small blocks
// compose the kernels), in every output form,
// against the scalar composition rotate_forward + thc_quantize (+ pack_bits).
TEST(SimdKernels, EncodeBlockMatchesScalar) {
  for_each_table_lookup([&] {
    for_each_target([&] {
      for (const auto& bg : {std::make_pair(4, 30), std::make_pair(4, 60), std::make_pair(5, 31), std::make_pair(2, 3),
                             std::make_pair(4, 300)}) {
        const Codec c(thc(bg.first, bg.second), 4);
        const kern::ThcTables tb = thc_tables(c);
        for (int lg : {8, 10, 14, 15}) {
          const uint64_t wire = uint64_t{1} << lg;
          auto x = make_input(lg % 2 ? Input::kMixed : Input::kGauss, wire, 3);
          // A straggler's NaN rounds as 0 (in one size only: the rotation spreads it over the
          // whole block, whose rounding then sees nothing but NaN).
          if (lg == 10) x[7] = std::numeric_limits<float>::quiet_NaN();
          const rng::Stream shared{7, rng::kSharedStream, 5}, own{7, 2, 5};
          const auto y = make_input(Input::kGauss, wire, 4);  // error feedback's e, added to x
          for (uint64_t elems : {wire, wire - 5}) {
            for (int e : {0, -3}) {
              for (const float* add : {static_cast<const float*>(nullptr), y.data()}) {
                SCOPED_TRACE("b " + std::to_string(bg.first) + " g " + std::to_string(bg.second) + " 2^" +
                             std::to_string(lg) + " elems " + std::to_string(elems) + " e " + std::to_string(e) +
                             (add ? " + add" : ""));
                const float enc = 0.0137f;
                std::vector<float> wa(wire), wb(wire);
                std::vector<uint8_t> ia(wire, 1), ib(wire, 2);
                std::vector<int32_t> va(wire, 3), vb(wire, 4);
                // staged: x + add for the real elements, nothing written past them.
                std::vector<float> sa(wire + 16, 9.0f), sb(wire + 16, 9.0f), sc(wire + 16, 9.0f);
                kern::thc_encode_block(x.data(), add, add ? sa.data() : nullptr, elems, wire, e, shared, 11, enc, tb,
                                       own, wa.data(), ia.data(), nullptr, va.data(), x.data(), add);
                kern::thc_encode_block_scalar(x.data(), add, add ? sb.data() : nullptr, elems, wire, e, shared, 11, enc,
                                              tb, own, wb.data(), ib.data(), nullptr, vb.data());
                ASSERT_EQ(ia, ib);
                ASSERT_EQ(va, vb);
                if (add) {
                  ASSERT_TRUE(same_bits(sa.data(), sb.data(), (wire + 16) * 4)) << first_diff(sa, sb);
                  kern::add_pair_scalar(x.data(), add, elems, sc.data());
                  ASSERT_TRUE(same_bits(sa.data(), sc.data(), (wire + 16) * 4)) << first_diff(sa, sc);
                  // x + add encodes exactly like that sum passed as x.
                  std::vector<uint8_t> id(wire, 6);
                  kern::thc_encode_block_scalar(sc.data(), nullptr, nullptr, elems, wire, e, shared, 11, enc, tb, own,
                                                wb.data(), id.data(), nullptr, nullptr);
                  ASSERT_EQ(id, ib);
                }
                std::vector<uint8_t> ic(wire, 5);
                kern::thc_encode_block(x.data(), add, add ? sa.data() : nullptr, elems, wire, e, shared, 11, enc, tb,
                                       own, wa.data(), ic.data(), nullptr, nullptr, nullptr, nullptr);
                ASSERT_EQ(ic, ib);
                if (bg.first == 4) {
                  std::vector<uint8_t> pa(wire / 2 + 8, 0xAB), pb(wire / 2 + 8, 0xAB), scratch(wire);
                  kern::thc_encode_block(x.data(), add, add ? sa.data() : nullptr, elems, wire, e, shared, 11, enc, tb,
                                         own, wa.data(), scratch.data(), pa.data(), nullptr, nullptr, nullptr);
                  kern::pack_bits_scalar(ib.data(), wire, 4, pb.data());
                  ASSERT_EQ(pa, pb);
                }
              }
            }
          }
        }
      }
    });
  });
}

// The fused THC decode of a block (dequantisation in the first FWHT pass, inverse signs and
// scale in the last), also with the non-temporal last pass of large calls, which joins lines from
// two vectors when out is not 64-byte aligned: every misalignment, every sum type, whole and
// partial blocks, with and without a residual; nothing outside out[0..m) is written.
TEST(SimdKernels, DecodeBlockMatchesScalar) {
  std::mt19937 gen(12);
  for_each_target([&] {
    for (int lg : {8, 10, 11, 14, 15, 16}) {
      const uint64_t wire = uint64_t{1} << lg;
      const rng::Stream shared{7, rng::kSharedStream, 5};
      const auto sub = make_input(Input::kGauss, wire, 8);
      for (IntType t : {IntType::kU8, IntType::kU16, IntType::kU32, IntType::kI8, IntType::kI16, IntType::kI32}) {
        const size_t ws = int_size(t);
        std::vector<uint8_t> sums((wire + 3) * ws);
        for (auto& b : sums) b = static_cast<uint8_t>(gen());
        for (uint64_t m : {wire, wire - 5}) {
          for (bool stream : {false, true}) {
            for (const float* sb : {static_cast<const float*>(nullptr), sub.data()}) {
              for (uint64_t mis : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15}) {
                if (!stream && mis != 1) continue;
                if (lg != 14 && t != IntType::kU8 && mis > 1) continue;  // keep the grid small
                SCOPED_TRACE("2^" + std::to_string(lg) + " " + int_name(t) + " m " + std::to_string(m) +
                             (stream ? " stream" : "") + (sb ? " sub" : "") + " out +" + std::to_string(mis));
                // out at `mis` floats past a 64-byte boundary, guards around it.
                std::vector<float> wa(wire), wb(wire), oa(wire + 64, 7.0f), ob(wire + 64, 7.0f);
                auto at = [mis](std::vector<float>& v) {  // 16 guard floats, then `mis` past a line start
                  const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
                  return v.data() + ((64 - p % 64) % 64) / 4 + 16 + mis;
                };
                const int e = lg % 2 ? -3 : 0;
                kern::thc_decode_block(t, sums.data(), 3, wire, m, 40.0f, 0.1436f, 0.37f, e, shared, 21, sb, at(oa),
                                       wa.data(), stream);
                kern::thc_decode_block_scalar(t, sums.data(), 3, wire, m, 40.0f, 0.1436f, 0.37f, e, shared, 21, sb,
                                              at(ob), wb.data());
                const std::vector<float> ra(at(oa) - 16, at(oa) + wire + 16), rb(at(ob) - 16, at(ob) + wire + 16);
                ASSERT_TRUE(same_bits(ra.data(), rb.data(), ra.size() * 4)) << first_diff(ra, rb);
              }
            }
          }
        }
      }
    }
  });
}

TEST(SimdKernels, DequantAndStoreEveryIntType) {
  std::mt19937 gen(5);
  const uint64_t n = 1037;
  std::vector<int32_t> v(n);
  for (auto& a : v) a = static_cast<int32_t>(gen());
  // Small, boundary and large values of every width (beyond 2^24 the float conversion rounds).
  const int32_t special[] = {0, 1, -1, 127, -128, 128, 255, 256, 32767, -32768, 65535, 65536, (1 << 24) + 1,
                             (1 << 24) + 3, 2147483647, -2147483647 - 1};
  for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); ++i) v[i] = special[i];
  std::vector<float> sub(n);
  for (auto& s : sub) s = std::normal_distribution<float>()(gen);
  for_each_target([&] {
    for (IntType t : {IntType::kU8, IntType::kU16, IntType::kU32, IntType::kI8, IntType::kI16, IntType::kI32}) {
      SCOPED_TRACE(int_name(t));
      const size_t ws = int_size(t);
      std::vector<uint8_t> a(n * ws + 16, 0x5A), b(n * ws + 16, 0x5A);
      kern::store_values(t, a.data(), 3, v.data(), n - 3);
      kern::store_values_scalar(t, b.data(), 3, v.data(), n - 3);
      ASSERT_EQ(a, b);
      for (uint64_t off : {uint64_t{0}, uint64_t{5}}) {
        std::vector<float> x(n), y(n);
        kern::thc_dequant(t, a.data(), off, n - off, 60.0f, 0.1436f, 0.37f, x.data());
        kern::thc_dequant_scalar(t, a.data(), off, n - off, 60.0f, 0.1436f, 0.37f, y.data());
        ASSERT_TRUE(same_bits(x.data(), y.data(), (n - off) * 4)) << "thc_dequant " << first_diff(x, y);
        for (const float* s : {static_cast<const float*>(nullptr), static_cast<const float*>(sub.data())}) {
          for (int e : {-200, -3, 0, 120}) {
            kern::nat_dequant(t, a.data(), off, n - off, 0.8125f, e, s, x.data());
            kern::nat_dequant_scalar(t, a.data(), off, n - off, 0.8125f, e, s, y.data());
            ASSERT_TRUE(same_bits(x.data(), y.data(), (n - off) * 4)) << "nat_dequant " << first_diff(x, y);
            // Streamed (non-temporal) stores from an output at every alignment: the same values,
            // nothing written outside [out, out + count).
            for (uint64_t mis : {0, 1, 3, 7, 15}) {
              std::vector<float> z(n + 16, 7.0f);
              kern::nat_dequant(t, a.data(), off, n - off, 0.8125f, e, s, z.data() + mis, true);
              ASSERT_TRUE(same_bits(z.data() + mis, y.data(), (n - off) * 4))
                  << "nat_dequant stream +" << mis << " " << first_diff(std::vector<float>(z.begin() + mis, z.end()), y);
              for (uint64_t k = 0; k < z.size(); ++k) {
                if (k < mis || k >= mis + (n - off)) {
                  ASSERT_EQ(z[k], 7.0f) << "stream +" << mis << " wrote " << k;
                }
              }
            }
          }
        }
      }
    }
  });
}

TEST(SimdKernels, PackUnpackEveryWidth) {
  std::mt19937 gen(8);
  for_each_target([&] {
    for (int bits = 1; bits <= 8; ++bits) {
      for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{8}, uint64_t{9}, uint64_t{63},
                         uint64_t{64}, uint64_t{65}, uint64_t{1000}, uint64_t{1025}, uint64_t{70000}}) {
        std::vector<uint8_t> codes(n);
        for (auto& c : codes) c = static_cast<uint8_t>(gen() & ((1u << bits) - 1));
        const uint64_t nb = (n * bits + 7) / 8;
        std::vector<uint8_t> a(nb + 16, 0xEE), b(nb + 16, 0xEE);
        pack_bits(codes.data(), n, bits, a.data());
        golden_pack(codes.data(), n, bits, b.data());
        ASSERT_EQ(a, b) << "pack bits=" << bits << " n=" << n;
        kern::pack_bits_scalar(codes.data(), n, bits, b.data());
        ASSERT_EQ(a, b);
        std::vector<uint8_t> u(n + 16, 0x77), w(n + 16, 0x77);
        unpack_bits(a.data(), n, bits, u.data());
        kern::unpack_bits_scalar(a.data(), n, bits, w.data());
        ASSERT_EQ(u, w) << "unpack bits=" << bits << " n=" << n;
        ASSERT_TRUE(same_bits(u.data(), codes.data(), n));
      }
    }
  });
}

TEST(SimdKernels, LookupAdd4U8MatchesScalar) {
  std::mt19937 gen(9);
  for_each_target([&] {
    uint8_t table[16];
    for (auto& t : table) t = static_cast<uint8_t>(gen());
    for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{31}, uint64_t{32}, uint64_t{33}, uint64_t{64},
                       uint64_t{1000}, uint64_t{65537}}) {
      std::vector<uint8_t> packed((n + 1) / 2 + 1);
      for (auto& b : packed) b = static_cast<uint8_t>(gen());
      std::vector<uint8_t> a(n + 8), b(n + 8);
      for (auto& x : a) x = static_cast<uint8_t>(gen());
      b = a;
      kern::lookup_add4_u8(table, packed.data(), n, a.data());
      kern::lookup_add4_u8_scalar(table, packed.data(), n, b.data());
      ASSERT_EQ(a, b) << "n=" << n;  // (the definition itself: LookupAdd in schedules_test)
    }
  });
}

TEST(SimdKernels, LookupAdd32U16MatchesScalar) {
  std::mt19937 gen(10);
  for_each_target([&] {
    uint16_t table[32];
    for (auto& t : table) t = static_cast<uint16_t>(gen());  // values that wrap as they add
    for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{15}, uint64_t{16}, uint64_t{17}, uint64_t{64},
                       uint64_t{1000}, uint64_t{65537}}) {
      std::vector<uint8_t> codes(n);
      for (uint64_t k = 0; k < n; ++k) codes[k] = k < 64 ? static_cast<uint8_t>(k % 32) : static_cast<uint8_t>(gen() % 32);
      std::vector<uint16_t> a(n + 8), b(n + 8);
      for (auto& x : a) x = static_cast<uint16_t>(gen());
      b = a;
      kern::lookup_add32_u16(table, codes.data(), n, a.data());
      kern::lookup_add32_u16_scalar(table, codes.data(), n, b.data());
      ASSERT_EQ(a, b) << "n=" << n;  // (the definition itself: LookupAdd in schedules_test)
    }
  });
}

TEST(SimdKernels, PreludeStatistics) {
  for_each_target([&] {
    for (Input kind : {Input::kGauss, Input::kZeros, Input::kDenormal, Input::kHuge, Input::kPow2, Input::kMixed}) {
      for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{15}, uint64_t{16}, uint64_t{17}, uint64_t{1025},
                         uint64_t{70000}}) {
        auto x = make_input(kind, n, 77);
        const double s1 = kern::sum_squares(x.data(), n), s2 = kern::sum_squares_scalar(x.data(), n);
        ASSERT_EQ(std::memcmp(&s1, &s2, 8), 0) << input_name(kind) << " n=" << n;
        // The fixed order differs from a left-to-right sum only by double rounding.
        double seq = 0;
        for (float v : x) seq += static_cast<double>(v) * v;
        ASSERT_NEAR(s1, seq, 1e-12 * seq + 1e-300);
        bool b1, b2;
        const float m1 = kern::max_abs(x.data(), n, &b1), m2 = kern::max_abs_scalar(x.data(), n, &b2);
        ASSERT_EQ(elem::float_bits(m1), elem::float_bits(m2));
        ASSERT_EQ(b1, b2);
        // Of x + e without storing it: the statistics of the stored sum, bit for bit.
        {
          const auto e = make_input(Input::kGauss, n, 78);
          std::vector<float> xe(n);
          for (uint64_t i = 0; i < n; ++i) xe[i] = x[i] + e[i];
          const double t1 = kern::sum_squares_sum(x.data(), e.data(), n), t2 = kern::sum_squares(xe.data(), n),
                       t3 = kern::sum_squares_sum_scalar(x.data(), e.data(), n);
          ASSERT_EQ(std::memcmp(&t1, &t2, 8), 0) << input_name(kind) << " n=" << n;
          ASSERT_EQ(std::memcmp(&t1, &t3, 8), 0) << input_name(kind) << " n=" << n;
          bool c1, c2, c3;
          const float u1 = kern::max_abs_sum(x.data(), e.data(), n, &c1), u2 = kern::max_abs(xe.data(), n, &c2),
                      u3 = kern::max_abs_sum_scalar(x.data(), e.data(), n, &c3);
          ASSERT_EQ(elem::float_bits(u1), elem::float_bits(u2)) << input_name(kind) << " n=" << n;
          ASSERT_EQ(elem::float_bits(u1), elem::float_bits(u3)) << input_name(kind) << " n=" << n;
          ASSERT_EQ(c1, c2);
          ASSERT_EQ(c1, c3);
        }
        if (n > 3) {  // non-finite detection
          for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()}) {
            auto y = x;
            y[n / 2] = bad;
            const float a1 = kern::max_abs(y.data(), n, &b1), a2 = kern::max_abs_scalar(y.data(), n, &b2);
            ASSERT_TRUE(b1);
            ASSERT_TRUE(b2);
            const std::vector<float> zero(n, 0.0f);
            bool b3;
            ASSERT_EQ(elem::float_bits(kern::max_abs_sum(y.data(), zero.data(), n, &b3)), elem::float_bits(a1));
            ASSERT_TRUE(b3);
            ASSERT_FALSE(std::isfinite(kern::sum_squares_sum(y.data(), zero.data(), n)));
            ASSERT_EQ(elem::float_bits(a1), elem::float_bits(a2));
            ASSERT_FALSE(std::isfinite(kern::sum_squares(y.data(), n)));
          }
        }
      }
    }
  });
}

// The hierarchical communicator's host sums and means, error feedback's x = g + e: the same bits as the scalar loops, on
// every target, for every length (vector body and tail), denormals and non-finite values included.
TEST(SimdKernels, AddPairAndScaleByMatchScalar) {
  for_each_target([&] {
    for (Input kind : {Input::kGauss, Input::kDenormal, Input::kHuge, Input::kMixed}) {
      for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{15}, uint64_t{16}, uint64_t{33}, uint64_t{1025},
                         uint64_t{70001}}) {
        const auto x = make_input(kind, n, 5), y = make_input(Input::kGauss, n, 6);
        auto a = y, b = y;
        if (n > 3) a[n / 3] = b[n / 3] = std::numeric_limits<float>::infinity();
        kern::add_pair(a.data(), x.data(), n, a.data());  // in place, as the host sums
        kern::add_pair_scalar(b.data(), x.data(), n, b.data());
        ASSERT_TRUE(n == 0 || std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0) << input_name(kind) << " n=" << n;
        std::vector<float> e(n), f(n);
        kern::add_pair(x.data(), y.data(), n, e.data());
        kern::add_pair_scalar(x.data(), y.data(), n, f.data());
        ASSERT_TRUE(n == 0 || std::memcmp(e.data(), f.data(), n * sizeof(float)) == 0) << input_name(kind) << " n=" << n;
        for (float sc : {0.25f, 1.0f / 3.0f, 1e-30f}) {
          auto c = x, d = x;
          kern::scale_by(c.data(), n, sc);
          kern::scale_by_scalar(d.data(), n, sc);
          ASSERT_TRUE(n == 0 || std::memcmp(c.data(), d.data(), n * sizeof(float)) == 0)
              << input_name(kind) << " n=" << n;
        }
      }
    }
  });
}

}  // namespace
}  // namespace thc::codec
