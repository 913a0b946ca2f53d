// Nonblocking calls, groups (fusion), reduce-scatter and allgather through the C API on in-process
// workers (threads), at odd and even world sizes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/engine/engine.h"
#include "thc/thc.h"
#include "transport/inproc/inproc.h"

namespace {

thc_config_t base_config() {
  thc_config_t c;
  EXPECT_EQ(thc_config_init(&c), THC_SUCCESS);
  c.block = 1024;
  c.chunk_bytes = 4 * 4096;  // 4 blocks per chunk: several chunks in flight
  c.seed = 4242;
  c.timeout_ms = 20000;
  return c;
}

// Runs fn(rank, comm) on n threads with one in-process communicator each; returns each rank's
// status.
std::vector<thc_status_t> run_workers(int n, const thc_config_t& cfg,
                                      const std::function<thc_status_t(int, thc_comm_t)>& fn) {
  thc_inproc_group_t g;
  EXPECT_EQ(thc_inproc_group_create(n, &g), THC_SUCCESS);
  std::vector<thc_status_t> st(n, THC_SUCCESS);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      thc_comm_t comm;
      thc_status_t s = thc_comm_create_inproc(g, r, &cfg, &comm);
      if (s == THC_SUCCESS) {
        s = fn(r, comm);
        thc_comm_destroy(comm);
      }
      st[r] = s;
    });
  }
  for (auto& t : ts) t.join();
  thc_inproc_group_destroy(g);
  return st;
}

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

double nmse(const float* est, const std::vector<double>& ref) {
  double e = 0, r = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e += (est[i] - ref[i]) * (est[i] - ref[i]);
    r += ref[i] * ref[i];
  }
  return r == 0 ? e : e / r;
}

// Bits of a float vector, for exact comparisons that treat NaN like any other value.
std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

const std::vector<size_t> kCounts = {1, 1023, 0, 5000, 3, 20000, 1025};

// The inputs of tensor t on rank r.
std::vector<float> input(int r, size_t t, size_t count) { return gaussian(count, 1000 * r + 17 * static_cast<uint32_t>(t) + 1); }

struct Sizes : public ::testing::TestWithParam<int> {};

// The reference: the same calls, blocking, one by one, in the same order.
std::vector<std::vector<std::vector<float>>> blocking_results(int n, const thc_config_t& cfg, thc_scheme_t scheme,
                                                              bool ef) {
  std::vector<std::vector<std::vector<float>>> out(n, std::vector<std::vector<float>>(kCounts.size()));
  auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
    std::vector<thc_state_t> states(kCounts.size(), nullptr);
    thc_status_t worst = THC_SUCCESS;
    for (int it = 0; it < 2; ++it)  // twice: the second call sees the first one's residuals
      for (size_t t = 0; t < kCounts.size(); ++t) {
        if (ef && !states[t]) thc_state_create(&states[t]);
        auto x = input(r, t + it, kCounts[t]);
        out[r][t].assign(kCounts[t], -7.0f);
        const thc_status_t s = thc_allreduce_scheme(scheme, x.data(), out[r][t].data(), kCounts[t], THC_FLOAT32,
                                                    THC_OP_SUM, comm, states[t]);
        if (s != THC_SUCCESS) worst = s;
      }
    for (thc_state_t s : states) thc_state_destroy(s);
    return worst;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(st[r], THC_SUCCESS);
  return out;
}

// Nonblocking calls return exactly the bits of the same blocking calls, fused or not: each tensor
// keeps its blocks, statistics and randomness, whatever the group it ran in.
TEST_P(Sizes, NonblockingFusedOrNotIsBitIdenticalToBlocking) {
  const int n = GetParam();
  for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
    for (bool ef : {false, true}) {
      thc_config_t cfg = base_config();
      const auto ref = blocking_results(n, cfg, scheme, ef);
      // fusion off; fusion with a long cycle (every call of an iteration in one group); and the
      // defaults (whatever the timing gives)
      for (int mode = 0; mode < 3; ++mode) {
        thc_config_t c = cfg;
        if (mode == 0) c.fusion_bytes = 0;
        if (mode == 1) {
          c.fusion_bytes = 1 << 30;
          c.fusion_cycle_ms = 300;
        }
        std::vector<std::vector<std::vector<float>>> out(n, std::vector<std::vector<float>>(kCounts.size()));
        std::vector<thc_stats_t> stats(n);
        auto st = run_workers(n, c, [&](int r, thc_comm_t comm) {
          std::vector<thc_state_t> states(kCounts.size(), nullptr);
          thc_status_t worst = THC_SUCCESS;
          std::vector<std::vector<float>> xs(kCounts.size());
          for (int it = 0; it < 2; ++it) {
            std::vector<thc_request_t> reqs(kCounts.size());
            for (size_t t = 0; t < kCounts.size(); ++t) {
              if (ef && !states[t]) thc_state_create(&states[t]);
              xs[t] = input(r, t + it, kCounts[t]);
              out[r][t].assign(kCounts[t], -7.0f);
              EXPECT_EQ(thc_iallreduce_scheme(scheme, xs[t].data(), out[r][t].data(), kCounts[t], THC_FLOAT32,
                                              THC_OP_SUM, comm, states[t], &reqs[t]),
                        THC_SUCCESS);
            }
            std::vector<thc_status_t> sts(kCounts.size());
            const thc_status_t s = thc_waitall(reqs.size(), reqs.data(), sts.data());
            if (s != THC_SUCCESS) worst = s;
            for (thc_request_t q : reqs) EXPECT_EQ(q, THC_REQUEST_NULL);
          }
          thc_comm_stats(comm, &stats[r]);
          for (thc_state_t s : states) thc_state_destroy(s);
          return worst;
        });
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(st[r], THC_SUCCESS) << thc_last_error();
          for (size_t t = 0; t < kCounts.size(); ++t)
            EXPECT_EQ(bits(out[r][t]), bits(ref[r][t]))
                << "n=" << n << " scheme " << scheme << " ef " << ef << " mode " << mode << " tensor " << t;
          // 6 non-empty tensors per iteration
          EXPECT_EQ(stats[r].calls, 12u);
          if (mode == 0) {
            EXPECT_EQ(stats[r].groups, 0u);
          }
          if (mode == 1) {
            EXPECT_EQ(stats[r].groups, 2u) << "a 300 ms cycle fuses each iteration's calls";
            EXPECT_EQ(stats[r].grouped_tensors, 12u);
          }
        }
      }
    }
  }
}

// The calls make progress while no rank's caller enters thc: rank 0 starts its call and then
// stays out of thc until every peer's thc_wait has returned, which needs rank 0's part of the
// collective to run on its own.
TEST_P(Sizes, ProgressWithoutTheCallerPolling) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "needs a peer";
  const size_t count = 100000;
  std::atomic<int> peers_done{0};
  std::vector<std::vector<float>> out(n);
  auto st = run_workers(n, base_config(), [&](int r, thc_comm_t comm) {
    auto x = input(r, 0, count);
    out[r].assign(count, 0.0f);
    thc_request_t req;
    thc_status_t s = thc_iallreduce(x.data(), out[r].data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr, &req);
    if (s != THC_SUCCESS) return s;
    if (r == 0) {
      // Outside thc: only the progress thread can take part for this rank.
      // (Without a progress thread the peers' waits would end in THC_ERR_TIMEOUT.)
      while (peers_done.load() < n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return thc_wait(&req);
    }
    s = thc_wait(&req);
    peers_done++;
    return s;
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(st[r], THC_SUCCESS) << "rank " << r;
  for (int r = 1; r < n; ++r) EXPECT_EQ(bits(out[r]), bits(out[0]));
}

// A rank's bad argument fails that call on every rank, with the calls around it unaffected; calls
// started in a different order on some rank are a configuration mismatch on every rank.
TEST_P(Sizes, BadArgumentAndMismatchedOrderFailTheRequestOnEveryRank) {
  const int n = GetParam();
  if (n < 2) GTEST_SKIP() << "needs a peer";
  const size_t count = 3000;
  for (bool fusion : {false, true}) {
    thc_config_t cfg = base_config();
    cfg.fusion_bytes = fusion ? (1 << 30) : 0;
    cfg.fusion_cycle_ms = 50;
    struct Bad {
      const char* what;
      thc_status_t expect;
    };
    for (const Bad& bad : {Bad{"recvbuf", THC_ERR_INVALID_ARG}, Bad{"dtype", THC_ERR_INVALID_ARG},
                           Bad{"op", THC_ERR_INVALID_ARG}, Bad{"state", THC_ERR_INVALID_ARG},
                           Bad{"order", THC_ERR_CONFIG_MISMATCH}}) {
      std::vector<std::vector<thc_status_t>> sts(n, std::vector<thc_status_t>(4, THC_ERR_INTERNAL));
      std::vector<std::vector<std::vector<float>>> out(n, std::vector<std::vector<float>>(4));
      run_workers(n, cfg, [&](int r, thc_comm_t comm) {
        // Cnat adds powers of two exactly: 1 * n, 2 * n, ... tell the calls apart.
        std::vector<std::vector<float>> x(4);
        std::vector<thc_request_t> req(4, THC_REQUEST_NULL);
        thc_state_t ef;
        thc_state_create(&ef);
        for (int i = 0; i < 4; ++i) {
          size_t c = count + (i == 2 ? 1000 : 0);
          x[i].assign(c, static_cast<float>(1 << i));
          out[r][i].assign(c, -7.0f);
        }
        const bool me = r == n - 1;
        for (int i = 0; i < 4; ++i) {
          int k = i;
          if (bad.what == std::string("order") && me && (i == 1 || i == 2)) k = 3 - i;  // 2 before 1
          void* recv = out[r][k].data();
          thc_dtype_t dt = THC_FLOAT32;
          thc_op_t op = THC_OP_SUM;
          thc_state_t st = nullptr;
          if (me && k == 1) {
            if (bad.what == std::string("recvbuf")) recv = nullptr;
            if (bad.what == std::string("dtype")) dt = static_cast<thc_dtype_t>(99);
            if (bad.what == std::string("op")) op = static_cast<thc_op_t>(5);
          }
          if (bad.what == std::string("state") && me && (k == 1 || k == 0)) st = ef;  // in use by call 0
          EXPECT_EQ(thc_iallreduce_scheme(THC_SCHEME_CNAT, x[k].data(), recv, x[k].size(), dt, op, comm, st, &req[k]),
                    THC_SUCCESS);
        }
        for (int i = 0; i < 4; ++i) sts[r][i] = thc_wait(&req[i]);
        thc_state_destroy(ef);
        return THC_SUCCESS;
      });
      for (int r = 0; r < n; ++r) {
        const bool order = bad.what == std::string("order");
        for (int i = 0; i < 4; ++i) {
          const bool failing = order ? (i == 1 || i == 2) : i == 1;
          EXPECT_EQ(sts[r][i], failing ? bad.expect : THC_SUCCESS)
              << bad.what << " fusion " << fusion << " rank " << r << " call " << i;
          if (failing && !(bad.what == std::string("recvbuf") && r == n - 1)) {
            EXPECT_EQ(out[r][i], std::vector<float>(out[r][i].size(), -7.0f)) << "output of a failed call touched";
          }
          if (!failing) {
            EXPECT_EQ(out[r][i], std::vector<float>(out[r][i].size(), static_cast<float>(n << i)))
                << bad.what << " fusion " << fusion << " rank " << r << " call " << i;
          }
        }
      }
    }
  }
}

// NaN in one call of a fused group fails that call alone, on every rank; the others of the group
// return what they would unfused.
TEST_P(Sizes, NonFiniteInAFusedGroupFailsOnlyThatCall) {
  const int n = GetParam();
  thc_config_t cfg = base_config();
  cfg.fusion_bytes = 1 << 30;
  cfg.fusion_cycle_ms = 300;
  const size_t count = 4000;
  std::vector<std::vector<thc_status_t>> sts(n, std::vector<thc_status_t>(3));
  std::vector<std::vector<std::vector<float>>> out(n, std::vector<std::vector<float>>(3));
  std::vector<thc_stats_t> stats(n);
  run_workers(n, cfg, [&](int r, thc_comm_t comm) {
    std::vector<std::vector<float>> x(3);
    std::vector<thc_request_t> req(3);
    for (int i = 0; i < 3; ++i) {
      x[i] = input(r, i, count);
      if (i == 1 && r == n / 2) x[i][77] = std::numeric_limits<float>::quiet_NaN();
      out[r][i].assign(count, -7.0f);
      EXPECT_EQ(thc_iallreduce_scheme(THC_SCHEME_THC, x[i].data(), out[r][i].data(), count, THC_FLOAT32, THC_OP_SUM,
                                      comm, nullptr, &req[i]),
                THC_SUCCESS);
    }
    for (int i = 0; i < 3; ++i) sts[r][i] = thc_wait(&req[i]);
    thc_comm_stats(comm, &stats[r]);
    return THC_SUCCESS;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(sts[r][0], THC_SUCCESS);
    EXPECT_EQ(sts[r][1], THC_ERR_NONFINITE) << "rank " << r;
    EXPECT_EQ(sts[r][2], THC_SUCCESS);
    EXPECT_EQ(out[r][1], std::vector<float>(count, -7.0f));
    for (int i : {0, 2}) {
      std::vector<double> exact(count, 0.0);
      for (int q = 0; q < n; ++q) {
        auto xq = input(q, i, count);
        for (size_t e = 0; e < count; ++e) exact[e] += xq[e];
      }
      EXPECT_LT(nmse(out[r][i].data(), exact), 0.1) << "rank " << r << " call " << i;
      EXPECT_EQ(bits(out[r][i]), bits(out[0][i]));
    }
  }
}

// A blocking call on a communicator with nonblocking calls in flight runs after them; a request
// freed early still completes (its output is written); destroying a communicator with calls in
// flight waits for them.
TEST_P(Sizes, BlockingAfterNonblockingFreeAndDestroyKeepTheOrder) {
  const int n = GetParam();
  const size_t count = 2500;
  std::vector<std::vector<float>> a(n), b(n), c(n), d(n);
  std::vector<thc_status_t> tail(n, THC_ERR_INTERNAL);
  // x2 and x4 belong to calls still in flight when the worker returns: they outlive it.
  std::vector<float> x2(count, 2.0f), x4(count, 8.0f);
  auto st = run_workers(n, base_config(), [&](int r, thc_comm_t comm) {
    std::vector<float> x1(count, 1.0f), x3(count, 4.0f);
    a[r].assign(count, 0);
    b[r].assign(count, 0);
    c[r].assign(count, 0);
    d[r].assign(count, 0);
    thc_request_t r1, r2, r4;
    EXPECT_EQ(cnat_iallreduce(x1.data(), a[r].data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr, &r1), THC_SUCCESS);
    EXPECT_EQ(cnat_iallreduce(x2.data(), b[r].data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr, &r2), THC_SUCCESS);
    EXPECT_EQ(thc_request_free(&r2), THC_SUCCESS);
    EXPECT_EQ(r2, THC_REQUEST_NULL);
    // Blocking, while r1 (and maybe r2) are in flight: after them.
    thc_status_t s = cnat_allreduce(x3.data(), c[r].data(), count, THC_FLOAT32, THC_OP_AVG, comm, nullptr);
    if (s != THC_SUCCESS) return s;
    EXPECT_EQ(thc_wait(&r1), THC_SUCCESS);
    int done = 0;
    EXPECT_EQ(thc_test(&r1, &done), THC_SUCCESS) << "a completed (null) request tests done";
    EXPECT_EQ(done, 1);
    EXPECT_EQ(cnat_iallreduce(x4.data(), d[r].data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr, &r4), THC_SUCCESS);
    // not waited: thc_comm_destroy (in run_workers) waits for it; the request stays valid
    std::thread([&tail, r, r4]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      tail[r] = thc_wait(&r4);
    }).detach();
    return THC_SUCCESS;
  });
  for (int i = 0; i < 200 && [&] {
         for (auto t : tail)
           if (t == THC_ERR_INTERNAL) return true;
         return false;
       }();
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(st[r], THC_SUCCESS);
    EXPECT_EQ(tail[r], THC_SUCCESS);
    EXPECT_EQ(a[r], std::vector<float>(count, 1.0f * n));
    EXPECT_EQ(b[r], std::vector<float>(count, 2.0f * n));
    EXPECT_EQ(c[r], std::vector<float>(count, 4.0f));
    EXPECT_EQ(d[r], std::vector<float>(count, 8.0f * n));
  }
}

// thc_test never blocks and, polled, completes the request; completing THC_REQUEST_NULL works;
// the start call refuses only what leaves no request.
TEST(Requests, TestPollsAndNullHandles) {
  auto st = run_workers(2, base_config(), [&](int r, thc_comm_t comm) {
    std::vector<float> x(50000, 1.0f), y(50000);
    thc_request_t q;
    EXPECT_EQ(thc_iallreduce(x.data(), y.data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm, nullptr, nullptr),
              THC_ERR_INVALID_ARG);
    EXPECT_EQ(thc_iallreduce(x.data(), y.data(), x.size(), THC_FLOAT32, THC_OP_SUM, nullptr, nullptr, &q),
              THC_ERR_INVALID_ARG);
    EXPECT_EQ(thc_iallreduce(x.data(), y.data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm, nullptr, &q), THC_SUCCESS);
    int done = 0;
    thc_status_t s = THC_SUCCESS;
    int polls = 0;
    while (!done) {
      s = thc_test(&q, &done);
      ++polls;
    }
    EXPECT_EQ(q, THC_REQUEST_NULL);
    EXPECT_EQ(thc_wait(&q), THC_SUCCESS);
    thc_request_t none[2] = {THC_REQUEST_NULL, THC_REQUEST_NULL};
    EXPECT_EQ(thc_waitall(2, none, nullptr), THC_SUCCESS);
    (void)r;
    return s;
  });
  EXPECT_EQ(st[0], THC_SUCCESS);
  EXPECT_EQ(st[1], THC_SUCCESS);
}

// Groups: every tensor bit-identical to one call of it, whatever dtype; in place; count 0 members.
TEST_P(Sizes, GroupMatchesSeparateCallsBitForBit) {
  const int n = GetParam();
  const thc_config_t cfg = base_config();
  const thc_dtype_t dts[] = {THC_FLOAT32, THC_FLOAT16, THC_BFLOAT16, THC_FLOAT32, THC_FLOAT32, THC_FLOAT16, THC_FLOAT32};
  auto make = [&](int r, size_t t, int it) {
    auto f = input(r, t + 10 * it, kCounts[t]);
    std::vector<uint16_t> v(kCounts[t] * 2);
    if (dts[t] == THC_FLOAT32) {
      std::vector<uint16_t> w(kCounts[t] * 2);
      if (kCounts[t]) std::memcpy(w.data(), f.data(), kCounts[t] * 4);
      return w;
    }
    for (size_t i = 0; i < kCounts[t]; ++i) {
      uint32_t u;
      std::memcpy(&u, &f[i], 4);
      v[i] = static_cast<uint16_t>(u >> 16);  // bf16 by truncation; as half it is just other bits
      if (dts[t] == THC_FLOAT16) v[i] = static_cast<uint16_t>(0x3C00 | (u & 0x3FF));  // 1.x, finite
    }
    return v;
  };
  for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_DNAT}) {
    std::vector<std::vector<std::vector<uint16_t>>> sep(n, std::vector<std::vector<uint16_t>>(kCounts.size())),
        grp = sep;
    run_workers(n, cfg, [&](int r, thc_comm_t comm) {
      std::vector<thc_state_t> ef(kCounts.size());
      for (auto& e : ef) thc_state_create(&e);
      for (int it = 0; it < 2; ++it)
        for (size_t t = 0; t < kCounts.size(); ++t) {
          sep[r][t] = make(r, t, it);  // in place
          EXPECT_EQ(thc_allreduce_scheme(scheme, THC_IN_PLACE, sep[r][t].data(), kCounts[t], dts[t], THC_OP_AVG, comm,
                                         ef[t]),
                    THC_SUCCESS);
        }
      for (auto& e : ef) thc_state_destroy(e);
      return THC_SUCCESS;
    });
    std::vector<thc_stats_t> stats(n);
    run_workers(n, cfg, [&](int r, thc_comm_t comm) {
      std::vector<thc_state_t> ef(kCounts.size());
      for (auto& e : ef) thc_state_create(&e);
      for (int it = 0; it < 2; ++it) {
        std::vector<thc_tensor_t> ts(kCounts.size());
        for (size_t t = 0; t < kCounts.size(); ++t) {
          grp[r][t] = make(r, t, it);
          ts[t] = thc_tensor_t{nullptr, grp[r][t].data(), kCounts[t], dts[t], ef[t]};
        }
        EXPECT_EQ(thc_allreduce_group(scheme, ts.data(), ts.size(), THC_OP_AVG, comm), THC_SUCCESS)
            << thc_last_error();
      }
      thc_comm_stats(comm, &stats[r]);
      for (auto& e : ef) thc_state_destroy(e);
      return THC_SUCCESS;
    });
    for (int r = 0; r < n; ++r) {
      for (size_t t = 0; t < kCounts.size(); ++t) EXPECT_EQ(grp[r][t], sep[r][t]) << "rank " << r << " tensor " << t;
      EXPECT_EQ(stats[r].groups, 2u);
      EXPECT_EQ(stats[r].calls, 12u);
    }
  }
}

// Reduce-scatter: each rank gets its shard of the sum, bit-identical to that shard in a group of
// the shards; equal, unequal and empty shards; in place; AVG; error feedback bound to the whole.
TEST_P(Sizes, ReduceScatterIsItsShardOfTheGroup) {
  const int n = GetParam();
  const thc_config_t cfg = base_config();
  std::vector<std::vector<size_t>> layouts = {std::vector<size_t>(n, 3000), std::vector<size_t>(n, 1)};
  std::vector<size_t> uneven(n);
  for (int q = 0; q < n; ++q) uneven[q] = q == 1 ? 0 : 700 * q + 5 + (q % 2) * 4096;
  layouts.push_back(uneven);
  for (const auto& counts : layouts) {
    size_t total = 0;
    std::vector<size_t> off(n);
    for (int q = 0; q < n; ++q) {
      off[q] = total;
      total += counts[q];
    }
    for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
      for (int algo : {THC_ALGO_PS, THC_ALGO_INT}) {
        thc_config_t c = cfg;
        c.algo = algo;
        std::vector<std::vector<float>> rs(n), grp(n), rs_inplace(n);
        run_workers(n, c, [&](int r, thc_comm_t comm) {
          thc_state_t ef;
          thc_state_create(&ef);
          for (int it = 0; it < 2; ++it) {
            auto x = input(r, it, total);
            rs[r].assign(counts[r], -7.0f);
            EXPECT_EQ(thc_reduce_scatter(scheme, x.data(), rs[r].data(), counts.data(), THC_FLOAT32, THC_OP_AVG, comm,
                                         ef),
                      THC_SUCCESS)
                << thc_last_error();
          }
          thc_state_destroy(ef);
          return THC_SUCCESS;
        });
        run_workers(n, c, [&](int r, thc_comm_t comm) {
          // the same shards as the tensors of a group, with the residuals of one state each
          std::vector<thc_state_t> ef(n);
          for (auto& e : ef) thc_state_create(&e);
          for (int it = 0; it < 2; ++it) {
            auto x = input(r, it, total);
            grp[r].assign(total, -7.0f);
            std::vector<thc_tensor_t> ts(n);
            for (int q = 0; q < n; ++q)
              ts[q] = thc_tensor_t{x.data() + off[q], grp[r].data() + off[q], counts[q], THC_FLOAT32, ef[q]};
            EXPECT_EQ(thc_allreduce_group(scheme, ts.data(), ts.size(), THC_OP_AVG, comm), THC_SUCCESS);
          }
          for (auto& e : ef) thc_state_destroy(e);
          // in place, without error feedback
          auto x = input(r, 5, total);
          rs_inplace[r] = x;
          EXPECT_EQ(thc_reduce_scatter(scheme, THC_IN_PLACE, rs_inplace[r].data(), counts.data(), THC_FLOAT32,
                                       THC_OP_SUM, comm, nullptr),
                    THC_SUCCESS);
          rs_inplace[r].resize(counts[r]);
          return THC_SUCCESS;
        });
        for (int r = 0; r < n; ++r) {
          std::vector<float> shard(grp[r].begin() + off[r], grp[r].begin() + off[r] + counts[r]);
          EXPECT_EQ(bits(rs[r]), bits(shard)) << "n=" << n << " rank " << r << " algo " << algo;
          std::vector<double> exact(counts[r], 0.0);
          for (int q = 0; q < n; ++q) {
            auto xq = input(q, 5, total);
            for (size_t e = 0; e < counts[r]; ++e) exact[e] += xq[off[r] + e];
          }
          if (counts[r] >= 1000) {
            EXPECT_LT(nmse(rs_inplace[r].data(), exact), scheme == THC_SCHEME_THC ? 0.05 : 0.15) << "rank " << r;
          } else {
            for (float v : rs_inplace[r]) EXPECT_TRUE(std::isfinite(v));  // a few elements: no NMSE bound
          }
        }
      }
    }
  }
}

// Lossy allgather: every rank holds the same bits, each shard within one worker's error bound of
// its owner's input; in place; unequal and empty shards.
TEST_P(Sizes, AllgatherGivesEveryRankTheSameApproximationOfEveryShard) {
  const int n = GetParam();
  std::vector<size_t> counts(n);
  for (int q = 0; q < n; ++q) counts[q] = q == 0 ? 20000 : (q == 2 ? 0 : 1023 * q + 1);
  size_t total = 0;
  std::vector<size_t> off(n);
  for (int q = 0; q < n; ++q) {
    off[q] = total;
    total += counts[q];
  }
  for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
    std::vector<std::vector<float>> out(n), out2(n);
    auto st = run_workers(n, base_config(), [&](int r, thc_comm_t comm) {
      auto x = input(r, 9, counts[r]);
      out[r].assign(total, -7.0f);
      thc_request_t q;
      thc_status_t s = thc_iallgather(scheme, x.data(), out[r].data(), counts.data(), THC_FLOAT32, comm, nullptr, &q);
      if (s == THC_SUCCESS) s = thc_wait(&q);
      if (s != THC_SUCCESS) return s;
      out2[r].assign(total, 0.0f);
      std::copy(x.begin(), x.end(), out2[r].begin() + off[r]);
      return thc_allgather(scheme, THC_IN_PLACE, out2[r].data(), counts.data(), THC_FLOAT32, comm, nullptr);
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(st[r], THC_SUCCESS) << thc_last_error();
      EXPECT_EQ(bits(out[r]), bits(out[0]));
      EXPECT_EQ(bits(out2[r]), bits(out2[0]));
    }
    for (int q = 0; q < n; ++q) {
      if (counts[q] < 1000) continue;
      auto xq = input(q, 9, counts[q]);
      std::vector<double> exact(xq.begin(), xq.end());
      // one worker's error (no averaging over workers): THC b=4 about 0.02-0.05, Cnat about 0.1
      EXPECT_LT(nmse(out[0].data() + off[q], exact), scheme == THC_SCHEME_THC ? 0.08 : 0.2) << "shard " << q;
      EXPECT_GT(nmse(out[0].data() + off[q], exact), 1e-6) << "lossy, as asked";
    }
  }
}

// A backend whose aggregates leave one rank uncounted (as a quorum aggregator may).
class PartialReducer final : public thc::transport::Reducer {
 public:
  PartialReducer(std::unique_ptr<Reducer> inner, int left_out) : inner_(std::move(inner)), left_out_(left_out) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "partial"; }
  void max_u32(uint32_t* d, size_t n) override { inner_->max_u32(d, n); }
  std::unique_ptr<thc::transport::Request> start_sum(void* d, uint64_t count, thc::codec::IntType t) override {
    return wrap(inner_->start_sum(d, count, t));
  }
  std::unique_ptr<thc::transport::Request> start_lookup_sum(const uint8_t* p, uint64_t count,
                                                            const thc::transport::LookupTable& tb, void* sums,
                                                            thc::codec::IntType t,
                                                            const thc::transport::DownstreamCodec* down) override {
    return wrap(inner_->start_lookup_sum(p, count, tb, sums, t, down));
  }
  bool partial_results() const override { return true; }

 private:
  class Req final : public thc::transport::Request {
   public:
    Req(std::unique_ptr<Request> r, int n, bool counted) : r_(std::move(r)), n_(n), counted_(counted) {}
    bool test() override { return r_->test(); }
    void wait() override { r_->wait(); }
    int contributors() const override { return n_ - 1; }
    bool self_counted() const override { return counted_; }

   private:
    std::unique_ptr<Request> r_;
    int n_;
    bool counted_;
  };
  std::unique_ptr<thc::transport::Request> wrap(std::unique_ptr<thc::transport::Request> r) {
    return std::make_unique<Req>(std::move(r), size(), rank() != left_out_);
  }
  std::unique_ptr<Reducer> inner_;
  int left_out_;
};

// Partial aggregates (a rank left out): a group's tensors still equal separate calls bit for bit,
// outputs and error-feedback residuals (the rank left out keeps its whole contribution).
TEST(Requests, GroupUnderPartialAggregationMatchesSeparateCalls) {
  const int n = 3;
  const thc_config_t cfg = base_config();
  for (thc::codec::Scheme scheme : {thc::codec::Scheme::kThc, thc::codec::Scheme::kCnat}) {
    std::vector<std::vector<std::vector<float>>> out(2, std::vector<std::vector<float>>(n * kCounts.size()));
    std::vector<std::vector<std::vector<float>>> res = out;
    for (int grouped = 0; grouped < 2; ++grouped) {
      auto group = thc::transport::make_inproc_group(n, 20000);
      std::vector<std::thread> ts;
      for (int r = 0; r < n; ++r) {
        ts.emplace_back([&, r] {
          thc::engine::Engine e(std::make_unique<PartialReducer>(thc::transport::make_inproc_reducer(group, r), 1), cfg);
          std::vector<thc::engine::ErrorFeedback> ef(kCounts.size());
          std::vector<std::vector<float>> x(kCounts.size());
          std::vector<thc::engine::Tensor> tensors;
          for (size_t t = 0; t < kCounts.size(); ++t) {
            x[t] = input(r, t, kCounts[t]);
            auto& o = out[grouped][r * kCounts.size() + t];
            o.assign(kCounts[t], -7.0f);
            tensors.push_back({x[t].data(), o.data(), kCounts[t], thc::engine::DType::kF32, &ef[t]});
          }
          if (grouped) {
            e.allreduce_group(scheme, tensors.data(), tensors.size(), false);
          } else {
            for (const auto& t : tensors) e.allreduce(scheme, t.send, t.recv, t.count, t.dtype, false, t.ef);
          }
          for (size_t t = 0; t < kCounts.size(); ++t) res[grouped][r * kCounts.size() + t].assign(ef[t].residual.begin(), ef[t].residual.end());
        });
      }
      for (auto& t : ts) t.join();
    }
    for (size_t i = 0; i < out[0].size(); ++i) {
      EXPECT_EQ(bits(out[1][i]), bits(out[0][i])) << "tensor " << i % kCounts.size() << " rank " << i / kCounts.size();
      EXPECT_EQ(bits(res[1][i]), bits(res[0][i])) << "residual of tensor " << i % kCounts.size();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(World, Sizes, ::testing::Values(1, 2, 3, 5));

}  // namespace
