// THC_SIMD (read when libthc is loaded) caps the SIMD target every kernel dispatches to. ctest
// runs this with THC_SIMD=avx2 (simd_knob_avx2) and with a name no build has (simd_knob_bad).
#include <gtest/gtest.h>
#include <strings.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "collectives/codec/rht.h"
#include "hwy/targets.h"

namespace thc::codec {
namespace {

// The best target this CPU and build have among those the knob left enabled.
std::string best_enabled() {
  const std::vector<int64_t> t = hwy::SupportedAndGeneratedTargets();
  return t.empty() ? std::string() : hwy::TargetName(t.front());
}

TEST(SimdKnob, CapsTheTargetAtTheNamedOne) {
  const char* want = std::getenv("THC_SIMD");
  ASSERT_NE(want, nullptr) << "run by ctest with THC_SIMD set";
  // First: Highway 1.0's SupportedTargets() (called below) chooses again among all targets.
  const std::string got = simd_target();
  bool cpu_has = false;
  const int64_t supported = hwy::SupportedTargets();
  for (int b = 0; b < 63; ++b) {
    const int64_t t = int64_t{1} << b;
    if ((supported & t) && strcasecmp(hwy::TargetName(t), want) == 0) cpu_has = true;
  }
  if (!cpu_has) {
    // An unknown name (or one this CPU lacks) leaves the dispatch alone: the best target.
    EXPECT_EQ(got, best_enabled());
    return;
  }
  EXPECT_EQ(strcasecmp(got.c_str(), want), 0) << "dispatches to " << got;
  EXPECT_EQ(best_enabled(), got);
}

}  // namespace
}  // namespace thc::codec
