// The engine through the C API on in-process workers (threads).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/capi/capi.h"
#include "collectives/engine/dtype.h"
#include "thc/thc.h"

namespace {

thc_config_t base_config() {
  thc_config_t c;
  EXPECT_EQ(thc_config_init(&c), THC_SUCCESS);
  c.block = 1024;
  c.chunk_bytes = 4 * 4096;  // 4 blocks per chunk: several chunks in flight in these tests
  c.seed = 12345;
  return c;
}

// Run fn(rank, comm) on n threads; returns each rank's status.
std::vector<thc_status_t> run_workers(int n, const thc_config_t& cfg,
                                      const std::function<thc_status_t(int, thc_comm_t)>& fn,
                                      const std::vector<thc_config_t>* per_rank = nullptr) {
  thc_inproc_group_t g;
  EXPECT_EQ(thc_inproc_group_create(n, &g), THC_SUCCESS);
  std::vector<thc_status_t> st(n, THC_SUCCESS);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      thc_comm_t comm;
      const thc_config_t& c = per_rank ? (*per_rank)[r] : cfg;
      thc_status_t s = thc_comm_create_inproc(g, r, &c, &comm);
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

double nmse(const std::vector<float>& est, const std::vector<double>& ref) {
  double e = 0, r = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e += (est[i] - ref[i]) * (est[i] - ref[i]);
    r += ref[i] * ref[i];
  }
  return r == 0 ? e : e / r;
}

struct Case {
  int n;
  size_t count;
};

class EngineWorld : public ::testing::TestWithParam<int> {};

TEST_P(EngineWorld, AllSchemesAllCountsMatchExactSumWithinCodecBound) {
  const int n = GetParam();
  const thc_config_t cfg = base_config();
  for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_UHC, THC_SCHEME_CNAT, THC_SCHEME_DNAT}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1023}, size_t{1025}, size_t{20000}}) {
      std::vector<std::vector<float>> in(n), out(n);
      std::vector<double> exact(count, 0.0);
      for (int r = 0; r < n; ++r) {
        in[r] = gaussian(count, 17 + r);
        for (size_t i = 0; i < count; ++i) exact[i] += in[r][i];
      }
      auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
        out[r].assign(count, -1.0f);
        return thc_allreduce_scheme(scheme, in[r].data(), out[r].data(), count, THC_FLOAT32, THC_OP_SUM, comm,
                                    nullptr);
      });
      for (int r = 0; r < n; ++r) ASSERT_EQ(st[r], THC_SUCCESS) << thc_last_error();
      if (count == 0) continue;
      for (int r = 1; r < n; ++r) ASSERT_EQ(out[r], out[0]) << "ranks disagree";
      // Bounds: THC b=4 ~0.015 + truncation per worker, divided by n for independent noise;
      // uniform THC ~0.1; Cnat <= 1/8. Tiny counts are dominated by one element: loose bound.
      const double bound = count < 64 ? 2.0 : (scheme == THC_SCHEME_UHC ? 0.25 : 0.13);
      EXPECT_LT(nmse(out[0], exact), bound) << "scheme " << scheme << " n=" << n << " count=" << count;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, EngineWorld, ::testing::Values(1, 2, 3, 5, 8));

TEST(Engine, AvgIsSumOverN) {
  const int n = 3;
  thc_config_t cfg = base_config();
  const size_t count = 5000;
  std::vector<std::vector<float>> sum(n), avg(n);
  auto in = gaussian(count, 1);
  run_workers(n, cfg, [&](int r, thc_comm_t comm) {
    sum[r].resize(count);
    return thc_allreduce(in.data(), sum[r].data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
  });
  run_workers(n, cfg, [&](int r, thc_comm_t comm) {
    avg[r].resize(count);
    return thc_allreduce(in.data(), avg[r].data(), count, THC_FLOAT32, THC_OP_AVG, comm, nullptr);
  });
  // Same seed, same round: same codes, so AVG is exactly SUM / n up to float rounding.
  for (size_t i = 0; i < count; ++i) ASSERT_NEAR(avg[0][i] * n, sum[0][i], 1e-4 * (1 + std::fabs(sum[0][i])));
}

TEST(Engine, InPlaceEqualsOutOfPlace) {
  const int n = 4;
  const thc_config_t cfg = base_config();
  const size_t count = 9000;
  std::vector<std::vector<float>> a(n), b(n);
  for (int r = 0; r < n; ++r) a[r] = b[r] = gaussian(count, 40 + r);
  std::vector<std::vector<float>> oop(n);
  run_workers(n, cfg, [&](int r, thc_comm_t comm) {
    oop[r].resize(count);
    return cnat_allreduce(a[r].data(), oop[r].data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
  });
  auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
    return cnat_allreduce(THC_IN_PLACE, b[r].data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(st[r], THC_SUCCESS);
    EXPECT_EQ(b[r], oop[r]);
  }
}

TEST(Engine, IntAndPsAlgorithmsDecodeIdentically) {
  const int n = 3;
  for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_CNAT, THC_SCHEME_DNAT}) {
    std::vector<float> res[2];
    for (int algo = 1; algo <= 2; ++algo) {
      thc_config_t cfg = base_config();
      cfg.algo = algo;
      std::vector<std::vector<float>> out(n);
      run_workers(n, cfg, [&](int r, thc_comm_t comm) {
        auto in = gaussian(7777, 60 + r);
        out[r].resize(in.size());
        thc_status_t s = thc_allreduce_scheme(scheme, in.data(), out[r].data(), in.size(), THC_FLOAT32,
                                              THC_OP_SUM, comm, nullptr);
        thc_stats_t st;
        thc_comm_stats(comm, &st);
        EXPECT_EQ(st.last_algo, algo);
        return s;
      });
      res[algo - 1] = out[0];
    }
    EXPECT_EQ(res[0], res[1]) << "scheme " << scheme;
  }
}

// THC_THREADS spreads prelude, encode and decode over threads block by block; the result must
// not depend on it: the same outputs, bit for bit, for every scheme and algorithm, across calls
// with error feedback (which also checks the residuals) and a tail block.
TEST(Engine, CodecThreadsDoNotChangeResults) {
  const int n = 2;
  const int calls = 3;
  for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
    for (int algo = 1; algo <= 2; ++algo) {
      std::vector<float> res[2];
      for (int threads : {1, 3}) {
        thc_config_t cfg = base_config();
        cfg.algo = algo;
        cfg.threads = threads;
        std::vector<std::vector<float>> out(n);
        auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
          auto in = gaussian(4 * 4096 * 2 + 999, 80 + r);  // several chunks and a tail block
          out[r].resize(in.size());
          thc_state_t ef;
          thc_state_create(&ef);
          thc_status_t s = THC_SUCCESS;
          for (int c = 0; c < calls && s == THC_SUCCESS; ++c)
            s = thc_allreduce_scheme(scheme, in.data(), out[r].data(), in.size(), THC_FLOAT32, THC_OP_AVG, comm, ef);
          thc_state_destroy(ef);
          return s;
        });
        ASSERT_EQ(st[0], THC_SUCCESS) << thc_last_error();
        res[threads == 1 ? 0 : 1] = out[1];
      }
      EXPECT_EQ(0, std::memcmp(res[0].data(), res[1].data(), res[0].size() * sizeof(float)))
          << "scheme " << scheme << " algo " << algo;
    }
  }
  thc_config_t bad = base_config();
  bad.threads = 0;
  thc_inproc_group_t g;
  thc_inproc_group_create(1, &g);
  thc_comm_t comm;
  EXPECT_EQ(thc_comm_create_inproc(g, 0, &bad, &comm), THC_ERR_INVALID_ARG);
  EXPECT_NE(std::string(thc_last_error()).find("THC_THREADS"), std::string::npos);
  thc_inproc_group_destroy(g);
}

// The pipeline's chunks (THC_CHUNK_BYTES, and their growth in the middle of a long call on the
// point-to-point schedules) only cut the call into transfers: the bits of the result are those of
// one chunk, for every algorithm, with error feedback over several calls.
TEST(Engine, ChunkingDoesNotChangeResults) {
  const int n = 3;
  const int calls = 2;
  const size_t count = 1024 * 41 + 999;  // 42 blocks: ramps up and down at one block per chunk
  // THC_CHUNK_GROWTH=4: the chunks grow in the middle of the call (default 1: they do not).
  struct GrowthEnv {
    GrowthEnv() { setenv("THC_CHUNK_GROWTH", "4", 1); }
    ~GrowthEnv() { unsetenv("THC_CHUNK_GROWTH"); }
  } growth_env;
  for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
    for (int algo = 1; algo <= 2; ++algo) {
      std::vector<float> res[4];
      int k = 0;
      // 1 and 3 blocks: ramps; 40: two chunks of 21 blocks, smaller than the configured chunk
      // (the prelude still reads by THC_CHUNK_BYTES); 64: one chunk.
      for (int64_t chunk : {int64_t{4 * 1024}, int64_t{4 * 1024 * 3}, int64_t{4 * 1024 * 40}, int64_t{4 * 1024 * 64}}) {
        thc_config_t cfg = base_config();
        cfg.algo = algo;
        cfg.chunk_bytes = chunk;
        std::vector<std::vector<float>> out(n);
        auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
          auto in = gaussian(count, 90 + r);
          out[r].resize(in.size());
          thc_state_t ef;
          thc_state_create(&ef);
          thc_status_t s = THC_SUCCESS;
          for (int c = 0; c < calls && s == THC_SUCCESS; ++c)
            s = thc_allreduce_scheme(scheme, in.data(), out[r].data(), in.size(), THC_FLOAT32, THC_OP_SUM, comm, ef);
          thc_state_destroy(ef);
          return s;
        });
        for (int r = 0; r < n; ++r) ASSERT_EQ(st[r], THC_SUCCESS) << thc_last_error();
        res[k++] = out[2];
      }
      for (int i = 1; i < 4; ++i)
        EXPECT_EQ(0, std::memcmp(res[0].data(), res[i].data(), res[0].size() * sizeof(float)))
            << "scheme " << scheme << " algo " << algo << " chunking " << i;
    }
  }
}

TEST(Engine, AllDtypes) {
  const int n = 2;
  const thc_config_t cfg = base_config();
  const size_t count = 4000;
  for (thc_dtype_t dt : {THC_FLOAT32, THC_FLOAT16, THC_BFLOAT16, THC_FLOAT64}) {
    std::vector<std::vector<float>> in(n);
    std::vector<double> exact(count, 0);
    for (int r = 0; r < n; ++r) {
      in[r] = gaussian(count, 70 + r);
      for (size_t i = 0; i < count; ++i) exact[i] += in[r][i];
    }
    std::vector<std::vector<float>> out(n);
    auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
      const auto t = static_cast<thc::engine::DType>(dt);
      const size_t es = thc::engine::dtype_size(t);
      std::vector<uint8_t> sb(count * es), rb(count * es);
      thc::engine::store_from_float(in[r].data(), count, t, sb.data(), 0);
      thc_status_t s = thc_allreduce(sb.data(), rb.data(), count, dt, THC_OP_SUM, comm, nullptr);
      out[r].resize(count);
      thc::engine::load_as_float(rb.data(), t, 0, count, nullptr, out[r].data());
      return s;
    });
    ASSERT_EQ(st[0], THC_SUCCESS) << thc_last_error();
    EXPECT_LT(nmse(out[0], exact), 0.05) << "dtype " << dt;
  }
}

TEST(Engine, ErrorFeedbackRunningAverageConvergesToTrueSum) {
  // THC truncation is biased; with error feedback the running average of repeated allreduces
  // of the same vectors converges to the exact sum (the bias is fed back).
  const int n = 2;
  thc_config_t cfg = base_config();
  cfg.p = 0.2;  // aggressive truncation: a large bias without EF
  const size_t count = 4096;
  std::vector<std::vector<float>> in(n);
  std::vector<double> exact(count, 0);
  for (int r = 0; r < n; ++r) {
    in[r] = gaussian(count, 90 + r);
    in[r][r * 100] = 40.0f;  // an outlier far beyond t_p after rotation
    for (size_t i = 0; i < count; ++i) exact[i] += in[r][i];
  }
  const int R = 200;
  double nmse_ef = 0, nmse_noef = 0;
  for (int use_ef = 0; use_ef < 2; ++use_ef) {
    std::vector<std::vector<double>> avg(n, std::vector<double>(count, 0));
    run_workers(n, cfg, [&](int r, thc_comm_t comm) {
      thc_state_t ef = nullptr;
      if (use_ef) thc_state_create(&ef);
      std::vector<float> out(count);
      thc_status_t s = THC_SUCCESS;
      for (int it = 0; it < R && s == THC_SUCCESS; ++it) {
        s = thc_allreduce(in[r].data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef);
        for (size_t i = 0; i < count; ++i) avg[r][i] += out[i] / R;
      }
      thc_state_destroy(ef);
      return s;
    });
    std::vector<float> a(avg[0].begin(), avg[0].end());
    (use_ef ? nmse_ef : nmse_noef) = nmse(a, exact);
  }
  EXPECT_LT(nmse_ef, 0.2 * nmse_noef) << "ef " << nmse_ef << " no-ef " << nmse_noef;
  EXPECT_LT(nmse_ef, 1e-3);
}

// Out-of-place error feedback (the hierarchical communicator's, which undoes a failed call by
// keeping the residual): the call leaves `residual` as it was and writes into `next` bit for
// bit what the in-place call leaves in `residual`, with the same results: a single allreduce
// (float32, whose encode sums grad + e as it reads them, and bfloat16, staged), and a group.
TEST(Engine, OutOfPlaceErrorFeedbackWritesTheInPlaceUpdateToNext) {
  const int n = 3;
  thc_config_t cfg = base_config();
  cfg.p = 0.2;
  const std::vector<size_t> counts = {5000, 2048, 777};
  std::vector<std::vector<float>> in(n);
  for (int r = 0; r < n; ++r) in[r] = gaussian(5000, 300 + r);
  for (int mode = 0; mode < 3; ++mode) {  // single float32, single bfloat16, group
    SCOPED_TRACE(mode == 0 ? "float32" : mode == 1 ? "bfloat16" : "group");
    const size_t nt = mode == 2 ? counts.size() : 1;
    // [out_of_place][rank][tensor]: residual before call 2, after it, next after it; outputs.
    std::vector<std::vector<std::vector<std::vector<float>>>> before(2), after(2), next(2), out(2);
    for (int oop = 0; oop < 2; ++oop) {
      for (auto* v : {&before, &after, &next, &out}) (*v)[oop].assign(n, std::vector<std::vector<float>>(nt));
      const auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
        std::vector<thc_state_t> ef(nt);
        for (auto& e : ef) thc_state_create(&e);
        std::vector<std::vector<float>> o(nt);
        std::vector<std::vector<uint16_t>> bf(nt), obf(nt);
        thc_status_t s = THC_SUCCESS;
        for (int call = 0; call < 2 && s == THC_SUCCESS; ++call) {
          if (call == 1) {
            for (size_t t = 0; t < nt; ++t) {
              before[oop][r][t].assign(ef[t]->ef.residual.begin(), ef[t]->ef.residual.end());
              ef[t]->ef.out_of_place = oop == 1;
            }
          }
          if (mode == 0) {
            o[0].assign(5000, 0.0f);
            s = thc_allreduce(in[r].data(), o[0].data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, ef[0]);
          } else if (mode == 1) {
            bf[0].resize(5000);
            obf[0].assign(5000, 0);
            for (size_t i = 0; i < 5000; ++i) bf[0][i] = thc::engine::float_to_bf16(in[r][i]);
            s = thc_allreduce(bf[0].data(), obf[0].data(), 5000, THC_BFLOAT16, THC_OP_SUM, comm, ef[0]);
            o[0].resize(5000);
            for (size_t i = 0; i < 5000; ++i) o[0][i] = thc::engine::bf16_to_float(obf[0][i]);
          } else {
            std::vector<thc_tensor_t> ts(nt);
            for (size_t t = 0; t < nt; ++t) {
              o[t].assign(counts[t], 0.0f);
              ts[t] = thc_tensor_t{in[r].data(), o[t].data(), counts[t], THC_FLOAT32, ef[t]};
            }
            s = thc_allreduce_group(THC_SCHEME_THC, ts.data(), nt, THC_OP_SUM, comm);
          }
        }
        for (size_t t = 0; t < nt; ++t) {
          after[oop][r][t].assign(ef[t]->ef.residual.begin(), ef[t]->ef.residual.end());
          next[oop][r][t].assign(ef[t]->ef.next.begin(), ef[t]->ef.next.end());
          out[oop][r][t] = o[t];
          thc_state_destroy(ef[t]);
        }
        return s;
      });
      for (int r = 0; r < n; ++r) ASSERT_EQ(st[r], THC_SUCCESS) << "rank " << r << ": " << thc_last_error();
    }
    for (int r = 0; r < n; ++r) {
      for (size_t t = 0; t < nt; ++t) {
        const size_t c = mode == 2 ? counts[t] : 5000;
        ASSERT_EQ(after[0][r][t].size(), c);
        EXPECT_NE(after[0][r][t], before[0][r][t]) << "rank " << r << " tensor " << t;  // (it did change)
        EXPECT_EQ(after[1][r][t], before[1][r][t]) << "rank " << r << " tensor " << t;
        ASSERT_GE(next[1][r][t].size(), c);
        EXPECT_EQ(0, std::memcmp(next[1][r][t].data(), after[0][r][t].data(), c * 4)) << "rank " << r << " tensor " << t;
        EXPECT_EQ(0, std::memcmp(out[1][r][t].data(), out[0][r][t].data(), c * 4)) << "rank " << r << " tensor " << t;
      }
    }
  }
}

// A host residual shorter than its count (a hierarchical communicator's state holds only its
// rank's slice) reads as zero-padded to the count: the same results and residual as the padded
// state, single allreduce and group.
TEST(Engine, ShortResidualReadsAsZeroPadded) {
  const int n = 2;
  const thc_config_t cfg = base_config();
  const size_t count = 5000;
  for (int group = 0; group < 2; ++group) {
    std::vector<std::vector<float>> res(2 * n), out(2 * n);
    for (int padded = 0; padded < 2; ++padded) {
      const auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
        thc_state_t ef;
        thc_state_create(&ef);
        ef->ef.count = count;
        {
          const auto g = gaussian(1500, 70 + r);
          ef->ef.residual.assign(g.begin(), g.end());
        }
        if (padded) ef->ef.residual.resize(count, 0.0f);
        const auto x = gaussian(count, 80 + r);
        std::vector<float> o(count);
        thc_status_t s;
        if (group) {
          const thc_tensor_t t{x.data(), o.data(), count, THC_FLOAT32, ef};
          s = thc_allreduce_group(THC_SCHEME_THC, &t, 1, THC_OP_SUM, comm);
        } else {
          s = thc_allreduce(x.data(), o.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef);
        }
        res[2 * r + padded].assign(ef->ef.residual.begin(), ef->ef.residual.end());
        out[2 * r + padded] = o;
        thc_state_destroy(ef);
        return s;
      });
      for (int r = 0; r < n; ++r) ASSERT_EQ(st[r], THC_SUCCESS) << thc_last_error();
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(res[2 * r], res[2 * r + 1]) << (group ? "group" : "single") << " rank " << r;
      EXPECT_EQ(out[2 * r], out[2 * r + 1]) << (group ? "group" : "single") << " rank " << r;
    }
  }
}

TEST(Engine, NonFiniteOnOneRankIsReportedOnEveryRank) {
  const int n = 3;
  const thc_config_t cfg = base_config();
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<std::vector<float>> out(n);
    auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
      auto in = gaussian(3000, r);
      if (r == 1) in[2999] = bad;
      out[r].assign(3000, 7.0f);
      thc_status_t s = thc_allreduce(in.data(), out[r].data(), 3000, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
      if (s != THC_SUCCESS) {
        EXPECT_NE(std::string(thc_last_error()).find("NaN or Inf"), std::string::npos);
      }
      return s;
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(st[r], THC_ERR_NONFINITE);
      EXPECT_EQ(out[r], std::vector<float>(3000, 7.0f)) << "output must be untouched";
    }
  }
}

TEST(Engine, MismatchedConfigurationIsDetectedOnEveryRank) {
  const int n = 3;
  std::vector<thc_config_t> per(n, base_config());
  per[2].granularity = 20;
  auto st = run_workers(n, per[0], [&](int r, thc_comm_t comm) {
    auto in = gaussian(2048, r);
    std::vector<float> out(2048);
    return thc_allreduce(in.data(), out.data(), 2048, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
  }, &per);
  for (int r = 0; r < n; ++r) EXPECT_EQ(st[r], THC_ERR_CONFIG_MISMATCH) << r;
}

TEST(Engine, CountMismatchIsCaughtInTheFirstExchangeAndTheGroupGoesOn) {
  // 2 blocks on ranks 0 and 2, 9 on rank 1: the statistics exchange would differ in size.
  const int n = 3;
  const thc_config_t cfg = base_config();
  auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
    const size_t count = r == 1 ? 9000 : 2000;
    auto in = gaussian(count, r);
    std::vector<float> out(count);
    const thc_status_t s = thc_allreduce(in.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
    EXPECT_EQ(s, THC_ERR_CONFIG_MISMATCH) << r;
    EXPECT_NE(std::string(thc_last_error()).find("the count"), std::string::npos) << thc_last_error();
    // Nothing of the failed call is left in flight: the next one works.
    in.resize(2000);
    out.resize(2000);
    return thc_allreduce(in.data(), out.data(), 2000, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(st[r], THC_SUCCESS) << r;
}

TEST(Engine, ChunkingAndAlgorithmMismatchesAreNamed) {
  const int n = 2;
  struct V {
    const char* field;
    void (*set)(thc_config_t&);
  };
  for (V v : {V{"chunking", [](thc_config_t& c) { c.chunk_bytes *= 2; }},
              V{"algorithm", [](thc_config_t& c) { c.algo = c.algo == THC_ALGO_PS ? THC_ALGO_INT : THC_ALGO_PS; }}}) {
    std::vector<thc_config_t> per(n, base_config());
    per[0].algo = THC_ALGO_INT;
    per[1].algo = THC_ALGO_INT;
    v.set(per[1]);
    auto st = run_workers(n, per[0], [&](int r, thc_comm_t comm) {
      auto in = gaussian(20000, r);
      std::vector<float> out(20000);
      const thc_status_t s = thc_allreduce(in.data(), out.data(), 20000, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
      EXPECT_NE(std::string(thc_last_error()).find(v.field), std::string::npos) << thc_last_error();
      return s;
    }, &per);
    for (int r = 0; r < n; ++r) EXPECT_EQ(st[r], THC_ERR_CONFIG_MISMATCH) << v.field << " rank " << r;
  }
}

// A rank that fails before the first exchange still takes part in it: the others fail with its
// status at once instead of waiting for THC_TIMEOUT_MS.
TEST(Engine, EarlyFailureOfOneRankIsReportedOnEveryRank) {
  setenv("THC_TIMEOUT_MS", "20000", 1);  // the group's wait bound (without the fix: TIMEOUT)
  const int n = 3;
  std::vector<thc_config_t> per(n, base_config());
  per[1].nat_levels = 15;  // too many for 16-bit sums of 3 workers: THC_ERR_OVERFLOW on rank 1
  auto st = run_workers(n, per[0], [&](int r, thc_comm_t comm) {
    auto in = gaussian(3000, r);
    std::vector<float> out(3000);
    const thc_status_t s = cnat_allreduce(in.data(), out.data(), 3000, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
    EXPECT_EQ(s, THC_ERR_OVERFLOW) << r << ": " << thc_last_error();
    // The call counted on every rank: THC goes on in step.
    return thc_allreduce(in.data(), out.data(), 3000, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
  }, &per);
  unsetenv("THC_TIMEOUT_MS");
  for (int r = 0; r < n; ++r) EXPECT_EQ(st[r], THC_SUCCESS) << r;
}

// thc.h: a communicator takes one call at a time. A second thread's call on the same communicator
// while the first waits for its peer is refused (it would race the first); stats stay readable.
TEST(Engine, ConcurrentCallOnOneCommunicatorIsRefused) {
  setenv("THC_TIMEOUT_MS", "20000", 1);
  thc_inproc_group_t g;
  ASSERT_EQ(thc_inproc_group_create(2, &g), THC_SUCCESS);
  unsetenv("THC_TIMEOUT_MS");
  const thc_config_t cfg = base_config();
  thc_comm_t comm[2];
  std::thread c1([&] { EXPECT_EQ(thc_comm_create_inproc(g, 1, &cfg, &comm[1]), THC_SUCCESS); });
  ASSERT_EQ(thc_comm_create_inproc(g, 0, &cfg, &comm[0]), THC_SUCCESS);
  c1.join();
  std::atomic<bool> second_done{false};
  thc_status_t first = THC_ERR_INTERNAL, second = THC_ERR_INTERNAL, peer = THC_ERR_INTERNAL;
  std::vector<float> a(4096, 1.0f), b(4096, 2.0f), c(4096, 3.0f);
  std::thread t_first([&] { first = thc_allreduce(a.data(), a.data(), a.size(), THC_FLOAT32, THC_OP_SUM, comm[0], nullptr); });
  std::thread t_second([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // (ordering only) the first is waiting for rank 1
    second = thc_allreduce(b.data(), b.data(), b.size(), THC_FLOAT32, THC_OP_SUM, comm[0], nullptr);
    thc_stats_t st;
    EXPECT_EQ(thc_comm_stats(comm[0], &st), THC_SUCCESS);
    second_done = true;
  });
  std::thread t_peer([&] {
    while (!second_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    peer = thc_allreduce(c.data(), c.data(), c.size(), THC_FLOAT32, THC_OP_SUM, comm[1], nullptr);
  });
  t_first.join();
  t_second.join();
  t_peer.join();
  EXPECT_EQ(second, THC_ERR_INVALID_ARG);
  EXPECT_EQ(first, THC_SUCCESS);
  EXPECT_EQ(peer, THC_SUCCESS);
  EXPECT_EQ(a, c);
  EXPECT_EQ(b, std::vector<float>(4096, 2.0f)) << "the refused call must not touch its buffer";
  thc_comm_destroy(comm[0]);
  thc_comm_destroy(comm[1]);
  thc_inproc_group_destroy(g);
}

TEST(Engine, BadArgumentsAreRejected) {
  const thc_config_t cfg = base_config();
  auto st = run_workers(1, cfg, [&](int, thc_comm_t comm) {
    std::vector<float> a(10);
    EXPECT_EQ(thc_allreduce(a.data(), nullptr, 10, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_ERR_INVALID_ARG);
    EXPECT_EQ(thc_allreduce(a.data(), a.data(), 10, THC_FLOAT32, static_cast<thc_op_t>(7), comm, nullptr),
              THC_ERR_INVALID_ARG);
    EXPECT_EQ(thc_allreduce(a.data(), a.data(), 10, static_cast<thc_dtype_t>(9), THC_OP_SUM, comm, nullptr),
              THC_ERR_INVALID_ARG);
    EXPECT_EQ(thc_allreduce(a.data(), a.data(), 10, THC_FLOAT32, THC_OP_SUM, nullptr, nullptr), THC_ERR_INVALID_ARG);
    thc_state_t ef;
    thc_state_create(&ef);
    EXPECT_EQ(thc_allreduce(a.data(), a.data(), 10, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS);
    EXPECT_EQ(thc_allreduce(a.data(), a.data(), 5, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_ERR_INVALID_ARG);
    thc_state_destroy(ef);
    return THC_SUCCESS;
  });
  EXPECT_EQ(st[0], THC_SUCCESS);
  thc_config_t bad = cfg;
  bad.block = 1000;
  thc_inproc_group_t g;
  thc_inproc_group_create(1, &g);
  thc_comm_t comm;
  EXPECT_EQ(thc_comm_create_inproc(g, 0, &bad, &comm), THC_ERR_INVALID_ARG);
  EXPECT_NE(std::string(thc_last_error()).find("THC_BLOCK"), std::string::npos);
  EXPECT_EQ(thc_comm_create_inproc(g, 5, &cfg, &comm), THC_ERR_INVALID_ARG);
  thc_inproc_group_destroy(g);
}

TEST(Engine, OverflowProneConfigurationFailsWithOverflow) {
  thc_config_t cfg = base_config();
  cfg.nat_width = 8;
  cfg.nat_levels = 7;  // 2 workers * 2^6 = 128 > 127
  auto st = run_workers(2, cfg, [&](int, thc_comm_t comm) {
    std::vector<float> a(2048, 1.0f);
    return cnat_allreduce(a.data(), a.data(), a.size(), THC_FLOAT32, THC_OP_SUM, comm, nullptr);
  });
  EXPECT_EQ(st[0], THC_ERR_OVERFLOW);
  EXPECT_EQ(st[1], THC_ERR_OVERFLOW);
}

// Re-compression rounds a shard sum of up to n 2^(L-1) up to a power of two: with 3 workers and
// 14 levels that is 32768, beyond 16-bit sums. Refused, never wrapped to -32768.
TEST(Engine, BidirWithoutHeadroomIsRefused) {
  const int n = 3;
  thc_config_t cfg = base_config();
  cfg.algo = THC_ALGO_PS;
  cfg.bidir = 1;
  cfg.nat_width = 16;
  for (int levels : {14, 0}) {
    cfg.nat_levels = levels;
    std::vector<std::vector<float>> out(n);
    auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
      std::vector<float> in(4096, 1.0f);  // every element at its block maximum: the largest sums
      out[r].assign(4096, 0.0f);
      return cnat_allreduce(in.data(), out[r].data(), in.size(), THC_FLOAT32, THC_OP_SUM, comm, nullptr);
    });
    for (int r = 0; r < n; ++r) {
      if (levels == 14) {
        EXPECT_EQ(st[r], THC_ERR_OVERFLOW) << r;
      } else {  // automatic levels keep the headroom; the sum 3 re-compresses to 2 or 4
        ASSERT_EQ(st[r], THC_SUCCESS) << r << ": " << thc_last_error();
        for (float v : out[r]) ASSERT_TRUE(v == 2.0f || v == 4.0f) << v;
      }
    }
  }
}

TEST(Engine, BidirectionalCnatIsUnbiasedAndCloseToExact) {
  const int n = 4;
  thc_config_t cfg = base_config();
  cfg.algo = THC_ALGO_PS;
  cfg.bidir = 1;
  const size_t count = 8192;
  std::vector<std::vector<float>> in(n);
  std::vector<double> exact(count, 0);
  for (int r = 0; r < n; ++r) {
    in[r] = gaussian(count, 200 + r);
    for (size_t i = 0; i < count; ++i) exact[i] += in[r][i];
  }
  std::vector<float> out(count);
  auto st = run_workers(n, cfg, [&](int r, thc_comm_t comm) {
    std::vector<float> o(count);
    thc_status_t s = cnat_allreduce(in[r].data(), o.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
    if (r == 0) out = o;
    return s;
  });
  ASSERT_EQ(st[0], THC_SUCCESS) << thc_last_error();
  // Two Cnat stages: at most (1 + 1/8)^2 - 1 relative variance, far less after averaging n.
  EXPECT_LT(nmse(out, exact), 0.27);
}

}  // namespace

// ---- review of issue 12 (MPI path): the C API's argument checks, naming failing ranks, and
// THC_TIMEOUT_MS <= 0 on in-process communicators.
namespace {

// thc.h: a rank whose call fails before the first exchange still takes part in it, so every rank
// fails that call with that rank's status and the call counts on every rank. An unknown dtype, op
// or scheme, or an error-feedback state in use by another thread, are such failures (the
// communicator itself is free, so the call can take part); before, the C API refused them before
// the engine saw the call: the peers' call was then completed by that rank's next call (a sum of
// two different calls), and their next call waited for a partner that never came.
TEST(Engine, BadArgumentOnOneRankFailsThatCallOnEveryRankAndCounts) {
  setenv("THC_TIMEOUT_MS", "3000", 1);  // the group's bound (without the fix the peer's second call times out)
  const size_t count = 3000;
  struct Bad {
    const char* what;
    std::function<thc_status_t(const float*, float*, thc_comm_t, thc_state_t)> call;
  };
  const std::vector<Bad> bads = {
      {"dtype", [&](const float* x, float* y, thc_comm_t c, thc_state_t) {
         return thc_allreduce_scheme(THC_SCHEME_CNAT, x, y, count, static_cast<thc_dtype_t>(99), THC_OP_SUM, c, nullptr);
       }},
      {"op", [&](const float* x, float* y, thc_comm_t c, thc_state_t) {
         return thc_allreduce_scheme(THC_SCHEME_CNAT, x, y, count, THC_FLOAT32, static_cast<thc_op_t>(7), c, nullptr);
       }},
      {"scheme", [&](const float* x, float* y, thc_comm_t c, thc_state_t) {
         return thc_allreduce_scheme(static_cast<thc_scheme_t>(9), x, y, count, THC_FLOAT32, THC_OP_SUM, c, nullptr);
       }},
      {"busy state", [&](const float* x, float* y, thc_comm_t c, thc_state_t ef) {
         ef->busy.store(true);  // as while another thread's call (on another communicator) uses it
         const thc_status_t s = thc_allreduce_scheme(THC_SCHEME_CNAT, x, y, count, THC_FLOAT32, THC_OP_SUM, c, ef);
         ef->busy.store(false);
         return s;
       }},
  };
  for (const Bad& bad : bads) {
    const int n = 3;
    std::vector<std::vector<float>> first(n), second(n);
    std::vector<thc_status_t> st1(n, THC_SUCCESS);
    auto st = run_workers(n, base_config(), [&](int r, thc_comm_t comm) {
      thc_state_t ef;
      thc_state_create(&ef);
      // Cnat adds powers of two exactly: 1 + 1 + 1 = 3 and 64 * 3 = 192 tell the calls apart.
      std::vector<float> x1(count, 1.0f), x2(count, 64.0f);
      first[r].assign(count, 7.0f);
      second[r].assign(count, 7.0f);
      st1[r] = r == 1 ? bad.call(x1.data(), first[r].data(), comm, ef)
                      : thc_allreduce_scheme(THC_SCHEME_CNAT, x1.data(), first[r].data(), count, THC_FLOAT32,
                                             THC_OP_SUM, comm, nullptr);
      const thc_status_t s2 = thc_allreduce_scheme(THC_SCHEME_CNAT, x2.data(), second[r].data(), count, THC_FLOAT32,
                                                   THC_OP_SUM, comm, nullptr);
      thc_state_destroy(ef);
      return s2;
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(st1[r], THC_ERR_INVALID_ARG) << bad.what << ": rank " << r;
      EXPECT_EQ(first[r], std::vector<float>(count, 7.0f)) << bad.what << ": rank " << r << " output touched";
      EXPECT_EQ(st[r], THC_SUCCESS) << bad.what << ": rank " << r << "'s next call";
      EXPECT_EQ(second[r], std::vector<float>(count, 192.0f)) << bad.what << ": rank " << r << "'s next call";
    }
  }
  unsetenv("THC_TIMEOUT_MS");
}

// A second thread's call on a busy communicator cannot take part in the exchange (it belongs to
// the call in progress): it is refused on its own thread and does not count, so the peers' calls
// stay paired with this rank's calls in the order they were made.
TEST(Engine, RefusedCallOnABusyCommunicatorDoesNotCount) {
  setenv("THC_TIMEOUT_MS", "20000", 1);
  thc_inproc_group_t g;
  ASSERT_EQ(thc_inproc_group_create(2, &g), THC_SUCCESS);
  unsetenv("THC_TIMEOUT_MS");
  const thc_config_t cfg = base_config();
  thc_comm_t comm[2];
  std::thread c1([&] { EXPECT_EQ(thc_comm_create_inproc(g, 1, &cfg, &comm[1]), THC_SUCCESS); });
  ASSERT_EQ(thc_comm_create_inproc(g, 0, &cfg, &comm[0]), THC_SUCCESS);
  c1.join();
  std::atomic<bool> refused{false};
  thc_status_t a0 = THC_ERR_INTERNAL, b0 = THC_ERR_INTERNAL, a1 = THC_ERR_INTERNAL, b1 = THC_ERR_INTERNAL;
  std::vector<float> x(4096, 1.0f), ya(4096), yb(4096), za(4096), zb(4096);
  std::thread first([&] {
    a0 = cnat_allreduce(x.data(), ya.data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm[0], nullptr);
    b0 = cnat_allreduce(x.data(), yb.data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm[0], nullptr);
  });
  std::thread intruder([&] {
    // rank 0's first call is in progress (its peer has not called yet): busy
    while (!comm[0]->busy.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<float> w(4096);
    EXPECT_EQ(cnat_allreduce(x.data(), w.data(), w.size(), THC_FLOAT32, THC_OP_SUM, comm[0], nullptr),
              THC_ERR_INVALID_ARG);
    refused = true;
  });
  std::thread peer([&] {
    while (!refused) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    a1 = cnat_allreduce(x.data(), za.data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm[1], nullptr);
    b1 = cnat_allreduce(x.data(), zb.data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm[1], nullptr);
  });
  first.join();
  intruder.join();
  peer.join();
  EXPECT_EQ(a0, THC_SUCCESS);
  EXPECT_EQ(b0, THC_SUCCESS);
  EXPECT_EQ(a1, THC_SUCCESS);
  EXPECT_EQ(b1, THC_SUCCESS);
  EXPECT_EQ(ya, std::vector<float>(4096, 2.0f));
  EXPECT_EQ(zb, std::vector<float>(4096, 2.0f));
  thc_comm_destroy(comm[0]);
  thc_comm_destroy(comm[1]);
  thc_inproc_group_destroy(g);
}

// The message of a failure some other rank caused names every such rank, not only the highest
// (the ranks were a "bitmap" combined by MAX, which keeps the highest bit only).
TEST(Engine, MessagesNameEveryFailingRank) {
  setenv("THC_TIMEOUT_MS", "5000", 1);
  const int n = 4;
  std::vector<thc_config_t> per(n, base_config());
  per[2].nat_levels = 15;  // THC_ERR_OVERFLOW on rank 2 (16-bit sums of 4 workers)
  std::vector<std::string> early(n), nonfinite(n);
  std::vector<thc_status_t> early_st(n), nonfinite_st(n);
  run_workers(n, per[0], [&](int r, thc_comm_t comm) {
    auto x = gaussian(3000, r);
    std::vector<float> y(3000);
    // ranks 1 (bad datatype) and 2 (overflow) fail before the first exchange
    early_st[r] = cnat_allreduce(x.data(), y.data(), 3000, r == 1 ? static_cast<thc_dtype_t>(42) : THC_FLOAT32,
                                 THC_OP_SUM, comm, nullptr);
    early[r] = thc_last_error();
    // ranks 0 and 3 have NaN/Inf
    if (r == 0) x[5] = std::numeric_limits<float>::quiet_NaN();
    if (r == 3) x[2999] = std::numeric_limits<float>::infinity();
    nonfinite_st[r] = thc_allreduce(x.data(), y.data(), 3000, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
    nonfinite[r] = thc_last_error();
    return THC_SUCCESS;
  }, &per);
  unsetenv("THC_TIMEOUT_MS");
  for (int r : {0, 3}) {
    EXPECT_NE(early_st[r], THC_SUCCESS);
    EXPECT_NE(early[r].find("rank 1 (invalid argument)"), std::string::npos) << early[r];
    EXPECT_NE(early[r].find("rank 2 (integer sums would overflow)"), std::string::npos) << early[r];
    EXPECT_EQ(early[r].find("rank 0"), std::string::npos) << early[r];
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(nonfinite_st[r], THC_ERR_NONFINITE) << r;
    EXPECT_NE(nonfinite[r].find("rank 0"), std::string::npos) << nonfinite[r];
    EXPECT_NE(nonfinite[r].find("rank 3"), std::string::npos) << nonfinite[r];
    EXPECT_EQ(nonfinite[r].find("rank 1"), std::string::npos) << nonfinite[r];
  }
}

// THC_TIMEOUT_MS <= 0 means "no bound" everywhere (thc.h, README); the in-process group took it
// as "do not wait at all", so a peer a moment late failed the call.
TEST(Engine, InprocTimeoutZeroOrNegativeWaitsWithoutBound) {
  for (const char* t : {"0", "-1"}) {
    setenv("THC_TIMEOUT_MS", t, 1);
    std::vector<std::vector<float>> out(2);
    auto st = run_workers(2, base_config(), [&](int r, thc_comm_t comm) {
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::vector<float> x(5000, 1.0f);
      out[r].resize(5000);
      return cnat_allreduce(x.data(), out[r].data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm, nullptr);
    });
    unsetenv("THC_TIMEOUT_MS");
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(st[r], THC_SUCCESS) << "THC_TIMEOUT_MS=" << t << " rank " << r;
      EXPECT_EQ(out[r], std::vector<float>(5000, 2.0f)) << "THC_TIMEOUT_MS=" << t;
    }
  }
}

}  // namespace
