// thc_overlap_perf: how much of a compressed allreduce hides behind computation.
//
//   mpirun -np 4 thc_overlap_perf --size 16M --inflight 4 --scheme thc
//
// Three timings, each the slowest rank's, median over -n repetitions:
//   compute  a fixed CPU workload alone (passes of y = a*y + x over a 256 KB buffer, the number of
//            passes fixed once for the run: by default calibrated on rank 0 so that the workload
//            takes about as long as the communication alone, where overlap matters most;
//            --compute-ms sets another target)
//   comm     --inflight allreduces of --size bytes each, started back to back (thc_iallreduce,
//            or MPI_Iallreduce for --scheme none) and waited for (thc_waitall / MPI_Waitall)
//   both     the same allreduces started, then the workload, then the wait
// and overlap = (compute + comm - both) / min(compute, comm): 1 when both = max(compute, comm)
// (communication fully hidden), 0 when both = compute + comm (none hidden). Also printed: both /
// max(compute, comm), and the CPU time (all threads of the process) per repetition of comm alone:
// a communication that keeps a core busy for its whole duration cannot hide behind a computation
// that needs that core too, whatever the threads (see the README: on this 2-core machine ranks
// share cores, so only the communication's waiting hides, its encoding and decoding do not).
//
// --workload sleep replaces the CPU workload by a sleep of the same calibrated length: the caller
// busy elsewhere without using a core (waiting for a GPU kernel, as a training step's backward pass
// does), which separates what the progress thread can hide from what the cores allow.
//
// thc needs MPI_THREAD_MULTIPLE for its progress thread; the tool asks for it and says what it got.
#include <mpi.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <thread>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "perf/nonblocking/nb_perf_util.h"
#include "thc/thc_mpi.h"

namespace {

using namespace thc_nb_perf;

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

// The workload: passes of an FMA over 64 Ki floats (256 KB, cache-resident): pure CPU. Or, with
// sleep, as long as that many passes took when calibrated, without using the CPU.
struct Work {
  std::vector<float> x, y;
  bool sleep = false;
  double per_pass = 0;  // seconds, measured by calibrate()
  Work() : x(1 << 16, 1.0001f), y(1 << 16, 0.5f) {}
  void run(long passes) {
    if (sleep && per_pass > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(per_pass * static_cast<double>(passes)));
      return;
    }
    for (long p = 0; p < passes; ++p) {
      const float a = 0.999f;
      for (size_t i = 0; i < y.size(); ++i) y[i] = a * y[i] + x[i] * 1e-3f;
    }
  }
  float sink() const { return y[17]; }
};

}  // namespace

int main(int argc, char** argv) {
  std::string size_s = "16M", scheme_s = "thc", workload_s = "cpu";
  int inflight = 4, reps = 5, warmup = 2;
  double compute_ms = 0;
  CLI::App app{"thc_overlap_perf: compute while nonblocking allreduces are in flight. Run under mpirun."};
  app.add_option("--size", size_s, "bytes of each allreduce (float32; K/M/G suffixes)");
  app.add_option("--inflight", inflight, "allreduces in flight at once")->check(CLI::Range(1, 1 << 16));
  app.add_option("--scheme", scheme_s, "thc | uhc | cnat | dnat | none (MPI_Iallreduce, uncompressed)")
      ->check(CLI::IsMember({"thc", "uhc", "cnat", "dnat", "none"}));
  app.add_option("--compute-ms", compute_ms, "the workload's target time (0: about the communication's)");
  app.add_option("--workload", workload_s, "cpu (FMA passes) | sleep (as long, without using a core)")
      ->check(CLI::IsMember({"cpu", "sleep"}));
  app.add_option("-n,--reps", reps, "timed repetitions (median)")->check(CLI::Range(1, 1000));
  app.add_option("-w,--warmup", warmup, "warm-up repetitions")->check(CLI::Range(0, 1000));
  if (const int rc = init(app, argc, argv, "thc_overlap_perf"); rc >= 0) return rc;
  uint64_t bytes = 0;
  if (!parse_size(size_s, &bytes) || bytes < 4) die("bad --size '" + size_s + "'");
  const size_t count = bytes / 4;
  const bool none = scheme_s == "none";
  thc_scheme_t scheme = THC_SCHEME_THC;
  if (scheme_s == "uhc") scheme = THC_SCHEME_UHC;
  if (scheme_s == "cnat") scheme = THC_SCHEME_CNAT;
  if (scheme_s == "dnat") scheme = THC_SCHEME_DNAT;

  thc_comm_t tc = nullptr;
  if (!none) {
    thc_config_t cfg;
    if (thc_config_init(&cfg) != THC_SUCCESS) die(thc_last_error());
    if (thc_comm_create_mpi(MPI_COMM_WORLD, &cfg, &tc) != THC_SUCCESS) die(thc_last_error());
  }
  std::vector<std::vector<float>> x(inflight), y(inflight);
  std::mt19937 gen(1 + g_rank);
  std::normal_distribution<float> nd;
  for (int i = 0; i < inflight; ++i) {
    x[i].resize(count);
    y[i].resize(count);
    for (float& v : x[i]) v = nd(gen);
  }
  auto start = [&](std::vector<thc_request_t>& tq, std::vector<MPI_Request>& mq) {
    for (int i = 0; i < inflight; ++i) {
      if (none) {
        if (MPI_Iallreduce(x[i].data(), y[i].data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                           &mq[i]) != MPI_SUCCESS)
          die("MPI_Iallreduce failed");
      } else if (thc_iallreduce_scheme(scheme, x[i].data(), y[i].data(), count, THC_FLOAT32, THC_OP_SUM, tc, nullptr,
                                       &tq[i]) != THC_SUCCESS) {
        die(std::string("thc_iallreduce: ") + thc_last_error());
      }
    }
  };
  auto finish = [&](std::vector<thc_request_t>& tq, std::vector<MPI_Request>& mq) {
    if (none) {
      MPI_Waitall(inflight, mq.data(), MPI_STATUSES_IGNORE);
    } else if (thc_waitall(tq.size(), tq.data(), nullptr) != THC_SUCCESS) {
      die(std::string("thc_waitall: ") + thc_last_error());
    }
  };
  std::vector<thc_request_t> tq(inflight);
  std::vector<MPI_Request> mq(inflight);
  Work work;

  // Communication alone (warm-up included), then the workload's size.
  std::vector<double> comm, cpu;
  for (int r = 0; r < warmup + reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double c0 = cpu_seconds(), t0 = MPI_Wtime();
    start(tq, mq);
    finish(tq, mq);
    const double t = slowest(MPI_Wtime() - t0);
    const double c = cpu_seconds() - c0;
    if (r >= warmup) {
      comm.push_back(t);
      cpu.push_back(c);
    }
  }
  const double t_comm = median(comm);
  // The workload's passes: measured on every rank at once (as it will run), slowest rank, twice
  // (the second round corrects the first at the target's length), then fixed for the run.
  const double target = compute_ms > 0 ? compute_ms * 1e-3 : t_comm;
  long passes = 100;
  for (int round = 0; round < 2; ++round) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    work.run(passes);
    const double t = slowest(MPI_Wtime() - t0);
    work.per_pass = t / static_cast<double>(passes);
    passes = std::max<long>(1, static_cast<long>(static_cast<double>(passes) * target / std::max(t, 1e-9)));
  }
  MPI_Bcast(&passes, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  MPI_Bcast(&work.per_pass, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  work.sleep = workload_s == "sleep";

  std::vector<double> comp, both;
  for (int r = 0; r < warmup + reps; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    work.run(passes);
    const double tc1 = slowest(MPI_Wtime() - t0);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    start(tq, mq);
    work.run(passes);
    finish(tq, mq);
    const double tb = slowest(MPI_Wtime() - t0);
    if (r >= warmup) {
      comp.push_back(tc1);
      both.push_back(tb);
    }
  }
  const double t_comp = median(comp), t_both = median(both), c_comm = median(cpu);
  double cpu_max = 0;
  MPI_Allreduce(&c_comm, &cpu_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const double hidden = t_comp + t_comm - t_both;
  const double overlap = hidden / std::min(t_comp, t_comm);
  if (g_rank == 0) {
    std::printf("# thc_overlap_perf: %d ranks, %d x %llu B allreduces in flight, scheme %s, MPI thread level %s, "
                "workload %s, %ld passes (%s)\n",
                g_size, inflight, static_cast<unsigned long long>(count * 4), scheme_s.c_str(),
                g_provided == MPI_THREAD_MULTIPLE ? "MULTIPLE" : "below MULTIPLE (thc runs calls inline)",
                workload_s == "sleep" ? "sleep (no CPU)" : "cpu", passes,
                compute_ms > 0 ? "--compute-ms" : "calibrated to the communication");
    std::printf("# %10s  %10s  %10s  %10s  %10s  %8s  %9s  %12s\n", "compute", "comm", "both", "sum", "max", "overlap",
                "both/max", "comm_cpu");
    std::printf("# %10s  %10s  %10s  %10s  %10s  %8s  %9s  %12s\n", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "", "",
                "(ms, busiest)");
    std::printf("  %10.1f  %10.1f  %10.1f  %10.1f  %10.1f  %8.2f  %9.2f  %12.1f\n", t_comp * 1e3, t_comm * 1e3,
                t_both * 1e3, (t_comp + t_comm) * 1e3, std::max(t_comp, t_comm) * 1e3, overlap,
                t_both / std::max(t_comp, t_comm), cpu_max * 1e3);
    std::printf("# workload checksum %g\n", static_cast<double>(work.sink()));
  }
  if (tc) thc_comm_destroy(tc);
  MPI_Finalize();
  return 0;
}
