// THC_SIMD=NAME (a Highway target: AVX3_SPR, AVX3_ZEN4, AVX3_DL, AVX3, AVX2, SSE4, SSSE3, EMU128,
// SCALAR; any case): every SIMD kernel of the process runs as on a CPU whose best target is NAME
// (the targets better than it are disabled in Highway's dispatch). For CPUs that slow down under
// 512-bit vectors, and to measure what a CPU without AVX-512 gets. Read once when the code that
// includes this is loaded (libthc: the codec; the aggregator: its lookup-add); a name this CPU
// lacks is reported on stderr and ignored. A program that calls Highway's hwy::SupportedTargets()
// itself afterwards undoes it (Highway 1.0 chooses again among every target there); thc never
// calls it after this.
#pragma once

#include <strings.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "hwy/targets.h"

namespace thc {

inline bool apply_simd_cap() {
  const char* want = std::getenv("THC_SIMD");
  if (!want || !*want) return false;
  const int64_t supported = hwy::SupportedTargets();
  std::string names;
  for (int b = 0; b < 63; ++b) {
    const int64_t t = int64_t{1} << b;
    if (!(supported & t)) continue;
    if (strcasecmp(hwy::TargetName(t), want) == 0) {
      hwy::DisableTargets(t - 1);  // better targets have lower bits
      return true;
    }
    names += std::string(names.empty() ? "" : " ") + hwy::TargetName(t);
  }
  std::fprintf(stderr, "thc: THC_SIMD=%s names no SIMD target this CPU has (%s); the best one is used\n", want,
               names.c_str());
  return false;
}

// Once per shared object that includes this (an inline variable), at load.
[[maybe_unused]] inline const bool simd_capped = apply_simd_cap();

}  // namespace thc
