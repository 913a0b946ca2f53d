// thcAllReduceEx with several ranks, in the emulator only: one thread per rank over the
// in-process fake NCCL (tests/cuda/emu/fake_nccl.cc). A single GPU cannot host a multi-rank NCCL
// communicator, so this is where the multi-rank flow is checked: the MAX prelude, the 16-bit
// pair sums across ranks, AlltoAll shards with padding, lookup-sum on each shard owner,
// AllGather, chunking, error feedback. Every rank's result must equal the host codec's
// encode / integer sum / decode on the same statistics, seeds and rounds, bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
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

constexpr uint64_t kSeed = 0xFEEDBEEF42ull;
constexpr long kBlock = 1024;

struct Call {
  Scheme scheme;
  ncclRedOp_t op;
  bool ef;
};

const std::vector<Call>& calls() {
  static const std::vector<Call> c = {
      {Scheme::kThc, ncclSum, false},  {Scheme::kThc, ncclAvg, false},       {Scheme::kUniformThc, ncclSum, false},
      {Scheme::kCnat, ncclSum, false}, {Scheme::kCnat, ncclAvg, false},      {Scheme::kDnat, ncclSum, false},
      {Scheme::kThc, ncclSum, true},   {Scheme::kThc, ncclSum, true},        {Scheme::kCnat, ncclSum, true},
  };
  return c;
}

codec::Params params(const thc_config_t& cfg, Scheme s) {
  codec::Params p;
  p.scheme = s;
  p.bits = cfg.bits;
  p.granularity = cfg.granularity;
  p.p = cfg.p;
  p.block_log2 = 10;
  p.nat_width = cfg.nat_width;
  p.nat_levels = cfg.nat_levels;
  p.dnat_norm = cfg.dnat_norm;
  return p;
}

// The GPU prelude statistics of x (the same deterministic kernel the call runs).
std::vector<float> gpu_stats(const Codec& c, const std::vector<float>& x) {
  const Layout lay = c.layout(x.size());
  DeviceCodec dc;
  EXPECT_EQ(dc.init(c), cudaSuccess);
  DevBuf<float> dx(x), ds(lay.nblocks);
  size_t tb = 0;
  EXPECT_EQ(prelude(nullptr, &tb, dc, lay, dx.get(), InType::kF32, nullptr, ds.get(), nullptr, 0, 0), cudaSuccess);
  DevBuf<uint8_t> t(tb);
  EXPECT_EQ(prelude(t.get(), &tb, dc, lay, dx.get(), InType::kF32, nullptr, ds.get(), nullptr, 0, 0), cudaSuccess);
  return ds.download();
}

class MultiRank : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(MultiRank, EveryRankMatchesHostCodec) {
  const int n = std::get<0>(GetParam());
  const int algo = std::get<1>(GetParam());
  const int width = std::get<2>(GetParam());
  const uint64_t count = 3 * kBlock + 37;
  thc_config_t cfg;
  ASSERT_EQ(thc_config_init(&cfg), THC_SUCCESS);
  cfg.seed = kSeed;
  cfg.block = kBlock;
  cfg.algo = algo;
  cfg.nat_width = width;
  cfg.chunk_bytes = 4;
  set_min_chunk_bytes(2 * 4 * kBlock);  // two blocks per chunk

  std::vector<ncclComm_t> comms(n);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  std::vector<std::vector<float>> grads(n);
  for (int r = 0; r < n; ++r) grads[r] = gaussian(count, 50 + r, 1.0f + r);
  // outputs[call][rank], residuals[call][rank]
  std::vector<std::vector<std::vector<float>>> outs(calls().size(), std::vector<std::vector<float>>(n));
  std::vector<std::vector<std::vector<float>>> res(calls().size(), std::vector<std::vector<float>>(n));
  std::vector<ncclResult_t> status(n, ncclSuccess);
  std::vector<std::string> errors(n);

  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      thcNcclComm_t h = nullptr;
      ncclResult_t st = thcNcclCommInit(comms[r], &cfg, &h);
      thcNcclEf_t ef = nullptr;
      if (st == ncclSuccess) st = thcNcclEfCreate(count, &ef);
      DevBuf<float> in(grads[r]), out(count);
      for (size_t k = 0; k < calls().size() && st == ncclSuccess; ++k) {
        const Call& c = calls()[k];
        if (c.ef && k > 0 && !calls()[k - 1].ef) thcNcclEfReset(ef, nullptr);
        st = thcAllReduceEx(in.get(), out.get(), count, ncclFloat32, c.op, static_cast<thc_scheme_t>(c.scheme), h,
                            c.ef ? ef : nullptr, nullptr);
        outs[k][r] = out.download();
        if (c.ef) {
          float* d = nullptr;
          thcNcclEfResidual(ef, &d, nullptr);
          res[k][r].assign(d, d + count);  // emulated device memory is host memory
        }
      }
      if (st != ncclSuccess) errors[r] = thcNcclGetLastError();
      status[r] = st;
      thcNcclEfDestroy(ef);
      thcNcclCommDestroy(h);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) ASSERT_EQ(status[r], ncclSuccess) << "rank " << r << ": " << errors[r];
  for (int r = 0; r < n; ++r) ncclCommDestroy(comms[r]);
  set_min_chunk_bytes(size_t{64} << 20);

  // host reference, call by call (round = call index: one handle made them all)
  std::vector<std::vector<float>> residual(n, std::vector<float>(count, 0.0f));
  for (size_t k = 0; k < calls().size(); ++k) {
    const Call& c = calls()[k];
    SCOPED_TRACE(std::string(codec::scheme_name(c.scheme)) + (c.op == ncclAvg ? " avg" : " sum") + (c.ef ? " ef" : "") +
                 " call " + std::to_string(k));
    if (c.ef && k > 0 && !calls()[k - 1].ef)
      for (auto& v : residual) std::fill(v.begin(), v.end(), 0.0f);
    const Codec cod(params(cfg, c.scheme), n);
    const Layout lay = cod.layout(count);
    std::vector<std::vector<float>> xs(n, std::vector<float>(count));
    std::vector<float> stats(lay.nblocks, 0.0f);
    for (int r = 0; r < n; ++r) {
      for (uint64_t i = 0; i < count; ++i) xs[r][i] = c.ef ? grads[r][i] + residual[r][i] : grads[r][i];
      const std::vector<float> s = gpu_stats(cod, xs[r]);
      for (uint64_t b = 0; b < lay.nblocks; ++b) stats[b] = std::max(stats[b], s[b]);
    }
    const size_t wsz = codec::int_size(cod.sum_type());
    std::vector<int64_t> total(lay.wire_count, 0);
    for (int r = 0; r < n; ++r) {
      std::vector<uint8_t> vals(lay.wire_count * wsz + 8);
      Codec::EncodeOut o;
      o.values = vals.data();
      if (c.ef) o.residual = residual[r].data();
      cod.encode(lay, 0, lay.nblocks, xs[r].data(), stats.data(), codec::CallRng{kSeed, static_cast<uint32_t>(r),
                                                                                  static_cast<uint32_t>(k)},
                 o);
      for (uint64_t i = 0; i < lay.wire_count; ++i) total[i] += codec::load_int(cod.sum_type(), vals.data(), i);
    }
    std::vector<uint8_t> sums(lay.wire_count * wsz + 8);
    for (uint64_t i = 0; i < lay.wire_count; ++i) codec::store_int(cod.sum_type(), sums.data(), i, total[i]);
    std::vector<float> want(count);
    cod.decode(lay, 0, lay.nblocks, sums.data(), stats.data(), codec::CallRng{kSeed, 0, static_cast<uint32_t>(k)}, n,
               c.op == ncclAvg, want.data());
    for (int r = 0; r < n; ++r) {
      uint64_t m = 0;
      for (uint64_t i = 0; i < count; ++i) m += fbits(outs[k][r][i]) != fbits(want[i]);
      EXPECT_EQ(m, 0u) << "rank " << r << " (" << cod.describe() << ")";
      if (c.ef) {
        uint64_t rm = 0;
        for (uint64_t i = 0; i < count; ++i) rm += fbits(res[k][r][i]) != fbits(residual[r][i]);
        EXPECT_EQ(rm, 0u) << "residual of rank " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Emu, MultiRank,
                         ::testing::Combine(::testing::Values(2, 3, 5), ::testing::Values(THC_ALGO_INT, THC_ALGO_PS),
                                            ::testing::Values(8, 16)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int, int>>& i) {
                           return "n" + std::to_string(std::get<0>(i.param)) +
                                  (std::get<1>(i.param) == THC_ALGO_PS ? "_ps" : "_int") + "_w" +
                                  std::to_string(std::get<2>(i.param));
                         });

}  // namespace
}  // namespace thc::cuda::test
