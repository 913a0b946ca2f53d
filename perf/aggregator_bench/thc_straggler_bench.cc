// thc_straggler_bench: one worker of an aggregator job, as its own process (no MPI: a worker that
// dies must not take the others down with it). perf/straggler.sh starts one per testbed host and
// compares what the others see when the last rank is late or dead.
//
//   thc_straggler_bench --aggregator URLS --rank R --world N --job J [--count 16777216] [--calls 3]
//                       [--quorum K] [--quorum-timeout-ms 100] [--timeout-ms 30000]
//                       [--straggle-ms MS] [--die] [--scheme thc|cnat]
//
// Every rank makes --calls allreduces (float32 SUM, error feedback on) of --count elements. The
// last rank sleeps --straggle-ms before its second call, or with --die exits after its first call
// without leaving the job (as a crashed process would). Prints one line per call:
//   rank R call C status NAME ms T contributors-ok
// The key comes from THC_AGGREGATOR_KEY / THC_AGGREGATOR_KEY_FILE.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "thc/thc.h"

int main(int argc, char** argv) {
  CLI::App app{"thc_straggler_bench: one worker of an aggregator job (stragglers, dead workers)"};
  std::string urls, scheme = "thc";
  int rank = 0, world = 1, calls = 3, quorum = 0;
  uint32_t job = 1;
  size_t count = size_t{1} << 24;
  long qt_ms = 100, timeout_ms = 30000, straggle_ms = 0;
  bool die = false;
  app.add_option("--aggregator", urls, "udp://HOST:PORT[,...]")->required();
  app.add_option("--rank", rank)->required();
  app.add_option("--world", world)->required();
  app.add_option("--job", job, "job label (the same on every rank)")->required();
  app.add_option("--count", count)->capture_default_str();
  app.add_option("--calls", calls)->capture_default_str();
  app.add_option("--quorum", quorum, "0: all workers")->capture_default_str();
  app.add_option("--quorum-timeout-ms", qt_ms)->capture_default_str();
  app.add_option("--timeout-ms", timeout_ms)->capture_default_str();
  app.add_option("--straggle-ms", straggle_ms, "the last rank sleeps this long before its second call");
  app.add_flag("--die", die, "the last rank exits after its first call, without leaving");
  app.add_option("--scheme", scheme)->check(CLI::IsMember({"thc", "cnat"}));
  CLI11_PARSE(app, argc, argv);

  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) {
    std::fprintf(stderr, "rank %d: %s\n", rank, thc_last_error());
    return 2;
  }
  cfg.quorum = quorum;
  cfg.quorum_timeout_ms = qt_ms;
  cfg.timeout_ms = timeout_ms;
  thc_comm_t comm = nullptr;
  if (thc_comm_create_aggregator(urls.c_str(), rank, world, job, nullptr, &cfg, &comm) != THC_SUCCESS) {
    std::fprintf(stderr, "rank %d: %s\n", rank, thc_last_error());
    return 1;
  }
  thc_state_t ef = nullptr;
  thc_state_create(&ef);
  std::vector<float> x(count), y(count);
  std::mt19937 g(static_cast<uint32_t>(rank + 1));
  std::normal_distribution<float> n01;
  const bool last = rank == world - 1;
  int rc = 0;
  for (int c = 1; c <= calls; ++c) {
    for (auto& v : x) v = n01(g);
    if (last && c == 2 && die) {
      std::printf("rank %d call %d died\n", rank, c);
      std::fflush(stdout);
      _exit(0);  // no LEAVE, no cleanup: a crashed worker
    }
    if (last && c == 2 && straggle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(straggle_ms));
    const auto t0 = std::chrono::steady_clock::now();
    const thc_status_t st = scheme == "thc"
                                ? thc_allreduce(x.data(), y.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef)
                                : cnat_allreduce(x.data(), y.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank %d call %d status %s ms %.1f%s%s\n", rank, c, st == THC_SUCCESS ? "ok" : thc_status_string(st), ms,
                st == THC_SUCCESS ? "" : " : ", st == THC_SUCCESS ? "" : thc_last_error());
    std::fflush(stdout);
    if (st != THC_SUCCESS && st != THC_ERR_LEFT_BEHIND) rc = 3;
  }
  thc_state_destroy(ef);
  thc_comm_destroy(comm);
  return rc;
}
