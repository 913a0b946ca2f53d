#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "collectives/codec/rht.h"

namespace thc::codec {
namespace {

std::vector<float> gaussian(uint64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

double norm2(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

class RhtSizes : public ::testing::TestWithParam<int> {};

TEST_P(RhtSizes, SimdEqualsScalarBitForBit) {
  const uint64_t n = uint64_t{1} << GetParam();
  auto a = gaussian(n, 1 + GetParam());
  auto b = a;
  fwht(a.data(), n);
  fwht_scalar(b.data(), n);
  // Same butterflies in the same order: results are identical, not just close.
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], b[i]) << "i=" << i << " n=" << n;
}

TEST_P(RhtSizes, InverseOfForwardIsIdentityAndNormIsPreserved) {
  const uint64_t n = uint64_t{1} << GetParam();
  const auto x = gaussian(n, 7 + GetParam());
  auto y = x;
  const rng::Stream s{0x1234567887654321ull, rng::kSharedStream, 3};
  rht_forward(y.data(), n, s, 5);
  EXPECT_NEAR(norm2(y) / norm2(x), 1.0, 1e-5);
  rht_inverse(y.data(), n, s, 5);
  double err = 0;
  for (uint64_t i = 0; i < n; ++i) err += (y[i] - x[i]) * static_cast<double>(y[i] - x[i]);
  EXPECT_LT(std::sqrt(err / norm2(x)), 1e-6 * std::max(1.0, GetParam() / 4.0));
}

INSTANTIATE_TEST_SUITE_P(Pow2, RhtSizes, ::testing::Values(0, 1, 2, 3, 4, 6, 10, 13, 14, 15, 16, 20));

TEST(Rht, SignsDependOnBlockAndRoundButNotOnRank) {
  const uint64_t n = 1024;
  std::vector<float> ones(n, 1.0f), a = ones, b = ones, c = ones;
  apply_signs(a.data(), n, {42, rng::kSharedStream, 0}, 0);
  apply_signs(b.data(), n, {42, rng::kSharedStream, 0}, 1);
  apply_signs(c.data(), n, {42, rng::kSharedStream, 1}, 0);
  int diff_ab = 0, diff_ac = 0, neg = 0;
  for (uint64_t i = 0; i < n; ++i) {
    diff_ab += a[i] != b[i];
    diff_ac += a[i] != c[i];
    neg += a[i] < 0;
  }
  EXPECT_GT(diff_ab, 400);
  EXPECT_GT(diff_ac, 400);
  EXPECT_NEAR(neg, 512, 100);  // ±1 with equal probability: 512 ± 6 sigma
}

TEST(Rht, OrthonormalOnBasisVector) {
  const uint64_t n = 256;
  std::vector<float> e(n, 0.0f);
  e[3] = 1.0f;
  fwht(e.data(), n);
  for (float v : e) EXPECT_EQ(std::fabs(v), 1.0f);
}

}  // namespace
}  // namespace thc::codec
