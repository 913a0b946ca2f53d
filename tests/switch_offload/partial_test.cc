// Partial aggregation end to end, as a user of the C API sees it: thc_allreduce on communicators
// of a real thc-aggregator, four workers as threads, a quorum of 3. A straggler must not hold the
// others back (their call completes before the straggler even starts its own: a causal check, not
// a timing threshold), every worker that receives a result receives the same bits, a worker left
// behind gets THC_ERR_LEFT_BEHIND and rejoins with its next call, a dead worker is dropped, and
// without a quorum the survivors get THC_ERR_TIMEOUT instead of hanging. Wall times are printed.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "tests/barrier.h"
#include "tests/switch_offload/aggregator_process.h"
#include "thc/thc.h"

namespace {

using thc::test::AggregatorProcess;
using Clock = std::chrono::steady_clock;

constexpr int kWorld = 4;
constexpr size_t kCount = 1 << 16;

using Barrier = thc_testing::Barrier;

std::vector<float> input(int rank, int call) {
  std::mt19937 g(static_cast<uint32_t>(rank * 1000 + call));
  std::normal_distribution<float> n01;
  std::vector<float> v(kCount);
  for (auto& x : v) x = n01(g);
  return v;
}

double nmse(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0, r = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    r += want[i] * want[i];
  }
  return e / r;
}

struct Worker {
  thc_comm_t comm = nullptr;
  thc_state_t ef = nullptr;
};

// Every thread makes its communicator (collective over the four), runs body(rank, worker), and
// destroys it. Environment knobs are set by the caller before.
void run(const AggregatorProcess& agg, uint32_t job, const std::function<void(int, Worker&)>& body,
         const std::function<void(thc_config_t&)>& tweak) {
  std::vector<std::thread> ts;
  std::vector<std::string> errors(kWorld);
  for (int r = 0; r < kWorld; ++r)
    ts.emplace_back([&, r] {
      thc_config_t cfg;
      ASSERT_EQ(thc_config_init(&cfg), THC_SUCCESS);
      cfg.block = 1024;
      cfg.chunk_bytes = 64 << 10;  // several chunks (operations) per call
      cfg.agg_lanes = 256;
      tweak(cfg);
      Worker w;
      const std::string key = thc::switch_offload::auth::format_key(thc::test::test_key(1));
      const thc_status_t st = thc_comm_create_aggregator(agg.url().c_str(), r, kWorld, job, key.c_str(), &cfg, &w.comm);
      if (st != THC_SUCCESS) {
        errors[r] = thc_last_error();
        return;
      }
      thc_state_create(&w.ef);
      body(r, w);
      thc_state_destroy(w.ef);
      thc_comm_destroy(w.comm);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

TEST(PartialAggregation, AStragglerDoesNotHoldTheQuorumBack) {
  AggregatorProcess agg;
  Barrier all(kWorld);
  std::atomic<bool> straggler_started{false};
  std::vector<std::vector<float>> out(kWorld);
  std::vector<thc_status_t> st(kWorld);
  std::vector<int> fast_done_first(kWorld, -1);
  std::vector<double> ms(kWorld);
  run(
      agg, 101,
      [&](int r, Worker& w) {
        std::vector<float> y(kCount);
        auto x = input(r, 0);
        ASSERT_EQ(thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef), THC_SUCCESS)
            << thc_last_error();
        all.arrive_and_wait();
        // Call 2: rank 3 is 2 s late.
        if (r == 3) {
          std::this_thread::sleep_for(std::chrono::seconds(2));
          straggler_started = true;
        }
        x = input(r, 1);
        const auto t0 = Clock::now();
        st[r] = thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef);
        ms[r] = ms_since(t0);
        if (r != 3) fast_done_first[r] = straggler_started ? 0 : 1;
        out[r] = y;
        all.arrive_and_wait();
        // Call 3: everybody on time again.
        x = input(r, 2);
        EXPECT_EQ(thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef), THC_SUCCESS)
            << thc_last_error();
      },
      [](thc_config_t& c) {
        c.quorum = 3;
        c.quorum_timeout_ms = 100;
      });
  std::printf("call with a 2 s straggler (quorum 3 of 4): fast ranks %.1f / %.1f / %.1f ms, straggler %.1f ms\n", ms[0],
              ms[1], ms[2], ms[3]);
  std::vector<double> want(kCount, 0.0);
  for (int r = 0; r < 3; ++r) {
    const auto x = input(r, 1);
    for (size_t i = 0; i < kCount; ++i) want[i] += x[i] * 4.0 / 3.0;  // SUM scaled from the 3 counted to all 4
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(st[r], THC_SUCCESS) << "rank " << r;
    EXPECT_EQ(out[r], out[0]) << "rank " << r << " received other bits";
  }
  for (int r = 0; r < 3; ++r) EXPECT_EQ(fast_done_first[r], 1) << "rank " << r << " waited for the straggler";
  EXPECT_LT(nmse(out[0], want), 0.1);
  EXPECT_GE(agg.stat("partial_completions"), 1u);
  EXPECT_GE(agg.stat("late_not_counted"), 1u);
}

TEST(PartialAggregation, AWorkerLeftBehindIsToldAndRejoins) {
  AggregatorProcess agg;
  Barrier all(kWorld);
  std::atomic<bool> fast_ahead{false};
  std::vector<thc_status_t> late(kWorld, THC_SUCCESS), again(kWorld, THC_SUCCESS);
  std::vector<std::vector<float>> out(kWorld);
  run(
      agg, 102,
      [&](int r, Worker& w) {
        std::vector<float> y(kCount);
        auto x = input(r, 0);
        ASSERT_EQ(thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef), THC_SUCCESS)
            << thc_last_error();
        all.arrive_and_wait();
        if (r != 3) {
          // The fast ranks run three calls while rank 3 sleeps: its slots are reused.
          for (int c = 1; c <= 3; ++c) {
            x = input(r, c);
            EXPECT_EQ(thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef), THC_SUCCESS)
                << thc_last_error();
          }
          fast_ahead = true;
        } else {
          while (!fast_ahead) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          x = input(r, 1);
          late[r] = thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef);
          if (late[r] != THC_SUCCESS) std::printf("rank 3: %s\n", thc_last_error());
        }
        all.arrive_and_wait();
        // Everybody calls again: rank 3 rejoins the job at its newest operation.
        x = input(r, 4);
        again[r] = thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef);
        if (again[r] != THC_SUCCESS) std::printf("rank %d again: %s\n", r, thc_last_error());
        out[r] = y;
      },
      [](thc_config_t& c) {
        c.quorum = 3;
        c.quorum_timeout_ms = 50;
        // Few slots: the fast ranks' three calls reuse rank 3's slots (with many, the aggregator
        // would still hold its results and it would just receive them late, in order).
        c.agg_slots = 16;
        c.timeout_ms = 10000;
      });
  EXPECT_EQ(late[3], THC_ERR_LEFT_BEHIND);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(again[r], THC_SUCCESS) << "rank " << r;
    EXPECT_EQ(out[r], out[0]) << "rank " << r << " received other bits";
  }
  EXPECT_GE(agg.stat("left_behind"), 1u);
}

TEST(PartialAggregation, ADeadWorkerIsDroppedWithAQuorum) {
  AggregatorProcess agg;
  Barrier all(kWorld);
  std::vector<thc_status_t> st(kWorld, THC_SUCCESS);
  std::vector<double> ms(kWorld);
  std::vector<std::vector<float>> out(kWorld);
  run(
      agg, 103,
      [&](int r, Worker& w) {
        std::vector<float> y(kCount);
        auto x = input(r, 0);
        ASSERT_EQ(thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef), THC_SUCCESS)
            << thc_last_error();
        all.arrive_and_wait();
        if (r == 3) return;  // dies: never sends again (its communicator stays open, silent)
        for (int c = 1; c <= 3; ++c) {
          x = input(r, c);
          const auto t0 = Clock::now();
          st[r] = thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef);
          if (c == 1) ms[r] = ms_since(t0);
          if (st[r] != THC_SUCCESS) return;
        }
        out[r] = y;
      },
      [](thc_config_t& c) {
        c.quorum = 3;
        c.quorum_timeout_ms = 100;
        c.timeout_ms = 20000;
      });
  std::printf("first call after a worker died (quorum 3 of 4): %.1f / %.1f / %.1f ms\n", ms[0], ms[1], ms[2]);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(st[r], THC_SUCCESS) << "rank " << r;
    EXPECT_EQ(out[r], out[0]) << "rank " << r;
  }
}

TEST(PartialAggregation, WithoutAQuorumADeadWorkerIsATimeoutNotAHang) {
  AggregatorProcess agg;
  Barrier all(kWorld);
  std::vector<thc_status_t> st(kWorld, THC_SUCCESS);
  std::vector<double> ms(kWorld);
  run(
      agg, 104,
      [&](int r, Worker& w) {
        std::vector<float> y(kCount);
        auto x = input(r, 0);
        ASSERT_EQ(thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef), THC_SUCCESS)
            << thc_last_error();
        all.arrive_and_wait();
        if (r == 3) return;
        x = input(r, 1);
        const auto t0 = Clock::now();
        st[r] = thc_allreduce(x.data(), y.data(), kCount, THC_FLOAT32, THC_OP_SUM, w.comm, w.ef);
        ms[r] = ms_since(t0);
      },
      [](thc_config_t& c) { c.timeout_ms = 1500; });
  std::printf("survivors of a dead worker without a quorum (THC_TIMEOUT_MS 1500): %.0f / %.0f / %.0f ms\n", ms[0],
              ms[1], ms[2]);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(st[r], THC_ERR_TIMEOUT) << "rank " << r;
}

}  // namespace
