// THC_Allreduce / CNAT_Allreduce / thc_comm_create_mpi against the exact MPI_Allreduce.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "collectives/engine/dtype.h"
#include "thc/thc_mpi.h"

namespace {

int rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world() {
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

std::vector<double> exact_sum(const std::vector<float>& x) {
  std::vector<double> in(x.begin(), x.end()), out(x.size());
  MPI_Allreduce(in.data(), out.data(), static_cast<int>(in.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return out;
}

double nmse(const std::vector<float>& est, const std::vector<double>& ref, double scale = 1.0) {
  double e = 0, r = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = est[i] * scale - ref[i];
    e += d * d;
    r += ref[i] * ref[i];
  }
  return e / r;
}

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
  EXPECT_EQ(st.wire_bytes_down, count);  // one byte per element downstream
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
