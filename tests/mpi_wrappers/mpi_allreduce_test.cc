// THC_Allreduce / CNAT_Allreduce / thc_comm_create_mpi against the exact MPI_Allreduce.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <limits>
#include <random>
#include <vector>

#include "collectives/engine/dtype.h"
#include "tests/mpi_wrappers/mpi_test_util.h"
#include "transport/mpi/mpi_reducer.h"
#include "thc/thc_mpi.h"

namespace {

using thc::test::exact_sum;
using thc::test::gaussian;
using thc::test::nmse;
using thc::test::rank;
using thc::test::world;

thc_config_t cfg_with(int algo, uint64_t seed = 777) {
  thc_config_t c;
  EXPECT_EQ(thc_config_init(&c), THC_SUCCESS);
  c.algo = algo;
  c.seed = seed;
  c.block = 4096;
  c.chunk_bytes = 4 * 4096 * 3;  // 3 blocks per chunk: several chunks pipelined
  return c;
}

TEST(MpiAllreduce, ThcAndCnatMatchExactWithinBound) {
  for (size_t count : {size_t{1}, size_t{777}, size_t{4095}, size_t{4097}, size_t{50001}}) {
    const auto x = gaussian(count, 10 + rank());
    const auto ex = exact_sum(x);
    std::vector<float> a(count), b(count);
    ASSERT_EQ(THC_Allreduce(x.data(), a.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS)
        << thc_last_error();
    ASSERT_EQ(CNAT_Allreduce(x.data(), b.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS)
        << thc_last_error();
    if (count >= 64) {
      EXPECT_LT(nmse(a, ex), 0.1) << count;
      EXPECT_LT(nmse(b, ex), 0.13) << count;
    }
    // Every rank holds the same result.
    std::vector<float> r0 = a;
    MPI_Bcast(r0.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
    EXPECT_EQ(r0, a);
  }
}

TEST(MpiAllreduce, AllSchemesBothAlgorithmsIdenticalDecodes) {
  const size_t count = 30000;
  const auto x = gaussian(count, 50 + rank());
  const auto ex = exact_sum(x);
  for (thc_scheme_t s : {THC_SCHEME_THC, THC_SCHEME_UHC, THC_SCHEME_CNAT, THC_SCHEME_DNAT}) {
    std::vector<float> out[2];
    for (int algo = 1; algo <= 2; ++algo) {
      thc_config_t c = cfg_with(algo);
      thc_comm_t comm;
      ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS) << thc_last_error();
      out[algo - 1].resize(count);
      ASSERT_EQ(thc_allreduce_scheme(s, x.data(), out[algo - 1].data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr),
                THC_SUCCESS)
          << thc_last_error();
      thc_stats_t st;
      thc_comm_stats(comm, &st);
      EXPECT_EQ(st.last_algo, algo);
      thc_comm_destroy(comm);
    }
    EXPECT_EQ(out[0], out[1]) << "scheme " << s;
    EXPECT_LT(nmse(out[0], ex), s == THC_SCHEME_UHC ? 0.3 : 0.13) << "scheme " << s;
  }
}

TEST(MpiAllreduce, DtypesInPlaceAndAvg) {
  const size_t count = 20000;
  const auto x = gaussian(count, 90 + rank());
  const auto ex = exact_sum(x);
  struct T {
    MPI_Datatype mpi;
    thc::engine::DType dt;
  };
  for (T t : {T{MPI_FLOAT, thc::engine::DType::kF32}, T{MPI_DOUBLE, thc::engine::DType::kF64},
              T{THC_MPI_FLOAT16(), thc::engine::DType::kF16}, T{THC_MPI_BFLOAT16(), thc::engine::DType::kBF16}}) {
    std::vector<uint8_t> buf(count * thc::engine::dtype_size(t.dt));
    thc::engine::store_from_float(x.data(), count, t.dt, buf.data(), 0);
    ASSERT_EQ(THC_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), t.mpi, THC_MPI_AVG(), MPI_COMM_WORLD),
              MPI_SUCCESS)
        << thc_last_error();
    std::vector<float> got(count);
    thc::engine::load_as_float(buf.data(), t.dt, 0, count, nullptr, got.data());
    EXPECT_LT(nmse(got, ex, world()), 0.1) << "dtype " << static_cast<int>(t.dt);
  }
}

TEST(MpiAllreduce, NonFloatTypesAndOtherOpsAreExact) {
  std::vector<int> a(1000), b(1000);
  for (int i = 0; i < 1000; ++i) a[i] = i * (rank() + 1);
  ASSERT_EQ(THC_Allreduce(a.data(), b.data(), 1000, MPI_INT, MPI_SUM, MPI_COMM_WORLD), MPI_SUCCESS);
  const int n = world();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(b[i], i * n * (n + 1) / 2);
  std::vector<float> f(1000, static_cast<float>(rank())), g(1000);
  ASSERT_EQ(THC_Allreduce(f.data(), g.data(), 1000, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD), MPI_SUCCESS);
  for (float v : g) ASSERT_EQ(v, static_cast<float>(n - 1));
}

// MPI's built-in ops on thc's byte-based 16-bit types: MPI itself refuses them (MPI_ERR_OP); the
// exact path hands MPI thc's ops for MPI_MAX, MPI_MIN and MPI_PROD (each element in float, rounded
// once to the type; NaN propagates), in the blocking and the nonblocking call. Inputs are signed
// powers of two and zeros, so every result is exact in both types.
TEST(MpiAllreduce, SixteenBitTypesTakeMaxMinAndProd) {
  const int n = world();
  const size_t count = 1000;
  auto value = [](int q, size_t i) {
    const int k = static_cast<int>(i % 5) - 2;  // -2..2
    return static_cast<float>(k) * std::ldexp(1.0f, (q + static_cast<int>(i % 3)) % 4 - 1);
  };
  for (const bool bf : {false, true}) {
    const thc::engine::DType dt = bf ? thc::engine::DType::kBF16 : thc::engine::DType::kF16;
    const MPI_Datatype mt = bf ? THC_MPI_BFLOAT16() : THC_MPI_FLOAT16();
    for (const MPI_Op op : {MPI_MAX, MPI_MIN, MPI_PROD}) {
      for (const bool nonblocking : {false, true}) {
        std::vector<float> x(count), ex(count);
        for (size_t i = 0; i < count; ++i) {
          x[i] = value(rank(), i);
          float e = value(0, i);
          for (int q = 1; q < n; ++q) {
            const float v = value(q, i);
            e = op == MPI_MAX ? std::max(e, v) : op == MPI_MIN ? std::min(e, v) : e * v;
          }
          ex[i] = e;
        }
        x[17] = rank() == n - 1 ? std::numeric_limits<float>::quiet_NaN() : x[17];
        std::vector<uint8_t> in(count * 2), out(count * 2, 0xAB);
        thc::engine::store_from_float(x.data(), count, dt, in.data(), 0);
        if (nonblocking) {
          MPI_Request req;
          ASSERT_EQ(THC_Iallreduce(in.data(), out.data(), static_cast<int>(count), mt, op, MPI_COMM_WORLD, &req),
                    MPI_SUCCESS)
              << thc_last_error();
          ASSERT_EQ(MPI_Wait(&req, MPI_STATUS_IGNORE), MPI_SUCCESS);
        } else {
          ASSERT_EQ(THC_Allreduce(in.data(), out.data(), static_cast<int>(count), mt, op, MPI_COMM_WORLD), MPI_SUCCESS)
              << thc_last_error();
        }
        std::vector<float> got(count);
        thc::engine::load_as_float(out.data(), dt, 0, count, nullptr, got.data());
        const std::string what = std::string(bf ? "bf16" : "f16") + (op == MPI_MAX ? " max" : op == MPI_MIN ? " min" : " prod") +
                                 (nonblocking ? " nonblocking" : "");
        EXPECT_TRUE(std::isnan(got[17])) << what << ": " << got[17];
        for (size_t i = 0; i < count; ++i) {
          if (i == 17) continue;
          ASSERT_EQ(got[i], ex[i]) << what << " element " << i;
        }
      }
    }
  }
}

TEST(MpiAllreduce, UnbiasedOverSeeds) {
  // With negligible truncation (p = 1e-7) THC's estimate is unbiased: the mean over rounds
  // approaches the exact sum as 1/R.
  thc_config_t c = cfg_with(0);
  c.p = 1e-7;
  c.granularity = 60;
  thc_comm_t comm;
  ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS);
  const size_t count = 4096;
  const auto x = gaussian(count, 300 + rank());
  const auto ex = exact_sum(x);
  const int R = 100;
  std::vector<double> acc(count, 0);
  double single = 0;
  std::vector<float> out(count);
  for (int r = 0; r < R; ++r) {
    ASSERT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS);
    for (size_t i = 0; i < count; ++i) {
      acc[i] += out[i];
      single += (out[i] - ex[i]) * (out[i] - ex[i]);
    }
  }
  single /= R;
  double err = 0;
  for (size_t i = 0; i < count; ++i) err += (acc[i] / R - ex[i]) * (acc[i] / R - ex[i]);
  EXPECT_LT(err, 2.0 * single / R);
  thc_comm_destroy(comm);
}

TEST(MpiAllreduce, ErrorFeedbackConverges) {
  thc_config_t c = cfg_with(0);
  c.p = 0.2;
  thc_comm_t comm;
  ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS);
  const size_t count = 4096;
  auto x = gaussian(count, 400 + rank());
  x[17 * rank()] = 40.0f;
  const auto ex = exact_sum(x);
  thc_state_t ef;
  thc_state_create(&ef);
  const int R = 100;
  std::vector<double> acc(count, 0);
  std::vector<float> out(count);
  for (int r = 0; r < R; ++r) {
    ASSERT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS);
    for (size_t i = 0; i < count; ++i) acc[i] += out[i] / R;
  }
  std::vector<float> avg(acc.begin(), acc.end());
  EXPECT_LT(nmse(avg, ex), 2e-3);
  thc_state_destroy(ef);
  thc_comm_destroy(comm);
}

TEST(MpiAllreduce, NonFiniteInputFailsOnEveryRank) {
  thc_config_t c = cfg_with(0);
  thc_comm_t comm;
  ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS);
  auto x = gaussian(5000, rank());
  if (rank() == world() - 1) x[4321] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> out(5000, 3.0f);
  EXPECT_EQ(thc_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_ERR_NONFINITE);
  EXPECT_EQ(out, std::vector<float>(5000, 3.0f));
  // The communicator stays usable.
  x[4321] = 0.0f;
  EXPECT_EQ(thc_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS);
  thc_comm_destroy(comm);
}

TEST(MpiAllreduce, MismatchedConfigurationFailsOnEveryRank) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  thc_config_t c = cfg_with(0);
  if (rank() == 1) c.bits = 3;
  thc_comm_t comm;
  ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS);
  auto x = gaussian(5000, rank());
  std::vector<float> out(5000);
  EXPECT_EQ(thc_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_ERR_CONFIG_MISMATCH)
      << thc_last_error();
  thc_comm_destroy(comm);
}

// Each disagreement that changes what the ranks exchange after the first exchange (chunk count,
// block count, algorithm, downstream re-compression) must be caught in that fixed-size first
// exchange: THC_ERR_CONFIG_MISMATCH on every rank, nothing sent that depends on the sizes, and
// the communicator still usable.
TEST(MpiAllreduce, MismatchesAreCaughtBeforeSizeDependentExchanges) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  struct Variant {
    const char* name;
    const char* field;  // what the message names
    std::function<void(thc_config_t&)> cfg;
    thc_scheme_t scheme;
    size_t count;
  };
  const std::vector<Variant> variants = {
      {"chunk", "chunking", [](thc_config_t& c) { c.chunk_bytes = 4 * 4096 * 7; }, THC_SCHEME_THC, 50000},
      {"algo", "algorithm", [](thc_config_t& c) { c.algo = THC_ALGO_PS; }, THC_SCHEME_THC, 50000},
      {"bidir", "re-compression", [](thc_config_t& c) { c.bidir = 1; }, THC_SCHEME_CNAT, 50000},
      {"count", "count", [](thc_config_t&) {}, THC_SCHEME_THC, 0},
  };
  for (const Variant& v : variants) {
    thc_config_t c = cfg_with(v.name == std::string("bidir") ? THC_ALGO_PS : THC_ALGO_INT);
    if (rank() == 1) v.cfg(c);
    thc_comm_t comm;
    ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS) << thc_last_error();
    // count variant: rank 1 has 13 blocks of 4096, the others 2
    const size_t count = v.count ? v.count : (rank() == 1 ? 50000 : 5000);
    auto x = gaussian(count, 70 + rank());
    std::vector<float> out(count, 5.0f);
    EXPECT_EQ(thc_allreduce_scheme(v.scheme, x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr),
              THC_ERR_CONFIG_MISMATCH)
        << v.name << ": " << thc_last_error();
    EXPECT_NE(std::string(thc_last_error()).find(v.field), std::string::npos) << v.name << ": " << thc_last_error();
    EXPECT_EQ(out, std::vector<float>(count, 5.0f)) << v.name << ": the output must be untouched";
    if (v.count == 0) {
      // The same communicator with matching counts: the failed call left nothing behind.
      std::vector<float> y(5000);
      auto x2 = gaussian(5000, 80 + rank());
      EXPECT_EQ(thc_allreduce(x2.data(), y.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS)
          << thc_last_error();
      EXPECT_LT(nmse(y, exact_sum(x2)), 0.1);
    }
    thc_comm_destroy(comm);
  }
}

// A rank whose call fails before the first exchange (a bad argument, a configuration of its own
// that overflows) still takes part in it: every rank fails with that status, none waits.
TEST(MpiAllreduce, FailureOfOneRankBeforeTheExchangeFailsEveryRank) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  {
    thc_config_t c = cfg_with(THC_ALGO_INT);
    if (rank() == 1) c.nat_levels = 15;  // too many for 16-bit sums of >= 2 workers
    thc_comm_t comm;
    ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS) << thc_last_error();
    auto x = gaussian(5000, rank());
    std::vector<float> out(5000);
    EXPECT_EQ(cnat_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_ERR_OVERFLOW)
        << thc_last_error();
    // THC itself is fine on every rank: the communicator goes on.
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS)
        << thc_last_error();
    thc_comm_destroy(comm);
  }
  {
    thc_config_t c = cfg_with(THC_ALGO_INT);
    thc_comm_t comm;
    ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS) << thc_last_error();
    thc_state_t ef;
    thc_state_create(&ef);
    auto x = gaussian(6000, rank());
    std::vector<float> out(6000);
    // rank 0's state gets bound to 6000 elements, then used with 5000: its own error
    if (rank() == 0)
      ASSERT_EQ(thc_allreduce(x.data(), out.data(), 6000, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS);
    else
      ASSERT_EQ(thc_allreduce(x.data(), out.data(), 6000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS);
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, rank() == 0 ? ef : nullptr),
              THC_ERR_INVALID_ARG)
        << thc_last_error();
    thc_state_destroy(ef);
    thc_comm_destroy(comm);
  }
}

// THC_BIDIR re-compresses a shard sum |S| <= n 2^(L-1) to a power of two at most twice as large:
// explicit levels that leave no room for it are refused (THC_ERR_OVERFLOW), never wrapped.
TEST(MpiAllreduce, BidirWithExplicitLevelsOverflowsOrIsExact) {
  {
    thc_config_t c = cfg_with(THC_ALGO_PS);
    thc_comm_t comm;
    ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS) << thc_last_error();
    thc_stats_t st;
    thc_comm_stats(comm, &st);
    thc_comm_destroy(comm);
    // The compressed stage of a hierarchical communicator sums host sums (not powers of two
    // on hosts of 3): mpi_hier_test has this case for it.
    if (st.hier_hosts > 0) GTEST_SKIP() << "hierarchical communicator (THC_HIER_HOSTS)";
  }
  const int n = world();
  int levels = 1;  // the most 16-bit sums allow without re-compression: n 2^(L-1) <= 32767
  while ((int64_t{n} << levels) <= 32767) ++levels;
  int64_t up = 1;
  while (up < (int64_t{n} << (levels - 1))) up <<= 1;
  const bool fits = up <= 32767;
  thc_config_t c = cfg_with(THC_ALGO_PS);
  c.bidir = 1;
  c.nat_width = 16;
  c.nat_levels = levels;
  thc_comm_t comm;
  ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS) << thc_last_error();
  // Every element at its block's maximum on every rank: the sums reach n 2^(L-1).
  std::vector<float> x(20000, 1.0f);
  std::vector<float> out(20000);
  const thc_status_t st = cnat_allreduce(x.data(), out.data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm, nullptr);
  if (fits) {
    ASSERT_EQ(st, THC_SUCCESS) << thc_last_error();
    for (float v : out) ASSERT_EQ(v, static_cast<float>(n));  // powers of two stay exact
  } else {
    EXPECT_EQ(st, THC_ERR_OVERFLOW) << "levels " << levels << ": " << thc_last_error();
  }
  thc_comm_destroy(comm);
}

// MPI waits are bounded by THC_TIMEOUT_MS: a peer that never calls makes the caller fail with
// THC_ERR_TIMEOUT, not wait forever; the communicator then refuses further calls.
// Its own ctest entry (mpi_timeout_*): MPI cannot cancel the abandoned collectives, and their
// messages could reach communicators that later tests create.
TEST(MpiAllreduce, PeerThatNeverCallsGivesTimeout) {
  if (!std::getenv("THC_TEST_MPI_TIMEOUT")) GTEST_SKIP() << "runs alone: set THC_TEST_MPI_TIMEOUT=1";
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  thc_config_t c = cfg_with(THC_ALGO_INT);
  c.timeout_ms = 1500;
  thc_comm_t comm;
  ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS) << thc_last_error();
  if (rank() == 0) {
    auto x = gaussian(5000, 1);
    std::vector<float> out(5000);
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_ERR_TIMEOUT)
        << thc_last_error();
    EXPECT_NE(std::string(thc_last_error()).find("THC_TIMEOUT_MS"), std::string::npos) << thc_last_error();
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_ERR_TRANSPORT)
        << thc_last_error();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  thc_comm_destroy(comm);

  // Creation is collective too: a rank that never creates its communicator.
  MPI_Comm parent;
  MPI_Comm_dup(MPI_COMM_WORLD, &parent);
  if (rank() == 0) {
    thc_comm_t lone;
    EXPECT_EQ(thc_comm_create_mpi(parent, &c, &lone), THC_ERR_TIMEOUT) << thc_last_error();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // parent is not freed: rank 0's abandoned duplication is still posted on it.

  // A request dropped while its peers never come gives up within the bound (no hang).
  auto red = thc::transport::make_mpi_reducer(MPI_COMM_WORLD, 1000);
  if (rank() == 0) {
    thc::transport::LookupTable table;
    table.bits = 8;
    for (int z = 0; z < 256; ++z) table.values.push_back(z);
    std::vector<uint8_t> packed(4096, 1);
    std::vector<uint32_t> sums(4096);
    auto req = red->start_lookup_sum(packed.data(), 4096, table, sums.data(), thc::codec::IntType::kU32, nullptr);
    req.reset();
    EXPECT_THROW(red->start_sum(sums.data(), 4096, thc::codec::IntType::kU32), thc::Error);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A request dropped before completion (an error elsewhere in the engine's call) must still
// play its part: the peers are waiting for its allgather.
TEST(MpiTransport, PsRequestDroppedBeforeItsAllgatherCompletesForThePeers) {
  auto red = thc::transport::make_mpi_reducer(MPI_COMM_WORLD, 60000);
  thc::transport::LookupTable table;
  table.bits = 4;
  for (int z = 0; z < 16; ++z) table.values.push_back(z * 3);
  const uint64_t count = 1000;
  std::vector<uint8_t> packed(count / 2, static_cast<uint8_t>(0x55));  // index 5 everywhere
  for (int round = 0; round < 2; ++round) {
    std::vector<uint16_t> sums(count, 0);
    auto req = red->start_lookup_sum(packed.data(), count, table, sums.data(), thc::codec::IntType::kU16, nullptr);
    if (rank() == 0 && round == 0) {
      req.reset();
    } else {
      req->wait();
      for (uint16_t v : sums) ASSERT_EQ(v, 15 * world());
    }
  }
}

TEST(MpiAllreduce, AvgOnIntegerTypesIsRefused) {
  std::vector<int> a(1000, 3), b(1000, -1);
  EXPECT_EQ(THC_Allreduce(a.data(), b.data(), 1000, MPI_INT, THC_MPI_AVG(), MPI_COMM_WORLD), MPI_ERR_OP);
  EXPECT_NE(std::string(thc_last_error()).find("THC_MPI_AVG"), std::string::npos) << thc_last_error();
  EXPECT_EQ(b, std::vector<int>(1000, -1));
}

TEST(MpiAllreduce, OverflowProneConfigurationFails) {
  thc_config_t c = cfg_with(0);
  c.nat_width = 8;
  c.nat_levels = 7;  // n * 64 > 127 for n >= 2
  thc_comm_t comm;
  ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS);
  std::vector<float> x(3000, 1.0f);
  const thc_status_t st = cnat_allreduce(x.data(), x.data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm, nullptr);
  EXPECT_EQ(st, world() >= 2 ? THC_ERR_OVERFLOW : THC_SUCCESS) << thc_last_error();
  thc_comm_destroy(comm);
}

TEST(MpiAllreduce, BidirectionalCnatOnColocatedPs) {
  thc_config_t c = cfg_with(THC_ALGO_PS);
  c.bidir = 1;
  thc_comm_t comm;
  ASSERT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS);
  const size_t count = 20000;
  const auto x = gaussian(count, 500 + rank());
  const auto ex = exact_sum(x);
  std::vector<float> out(count);
  ASSERT_EQ(cnat_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS)
      << thc_last_error();
  EXPECT_LT(nmse(out, ex), 0.27);
  thc_stats_t st;
  thc_comm_stats(comm, &st);
  // One byte per element downstream, on each of the ranks that compress it: every rank (flat),
  // one rank per host for each slice (hierarchical).
  uint64_t down = 0;
  MPI_Allreduce(&st.wire_bytes_down, &down, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(down, count * static_cast<uint64_t>(st.hier_hosts > 0 ? st.hier_hosts : world()));
  thc_comm_destroy(comm);
}

TEST(MpiAllreduce, HugeCountBeyondInt) {
  // 2^31 + 3 bfloat16 elements (4 GiB per rank): counts past INT_MAX through THC_Allreduce_x.
  if (!std::getenv("THC_TEST_HUGE")) GTEST_SKIP() << "set THC_TEST_HUGE=1 (needs ~5 GiB per rank)";
  const size_t count = (size_t{1} << 31) + 3;
  std::vector<uint16_t> buf(count, thc::engine::float_to_bf16(1.0f));
  buf[count - 1] = thc::engine::float_to_bf16(2.0f);
  ASSERT_EQ(THC_Allreduce_x(THC_SCHEME_CNAT, MPI_IN_PLACE, buf.data(), count, THC_MPI_BFLOAT16(), MPI_SUM,
                            MPI_COMM_WORLD, nullptr),
            MPI_SUCCESS)
      << thc_last_error();
  // Powers of two are represented exactly by Cnat: the sums are exact.
  EXPECT_EQ(thc::engine::bf16_to_float(buf[0]), static_cast<float>(world()));
  EXPECT_EQ(thc::engine::bf16_to_float(buf[count - 1]), 2.0f * world());
}

}  // namespace
