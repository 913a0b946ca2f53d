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
// are the inner backend's, the engine is told they hold n-1 contributions, without left_out.
class PartialReducer final : public Reducer {
 public:
  PartialReducer(std::unique_ptr<Reducer> inner, int left_out) : inner_(std::move(inner)), left_out_(left_out) {}
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
  std::unique_ptr<Request> wrap(std::unique_ptr<Request> r) {
    return std::make_unique<Req>(std::move(r), size(), rank() != left_out_);
  }
  std::unique_ptr<Reducer> inner_;
  int left_out_;
};

// Run body(rank, engine) on n threads over one in-process group.
void run_ranks(int n, const thc_config_t& cfg, const std::function<void(int, Engine&)>& body, int left_out = -1,
               int timeout_ms = 60000) {
  auto group = thc::transport::make_inproc_group(n, timeout_ms);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      std::unique_ptr<Reducer> red = thc::transport::make_inproc_reducer(group, r);
      if (left_out >= 0) red = std::make_unique<PartialReducer>(std::move(red), left_out);
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
        rr = fb.residual;
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
  for (size_t r = 0; r < a.size(); ++r)
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

TEST_F(DevicePathTest, BadArgumentsAreRefused) {
  const thc_config_t cfg = config(THC_ALGO_INT);
  run_ranks(1, cfg, [&](int, Engine& e) {
    DevBuf<float> d(2048);
    std::vector<float> h(2048, 1.0f);
    auto status_of = [](const std::function<void()>& f) {
      try {
        f();
        return thc::Status::kSuccess;
      } catch (const thc::Error& err) {
        return err.status();
      }
    };
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

// Nonblocking calls on device buffers (C API, in-process communicators): the call runs on the
// communicator's progress thread, which selects the buffers' device itself, and returns the bits
// of the same blocking call on host buffers. Groups refuse device buffers on every rank alike.
TEST_F(DevicePathTest, NonblockingOnDeviceBuffersMatchesBlockingOnHost) {
  const int n = 3;
  const uint64_t count = 5 * 1024 + 3;
  const thc_config_t cfg = config(THC_ALGO_PS);
  std::vector<std::vector<uint8_t>> host(n), dev(n);
  std::vector<thc_status_t> group_st(n, THC_SUCCESS);
  for (int device = 0; device < 2; ++device) {
    thc_inproc_group_t g;
    ASSERT_EQ(thc_inproc_group_create(n, &g), THC_SUCCESS);
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] {
        thc_comm_t comm;
        ASSERT_EQ(thc_comm_create_inproc(g, r, &cfg, &comm), THC_SUCCESS);
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
        thc_comm_destroy(comm);
      });
    }
    for (auto& t : ts) t.join();
    thc_inproc_group_destroy(g);
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(dev[r], host[r]) << "rank " << r;
    EXPECT_EQ(group_st[r], THC_ERR_UNSUPPORTED) << "rank " << r;
  }
}

}  // namespace
