// Non-homomorphic baselines for thc_nmse: TopK, DGC, TernGrad, QSGD.
//
// All of them are "aggregate at a parameter server" schemes: the PS has to decompress every
// worker's message (sparse indices, or values with per-worker scales) before it can add them, which
// is exactly what THC and Cnat avoid. The simulation here computes what such a PS would hand back:
// the mean of the workers' decompressed vectors.
//
// Bit accounting (per element of the input, averaged over rounds; documented in perf/README.md):
//   TopK / DGC   up:   k * (32-bit index + 32-bit float value) = 64k
//                down: the PS sends the union support U of all workers' selections, sparse
//                      (64 bits per entry) or dense float32, whichever is smaller:
//                      min(64 |U|, 32 d) / d
//   TernGrad     up:   2 bits per element (sign + {0,1}) + one float32 scale per bucket
//                down: 32 (the PS sums dequantised floats; scales differ per worker, so the sum
//                      is no longer ternary and goes back as float32)
//   QSGD         up:   1 sign bit + ceil(log2(s + 1)) level bits per element + one float32 norm
//                      per bucket (fixed-width codes; QSGD's Elias coding is not modelled)
//                down: 32 (as TernGrad)
//
// Randomness: Philox4x32-10 with purpose rng::kPurposeBaseline (collectives/codec/philox.h);
// stream = worker + 1, counter round = the simulation round, block = (scheme id << 40) | bucket.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace thc::perf {

// Uniform [0,1) draws for stochastic rounding of baseline `scheme_id` (one of the kId* below).
class BaselineRng {
 public:
  BaselineRng(uint64_t seed, uint32_t worker, uint32_t round, uint32_t scheme_id);
  // Fill u[0..n) with draws for elements [first, first + n) of the vector.
  void uniforms(uint64_t first, uint64_t n, float* u) const;

 private:
  uint64_t seed_;
  uint32_t worker_, round_, scheme_id_;
};

constexpr uint32_t kIdTopK = 1;
constexpr uint32_t kIdDgc = 2;
constexpr uint32_t kIdTernGrad = 3;
constexpr uint32_t kIdQsgd = 4;

// Number of elements TopK keeps out of d for fraction k (at least 1 when d > 0 and k > 0).
uint64_t topk_count(uint64_t d, double k);

// Keep the `keep` largest-magnitude entries of x; out is dense (zeros elsewhere), mask marks the
// kept entries (if non-null; mask is OR-ed into, so the caller can build the union support).
void topk_sparsify(const float* x, uint64_t d, uint64_t keep, float* out, std::vector<uint8_t>* mask);

// TernGrad (Wen et al. 2017): per bucket s = max|x|, q_i = s * sign(x_i) * Bernoulli(|x_i| / s).
// bucket = 0 means one bucket for the whole vector.
void terngrad(const float* x, uint64_t d, uint64_t bucket, const BaselineRng& rng, float* out);

// QSGD (Alistarh et al. 2017), standard dithering D_sta^{2,s}: per bucket n = ||x||_2,
// q_i = n * sign(x_i) * l_i / s with l_i the stochastic rounding of s |x_i| / n to an integer.
void qsgd(const float* x, uint64_t d, uint64_t bucket, int levels, const BaselineRng& rng, float* out);

// Bits per element of the uplink for each scheme (see the header comment).
double terngrad_bits_up(uint64_t d, uint64_t bucket);
double qsgd_bits_up(uint64_t d, uint64_t bucket, int levels);
// Down bits of a sparse PS reply: min(64 |U|, 32 d) / d.
double sparse_down_bits(uint64_t d, uint64_t union_size);

// DGC (Lin et al. 2018) for one worker: momentum correction and local gradient accumulation.
// Each round:
//   u <- m u + g;  v <- v + u;  send the top-k of v;  v[sent] = 0   (and u[sent] = 0 with
//   momentum factor masking, off by default).
// The PS mean of the sent vectors estimates the dense momentum-SGD update U <- m U + mean(g),
// so thc_nmse measures DGC's NMSE against that reference. Without masking, k = 1 is exact; with
// masking, k = 1 degenerates to plain SGD and the reference no longer matches exactly.
class DgcWorker {
 public:
  DgcWorker(uint64_t d, double momentum, bool masking)
      : m_(momentum), masking_(masking), u_(d, 0.0f), v_(d, 0.0f) {}
  void step(const float* g, uint64_t keep, float* out, std::vector<uint8_t>* mask);

 private:
  double m_;
  bool masking_;
  std::vector<float> u_, v_;
};

}  // namespace thc::perf
