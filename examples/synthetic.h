// Synthetic "gradients" for demos: layers of varying size whose scales span three orders of
// magnitude (like real networks), Gaussian inside a layer, partly shared across workers.
#pragma once

#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

namespace thc::examples {

inline std::vector<float> synthetic_gradients(size_t count, int worker, double shared = 0.5) {
  std::vector<float> g(count);
  std::mt19937_64 common(12345), own(1000 + worker);
  std::normal_distribution<double> n01;
  std::uniform_real_distribution<double> u01;
  size_t i = 0;
  while (i < count) {
    const size_t layer = std::min(count - i, static_cast<size_t>(1 + u01(common) * 2e6));
    const double scale = std::pow(10.0, -4 + 3 * u01(common));
    for (size_t k = 0; k < layer; ++k, ++i) {
      const double c = n01(common), o = n01(own);
      g[i] = static_cast<float>(scale * (std::sqrt(shared) * c + std::sqrt(1 - shared) * o));
    }
  }
  return g;
}

}  // namespace thc::examples
