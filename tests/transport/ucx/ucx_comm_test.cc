// thc_comm_create_ucx: communicators whose reductions run over UCX between the ranks, bootstrapped
// from a TCP rendezvous (transport/ucx/ucx_reducer.h). Ranks are threads of this process, each
// with its own UCX workers and endpoints, UCX used for real (its shared-memory and TCP
// transports here). Results are compared bit for bit with the same calls over the in-process
// backend: both run transport/schedules, so the sums and therefore the decodes are identical.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/engine/plan_rules.h"
#include "thc/thc.h"

namespace {

// A TCP port on 127.0.0.1 free a moment ago.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string rendezvous() { return "127.0.0.1:" + std::to_string(free_port()); }

thc_config_t config(int algo, long timeout_ms = 30000) {
  thc_config_t c;
  EXPECT_EQ(thc_config_init(&c), THC_SUCCESS);
  c.block = 1024;
  c.chunk_bytes = 64 * 1024;  // several chunks per call: the pipeline's operations overlap
  c.seed = 4242;
  c.algo = algo;
  c.timeout_ms = timeout_ms;
  return c;
}

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Runs body(rank, comm) on n threads; comm from make(rank) (null if creation failed: then
// body is not called and the status is recorded).
struct RankResult {
  thc_status_t create = THC_ERR_INTERNAL;
  std::string error;
};
std::vector<RankResult> run(int n, const std::function<thc_status_t(int, thc_comm_t*)>& make,
                            const std::function<void(int, thc_comm_t)>& body) {
  std::vector<RankResult> res(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      thc_comm_t comm = nullptr;
      res[static_cast<size_t>(r)].create = make(r, &comm);
      if (res[static_cast<size_t>(r)].create != THC_SUCCESS) {
        res[static_cast<size_t>(r)].error = thc_last_error();
        return;
      }
      body(r, comm);
      EXPECT_EQ(thc_comm_destroy(comm), THC_SUCCESS);
    });
  }
  for (auto& t : ts) t.join();
  return res;
}

// Each rank's results of the same calls: several sizes, both schemes, error feedback.
std::vector<std::vector<float>> calls(int r, thc_comm_t comm) {
  std::vector<std::vector<float>> out;
  thc_state_t ef;
  EXPECT_EQ(thc_state_create(&ef), THC_SUCCESS);
  for (const size_t count : {size_t{1}, size_t{1000}, size_t{70000}, size_t{300000}}) {
    for (int k = 0; k < 2; ++k) {
      const auto x = gaussian(count, static_cast<uint32_t>(100 * r + k + count));
      std::vector<float> y(count, -1.0f);
      EXPECT_EQ(thc_allreduce(x.data(), y.data(), count, THC_FLOAT32, THC_OP_SUM, comm, count == 70000 ? ef : nullptr),
                THC_SUCCESS)
          << thc_last_error();
      out.push_back(y);
      EXPECT_EQ(cnat_allreduce(x.data(), y.data(), count, THC_FLOAT32, THC_OP_AVG, comm, nullptr), THC_SUCCESS)
          << thc_last_error();
      out.push_back(y);
    }
  }
  thc_state_destroy(ef);
  return out;
}

TEST(UcxComm, SameBitsAsTheInprocBackend) {
  for (const int algo : {THC_ALGO_PS, THC_ALGO_INT}) {
    for (const int n : {2, 3}) {
      const thc_config_t cfg = config(algo);
      std::vector<std::vector<std::vector<float>>> ucx(static_cast<size_t>(n)), inproc(static_cast<size_t>(n));
      const std::string rv = rendezvous();
      auto res = run(n, [&](int r, thc_comm_t* c) { return thc_comm_create_ucx(rv.c_str(), r, n, &cfg, c); },
                     [&](int r, thc_comm_t c) {
                       int rank = -1, size = -1;
                       EXPECT_EQ(thc_comm_rank(c, &rank), THC_SUCCESS);
                       EXPECT_EQ(thc_comm_size(c, &size), THC_SUCCESS);
                       EXPECT_EQ(rank, r);
                       EXPECT_EQ(size, n);
                       ucx[static_cast<size_t>(r)] = calls(r, c);
                     });
      for (int r = 0; r < n; ++r) ASSERT_EQ(res[static_cast<size_t>(r)].create, THC_SUCCESS) << res[static_cast<size_t>(r)].error;
      thc_inproc_group_t g;
      ASSERT_EQ(thc_inproc_group_create(n, &g), THC_SUCCESS);
      res = run(n, [&](int r, thc_comm_t* c) { return thc_comm_create_inproc(g, r, &cfg, c); },
                [&](int r, thc_comm_t c) { inproc[static_cast<size_t>(r)] = calls(r, c); });
      thc_inproc_group_destroy(g);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(ucx[static_cast<size_t>(r)].size(), inproc[static_cast<size_t>(r)].size());
        for (size_t k = 0; k < ucx[static_cast<size_t>(r)].size(); ++k) {
          const auto& a = ucx[static_cast<size_t>(r)][k];
          const auto& b = inproc[static_cast<size_t>(r)][k];
          ASSERT_EQ(a.size(), b.size());
          EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
              << "algo " << algo << " n " << n << " rank " << r << " call " << k;
          // and every rank has the same result
          const auto& z = ucx[0][k];
          EXPECT_EQ(std::memcmp(a.data(), z.data(), a.size() * 4), 0) << "rank " << r << " call " << k;
        }
      }
    }
  }
}

TEST(UcxComm, OneRankNeedsNoPeers) {
  const thc_config_t cfg = config(THC_ALGO_AUTO);
  thc_comm_t c;
  ASSERT_EQ(thc_comm_create_ucx(rendezvous().c_str(), 0, 1, &cfg, &c), THC_SUCCESS) << thc_last_error();
  std::vector<float> x = gaussian(5000, 1), y(5000);
  EXPECT_EQ(thc_allreduce(x.data(), y.data(), x.size(), THC_FLOAT32, THC_OP_SUM, c, nullptr), THC_SUCCESS);
  EXPECT_EQ(thc_comm_destroy(c), THC_SUCCESS);
}

TEST(UcxComm, BadArgumentsAreRefused) {
  const thc_config_t cfg = config(THC_ALGO_AUTO);
  thc_comm_t c = nullptr;
  for (const char* rv : {"", "nohostport", "127.0.0.1:0", "127.0.0.1:70000", "udp://127.0.0.1:5000", "[::1:5"}) {
    EXPECT_EQ(thc_comm_create_ucx(rv, 0, 2, &cfg, &c), THC_ERR_INVALID_ARG) << rv;
    EXPECT_NE(std::string(thc_last_error()).find("rendezvous"), std::string::npos) << thc_last_error();
  }
  EXPECT_EQ(thc_comm_create_ucx(nullptr, 0, 2, &cfg, &c), THC_ERR_INVALID_ARG);
  EXPECT_EQ(thc_comm_create_ucx("127.0.0.1:5000", 2, 2, &cfg, &c), THC_ERR_INVALID_ARG);
  EXPECT_EQ(thc_comm_create_ucx("127.0.0.1:5000", -1, 2, &cfg, &c), THC_ERR_INVALID_ARG);
  EXPECT_EQ(thc_comm_create_ucx("127.0.0.1:5000", 0, 0, &cfg, &c), THC_ERR_INVALID_ARG);
  EXPECT_EQ(thc_comm_create_ucx("127.0.0.1:5000", 0, 1, &cfg, nullptr), THC_ERR_INVALID_ARG);
}

// Ranks that disagree on the group size, or two processes that claim one rank: every rank fails
// creation with a message saying what, none waits for its timeout.
TEST(UcxComm, SizeMismatchAndDuplicateRankAreNamed) {
  const thc_config_t cfg = config(THC_ALGO_AUTO, 20000);
  {
    const std::string rv = rendezvous();
    auto res = run(2, [&](int r, thc_comm_t* c) { return thc_comm_create_ucx(rv.c_str(), r, r == 0 ? 2 : 3, &cfg, c); },
                   [](int, thc_comm_t) { ADD_FAILURE() << "created"; });
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(res[static_cast<size_t>(r)].create, THC_ERR_CONFIG_MISMATCH) << res[static_cast<size_t>(r)].error;
      EXPECT_NE(res[static_cast<size_t>(r)].error.find("group"), std::string::npos) << res[static_cast<size_t>(r)].error;
    }
  }
  {
    const std::string rv = rendezvous();
    auto res = run(3, [&](int r, thc_comm_t* c) { return thc_comm_create_ucx(rv.c_str(), r == 2 ? 1 : r, 3, &cfg, c); },
                   [](int, thc_comm_t) { ADD_FAILURE() << "created"; });
    int dup = 0;
    for (int r = 0; r < 3; ++r) {
      EXPECT_NE(res[static_cast<size_t>(r)].create, THC_SUCCESS);
      if (res[static_cast<size_t>(r)].error.find("rank 1") != std::string::npos ||
          res[static_cast<size_t>(r)].error.find("already took its rank") != std::string::npos)
        ++dup;
    }
    EXPECT_GE(dup, 2) << res[0].error << " / " << res[1].error << " / " << res[2].error;
    EXPECT_EQ(res[0].create, THC_ERR_CONFIG_MISMATCH) << res[0].error;
  }
}

// A rank that never comes: the others fail within the timeout, naming it.
TEST(UcxComm, AMissingRankIsNamedAtTheTimeout) {
  const thc_config_t cfg = config(THC_ALGO_AUTO, 1500);
  const std::string rv = rendezvous();
  auto res = run(2, [&](int r, thc_comm_t* c) { return thc_comm_create_ucx(rv.c_str(), r, 3, &cfg, c); },
                 [](int, thc_comm_t) { ADD_FAILURE() << "created"; });
  EXPECT_EQ(res[0].create, THC_ERR_TIMEOUT) << res[0].error;
  EXPECT_NE(res[0].error.find("rank(s) 2"), std::string::npos) << res[0].error;
  EXPECT_EQ(res[1].create, THC_ERR_TIMEOUT) << res[1].error;
}

// Something else on the rendezvous port during setup (a port scanner, garbage, a connection that
// closes at once) is dropped; the group still forms.
TEST(UcxComm, StrangersAtTheRendezvousAreIgnored) {
  const thc_config_t cfg = config(THC_ALGO_PS, 20000);
  const int port = free_port();
  const std::string rv = "127.0.0.1:" + std::to_string(port);
  std::atomic<bool> stop{false};
  std::thread stranger([&] {
    while (!stop) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
        const char junk[64] = "GET / HTTP/1.0\r\n\r\n and more bytes than a hello has.........";
        (void)::send(fd, junk, sizeof junk, MSG_NOSIGNAL);
      }
      ::close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::vector<std::vector<float>> out(3);
  auto res = run(3, [&](int r, thc_comm_t* c) {
        std::this_thread::sleep_for(std::chrono::milliseconds(30 * r));
        return thc_comm_create_ucx(rv.c_str(), r, 3, &cfg, c);
      },
      [&](int r, thc_comm_t c) {
        const auto x = gaussian(4096, static_cast<uint32_t>(r));
        out[static_cast<size_t>(r)].resize(4096);
        EXPECT_EQ(thc_allreduce(x.data(), out[static_cast<size_t>(r)].data(), 4096, THC_FLOAT32, THC_OP_SUM, c, nullptr),
                  THC_SUCCESS)
            << thc_last_error();
      });
  stop = true;
  stranger.join();
  for (int r = 0; r < 3; ++r) ASSERT_EQ(res[static_cast<size_t>(r)].create, THC_SUCCESS) << res[static_cast<size_t>(r)].error;
  EXPECT_EQ(out[0], out[1]);
  EXPECT_EQ(out[0], out[2]);
}

// THC_HIER over UCX, hosts emulated (THC_HIER_HOSTS=2,2: ranks 0-1 and 2-3): every rank's result
// is, slice by slice, the compressed allreduce across the two hosts of the hosts' float sums
// (local rank l of each host compresses slice l, blocks [nb l / 2, nb (l + 1) / 2), with THC_SEED
// mixed with l for l > 0), bit for bit what two in-process ranks give on those sums.
TEST(UcxHier, EachSliceIsTheHostSumsCompressedAcrossHosts) {
  const size_t count = 5 * 1024 + 37;  // 6 blocks of 1024: slices of 3 blocks, the last partial
  std::vector<std::vector<float>> x(4);
  for (int r = 0; r < 4; ++r) x[static_cast<size_t>(r)] = gaussian(count, static_cast<uint32_t>(70 + r));
  for (const int algo : {THC_ALGO_PS, THC_ALGO_INT}) {
    for (const bool nat : {false, true}) {
      thc_config_t cfg = config(algo);
      cfg.hier = 1;
      std::snprintf(cfg.hier_hosts, sizeof cfg.hier_hosts, "2,2");
      std::vector<std::vector<float>> y(4, std::vector<float>(count, -1.0f));
      std::vector<int> hosts(4, -1);
      const std::string rv = rendezvous();
      auto res = run(4, [&](int r, thc_comm_t* c) { return thc_comm_create_ucx(rv.c_str(), r, 4, &cfg, c); },
                     [&](int r, thc_comm_t c) {
                       const size_t i = static_cast<size_t>(r);
                       EXPECT_EQ(nat ? cnat_allreduce(x[i].data(), y[i].data(), count, THC_FLOAT32, THC_OP_SUM, c, nullptr)
                                     : thc_allreduce(x[i].data(), y[i].data(), count, THC_FLOAT32, THC_OP_SUM, c, nullptr),
                                 THC_SUCCESS)
                           << thc_last_error();
                       thc_stats_t st;
                       EXPECT_EQ(thc_comm_stats(c, &st), THC_SUCCESS);
                       hosts[i] = st.hier_hosts;
                     });
      for (int r = 0; r < 4; ++r) {
        ASSERT_EQ(res[static_cast<size_t>(r)].create, THC_SUCCESS) << res[static_cast<size_t>(r)].error;
        EXPECT_EQ(hosts[static_cast<size_t>(r)], 2) << "rank " << r << ": not hierarchical";
      }
      // The reference: the hosts' sums, each slice through two in-process ranks.
      std::vector<std::vector<float>> h(2, std::vector<float>(count));
      for (size_t k = 0; k < count; ++k) {
        h[0][k] = x[0][k] + x[1][k];
        h[1][k] = x[2][k] + x[3][k];
      }
      const uint64_t nb = (count + 1023) / 1024;
      for (uint64_t l = 0; l < 2; ++l) {
        const size_t f = static_cast<size_t>(std::min<uint64_t>(count, nb * l / 2 * 1024));
        const size_t e = static_cast<size_t>(std::min<uint64_t>(count, nb * (l + 1) / 2 * 1024));
        thc_config_t rc = config(algo);
        if (l > 0) rc.seed = thc::engine::digest_mix(rc.seed, l) | 1;
        std::vector<std::vector<float>> ref(2, std::vector<float>(e - f));
        thc_inproc_group_t g;
        ASSERT_EQ(thc_inproc_group_create(2, &g), THC_SUCCESS);
        run(2, [&](int r, thc_comm_t* c) { return thc_comm_create_inproc(g, r, &rc, c); },
            [&](int r, thc_comm_t c) {
              const size_t i = static_cast<size_t>(r);
              EXPECT_EQ(nat ? cnat_allreduce(h[i].data() + f, ref[i].data(), e - f, THC_FLOAT32, THC_OP_SUM, c, nullptr)
                            : thc_allreduce(h[i].data() + f, ref[i].data(), e - f, THC_FLOAT32, THC_OP_SUM, c, nullptr),
                        THC_SUCCESS)
                  << thc_last_error();
            });
        thc_inproc_group_destroy(g);
        for (int r = 0; r < 4; ++r)
          EXPECT_EQ(std::memcmp(y[static_cast<size_t>(r)].data() + f, ref[0].data(), (e - f) * 4), 0)
              << "algo " << algo << (nat ? " cnat" : " thc") << " slice " << l << " rank " << r;
      }
    }
  }
}

// The other calls on a hierarchical UCX communicator (the same code as on MPI, tested there in
// depth): a group, nonblocking allreduces, error feedback over calls, a reduce-scatter and an
// allgather; every rank agrees and the sums are close to the exact ones.
TEST(UcxHier, GroupsNonblockingErrorFeedbackReduceScatterAllgather) {
  thc_config_t cfg = config(THC_ALGO_AUTO);
  cfg.hier = 1;
  std::snprintf(cfg.hier_hosts, sizeof cfg.hier_hosts, "2,2");
  const size_t n1 = 3000, n2 = 9000, shard = 2500;
  std::vector<std::vector<float>> a(4), b(4), ga(4), gb(4), nb(4), ef(4), rs(4), ag(4);
  std::vector<std::vector<float>> in1(4), in2(4);
  for (int r = 0; r < 4; ++r) {
    in1[static_cast<size_t>(r)] = gaussian(n1, static_cast<uint32_t>(300 + r));
    in2[static_cast<size_t>(r)] = gaussian(n2, static_cast<uint32_t>(400 + r));
  }
  const std::string rv = rendezvous();
  auto res = run(4, [&](int r, thc_comm_t* c) { return thc_comm_create_ucx(rv.c_str(), r, 4, &cfg, c); },
                 [&](int r, thc_comm_t c) {
                   const size_t i = static_cast<size_t>(r);
                   ga[i].resize(n1);
                   gb[i].resize(n2);
                   thc_tensor_t ts[2] = {{in1[i].data(), ga[i].data(), n1, THC_FLOAT32, nullptr},
                                         {in2[i].data(), gb[i].data(), n2, THC_FLOAT32, nullptr}};
                   EXPECT_EQ(thc_allreduce_group(THC_SCHEME_THC, ts, 2, THC_OP_SUM, c), THC_SUCCESS) << thc_last_error();
                   nb[i].resize(n2);
                   thc_request_t q1, q2;
                   a[i].resize(n1);
                   EXPECT_EQ(thc_iallreduce(in1[i].data(), a[i].data(), n1, THC_FLOAT32, THC_OP_SUM, c, nullptr, &q1),
                             THC_SUCCESS);
                   EXPECT_EQ(thc_iallreduce(in2[i].data(), nb[i].data(), n2, THC_FLOAT32, THC_OP_SUM, c, nullptr, &q2),
                             THC_SUCCESS);
                   EXPECT_EQ(thc_wait(&q1), THC_SUCCESS) << thc_last_error();
                   EXPECT_EQ(thc_wait(&q2), THC_SUCCESS) << thc_last_error();
                   thc_state_t st;
                   EXPECT_EQ(thc_state_create(&st), THC_SUCCESS);
                   ef[i].resize(n2);
                   for (int k = 0; k < 3; ++k)
                     EXPECT_EQ(thc_allreduce(in2[i].data(), ef[i].data(), n2, THC_FLOAT32, THC_OP_AVG, c, st), THC_SUCCESS)
                         << thc_last_error();
                   thc_state_destroy(st);
                   const size_t counts[4] = {shard, shard, shard, shard};
                   std::vector<float> big = gaussian(4 * shard, static_cast<uint32_t>(500 + r));
                   rs[i].resize(shard);
                   EXPECT_EQ(thc_reduce_scatter(THC_SCHEME_THC, big.data(), rs[i].data(), counts, THC_FLOAT32, THC_OP_SUM, c,
                                                nullptr),
                             THC_SUCCESS)
                       << thc_last_error();
                   ag[i].resize(4 * shard);
                   EXPECT_EQ(thc_allgather(THC_SCHEME_THC, big.data() + i * shard, ag[i].data(), counts, THC_FLOAT32, c, nullptr),
                             THC_SUCCESS)
                       << thc_last_error();
                 });
  for (int r = 0; r < 4; ++r) ASSERT_EQ(res[static_cast<size_t>(r)].create, THC_SUCCESS) << res[static_cast<size_t>(r)].error;
  auto nmse = [](const std::vector<float>& got, const std::vector<float>& want) {
    double e = 0, w = 0;
    for (size_t k = 0; k < want.size(); ++k) e += (got[k] - want[k]) * (got[k] - want[k]), w += want[k] * want[k];
    return e / w;
  };
  std::vector<float> s1(n1, 0.0f), s2(n2, 0.0f);
  for (int r = 0; r < 4; ++r) {
    for (size_t k = 0; k < n1; ++k) s1[k] += in1[static_cast<size_t>(r)][k];
    for (size_t k = 0; k < n2; ++k) s2[k] += in2[static_cast<size_t>(r)][k];
  }
  std::vector<float> avg2(s2);
  for (float& v : avg2) v /= 4.0f;
  for (int r = 0; r < 4; ++r) {
    const size_t i = static_cast<size_t>(r);
    EXPECT_EQ(ga[i], ga[0]);
    EXPECT_EQ(gb[i], gb[0]);
    EXPECT_EQ(a[i], a[0]);
    EXPECT_EQ(nb[i], nb[0]);
    EXPECT_EQ(ef[i], ef[0]);
    EXPECT_EQ(ag[i], ag[0]);
  }
  EXPECT_LT(nmse(ga[0], s1), 0.05);
  EXPECT_LT(nmse(gb[0], s2), 0.05);
  EXPECT_LT(nmse(a[0], s1), 0.05);
  EXPECT_LT(nmse(nb[0], s2), 0.05);
  EXPECT_LT(nmse(ef[0], avg2), 0.05);
  std::vector<float> bigsum(4 * shard, 0.0f), all(4 * shard);
  for (int r = 0; r < 4; ++r) {
    const auto big = gaussian(4 * shard, static_cast<uint32_t>(500 + r));
    for (size_t k = 0; k < 4 * shard; ++k) bigsum[k] += big[k];
    std::copy(big.begin() + r * shard, big.begin() + (r + 1) * shard, all.begin() + r * shard);
  }
  for (int r = 0; r < 4; ++r) {
    const std::vector<float> want(bigsum.begin() + r * shard, bigsum.begin() + (r + 1) * shard);
    EXPECT_LT(nmse(rs[static_cast<size_t>(r)], want), 0.05) << "rank " << r;
  }
  EXPECT_LT(nmse(ag[0], all), 0.05);
}

// NaN on one rank fails the hierarchical call on every rank, naming that rank; the communicator
// goes on (nothing was exchanged but the first MAX).
TEST(UcxHier, NonFiniteInputFailsEveryRankAndTheNextCallWorks) {
  const size_t count = 4096;
  thc_config_t cfg = config(THC_ALGO_PS);
  cfg.hier = 1;
  std::snprintf(cfg.hier_hosts, sizeof cfg.hier_hosts, "2,2");
  std::vector<thc_status_t> first(4), second(4);
  std::vector<std::string> why(4);
  const std::string rv = rendezvous();
  auto res = run(4, [&](int r, thc_comm_t* c) { return thc_comm_create_ucx(rv.c_str(), r, 4, &cfg, c); },
                 [&](int r, thc_comm_t c) {
                   const size_t i = static_cast<size_t>(r);
                   auto x = gaussian(count, static_cast<uint32_t>(r));
                   std::vector<float> y(count);
                   if (r == 2) x[77] = std::numeric_limits<float>::quiet_NaN();
                   first[i] = thc_allreduce(x.data(), y.data(), count, THC_FLOAT32, THC_OP_SUM, c, nullptr);
                   why[i] = thc_last_error();
                   x[77] = 0.0f;
                   second[i] = thc_allreduce(x.data(), y.data(), count, THC_FLOAT32, THC_OP_SUM, c, nullptr);
                 });
  for (int r = 0; r < 4; ++r) {
    const size_t i = static_cast<size_t>(r);
    ASSERT_EQ(res[i].create, THC_SUCCESS) << res[i].error;
    EXPECT_EQ(first[i], THC_ERR_NONFINITE) << why[i];
    EXPECT_NE(why[i].find("rank 2"), std::string::npos) << why[i];
    EXPECT_EQ(second[i], THC_SUCCESS) << "rank " << r;
  }
}

}  // namespace
