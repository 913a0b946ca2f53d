// Device buffers through the MPI path: THC_Allreduce / CNAT_Allreduce / thc_allreduce on an MPI
// communicator with device memory give the same bits as with host memory (same seed: THC_SEED;
// dyadic inputs make both preludes exact). Run under mpirun; built against the CPU emulator
// (emu.) and against a real device (gpu.; skips without one, e.g. on one GPU shared by ranks
// only when the device is missing).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collectives/engine/device.h"
#include "collectives/engine/dtype.h"
#include "cuda/thc_cuda.h"
#include "tests/cuda/gpu_test_util.h"
#include "thc/thc_mpi.h"

namespace {

using namespace thc::cuda::test;

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


class MpiDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int dev = 0;
    const bool ok = have_device();
    int all_ok = 0;
    int mine = ok ? 1 : 0;
    MPI_Allreduce(&mine, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) GTEST_SKIP() << "no CUDA device";
    int ndev = 1;
    cudaGetDeviceCount(&ndev);
    dev = rank() % ndev;
    cudaSetDevice(dev);
    thc::engine::set_device_backend(thc::cuda::engine_backend());
    // fresh communicators: both start at call 0 with the same THC_SEED
    MPI_Comm_dup(MPI_COMM_WORLD, &host_);
    MPI_Comm_dup(MPI_COMM_WORLD, &dev_);
  }
  void TearDown() override {
    if (host_ != MPI_COMM_NULL) MPI_Comm_free(&host_);
    if (dev_ != MPI_COMM_NULL) MPI_Comm_free(&dev_);
  }
  // A flat communicator on host_ and a hierarchical one on dev_ (2 hosts emulated: all ranks but
  // the last, and the last), same seed.
  void flat_and_hier(thc_comm_t* flat, thc_comm_t* hier) {
    thc_config_t flat_cfg;
    ASSERT_EQ(thc_config_init(&flat_cfg), THC_SUCCESS);
    flat_cfg.hier = 0;
    thc_config_t hier_cfg = flat_cfg;
    hier_cfg.hier = 1;
    std::snprintf(hier_cfg.hier_hosts, sizeof hier_cfg.hier_hosts, "%d,1", world() - 1);
    ASSERT_EQ(thc_comm_create_mpi(host_, &flat_cfg, flat), THC_SUCCESS) << thc_last_error();
    ASSERT_EQ(thc_comm_create_mpi(dev_, &hier_cfg, hier), THC_SUCCESS) << thc_last_error();
    thc_stats_t st;
    ASSERT_EQ(thc_comm_stats(*hier, &st), THC_SUCCESS);
    ASSERT_EQ(st.hier_hosts, 2);
  }
  MPI_Comm host_ = MPI_COMM_NULL, dev_ = MPI_COMM_NULL;
};

using Call = int (*)(const void*, void*, int, MPI_Datatype, MPI_Op, MPI_Comm);

// One call on host buffers (comm host) and on device buffers (comm dev); the recv bytes.
void both(Call f, const std::vector<uint8_t>& in, int count, MPI_Datatype dt, MPI_Op op, bool in_place, MPI_Comm host,
          MPI_Comm dev, std::vector<uint8_t>* h_out, std::vector<uint8_t>* d_out) {
  std::vector<uint8_t> hs = in, hr(in.size());
  ASSERT_EQ(f(in_place ? MPI_IN_PLACE : hs.data(), in_place ? hs.data() : hr.data(), count, dt, op, host), MPI_SUCCESS)
      << thc_last_error();
  *h_out = in_place ? hs : hr;
  DevBuf<uint8_t> ds(in), dr(in.size());
  ASSERT_EQ(f(in_place ? MPI_IN_PLACE : ds.get(), in_place ? ds.get() : dr.get(), count, dt, op, dev), MPI_SUCCESS)
      << thc_last_error();
  *d_out = in_place ? ds.download() : dr.download();
}

TEST_F(MpiDeviceTest, ThcAllreduceFloat32) {
  const int count = 9 * 1024 + 333;
  for (int k = 0; k < 2; ++k) {
    const std::vector<float> x = dyadic(count, 100 * rank() + k);
    std::vector<uint8_t> in(count * 4), h, d;
    std::memcpy(in.data(), x.data(), in.size());
    both(THC_Allreduce, in, count, MPI_FLOAT, MPI_SUM, false, host_, dev_, &h, &d);
    EXPECT_EQ(h, d) << "call " << k;
  }
  thc_stats_t st;
  ASSERT_EQ(THC_Comm_stats(dev_, &st), THC_SUCCESS);
  EXPECT_EQ(st.calls, 2u);
  EXPECT_EQ(st.elements, 2u * count);
}

TEST_F(MpiDeviceTest, CnatAverageFloat16InPlace) {
  const int count = 5 * 1024 + 17;
  const std::vector<float> x = dyadic(count, 7 + rank());
  std::vector<uint8_t> in(count * 2), h, d;
  thc::engine::store_from_float(x.data(), count, thc::engine::DType::kF16, in.data(), 0);
  both(CNAT_Allreduce, in, count, THC_MPI_FLOAT16(), THC_MPI_AVG(), true, host_, dev_, &h, &d);
  EXPECT_EQ(h, d);
}

TEST_F(MpiDeviceTest, ParameterServerWithErrorFeedback) {
  thc_config_t cfg;
  ASSERT_EQ(thc_config_init(&cfg), THC_SUCCESS);
  cfg.algo = THC_ALGO_PS;
  thc_comm_t ch, cd;
  ASSERT_EQ(thc_comm_create_mpi(host_, &cfg, &ch), THC_SUCCESS);
  ASSERT_EQ(thc_comm_create_mpi(dev_, &cfg, &cd), THC_SUCCESS);
  thc_state_t sh, sd;
  ASSERT_EQ(thc_state_create(&sh), THC_SUCCESS);
  ASSERT_EQ(thc_state_create(&sd), THC_SUCCESS);
  const size_t count = 6 * 1024 + 5;
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> x = dyadic(count, 31 * rank() + k);
    std::vector<float> hr(count);
    ASSERT_EQ(thc_allreduce(x.data(), hr.data(), count, THC_FLOAT32, THC_OP_AVG, ch, sh), THC_SUCCESS) << thc_last_error();
    DevBuf<float> ds(x), dr(count);
    ASSERT_EQ(thc_allreduce(ds.get(), dr.get(), count, THC_FLOAT32, THC_OP_AVG, cd, sd), THC_SUCCESS) << thc_last_error();
    const std::vector<float> got = dr.download();
    EXPECT_EQ(std::memcmp(got.data(), hr.data(), count * 4), 0) << "call " << k;
  }
  thc_stats_t st;
  ASSERT_EQ(thc_comm_stats(cd, &st), THC_SUCCESS);
  EXPECT_EQ(st.last_algo, THC_ALGO_PS);
  thc_state_destroy(sh);
  thc_state_destroy(sd);
  thc_comm_destroy(ch);
  thc_comm_destroy(cd);
}

TEST_F(MpiDeviceTest, NonFiniteOnOneRankFailsEverywhere) {
  const int count = 4096;
  std::vector<float> x = dyadic(count, rank());
  if (rank() == world() - 1) x[77] = std::numeric_limits<float>::infinity();
  DevBuf<float> d(x);
  const int rc = THC_Allreduce(MPI_IN_PLACE, d.get(), count, MPI_FLOAT, MPI_SUM, dev_);
  EXPECT_EQ(rc, MPI_ERR_OTHER);
  EXPECT_NE(std::string(thc_last_error()).find("NaN or Inf"), std::string::npos) << thc_last_error();
  // and the communicator still works
  DevBuf<float> y(dyadic(count, rank()));
  EXPECT_EQ(THC_Allreduce(MPI_IN_PLACE, y.get(), count, MPI_FLOAT, MPI_SUM, dev_), MPI_SUCCESS) << thc_last_error();
}

// A hierarchical communicator (THC_HIER, hosts emulated by THC_HIER_HOSTS) runs calls with device
// buffers on any rank flat, on every rank: the bits of a flat communicator with the same seed,
// also when only some ranks pass device memory. Host-buffer calls stay hierarchical.
TEST_F(MpiDeviceTest, HierarchicalCommunicatorRunsDeviceCallsFlat) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  thc_comm_t flat, hier;
  ASSERT_NO_FATAL_FAILURE(flat_and_hier(&flat, &hier));
  thc_stats_t st;
  const size_t count = 7 * 1024 + 9;
  for (int k = 0; k < 2; ++k) {
    const std::vector<float> x = dyadic(count, 13 * rank() + k);
    std::vector<float> want(count);
    ASSERT_EQ(thc_allreduce(x.data(), want.data(), count, THC_FLOAT32, THC_OP_SUM, flat, nullptr), THC_SUCCESS)
        << thc_last_error();
    // call 0: device buffers everywhere; call 1: on rank 0 only
    const bool on_device = k == 0 || rank() == 0;
    std::vector<float> got(count);
    if (on_device) {
      DevBuf<float> ds(x), dr(count);
      ASSERT_EQ(thc_allreduce(ds.get(), dr.get(), count, THC_FLOAT32, THC_OP_SUM, hier, nullptr), THC_SUCCESS)
          << thc_last_error();
      got = dr.download();
    } else {
      ASSERT_EQ(thc_allreduce(x.data(), got.data(), count, THC_FLOAT32, THC_OP_SUM, hier, nullptr), THC_SUCCESS)
          << thc_last_error();
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), count * 4), 0) << "call " << k;
  }
  // host buffers everywhere: the hierarchical path (its compressed stage's bytes only)
  const std::vector<float> x = dyadic(count, 99 + rank());
  std::vector<float> a(count);
  ASSERT_EQ(thc_allreduce(x.data(), a.data(), count, THC_FLOAT32, THC_OP_SUM, hier, nullptr), THC_SUCCESS)
      << thc_last_error();
  ASSERT_EQ(thc_comm_stats(hier, &st), THC_SUCCESS);
  EXPECT_EQ(st.calls, 3u);
  thc_comm_destroy(flat);
  thc_comm_destroy(hier);
}

// Groups, reduce-scatter and allgather with device buffers on a hierarchical communicator run on
// its flat engine's stream path on every rank (the device codec; a real reduce-scatter): the bits
// of the same calls on host buffers of a flat communicator with the same seed, also when only
// rank 0 passes device memory. Host buffers everywhere keep the hierarchical ways.
TEST_F(MpiDeviceTest, HierarchicalCommunicatorTakesDeviceBuffersInEveryCall) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  thc_comm_t flat, hier;
  ASSERT_NO_FATAL_FAILURE(flat_and_hier(&flat, &hier));
  const int n = world(), me = rank();
  std::vector<size_t> counts;
  size_t total = 0;
  for (int q = 0; q < n; ++q) counts.push_back(2 * 1024 + 100 * q + 3), total += counts.back();
  thc_state_t ef_flat, ef_hier;
  ASSERT_EQ(thc_state_create(&ef_flat), THC_SUCCESS);
  ASSERT_EQ(thc_state_create(&ef_hier), THC_SUCCESS);
  for (int k = 0; k < 2; ++k) {
    const bool on_device = k == 0 || me == 0;  // call pair 0: device buffers everywhere; 1: on rank 0 only
    SCOPED_TRACE(on_device ? "device buffers" : "host buffers on this rank");
    // reduce-scatter with error feedback
    const std::vector<float> x = dyadic(total, 31 * me + k);
    std::vector<float> want(counts[me]), got(counts[me]);
    // (error feedback in the first pair only: a state stays bound to host or device memory)
    ASSERT_EQ(thc_reduce_scatter(THC_SCHEME_THC, x.data(), want.data(), counts.data(), THC_FLOAT32, THC_OP_SUM, flat,
                                 k == 0 ? ef_flat : nullptr),
              THC_SUCCESS)
        << thc_last_error();
    if (on_device) {
      DevBuf<float> ds(x), dr(counts[me]);
      ASSERT_EQ(thc_reduce_scatter(THC_SCHEME_THC, ds.get(), dr.get(), counts.data(), THC_FLOAT32, THC_OP_SUM, hier,
                                   k == 0 ? ef_hier : nullptr),
                THC_SUCCESS)
          << thc_last_error();
      got = dr.download();
    } else {
      ASSERT_EQ(thc_reduce_scatter(THC_SCHEME_THC, x.data(), got.data(), counts.data(), THC_FLOAT32, THC_OP_SUM, hier,
                                   nullptr),
                THC_SUCCESS)
          << thc_last_error();
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), counts[me] * 4), 0) << "reduce-scatter " << k;
    // allgather (float16)
    std::vector<uint8_t> mine(counts[me] * 2);
    thc::engine::store_from_float(dyadic(counts[me], 7 * me + k).data(), counts[me], thc::engine::DType::kF16,
                                  mine.data(), 0);
    std::vector<uint8_t> gw(total * 2), gg(total * 2);
    ASSERT_EQ(thc_allgather(THC_SCHEME_CNAT, mine.data(), gw.data(), counts.data(), THC_FLOAT16, flat, nullptr),
              THC_SUCCESS)
        << thc_last_error();
    if (on_device) {
      DevBuf<uint8_t> ds(mine), dr(total * 2);
      ASSERT_EQ(thc_allgather(THC_SCHEME_CNAT, ds.get(), dr.get(), counts.data(), THC_FLOAT16, hier, nullptr),
                THC_SUCCESS)
          << thc_last_error();
      gg = dr.download();
    } else {
      ASSERT_EQ(thc_allgather(THC_SCHEME_CNAT, mine.data(), gg.data(), counts.data(), THC_FLOAT16, hier, nullptr),
                THC_SUCCESS)
          << thc_last_error();
    }
    EXPECT_EQ(gg, gw) << "allgather " << k;
    // a group: one device tensor, one host tensor (on rank 0 in call pair 1: both on the device)
    const std::vector<float> a = dyadic(3000, 5 * me + k), b = dyadic(1500, 9 * me + k);
    std::vector<float> fa = a, fb = b;
    thc_tensor_t ft[2] = {{THC_IN_PLACE, fa.data(), fa.size(), THC_FLOAT32, nullptr},
                          {THC_IN_PLACE, fb.data(), fb.size(), THC_FLOAT32, nullptr}};
    ASSERT_EQ(thc_allreduce_group(THC_SCHEME_THC, ft, 2, THC_OP_AVG, flat), THC_SUCCESS) << thc_last_error();
    DevBuf<float> da(a), db(b);
    std::vector<float> hb = b;
    thc_tensor_t ht[2] = {{THC_IN_PLACE, da.get(), a.size(), THC_FLOAT32, nullptr},
                          {THC_IN_PLACE, on_device ? static_cast<void*>(db.get()) : hb.data(), b.size(), THC_FLOAT32,
                           nullptr}};
    ASSERT_EQ(thc_allreduce_group(THC_SCHEME_THC, ht, 2, THC_OP_AVG, hier), THC_SUCCESS) << thc_last_error();
    EXPECT_TRUE(da.download() == fa) << "group tensor 0, call pair " << k;
    EXPECT_TRUE((on_device ? db.download() : hb) == fb) << "group tensor 1, call pair " << k;
  }
  // host buffers everywhere: the hierarchical ways (reduce-scatter through its allreduce)
  const std::vector<float> x = dyadic(total, 77 + me);
  std::vector<float> y(counts[me]);
  ASSERT_EQ(thc_reduce_scatter(THC_SCHEME_THC, x.data(), y.data(), counts.data(), THC_FLOAT32, THC_OP_SUM, hier,
                               nullptr),
            THC_SUCCESS)
      << thc_last_error();
  thc_state_destroy(ef_flat);
  thc_state_destroy(ef_hier);
  thc_comm_destroy(flat);
  thc_comm_destroy(hier);
}

TEST_F(MpiDeviceTest, IntegerAverageOnDeviceIsRefused) {
  DevBuf<int> d(64);
  // int is not compressed, and an average of integers is refused wherever the buffer lives
  EXPECT_EQ(THC_Allreduce(MPI_IN_PLACE, d.get(), 64, MPI_INT, THC_MPI_AVG(), dev_), MPI_ERR_OP);
  EXPECT_NE(std::string(thc_last_error()).find("THC_MPI_AVG"), std::string::npos) << thc_last_error();
}

}  // namespace
