#include "perf/nmse/inputs.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

namespace thc::perf {

std::string expand_pattern(const std::string& pattern, int worker) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'd') {
        out += std::to_string(worker);
        ++i;
        continue;
      }
      if (pattern[i + 1] == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

namespace {

class Synthetic final : public Inputs {
 public:
  explicit Synthetic(const InputSpec& s) : s_(s) {}

  void generate(uint32_t round, Grads* xs) const override {
    xs->assign(s_.workers, std::vector<float>(s_.count));
    const double a = std::sqrt(s_.corr), b = std::sqrt(1.0 - s_.corr);
    std::vector<float> common;
    if (s_.corr > 0) {
      common.resize(s_.count);
      fill(round, /*stream=*/0, common.data());
    }
    std::vector<float> own(s_.count);
    for (int w = 0; w < s_.workers; ++w) {
      float* x = (*xs)[w].data();
      if (s_.corr >= 1.0) {
        std::copy(common.begin(), common.end(), x);
        continue;
      }
      fill(round, static_cast<uint32_t>(w) + 1, own.data());
      for (uint64_t i = 0; i < s_.count; ++i)
        x[i] = static_cast<float>((s_.corr > 0 ? a * common[i] : 0.0) + b * own[i]);
    }
  }
  uint64_t count() const override { return s_.count; }
  std::string describe() const override {
    std::string d = s_.dist;
    if (s_.dist == "lognormal") d += " sigma=" + fmt(s_.sigma);
    return d + " corr=" + fmt(s_.corr);
  }

 private:
  static std::string fmt(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
  }
  // stream 0 = the common component, w + 1 = worker w's own component.
  void fill(uint32_t round, uint32_t stream, float* out) const {
    std::seed_seq seq{static_cast<uint32_t>(s_.seed), static_cast<uint32_t>(s_.seed >> 32), round, stream, 0x7468u};
    std::mt19937_64 gen(seq);
    std::normal_distribution<double> n01;
    if (s_.dist == "gaussian") {
      for (uint64_t i = 0; i < s_.count; ++i) out[i] = static_cast<float>(n01(gen));
    } else {
      for (uint64_t i = 0; i < s_.count; ++i) {
        const double mag = std::exp(s_.sigma * n01(gen));
        out[i] = static_cast<float>((gen() & 1) ? -mag : mag);
      }
    }
  }

  InputSpec s_;
};

class Files final : public Inputs {
 public:
  explicit Files(const InputSpec& s) : s_(s) {
    if (s.pattern.find("%d") == std::string::npos && s.workers > 1)
      throw InputError("--input '" + s.pattern + "' has no %d, so every worker would read the same file; use e.g. 'grads/rank%d.f32'");
    uint64_t common = 0;
    std::string first_path;
    for (int w = 0; w < s.workers; ++w) {
      const std::string path = expand_pattern(s.pattern, w);
      struct stat st;
      if (::stat(path.c_str(), &st) != 0)
        throw InputError("worker " + std::to_string(w) + ": cannot open '" + path + "': " + std::strerror(errno));
      if (!S_ISREG(st.st_mode)) throw InputError("worker " + std::to_string(w) + ": '" + path + "' is not a regular file");
      const uint64_t bytes = static_cast<uint64_t>(st.st_size);
      if (bytes % 4 != 0)
        throw InputError("'" + path + "' has " + std::to_string(bytes) +
                         " bytes, not a whole number of little-endian float32 values");
      const uint64_t n = bytes / 4;
      if (w == 0) {
        common = n;
        first_path = path;
      } else if (n != common) {
        throw InputError("'" + path + "' has " + std::to_string(n) + " floats but '" + first_path + "' has " +
                         std::to_string(common) + "; all workers' files must have the same length");
      }
    }
    if (common == 0) throw InputError("'" + first_path + "' is empty");
    if (s.count > common)
      throw InputError("--count " + std::to_string(s.count) + " but '" + first_path + "' is short: it holds only " +
                       std::to_string(common) + " floats");
    count_ = s.count ? s.count : common;
    data_.resize(s.workers);
    for (int w = 0; w < s.workers; ++w) {
      const std::string path = expand_pattern(s.pattern, w);
      FILE* f = std::fopen(path.c_str(), "rb");
      if (!f) throw InputError("cannot open '" + path + "': " + std::strerror(errno));
      data_[w].resize(count_);
      const size_t got = std::fread(data_[w].data(), 4, count_, f);
      std::fclose(f);
      if (got != count_)
        throw InputError("short read from '" + path + "': " + std::to_string(got) + " of " + std::to_string(count_) +
                         " floats");
      for (uint64_t i = 0; i < count_; ++i)
        if (!std::isfinite(data_[w][i]))
          throw InputError("'" + path + "' element " + std::to_string(i) + " is NaN or infinite");
    }
  }
  void generate(uint32_t, Grads* xs) const override { *xs = data_; }
  uint64_t count() const override { return count_; }
  std::string describe() const override { return "files " + s_.pattern; }

 private:
  InputSpec s_;
  uint64_t count_ = 0;
  Grads data_;
};

}  // namespace

std::unique_ptr<Inputs> make_inputs(const InputSpec& s) {
  if (s.workers < 1) throw InputError("--workers must be at least 1");
  if (!s.pattern.empty()) {
    static_assert(sizeof(float) == 4, "float32");
    const uint16_t probe = 1;
    if (*reinterpret_cast<const uint8_t*>(&probe) != 1) throw InputError("file input assumes a little-endian host");
    return std::make_unique<Files>(s);
  }
  if (s.dist != "gaussian" && s.dist != "lognormal")
    throw InputError("--dist must be gaussian or lognormal, not '" + s.dist + "'");
  if (!(s.corr >= 0.0 && s.corr <= 1.0)) throw InputError("--corr must be in [0, 1]");
  if (s.count == 0) throw InputError("--count must be positive");
  return std::make_unique<Synthetic>(s);
}

}  // namespace thc::perf
