// The engine's device path (cuda/engine_device.cc): device buffers through the same engine and
// backends as host buffers. Ranks are threads over the in-process backend. Every test runs the
// same call on host buffers and on device buffers, with the same seed, and expects the same bits:
// the device kernels are bit-identical to the host codec given the same statistics, and the
// inputs are chosen so that both preludes compute the statistics exactly (dyadic values: every
// sum of squares is exact in double, in any order).
//
// Built twice, like the other CUDA tests: against the CPU emulator (emu.) and against a real
// device (gpu.; skips without one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/engine/device.h"
#include "collectives/engine/dtype.h"
#include "collectives/engine/engine.h"
#include "cuda/thc_cuda.h"
#include "tests/cuda/gpu_test_util.h"
#include "transport/inproc/inproc.h"
#if defined(THC_CUDA_EMULATION)
#include "tests/cuda/emu/cuda_emu.h"
#endif

namespace {

using thc::codec::Scheme;
using thc::engine::DType;
using thc::engine::Engine;
using thc::engine::ErrorFeedback;
using thc::transport::Reducer;
using thc::transport::Request;
using namespace thc::cuda::test;

class DevicePathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    THC_REQUIRE_DEVICE();
    thc::engine::set_device_backend(thc::cuda::engine_backend());
  }
};

thc_config_t config(int algo) {
  thc_config_t c;
  EXPECT_EQ(thc_config_init(&c), THC_SUCCESS);
  c.block = 1024;
  c.chunk_bytes = 4 * 2048;  // 2 blocks per chunk: several chunks, both pipeline slots
  c.seed = 777;
  c.algo = algo;
  return c;
}

// A backend whose aggregates leave `left_out` uncounted (as a quorum aggregator may): the sums
// are the inner backend's, the engine is told they hold n-1 contributions, without left_out
// (left_out < 0: all n). Operation number `left_behind_at` (from 0) ends in kLeftBehind, as when
// the job went on without this rank.
class PartialReducer final : public Reducer {
 public:
  PartialReducer(std::unique_ptr<Reducer> inner, int left_out, int left_behind_at = -1)
      : inner_(std::move(inner)), left_out_(left_out), left_behind_at_(left_behind_at) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string name() const override { return "partial(" + inner_->name() + ")"; }
  void max_u32(uint32_t* d, size_t n) override { inner_->max_u32(d, n); }
  std::unique_ptr<Request> start_sum(void* d, uint64_t count, thc::codec::IntType t) override {
    return wrap(inner_->start_sum(d, count, t));
  }
  std::unique_ptr<Request> start_lookup_sum(const uint8_t* p, uint64_t count, const thc::transport::LookupTable& tb,
                                            void* sums, thc::codec::IntType t,
                                            const thc::transport::DownstreamCodec* down) override {
    return wrap(inner_->start_lookup_sum(p, count, tb, sums, t, down));
  }
  bool prefers_index_form() const override { return inner_->prefers_index_form(); }
  bool partial_results() const override { return true; }

 private:
  class Req final : public Request {
   public:
    Req(std::unique_ptr<Request> r, int contributors, bool counted, bool behind)
        : r_(std::move(r)), contributors_(contributors), counted_(counted), behind_(behind) {}
    bool test() override { return r_->test(); }
    void wait() override {
      r_->wait();
      if (behind_) thc::fail(thc::Status::kLeftBehind, "the job went on without this rank");
    }
    int contributors() const override { return contributors_; }
    bool self_counted() const override { return counted_; }

   private:
    std::unique_ptr<Request> r_;
    int contributors_;
    bool counted_;
    bool behind_;
  };
  std::unique_ptr<Request> wrap(std::unique_ptr<Request> r) {
    return std::make_unique<Req>(std::move(r), left_out_ >= 0 ? size() - 1 : size(), rank() != left_out_,
                                 ops_++ == left_behind_at_);
  }
  std::unique_ptr<Reducer> inner_;
  int left_out_;
  int left_behind_at_;
  int ops_ = 0;
};

// Run body(rank, engine) on n threads over one in-process group.
void run_ranks(int n, const thc_config_t& cfg, const std::function<void(int, Engine&)>& body, int left_out = -1,
               int timeout_ms = 60000, int left_behind_at = -1) {
  auto group = thc::transport::make_inproc_group(n, timeout_ms);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      std::unique_ptr<Reducer> red = thc::transport::make_inproc_reducer(group, r);
      if (left_out >= 0 || left_behind_at >= 0)
        red = std::make_unique<PartialReducer>(std::move(red), left_out, left_behind_at);
      Engine e(std::move(red), cfg);
      body(r, e);
    });
  }
  for (auto& t : ts) t.join();
}


// Inputs of one rank as bytes of dtype t.
std::vector<uint8_t> as_bytes(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> b(v.size() * thc::engine::dtype_size(t));
  thc::engine::store_from_float(v.data(), v.size(), t, b.data(), 0);
  return b;
}

struct Case {
  Scheme scheme;
  int algo;
  DType dtype;
  uint64_t count;
  int ranks;
};

std::string name(const Case& c) {
  return std::string(thc::codec::scheme_name(c.scheme)) + (c.algo == THC_ALGO_PS ? "/ps/" : "/int/") +
         thc::engine::dtype_name(c.dtype) + "/n" + std::to_string(c.count) + "/r" + std::to_string(c.ranks);
}

// Results of `calls` successive calls per rank (bytes of dtype), on host or device buffers.
// With ef, the calls share one error-feedback state per rank; `residuals` receives the final one.
std::vector<std::vector<std::vector<uint8_t>>> run_case(const Case& c, bool device, int calls, bool ef,
                                                        bool in_place, int left_out = -1,
                                                        std::vector<std::vector<float>>* residuals = nullptr,
                                                        const std::vector<bool>* device_ranks = nullptr) {
  const thc_config_t cfg = config(c.algo);
  std::vector<std::vector<std::vector<uint8_t>>> out(c.ranks, std::vector<std::vector<uint8_t>>(calls));
  if (residuals) residuals->assign(c.ranks, {});
  const size_t esz = thc::engine::dtype_size(c.dtype);
  run_ranks(c.ranks, cfg, [&](int r, Engine& e) {
    ErrorFeedback fb;
    const bool dev = device_ranks ? (*device_ranks)[r] : device;
    for (int k = 0; k < calls; ++k) {
      const std::vector<uint8_t> in = as_bytes(dyadic(c.count, 1000 * r + k), c.dtype);
      std::vector<uint8_t>& res = out[r][k];
      res.assign(in.size(), 0xAB);
      if (dev) {
        DevBuf<uint8_t> s(in), d(in.size());
        e.allreduce(c.scheme, s.get(), in_place ? s.get() : d.get(), c.count, c.dtype, false, ef ? &fb : nullptr);
        res = in_place ? s.download() : d.download();
      } else {
        std::vector<uint8_t> s = in;
        e.allreduce(c.scheme, s.data(), in_place ? s.data() : res.data(), c.count, c.dtype, false,
                    ef ? &fb : nullptr);
        if (in_place) res = s;
      }
    }
    if (residuals && ef) {
      std::vector<float>& rr = (*residuals)[r];
      if (fb.device) {
        rr.resize(fb.count);
        cudaMemcpy(rr.data(), fb.device.get(), fb.count * sizeof(float), cudaMemcpyDeviceToHost);
      } else {
        rr.assign(fb.residual.begin(), fb.residual.end());
      }
    }
    EXPECT_EQ(e.stats().calls, static_cast<uint64_t>(calls));
  }, left_out);
  (void)esz;
  return out;
}

void expect_same(const std::vector<std::vector<std::vector<uint8_t>>>& a,
                 const std::vector<std::vector<std::vector<uint8_t>>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    ASSERT_EQ(a[r].size(), b[r].size()) << what << ": results of rank " << r;
    for (size_t k = 0; k < a[r].size(); ++k) {
      ASSERT_EQ(a[r][k].size(), b[r][k].size());
      size_t first = a[r][k].size();
      for (size_t i = 0; i < a[r][k].size(); ++i)
        if (a[r][k][i] != b[r][k][i]) {
          first = i;
          break;
        }
      EXPECT_EQ(first, a[r][k].size()) << what << ": rank " << r << " call " << k << " first differing byte " << first;
    }
  }
}

TEST_F(DevicePathTest, SameBitsAsHostBuffers) {
  const std::vector<Case> cases = {
      {Scheme::kThc, THC_ALGO_INT, DType::kF32, 9 * 1024 + 300, 3},
      {Scheme::kThc, THC_ALGO_PS, DType::kF32, 9 * 1024 + 300, 3},
      {Scheme::kUniformThc, THC_ALGO_INT, DType::kF16, 5 * 1024 + 77, 2},
      {Scheme::kCnat, THC_ALGO_INT, DType::kF32, 7 * 1024 + 5, 4},
      {Scheme::kCnat, THC_ALGO_PS, DType::kBF16, 7 * 1024 + 5, 3},
      {Scheme::kDnat, THC_ALGO_PS, DType::kF16, 3 * 1024, 3},
      {Scheme::kThc, THC_ALGO_AUTO, DType::kBF16, 100, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(name(c));
    const auto host = run_case(c, false, 2, false, false);
    const auto dev = run_case(c, true, 2, false, false);
    expect_same(host, dev, name(c));
    // every rank holds the same estimate
    for (int r = 1; r < c.ranks; ++r) EXPECT_EQ(dev[r][0], dev[0][0]) << "rank " << r;
  }
}

TEST_F(DevicePathTest, EdgeCountsAndWorldSizes) {
  // counts around the block (1024) and chunk (2 blocks) boundaries; odd world sizes
  for (int ranks : {1, 2, 5, 8})
    for (uint64_t count : {uint64_t{1}, uint64_t{63}, uint64_t{1023}, uint64_t{1025}, uint64_t{2048}, uint64_t{4097}}) {
      const Case c{ranks % 2 ? Scheme::kCnat : Scheme::kThc, ranks == 5 ? THC_ALGO_PS : THC_ALGO_AUTO, DType::kF32,
                   count, ranks};
      SCOPED_TRACE(name(c));
      expect_same(run_case(c, false, 1, false, false), run_case(c, true, 1, false, false), name(c));
    }
}

TEST_F(DevicePathTest, CountZeroIsANoOp) {
  const thc_config_t cfg = config(THC_ALGO_INT);
  run_ranks(2, cfg, [&](int, Engine& e) {
    DevBuf<float> x(16);
    e.allreduce(Scheme::kThc, x.get(), x.get(), 0, DType::kF32, false, nullptr);
    EXPECT_EQ(e.stats().calls, 0u);
  });
}

TEST_F(DevicePathTest, InPlace) {
  const Case c{Scheme::kThc, THC_ALGO_INT, DType::kF32, 6 * 1024 + 1, 3};
  expect_same(run_case(c, false, 1, false, true), run_case(c, true, 1, false, true), "in place");
  expect_same(run_case(c, false, 1, false, false), run_case(c, true, 1, false, true), "in place vs out of place");
}

TEST_F(DevicePathTest, ErrorFeedbackMatchesHost) {
  for (const Case& c : {Case{Scheme::kThc, THC_ALGO_INT, DType::kF32, 4 * 1024 + 9, 3},
                        Case{Scheme::kCnat, THC_ALGO_PS, DType::kF16, 4 * 1024 + 9, 3}}) {
    SCOPED_TRACE(name(c));
    std::vector<std::vector<float>> rh, rd;
    const auto host = run_case(c, false, 3, true, false, -1, &rh);
    const auto dev = run_case(c, true, 3, true, false, -1, &rd);
    expect_same(host, dev, "results with error feedback");
    for (int r = 0; r < c.ranks; ++r) {
      ASSERT_EQ(rh[r].size(), c.count);
      ASSERT_EQ(rd[r].size(), c.count);
      EXPECT_EQ(std::memcmp(rh[r].data(), rd[r].data(), c.count * 4), 0) << "residual of rank " << r;
      double e2 = 0;
      for (float v : rd[r]) e2 += double(v) * v;
      EXPECT_GT(e2, 0.0) << "the residual was never written";
    }
  }
}

TEST_F(DevicePathTest, PartialAggregationMatchesHost) {
  // Rank 1 is left out of every aggregate: its residual must keep its whole contribution, and
  // SUM is scaled from the counted workers' mean.
  for (bool in_place : {false, true}) {
    const Case c{Scheme::kThc, THC_ALGO_INT, DType::kF16, 5 * 1024 + 3, 3};
    std::vector<std::vector<float>> rh, rd;
    const auto host = run_case(c, false, 2, true, in_place, 1, &rh);
    const auto dev = run_case(c, true, 2, true, in_place, 1, &rd);
    expect_same(host, dev, "partial aggregation");
    for (int r = 0; r < c.ranks; ++r)
      EXPECT_EQ(std::memcmp(rh[r].data(), rd[r].data(), c.count * 4), 0) << "residual of rank " << r;
  }
}

TEST_F(DevicePathTest, HostAndDeviceRanksShareACall) {
  const Case c{Scheme::kCnat, THC_ALGO_INT, DType::kF32, 3 * 1024 + 50, 3};
  const std::vector<bool> mixed = {true, false, true};
  expect_same(run_case(c, false, 2, false, false), run_case(c, false, 2, false, false, -1, nullptr, &mixed),
              "mixed host/device ranks");
}

TEST_F(DevicePathTest, StatsCountTheWire) {
  const Case c{Scheme::kThc, THC_ALGO_PS, DType::kF32, 8 * 1024, 2};
  const thc_config_t cfg = config(c.algo);
  run_ranks(2, cfg, [&](int r, Engine& e) {
    DevBuf<float> x(dyadic(c.count, r));
    e.allreduce(c.scheme, x.get(), x.get(), c.count, DType::kF32, true, nullptr);
    EXPECT_EQ(e.stats().elements, c.count);
    EXPECT_EQ(e.stats().last_algo, thc::engine::Algo::kPs);
    EXPECT_EQ(e.stats().wire_bytes_up, c.count * 4 / 8);  // 4-bit indices
  });
}

TEST_F(DevicePathTest, NonFiniteInputFailsOnEveryRank) {
  const thc_config_t cfg = config(THC_ALGO_INT);
  std::vector<int> status(3, -1);
  run_ranks(3, cfg, [&](int r, Engine& e) {
    std::vector<float> v = dyadic(4096, r);
    if (r == 2) v[1234] = std::numeric_limits<float>::quiet_NaN();
    DevBuf<float> x(v);
    try {
      e.allreduce(Scheme::kThc, x.get(), x.get(), v.size(), DType::kF32, false, nullptr);
      status[r] = 0;
    } catch (const thc::Error& err) {
      status[r] = static_cast<int>(err.status());
    }
    // the communicator stays usable
    DevBuf<float> y(dyadic(4096, r));
    EXPECT_NO_THROW(e.allreduce(Scheme::kThc, y.get(), y.get(), 4096, DType::kF32, false, nullptr));
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(status[r], static_cast<int>(thc::Status::kNonFinite)) << "rank " << r;
}

#if defined(THC_CUDA_EMULATION)
// A rank whose device path fails before the first exchange (here the device has no memory for the
// call's workspace) still takes part in it: the others fail the call with its status and its rank
// named instead of waiting out the backend's timeout (kTimeout without the fix), the call counts
// on every rank and every communicator stays usable. The emulator fails the allocations.
TEST_F(DevicePathTest, DeviceFailureBeforeTheFirstExchangeFailsEveryRankAtOnce) {
  for (const int algo : {THC_ALGO_INT, THC_ALGO_PS}) {
    const thc_config_t cfg = config(algo);
    std::vector<int> status(3, -1);
    std::vector<std::string> what(3);
    run_ranks(3, cfg, [&](int r, Engine& e) {
      DevBuf<float> x(dyadic(4096, r));
      if (r == 1) thc_emu::fail_allocations(true);
      try {
        e.allreduce(Scheme::kThc, x.get(), x.get(), 4096, DType::kF32, false, nullptr);
        status[r] = 0;
      } catch (const thc::Error& err) {
        status[r] = static_cast<int>(err.status());
        what[r] = err.what();
      }
      thc_emu::fail_allocations(false);
      DevBuf<float> y(dyadic(4096, r));
      EXPECT_NO_THROW(e.allreduce(Scheme::kThc, y.get(), y.get(), 4096, DType::kF32, false, nullptr)) << "rank " << r;
    }, -1, 20000);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(status[r], static_cast<int>(thc::Status::kOutOfMemory)) << "algo " << algo << " rank " << r << ": " << what[r];
      if (r != 1) {
        EXPECT_NE(what[r].find("rank 1"), std::string::npos) << what[r];
      }
    }
  }
}
#endif

// The status f throws (kSuccess if none).
thc::Status status_of(const std::function<void()>& f) {
  try {
    f();
    return thc::Status::kSuccess;
  } catch (const thc::Error& err) {
    return err.status();
  }
}

TEST_F(DevicePathTest, BadArgumentsAreRefused) {
  const thc_config_t cfg = config(THC_ALGO_INT);
  run_ranks(1, cfg, [&](int, Engine& e) {
    DevBuf<float> d(2048);
    std::vector<float> h(2048, 1.0f);
    EXPECT_EQ(status_of([&] { e.allreduce(Scheme::kThc, d.get(), h.data(), 2048, DType::kF32, false, nullptr); }),
              thc::Status::kInvalidArgument);
    EXPECT_EQ(status_of([&] { e.allreduce(Scheme::kThc, h.data(), d.get(), 2048, DType::kF32, false, nullptr); }),
              thc::Status::kInvalidArgument);
    DevBuf<double> d64(1024);
    EXPECT_EQ(status_of([&] { e.allreduce(Scheme::kThc, d64.get(), d64.get(), 1024, DType::kF64, false, nullptr); }),
              thc::Status::kUnsupported);
    // an error-feedback state bound to host buffers is not silently reused on device buffers
    ErrorFeedback fb;
    EXPECT_EQ(status_of([&] { e.allreduce(Scheme::kThc, h.data(), h.data(), 2048, DType::kF32, false, &fb); }),
              thc::Status::kSuccess);
    EXPECT_EQ(status_of([&] { e.allreduce(Scheme::kThc, d.get(), d.get(), 2048, DType::kF32, false, &fb); }),
              thc::Status::kInvalidArgument);
    fb.reset();
    EXPECT_EQ(status_of([&] { e.allreduce(Scheme::kThc, d.get(), d.get(), 2048, DType::kF32, false, &fb); }),
              thc::Status::kSuccess);
    EXPECT_EQ(status_of([&] { e.allreduce(Scheme::kThc, d.get(), d.get(), 1024, DType::kF32, false, &fb); }),
              thc::Status::kInvalidArgument);
  });
}

// ---- groups, reduce-scatter and allgather on device buffers (the engine's stream path): the
// device codec encodes and decodes each tensor where it lives, only codes cross to the host, and
// every result, residual and statistic is the bits of the same call on host buffers.

enum class StreamOp { kGroup, kReduceScatter, kAllgather };

struct StreamCase {
  StreamOp op;
  Scheme scheme;
  int algo;
  int ranks;
  bool ef;
  bool in_place;
};

std::string name(const StreamCase& c) {
  const char* op = c.op == StreamOp::kGroup           ? "group"
                   : c.op == StreamOp::kReduceScatter ? "reduce_scatter"
                                                      : "allgather";
  return std::string(op) + "/" + thc::codec::scheme_name(c.scheme) + (c.algo == THC_ALGO_PS ? "/ps" : "/int") + "/r" +
         std::to_string(c.ranks) + (c.ef ? "/ef" : "") + (c.in_place ? "/in_place" : "");
}

// A group's tensors: several dtypes, sizes that end inside a block, one smaller than a block.
struct Member {
  uint64_t count;
  DType dtype;
};
const std::vector<Member> kMembers = {
    {3 * 1024 + 5, DType::kF32}, {1024, DType::kF16}, {2 * 1024 + 700, DType::kBF16}, {17, DType::kF32}};

// Shard counts of reduce-scatter / allgather for n ranks (one empty shard when n > 2).
std::vector<uint64_t> shard_counts(int n, DType t) {
  std::vector<uint64_t> c;
  for (int q = 0; q < n; ++q) c.push_back(q == 1 && n > 2 ? 0 : (q + 1) * 1024 + 37 * q + (t == DType::kF32 ? 3 : 0));
  return c;
}

struct StreamResult {
  std::vector<std::vector<std::vector<uint8_t>>> out;  // [rank][call * members + member]
  std::vector<std::vector<std::vector<float>>> res;    // [rank][member] final residuals
  std::vector<thc::engine::EngineStats> stats;
};

std::vector<float> residual_of(const ErrorFeedback& fb) {
  if (!fb.device) return std::vector<float>(fb.residual.begin(), fb.residual.end());
  std::vector<float> r(fb.count);
  cudaMemcpy(r.data(), fb.device.get(), fb.count * sizeof(float), cudaMemcpyDeviceToHost);
  return r;
}

// `calls` successive calls of c per rank, on device buffers where device(rank, member) says so.
StreamResult run_stream_case(const StreamCase& c, const std::function<bool(int, size_t)>& device, int calls = 2,
                             int left_out = -1, long chunk_bytes = 0) {
  thc_config_t cfg = config(c.algo);
  if (chunk_bytes) cfg.chunk_bytes = chunk_bytes;
  const int n = c.ranks;
  StreamResult R;
  R.out.assign(n, {});
  R.res.assign(n, {});
  R.stats.resize(n);
  run_ranks(n, cfg, [&](int r, Engine& e) {
    try {
      if (c.op == StreamOp::kGroup) {
        std::vector<ErrorFeedback> fb(kMembers.size());
        for (int k = 0; k < calls; ++k) {
          std::vector<std::vector<uint8_t>> in(kMembers.size());
          std::vector<std::vector<uint8_t>> hs(kMembers.size()), hr(kMembers.size());
          std::vector<std::unique_ptr<DevBuf<uint8_t>>> ds(kMembers.size()), dr(kMembers.size());
          std::vector<thc::engine::Tensor> ts(kMembers.size());
          for (size_t i = 0; i < kMembers.size(); ++i) {
            const Member& m = kMembers[i];
            in[i] = as_bytes(dyadic(m.count, 1000 * r + 10 * k + static_cast<uint32_t>(i)), m.dtype);
            ts[i].count = m.count;
            ts[i].dtype = m.dtype;
            ts[i].ef = c.ef ? &fb[i] : nullptr;
            if (device(r, i)) {
              ds[i] = std::make_unique<DevBuf<uint8_t>>(in[i]);
              dr[i] = std::make_unique<DevBuf<uint8_t>>(in[i].size());
              ts[i].send = ds[i]->get();
              ts[i].recv = c.in_place ? ds[i]->get() : dr[i]->get();
            } else {
              hs[i] = in[i];
              hr[i].assign(in[i].size(), 0xAB);
              ts[i].send = hs[i].data();
              ts[i].recv = c.in_place ? hs[i].data() : hr[i].data();
            }
          }
          e.allreduce_group(c.scheme, ts.data(), ts.size(), false);
          for (size_t i = 0; i < kMembers.size(); ++i) {
            if (device(r, i)) {
              R.out[r].push_back(c.in_place ? ds[i]->download() : dr[i]->download());
            } else {
              R.out[r].push_back(c.in_place ? hs[i] : hr[i]);
            }
          }
        }
        for (const ErrorFeedback& f : fb) R.res[r].push_back(residual_of(f));
      } else {
        const bool rs = c.op == StreamOp::kReduceScatter;
        const DType t = c.algo == THC_ALGO_PS ? DType::kF16 : DType::kF32;
        const size_t esz = thc::engine::dtype_size(t);
        const std::vector<uint64_t> counts = shard_counts(n, t);
        uint64_t total = 0;
        for (uint64_t v : counts) total += v;
        ErrorFeedback fb;
        const bool dev = device(r, 0);
        for (int k = 0; k < calls; ++k) {
          const uint64_t in_count = rs ? total : counts[r];
          const uint64_t out_count = rs ? counts[r] : total;
          const std::vector<uint8_t> in = as_bytes(dyadic(in_count, 500 * r + k), t);
          // in place: recv holds the input (reduce-scatter: the whole vector; allgather: rank r's
          // shard at its offset in the whole) and receives the result at its front / everywhere.
          uint64_t off = 0;
          for (int q = 0; q < r; ++q) off += counts[q];
          std::vector<uint8_t> recv_init(std::max(in_count, out_count) * esz, 0xCD);
          if (c.in_place) std::memcpy(recv_init.data() + (rs ? 0 : off * esz), in.data(), in.size());
          ErrorFeedback* const f = c.ef ? &fb : nullptr;
          auto call = [&](const void* send, void* recv) {
            if (rs) {
              e.reduce_scatter(c.scheme, c.in_place ? nullptr : send, recv, counts.data(), t, false, f);
            } else {
              e.allgather(c.scheme, c.in_place ? nullptr : send, recv, counts.data(), t, f);
            }
          };
          std::vector<uint8_t> got = recv_init;
          if (dev) {
            DevBuf<uint8_t> s(in), d(recv_init);
            call(s.get(), d.get());
            got = d.download();
          } else {
            std::vector<uint8_t> s = in;
            call(s.data(), got.data());
          }
          got.resize(out_count * esz);
          R.out[r].push_back(got);
        }
        R.res[r].push_back(residual_of(fb));
      }
    } catch (const thc::Error& err) {
      ADD_FAILURE() << "rank " << r << ": " << err.what();
    }
    R.stats[r] = e.stats();
  }, left_out);
  return R;
}

void expect_same(const StreamResult& a, const StreamResult& b, const std::string& what) {
  expect_same(a.out, b.out, what);
  for (size_t r = 0; r < a.res.size(); ++r) {
    ASSERT_EQ(a.res[r].size(), b.res[r].size());
    for (size_t i = 0; i < a.res[r].size(); ++i) {
      ASSERT_EQ(a.res[r][i].size(), b.res[r][i].size()) << what << ": residual " << i << " of rank " << r;
      EXPECT_TRUE(a.res[r][i] == b.res[r][i]) << what << ": residual " << i << " of rank " << r;
    }
    EXPECT_EQ(a.stats[r].calls, b.stats[r].calls) << what;
    EXPECT_EQ(a.stats[r].elements, b.stats[r].elements) << what;
    EXPECT_EQ(a.stats[r].wire_bytes_up, b.stats[r].wire_bytes_up) << what;
    EXPECT_EQ(a.stats[r].wire_bytes_down, b.stats[r].wire_bytes_down) << what;
    EXPECT_EQ(a.stats[r].groups, b.stats[r].groups) << what;
  }
}

const auto kAllHost = [](int, size_t) { return false; };
const auto kAllDevice = [](int, size_t) { return true; };

TEST_F(DevicePathTest, GroupsReduceScatterAndAllgatherOnDeviceBuffersGiveTheHostBits) {
  std::vector<StreamCase> cases;
  for (StreamOp op : {StreamOp::kGroup, StreamOp::kReduceScatter, StreamOp::kAllgather})
    for (int algo : {THC_ALGO_PS, THC_ALGO_INT})
      for (bool in_place : {false, true}) {
        const bool ef = op != StreamOp::kAllgather || algo == THC_ALGO_PS;
        cases.push_back({op, algo == THC_ALGO_PS ? Scheme::kThc : Scheme::kCnat, algo, 3, ef, in_place});
      }
  cases.push_back({StreamOp::kGroup, Scheme::kThc, THC_ALGO_PS, 2, false, false});
  cases.push_back({StreamOp::kReduceScatter, Scheme::kThc, THC_ALGO_INT, 4, true, false});
  for (const StreamCase& c : cases) {
    SCOPED_TRACE(name(c));
    const StreamResult host = run_stream_case(c, kAllHost);
    const StreamResult dev = run_stream_case(c, kAllDevice);
    ASSERT_NO_FATAL_FAILURE(expect_same(host, dev, "device buffers"));
    if (c.ef && !dev.res[0].empty()) {
      double e2 = 0;
      for (float v : dev.res[0][0]) e2 += double(v) * v;
      EXPECT_GT(e2, 0.0) << "the residual was never written";
    }
  }
}

TEST_F(DevicePathTest, HostAndDeviceBuffersMixInOneGroupAndAcrossRanks) {
  for (int algo : {THC_ALGO_PS, THC_ALGO_INT}) {
    const StreamCase g{StreamOp::kGroup, Scheme::kThc, algo, 3, true, false};
    SCOPED_TRACE(name(g));
    const StreamResult host = run_stream_case(g, kAllHost);
    // tensors 1 and 3 on the device on every rank, the others on the host (a chunk holds tensor
    // 1 on the device and tensor 2 on the host)
    expect_same(host, run_stream_case(g, [](int, size_t i) { return i == 1 || i == 3; }), "mixed tensors");
    // chunks of 8 blocks: one chunk holds tensor 0 on the device, 1 on the host, 2 on the device
    const long big = 4 * 8 * 1024;
    expect_same(run_stream_case(g, kAllHost, 2, -1, big),
                run_stream_case(g, [](int, size_t i) { return i % 2 == 0; }, 2, -1, big), "mixed tensors in one chunk");
    // rank 1 passes host buffers, the others device buffers
    expect_same(host, run_stream_case(g, [](int r, size_t) { return r != 1; }), "mixed ranks");
    const StreamCase rs{StreamOp::kReduceScatter, Scheme::kCnat, algo, 3, true, true};
    expect_same(run_stream_case(rs, kAllHost), run_stream_case(rs, [](int r, size_t) { return r == 2; }),
                "reduce-scatter, mixed ranks");
  }
}

TEST_F(DevicePathTest, StreamCallsUnderPartialAggregationMatchHost) {
  // Rank 1 is left out of every aggregate: its residuals keep its whole contribution, SUM is
  // scaled from the counted workers' mean.
  for (StreamOp op : {StreamOp::kGroup, StreamOp::kReduceScatter}) {
    for (bool in_place : {false, true}) {
      const StreamCase c{op, Scheme::kThc, THC_ALGO_INT, 3, true, in_place};
      SCOPED_TRACE(name(c));
      expect_same(run_stream_case(c, kAllHost, 2, 1), run_stream_case(c, kAllDevice, 2, 1), "partial aggregation");
    }
  }
}

// A rank told at the end of its second operation that the job went on without it (one rank:
// nothing waits for it) keeps its whole contribution from there on in the residuals: the kept
// x + e of the chunks in flight, x added to e for the chunks never encoded. The device residuals
// are the host ones.
TEST_F(DevicePathTest, ARankLeftBehindInAStreamCallKeepsItsContributionOnTheDevice) {
  const thc_config_t cfg = config(THC_ALGO_PS);
  for (StreamOp op : {StreamOp::kGroup, StreamOp::kReduceScatter}) {
    std::vector<std::vector<float>> residuals[2];
    for (int device = 0; device < 2; ++device) {
      run_ranks(1, cfg, [&](int, Engine& e) {
        std::vector<ErrorFeedback> fb(kMembers.size());
        std::vector<std::vector<uint8_t>> host(kMembers.size());
        std::vector<std::unique_ptr<DevBuf<uint8_t>>> dev(kMembers.size());
        std::vector<thc::engine::Tensor> ts;
        for (size_t i = 0; i < kMembers.size(); ++i) {
          host[i] = as_bytes(dyadic(kMembers[i].count, 31 + static_cast<uint32_t>(i)), kMembers[i].dtype);
          dev[i] = std::make_unique<DevBuf<uint8_t>>(host[i]);
          void* p = device ? static_cast<void*>(dev[i]->get()) : host[i].data();
          ts.push_back({p, p, kMembers[i].count, kMembers[i].dtype, &fb[i]});
        }
        thc::Status st = thc::Status::kSuccess;
        try {
          if (op == StreamOp::kGroup) {
            e.allreduce_group(Scheme::kThc, ts.data(), ts.size(), false);
          } else {
            // one rank: its shard is the whole vector (member 0, float32)
            const uint64_t counts[1] = {kMembers[0].count};
            std::vector<uint8_t> out(kMembers[0].count * 4);
            DevBuf<uint8_t> dout(out.size());
            e.reduce_scatter(Scheme::kThc, ts[0].send, device ? static_cast<void*>(dout.get()) : out.data(), counts,
                             DType::kF32, false, &fb[0]);
          }
        } catch (const thc::Error& err) {
          st = err.status();
        }
        EXPECT_EQ(st, thc::Status::kLeftBehind);
        for (const ErrorFeedback& f : fb) residuals[device].push_back(residual_of(f));
      }, -1, 60000, 1);
    }
    ASSERT_EQ(residuals[0].size(), residuals[1].size());
    for (size_t i = 0; i < residuals[0].size(); ++i)
      EXPECT_TRUE(residuals[0][i] == residuals[1][i]) << (op == StreamOp::kGroup ? "group" : "reduce-scatter")
                                                      << ": residual " << i;
    // the residual holds more than the first chunk's error: x itself from the second chunk on
    double e2 = 0;
    for (float v : residuals[1][0]) e2 += double(v) * v;
    EXPECT_GT(e2, 10.0);
  }
}

TEST_F(DevicePathTest, StreamCallsOnDeviceBuffersRefuseWhatTheyCannotDo) {
  const thc_config_t cfg = config(THC_ALGO_INT);
  std::vector<int> status(2, -1);
  run_ranks(2, cfg, [&](int r, Engine& e) {
    // float64 device tensors: the GPU codec takes float32, float16 and bfloat16 (on every rank)
    DevBuf<double> d64(1000);
    std::vector<double> h64(1000, 1.0);
    thc::engine::Tensor t{r == 0 ? static_cast<const void*>(d64.get()) : h64.data(),
                          r == 0 ? static_cast<void*>(d64.get()) : h64.data(), 1000, DType::kF64, nullptr};
    EXPECT_EQ(status_of([&] { e.allreduce_group(Scheme::kThc, &t, 1, false); }), thc::Status::kUnsupported)
        << "rank " << r;
    // send on the device, recv on the host
    DevBuf<float> d(2048);
    std::vector<float> h(2048, 1.0f);
    thc::engine::Tensor u{d.get(), r == 0 ? static_cast<void*>(h.data()) : d.get(), 2048, DType::kF32, nullptr};
    EXPECT_EQ(status_of([&] { e.allreduce_group(Scheme::kThc, &u, 1, false); }), thc::Status::kInvalidArgument)
        << "rank " << r;
    // an error-feedback state bound to host buffers is not reused on device buffers
    ErrorFeedback fb;
    thc::engine::Tensor th{h.data(), h.data(), 2048, DType::kF32, &fb};
    EXPECT_EQ(status_of([&] { e.allreduce_group(Scheme::kThc, &th, 1, false); }), thc::Status::kSuccess);
    thc::engine::Tensor td{d.get(), d.get(), 2048, DType::kF32, &fb};
    EXPECT_EQ(status_of([&] { e.allreduce_group(Scheme::kThc, &td, 1, false); }), thc::Status::kInvalidArgument);
    // and the communicator goes on
    EXPECT_EQ(status_of([&] { e.allreduce_group(Scheme::kThc, &u, 0, false); }), thc::Status::kSuccess);
    thc::engine::Tensor ok{d.get(), d.get(), 2048, DType::kF32, nullptr};
    EXPECT_EQ(status_of([&] { e.allreduce_group(Scheme::kThc, &ok, 1, false); }), thc::Status::kSuccess);
    status[r] = 0;
  });
  EXPECT_EQ(status, std::vector<int>(2, 0));
}

// Run body(rank, comm) on n threads, each with a C API communicator of one in-process group.
void run_comms(int n, const thc_config_t& cfg, const std::function<void(int, thc_comm_t)>& body) {
  thc_inproc_group_t g;
  ASSERT_EQ(thc_inproc_group_create(n, &g), THC_SUCCESS);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      thc_comm_t comm;
      ASSERT_EQ(thc_comm_create_inproc(g, r, &cfg, &comm), THC_SUCCESS);
      body(r, comm);
      thc_comm_destroy(comm);
    });
  }
  for (auto& t : ts) t.join();
  thc_inproc_group_destroy(g);
}

// Nonblocking calls on device buffers (C API, in-process communicators): the call runs on the
// communicator's progress thread, which selects the buffers' device itself, and returns the bits
// of the same blocking call on host buffers, as does a group of one device tensor.
TEST_F(DevicePathTest, NonblockingOnDeviceBuffersMatchesBlockingOnHost) {
  const int n = 3;
  const uint64_t count = 5 * 1024 + 3;
  const thc_config_t cfg = config(THC_ALGO_PS);
  std::vector<std::vector<uint8_t>> host(n), dev(n);
  std::vector<thc_status_t> group_st(n, THC_SUCCESS);
  for (int device = 0; device < 2; ++device) {
    run_comms(n, cfg, [&](int r, thc_comm_t comm) {
      const std::vector<uint8_t> in = as_bytes(dyadic(count, 77 + r), DType::kF16);
      if (device) {
        DevBuf<uint8_t> s(in), d(in.size());
        thc_request_t q;
        EXPECT_EQ(thc_iallreduce_scheme(THC_SCHEME_THC, s.get(), d.get(), count, THC_FLOAT16, THC_OP_SUM, comm, nullptr,
                                        &q),
                  THC_SUCCESS);
        EXPECT_EQ(thc_wait(&q), THC_SUCCESS) << thc_last_error();
        dev[r] = d.download();
        thc_tensor_t t{s.get(), d.get(), count, THC_FLOAT16, nullptr};
        group_st[r] = thc_allreduce_group(THC_SCHEME_THC, &t, 1, THC_OP_SUM, comm);
      } else {
        host[r].assign(in.size(), 0);
        EXPECT_EQ(thc_allreduce_scheme(THC_SCHEME_THC, in.data(), host[r].data(), count, THC_FLOAT16, THC_OP_SUM, comm,
                                       nullptr),
                  THC_SUCCESS);
      }
    });
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(dev[r], host[r]) << "rank " << r;
    EXPECT_EQ(group_st[r], THC_SUCCESS) << "rank " << r;
  }
}

// Nonblocking allreduces on device buffers started back to back are fused into one group (the
// progress thread's fusion), and each returns the bits of its own blocking call on host buffers.
TEST_F(DevicePathTest, NonblockingDeviceCallsFuseAndGiveTheSeparateCallsBits) {
  const int n = 3;
  const std::vector<Member> calls = {{3000, DType::kF32}, {5 * 1024 + 1, DType::kF16}, {700, DType::kF32},
                                     {2048, DType::kBF16}};
  thc_config_t cfg = config(THC_ALGO_PS);
  cfg.fusion_bytes = 1 << 20;
  cfg.fusion_cycle_ms = 200;  // the four starts land in one cycle
  std::vector<std::vector<std::vector<uint8_t>>> out[2];
  std::vector<uint64_t> groups(n, 0);
  for (int device = 0; device < 2; ++device) {
    out[device].assign(n, {});
    run_comms(n, cfg, [&](int r, thc_comm_t comm) {
      std::vector<std::vector<uint8_t>> in;
      std::vector<std::unique_ptr<DevBuf<uint8_t>>> bufs;
      std::vector<thc_request_t> qs(calls.size(), THC_REQUEST_NULL);
      for (size_t i = 0; i < calls.size(); ++i) {
        in.push_back(as_bytes(dyadic(calls[i].count, 300 * r + static_cast<uint32_t>(i)), calls[i].dtype));
        const thc_dtype_t dt = calls[i].dtype == DType::kF32   ? THC_FLOAT32
                               : calls[i].dtype == DType::kF16 ? THC_FLOAT16
                                                               : THC_BFLOAT16;
        if (device) {
          bufs.push_back(std::make_unique<DevBuf<uint8_t>>(in[i]));
          EXPECT_EQ(thc_iallreduce_scheme(THC_SCHEME_THC, THC_IN_PLACE, bufs[i]->get(), calls[i].count, dt, THC_OP_SUM,
                                          comm, nullptr, &qs[i]),
                    THC_SUCCESS);
        } else {
          EXPECT_EQ(thc_allreduce_scheme(THC_SCHEME_THC, THC_IN_PLACE, in[i].data(), calls[i].count, dt, THC_OP_SUM,
                                         comm, nullptr),
                    THC_SUCCESS);
        }
      }
      for (size_t i = 0; i < calls.size(); ++i) {
        if (device) {
          EXPECT_EQ(thc_wait(&qs[i]), THC_SUCCESS) << thc_last_error();
          out[device][r].push_back(bufs[i]->download());
        } else {
          out[device][r].push_back(in[i]);
        }
      }
      thc_stats_t st;
      ASSERT_EQ(thc_comm_stats(comm, &st), THC_SUCCESS);
      if (device) groups[r] = st.groups;
    });
  }
  expect_same(out[0], out[1], "fused device calls");
  for (int r = 0; r < n; ++r) EXPECT_GE(groups[r], 1u) << "rank " << r << ": no call was fused";
}

}  // namespace
