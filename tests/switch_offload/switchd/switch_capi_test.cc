// The C API's aggregator communicator (thc_comm_create_aggregator) on a switch: thc_allreduce (THC,
// index form) and cnat_allreduce (Cnat: value form on a switch) through simple_switch running the
// THC program, with thc-switchd as its control plane. Ranks are threads of this process (one
// address, a UDP port each). The decoded results must be bit-identical to the same calls (same
// seeds) on the software thc-aggregator; a quorum job must be refused with a message that says
// quorum jobs need a software aggregator.
//
// Runs inside the testbed (bmv2_capi_test.sh sets THC_TEST_SWITCH_URL, THC_TEST_REF_URL and
// THC_AGGREGATOR_KEY_FILE); skipped elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "thc/thc.h"

namespace {

std::string env(const char* n) {
  const char* v = std::getenv(n);
  return v ? v : "";
}

#define REQUIRE_TESTBED()                                                                       \
  if (env("THC_TEST_SWITCH_URL").empty() || env("THC_TEST_REF_URL").empty())                    \
  GTEST_SKIP() << "not in the switch testbed (run by bmv2_capi_test.sh: THC_TEST_SWITCH_URL)"

std::vector<float> input(int rank, size_t n) {
  std::mt19937 g(static_cast<uint32_t>(9000 + rank));
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct Outcome {
  std::vector<std::vector<float>> out;
  std::vector<std::string> err;
  std::vector<thc_stats_t> stats;
};

// `world` ranks as threads: create a communicator of job `job` at `url`, one allreduce of `n`
// floats with `scheme`, destroy it.
Outcome run(const std::string& url, int world, uint32_t job, thc_scheme_t scheme, size_t n, int quorum = 0) {
  Outcome r;
  r.out.resize(world);
  r.err.resize(world);
  r.stats.resize(world);
  std::vector<std::thread> ts;
  for (int rank = 0; rank < world; ++rank)
    ts.emplace_back([&, rank] {
      thc_config_t cfg;
      if (thc_config_init(&cfg) != THC_SUCCESS) {
        r.err[rank] = thc_last_error();
        return;
      }
      cfg.seed = 11;
      cfg.quorum = quorum;
      cfg.timeout_ms = 120000;
      thc_comm_t comm = nullptr;
      if (thc_comm_create_aggregator(url.c_str(), rank, world, job, nullptr, &cfg, &comm) != THC_SUCCESS) {
        r.err[rank] = thc_last_error();
        return;
      }
      const std::vector<float> x = input(rank, n);
      r.out[rank].assign(n, 0.f);
      if (thc_allreduce_scheme(scheme, x.data(), r.out[rank].data(), n, THC_FLOAT32, THC_OP_SUM, comm, nullptr) !=
          THC_SUCCESS)
        r.err[rank] = thc_last_error();
      thc_comm_stats(comm, &r.stats[rank]);
      thc_comm_destroy(comm);
    });
  for (auto& t : ts) t.join();
  return r;
}

double nmse(const std::vector<float>& got, int world) {
  std::vector<double> want(got.size(), 0.0);
  for (int rank = 0; rank < world; ++rank) {
    const auto x = input(rank, got.size());
    for (size_t i = 0; i < got.size(); ++i) want[i] += x[i];
  }
  double e = 0, s = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    s += want[i] * want[i];
  }
  return e / s;
}

void expect_equal_to_software(thc_scheme_t scheme, int world, size_t n, uint32_t job) {
  const Outcome sw = run(env("THC_TEST_SWITCH_URL"), world, job, scheme, n);
  const Outcome ref = run(env("THC_TEST_REF_URL"), world, job, scheme, n);
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_EQ(sw.err[rank], "") << "switch, rank " << rank;
    ASSERT_EQ(ref.err[rank], "") << "thc-aggregator, rank " << rank;
    EXPECT_GT(sw.stats[rank].packets, 0u);
    EXPECT_EQ(std::memcmp(sw.out[rank].data(), ref.out[rank].data(), n * sizeof(float)), 0)
        << "rank " << rank << ": the switch's result differs from thc-aggregator's";
    EXPECT_EQ(std::memcmp(sw.out[rank].data(), sw.out[0].data(), n * sizeof(float)), 0) << "rank " << rank;
  }
  const double e = nmse(sw.out[0], world);
  std::printf("scheme %d, %d workers, %zu floats: NMSE %.6g, %llu data packets and %llu retransmissions at rank 0\n",
              static_cast<int>(scheme), world, n, e, static_cast<unsigned long long>(sw.stats[0].packets),
              static_cast<unsigned long long>(sw.stats[0].retransmissions));
  EXPECT_LT(e, 0.1);
}

// BMv2 forwards a few hundred of these packets per second: sizes are chosen for that.
TEST(SwitchCapi, ThcMatchesTheSoftwareAggregator) {
  REQUIRE_TESTBED();
  expect_equal_to_software(THC_SCHEME_THC, 3, size_t{1} << 17, 31);  // 512 KB of float32
}

TEST(SwitchCapi, CnatMatchesTheSoftwareAggregator) {
  REQUIRE_TESTBED();
  expect_equal_to_software(THC_SCHEME_CNAT, 3, size_t{1} << 17, 32);
}

// 1 MB on two workers: 2048 packets through BMv2 take several times the job idle timeout that
// bmv2_capi_test.sh gives thc-switchd, without a control message after the joins.
TEST(SwitchCapi, ACallLongerThanTheJobIdleTimeoutKeepsItsJob) {
  REQUIRE_TESTBED();
  expect_equal_to_software(THC_SCHEME_THC, 2, size_t{1} << 18, 33);
}

TEST(SwitchCapi, QuorumJobsAreRefusedWithAClearMessage) {
  REQUIRE_TESTBED();
  const Outcome r = run(env("THC_TEST_SWITCH_URL"), 3, 34, THC_SCHEME_THC, 4096, /*quorum=*/2);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_NE(r.err[rank].find("takes no quorum jobs"), std::string::npos) << r.err[rank];
    EXPECT_NE(r.err[rank].find("software aggregator"), std::string::npos) << r.err[rank];
  }
  std::printf("rank 0: %s\n", r.err[0].c_str());
  // The same job on the software aggregator is fine.
  const Outcome ok = run(env("THC_TEST_REF_URL"), 3, 34, THC_SCHEME_THC, 4096, 2);
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(ok.err[rank], "") << rank;
}

}  // namespace
