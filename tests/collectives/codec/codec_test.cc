#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/codec/table_solver.h"
#include "common/status.h"

namespace thc::codec {
namespace {

std::vector<float> gaussian(uint64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

double sq(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}
double sq(const std::vector<float>& a) { return sq(a, std::vector<float>(a.size(), 0.0f)); }

// Prelude on each worker, MAX across them (what the network does).
std::vector<float> global_stats(const Codec& c, const std::vector<std::vector<float>>& xs) {
  const Layout l = c.layout(xs[0].size());
  std::vector<float> g(l.nblocks, 0.0f), s(l.nblocks);
  for (const auto& x : xs) {
    EXPECT_TRUE(c.prelude(x.data(), x.size(), s.data()));
    for (uint64_t b = 0; b < l.nblocks; ++b) g[b] = std::max(g[b], s[b]);
  }
  return g;
}

// Encode every worker's x in value form, sum the integers, decode. Optionally return each
// worker's own decode too.
std::vector<float> roundtrip(const Codec& c, const std::vector<std::vector<float>>& xs, uint32_t round,
                             bool mean, std::vector<std::vector<float>>* singles = nullptr) {
  const uint64_t count = xs[0].size();
  const Layout l = c.layout(count);
  const auto stats = global_stats(c, xs);
  const size_t w = int_size(c.sum_type());
  std::vector<int64_t> total(l.wire_count, 0);
  std::vector<uint8_t> vals(l.wire_count * w);
  for (size_t r = 0; r < xs.size(); ++r) {
    CallRng rng{99, static_cast<uint32_t>(r), round};
    Codec::EncodeOut out;
    out.values = vals.data();
    c.encode(l, 0, l.nblocks, xs[r].data(), stats.data(), rng, out);
    for (uint64_t i = 0; i < l.wire_count; ++i) total[i] += load_int(c.sum_type(), vals.data(), i);
    if (singles) {
      std::vector<float> d(count);
      c.decode(l, 0, l.nblocks, vals.data(), stats.data(), rng, 1, false, d.data());
      singles->push_back(d);
    }
  }
  std::vector<uint8_t> sums(l.wire_count * w);
  for (uint64_t i = 0; i < l.wire_count; ++i) {
    EXPECT_LE(std::llabs(total[i]), int_max(c.sum_type()));
    store_int(c.sum_type(), sums.data(), i, total[i]);
  }
  std::vector<float> out(count);
  c.decode(l, 0, l.nblocks, sums.data(), stats.data(), CallRng{99, 0, round}, static_cast<int>(xs.size()), mean,
           out.data());
  return out;
}

Params thc_params(int bits = 4, int g = 30, double p = 1.0 / 32, int block_log2 = 10) {
  Params p_;
  p_.scheme = Scheme::kThc;
  p_.bits = bits;
  p_.granularity = g;
  p_.p = p;
  p_.block_log2 = block_log2;
  return p_;
}
Params nat_params(Scheme s, int block_log2 = 10, int width = 16) {
  Params p;
  p.scheme = s;
  p.block_log2 = block_log2;
  p.nat_width = width;
  return p;
}

std::vector<Params> all_schemes() {
  Params u = thc_params();
  u.scheme = Scheme::kUniformThc;
  Params dinf = nat_params(Scheme::kDnat);
  dinf.dnat_norm = 0;
  Params d2 = nat_params(Scheme::kDnat);
  d2.nat_levels = 8;
  return {thc_params(), u, nat_params(Scheme::kCnat), d2, dinf};
}

// ---------------------------------------------------------------------------------------------

TEST(Codec, DefaultTableIsTheSolversOptimum) {
  Codec c(thc_params(4, 30), 4);
  const auto sol = solve_optimal_table(4, 30, 1.0 / 32);
  ASSERT_EQ(c.table().size(), sol.table.size());
  for (size_t i = 0; i < sol.table.size(); ++i) EXPECT_EQ(c.table()[i], sol.table[i]);
  EXPECT_EQ(c.sum_type(), IntType::kU8);  // 4 * 30 = 120 fits 8 bits
  EXPECT_EQ(Codec(thc_params(4, 30), 9).sum_type(), IntType::kU16);
  EXPECT_NEAR(c.t_p(), 2.1538746940614564, 1e-12);
}

TEST(Codec, UnbiasedOverRoundsForEveryScheme) {
  // THC truncates at t_p; with p = 1e-7 truncation practically never happens, so its stochastic
  // rounding must be unbiased. The natural codes are unbiased as they are.
  for (Params p : all_schemes()) {
    if (p.scheme == Scheme::kThc) {
      p.p = 1e-7;
      p.granularity = 60;
    }
    if (p.scheme == Scheme::kUniformThc) p.p = 1e-7;
    Codec c(p, 1);
    const auto x = gaussian(1500, 3);
    const int R = 400;
    std::vector<double> acc(x.size(), 0.0);
    double single = 0;
    for (int r = 0; r < R; ++r) {
      const auto d = roundtrip(c, {x}, static_cast<uint32_t>(r), false);
      single += sq(d, x);
      for (size_t i = 0; i < x.size(); ++i) acc[i] += d[i];
    }
    single /= R;  // E||d - x||^2 of one round
    double err = 0;
    for (size_t i = 0; i < x.size(); ++i) err += (acc[i] / R - x[i]) * (acc[i] / R - x[i]);
    // Unbiased: E||mean - x||^2 = single / R. A biased codec would leave a floor that does not
    // shrink with R; 2x the variance bound over 1500 coordinates is far outside chance.
    EXPECT_LT(err, 2.0 * single / R) << scheme_name(p.scheme) << " single-round error " << single;
  }
}

// The rounding contract of philox.h: element k of a group takes the k-th little-endian u16 of the
// call's 128 bits, and u = (2 j + 1) / 2^17, so that P(u < p) over the 2^16 values of j is p
// rounded to the nearest multiple of 2^-16 (halves down), exact at 0 and 1.
TEST(Rng, RoundingDrawsAreSixteenBitMidpoints) {
  const r123::Philox4x32::ctr_type r = {{0x22221111u, 0x44443333u, 0x66665555u, 0x88887777u}};
  for (uint32_t k = 0; k < rng::kRoundGroup; ++k)
    EXPECT_EQ(rng::round_bits(r, k), 0x1111u * (k + 1)) << "element " << k;
  std::vector<float> u(65536);
  for (uint32_t j = 0; j < 65536; ++j) {
    u[j] = rng::round_unit(j);
    EXPECT_EQ(static_cast<double>(u[j]), (j + 0.5) / 65536.0);
  }
  auto p_up = [&](float p) {
    uint32_t n = 0;
    for (float x : u) n += x < p ? 1 : 0;
    return n;
  };
  EXPECT_EQ(p_up(0.0f), 0u);
  EXPECT_EQ(p_up(1.0f), 65536u);
  std::mt19937 gen(5);
  for (int t = 0; t < 200; ++t) {
    const uint32_t m = gen() % 65536;
    EXPECT_EQ(p_up(static_cast<float>(m) / 65536.0f), m);              // on the grid: exact
    EXPECT_EQ(p_up((static_cast<float>(m) + 0.5f) / 65536.0f), m);     // a half: down
    EXPECT_EQ(p_up((static_cast<float>(m) + 0.25f) / 65536.0f), m);    // nearest
    EXPECT_EQ(p_up((static_cast<float>(m) + 0.75f) / 65536.0f), m + 1);
  }
}

TEST(Codec, ThcVarianceMatchesTableExpectation) {
  // y = RHT(x) / rms is ~N(0,1); NMSE = table variance + truncation error (both in sigma^2 = 1).
  for (int g : {16, 30, 51}) {
    const Params p = thc_params(4, g, 1.0 / 32, 16);
    Codec c(p, 1);
    const double t = c.t_p();
    const double trunc = 2 * ((1 + t * t) * (1 - normal_cdf(t)) - t * normal_pdf(t));
    const double expect = table_variance(std::vector<int>(c.table().begin(), c.table().end()), g, p.p) + trunc;
    const auto x = gaussian(4 << 16, 11);
    double err = 0;
    const int R = 3;
    for (int r = 0; r < R; ++r) err += sq(roundtrip(c, {x}, r, false), x) / sq(x);
    err /= R;
    EXPECT_NEAR(err / expect, 1.0, 0.03) << "g=" << g << " nmse=" << err << " expected=" << expect;
  }
}

TEST(Codec, UniformThcUsesIdentityTable) {
  Params p = thc_params(3);
  p.scheme = Scheme::kUniformThc;
  Codec c(p, 2);
  EXPECT_EQ(c.granularity(), 7);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.table()[i], i);
}

TEST(Codec, CnatErrorAtMostOneEighthOfNorm) {
  Codec c(nat_params(Scheme::kCnat), 1);
  for (uint32_t seed : {1u, 2u, 3u}) {
    const auto x = gaussian(5000, seed, 3.0f);
    double err = 0;
    const int R = 20;
    for (int r = 0; r < R; ++r) err += sq(roundtrip(c, {x}, r, false), x);
    EXPECT_LE(err / R, sq(x) / 8.0);
  }
  // A value halfway between powers of two has the worst relative variance, 1/9 of x^2 <= 1/8.
  std::vector<float> x(1024, 1.5f);
  double err = 0;
  for (int r = 0; r < 50; ++r) err += sq(roundtrip(c, {x}, r, false), x);
  EXPECT_NEAR(err / 50 / sq(x), 1.0 / 9.0, 0.01);
}

TEST(Codec, CnatOutputsArePowersOfTwo) {
  Codec c(nat_params(Scheme::kCnat), 1);
  const auto x = gaussian(3000, 5, 0.01f);
  const auto d = roundtrip(c, {x}, 0, false);
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] == 0) continue;
    int e;
    const float m = std::frexp(std::fabs(d[i]), &e);
    ASSERT_EQ(m, 0.5f) << d[i];
    ASSERT_EQ(std::signbit(d[i]), std::signbit(x[i]));
  }
}

class Homomorphism : public ::testing::TestWithParam<int> {};

TEST_P(Homomorphism, DecodeOfSumEqualsMeanOfDecodes) {
  const int n = GetParam();
  for (const Params& p : all_schemes()) {
    Codec c(p, n);
    std::vector<std::vector<float>> xs;
    for (int r = 0; r < n; ++r) xs.push_back(gaussian(2500, 100 + r, 1.0f + r));
    std::vector<std::vector<float>> singles;
    const auto agg = roundtrip(c, xs, 5, true, &singles);
    double err = 0, ref = 0;
    for (size_t i = 0; i < agg.size(); ++i) {
      double m = 0;
      for (const auto& s : singles) m += s[i];
      m /= n;
      err += (agg[i] - m) * (agg[i] - m);
      ref += m * m;
    }
    EXPECT_LT(std::sqrt(err / ref), 2e-6) << scheme_name(p.scheme) << " n=" << n;
  }
}
INSTANTIATE_TEST_SUITE_P(Workers, Homomorphism, ::testing::Values(1, 2, 3, 4, 7, 8));

TEST(Codec, IndexFormLookupEqualsValueForm) {
  for (const Params& p : all_schemes()) {
    Codec c(p, 3);
    const auto x = gaussian(3333, 8);
    const Layout l = c.layout(x.size());
    const auto stats = global_stats(c, {x});
    const size_t w = int_size(c.sum_type());
    std::vector<uint8_t> packed(c.packed_bytes(l.wire_count)), vals(l.wire_count * w), looked(l.wire_count * w);
    Codec::EncodeOut out;
    out.packed = packed.data();
    out.values = vals.data();
    c.encode(l, 0, l.nblocks, x.data(), stats.data(), CallRng{1, 0, 0}, out);
    c.lookup(packed.data(), l.wire_count, looked.data());
    EXPECT_EQ(vals, looked) << scheme_name(p.scheme);
  }
}

TEST(Codec, PackingRoundTripsForEveryWidth) {
  std::mt19937 gen(4);
  for (int b = 1; b <= 8; ++b) {
    for (uint64_t n : {0u, 1u, 7u, 8u, 9u, 1000u, 1001u}) {
      std::vector<uint8_t> codes(n), back(n);
      for (auto& v : codes) v = static_cast<uint8_t>(gen() & ((1u << b) - 1));
      std::vector<uint8_t> packed((n * b + 7) / 8 + 1, 0xAA);
      pack_bits(codes.data(), n, b, packed.data());
      unpack_bits(packed.data(), n, b, back.data());
      EXPECT_EQ(codes, back) << "b=" << b << " n=" << n;
      for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(elem::packed_get(packed.data(), i, b), codes[i]);
    }
  }
  // Documented bit order: LSB first. Codes 1,2,3 at 4 bits -> bytes 0x21, 0x03.
  const uint8_t codes[3] = {1, 2, 3};
  uint8_t out[2];
  pack_bits(codes, 3, 4, out);
  EXPECT_EQ(out[0], 0x21);
  EXPECT_EQ(out[1], 0x03);
}

TEST(Codec, OddCountsAndTailBlocks) {
  for (const Params& p : all_schemes()) {
    Codec c(p, 2);
    for (uint64_t count : {1u, 2u, 63u, 1023u, 1024u, 1025u, 2049u, 5000u}) {
      const auto a = gaussian(count, 1), b = gaussian(count, 2);
      const auto d = roundtrip(c, {a, b}, 1, false);
      std::vector<float> s(count);
      for (uint64_t i = 0; i < count; ++i) s[i] = a[i] + b[i];
      const double nmse = sq(d, s) / sq(s);
      for (float v : d) ASSERT_TRUE(std::isfinite(v));
      EXPECT_LT(nmse, count < 64 ? 1.0 : 0.2) << scheme_name(p.scheme) << " count=" << count;
    }
  }
}

TEST(Codec, LayoutPadsOnlyRotatedTails) {
  Codec t(thc_params(), 1);
  const Layout l = t.layout(1025);
  EXPECT_EQ(l.nblocks, 2u);
  EXPECT_EQ(l.tail_elems, 1u);
  EXPECT_EQ(l.tail_wire, 64u);
  EXPECT_EQ(l.wire_count, 1024u + 64u);
  EXPECT_EQ(t.layout(0).nblocks, 0u);
  Codec n(nat_params(Scheme::kCnat), 1);
  EXPECT_EQ(n.layout(1025).wire_count, 1025u);
}

TEST(Codec, AllZeroBlockDecodesToExactZeros) {
  for (const Params& p : all_schemes()) {
    Codec c(p, 3);
    std::vector<float> x(3000, 0.0f);
    for (int i = 1024; i < 2048; ++i) x[i] = 0.5f;  // only the middle block is non-zero
    const auto d = roundtrip(c, {x, x, x}, 0, false);
    for (int i = 0; i < 1024; ++i) ASSERT_EQ(d[i], 0.0f) << scheme_name(p.scheme);
    for (int i = 2048; i < 3000; ++i) ASSERT_EQ(d[i], 0.0f) << scheme_name(p.scheme);
  }
}

TEST(Codec, HugeAndDenormalValuesStayFiniteAndAccurate) {
  for (const Params& p : all_schemes()) {
    Codec c(p, 2);
    for (float scale : {1e37f, 1e-39f, 1e-44f}) {
      auto x = gaussian(2048, 9);
      for (auto& v : x) v *= scale;
      // Two workers with the same input: the sum 2x must not overflow at 1e37 (3.4e38 max).
      const auto d = roundtrip(c, {x, x}, 0, true);
      for (float v : d) ASSERT_TRUE(std::isfinite(v)) << scheme_name(p.scheme) << " scale " << scale;
      const double nmse = sq(d, x) / sq(x);
      // Denormal inputs have few significant bits themselves; only ask for a sane result there.
      EXPECT_LT(nmse, scale < 1e-40f ? 1.0 : 0.2) << scheme_name(p.scheme) << " scale " << scale;
    }
  }
}

TEST(Codec, PreludeRejectsNonFinite) {
  for (const Params& p : all_schemes()) {
    Codec c(p, 1);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> x(3000, 1.0f), st(3);
      x[2500] = bad;
      EXPECT_FALSE(c.prelude(x.data(), x.size(), st.data())) << scheme_name(p.scheme);
    }
    std::vector<float> ok(3000, 1.0f), st(3);
    EXPECT_TRUE(c.prelude(ok.data(), ok.size(), st.data()));
  }
}

Status status_of(const Params& p, int n) {
  try {
    Codec c(p, n);
  } catch (const Error& e) {
    return e.status();
  }
  return Status::kSuccess;
}

TEST(Codec, BadConfigurationsFailClearly) {
  EXPECT_EQ(status_of(thc_params(4, 14), 1), Status::kInvalidArgument);  // g < 2^b - 1
  EXPECT_EQ(status_of(thc_params(0), 1), Status::kInvalidArgument);
  EXPECT_EQ(status_of(thc_params(9), 1), Status::kInvalidArgument);
  EXPECT_EQ(status_of(thc_params(4, 30, 0.0), 1), Status::kInvalidArgument);
  EXPECT_EQ(status_of(thc_params(4, 30, 1.0), 1), Status::kInvalidArgument);
  EXPECT_EQ(status_of(thc_params(4, 30, 1.0 / 32, 9), 1), Status::kInvalidArgument);
  EXPECT_EQ(status_of(thc_params(4, 30, 1.0 / 32, 21), 1), Status::kInvalidArgument);
  EXPECT_EQ(status_of(thc_params(8, 4096), 2000000), Status::kOverflow);  // n*g >= 2^32
  EXPECT_EQ(status_of(nat_params(Scheme::kCnat, 10, 8), 200), Status::kOverflow);  // 200 > 127
  Params lv = nat_params(Scheme::kCnat, 10, 8);
  lv.nat_levels = 6;  // 4 workers * 2^5 = 128 > 127
  EXPECT_EQ(status_of(lv, 4), Status::kOverflow);
  lv.nat_levels = 5;
  EXPECT_EQ(status_of(lv, 4), Status::kSuccess);
  Params w = nat_params(Scheme::kCnat, 10, 12);
  EXPECT_EQ(status_of(w, 1), Status::kInvalidArgument);
  Params t = thc_params();
  t.table = {0, 1, 2};
  EXPECT_EQ(status_of(t, 1), Status::kInvalidArgument);
  EXPECT_EQ(status_of(thc_params(), 0), Status::kInvalidArgument);
}

TEST(Codec, DuplicateTableEntriesAreHandled) {
  // The reference table for g = 16 repeats the value 8; encoding must still be unbiased and the
  // repeated value must always be sent with one index.
  Params p = thc_params(4, 16, 1e-7);
  p.table = {0, 2, 3, 4, 5, 6, 7, 8, 8, 9, 10, 11, 12, 13, 14, 16};
  Codec c(p, 1);
  const auto x = gaussian(1024, 21);
  const Layout l = c.layout(x.size());
  const auto stats = global_stats(c, {x});
  std::vector<uint8_t> packed(c.packed_bytes(l.wire_count));
  Codec::EncodeOut out;
  out.packed = packed.data();
  c.encode(l, 0, l.nblocks, x.data(), stats.data(), CallRng{1, 0, 0}, out);
  for (uint64_t i = 0; i < l.wire_count; ++i) ASSERT_NE(elem::packed_get(packed.data(), i, 4), 8u);
  std::vector<double> acc(x.size(), 0.0);
  double single = 0;
  const int R = 300;
  for (int r = 0; r < R; ++r) {
    const auto d = roundtrip(c, {x}, r, false);
    single += sq(d, x);
    for (size_t i = 0; i < x.size(); ++i) acc[i] += d[i];
  }
  double err = 0;
  for (size_t i = 0; i < x.size(); ++i) err += (acc[i] / R - x[i]) * (acc[i] / R - x[i]);
  EXPECT_LT(err, 2.0 * single / R / R);
}

TEST(Codec, ResidualIsInputMinusOwnContribution) {
  for (const Params& p : all_schemes()) {
    Codec c(p, 1);
    const auto x = gaussian(2100, 31);
    const Layout l = c.layout(x.size());
    const auto stats = global_stats(c, {x});
    std::vector<uint8_t> vals(l.wire_count * int_size(c.sum_type()));
    std::vector<float> res(x.size()), dec(x.size());
    Codec::EncodeOut out;
    out.values = vals.data();
    out.residual = res.data();
    const CallRng rng{5, 0, 2};
    c.encode(l, 0, l.nblocks, x.data(), stats.data(), rng, out);
    c.decode(l, 0, l.nblocks, vals.data(), stats.data(), rng, 1, false, dec.data());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(res[i], x[i] - dec[i], 1e-5) << scheme_name(p.scheme);
  }
}

// Error feedback's input read where it is: encoding x + add (add the residual, updated in
// place) gives the codes, values, staged sum and residual of encoding that sum staged first, bit
// for bit, in every scheme, for a partial last block and an all-zero block (whose sum is staged
// without an encode), in one call and block by block.
TEST(Codec, EncodeOfASumMatchesTheStagedSum) {
  for (Params p : all_schemes()) {
    p.block_log2 = 10;
    Codec c(p, 2);
    auto g = gaussian(4000, 41);
    auto e = gaussian(4000, 42);
    for (size_t i = 1024; i < 2048; ++i) g[i] = e[i] = 0.0f;  // block 1: x + e all zero
    std::vector<float> x(g.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = g[i] + e[i];
    const Layout l = c.layout(x.size());
    const auto stats = global_stats(c, {x});
    const size_t w = int_size(c.sum_type());
    const CallRng rng{9, 1, 3};
    for (bool per_block : {false, true}) {
      const std::string what = c.describe() + (per_block ? " per block" : " one call");
      std::vector<uint8_t> p1(c.packed_bytes(l.wire_count)), p2(p1.size()), v1(l.wire_count * w), v2(v1.size());
      std::vector<float> r1(x.size()), r2 = e, staged(x.size(), 7.0f);
      uint64_t wire = 0;
      for (uint64_t b = 0; b < l.nblocks; b += per_block ? 1 : l.nblocks) {
        const uint64_t nb = per_block ? 1 : l.nblocks;
        const uint64_t f = b * l.block;
        Codec::EncodeOut o1, o2;
        o1.packed = p1.data() + wire * c.index_bits() / 8;
        o2.packed = p2.data() + wire * c.index_bits() / 8;
        o1.values = v1.data() + wire * w;
        o2.values = v2.data() + wire * w;
        o1.residual = r1.data() + f;
        o2.residual = r2.data() + f;  // in place over add
        o2.staged = staged.data() + f;
        c.encode(l, b, nb, x.data() + f, stats.data() + b, rng, o1);
        c.encode(l, b, nb, g.data() + f, stats.data() + b, rng, o2, nullptr, r2.data() + f);
        for (uint64_t k = b; k < b + nb; ++k) wire += l.wire(k);
      }
      EXPECT_EQ(p1, p2) << what;
      EXPECT_EQ(v1, v2) << what;
      EXPECT_EQ(0, std::memcmp(x.data(), staged.data(), x.size() * 4)) << what;
      EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), r1.size() * 4)) << what;
    }
    Codec::EncodeOut bad;
    bad.residual = e.data();
    EXPECT_THROW(c.encode(l, 0, 1, g.data(), stats.data(), rng, bad, nullptr, e.data()), Error) << c.describe();
  }
}

// A workspace reused across calls, schemes and block sizes (larger, then smaller, then larger
// again: it keeps what it held) gives exactly what calls that allocate their own give, whether
// the caller encodes a call at once or block by block as the engine does.
TEST(Codec, ReusedWorkspaceMatchesFreshScratch) {
  Workspace ws;
  std::vector<Params> ps;
  for (int lb : {12, 10, 11}) {
    for (Params p : all_schemes()) {
      p.block_log2 = lb;
      ps.push_back(p);
    }
  }
  const auto x = gaussian(5000, 17);
  for (const Params& p : ps) {
    Codec c(p, 3);
    const Layout l = c.layout(x.size());
    const auto stats = global_stats(c, {x});
    const size_t w = int_size(c.sum_type());
    const CallRng rng{8, 1, 4};
    auto run = [&](Workspace* wsp, bool per_block, std::vector<uint8_t>* packed, std::vector<uint8_t>* vals,
                   std::vector<float>* res, std::vector<float>* dec) {
      packed->assign(c.packed_bytes(l.wire_count), 0);
      vals->assign(l.wire_count * w, 0);
      res->assign(x.size(), 0.0f);
      dec->assign(x.size(), 0.0f);
      uint64_t wire = 0;
      for (uint64_t b = 0; b < l.nblocks; b += per_block ? 1 : l.nblocks) {
        const uint64_t nb = per_block ? 1 : l.nblocks;
        Codec::EncodeOut out;
        out.packed = packed->data() + wire * c.index_bits() / 8;
        out.values = vals->data() + wire * w;
        out.residual = res->data() + b * l.block;
        c.encode(l, b, nb, x.data() + b * l.block, stats.data() + b, rng, out, wsp);
        for (uint64_t k = b; k < b + nb; ++k) wire += l.wire(k);
      }
      c.decode(l, 0, l.nblocks, vals->data(), stats.data(), rng, 1, true, dec->data(), wsp);
    };
    std::vector<uint8_t> p1, v1, p2, v2;
    std::vector<float> r1, d1, r2, d2;
    run(nullptr, false, &p1, &v1, &r1, &d1);
    for (bool per_block : {false, true}) {
      run(&ws, per_block, &p2, &v2, &r2, &d2);
      const std::string what = c.describe() + (per_block ? " per block" : " one call");
      EXPECT_EQ(p1, p2) << what;
      EXPECT_EQ(v1, v2) << what;
      EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), r1.size() * 4)) << what;
      EXPECT_EQ(0, std::memcmp(d1.data(), d2.data(), d1.size() * 4)) << what;
    }
    EXPECT_EQ(ws.block(), uint64_t{1} << 12);
  }
}

}  // namespace
}  // namespace thc::codec
