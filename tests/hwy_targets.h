// Runs a test body once per Highway target this binary was compiled for and this CPU supports
// (best first; EMU128 is the scalar code), then restores normal dispatch. Shared by the codec's
// SIMD tests and the aggregator's lanes and SipHash tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hwy/targets.h"

namespace thc::test {

// dispatched(): the name of the target the code under test dispatches to (for the trace), or null.
template <class F>
void for_each_hwy_target(F f, const char* (*dispatched)() = nullptr) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(std::string("target ") + hwy::TargetName(t) +
                 (dispatched ? std::string(" dispatches to ") + dispatched() : std::string()));
    f();
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace thc::test
