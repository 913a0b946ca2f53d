// Worker gradients for thc_nmse: synthetic (Gaussian or heavy-tailed log-normal, with a knob for
// the correlation between workers) or real gradients from files (one raw float32 file per worker).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace thc::perf {

using Grads = std::vector<std::vector<float>>;

struct InputSpec {
  std::string dist = "gaussian";  // gaussian | lognormal
  double sigma = 1.0;             // lognormal: |x| = exp(sigma * N(0,1)), random sign
  double corr = 0.0;              // x_i = sqrt(corr) * common + sqrt(1 - corr) * own_i
  std::string pattern;            // file input: "grads/rank%d.f32" (%d = worker index); empty = synthetic
  uint64_t count = 0;             // synthetic: elements; files: 0 = the files' length, else a prefix
  int workers = 4;
  uint64_t seed = 1;
};

// Input problems are reported as InputError with a message naming the file and what is wrong.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Inputs {
 public:
  virtual ~Inputs() = default;
  // Every worker's gradient for round r (synthetic inputs draw fresh ones each round; file
  // inputs return the same gradients every round).
  virtual void generate(uint32_t round, Grads* xs) const = 0;
  virtual uint64_t count() const = 0;
  virtual std::string describe() const = 0;
};

// Throws InputError on a bad specification, a missing, unreadable or short file.
std::unique_ptr<Inputs> make_inputs(const InputSpec& spec);

// "grads/rank%d.f32" with worker 3 -> "grads/rank3.f32" (also "%%" -> "%").
std::string expand_pattern(const std::string& pattern, int worker);

}  // namespace thc::perf
