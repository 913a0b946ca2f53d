// The shared host/device scale derivation (collectives/codec/block_scale.h) against the host
// codec's Codec::block_scale, bit for bit. Runs everywhere (no CUDA needed).
#include "collectives/codec/block_scale.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "collectives/codec/codec.h"

namespace thc::elem {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> interesting_stats() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, 0.5f, 2.0f, 0.75f, 1e-30f, 1e30f, 3.4e38f,
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::min() / 3.0f, 1.17549421e-38f, 0.999999940f, 1.00000012f,
                          -1.0f, std::numeric_limits<float>::quiet_NaN()};
  for (int e = -149; e <= 127; e += 3) v.push_back(std::ldexp(1.0f, e));
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> m(0.5f, 1.0f);
  std::uniform_int_distribution<int> ex(-140, 120);
  for (int i = 0; i < 2000; ++i) v.push_back(std::ldexp(m(gen), ex(gen)));
  return v;
}

TEST(BlockScale, FrexpMatchesStd) {
  for (float x : interesting_stats()) {
    if (!(x > 0)) continue;
    int e1 = 0, e2 = 0;
    const float m1 = std::frexp(x, &e1);
    const float m2 = frexp_pos(x, &e2);
    EXPECT_EQ(bits(m1), bits(m2)) << x;
    EXPECT_EQ(e1, e2) << x;
  }
}

struct Case {
  codec::Scheme scheme;
  int nat_width;
  int dnat_norm;
  int n;
};

TEST(BlockScale, MatchesCodec) {
  const std::vector<Case> cases = {
      {codec::Scheme::kThc, 16, 2, 4},       {codec::Scheme::kUniformThc, 16, 2, 3},
      {codec::Scheme::kCnat, 8, 2, 1},       {codec::Scheme::kCnat, 16, 2, 5},
      {codec::Scheme::kCnat, 32, 2, 7},      {codec::Scheme::kDnat, 16, 2, 3},
      {codec::Scheme::kDnat, 16, 0, 3},      {codec::Scheme::kDnat, 8, 0, 2},
  };
  const std::vector<float> stats = interesting_stats();
  for (const Case& k : cases) {
    codec::Params p;
    p.scheme = k.scheme;
    p.nat_width = k.nat_width;
    p.dnat_norm = k.dnat_norm;
    p.block_log2 = 12;
    const codec::Codec c(p, k.n);
    const ScaleKind kind = scale_kind(c.rotates(), k.scheme == codec::Scheme::kDnat, k.dnat_norm);
    EXPECT_EQ(stat_is_rms(kind), c.rotates() || (k.scheme == codec::Scheme::kDnat && k.dnat_norm == 2));
    for (uint64_t wire : {uint64_t{1}, uint64_t{3}, uint64_t{64}, uint64_t{100}, uint64_t{1024}, uint64_t{4095},
                          uint64_t{4096}, uint64_t{1} << 20}) {
      for (float s : stats) {
        const codec::Codec::BlockScale a = c.block_scale(s, wire);
        const Scale b = block_scale(kind, c.levels(), s, wire);
        ASSERT_EQ(a.zero, b.zero) << c.describe() << " stat=" << s;
        if (a.zero) continue;
        ASSERT_EQ(a.exp, b.exp) << c.describe() << " stat=" << s << " wire=" << wire;
        ASSERT_EQ(bits(a.enc), bits(b.enc)) << c.describe() << " stat=" << s << " wire=" << wire;
        ASSERT_EQ(bits(a.dec), bits(b.dec)) << c.describe() << " stat=" << s << " wire=" << wire;
      }
    }
  }
}

}  // namespace
}  // namespace thc::elem
