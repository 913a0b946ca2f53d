// thc_nmse: the accuracy table of the THC and Cnat papers.
//
// n simulated workers each hold a gradient; every scheme estimates their mean and the tool reports
//   NMSE = ||estimate - mean||^2 / ||mean||^2      (averaged over --rounds)
// with the bits per element each worker sends up and receives down, and whether the scheme
// aggregates without decompressing ("homomorphic"). THC, uniform THC, Cnat and natural dithering
// run through the host codec exactly as the library does (prelude MAX, encode, integer sum,
// decode); TopK, DGC, TernGrad and QSGD are the baselines in baselines.h. No MPI is involved.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "common/status.h"
#include "perf/nmse/baselines.h"
#include "perf/nmse/inputs.h"
#include "perf/nmse/plot.h"

namespace thc::perf {
namespace {

// ---------------------------------------------------------------------------------------------
// Knobs of one evaluation point (a sweep changes one of them).
struct Knobs {
  int workers = 4;
  double corr = 0.0;
  int bits = 4;             // THC b, and the bit budget the baselines match unless set explicitly
  int g = 0;                // THC granularity; 0 = 2 (2^b - 1) (30 for b = 4, the reference default)
  double p = 1.0 / 32;      // THC truncation fraction
  int block_log2 = 16;      // THC/UHC RHT block, Cnat/Dnat prelude block
  int nat_width = 16;       // Cnat/Dnat sum width
  int cnat_levels = 0;      // 0 = widest window that fits nat_width for n workers
  int dnat_levels = 0;      // 0 = min(2^(b-1) - 1, widest that fits)
  double k = 0;             // TopK/DGC fraction; 0 = b / 64 (same uplink bits as THC's b)
  double momentum = 0.9;    // DGC
  bool dgc_masking = false; // DGC momentum factor masking
  int qsgd_levels = 0;      // 0 = 2^(b-1) - 1 (sign + level in b bits)
  uint64_t qsgd_bucket = 512;
  uint64_t terngrad_bucket = 0;  // 0 = one scale for the whole tensor (TernGrad's per-layer max)
  bool ef = false;          // error feedback for every scheme but DGC (which accumulates anyway)
  uint64_t seed = 1;
};

int thc_g(const Knobs& k) { return k.g > 0 ? k.g : 2 * ((1 << k.bits) - 1); }
double topk_k(const Knobs& k) { return k.k > 0 ? k.k : k.bits / 64.0; }
int qsgd_s(const Knobs& k) { return k.qsgd_levels > 0 ? k.qsgd_levels : (1 << (k.bits - 1)) - 1; }

std::string fmt(double v) {
  char b[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(b, sizeof b, "%.0f", v);
  else std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

struct Param {
  std::string key, value;
  bool numeric;
};
Param num(const std::string& k, double v) { return {k, fmt(v), true}; }

// ---------------------------------------------------------------------------------------------
// One scheme, simulated over the rounds of a run.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual std::string name() const = 0;
  virtual bool homomorphic() const = 0;
  virtual std::vector<Param> params() const = 0;
  // est: the scheme's estimate of the mean. ref: what it estimates (the mean, except for DGC).
  virtual void round(const Grads& xs, const std::vector<double>& mean, uint32_t r, std::vector<double>* est,
                     std::vector<double>* ref, double* bits_up, double* bits_down) = 0;
};

// THC, uniform THC, Cnat, Dnat: the library's codec, with the network's integer sum in between.
class CodecRunner final : public Runner {
 public:
  CodecRunner(std::string name, const codec::Params& p, const Knobs& k, uint64_t count)
      : name_(std::move(name)), codec_(p, k.workers), k_(k), count_(count) {
    if (k.ef) residual_.assign(k.workers, std::vector<float>(count, 0.0f));
  }
  std::string name() const override { return name_; }
  bool homomorphic() const override { return true; }
  std::vector<Param> params() const override {
    std::vector<Param> v;
    v.push_back(num("b", codec_.index_bits()));
    if (codec_.rotates()) {
      v.push_back(num("g", codec_.granularity()));
      v.push_back(num("p", codec_.params().p));
    } else {
      v.push_back(num("levels", codec_.levels()));
      v.push_back(num("width", codec_.params().nat_width));
    }
    v.push_back(num("block", static_cast<double>(codec_.block())));
    v.push_back(num("ef", k_.ef ? 1 : 0));
    return v;
  }
  void round(const Grads& xs, const std::vector<double>& mean, uint32_t r, std::vector<double>* est,
             std::vector<double>* ref, double* bits_up, double* bits_down) override {
    const int n = k_.workers;
    const codec::Layout l = codec_.layout(count_);
    std::vector<std::vector<float>> in(n);
    std::vector<float> stats(l.nblocks, 0.0f), s(l.nblocks);
    for (int w = 0; w < n; ++w) {
      in[w] = xs[w];
      if (k_.ef)
        for (uint64_t i = 0; i < count_; ++i) in[w][i] += residual_[w][i];
      if (!codec_.prelude(in[w].data(), count_, s.data()))
        fail(Status::kNonFinite, "worker " + std::to_string(w) + "'s input has NaN or Inf");
      for (uint64_t b = 0; b < l.nblocks; ++b) stats[b] = std::max(stats[b], s[b]);
    }
    const codec::IntType t = codec_.sum_type();
    std::vector<int64_t> total(l.wire_count, 0);
    std::vector<uint8_t> vals(l.wire_count * codec::int_size(t));
    for (int w = 0; w < n; ++w) {
      codec::CallRng rng{k_.seed, static_cast<uint32_t>(w), r};
      codec::Codec::EncodeOut out;
      out.values = vals.data();
      if (k_.ef) out.residual = residual_[w].data();
      codec_.encode(l, 0, l.nblocks, in[w].data(), stats.data(), rng, out);
      for (uint64_t i = 0; i < l.wire_count; ++i) total[i] += codec::load_int(t, vals.data(), i);
    }
    for (uint64_t i = 0; i < l.wire_count; ++i) {
      if (std::llabs(total[i]) > codec::int_max(t))
        fail(Status::kOverflow, name_ + ": integer sum overflows " + codec::int_name(t));
      codec::store_int(t, vals.data(), i, total[i]);
    }
    std::vector<float> dec(count_);
    codec_.decode(l, 0, l.nblocks, vals.data(), stats.data(), codec::CallRng{k_.seed, 0, r}, n, /*mean=*/true,
                  dec.data());
    est->assign(dec.begin(), dec.end());
    *ref = mean;
    // Up: b-bit indices (index form) + one float32 prelude statistic per block; down: the
    // integer sums at the codec's sum width + the MAX-combined statistic per block.
    const double c = static_cast<double>(count_), wire = static_cast<double>(l.wire_count);
    *bits_up = (codec_.index_bits() * wire + 32.0 * l.nblocks) / c;
    *bits_down = (8.0 * codec::int_size(t) * wire + 32.0 * l.nblocks) / c;
  }

 private:
  std::string name_;
  codec::Codec codec_;
  Knobs k_;
  uint64_t count_;
  std::vector<std::vector<float>> residual_;
};

// Baselines a parameter server has to decompress: per-worker operator Q, optional error feedback.
class PsRunner : public Runner {
 public:
  PsRunner(const Knobs& k, uint64_t count) : k_(k), count_(count) {
    if (k.ef) residual_.assign(k.workers, std::vector<float>(count, 0.0f));
  }
  bool homomorphic() const override { return false; }
  void round(const Grads& xs, const std::vector<double>& mean, uint32_t r, std::vector<double>* est,
             std::vector<double>* ref, double* bits_up, double* bits_down) override {
    const int n = k_.workers;
    est->assign(count_, 0.0);
    std::vector<uint8_t> mask(count_, 0);
    std::vector<float> x(count_), q(count_);
    for (int w = 0; w < n; ++w) {
      std::copy(xs[w].begin(), xs[w].end(), x.begin());
      if (k_.ef)
        for (uint64_t i = 0; i < count_; ++i) x[i] += residual_[w][i];
      compress(w, r, x.data(), q.data(), &mask);
      if (k_.ef)
        for (uint64_t i = 0; i < count_; ++i) residual_[w][i] = x[i] - q[i];
      for (uint64_t i = 0; i < count_; ++i) (*est)[i] += q[i];
    }
    for (auto& v : *est) v /= n;
    *ref = mean;
    uint64_t u = 0;
    for (uint8_t m : mask) u += m;
    *bits_up = up_bits();
    *bits_down = down_bits(u);
  }

 protected:
  virtual void compress(int w, uint32_t r, const float* x, float* q, std::vector<uint8_t>* mask) = 0;
  virtual double up_bits() const = 0;
  virtual double down_bits(uint64_t union_size) const { return 32.0; }
  std::vector<Param> with_ef(std::vector<Param> v) const {
    v.push_back(num("ef", k_.ef ? 1 : 0));
    return v;
  }

  Knobs k_;
  uint64_t count_;
  std::vector<std::vector<float>> residual_;
};

class TopKRunner final : public PsRunner {
 public:
  using PsRunner::PsRunner;
  std::string name() const override { return "topk"; }
  std::vector<Param> params() const override { return with_ef({num("k", topk_k(k_))}); }

 protected:
  void compress(int, uint32_t, const float* x, float* q, std::vector<uint8_t>* mask) override {
    topk_sparsify(x, count_, topk_count(count_, topk_k(k_)), q, mask);
  }
  double up_bits() const override {
    return 64.0 * static_cast<double>(topk_count(count_, topk_k(k_))) / static_cast<double>(count_);
  }
  double down_bits(uint64_t u) const override { return sparse_down_bits(count_, u); }
};

class TernGradRunner final : public PsRunner {
 public:
  using PsRunner::PsRunner;
  std::string name() const override { return "terngrad"; }
  std::vector<Param> params() const override {
    return with_ef({num("bucket", static_cast<double>(k_.terngrad_bucket ? k_.terngrad_bucket : count_))});
  }

 protected:
  void compress(int w, uint32_t r, const float* x, float* q, std::vector<uint8_t>*) override {
    terngrad(x, count_, k_.terngrad_bucket, BaselineRng(k_.seed, w, r, kIdTernGrad), q);
  }
  double up_bits() const override { return terngrad_bits_up(count_, k_.terngrad_bucket); }
};

class QsgdRunner final : public PsRunner {
 public:
  using PsRunner::PsRunner;
  std::string name() const override { return "qsgd"; }
  std::vector<Param> params() const override {
    return with_ef({num("s", qsgd_s(k_)), num("bucket", static_cast<double>(k_.qsgd_bucket ? k_.qsgd_bucket : count_))});
  }

 protected:
  void compress(int w, uint32_t r, const float* x, float* q, std::vector<uint8_t>*) override {
    qsgd(x, count_, k_.qsgd_bucket, qsgd_s(k_), BaselineRng(k_.seed, w, r, kIdQsgd), q);
  }
  double up_bits() const override { return qsgd_bits_up(count_, k_.qsgd_bucket, qsgd_s(k_)); }
};

class DgcRunner final : public Runner {
 public:
  DgcRunner(const Knobs& k, uint64_t count) : k_(k), count_(count), U_(count, 0.0) {
    for (int w = 0; w < k.workers; ++w) workers_.emplace_back(count, k.momentum, k.dgc_masking);
  }
  std::string name() const override { return "dgc"; }
  bool homomorphic() const override { return false; }
  std::vector<Param> params() const override {
    return {num("k", topk_k(k_)), num("momentum", k_.momentum), num("masking", k_.dgc_masking ? 1 : 0)};
  }
  void round(const Grads& xs, const std::vector<double>& mean, uint32_t, std::vector<double>* est,
             std::vector<double>* ref, double* bits_up, double* bits_down) override {
    const uint64_t keep = topk_count(count_, topk_k(k_));
    est->assign(count_, 0.0);
    std::vector<uint8_t> mask(count_, 0);
    std::vector<float> q(count_);
    for (size_t w = 0; w < workers_.size(); ++w) {
      workers_[w].step(xs[w].data(), keep, q.data(), &mask);
      for (uint64_t i = 0; i < count_; ++i) (*est)[i] += q[i];
    }
    for (auto& v : *est) v /= static_cast<double>(workers_.size());
    for (uint64_t i = 0; i < count_; ++i) U_[i] = k_.momentum * U_[i] + mean[i];
    *ref = U_;
    uint64_t u = 0;
    for (uint8_t m : mask) u += m;
    *bits_up = 64.0 * static_cast<double>(keep) / static_cast<double>(count_);
    *bits_down = sparse_down_bits(count_, u);
  }

 private:
  Knobs k_;
  uint64_t count_;
  std::vector<DgcWorker> workers_;
  std::vector<double> U_;  // dense momentum-SGD update on the true mean
};

// ---------------------------------------------------------------------------------------------
// Schemes by name, and which knobs they depend on (a sweep over a knob a scheme ignores computes
// that scheme once, at the first point).
const std::vector<std::string> kAllSchemes = {"thc", "uhc", "cnat", "dnat2", "dnatinf", "topk", "dgc", "terngrad", "qsgd"};

bool depends(const std::string& scheme, const std::string& key, const Knobs& k) {
  if (key == "workers" || key == "corr") return true;
  static const std::map<std::string, std::set<std::string>> deps = {
      {"thc", {"bits", "g", "p", "block"}},
      {"uhc", {"bits", "p", "block"}},
      {"cnat", {"block", "width"}},
      {"dnat2", {"block", "width", "levels", "bits"}},
      {"dnatinf", {"block", "width", "levels", "bits"}},
      {"topk", {"k", "bits"}},
      {"dgc", {"k", "bits", "momentum"}},
      {"terngrad", {}},
      {"qsgd", {"s", "bits"}},
  };
  if (key == "bits") {
    if ((scheme == "topk" || scheme == "dgc") && k.k > 0) return false;
    if (scheme == "qsgd" && k.qsgd_levels > 0) return false;
    if ((scheme == "dnat2" || scheme == "dnatinf") && k.dnat_levels > 0) return false;
  }
  auto it = deps.find(scheme);
  return it != deps.end() && it->second.count(key) > 0;
}

std::unique_ptr<Runner> make_runner(const std::string& s, const Knobs& k, uint64_t count) {
  codec::Params p;
  p.block_log2 = k.block_log2;
  p.nat_width = k.nat_width;
  if (s == "thc" || s == "uhc") {
    p.scheme = s == "thc" ? codec::Scheme::kThc : codec::Scheme::kUniformThc;
    p.bits = k.bits;
    p.granularity = thc_g(k);
    p.p = k.p;
    return std::make_unique<CodecRunner>(s, p, k, count);
  }
  if (s == "cnat") {
    p.scheme = codec::Scheme::kCnat;
    p.nat_levels = k.cnat_levels;
    return std::make_unique<CodecRunner>(s, p, k, count);
  }
  if (s == "dnat2" || s == "dnatinf") {
    p.scheme = codec::Scheme::kDnat;
    p.dnat_norm = s == "dnat2" ? 2 : 0;
    if (k.dnat_levels > 0) {
      p.nat_levels = k.dnat_levels;
    } else {
      codec::Params probe = p;  // widest window the sum width allows for n workers
      probe.nat_levels = 0;
      const int widest = codec::Codec(probe, k.workers).levels();
      p.nat_levels = std::min((1 << (k.bits - 1)) - 1, widest);
      p.nat_levels = std::max(1, p.nat_levels);
    }
    return std::make_unique<CodecRunner>(s, p, k, count);
  }
  if (s == "topk") return std::make_unique<TopKRunner>(k, count);
  if (s == "dgc") return std::make_unique<DgcRunner>(k, count);
  if (s == "terngrad") return std::make_unique<TernGradRunner>(k, count);
  if (s == "qsgd") return std::make_unique<QsgdRunner>(k, count);
  fail(Status::kInvalidArgument, "unknown scheme '" + s + "'");
}

// ---------------------------------------------------------------------------------------------
struct Row {
  std::string scheme;
  std::vector<Param> params;
  int workers = 0;
  uint64_t count = 0;
  int rounds = 0;
  double nmse = 0, bits_up = 0, bits_down = 0;
  bool homomorphic = false;
  std::string sweep_key;
  double sweep_value = 0;
};

std::string params_text(const std::vector<Param>& ps) {
  std::string s;
  for (const auto& p : ps) s += (s.empty() ? "" : " ") + p.key + "=" + p.value;
  return s;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += c;
    }
  }
  return o;
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[40];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

std::string row_json(const Row& r) {
  std::ostringstream o;
  o << "{\"scheme\":\"" << json_escape(r.scheme) << "\",\"params\":{";
  for (size_t i = 0; i < r.params.size(); ++i) {
    const auto& p = r.params[i];
    o << (i ? "," : "") << "\"" << json_escape(p.key) << "\":";
    if (p.numeric) o << p.value;
    else o << "\"" << json_escape(p.value) << "\"";
  }
  o << "},\"workers\":" << r.workers << ",\"count\":" << r.count << ",\"rounds\":" << r.rounds
    << ",\"nmse\":" << json_number(r.nmse) << ",\"bits_up\":" << json_number(r.bits_up)
    << ",\"bits_down\":" << json_number(r.bits_down) << ",\"homomorphic\":" << (r.homomorphic ? "true" : "false");
  if (!r.sweep_key.empty()) o << ",\"sweep\":{\"" << r.sweep_key << "\":" << json_number(r.sweep_value) << "}";
  o << "}";
  return o.str();
}

const char* kTableFmt = "%-9s %-42s %7s %12s %9s %9s  %s\n";

void print_table_header() {
  std::printf(kTableFmt, "scheme", "params", "workers", "nmse", "bits_up", "bits_down", "homomorphic");
}

void print_table_row(const Row& r) {
  char nm[32], up[32], dn[32], wk[16];
  std::snprintf(nm, sizeof nm, "%.4e", r.nmse);
  std::snprintf(up, sizeof up, "%.4f", r.bits_up);
  std::snprintf(dn, sizeof dn, "%.4f", r.bits_down);
  std::snprintf(wk, sizeof wk, "%d", r.workers);
  std::printf(kTableFmt, r.scheme.c_str(), params_text(r.params).c_str(), wk, nm, up, dn,
              r.homomorphic ? "yes" : "no");
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Sweep values: "1,2,4,...,64" (arithmetic or geometric continuation), "2..8" (integer range),
// fractions "1/32".
double parse_number(const std::string& t, const std::string& what = "--sweep") {
  const auto slash = t.find('/');
  size_t used = 0;
  try {
    if (slash != std::string::npos) {
      const double a = std::stod(t.substr(0, slash)), b = std::stod(t.substr(slash + 1));
      if (b == 0) throw std::invalid_argument("division by zero");
      return a / b;
    }
    const double v = std::stod(t, &used);
    if (used != t.size()) throw std::invalid_argument("trailing characters");
    return v;
  } catch (const std::exception&) {
    throw CLI::ValidationError(what, "'" + t + "' is not a number");
  }
}

std::vector<double> parse_values(const std::string& list) {
  std::vector<std::string> toks;
  std::stringstream ss(list);
  std::string t;
  while (std::getline(ss, t, ',')) toks.push_back(t);
  std::vector<double> out;
  for (size_t i = 0; i < toks.size(); ++i) {
    const std::string& tok = toks[i];
    const auto dots = tok.find("..");
    if (tok == "..." || tok == "..") {
      if (out.size() < 2 || i + 1 >= toks.size())
        throw CLI::ValidationError("--sweep", "'...' needs two values before it and one after it");
      const double end = parse_number(toks[i + 1]);
      const double a = out[out.size() - 2], b = out.back();
      const bool geometric = out.size() >= 3 && a != 0 && out[out.size() - 3] != 0 &&
                             std::fabs(b / a - a / out[out.size() - 3]) < 1e-9 && std::fabs(b / a - 1) > 1e-9 &&
                             std::fabs((b - a) - (a - out[out.size() - 3])) > 1e-9;
      const double step = geometric ? b / a : b - a;
      if ((geometric && step <= 1) || (!geometric && step <= 0))
        throw CLI::ValidationError("--sweep", "'...' continues increasing sequences only");
      for (double v = geometric ? b * step : b + step; v < end * (1 - 1e-12); v = geometric ? v * step : v + step)
        out.push_back(v);
      continue;
    }
    if (dots != std::string::npos) {
      const double lo = parse_number(tok.substr(0, dots)), hi = parse_number(tok.substr(dots + 2));
      if (lo != std::floor(lo) || hi != std::floor(hi) || hi < lo)
        throw CLI::ValidationError("--sweep", "range '" + tok + "' must be integers lo..hi with lo <= hi");
      for (double v = lo; v <= hi; v += 1) out.push_back(v);
      continue;
    }
    out.push_back(parse_number(tok));
  }
  if (out.empty()) throw CLI::ValidationError("--sweep", "no values");
  return out;
}

int block_log2_of(double v, const std::string& what) {
  // Accept the block size in elements (a power of two) or its log2 (10..20).
  const long e = std::lround(v);
  if (e >= 10 && e <= 20) return static_cast<int>(e);
  for (int l = 10; l <= 20; ++l)
    if (e == (1L << l)) return l;
  throw CLI::ValidationError(what, "block must be a power of two in 1024..1048576 (or its log2 10..20), not " + fmt(v));
}

void apply(Knobs* k, const std::string& key, double v) {
  auto as_int = [&](int lo, int hi) {
    if (v != std::floor(v) || v < lo || v > hi)
      throw CLI::ValidationError("--sweep", key + "=" + fmt(v) + " must be an integer in " + std::to_string(lo) + ".." +
                                                std::to_string(hi));
    return static_cast<int>(v);
  };
  if (key == "workers") k->workers = as_int(1, 4096);
  else if (key == "bits" || key == "b") k->bits = as_int(1, 8);
  else if (key == "g") k->g = as_int(1, 1 << 20);
  else if (key == "p") k->p = v;
  else if (key == "block") k->block_log2 = block_log2_of(v, "--sweep");
  else if (key == "corr") k->corr = v;
  else if (key == "k") k->k = v;
  else if (key == "s") k->qsgd_levels = as_int(1, 1 << 20);
  else if (key == "levels") k->dnat_levels = as_int(1, 127);
  else if (key == "width") k->nat_width = as_int(8, 32);
  else if (key == "momentum") k->momentum = v;
  else
    throw CLI::ValidationError("--sweep", "unknown key '" + key +
                                              "' (workers, bits, g, p, block, corr, k, s, levels, width, momentum)");
}

std::string canonical_key(const std::string& key) { return key == "b" ? "bits" : key; }

}  // namespace
}  // namespace thc::perf

int main(int argc, char** argv) {
  using namespace thc::perf;
  Knobs k;
  InputSpec in;
  int rounds = 1;
  std::string schemes_opt = "all", sweep, plot, p_text = "1/32";
  long block = 16384;
  bool json = false;

  CLI::App app{
      "thc_nmse: NMSE of THC, uniform THC, Cnat and natural dithering against TopK, DGC, TernGrad and QSGD, "
      "with the bits per element each worker sends up and receives down. One row per scheme; NMSE = "
      "||estimate - mean||^2 / ||mean||^2 over the workers' gradients, averaged over --rounds."};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // last wins, as getopt
  app.add_option("--workers", k.workers, "number of workers n")->check(CLI::Range(1, 4096));
  auto* count_opt = app.add_option(
      "--count", in.count, "elements per gradient (synthetic, default 1048576); with --input, only the first --count");
  app.add_option("--seed", k.seed, "seed of inputs and of every scheme's randomness");
  app.add_option("--rounds", rounds, "rounds (fresh synthetic gradients each round; error feedback and DGC carry state)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--dist", in.dist, "synthetic distribution: gaussian | lognormal (heavy-tailed, random signs)")
      ->check(CLI::IsMember({"gaussian", "lognormal"}));
  app.add_option("--sigma", in.sigma, "lognormal: |x| = exp(sigma * N(0,1))");
  app.add_option("--corr", k.corr, "correlation between workers: x_i = sqrt(corr) common + sqrt(1-corr) own_i")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--input", in.pattern,
                 "real gradients: raw little-endian float32 files, one per worker, e.g. 'grads/rank%d.f32'");
  app.add_option("--schemes", schemes_opt,
                 "comma-separated subset of thc,uhc,cnat,dnat2,dnatinf,topk,dgc,terngrad,qsgd (or 'all')");
  app.add_option("--bits,-b", k.bits, "THC index bits b; also the uplink budget TopK/DGC (k = b/64), QSGD (s = 2^(b-1)-1) "
                                      "and natural dithering (s = 2^(b-1)-1 levels, capped) match unless set explicitly")
      ->check(CLI::Range(1, 8));
  app.add_option("-g,--granularity", k.g, "THC granularity g (0 = 2(2^b-1): 30 for b=4)");
  app.add_option("--p", p_text, "THC truncation fraction p, t_p = Phi^-1(1-p/2) (accepts 1/32)");
  app.add_option("--block", block, "THC RHT block / Cnat prelude block in elements (power of two, 1024..1048576)");
  app.add_option("--nat-width", k.nat_width, "Cnat/Dnat integer sum width (8, 16, 32)")->check(CLI::IsMember({8, 16, 32}));
  app.add_option("--cnat-levels", k.cnat_levels, "Cnat power-of-two levels (0 = widest that fits the sum width)");
  app.add_option("--dnat-levels", k.dnat_levels, "natural dithering levels s (0 = from --bits)");
  app.add_option("--k", k.k, "TopK/DGC fraction of coordinates kept (0 = bits/64)")->check(CLI::Range(0.0, 1.0));
  app.add_option("--momentum", k.momentum, "DGC momentum")->check(CLI::Range(0.0, 1.0));
  app.add_flag("--dgc-masking", k.dgc_masking, "DGC momentum factor masking (u[sent] = 0)");
  app.add_option("--qsgd-levels", k.qsgd_levels, "QSGD levels s (0 = 2^(bits-1)-1)");
  app.add_option("--qsgd-bucket", k.qsgd_bucket, "QSGD bucket size (0 = whole vector)");
  app.add_option("--terngrad-bucket", k.terngrad_bucket, "TernGrad bucket size (0 = whole vector)");
  app.add_flag("--ef", k.ef, "error feedback over rounds for every scheme (DGC accumulates locally anyway)");
  app.add_option("--sweep", sweep,
                 "one knob over values: workers=1,2,4,...,64 | bits=2..8 | g=16,30,60 | p=1/64,1/32 | "
                 "block=1024,65536 | corr=0,0.5,1 | k=0.01,0.1 | s=1,3,7 | levels=2..8");
  app.add_flag("--json", json, "one JSON object per row instead of the table");
  app.add_option("--plot", plot, "draw NMSE against bits per element up (or against the swept knob) into this PNG");
  CLI11_PARSE(app, argc, argv);

  if (in.pattern.empty() && count_opt->count() == 0) in.count = 1 << 20;
  try {
    k.p = parse_number(p_text, "--p");
    if (!(k.p > 0 && k.p < 1)) throw CLI::ValidationError("--p", "must be in (0, 1)");
    k.block_log2 = block_log2_of(static_cast<double>(block), "--block");
  } catch (const CLI::Error& e) {
    return app.exit(e);
  }

  std::vector<std::string> schemes;
  if (schemes_opt == "all") {
    schemes = kAllSchemes;
  } else {
    std::stringstream ss(schemes_opt);
    std::string s;
    while (std::getline(ss, s, ',')) {
      if (std::find(kAllSchemes.begin(), kAllSchemes.end(), s) == kAllSchemes.end()) {
        std::fprintf(stderr, "thc_nmse: unknown scheme '%s' (thc, uhc, cnat, dnat2, dnatinf, topk, dgc, terngrad, qsgd)\n",
                     s.c_str());
        return 2;
      }
      schemes.push_back(s);
    }
  }

  std::string sweep_key;
  std::vector<double> sweep_values;
  try {
    if (!sweep.empty()) {
      const auto eq = sweep.find('=');
      if (eq == std::string::npos) throw CLI::ValidationError("--sweep", "expected key=values, e.g. bits=2..8");
      sweep_key = canonical_key(sweep.substr(0, eq));
      sweep_values = parse_values(sweep.substr(eq + 1));
      Knobs probe = k;
      for (double v : sweep_values) apply(&probe, sweep_key, v);  // validate all values up front
    }
  } catch (const CLI::Error& e) {
    return app.exit(e);
  }
  if (sweep_values.empty()) sweep_values.push_back(NAN);

  in.workers = k.workers;
  in.corr = k.corr;
  in.seed = k.seed;
  if (!in.pattern.empty() && sweep_key == "corr") {
    std::fprintf(stderr, "thc_nmse: --sweep corr needs synthetic inputs, not --input\n");
    return 2;
  }

  std::vector<Row> rows;
  int failures = 0;
  bool header = false;
  for (size_t si = 0; si < sweep_values.size(); ++si) {
    Knobs kk = k;
    if (!sweep_key.empty()) apply(&kk, sweep_key, sweep_values[si]);
    InputSpec ii = in;
    ii.workers = kk.workers;
    ii.corr = kk.corr;
    std::unique_ptr<Inputs> inputs;
    try {
      inputs = make_inputs(ii);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "thc_nmse: %s\n", e.what());
      return 2;
    }
    const uint64_t count = inputs->count();
    if (!header) {
      if (!json) {
        std::printf("# thc_nmse: input %s, workers %s, count %llu, rounds %d, seed %llu, error feedback %s\n",
                    inputs->describe().c_str(),
                    sweep_key == "workers" ? "swept" : std::to_string(k.workers).c_str(), static_cast<unsigned long long>(count), rounds,
                    static_cast<unsigned long long>(k.seed), k.ef ? "on" : "off");
        if (!sweep_key.empty()) std::printf("# sweep %s = %s\n", sweep_key.c_str(), sweep.substr(sweep.find('=') + 1).c_str());
        std::printf("# nmse = ||est - mean||^2 / ||mean||^2 (dgc: against the dense momentum update); bits per element\n");
        print_table_header();
      }
      header = true;
    }
    std::vector<std::string> todo;
    for (const auto& s : schemes)
      if (si == 0 || depends(s, sweep_key, k)) todo.push_back(s);

    std::vector<std::unique_ptr<Runner>> runners(todo.size());
    std::vector<double> nmse_sum(todo.size(), 0), up_sum(todo.size(), 0), down_sum(todo.size(), 0);
    std::vector<bool> failed(todo.size(), false);
    for (size_t i = 0; i < todo.size(); ++i) {
      try {
        runners[i] = make_runner(todo[i], kk, count);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thc_nmse: %s (workers=%d): %s\n", todo[i].c_str(), kk.workers, e.what());
        failed[i] = true;
        ++failures;
      }
    }
    Grads xs;
    std::vector<double> mean(count), est, ref;
    for (int r = 0; r < rounds; ++r) {
      inputs->generate(static_cast<uint32_t>(r), &xs);
      std::fill(mean.begin(), mean.end(), 0.0);
      for (const auto& x : xs)
        for (uint64_t i = 0; i < count; ++i) mean[i] += x[i];
      for (auto& m : mean) m /= kk.workers;
      for (size_t i = 0; i < todo.size(); ++i) {
        if (failed[i]) continue;
        double up = 0, down = 0;
        try {
          runners[i]->round(xs, mean, static_cast<uint32_t>(r), &est, &ref, &up, &down);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "thc_nmse: %s (workers=%d): %s\n", todo[i].c_str(), kk.workers, e.what());
          failed[i] = true;
          ++failures;
          continue;
        }
        double err = 0, nrm = 0;
        for (uint64_t j = 0; j < count; ++j) {
          const double d = est[j] - ref[j];
          err += d * d;
          nrm += ref[j] * ref[j];
        }
        nmse_sum[i] += nrm > 0 ? err / nrm : (err > 0 ? INFINITY : 0.0);
        up_sum[i] += up;
        down_sum[i] += down;
      }
    }
    for (size_t i = 0; i < todo.size(); ++i) {
      if (failed[i]) continue;
      Row row;
      row.scheme = todo[i];
      row.params = runners[i]->params();
      row.workers = kk.workers;
      row.count = count;
      row.rounds = rounds;
      row.nmse = nmse_sum[i] / rounds;
      row.bits_up = up_sum[i] / rounds;
      row.bits_down = down_sum[i] / rounds;
      row.homomorphic = runners[i]->homomorphic();
      if (!sweep_key.empty()) {
        row.sweep_key = sweep_key;
        row.sweep_value = sweep_values[si];
      }
      if (json) {
        std::printf("%s\n", row_json(row).c_str());
        std::fflush(stdout);
      } else {
        print_table_row(row);
      }
      rows.push_back(row);
    }
  }

  if (!plot.empty()) {
    // x: bits up, unless the sweep changes something the bits do not show (workers, corr, g, p,
    // block, momentum, width): then the swept knob.
    const bool by_knob = !sweep_key.empty() && sweep_key != "bits" && sweep_key != "k" && sweep_key != "s" &&
                         sweep_key != "levels";
    std::vector<Series> series;
    std::map<std::string, size_t> idx;
    for (const auto& r : rows) {
      if (!idx.count(r.scheme)) {
        idx[r.scheme] = series.size();
        series.push_back({r.scheme, {}});
      }
      series[idx[r.scheme]].points.push_back({by_knob ? r.sweep_value : r.bits_up, r.nmse});
    }
    for (auto& s : series)
      if (!by_knob) std::sort(s.points.begin(), s.points.end());
    PlotSpec ps;
    ps.file = plot;
    ps.title = "thc_nmse: n=" + (sweep_key == "workers" ? std::string("swept") : std::to_string(k.workers)) +
               ", " + std::to_string(rows.empty() ? 0 : rows[0].count) + " elements";
    ps.xlabel = by_knob ? sweep_key : "bits per element (up)";
    ps.ylabel = "NMSE";
    ps.logx = by_knob && (sweep_key == "workers" || sweep_key == "block");
    try {
      const std::string how = plot_png(ps, series);
      std::fprintf(stderr, "thc_nmse: wrote %s (%s)\n", plot.c_str(), how.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "thc_nmse: %s\n", e.what());
      return 3;
    }
  }
  return failures ? 1 : 0;
}
