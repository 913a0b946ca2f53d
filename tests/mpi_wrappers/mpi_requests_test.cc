// THC_Iallreduce (MPI generalized requests), thc_iallreduce on MPI communicators, THC_Reduce_scatter
// and THC_Allgather_x under mpirun; run with and without MPI_THREAD_MULTIPLE
// (THC_TEST_THREAD_MULTIPLE, mpi_main.cc): with it calls progress on thc's thread, without it they
// complete inside the start call.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "collectives/engine/dtype.h"
#include "mpi_wrappers/thc_mpi_internal.h"
#include "tests/mpi_wrappers/mpi_test_util.h"
#include "thc/thc_mpi.h"

namespace {

using thc::test::exact_sum;
using thc::test::gaussian;
using thc::test::nmse;
using thc::test::rank;
using thc::test::world;

bool threaded() {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

thc_config_t config(uint64_t seed = 99) {
  thc_config_t c;
  EXPECT_EQ(thc_config_init(&c), THC_SUCCESS);
  c.seed = seed;
  c.block = 4096;
  c.chunk_bytes = 4 * 4096 * 2;
  c.timeout_ms = 60000;
  return c;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

const std::vector<int> kCounts = {5000, 1, 0, 777, 20000, 4097};

// MPI_Iallreduce-shaped calls return exactly what the same blocking calls return, completed by
// MPI_Waitall, MPI_Wait and MPI_Test alike.
TEST(MpiRequests, ThcIallreduceEqualsThcAllreduceBitForBit) {
  setenv("THC_SEED", "4711", 1);
  MPI_Comm a, b;
  MPI_Comm_dup(MPI_COMM_WORLD, &a);
  MPI_Comm_dup(MPI_COMM_WORLD, &b);
  std::vector<std::vector<float>> x(kCounts.size()), blocking(kCounts.size()), nb(kCounts.size());
  for (size_t t = 0; t < kCounts.size(); ++t) x[t] = gaussian(kCounts[t], 31 * rank() + t);
  for (int it = 0; it < 2; ++it) {
    for (size_t t = 0; t < kCounts.size(); ++t) {
      blocking[t].assign(kCounts[t], -1.0f);
      ASSERT_EQ(THC_Allreduce(x[t].data(), blocking[t].data(), kCounts[t], MPI_FLOAT, MPI_SUM, a), MPI_SUCCESS)
          << thc_last_error();
    }
    std::vector<MPI_Request> reqs(kCounts.size(), MPI_REQUEST_NULL);
    for (size_t t = 0; t < kCounts.size(); ++t) {
      nb[t].assign(kCounts[t], -1.0f);
      ASSERT_EQ(THC_Iallreduce(x[t].data(), nb[t].data(), kCounts[t], MPI_FLOAT, MPI_SUM, b, &reqs[t]), MPI_SUCCESS);
    }
    if (it == 0) {
      std::vector<MPI_Status> sts(reqs.size());
      ASSERT_EQ(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), sts.data()), MPI_SUCCESS);
    } else {
      // MPI_Test until done on the first, MPI_Wait on the others
      int flag = 0;
      while (!flag) ASSERT_EQ(MPI_Test(&reqs[0], &flag, MPI_STATUS_IGNORE), MPI_SUCCESS);
      for (size_t t = 1; t < reqs.size(); ++t) ASSERT_EQ(MPI_Wait(&reqs[t], MPI_STATUS_IGNORE), MPI_SUCCESS);
    }
    for (MPI_Request r : reqs) EXPECT_EQ(r, MPI_REQUEST_NULL);
    for (size_t t = 0; t < kCounts.size(); ++t) EXPECT_EQ(bits(nb[t]), bits(blocking[t])) << "call " << t << " it " << it;
  }
  // Uncompressed types go to PMPI_Iallreduce: an ordinary request, exact.
  std::vector<int> ia(1000, rank() + 1), ib(1000, 0);
  MPI_Request r;
  ASSERT_EQ(THC_Iallreduce(ia.data(), ib.data(), 1000, MPI_INT, MPI_SUM, b, &r), MPI_SUCCESS);
  ASSERT_EQ(MPI_Wait(&r, MPI_STATUS_IGNORE), MPI_SUCCESS);
  EXPECT_EQ(ib, std::vector<int>(1000, world() * (world() + 1) / 2));
  EXPECT_EQ(THC_Iallreduce(ia.data(), ib.data(), 1000, MPI_INT, THC_MPI_AVG(), b, &r), MPI_ERR_OP);
  MPI_Comm_free(&a);
  MPI_Comm_free(&b);
  unsetenv("THC_SEED");
}

// A rank's bad argument fails that request on every rank (reported by MPI_Wait), the calls
// around it are unaffected; calls started in different orders fail as a mismatch everywhere.
TEST(MpiRequests, FailuresAreTheRequestsOnEveryRank) {
  if (world() < 2) GTEST_SKIP() << "needs a peer";
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  // Open MPI reports a generalized request's failure through MPI_COMM_WORLD's handler.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  thc_comm_t tc;
  thc_config_t cfg = config();
  ASSERT_EQ(thc_comm_create_mpi(c, &cfg, &tc), THC_SUCCESS) << thc_last_error();
  const bool me = rank() == world() - 1;
  for (int order : {0, 1}) {
    std::vector<std::vector<float>> x(3), y(3);
    std::vector<thc_request_t> q(3);
    for (int i = 0; i < 3; ++i) {
      x[i].assign(3000 + 1000 * i, static_cast<float>(1 << i));
      y[i].assign(x[i].size(), -7.0f);
    }
    for (int i = 0; i < 3; ++i) {
      int k = i;
      if (order && me && i > 0) k = 3 - i;  // 0, 2, 1 on the last rank
      void* recv = (!order && me && k == 1) ? nullptr : y[k].data();
      ASSERT_EQ(cnat_iallreduce(x[k].data(), recv, x[k].size(), THC_FLOAT32, THC_OP_SUM, tc, nullptr, &q[k]),
                THC_SUCCESS);
    }
    std::vector<thc_status_t> st(3);
    thc_waitall(3, q.data(), st.data());
    for (int i = 0; i < 3; ++i) {
      const bool failing = order ? i > 0 : i == 1;
      EXPECT_EQ(st[i], failing ? (order ? THC_ERR_CONFIG_MISMATCH : THC_ERR_INVALID_ARG) : THC_SUCCESS)
          << "order " << order << " call " << i;
      if (!failing) {
        EXPECT_EQ(y[i], std::vector<float>(y[i].size(), static_cast<float>(world() << i)));
      }
    }
  }
  thc_comm_destroy(tc);
  // The same through THC_Iallreduce: MPI_Wait returns the failure.
  std::vector<float> x(5000, 1.0f), y(5000);
  MPI_Request r;
  ASSERT_EQ(THC_Iallreduce(x.data(), me ? nullptr : y.data(), 5000, MPI_FLOAT, MPI_SUM, c, &r), MPI_SUCCESS);
  MPI_Status s;
  EXPECT_NE(MPI_Wait(&r, &s), MPI_SUCCESS);
  EXPECT_EQ(r, MPI_REQUEST_NULL);
  ASSERT_EQ(THC_Iallreduce(x.data(), y.data(), 5000, MPI_FLOAT, MPI_SUM, c, &r), MPI_SUCCESS);
  EXPECT_EQ(MPI_Wait(&r, &s), MPI_SUCCESS);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  MPI_Comm_free(&c);
}

// With MPI_THREAD_MULTIPLE a rank's call progresses while that rank makes no MPI or thc call at
// all: rank 0 starts it, then waits (outside MPI) for a file the other ranks write once their
// MPI_Wait returned, which needs rank 0's part to have run.
TEST(MpiRequests, ProgressWithoutTheCallerEnteringMpi) {
  if (world() < 2 || !threaded()) GTEST_SKIP() << "needs a peer and MPI_THREAD_MULTIPLE";
  // A fresh directory of rank 0's (a file left by an earlier, killed run must not stand in for the
  // peers' signal).
  char dir[256] = "/tmp/thc-progress-XXXXXX";
  if (rank() == 0 && mkdtemp(dir) == nullptr) {
    ADD_FAILURE() << "mkdtemp " << dir << ": " << std::strerror(errno);
    dir[0] = '\0';
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (dir[0] == '\0') return;  // every rank leaves together
  char path[300];
  std::snprintf(path, sizeof path, "%s/done", dir);
  MPI_Comm peers;
  MPI_Comm_split(MPI_COMM_WORLD, rank() == 0 ? 0 : 1, rank(), &peers);
  const int count = 200000;
  std::vector<float> x = gaussian(count, 5 + rank()), y(count);
  MPI_Request r;
  ASSERT_EQ(THC_Iallreduce(x.data(), y.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r), MPI_SUCCESS);
  if (rank() == 0) {
    bool seen = false;
    for (int i = 0; i < 60000 && !seen; ++i) {
      seen = access(path, F_OK) == 0;
      if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(seen) << "the peers' MPI_Wait did not return while rank 0 stayed out of MPI";
    EXPECT_EQ(MPI_Wait(&r, MPI_STATUS_IGNORE), MPI_SUCCESS);
    unlink(path);
    rmdir(dir);
  } else {
    EXPECT_EQ(MPI_Wait(&r, MPI_STATUS_IGNORE), MPI_SUCCESS);
    MPI_Barrier(peers);
    if (rank() == 1) {
      FILE* f = std::fopen(path, "w");
      if (f) std::fclose(f);
    }
  }
  MPI_Comm_free(&peers);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(thc::test::same_on_every_rank(y));
}

// Compressed reduce-scatter with MPI's signatures: equal (block) and unequal shards, in place,
// within the codec's bound of the exact shard.
TEST(MpiRequests, ReduceScatterBlockAndUnequal) {
  const int n = world();
  for (int unequal : {0, 1}) {
    std::vector<int> counts(n);
    for (int q = 0; q < n; ++q) counts[q] = unequal ? (q == 0 ? 0 : 3000 * q + 17) : 8192;
    int total = 0, off = 0;
    for (int q = 0; q < n; ++q) {
      if (q == rank()) off = total;
      total += counts[q];
    }
    const auto x = gaussian(total, 77 + rank());
    const auto ex = exact_sum(x);
    std::vector<float> y(counts[rank()], -1.0f);
    if (unequal) {
      ASSERT_EQ(THC_Reduce_scatter(x.data(), y.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS)
          << thc_last_error();
    } else {
      ASSERT_EQ(THC_Reduce_scatter_block(x.data(), y.data(), counts[0], MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                MPI_SUCCESS)
          << thc_last_error();
    }
    std::vector<double> mine(ex.begin() + off, ex.begin() + off + counts[rank()]);
    if (!mine.empty()) {
      EXPECT_LT(nmse(y, mine), 0.05) << "unequal " << unequal;
    }
    // in place
    std::vector<float> z = x;
    ASSERT_EQ(THC_Reduce_scatter(MPI_IN_PLACE, z.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
    z.resize(counts[rank()]);
    if (!mine.empty()) {
      EXPECT_LT(nmse(z, mine), 0.05);
    }
  }
  // Integers are exact, through PMPI.
  std::vector<int> ia(2 * n, 1), ib(2, 0);
  ASSERT_EQ(THC_Reduce_scatter_block(ia.data(), ib.data(), 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
  EXPECT_EQ(ib, std::vector<int>(2, n));
}

// The interposer's nonblocking path on 16-bit floats: NaN/Inf make every rank redo the call
// exactly, with an op that adds half (bfloat16) values in float: small integers add exactly, the
// NaN stays where it was, the hook sees the outcome, and MPI_Wait succeeds.
TEST(MpiRequests, NonFiniteRedoneExactlyOnSixteenBitFloats) {
  for (int bf : {0, 1}) {
    const int count = 5000;
    std::vector<uint16_t> x(count), y(count, 0);
    for (int i = 0; i < count; ++i) {
      const float v = static_cast<float>((i + rank()) % 7);
      x[i] = bf ? thc::engine::float_to_bf16(v) : thc::engine::float_to_half(v);
    }
    if (rank() == 0) x[11] = bf ? 0x7FC0 : 0x7E00;  // NaN
    thc::mpi::IallreduceHooks h;
    h.nonfinite_exact = true;
    thc_status_t seen = THC_SUCCESS;
    int code_seen = -1;
    h.done = [&](int code, thc_status_t st, const std::string&) {
      seen = st;
      code_seen = code;
    };
    MPI_Request r;
    ASSERT_EQ(thc::mpi::iallreduce(THC_SCHEME_THC, x.data(), y.data(), count,
                                   bf ? THC_MPI_BFLOAT16() : THC_MPI_FLOAT16(), MPI_SUM, MPI_COMM_WORLD, nullptr, &r, h),
              MPI_SUCCESS);
    ASSERT_EQ(MPI_Wait(&r, MPI_STATUS_IGNORE), MPI_SUCCESS);
    EXPECT_EQ(seen, THC_ERR_NONFINITE);
    EXPECT_EQ(code_seen, MPI_SUCCESS);
    for (int i = 0; i < count; ++i) {
      const float got = bf ? thc::engine::bf16_to_float(y[i]) : thc::engine::half_to_float(y[i]);
      if (i == 11) {
        EXPECT_TRUE(std::isnan(got));
        continue;
      }
      float want = 0;
      for (int q = 0; q < world(); ++q) want += static_cast<float>((i + q) % 7);
      ASSERT_EQ(got, want) << "element " << i << (bf ? " bfloat16" : " half");
    }
  }
}

TEST(MpiRequests, LossyAllgather) {
  const int n = world();
  const int count = 10000;
  const auto x = gaussian(count, 3 + rank());
  std::vector<float> all(static_cast<size_t>(count) * n, -1.0f);
  ASSERT_EQ(THC_Allgather_x(THC_SCHEME_THC, x.data(), count, MPI_FLOAT, all.data(), count, MPI_FLOAT, MPI_COMM_WORLD,
                            nullptr),
            MPI_SUCCESS)
      << thc_last_error();
  EXPECT_TRUE(thc::test::same_on_every_rank(all));
  std::vector<float> exact(static_cast<size_t>(count) * n);
  MPI_Allgather(x.data(), count, MPI_FLOAT, exact.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<double> ex(exact.begin(), exact.end());
  const double e = nmse(all, ex);
  EXPECT_LT(e, 0.08);
  EXPECT_GT(e, 1e-6);
}

}  // namespace
