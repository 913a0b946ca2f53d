#include "perf/nmse/baselines.h"

#include <algorithm>
#include <cmath>

#include "collectives/codec/philox.h"

namespace thc::perf {

BaselineRng::BaselineRng(uint64_t seed, uint32_t worker, uint32_t round, uint32_t scheme_id)
    : seed_(seed), worker_(worker), round_(round), scheme_id_(scheme_id) {}

void BaselineRng::uniforms(uint64_t first, uint64_t n, float* u) const {
  const rng::Stream s{seed_, worker_ + 1, round_};
  const auto key = rng::make_key(s);
  // Counter: group = element / 4 inside a 2^34-element span, block = (scheme << 40) | span.
  uint64_t i = 0;
  while (i < n) {
    const uint64_t e = first + i;
    const uint64_t block = (static_cast<uint64_t>(scheme_id_) << 40) | (e >> 34);
    const uint32_t group = static_cast<uint32_t>((e & ((uint64_t{1} << 34) - 1)) >> 2);
    const auto r = rng::draw4(key, s, rng::kPurposeBaseline, block, group);
    for (uint64_t k = e & 3; k < 4 && i < n; ++k, ++i) u[i] = rng::to_unit(r.v[k]);
  }
}

uint64_t topk_count(uint64_t d, double k) {
  if (d == 0 || k <= 0) return 0;
  const uint64_t keep = static_cast<uint64_t>(std::llround(k * static_cast<double>(d)));
  return std::min<uint64_t>(d, std::max<uint64_t>(1, keep));
}

void topk_sparsify(const float* x, uint64_t d, uint64_t keep, float* out, std::vector<uint8_t>* mask) {
  std::fill(out, out + d, 0.0f);
  if (keep == 0 || d == 0) return;
  auto mark = [&](uint64_t i) {
    out[i] = x[i];
    if (mask) (*mask)[i] = 1;
  };
  if (keep >= d) {
    for (uint64_t i = 0; i < d; ++i) mark(i);
    return;
  }
  std::vector<float> mag(d);
  for (uint64_t i = 0; i < d; ++i) mag[i] = std::fabs(x[i]);
  std::nth_element(mag.begin(), mag.begin() + (d - keep), mag.end());
  const float thr = mag[d - keep];  // the keep-th largest magnitude
  uint64_t taken = 0;
  for (uint64_t i = 0; i < d; ++i)
    if (std::fabs(x[i]) > thr) {
      mark(i);
      ++taken;
    }
  // Ties at the threshold: first come, first kept, until exactly `keep`.
  for (uint64_t i = 0; i < d && taken < keep; ++i)
    if (std::fabs(x[i]) == thr) {
      mark(i);
      ++taken;
    }
}

namespace {

template <typename F>
void for_buckets(uint64_t d, uint64_t bucket, F&& f) {
  const uint64_t b = bucket == 0 ? std::max<uint64_t>(d, 1) : bucket;
  for (uint64_t first = 0; first < d; first += b) f(first, std::min(b, d - first));
}

}  // namespace

void terngrad(const float* x, uint64_t d, uint64_t bucket, const BaselineRng& rng, float* out) {
  std::vector<float> u;
  for_buckets(d, bucket, [&](uint64_t first, uint64_t m) {
    float s = 0;
    for (uint64_t i = 0; i < m; ++i) s = std::max(s, std::fabs(x[first + i]));
    u.resize(m);
    rng.uniforms(first, m, u.data());
    for (uint64_t i = 0; i < m; ++i) {
      const float a = std::fabs(x[first + i]);
      const bool on = s > 0 && u[i] < a / s;
      out[first + i] = on ? std::copysign(s, x[first + i]) : 0.0f;
    }
  });
}

void qsgd(const float* x, uint64_t d, uint64_t bucket, int levels, const BaselineRng& rng, float* out) {
  std::vector<float> u;
  const double s = levels;
  for_buckets(d, bucket, [&](uint64_t first, uint64_t m) {
    double n2 = 0;
    for (uint64_t i = 0; i < m; ++i) n2 += static_cast<double>(x[first + i]) * x[first + i];
    const double norm = std::sqrt(n2);
    u.resize(m);
    rng.uniforms(first, m, u.data());
    for (uint64_t i = 0; i < m; ++i) {
      if (norm == 0) {
        out[first + i] = 0.0f;
        continue;
      }
      const double r = std::fabs(x[first + i]) / norm * s;  // in [0, s]
      double l = std::floor(r);
      if (u[i] < r - l) l += 1;
      out[first + i] = static_cast<float>(std::copysign(norm * l / s, x[first + i]));
    }
  });
}

double terngrad_bits_up(uint64_t d, uint64_t bucket) {
  if (d == 0) return 0;
  const uint64_t b = bucket == 0 ? d : bucket;
  const double nb = std::ceil(static_cast<double>(d) / static_cast<double>(b));
  return 2.0 + 32.0 * nb / static_cast<double>(d);
}

double qsgd_bits_up(uint64_t d, uint64_t bucket, int levels) {
  if (d == 0) return 0;
  const uint64_t b = bucket == 0 ? d : bucket;
  const double nb = std::ceil(static_cast<double>(d) / static_cast<double>(b));
  int lb = 0;
  while ((1 << lb) < levels + 1) ++lb;  // ceil(log2(s + 1)): levels 0..s
  return 1.0 + lb + 32.0 * nb / static_cast<double>(d);
}

double sparse_down_bits(uint64_t d, uint64_t union_size) {
  if (d == 0) return 0;
  return std::min(64.0 * static_cast<double>(union_size), 32.0 * static_cast<double>(d)) / static_cast<double>(d);
}

void DgcWorker::step(const float* g, uint64_t keep, float* out, std::vector<uint8_t>* mask) {
  const uint64_t d = u_.size();
  const float m = static_cast<float>(m_);
  for (uint64_t i = 0; i < d; ++i) {
    u_[i] = m * u_[i] + g[i];
    v_[i] += u_[i];
  }
  std::vector<uint8_t> sent(d, 0);
  topk_sparsify(v_.data(), d, keep, out, &sent);
  for (uint64_t i = 0; i < d; ++i) {
    if (sent[i]) {
      v_[i] = 0;
      if (masking_) u_[i] = 0;
      if (mask) (*mask)[i] = 1;
    }
  }
}

}  // namespace thc::perf
