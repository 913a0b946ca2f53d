// thcAllReduce / cnatAllReduce / thcAllReduceEx on a one-rank NCCL communicator
// (ncclCommInitAll with one device) against the host codec. With one rank the MAX and SUM
// collectives are identities, so the result must equal the host codec's encode + decode with
// the same seed and round, on the statistics the GPU prelude computes (the same kernel the call
// runs: the host's own double sums may differ in the last bit).
//
// Built against the real CUDA runtime and NCCL (skips without a device) and against the CPU
// emulator with a one-rank fake NCCL (tests/cuda/emu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "cuda/nccl_api_internal.h"
#include "cuda/thc_cuda.h"
#include "tests/cuda/gpu_test_util.h"
#include "thc/thc_nccl.h"

namespace thc::cuda::test {
namespace {

using codec::Codec;
using codec::Layout;
using codec::Scheme;

#define ASSERT_NCCL(expr)                                                                                 \
  do {                                                                                                    \
    const ncclResult_t r_ = (expr);                                                                       \
    ASSERT_EQ(r_, ncclSuccess) << #expr << ": " << ncclGetErrorString(r_) << " / " << thcNcclGetLastError(); \
  } while (0)

constexpr uint64_t kSeed = 0xC0FFEE1234ull;

#if defined(THC_CUDA_EMULATION)
constexpr long kBlock = 1024;
#else
constexpr long kBlock = 65536;
#endif

class NcclApi : public ::testing::Test {
 protected:
  void SetUp() override {
    THC_REQUIRE_DEVICE();
    const int dev = 0;
    ASSERT_NCCL(ncclCommInitAll(&nccl_, 1, &dev));
    ASSERT_CUDA(cudaStreamCreate(&stream_));
    ASSERT_EQ(thc_config_init(&cfg_), THC_SUCCESS);
    cfg_.seed = kSeed;
    cfg_.block = kBlock;
    cfg_.algo = THC_ALGO_INT;
  }
  void TearDown() override {
    if (comm_) thcNcclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
    if (nccl_) {
      thcNcclCommRelease(nccl_);
      ncclCommDestroy(nccl_);
    }
    set_min_chunk_bytes(size_t{64} << 20);
  }
  void init() { ASSERT_NCCL(thcNcclCommInit(nccl_, &cfg_, &comm_)); }

  codec::Params params(Scheme s) const {
    codec::Params p;
    p.scheme = s;
    p.bits = cfg_.bits;
    p.granularity = cfg_.granularity;
    p.p = cfg_.p;
    int l = 0;
    while ((1L << l) < cfg_.block) ++l;
    p.block_log2 = l;
    p.nat_width = cfg_.nat_width;
    p.nat_levels = cfg_.nat_levels;
    p.dnat_norm = cfg_.dnat_norm;
    return p;
  }

  // Host reference of one call on one rank: x = grad (+ residual), GPU prelude statistics,
  // host encode (updating *residual when given) and decode.
  std::vector<float> reference(Scheme s, const std::vector<float>& x, uint32_t round, bool mean,
                               std::vector<float>* residual = nullptr) {
    const Codec c(params(s), 1);
    const Layout lay = c.layout(x.size());
    DeviceCodec dc;
    EXPECT_EQ(dc.init(c), cudaSuccess);
    DevBuf<float> dx(x), dstats(lay.nblocks);
    size_t tb = 0;
    EXPECT_EQ(prelude(nullptr, &tb, dc, lay, dx.get(), InType::kF32, nullptr, dstats.get(), nullptr, 0, 0), cudaSuccess);
    DevBuf<uint8_t> temp(tb);
    EXPECT_EQ(prelude(temp.get(), &tb, dc, lay, dx.get(), InType::kF32, nullptr, dstats.get(), nullptr, 0, 0),
              cudaSuccess);
    const std::vector<float> stats = dstats.download();
    const codec::CallRng rng{kSeed, 0, round};
    std::vector<uint8_t> vals(lay.wire_count * 4 + 8);
    Codec::EncodeOut o;
    o.values = vals.data();
    std::vector<float> res(x.size());
    if (residual) o.residual = res.data();
    c.encode(lay, 0, lay.nblocks, x.data(), stats.data(), rng, o);
    if (residual) *residual = res;
    std::vector<float> out(x.size());
    c.decode(lay, 0, lay.nblocks, vals.data(), stats.data(), rng, 1, mean, out.data());
    return out;
  }

  std::vector<float> run(Scheme s, const std::vector<float>& x, ncclRedOp_t op = ncclSum, thcNcclEf_t ef = nullptr) {
    DevBuf<float> in(x), out(x.size());
    EXPECT_EQ(thcAllReduceEx(in.get(), out.get(), x.size(), ncclFloat32, op, static_cast<thc_scheme_t>(s), comm_, ef,
                             stream_),
              ncclSuccess)
        << thcNcclGetLastError();
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return out.download();
  }

  static uint64_t diff(const std::vector<float>& a, const std::vector<float>& b) {
    uint64_t m = 0;
    for (size_t i = 0; i < a.size(); ++i) m += fbits(a[i]) != fbits(b[i]);
    return m;
  }

  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  thc_config_t cfg_{};
  thcNcclComm_t comm_ = nullptr;
};

TEST_F(NcclApi, ThcMatchesHostCodecAndRoundsAdvance) {
  init();
  const std::vector<float> x = gaussian(3 * kBlock + 77, 1);
  for (uint32_t round = 0; round < 3; ++round) {
    const std::vector<float> got = run(Scheme::kThc, x);
    EXPECT_EQ(diff(got, reference(Scheme::kThc, x, round, false)), 0u) << "round " << round;
  }
}

TEST_F(NcclApi, EverySchemeBothAlgorithmsChunked) {
  set_min_chunk_bytes(4 * kBlock);  // one block per chunk: the chunk loop runs
  cfg_.chunk_bytes = 4;
  for (int algo : {THC_ALGO_INT, THC_ALGO_PS}) {
    cfg_.algo = algo;
    for (int dnat_norm : {2, 0}) {
      cfg_.dnat_norm = dnat_norm;
      if (comm_) thcNcclCommDestroy(comm_);
      comm_ = nullptr;
      init();
      const std::vector<float> x = gaussian(2 * kBlock + 3, 2);
      uint32_t round = 0;
      for (Scheme s : {Scheme::kThc, Scheme::kUniformThc, Scheme::kCnat, Scheme::kDnat}) {
        for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
          const std::vector<float> got = run(s, x, op);
          EXPECT_EQ(diff(got, reference(s, x, round, op == ncclAvg)), 0u)
              << codec::scheme_name(s) << " algo " << algo << " norm " << dnat_norm;
          ++round;
        }
      }
    }
  }
}

TEST_F(NcclApi, ErrorFeedback) {
  init();
  const uint64_t count = kBlock + 5;
  thcNcclEf_t ef = nullptr;
  ASSERT_NCCL(thcNcclEfCreate(count, &ef));
  std::vector<float> residual(count, 0.0f);
  for (uint32_t round = 0; round < 3; ++round) {
    const std::vector<float> g = gaussian(count, 10 + round);
    std::vector<float> x(count);
    for (uint64_t i = 0; i < count; ++i) x[i] = g[i] + residual[i];
    const std::vector<float> want = reference(Scheme::kThc, x, round, false, &residual);
    const std::vector<float> got = run(Scheme::kThc, g, ncclSum, ef);
    EXPECT_EQ(diff(got, want), 0u) << "round " << round;
    float* d = nullptr;
    size_t n = 0;
    ASSERT_NCCL(thcNcclEfResidual(ef, &d, &n));
    ASSERT_EQ(n, count);
    std::vector<float> gr(count);
    ASSERT_CUDA(cudaMemcpy(gr.data(), d, count * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(diff(gr, residual), 0u) << "residual, round " << round;
  }
  ASSERT_NCCL(thcNcclEfReset(ef, stream_));
  ASSERT_NCCL(thcNcclEfDestroy(ef));
  // a state made for another count is refused
  ASSERT_NCCL(thcNcclEfCreate(7, &ef));
  DevBuf<float> buf(count);
  EXPECT_EQ(thcAllReduceEx(buf.get(), buf.get(), count, ncclFloat32, ncclSum, THC_SCHEME_THC, comm_, ef, stream_),
            ncclInvalidArgument);
  EXPECT_NE(std::string(thcNcclGetLastError()).find("count"), std::string::npos);
  thcNcclEfDestroy(ef);
}

TEST_F(NcclApi, SixteenBitTypesInPlace) {
  init();
  const uint64_t count = kBlock + 9;
  const std::vector<float> g = gaussian(count, 3);
  uint32_t round = 0;
  for (ncclDataType_t dt : {ncclFloat16, ncclBfloat16}) {
    std::vector<uint16_t> raw(count);
    std::vector<float> x(count);
    for (uint64_t i = 0; i < count; ++i) {
      if (dt == ncclFloat16) {
        const __half h = __float2half_rn(g[i]);
        std::memcpy(&raw[i], &h, 2);
        x[i] = __half2float(h) + 0.0f;
      } else {
        const __nv_bfloat16 h = __float2bfloat16_rn(g[i]);
        std::memcpy(&raw[i], &h, 2);
        x[i] = __bfloat162float(h) + 0.0f;
      }
    }
    // the prelude statistics of the 16-bit input equal those of its float conversion
    const std::vector<float> want = reference(Scheme::kThc, x, round++, false);
    DevBuf<uint16_t> buf(raw);
    ASSERT_NCCL(thcAllReduceEx(buf.get(), buf.get(), count, dt, ncclSum, THC_SCHEME_THC, comm_, nullptr, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    const std::vector<uint16_t> got = buf.download();
    uint64_t m = 0;
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t w;
      if (dt == ncclFloat16) {
        const __half h = __float2half_rn(want[i]);
        std::memcpy(&w, &h, 2);
      } else {
        const __nv_bfloat16 h = __float2bfloat16_rn(want[i]);
        std::memcpy(&w, &h, 2);
      }
      m += w != got[i];
    }
    EXPECT_EQ(m, 0u) << (dt == ncclFloat16 ? "half" : "bfloat16");
  }
}

TEST_F(NcclApi, FallThroughAndEmpty) {
  init();
  std::vector<int32_t> v = {1, -2, 3, 2147483647};
  DevBuf<int32_t> a(v), b(v.size());
  ASSERT_NCCL(thcAllReduceEx(a.get(), b.get(), v.size(), ncclInt32, ncclSum, THC_SCHEME_THC, comm_, nullptr, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  EXPECT_EQ(b.download(), v);
  std::vector<double> d = {1.5, -2.25};
  DevBuf<double> c(d), e(d.size());
  ASSERT_NCCL(thcAllReduceEx(c.get(), e.get(), d.size(), ncclFloat64, ncclSum, THC_SCHEME_CNAT, comm_, nullptr, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  EXPECT_EQ(e.download(), d);
  std::vector<float> f = {1.0f, 2.0f};
  DevBuf<float> g(f), h(f.size());
  ASSERT_NCCL(thcAllReduceEx(g.get(), h.get(), f.size(), ncclFloat32, ncclMax, THC_SCHEME_THC, comm_, nullptr, stream_));
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  EXPECT_EQ(h.download(), f);
  ASSERT_NCCL(thcAllReduceEx(g.get(), h.get(), 0, ncclFloat32, ncclSum, THC_SCHEME_THC, comm_, nullptr, stream_));
  EXPECT_EQ(thcAllReduceEx(g.get(), nullptr, 2, ncclFloat32, ncclSum, THC_SCHEME_THC, comm_, nullptr, stream_),
            ncclInvalidArgument);
}

TEST_F(NcclApi, NonFiniteInputGivesNaNAndAsyncError) {
  init();
  const uint64_t count = 2 * kBlock;
  std::vector<float> x = gaussian(count, 4);
  x[kBlock + 3] = INFINITY;
  thcNcclEf_t ef = nullptr;
  ASSERT_NCCL(thcNcclEfCreate(count, &ef));
  const std::vector<float> got = run(Scheme::kThc, x, ncclSum, ef);
  for (float v : got) ASSERT_TRUE(std::isnan(v));
  thc_status_t st = THC_SUCCESS;
  ASSERT_NCCL(thcNcclCommGetAsyncError(comm_, stream_, &st));
  EXPECT_EQ(st, THC_ERR_NONFINITE);
  float* d = nullptr;
  ASSERT_NCCL(thcNcclEfResidual(ef, &d, nullptr));
  std::vector<float> r(count);
  ASSERT_CUDA(cudaMemcpy(r.data(), d, count * 4, cudaMemcpyDeviceToHost));
  for (float v : r) ASSERT_EQ(v, 0.0f) << "a failed call must leave the residual alone";
  thcNcclEfDestroy(ef);
}

TEST_F(NcclApi, DropInFunctions) {
  // The cached handle reads THC_* from the environment; only closeness is checked here.
  const uint64_t count = 2 * kBlock + 1;
  const std::vector<float> x = gaussian(count, 5);
  DevBuf<float> in(x), out(count);
  for (int which = 0; which < 2; ++which) {
    auto fn = which == 0 ? thcAllReduce : cnatAllReduce;
    ASSERT_NCCL(fn(in.get(), out.get(), count, ncclFloat32, ncclAvg, nccl_, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    const std::vector<float> got = out.download();
    double num = 0, den = 0;
    for (uint64_t i = 0; i < count; ++i) {
      num += (got[i] - x[i]) * (got[i] - x[i]);
      den += x[i] * x[i];
    }
    EXPECT_LT(num / den, 0.2) << (which == 0 ? "thcAllReduce" : "cnatAllReduce") << " NMSE";
  }
  thcNcclComm_t h = nullptr;
  ASSERT_NCCL(thcNcclCommGet(nccl_, &h));
  ASSERT_NE(h, nullptr);
}

TEST_F(NcclApi, GraphCaptureReplaysWithFreshRandomness) {
#if defined(THC_CUDA_EMULATION)
  GTEST_SKIP() << "the emulator has no graphs";
#else
  init();
  const uint64_t count = 2 * kBlock + 11;
  const std::vector<float> x = gaussian(count, 6);
  DevBuf<float> in(x), out(count);
  ASSERT_NCCL(thcNcclCommReserve(comm_, count));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  const ncclResult_t r =
      thcAllReduceEx(in.get(), out.get(), count, ncclFloat32, ncclSum, THC_SCHEME_THC, comm_, nullptr, stream_);
  ASSERT_CUDA(cudaStreamEndCapture(stream_, &graph));
  ASSERT_EQ(r, ncclSuccess) << thcNcclGetLastError();
  ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (uint32_t round = 0; round < 3; ++round) {
    ASSERT_CUDA(cudaGraphLaunch(exec, stream_));
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    EXPECT_EQ(diff(out.download(), reference(Scheme::kThc, x, round, false)), 0u) << "replay " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
#endif
}

TEST(NcclApiNoDevice, DevicePointerHelper) {
  int host = 0;
  EXPECT_EQ(thc_cuda_is_device_pointer(nullptr), 0);
  EXPECT_EQ(thc_cuda_is_device_pointer(&host), 0);
#if !defined(THC_CUDA_EMULATION)
  if (!have_device()) return;
  void* d = nullptr;
  ASSERT_CUDA(cudaMalloc(&d, 64));
  EXPECT_EQ(thc_cuda_is_device_pointer(d), 1);
  void* m = nullptr;
  ASSERT_CUDA(cudaMallocManaged(&m, 64));
  EXPECT_EQ(thc_cuda_is_device_pointer(m), 0);
  void* p = nullptr;
  ASSERT_CUDA(cudaMallocHost(&p, 64));
  EXPECT_EQ(thc_cuda_is_device_pointer(p), 0);
  cudaFree(d);
  cudaFree(m);
  cudaFreeHost(p);
#endif
}

}  // namespace
}  // namespace thc::cuda::test
