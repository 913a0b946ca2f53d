// The hierarchical allreduce (THC_HIER, mpi_wrappers/hier.h) under mpirun, with hosts emulated
// on this machine by THC_HIER_HOSTS (consecutive blocks of MPI_COMM_WORLD ranks), against the
// exact MPI_Allreduce and against the flat engine.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "collectives/capi/capi.h"
#include "collectives/engine/dtype.h"
#include "tests/mpi_wrappers/mpi_test_util.h"
#include "thc/thc_mpi.h"

namespace {

using thc::test::exact_sum;
using thc::test::gaussian;
using thc::test::nmse;
using thc::test::rank;
using thc::test::same_on_every_rank;
using thc::test::world;

struct Layout {
  std::vector<int> sizes;
  std::string str() const {
    std::string s;
    for (size_t i = 0; i < sizes.size(); ++i) s += (i ? "," : "") + std::to_string(sizes[i]);
    return s;
  }
  int hosts() const { return static_cast<int>(sizes.size()); }
  int host_of(int r) const {
    for (int h = 0, acc = 0; h < hosts(); ++h)
      if (r < (acc += sizes[h])) return h;
    return -1;
  }
  int local_rank(int r) const {
    int acc = 0;
    for (int h = 0; h < host_of(r); ++h) acc += sizes[h];
    return r - acc;
  }
  int slices() const { return *std::min_element(sizes.begin(), sizes.end()); }
};

// Layouts with more than one rank on some host and more than one host: even ones (2 per
// host), and uneven ones (ranks beyond the fewest a host has only contribute).
std::vector<Layout> multi_layouts() {
  const int n = world();
  std::vector<Layout> out;
  if (n >= 4 && n % 2 == 0) out.push_back(Layout{std::vector<int>(n / 2, 2)});
  if (n >= 3) out.push_back(Layout{{n - 1, 1}});
  if (n >= 5) out.push_back(Layout{{2, n - 2}});
  return out;
}

thc_config_t cfg_for(const Layout& lay, int hier = -1, int algo = THC_ALGO_AUTO, uint64_t seed = 777) {
  thc_config_t c;
  EXPECT_EQ(thc_config_init(&c), THC_SUCCESS);
  c.algo = algo;
  c.seed = seed;
  c.block = 4096;
  c.chunk_bytes = 4 * 4096 * 3;  // several chunks pipelined in the compressed stage
  c.hier = hier;
  std::snprintf(c.hier_hosts, sizeof c.hier_hosts, "%s", lay.str().c_str());
  return c;
}

thc_comm_t make(const thc_config_t& c) {
  thc_comm_t comm = nullptr;
  EXPECT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), THC_SUCCESS) << thc_last_error();
  return comm;
}

int hier_hosts(thc_comm_t comm) {
  thc_stats_t st;
  EXPECT_EQ(thc_comm_stats(comm, &st), THC_SUCCESS);
  return st.hier_hosts;
}

TEST(Hier, DecisionFollowsTheLayout) {
  const int n = world();
  struct Case {
    Layout lay;
    int hier;
    int expect_hosts;  // 0: flat
  };
  std::vector<Case> cases = {{Layout{{n}}, -1, 0}, {Layout{{n}}, 1, 0}, {Layout{std::vector<int>(n, 1)}, 0, 0}};
  if (n >= 2) {
    cases.push_back({Layout{std::vector<int>(n, 1)}, -1, 0});  // one rank per host: nothing to reduce locally
    cases.push_back({Layout{std::vector<int>(n, 1)}, 1, n});
  }
  for (const Layout& l : multi_layouts()) {
    cases.push_back({l, -1, l.hosts()});
    cases.push_back({l, 1, l.hosts()});
    cases.push_back({l, 0, 0});
  }
  for (const Case& k : cases) {
    thc_comm_t comm = make(cfg_for(k.lay, k.hier));
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(hier_hosts(comm), k.expect_hosts) << k.lay.str() << " THC_HIER=" << k.hier;
    int r = -1, s = -1;
    thc_comm_rank(comm, &r);
    thc_comm_size(comm, &s);
    EXPECT_EQ(r, rank());
    EXPECT_EQ(s, n);
    thc_comm_destroy(comm);
  }
}

TEST(Hier, MatchesExactWithinBoundEveryRankIdentical) {
  for (const Layout& lay : multi_layouts()) {
    for (int algo : {THC_ALGO_INT, THC_ALGO_PS}) {
      thc_comm_t comm = make(cfg_for(lay, -1, algo));
      ASSERT_EQ(hier_hosts(comm), lay.hosts());
      for (size_t count : {size_t{1}, size_t{777}, size_t{4097}, size_t{50001}}) {
        const auto x = gaussian(count, 10 + rank());
        const auto ex = exact_sum(x);
        for (thc_scheme_t s : {THC_SCHEME_THC, THC_SCHEME_UHC, THC_SCHEME_CNAT, THC_SCHEME_DNAT}) {
          for (thc_op_t op : {THC_OP_SUM, THC_OP_AVG}) {
            std::vector<float> out(count);
            ASSERT_EQ(thc_allreduce_scheme(s, x.data(), out.data(), count, THC_FLOAT32, op, comm, nullptr), THC_SUCCESS)
                << thc_last_error();
            const std::string what = lay.str() + " algo " + std::to_string(algo) + " count " + std::to_string(count) +
                                     " scheme " + std::to_string(s) + " op " + std::to_string(op);
            EXPECT_TRUE(same_on_every_rank(out)) << what;
            if (count < 64) continue;
            const double bound = s == THC_SCHEME_THC ? 0.1 : (s == THC_SCHEME_CNAT ? 0.13 : 0.3);
            EXPECT_LT(nmse(out, ex, op == THC_OP_AVG ? world() : 1.0), bound) << what;
          }
        }
      }
      thc_stats_t st;
      thc_comm_stats(comm, &st);
      EXPECT_EQ(st.last_algo, algo) << lay.str();
      thc_comm_destroy(comm);
    }
  }
}

// One rank per host with THC_HIER=1: the compressed stage is the flat engine's allreduce over
// every rank with the same seed, so the bits are the flat engine's; one host is flat itself.
TEST(Hier, OneRankPerHostAndOneHostGiveTheFlatBits) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  const size_t count = 30001;
  const auto x = gaussian(count, 50 + rank());
  for (const Layout& lay : {Layout{std::vector<int>(world(), 1)}, Layout{{world()}}}) {
    for (int algo : {THC_ALGO_INT, THC_ALGO_PS}) {
      thc_comm_t flat = make(cfg_for(lay, 0, algo)), hier = make(cfg_for(lay, 1, algo));
      EXPECT_EQ(hier_hosts(hier), lay.hosts() > 1 ? world() : 0);
      for (thc_scheme_t s : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
        std::vector<float> a(count), b(count);
        ASSERT_EQ(thc_allreduce_scheme(s, x.data(), a.data(), count, THC_FLOAT32, THC_OP_SUM, flat, nullptr), THC_SUCCESS)
            << thc_last_error();
        ASSERT_EQ(thc_allreduce_scheme(s, x.data(), b.data(), count, THC_FLOAT32, THC_OP_SUM, hier, nullptr), THC_SUCCESS)
            << thc_last_error();
        EXPECT_EQ(a, b) << lay.str() << " algo " << algo << " scheme " << s;
      }
      thc_comm_destroy(flat);
      thc_comm_destroy(hier);
    }
  }
}

// Cnat represents 1.0 exactly: with one 1.0 per host (local rank 0) and zeros elsewhere, every
// host sum is 1 and the compressed stage adds exact codes, in place too.
TEST(Hier, CnatOfExactHostSumsIsExact) {
  for (const Layout& lay : multi_layouts()) {
    thc_comm_t comm = make(cfg_for(lay, -1, THC_ALGO_PS));
    const size_t count = 20000;
    std::vector<float> x(count, lay.local_rank(rank()) == 0 ? 1.0f : 0.0f);
    ASSERT_EQ(cnat_allreduce(THC_IN_PLACE, x.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS)
        << thc_last_error();
    EXPECT_EQ(x, std::vector<float>(count, static_cast<float>(lay.hosts()))) << lay.str();
    thc_comm_destroy(comm);
  }
}

TEST(Hier, DtypesInPlaceAndAvg) {
  const size_t count = 20000;
  const auto x = gaussian(count, 90 + rank());
  const auto ex = exact_sum(x);
  for (const Layout& lay : multi_layouts()) {
    thc_comm_t comm = make(cfg_for(lay));
    for (thc_dtype_t dt : {THC_FLOAT32, THC_FLOAT64, THC_FLOAT16, THC_BFLOAT16}) {
      const auto t = thc::capi::to_dtype(dt);
      for (bool in_place : {true, false}) {
        std::vector<uint8_t> in(count * thc::engine::dtype_size(t)), out(in.size());
        thc::engine::store_from_float(x.data(), count, t, in.data(), 0);
        const thc_status_t st =
            in_place ? thc_allreduce(THC_IN_PLACE, in.data(), count, dt, THC_OP_AVG, comm, nullptr)
                     : thc_allreduce(in.data(), out.data(), count, dt, THC_OP_AVG, comm, nullptr);
        ASSERT_EQ(st, THC_SUCCESS) << thc_last_error();
        std::vector<float> got(count);
        thc::engine::load_as_float(in_place ? in.data() : out.data(), t, 0, count, nullptr, got.data());
        EXPECT_LT(nmse(got, ex, world()), 0.1) << lay.str() << " dtype " << dt << " in place " << in_place;
        EXPECT_TRUE(same_on_every_rank(got));
      }
    }
    thc_comm_destroy(comm);
  }
}

TEST(Hier, ErrorFeedbackConverges) {
  for (const Layout& lay : multi_layouts()) {
    thc_config_t c = cfg_for(lay);
    c.p = 0.2;  // heavy truncation: without error feedback the mean stays biased
    thc_comm_t comm = make(c);
    const size_t count = 8192 + 100;
    auto x = gaussian(count, 400 + rank());
    x[17 * rank()] = 40.0f;
    const auto ex = exact_sum(x);
    thc_state_t ef;
    thc_state_create(&ef);
    const int R = 100;
    std::vector<double> acc(count, 0);
    std::vector<float> out(count);
    for (int r = 0; r < R; ++r) {
      ASSERT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS)
          << thc_last_error();
      for (size_t i = 0; i < count; ++i) acc[i] += out[i] / R;
    }
    std::vector<float> avg(acc.begin(), acc.end());
    EXPECT_LT(nmse(avg, ex), 2e-3) << lay.str();
    // A state bound to this count, used with another on one rank: every rank fails alike and
    // the communicator goes on.
    std::vector<float> y(5000);
    EXPECT_EQ(thc_allreduce(x.data(), y.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, rank() == 0 ? ef : nullptr),
              THC_ERR_INVALID_ARG)
        << thc_last_error();
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS)
        << thc_last_error();
    thc_state_destroy(ef);
    thc_comm_destroy(comm);
  }
}

// NaN or Inf on any rank (one that only contributes, too): every rank fails before anything is
// reduced; output and error-feedback residual untouched; the communicator goes on.
TEST(Hier, NonFiniteInputFailsEveryRankBeforeAnything) {
  for (const Layout& lay : multi_layouts()) {
    for (int bad : {world() - 1, 1}) {
      thc_comm_t comm = make(cfg_for(lay));
      thc_state_t ef;
      thc_state_create(&ef);
      const size_t count = 9000;
      auto x = gaussian(count, rank());
      std::vector<float> out(count, 3.0f);
      ASSERT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS);
      const thc::engine::ErrorFeedback::Buffer residual = ef->ef.residual;
      std::fill(out.begin(), out.end(), 3.0f);
      if (rank() == bad) x[4321] = bad == 1 ? std::numeric_limits<float>::infinity() : std::nanf("");
      EXPECT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_ERR_NONFINITE)
          << lay.str() << ": " << thc_last_error();
      EXPECT_EQ(out, std::vector<float>(count, 3.0f));
      EXPECT_EQ(ef->ef.residual, residual);
      x[4321] = 0.0f;
      EXPECT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS)
          << thc_last_error();
      thc_state_destroy(ef);
      thc_comm_destroy(comm);
    }
  }
}

// Finite inputs whose host sum overflows float32 (two ranks of one host at 3e38): only the
// compressed stage of that slice sees the infinity. Every rank still fails with
// THC_ERR_NONFINITE before any output is written (the exchange after the compressed stage).
TEST(Hier, HostSumOverflowFailsEveryRankBeforeOutput) {
  for (const Layout& lay : multi_layouts()) {
    if (lay.sizes[0] < 2) continue;
    thc_comm_t comm = make(cfg_for(lay));
    const size_t count = 9000;
    auto x = gaussian(count, rank());
    if (lay.host_of(rank()) == 0 && lay.local_rank(rank()) < 2) x[count - 5] = 3e38f;
    std::vector<float> out(count, 3.0f);
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_ERR_NONFINITE)
        << lay.str() << ": " << thc_last_error();
    EXPECT_EQ(out, std::vector<float>(count, 3.0f));
    x[count - 5] = 1.0f;
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS)
        << thc_last_error();
    thc_comm_destroy(comm);
  }
}

// Disagreements across hosts are caught in the first exchange over the whole communicator:
// THC_ERR_CONFIG_MISMATCH on every rank, naming what differs, output untouched.
TEST(Hier, MismatchesFailEveryRank) {
  struct Variant {
    const char* name;
    const char* field;
    std::function<void(thc_config_t&)> cfg;
    size_t count;  // 0: differs across ranks
  };
  const std::vector<Variant> variants = {
      {"bits", "codec", [](thc_config_t& c) { c.bits = 3; }, 50000},
      {"chunk", "chunking", [](thc_config_t& c) { c.chunk_bytes = 4 * 4096 * 7; }, 50000},
      {"algo", "algorithm", [](thc_config_t& c) { c.algo = THC_ALGO_PS; }, 50000},
      {"count", "count", [](thc_config_t&) {}, 0},
  };
  for (const Layout& lay : multi_layouts()) {
    const int odd = world() - 1;  // on the last host
    for (const Variant& v : variants) {
      thc_config_t c = cfg_for(lay, -1, THC_ALGO_INT);
      if (rank() == odd) v.cfg(c);
      thc_comm_t comm = make(c);
      const size_t count = v.count ? v.count : (rank() == odd ? 50000 : 5000);
      auto x = gaussian(count, 70 + rank());
      std::vector<float> out(count, 5.0f);
      EXPECT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr),
                THC_ERR_CONFIG_MISMATCH)
          << lay.str() << " " << v.name << ": " << thc_last_error();
      EXPECT_NE(std::string(thc_last_error()).find(v.field), std::string::npos) << v.name << ": " << thc_last_error();
      EXPECT_EQ(out, std::vector<float>(count, 5.0f));
      if (v.count == 0) {
        std::vector<float> y(5000);
        auto x2 = gaussian(5000, 80 + rank());
        EXPECT_EQ(thc_allreduce(x2.data(), y.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS)
            << thc_last_error();
        EXPECT_LT(nmse(y, exact_sum(x2)), 0.1);
      }
      thc_comm_destroy(comm);
    }
  }
}

// A configuration that overflows on one rank fails that rank before exchanging: every rank
// fails with its status, and the communicator goes on.
TEST(Hier, OverflowOnOneRankFailsEveryRank) {
  for (const Layout& lay : multi_layouts()) {
    thc_config_t c = cfg_for(lay);
    if (rank() == 1) c.nat_levels = 15;  // too many for 16-bit sums of >= 2 hosts
    thc_comm_t comm = make(c);
    auto x = gaussian(5000, rank());
    std::vector<float> out(5000);
    EXPECT_EQ(cnat_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_ERR_OVERFLOW)
        << thc_last_error();
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), 5000, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS)
        << thc_last_error();
    thc_comm_destroy(comm);
  }
}

// THC_BIDIR with explicit levels on the compressed stage's workers (the hosts): refused when
// re-compression could overflow, exact otherwise (host sums of 1.0).
TEST(Hier, BidirWithExplicitLevelsOverflowsOrIsExact) {
  for (const Layout& lay : multi_layouts()) {
    const int n = lay.hosts();
    int levels = 1;
    while ((int64_t{n} << levels) <= 32767) ++levels;
    int64_t up = 1;
    while (up < (int64_t{n} << (levels - 1))) up <<= 1;
    thc_config_t c = cfg_for(lay, -1, THC_ALGO_PS);
    c.bidir = 1;
    c.nat_width = 16;
    c.nat_levels = levels;
    thc_comm_t comm = make(c);
    std::vector<float> x(20000, lay.local_rank(rank()) == 0 ? 1.0f : 0.0f), out(20000);
    const thc_status_t st = cnat_allreduce(x.data(), out.data(), x.size(), THC_FLOAT32, THC_OP_SUM, comm, nullptr);
    if (up <= 32767) {
      ASSERT_EQ(st, THC_SUCCESS) << thc_last_error();
      EXPECT_EQ(out, std::vector<float>(x.size(), static_cast<float>(n)));
    } else {
      EXPECT_EQ(st, THC_ERR_OVERFLOW) << thc_last_error();
    }
    thc_comm_destroy(comm);
  }
}

TEST(Hier, DisagreementOnTheKnobsFailsCreationOnEveryRank) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks";
  const Layout lay{{world() - 1, 1}};
  struct Variant {
    const char* name;
    thc_status_t expect;
    const char* says;
    std::function<void(thc_config_t&)> cfg;
  };
  const std::vector<Variant> variants = {
      {"hier", THC_ERR_CONFIG_MISMATCH, "THC_HIER", [](thc_config_t& c) { c.hier = 0; }},
      {"hosts", THC_ERR_CONFIG_MISMATCH, "THC_HIER_HOSTS",
       [](thc_config_t& c) { std::snprintf(c.hier_hosts, sizeof c.hier_hosts, "1,%d", world() - 1); }},
      {"malformed", THC_ERR_INVALID_ARG, "THC_HIER_HOSTS", [](thc_config_t& c) { std::strcpy(c.hier_hosts, "2,x"); }},
      {"too few", THC_ERR_INVALID_ARG, "THC_HIER_HOSTS", [](thc_config_t& c) { std::strcpy(c.hier_hosts, "1"); }},
  };
  for (const Variant& v : variants) {
    thc_config_t c = cfg_for(lay);
    if (rank() == 1) v.cfg(c);
    thc_comm_t comm = nullptr;
    EXPECT_EQ(thc_comm_create_mpi(MPI_COMM_WORLD, &c, &comm), v.expect) << v.name << ": " << thc_last_error();
    if (rank() == 1 || v.expect == THC_ERR_CONFIG_MISMATCH) {
      EXPECT_NE(std::string(thc_last_error()).find(v.says), std::string::npos) << v.name << ": " << thc_last_error();
    }
    EXPECT_EQ(comm, nullptr);
  }
}

// The wire bytes are the compressed stage's: per slice, one rank per host sends its packed
// indices (4 bits) and receives the sums (8 bits for up to 8 hosts) of its slice.
TEST(Hier, StatsCountTheCompressedStage) {
  for (const Layout& lay : multi_layouts()) {
    thc_comm_t comm = make(cfg_for(lay, -1, THC_ALGO_PS));
    const size_t count = 4096 * 10;
    const auto x = gaussian(count, 5 + rank());
    std::vector<float> out(count);
    for (int i = 0; i < 2; ++i)
      ASSERT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS);
    thc_stats_t st;
    thc_comm_stats(comm, &st);
    EXPECT_EQ(st.calls, 2u);
    EXPECT_EQ(st.elements, 2 * count);
    EXPECT_EQ(st.float_bytes, 2 * count * 4);
    EXPECT_EQ(st.hier_hosts, lay.hosts());
    uint64_t w[2] = {st.wire_bytes_up, st.wire_bytes_down}, all[2];
    MPI_Allreduce(w, all, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    EXPECT_EQ(all[0], 2 * count / 2 * lay.hosts()) << lay.str();
    EXPECT_EQ(all[1], 2 * count * lay.hosts()) << lay.str();
    const bool owner = lay.local_rank(rank()) < lay.slices();
    if (!owner) {
      EXPECT_EQ(st.wire_bytes_up, 0u);
    }
    thc_comm_destroy(comm);
  }
}

// ---- review of issue 12 (MPI path)

// A bad argument on one rank (here an unknown datatype) fails that call on every rank with its
// status, before anything is reduced, and the call counts: the next call pairs with the peers'
// next call. (Before, the rank refused it alone: the peers' call was completed by its next one.)
TEST(Hier, BadArgumentOnOneRankFailsThatCallOnEveryRank) {
  for (const Layout& lay : multi_layouts()) {
    thc_config_t c = cfg_for(lay);
    c.timeout_ms = 3000;  // without the fix the peers' second call waits for a partner that never comes
    thc_comm_t comm = make(c);
    const size_t count = 20000;
    const float one = lay.local_rank(rank()) == 0 ? 1.0f : 0.0f;
    std::vector<float> x1(count, one), x2(count, 64.0f * one), y1(count, 7.0f), y2(count, 7.0f);
    const thc_dtype_t dt = rank() == 1 ? static_cast<thc_dtype_t>(42) : THC_FLOAT32;
    EXPECT_EQ(cnat_allreduce(x1.data(), y1.data(), count, dt, THC_OP_SUM, comm, nullptr), THC_ERR_INVALID_ARG)
        << lay.str() << ": " << thc_last_error();
    if (rank() != 1) {
      EXPECT_NE(std::string(thc_last_error()).find("rank 1 (invalid argument)"), std::string::npos) << thc_last_error();
    }
    EXPECT_EQ(y1, std::vector<float>(count, 7.0f)) << lay.str();
    // Cnat adds the host sums (64 on each host) exactly.
    EXPECT_EQ(cnat_allreduce(x2.data(), y2.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS)
        << lay.str() << ": " << thc_last_error();
    EXPECT_EQ(y2, std::vector<float>(count, 64.0f * lay.hosts())) << lay.str();
    thc_comm_destroy(comm);
  }
}

// The message of a failure other ranks caused names every one of them, with its status (the
// ranks were a bitmap combined by MAX: only the highest survived).
TEST(Hier, MessagesNameEveryFailingRank) {
  if (world() < 3) GTEST_SKIP() << "needs three ranks";
  const int a = 1, b = world() - 1;
  for (const Layout& lay : multi_layouts()) {
    thc_config_t c = cfg_for(lay);
    if (rank() == b) c.nat_levels = 15;  // THC_ERR_OVERFLOW on rank b (16-bit sums of >= 2 hosts)
    thc_comm_t comm = make(c);
    const size_t count = 9000;
    auto x = gaussian(count, rank());
    std::vector<float> y(count);
    const thc_dtype_t dt = rank() == a ? static_cast<thc_dtype_t>(42) : THC_FLOAT32;
    EXPECT_NE(cnat_allreduce(x.data(), y.data(), count, dt, THC_OP_SUM, comm, nullptr), THC_SUCCESS);
    if (rank() != a && rank() != b) {
      const std::string m = thc_last_error();
      EXPECT_NE(m.find("rank " + std::to_string(a) + " (invalid argument)"), std::string::npos) << lay.str() << ": " << m;
      EXPECT_NE(m.find("rank " + std::to_string(b) + " (integer sums would overflow)"), std::string::npos) << lay.str() << ": " << m;
    }
    if (rank() == 0 || rank() == b) x[17] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(thc_allreduce(x.data(), y.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_ERR_NONFINITE);
    const std::string m = thc_last_error();
    EXPECT_NE(m.find("rank 0"), std::string::npos) << lay.str() << ": " << m;
    EXPECT_NE(m.find("rank " + std::to_string(b)), std::string::npos) << lay.str() << ": " << m;
    thc_comm_destroy(comm);
  }
}

// A call that fails at its second exchange (here: a host sum that overflows float32 in the last
// slice only) fails every rank before any output is written, and leaves every error-feedback
// residual as it was: the slices that did go through had advanced theirs.
TEST(Hier, FailureAfterTheCompressedStageKeepsTheResidual) {
  for (const Layout& lay : multi_layouts()) {
    if (lay.sizes[0] < 2 || lay.slices() < 2) continue;
    thc_comm_t comm = make(cfg_for(lay));
    thc_state_t ef;
    thc_state_create(&ef);
    const size_t count = 4096 * 8;
    auto x = gaussian(count, 30 + rank());
    std::vector<float> out(count, 3.0f);
    ASSERT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS)
        << thc_last_error();
    const thc::engine::ErrorFeedback::Buffer residual = ef->ef.residual;
    std::fill(out.begin(), out.end(), 3.0f);
    if (lay.host_of(rank()) == 0 && lay.local_rank(rank()) < 2) x[count - 5] = 3e38f;  // the last slice
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_ERR_NONFINITE)
        << lay.str() << ": " << thc_last_error();
    EXPECT_EQ(out, std::vector<float>(count, 3.0f)) << lay.str();
    EXPECT_EQ(ef->ef.residual, residual) << lay.str() << ": rank " << rank() << " (local rank "
                                         << lay.local_rank(rank()) << ")";
    x[count - 5] = 1.0f;
    EXPECT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS)
        << thc_last_error();
    thc_state_destroy(ef);
    thc_comm_destroy(comm);
  }
}

// A state on a hierarchical communicator holds only its rank's slice, twice (the residual and
// the update written beside it until every slice has made it): with S slices per host, about
// 2/S of the tensor, not the tensor (and no copy of it per call). Handed to a flat communicator
// afterwards, it reads as zero-padded to its count.
TEST(Hier, ErrorFeedbackStateHoldsItsSliceOnly) {
  for (const Layout& lay : multi_layouts()) {
    if (lay.slices() < 2) continue;
    thc_comm_t comm = make(cfg_for(lay));
    thc_comm_t flat = make(cfg_for(lay, 0));
    thc_state_t ef;
    thc_state_create(&ef);
    const size_t count = 4096 * 16;
    const auto x = gaussian(count, 50 + rank());
    std::vector<float> out(count);
    for (int call = 0; call < 3; ++call)
      ASSERT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, comm, ef), THC_SUCCESS)
          << thc_last_error();
    const bool owner = lay.local_rank(rank()) < lay.slices();
    const size_t held = ef->ef.residual.size() + ef->ef.next.size();
    EXPECT_EQ(ef->ef.count, count);
    if (owner) {
      EXPECT_EQ(ef->ef.residual.size(), ef->ef.next.size()) << lay.str();
      EXPECT_LE(ef->ef.residual.size(), count / lay.slices() + 4096) << lay.str() << ": rank " << rank();
      EXPECT_LE(held, 2 * (count / lay.slices() + 4096)) << lay.str() << ": rank " << rank();
    } else {
      EXPECT_EQ(held, 0u) << lay.str() << ": rank " << rank();
    }
    ASSERT_EQ(thc_allreduce(x.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, flat, ef), THC_SUCCESS)
        << thc_last_error();
    EXPECT_EQ(ef->ef.residual.size(), count);
    EXPECT_LT(nmse(out, exact_sum(x)), 0.1) << lay.str();
    thc_state_destroy(ef);
    thc_comm_destroy(flat);
    thc_comm_destroy(comm);
  }
}

// More than the host's shared memory holds (THC_HIER_ARENA_BYTES) streams through it in rounds:
// the result is bit for bit the one of a call that fits, in place or not, for every dtype, with
// error feedback, and NaN/Inf or a host sum that overflows still fail every rank before output.
TEST(Hier, CallsLargerThanTheArenaStreamInRoundsWithTheSameBits) {
  for (const Layout& lay : multi_layouts()) {
    thc_config_t big = cfg_for(lay), small = cfg_for(lay);
    small.hier_arena_bytes = 1 << 20;  // ~ 40K floats per slice and rank: several rounds below
    thc_comm_t a = make(big), b = make(small);
    const size_t count = 300000 + 17;
    const auto x = gaussian(count, 60 + rank());
    for (thc_dtype_t dt : {THC_FLOAT32, THC_BFLOAT16}) {
      const auto t = thc::capi::to_dtype(dt);
      std::vector<uint8_t> in(count * thc::engine::dtype_size(t));
      thc::engine::store_from_float(x.data(), count, t, in.data(), 0);
      std::vector<uint8_t> ya(in.size()), yb(in.size()), inplace = in;
      thc_state_t ea, eb;
      thc_state_create(&ea);
      thc_state_create(&eb);
      for (int call = 0; call < 2; ++call) {
        ASSERT_EQ(thc_allreduce(in.data(), ya.data(), count, dt, THC_OP_AVG, a, ea), THC_SUCCESS) << thc_last_error();
        ASSERT_EQ(thc_allreduce(in.data(), yb.data(), count, dt, THC_OP_AVG, b, eb), THC_SUCCESS) << thc_last_error();
        EXPECT_EQ(ya, yb) << lay.str() << " dtype " << dt << " call " << call;
        EXPECT_EQ(ea->ef.residual, eb->ef.residual) << lay.str();
      }
      // (both communicators: their call counts, which seed the randomness, stay equal)
      std::vector<uint8_t> inplace_a = in;
      ASSERT_EQ(thc_allreduce(THC_IN_PLACE, inplace_a.data(), count, dt, THC_OP_AVG, a, nullptr), THC_SUCCESS);
      ASSERT_EQ(thc_allreduce(THC_IN_PLACE, inplace.data(), count, dt, THC_OP_AVG, b, nullptr), THC_SUCCESS);
      EXPECT_EQ(inplace, inplace_a) << lay.str() << " dtype " << dt << " in place";
      std::vector<float> got(count);
      thc::engine::load_as_float(inplace.data(), t, 0, count, nullptr, got.data());
      EXPECT_LT(nmse(got, exact_sum(x), world()), 0.1) << lay.str();
      thc_state_destroy(ea);
      thc_state_destroy(eb);
    }
    std::vector<float> bad = x, out(count, 3.0f);
    if (rank() == world() - 1) bad[count / 2] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(thc_allreduce(bad.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, b, nullptr), THC_ERR_NONFINITE);
    EXPECT_EQ(out, std::vector<float>(count, 3.0f));
    bad = x;
    if (lay.sizes[0] >= 2 && lay.host_of(rank()) == 0 && lay.local_rank(rank()) < 2) bad[count - 5] = 3e38f;
    if (lay.sizes[0] >= 2) {
      EXPECT_EQ(thc_allreduce(bad.data(), out.data(), count, THC_FLOAT32, THC_OP_SUM, b, nullptr), THC_ERR_NONFINITE);
      EXPECT_EQ(out, std::vector<float>(count, 3.0f));
    }
    thc_comm_destroy(a);
    thc_comm_destroy(b);
  }
}

// THC_HIER=auto where /dev/shm is small (Docker's default is 64 MB; the ctest entry mounts 8 MB
// over it in a mount namespace of its own): the call the flat engine does must be done. The
// shared memory of 2 ranks for 2^20 floats is 3 x 4 MB.
TEST(Hier, SmallDevShmDoesNotFailCalls) {
  if (!std::getenv("THC_TEST_SMALL_SHM")) GTEST_SKIP() << "runs in its own mount namespace: tests/mpi_wrappers/private_shm.sh";
  for (const Layout& lay : multi_layouts()) {
    thc_comm_t comm = make(cfg_for(lay));
    ASSERT_EQ(hier_hosts(comm), lay.hosts());
    const size_t count = size_t{1} << 20;
    const auto x = gaussian(count, 70 + rank());
    std::vector<float> y(count);
    ASSERT_EQ(thc_allreduce(x.data(), y.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr), THC_SUCCESS)
        << lay.str() << ": " << thc_last_error();
    EXPECT_LT(nmse(y, exact_sum(x)), 0.1);
    thc_comm_destroy(comm);
  }
}

// ---- calls on several tensors: groups and fused nonblocking allreduces run as one stream

// A group's tensors: sizes from below one block to several, one empty, every dtype, in place and
// not, with and without error feedback.
struct GroupMember {
  size_t count;
  thc_dtype_t dt;
  bool in_place;
  bool ef;
};
const std::vector<GroupMember> kMembers = {
    {5000, THC_FLOAT32, false, true},  {0, THC_FLOAT32, false, false},    {1, THC_FLOAT32, false, false},
    {40003, THC_BFLOAT16, false, true}, {4096, THC_FLOAT32, true, false}, {777, THC_FLOAT16, false, false},
    {100000, THC_FLOAT32, false, true}, {12, THC_FLOAT64, true, true},    {9000, THC_FLOAT32, false, false},
};

struct GroupBuffers {
  std::vector<std::vector<uint8_t>> in, out;
  std::vector<thc_state_t> states;
  explicit GroupBuffers(const std::vector<GroupMember>& ms) : in(ms.size()), out(ms.size()), states(ms.size(), nullptr) {
    for (size_t t = 0; t < ms.size(); ++t)
      if (ms[t].ef) thc_state_create(&states[t]);
  }
  ~GroupBuffers() {
    for (thc_state_t s : states)
      if (s) thc_state_destroy(s);
  }
  // Inputs of call `call`; the outputs (the inputs, in place) filled with 3.
  void fill(const std::vector<GroupMember>& ms, int call) {
    for (size_t t = 0; t < ms.size(); ++t) {
      const auto dt = thc::capi::to_dtype(ms[t].dt);
      const auto x = gaussian(ms[t].count, static_cast<uint32_t>(1000 * t + 10 * call + rank()));
      in[t].assign(ms[t].count * thc::engine::dtype_size(dt), 0);
      thc::engine::store_from_float(x.data(), ms[t].count, dt, in[t].data(), 0);
      out[t].assign(in[t].size(), 0);
      const std::vector<float> three(ms[t].count, 3.0f);
      thc::engine::store_from_float(three.data(), ms[t].count, dt, out[t].data(), 0);
    }
  }
  std::vector<thc_tensor_t> tensors(const std::vector<GroupMember>& ms) {
    std::vector<thc_tensor_t> ts;
    for (size_t t = 0; t < ms.size(); ++t) {
      if (ms[t].in_place) out[t] = in[t];
      ts.push_back(thc_tensor_t{ms[t].in_place ? THC_IN_PLACE : in[t].data(), out[t].data(), ms[t].count, ms[t].dt,
                                states[t]});
    }
    return ts;
  }
};

// A group on a hierarchical communicator runs as one stream: one first exchange, the host sums of
// every tensor in one pass through the arena, and per slice one compressed group (the flat
// engine's stream path) over the tensors' pieces. Each piece keeps its tensor's slicing, so every
// result and residual is bit for bit that of the separate calls, also when the group is larger
// than the host's shared memory (rounds). (Before, a group ran tensor by tensor.)
TEST(Hier, GroupsRunAsOneStreamWithTheSeparateCallsBits) {
  for (const Layout& lay : multi_layouts()) {
    for (long arena : {0L, 1L << 20}) {
      thc_config_t cg = cfg_for(lay), cs = cfg_for(lay);
      if (arena) cg.hier_arena_bytes = arena;  // ~ 40K floats per slice and rank: the group streams in rounds
      thc_comm_t grouped = make(cg), separate = make(cs);
      ASSERT_EQ(hier_hosts(grouped), lay.hosts());
      GroupBuffers g(kMembers), s(kMembers);
      int groups = 0;
      for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
        for (int call = 0; call < 2; ++call) {
          const thc_op_t op = call ? THC_OP_AVG : THC_OP_SUM;
          g.fill(kMembers, call);
          s.fill(kMembers, call);
          std::vector<thc_tensor_t> tg = g.tensors(kMembers), ts = s.tensors(kMembers);
          ASSERT_EQ(thc_allreduce_group(scheme, tg.data(), tg.size(), op, grouped), THC_SUCCESS) << thc_last_error();
          ++groups;
          for (const thc_tensor_t& t : ts)
            ASSERT_EQ(thc_allreduce_scheme(scheme, t.sendbuf, t.recvbuf, t.count, t.dtype, op, separate, t.state),
                      THC_SUCCESS)
                << thc_last_error();
          for (size_t t = 0; t < kMembers.size(); ++t) {
            const std::string what = lay.str() + " arena " + std::to_string(arena) + " scheme " +
                                     std::to_string(scheme) + " call " + std::to_string(call) + " tensor " +
                                     std::to_string(t);
            EXPECT_EQ(g.out[t], s.out[t]) << what;
            if (kMembers[t].ef) {
              EXPECT_EQ(g.states[t]->ef.residual, s.states[t]->ef.residual) << what;
              EXPECT_EQ(g.states[t]->ef.count, s.states[t]->ef.count) << what;
            }
          }
        }
      }
      thc_stats_t a, b;
      thc_comm_stats(grouped, &a);
      thc_comm_stats(separate, &b);
      EXPECT_EQ(a.groups, static_cast<uint64_t>(groups)) << lay.str();
      EXPECT_EQ(a.grouped_tensors, static_cast<uint64_t>(groups) * (kMembers.size() - 1)) << lay.str();
      EXPECT_EQ(a.calls, b.calls) << lay.str();
      EXPECT_EQ(a.elements, b.elements) << lay.str();
      // The same codes; a group's runs start at whole bytes of codes in a chunk (a few padding
      // elements per tensor and chunk).
      EXPECT_GE(a.wire_bytes_up, b.wire_bytes_up) << lay.str();
      EXPECT_LE(a.wire_bytes_up, b.wire_bytes_up + b.wire_bytes_up / 100) << lay.str();
      EXPECT_GE(a.wire_bytes_down, b.wire_bytes_down) << lay.str();
      EXPECT_LE(a.wire_bytes_down, b.wire_bytes_down + b.wire_bytes_down / 100) << lay.str();
      thc_comm_destroy(grouped);
      thc_comm_destroy(separate);
    }
  }
}

// What fails a group fails it on every rank before any output is written, with the residuals
// as they were, and the communicator goes on: NaN/Inf in one tensor on one rank, counts that
// differ per tensor (with the same total), a host sum that overflows in one tensor only.
TEST(Hier, GroupFailuresFailEveryRankBeforeOutput) {
  const std::vector<GroupMember> ms = {
      {9000, THC_FLOAT32, false, false}, {20000, THC_FLOAT32, false, true}, {4096, THC_FLOAT32, false, false}};
  for (const Layout& lay : multi_layouts()) {
    thc_comm_t comm = make(cfg_for(lay));
    GroupBuffers g(ms);
    g.fill(ms, 0);
    std::vector<thc_tensor_t> ts = g.tensors(ms);
    ASSERT_EQ(thc_allreduce_group(THC_SCHEME_THC, ts.data(), ts.size(), THC_OP_SUM, comm), THC_SUCCESS)
        << thc_last_error();
    const thc::engine::ErrorFeedback::Buffer residual = g.states[1]->ef.residual;
    auto untouched = [&](const std::string& what) {
      for (size_t t = 0; t < ms.size(); ++t) {
        std::vector<float> got(ms[t].count);
        thc::engine::load_as_float(g.out[t].data(), thc::engine::DType::kF32, 0, ms[t].count, nullptr, got.data());
        EXPECT_EQ(got, std::vector<float>(ms[t].count, 3.0f)) << lay.str() << " " << what << " tensor " << t;
      }
      EXPECT_EQ(g.states[1]->ef.residual, residual) << lay.str() << " " << what << " rank " << rank();
    };

    // NaN on the last rank (it may only contribute), in the last tensor.
    g.fill(ms, 1);
    if (rank() == world() - 1) reinterpret_cast<float*>(g.in[2].data())[17] = std::nanf("");
    ts = g.tensors(ms);
    EXPECT_EQ(thc_allreduce_group(THC_SCHEME_THC, ts.data(), ts.size(), THC_OP_SUM, comm), THC_ERR_NONFINITE)
        << thc_last_error();
    untouched("NaN");

    // The first two tensors swapped on one rank (the same total count).
    g.fill(ms, 2);
    ts = g.tensors(ms);
    for (auto& t : ts) t.state = nullptr;
    if (rank() == world() - 1) std::swap(ts[0], ts[1]);
    EXPECT_EQ(thc_allreduce_group(THC_SCHEME_THC, ts.data(), ts.size(), THC_OP_SUM, comm), THC_ERR_CONFIG_MISMATCH)
        << thc_last_error();
    EXPECT_NE(std::string(thc_last_error()).find("tensors"), std::string::npos) << thc_last_error();
    untouched("counts");

    // A host sum that overflows float32 in the error-feedback tensor only: the compressed stage
    // of that slice fails, and with it every rank, before output.
    if (lay.sizes[0] >= 2) {
      g.fill(ms, 3);
      if (lay.host_of(rank()) == 0 && lay.local_rank(rank()) < 2) reinterpret_cast<float*>(g.in[1].data())[19990] = 3e38f;
      ts = g.tensors(ms);
      EXPECT_EQ(thc_allreduce_group(THC_SCHEME_THC, ts.data(), ts.size(), THC_OP_SUM, comm), THC_ERR_NONFINITE)
          << thc_last_error();
      untouched("host sum overflow");
    }

    g.fill(ms, 4);
    ts = g.tensors(ms);
    EXPECT_EQ(thc_allreduce_group(THC_SCHEME_THC, ts.data(), ts.size(), THC_OP_SUM, comm), THC_SUCCESS)
        << thc_last_error();
    EXPECT_TRUE(same_on_every_rank(std::vector<float>(reinterpret_cast<float*>(g.out[1].data()),
                                                      reinterpret_cast<float*>(g.out[1].data()) + ms[1].count)));
    thc_comm_destroy(comm);
  }
}

// Every tensor's nonblocking allreduce on `nb`, waited for together, then its blocking call on
// `blocking` (the same inputs in other buffers): whether both succeeded.
::testing::AssertionResult nonblocking_then_blocking(thc_scheme_t scheme, thc_op_t op, const std::vector<thc_tensor_t>& tn,
                                                     thc_comm_t nb, const std::vector<thc_tensor_t>& tb,
                                                     thc_comm_t blocking) {
  std::vector<thc_request_t> reqs(tn.size(), THC_REQUEST_NULL);
  for (size_t t = 0; t < tn.size(); ++t)
    if (thc_iallreduce_scheme(scheme, tn[t].sendbuf, tn[t].recvbuf, tn[t].count, tn[t].dtype, op, nb, tn[t].state,
                              &reqs[t]) != THC_SUCCESS)
      return ::testing::AssertionFailure() << "thc_iallreduce_scheme: " << thc_last_error();
  std::vector<thc_status_t> sts(tn.size());
  if (thc_waitall(reqs.size(), reqs.data(), sts.data()) != THC_SUCCESS)
    return ::testing::AssertionFailure() << "thc_waitall: " << thc_last_error();
  for (const thc_tensor_t& t : tb)
    if (thc_allreduce_scheme(scheme, t.sendbuf, t.recvbuf, t.count, t.dtype, op, blocking, t.state) != THC_SUCCESS)
      return ::testing::AssertionFailure() << "thc_allreduce_scheme: " << thc_last_error();
  return ::testing::AssertionSuccess();
}

// Nonblocking allreduces started back to back on a hierarchical communicator fuse into groups
// (Horovod's cycle), as on a flat one, with the bits of the blocking calls. Needs
// MPI_THREAD_MULTIPLE (its own ctest entry); below it, calls complete inside their start call.
TEST(Hier, NonblockingAllreducesFuse) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_MULTIPLE) GTEST_SKIP() << "needs MPI_THREAD_MULTIPLE: THC_TEST_THREAD_MULTIPLE=1";
  std::vector<GroupMember> ms;
  for (const GroupMember& m : kMembers)
    if (m.count) ms.push_back(m);
  for (const Layout& lay : multi_layouts()) {
    thc_config_t cf = cfg_for(lay), cb = cfg_for(lay);
    cf.fusion_bytes = 1 << 30;
    cf.fusion_cycle_ms = 300;
    thc_comm_t fused = make(cf), blocking = make(cb);
    GroupBuffers f(ms), b(ms);
    for (int it = 0; it < 2; ++it) {
      f.fill(ms, it);
      b.fill(ms, it);
      ASSERT_TRUE(nonblocking_then_blocking(THC_SCHEME_THC, THC_OP_AVG, f.tensors(ms), fused, b.tensors(ms), blocking));
      for (size_t t = 0; t < ms.size(); ++t) {
        EXPECT_EQ(f.out[t], b.out[t]) << lay.str() << " iteration " << it << " tensor " << t;
        if (ms[t].ef) {
          EXPECT_EQ(f.states[t]->ef.residual, b.states[t]->ef.residual) << lay.str() << " tensor " << t;
        }
      }
    }
    thc_stats_t st;
    thc_comm_stats(fused, &st);
    EXPECT_EQ(st.calls, 2 * ms.size()) << lay.str();
    EXPECT_EQ(st.groups, 2u) << lay.str() << ": a 300 ms cycle fuses each iteration's calls";
    EXPECT_EQ(st.grouped_tensors, 2 * ms.size()) << lay.str();
    // THC_FUSION_BYTES on one rank only (the others propose single calls: nothing fuses), and on
    // none (agreed at creation: no agreement per call), hierarchical and flat: the blocking
    // calls' bits.
    for (int combo = 0; combo < 4; ++combo) {
      const bool one = combo & 1;
      thc_config_t c = cfg_for(lay, combo & 2 ? 0 : -1), ct = c;
      c.fusion_bytes = one && rank() == 0 ? 1 << 30 : 0;
      c.fusion_cycle_ms = 300;
      thc_comm_t comm = make(c), twin = make(ct);
      ASSERT_EQ(hier_hosts(comm), combo & 2 ? 0 : lay.hosts());
      GroupBuffers x(ms), y(ms);
      x.fill(ms, 5);
      y.fill(ms, 5);
      ASSERT_TRUE(nonblocking_then_blocking(THC_SCHEME_CNAT, THC_OP_SUM, x.tensors(ms), comm, y.tensors(ms), twin));
      for (size_t t = 0; t < ms.size(); ++t) EXPECT_EQ(x.out[t], y.out[t]) << lay.str() << " one " << one << " tensor " << t;
      thc_comm_stats(comm, &st);
      EXPECT_EQ(st.groups, 0u) << lay.str() << " one " << one;
      thc_comm_destroy(comm);
      thc_comm_destroy(twin);
    }
    thc_comm_destroy(fused);
    thc_comm_destroy(blocking);
  }
}

// ---- reduce-scatter and allgather: the ranks' shards as the tensors of one hierarchical call

// Shard counts: equal (several blocks, not whole), unequal (one empty, some below a block), one
// large shard among small ones.
std::vector<size_t> shard_counts(int kind) {
  const int n = world();
  std::vector<size_t> c(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    if (kind == 0) c[q] = 3 * 4096 + 100;
    if (kind == 1) c[q] = q == 0 ? 0 : 3000 * q + 17;
    if (kind == 2) c[q] = q == 1 ? 40000 : 500;
  }
  return c;
}
size_t shard_offset(const std::vector<size_t>& c, int q) {
  return std::accumulate(c.begin(), c.begin() + q, size_t{0});
}

thc_stats_t stats_of(thc_comm_t comm) {
  thc_stats_t st;
  EXPECT_EQ(thc_comm_stats(comm, &st), THC_SUCCESS);
  return st;
}
// Wire bytes (up, down) summed over the ranks.
std::array<uint64_t, 2> wire_sum(const thc_stats_t& st) {
  uint64_t w[2] = {st.wire_bytes_up, st.wire_bytes_down}, all[2];
  MPI_Allreduce(w, all, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return {all[0], all[1]};
}

// A reduce-scatter on a hierarchical communicator reduces the shards over the hosts and decodes
// each on its rank's host only: rank r's result is bit for bit its shard's in an allreduce group
// of the shards (as on a flat communicator), with error feedback (the second call carries the
// residual), in place, in rounds through a small arena, and only the shards of a host travel down
// to it. (Before, it was the whole hierarchical allreduce, 1.5x its time on the testbed.)
TEST(Hier, ReduceScatterIsTheShardOfAGroupOfTheShards) {
  const int n = world(), me = rank();
  for (const Layout& lay : multi_layouts()) {
    for (int v = 0; v < 3; ++v) {  // the integer ring and the colocated PS; in rounds
      const long arena = v == 2 ? 1L << 20 : 0L;
      thc_config_t c = cfg_for(lay, -1, v == 0 ? THC_ALGO_INT : THC_ALGO_PS);
      if (arena) c.hier_arena_bytes = arena;
      thc_comm_t rs = make(c), grp = make(c);
      ASSERT_EQ(hier_hosts(rs), lay.hosts());
      for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
        for (int kind = 0; kind < 3; ++kind) {
          const std::vector<size_t> counts = shard_counts(kind);
          const size_t total = shard_offset(counts, n), off = shard_offset(counts, me);
          thc_state_t ef = nullptr;
          std::vector<thc_state_t> efs(static_cast<size_t>(n), nullptr);
          if (kind != 2) {
            thc_state_create(&ef);
            for (auto& s : efs) thc_state_create(&s);
          }
          for (int call = 0; call < 2; ++call) {
            const thc_op_t op = call ? THC_OP_AVG : THC_OP_SUM;
            const bool in_place = kind == 1;
            const std::string what = lay.str() + " arena " + std::to_string(arena) + " algo " + std::to_string(c.algo) +
                                     " scheme " + std::to_string(scheme) + " kind " + std::to_string(kind) + " call " +
                                     std::to_string(call);
            const auto x = gaussian(total, static_cast<uint32_t>(50 * kind + 7 * call + me));
            std::vector<float> y(in_place ? total : counts[me], 3.0f);
            if (in_place) y = x;
            ASSERT_EQ(thc_reduce_scatter(scheme, in_place ? THC_IN_PLACE : x.data(), y.data(), counts.data(),
                                         THC_FLOAT32, op, rs, ef),
                      THC_SUCCESS)
                << what << ": " << thc_last_error();
            y.resize(counts[me]);
            std::vector<std::vector<float>> gout(static_cast<size_t>(n));
            std::vector<thc_tensor_t> ts;
            for (int q = 0; q < n; ++q) {
              gout[q].assign(counts[q], 3.0f);
              ts.push_back(thc_tensor_t{x.data() + shard_offset(counts, q), gout[q].data(), counts[q], THC_FLOAT32,
                                        efs[static_cast<size_t>(q)]});
            }
            ASSERT_EQ(thc_allreduce_group(scheme, ts.data(), ts.size(), op, grp), THC_SUCCESS) << thc_last_error();
            EXPECT_EQ(y, gout[me]) << what;
            // (a second call with error feedback also carries the first call's residual)
            if (!y.empty() && (!ef || call == 0)) {
              const auto ex = exact_sum(x);
              EXPECT_LT(nmse(y, std::vector<double>(ex.begin() + off, ex.begin() + off + counts[me]),
                             call ? n : 1.0),
                        scheme == THC_SCHEME_CNAT ? 0.2 : 0.1)  // (Cnat: shards of 500 elements vary more)
                  << what;
            } else {
              exact_sum(x);
            }
            if (ef) {
              EXPECT_EQ(ef->ef.count, total) << what;
              EXPECT_LE(ef->ef.residual.size(), total) << what;  // (this rank's slice of it)
            }
          }
          if (ef) thc_state_destroy(ef);
          for (auto s : efs)
            if (s) thc_state_destroy(s);
        }
      }
      // As many calls and elements as the group's; each host receives the sums of its own shards only.
      const thc_stats_t a = stats_of(rs), b = stats_of(grp);
      EXPECT_EQ(a.calls, b.calls) << lay.str();
      EXPECT_EQ(a.elements, b.elements) << lay.str();
      const auto wa = wire_sum(a), wb = wire_sum(b);
      EXPECT_GE(wa[0], wb[0]) << lay.str();
      EXPECT_LE(wa[0], wb[0] + wb[0] / 50) << lay.str();
      EXPECT_LT(wa[1], wb[1] * 3 / 4) << lay.str() << ": down " << wa[1] << " against the group's " << wb[1];
      thc_comm_destroy(rs);
      thc_comm_destroy(grp);
    }
  }
}

// An allgather on a hierarchical communicator gathers each host's shards, encodes every shard
// once on its rank's host and decodes it on every host: identical bits everywhere, the error of
// one encoding (as the flat allgather's), codes sent once per shard. (Before, it was an allreduce
// of the shards zero-padded to the whole: every host sent codes for every element, twice the
// flat allgather's bytes on 2 hosts, and received sums, not codes.) Error feedback is the slice
// owners' (they encode), the state bound to the own shard.
TEST(Hier, AllgatherEncodesEachShardOnceOnItsHost) {
  const int n = world(), me = rank();
  for (const Layout& lay : multi_layouts()) {
    for (long arena : {0L, 1L << 20}) {
      thc_config_t c = cfg_for(lay);
      if (arena) c.hier_arena_bytes = arena;
      thc_comm_t h = make(c), flat = make(cfg_for(lay, 0));
      ASSERT_EQ(hier_hosts(h), lay.hosts());
      for (thc_scheme_t scheme : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
        for (int kind = 0; kind < 3; ++kind) {
          const std::vector<size_t> counts = shard_counts(kind);
          const size_t total = shard_offset(counts, n), off = shard_offset(counts, me);
          const bool in_place = kind == 2;
          const std::string what = lay.str() + " arena " + std::to_string(arena) + " scheme " +
                                   std::to_string(scheme) + " kind " + std::to_string(kind);
          const auto x = gaussian(counts[me], static_cast<uint32_t>(90 * kind + me));
          std::vector<float> all(total, 3.0f), fall(total, 3.0f);
          if (in_place) std::copy(x.begin(), x.end(), all.begin() + static_cast<ptrdiff_t>(off));
          const thc_stats_t before = stats_of(h), fbefore = stats_of(flat);
          ASSERT_EQ(thc_allgather(scheme, in_place ? THC_IN_PLACE : x.data(), all.data(), counts.data(), THC_FLOAT32,
                                  h, nullptr),
                    THC_SUCCESS)
              << what << ": " << thc_last_error();
          ASSERT_EQ(thc_allgather(scheme, x.data(), fall.data(), counts.data(), THC_FLOAT32, flat, nullptr),
                    THC_SUCCESS)
              << thc_last_error();
          thc_stats_t after = stats_of(h), fafter = stats_of(flat);
          after.wire_bytes_up -= before.wire_bytes_up;
          fafter.wire_bytes_up -= fbefore.wire_bytes_up;
          const uint64_t up = wire_sum(after)[0], fup = wire_sum(fafter)[0];
          EXPECT_TRUE(same_on_every_rank(all)) << what;
          std::vector<int> rc(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
          for (int q = 0; q < n; ++q) {
            rc[q] = static_cast<int>(counts[q]);
            displs[q] = static_cast<int>(shard_offset(counts, q));
          }
          std::vector<float> exact(total);
          MPI_Allgatherv(x.data(), static_cast<int>(x.size()), MPI_FLOAT, exact.data(), rc.data(), displs.data(),
                         MPI_FLOAT, MPI_COMM_WORLD);
          const std::vector<double> ex(exact.begin(), exact.end());
          const double e_hier = nmse(all, ex), e_flat = nmse(fall, ex);
          EXPECT_LT(e_hier, 1.2 * e_flat + 1e-6) << what << ": hierarchical " << e_hier << ", flat " << e_flat;
          // Codes go up once per element, as on the flat communicator (with a few bytes of padding
          // per piece and chunk).
          EXPECT_LE(up, fup + fup / 50 + 64 * static_cast<uint64_t>(n) * lay.slices()) << what << ": " << up << " vs " << fup;
        }
      }
      // With error feedback (on every rank, on rank 0 only, on none), under heavy truncation (the
      // mean of repeated calls stays biased without it): the slice owners keep the residual of the
      // pieces they encode, so the mean of repeated allgathers of the same input converges to it;
      // the states are bound to the own shard.
      thc_config_t ct = c;
      ct.p = 0.2;
      thc_comm_t trunc = make(ct);
      const std::vector<size_t> counts = shard_counts(0);
      const size_t total = shard_offset(counts, n);
      auto x = gaussian(counts[me], 5 + me);
      x[17 * me % counts[me]] = 40.0f;
      std::vector<int> rc(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
      for (int q = 0; q < n; ++q) {
        rc[q] = static_cast<int>(counts[q]);
        displs[q] = static_cast<int>(shard_offset(counts, q));
      }
      std::vector<float> exact(total);
      MPI_Allgatherv(x.data(), static_cast<int>(x.size()), MPI_FLOAT, exact.data(), rc.data(), displs.data(), MPI_FLOAT,
                     MPI_COMM_WORLD);
      const std::vector<double> ex(exact.begin(), exact.end());
      double mean_nmse[3] = {0, 0, 0};
      for (int who = 0; who < 3; ++who) {  // every rank, rank 0, none
        thc_state_t ef = nullptr;
        if (who == 0 || (who == 1 && me == 0)) thc_state_create(&ef);
        const int R = 40;
        std::vector<double> acc(total, 0.0);
        std::vector<float> all(total);
        const thc_stats_t before = stats_of(trunc);
        for (int r = 0; r < R; ++r) {
          ASSERT_EQ(thc_allgather(THC_SCHEME_THC, x.data(), all.data(), counts.data(), THC_FLOAT32, trunc, ef),
                    THC_SUCCESS)
              << thc_last_error();
          for (size_t i = 0; i < total; ++i) acc[i] += all[i] / static_cast<double>(R);
        }
        EXPECT_TRUE(same_on_every_rank(all));
        mean_nmse[who] = nmse(std::vector<float>(acc.begin(), acc.end()), ex);
        // hierarchical, error feedback or not: the codes cross to the other hosts once (the flat
        // allgather's ranks each receive every other rank's)
        thc_stats_t after = stats_of(trunc), fb = stats_of(flat);
        after.wire_bytes_down -= before.wire_bytes_down;
        ASSERT_EQ(thc_allgather(THC_SCHEME_THC, x.data(), all.data(), counts.data(), THC_FLOAT32, flat, nullptr),
                  THC_SUCCESS);
        thc_stats_t fa = stats_of(flat);
        fa.wire_bytes_down -= fb.wire_bytes_down;
        EXPECT_LT(wire_sum(after)[1] / R, wire_sum(fa)[1] * 3 / 4) << lay.str() << " error feedback on " << who;
        if (ef) {
          EXPECT_EQ(ef->ef.count, counts[me]);
          thc_state_destroy(ef);
        }
      }
      EXPECT_LT(mean_nmse[0], mean_nmse[2] / 5) << lay.str() << ": with error feedback " << mean_nmse[0]
                                                << ", without " << mean_nmse[2];
      thc_comm_destroy(trunc);
      thc_comm_destroy(h);
      thc_comm_destroy(flat);
    }
  }
}

// What fails a reduce-scatter or allgather fails it on every rank before any output, residual
// untouched, and the communicator goes on: NaN in one rank's input, shard counts that differ on
// one rank (same total), one rank calling an allreduce of the same count instead.
TEST(Hier, ShardCollectiveFailuresFailEveryRankBeforeOutput) {
  const int n = world(), me = rank();
  for (const Layout& lay : multi_layouts()) {
    thc_comm_t comm = make(cfg_for(lay));
    const std::vector<size_t> counts = shard_counts(0);
    const size_t total = shard_offset(counts, n);
    thc_state_t ef;
    thc_state_create(&ef);
    auto x = gaussian(total, 31 + me);
    std::vector<float> y(counts[me], 3.0f);
    ASSERT_EQ(thc_reduce_scatter(THC_SCHEME_THC, x.data(), y.data(), counts.data(), THC_FLOAT32, THC_OP_SUM, comm, ef),
              THC_SUCCESS)
        << thc_last_error();
    const thc::engine::ErrorFeedback::Buffer residual = ef->ef.residual;
    const std::vector<float> three(counts[me], 3.0f);
    // NaN on the last rank (at an element another host's rank owns)
    std::fill(y.begin(), y.end(), 3.0f);
    if (me == n - 1) x[5] = std::nanf("");
    EXPECT_EQ(thc_reduce_scatter(THC_SCHEME_THC, x.data(), y.data(), counts.data(), THC_FLOAT32, THC_OP_SUM, comm, ef),
              THC_ERR_NONFINITE)
        << lay.str() << ": " << thc_last_error();
    EXPECT_EQ(y, three);
    EXPECT_EQ(ef->ef.residual, residual);
    x[5] = 0.5f;
    // shard counts that differ on rank 0 (the same total)
    std::vector<size_t> other = counts;
    if (me == 0) {
      other[0] -= 10;
      other[1] += 10;
    }
    std::vector<float> big(total, 3.0f);
    EXPECT_EQ(thc_reduce_scatter(THC_SCHEME_THC, x.data(), big.data(), other.data(), THC_FLOAT32, THC_OP_SUM, comm,
                                 nullptr),
              THC_ERR_CONFIG_MISMATCH)
        << lay.str() << ": " << thc_last_error();
    EXPECT_NE(std::string(thc_last_error()).find("shards"), std::string::npos) << thc_last_error();
    EXPECT_EQ(big, std::vector<float>(total, 3.0f));
    // an allreduce of the whole on rank 0, a reduce-scatter elsewhere
    thc_status_t st;
    if (me == 0) {
      st = thc_allreduce(x.data(), big.data(), total, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
    } else {
      st = thc_reduce_scatter(THC_SCHEME_THC, x.data(), big.data(), counts.data(), THC_FLOAT32, THC_OP_SUM, comm,
                              nullptr);
    }
    EXPECT_EQ(st, THC_ERR_CONFIG_MISMATCH) << lay.str() << ": " << thc_last_error();
    EXPECT_NE(std::string(thc_last_error()).find("the collective"), std::string::npos) << thc_last_error();
    EXPECT_EQ(big, std::vector<float>(total, 3.0f));
    // an allgather with NaN in one rank's shard
    auto s = gaussian(counts[me], 77 + me);
    if (me == 1) s[counts[me] - 1] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(thc_allgather(THC_SCHEME_THC, s.data(), big.data(), counts.data(), THC_FLOAT32, comm, nullptr),
              THC_ERR_NONFINITE)
        << lay.str() << ": " << thc_last_error();
    EXPECT_EQ(big, std::vector<float>(total, 3.0f));
    // the communicator goes on
    ASSERT_EQ(thc_reduce_scatter(THC_SCHEME_THC, x.data(), y.data(), counts.data(), THC_FLOAT32, THC_OP_SUM, comm, ef),
              THC_SUCCESS)
        << thc_last_error();
    EXPECT_LT(nmse(y, [&] {
                const auto ex = exact_sum(x);
                const size_t off = shard_offset(counts, me);
                return std::vector<double>(ex.begin() + off, ex.begin() + off + counts[me]);
              }()),
              0.1);
    thc_state_destroy(ef);
    thc_comm_destroy(comm);
  }
}

// A peer that never calls: every wait is bounded by THC_TIMEOUT_MS; the communicator then
// refuses later calls. Its own ctest entry (the abandoned operations stay with MPI).
TEST(Hier, PeerThatNeverCallsGivesTimeout) {
  if (!std::getenv("THC_TEST_MPI_TIMEOUT")) GTEST_SKIP() << "runs alone: set THC_TEST_MPI_TIMEOUT=1";
  const std::vector<Layout> lays = multi_layouts();
  if (lays.empty()) GTEST_SKIP() << "needs three ranks";
  thc_config_t c = cfg_for(lays.front());
  c.timeout_ms = 1500;
  thc_comm_t comm = make(c);
  ASSERT_EQ(hier_hosts(comm), lays.front().hosts());
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
  // Creation: a rank that never creates its communicator.
  MPI_Comm parent;
  MPI_Comm_dup(MPI_COMM_WORLD, &parent);
  if (rank() == 0) {
    thc_comm_t lone;
    EXPECT_EQ(thc_comm_create_mpi(parent, &c, &lone), THC_ERR_TIMEOUT) << thc_last_error();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
