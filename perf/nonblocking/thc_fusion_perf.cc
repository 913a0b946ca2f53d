// thc_fusion_perf: a model's many tensors against one allreduce of their total size.
//
//   mpirun -np 4 thc_fusion_perf --tensors 200 --min 1K --max 4M --scheme thc
//
// The model: --tensors float32 tensors whose sizes are drawn log-uniformly in [--min, --max] bytes
// (fixed --seed, the same on every rank; the sizes of a convolutional or transformer model's
// weights, biases and norms spread over several orders of magnitude like this), each starting on
// a 64-byte boundary as allocators place tensors (a bucket's tensors packed at arbitrary float
// offsets make every SIMD load of the codec straddle cache lines). Timed, each the
// slowest rank's, median over -n repetitions:
//   one      one thc_allreduce_scheme of a buffer of the total size: the reference
//   fused    every tensor's thc_iallreduce started back to back, then thc_waitall: the progress
//            thread fuses them (THC_FUSION_BYTES, THC_FUSION_CYCLE_MS)
//   group    one thc_allreduce_group of all the tensors
//   unfused  every tensor's thc_iallreduce on a communicator with THC_FUSION_BYTES=0
// and the ratios to `one` (the median of per-repetition ratios, modes alternating; target: fused
// within 1.15), plus the CPU time of the busiest process per repetition (all its threads). The NMSE of the fused results against the
// exact sum checks that they are what an allreduce returns.
#include <mpi.h>
#include <time.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "perf/nonblocking/nb_perf_util.h"
#include "thc/thc_mpi.h"

namespace {

using namespace thc_nb_perf;

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

void check(thc_status_t st, const char* what) {
  if (st != THC_SUCCESS) die(std::string(what) + ": " + thc_last_error());
}

}  // namespace

int main(int argc, char** argv) {
  std::string min_s = "1K", max_s = "4M", scheme_s = "thc", modes_s = "one,fused,group,unfused";
  int ntensors = 200, reps = 5, warmup = 2;
  uint64_t seed = 1;
  CLI::App app{"thc_fusion_perf: many tensors (nonblocking, fused) against one allreduce of their total size."};
  app.add_option("--tensors", ntensors, "tensors of the model")->check(CLI::Range(1, 100000));
  app.add_option("--min", min_s, "smallest tensor in bytes (K/M/G)");
  app.add_option("--max", max_s, "largest tensor in bytes");
  app.add_option("--scheme", scheme_s, "thc | uhc | cnat | dnat")->check(CLI::IsMember({"thc", "uhc", "cnat", "dnat"}));
  app.add_option("--seed", seed, "seed of the tensor sizes and inputs");
  app.add_option("--modes", modes_s, "comma-separated modes to time (one first: the ratios' reference)");
  app.add_option("-n,--reps", reps, "timed repetitions (median)")->check(CLI::Range(1, 1000));
  app.add_option("-w,--warmup", warmup, "warm-up repetitions")->check(CLI::Range(0, 1000));
  if (const int rc = init(app, argc, argv, "thc_fusion_perf"); rc >= 0) return rc;
  uint64_t lo = 0, hi = 0;
  if (!parse_size(min_s, &lo) || !parse_size(max_s, &hi) || lo < 4 || hi < lo) die("bad --min / --max");
  thc_scheme_t scheme = THC_SCHEME_THC;
  if (scheme_s == "uhc") scheme = THC_SCHEME_UHC;
  if (scheme_s == "cnat") scheme = THC_SCHEME_CNAT;
  if (scheme_s == "dnat") scheme = THC_SCHEME_DNAT;

  // The model's tensor sizes: the same on every rank (one seed).
  std::vector<size_t> counts(ntensors);
  {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)), std::log(static_cast<double>(hi)));
    for (size_t& c : counts) c = std::max<size_t>(1, static_cast<size_t>(std::exp(u(gen))) / 4);
  }
  size_t total = 0, span = 0;
  std::vector<size_t> off(ntensors);
  for (int t = 0; t < ntensors; ++t) {
    off[t] = span;
    total += counts[t];
    span += (counts[t] + 15) / 16 * 16;  // 64-byte boundaries
  }
  // Inputs: the model's tensors (xm, results ym) and the same values side by side in one buffer of
  // the total size for the reference (x, results y).
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  auto alloc = [](size_t n) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, std::max<size_t>(n, 1) * sizeof(float)) != 0) die("out of memory");
    return std::unique_ptr<float, Free>(static_cast<float*>(p));
  };
  auto xm_ = alloc(span), ym_ = alloc(span), x_ = alloc(total), y_ = alloc(total);
  float *xm = xm_.get(), *ym = ym_.get(), *xs = x_.get(), *ys = y_.get();
  {
    std::mt19937 gen(static_cast<uint32_t>(seed * 7919 + g_rank));
    std::normal_distribution<float> nd;
    size_t k = 0;
    for (int t = 0; t < ntensors; ++t)
      for (size_t i = 0; i < counts[t]; ++i) xm[off[t] + i] = xs[k++] = nd(gen);
  }

  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) die(thc_last_error());
  thc_comm_t fused = nullptr, plain = nullptr;
  check(thc_comm_create_mpi(MPI_COMM_WORLD, &cfg, &fused), "thc_comm_create_mpi");
  thc_config_t nofuse = cfg;
  nofuse.fusion_bytes = 0;
  check(thc_comm_create_mpi(MPI_COMM_WORLD, &nofuse, &plain), "thc_comm_create_mpi");

  auto run_one = [&] {
    check(thc_allreduce_scheme(scheme, xs, ys, total, THC_FLOAT32, THC_OP_SUM, fused, nullptr), "thc_allreduce_scheme");
  };
  std::vector<thc_request_t> reqs(ntensors);
  auto run_nb = [&](thc_comm_t c) {
    for (int t = 0; t < ntensors; ++t)
      check(thc_iallreduce_scheme(scheme, xm + off[t], ym + off[t], counts[t], THC_FLOAT32, THC_OP_SUM, c, nullptr,
                                  &reqs[t]),
            "thc_iallreduce_scheme");
    check(thc_waitall(reqs.size(), reqs.data(), nullptr), "thc_waitall");
  };
  std::vector<thc_tensor_t> ts(ntensors);
  for (int t = 0; t < ntensors; ++t) ts[t] = thc_tensor_t{xm + off[t], ym + off[t], counts[t], THC_FLOAT32, nullptr};
  auto run_group = [&] { check(thc_allreduce_group(scheme, ts.data(), ts.size(), THC_OP_SUM, fused), "thc_allreduce_group"); };

  struct Mode {
    const char* name;
    std::function<void()> fn;
    std::vector<double> t, cpu;
  };
  std::vector<Mode> all_modes = {{"one", run_one, {}, {}},
                                 {"fused", [&] { run_nb(fused); }, {}, {}},
                                 {"group", run_group, {}, {}},
                                 {"unfused", [&] { run_nb(plain); }, {}, {}}};
  std::vector<Mode> modes;
  for (Mode& m : all_modes)
    if (("," + modes_s + ",").find("," + std::string(m.name) + ",") != std::string::npos) modes.push_back(m);
  if (modes.empty()) die("--modes: none of one, fused, group, unfused");
  thc_stats_t s0{}, s1{};
  // Alternating modes, so that the machine's load drifts alike for all.
  for (int r = 0; r < warmup + reps; ++r) {
    for (Mode& m : modes) {
      if (std::string(m.name) == "fused") thc_comm_stats(fused, &s0);
      MPI_Barrier(MPI_COMM_WORLD);
      const double c0 = cpu_seconds(), t0 = MPI_Wtime();
      m.fn();
      const double t = slowest(MPI_Wtime() - t0);
      const double c = slowest(cpu_seconds() - c0);
      if (std::string(m.name) == "fused") thc_comm_stats(fused, &s1);
      if (r >= warmup) {
        m.t.push_back(t);
        m.cpu.push_back(c);
      }
    }
  }
  // The fused results against the exact sum.
  run_nb(fused);
  std::vector<double> xd(xs, xs + total), ex(total);
  MPI_Allreduce(xd.data(), ex.data(), static_cast<int>(total), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  double err = 0, ref = 0;
  for (int t = 0, k = 0; t < ntensors; ++t)
    for (size_t i = 0; i < counts[t]; ++i, ++k) {
      err += (ym[off[t] + i] - ex[k]) * (ym[off[t] + i] - ex[k]);
      ref += ex[k] * ex[k];
    }
  double nmse = err / ref, worst = 0;
  MPI_Allreduce(&nmse, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

  if (g_rank == 0) {
    const double base = median(modes[0].t);
    std::printf("# thc_fusion_perf: %d ranks, scheme %s, %d float32 tensors of %s..%s (log-uniform, seed %llu), total "
                "%.1f MB; THC_FUSION_BYTES %ld, THC_FUSION_CYCLE_MS %g; MPI thread level %s\n",
                g_size, scheme_s.c_str(), ntensors, min_s.c_str(), max_s.c_str(), static_cast<unsigned long long>(seed),
                total * 4 / 1e6, cfg.fusion_bytes, cfg.fusion_cycle_ms,
                g_provided == MPI_THREAD_MULTIPLE ? "MULTIPLE" : "below MULTIPLE (calls run inline)");
    // ratio_to_one: the median over repetitions of this mode's time over `one`'s in the same
    // repetition (measured back to back, so that the machine's load drifts out of the ratio).
    std::printf("# %-8s  %10s  %10s  %10s  %12s  %12s\n", "mode", "median_ms", "min_ms", "max_ms", "ratio_to_one",
                "cpu_ms");
    for (const Mode& m : modes) {
      std::vector<double> ratio;
      for (size_t i = 0; i < m.t.size(); ++i) ratio.push_back(m.t[i] / modes[0].t[i]);
      std::printf("  %-8s  %10.1f  %10.1f  %10.1f  %12.3f  %12.1f\n", m.name, median(m.t) * 1e3,
                  *std::min_element(m.t.begin(), m.t.end()) * 1e3, *std::max_element(m.t.begin(), m.t.end()) * 1e3,
                  median(ratio), median(m.cpu) * 1e3);
    }
    (void)base;
    std::printf("# fused: %llu groups for %llu tensors per repetition (last repetition); NMSE of the fused results "
                "%.4g (worst rank)\n",
                static_cast<unsigned long long>(s1.groups - s0.groups),
                static_cast<unsigned long long>(s1.grouped_tensors - s0.grouped_tensors), worst);
  }
  thc_comm_destroy(fused);
  thc_comm_destroy(plain);
  MPI_Finalize();
  return 0;
}
