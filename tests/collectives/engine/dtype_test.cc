#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "collectives/engine/dtype.h"

namespace thc::engine {
namespace {

TEST(Dtype, HalfRoundTripsEveryHalfValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
      continue;
    }
    ASSERT_EQ(float_to_half(f), h) << std::hex << h;
  }
}

TEST(Dtype, HalfKnownValuesAndRounding) {
  EXPECT_EQ(half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float(0xC000), -2.0f);
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // rounds to infinity
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie to even
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
}

TEST(Dtype, Bfloat16) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-3.5f)), -3.5f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_NEAR(bf16_to_float(float_to_bf16(3.14159f)), 3.14159f, 0.01f);
}

TEST(Dtype, DoubleBeyondFloatRangeBecomesInfinite) {
  const double d[2] = {1e300, 1.0};
  float f[2];
  load_as_float(d, DType::kF64, 0, 2, nullptr, f);
  EXPECT_TRUE(std::isinf(f[0]));
  EXPECT_EQ(f[1], 1.0f);
}

}  // namespace
}  // namespace thc::engine
