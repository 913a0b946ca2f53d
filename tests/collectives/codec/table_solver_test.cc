#include "collectives/codec/table_solver.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "common/status.h"

namespace thc::codec {
namespace {

const std::vector<int> kRef30 = {0, 3, 5, 7, 9, 11, 13, 14, 16, 17, 19, 21, 23, 25, 27, 30};
const std::vector<int> kRef16 = {0, 2, 3, 4, 5, 6, 7, 8, 8, 9, 10, 11, 12, 13, 14, 16};

template <class F>
void ExpectInvalid(F&& f, const std::string& needle = "") {
  try {
    f();
    ADD_FAILURE() << "expected thc::Error";
  } catch (const thc::Error& e) {
    EXPECT_EQ(e.status(), thc::Status::kInvalidArgument);
    if (!needle.empty()) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

// Independent interval cost: composite Simpson on (x-a)(c-x) phi(x).
double SimpsonCost(double a, double c, int n = 2000) {
  const double h = (c - a) / n;
  auto f = [&](double x) { return (x - a) * (c - x) * normal_pdf(x); };
  double s = f(a) + f(c);
  for (int i = 1; i < n; ++i) s += f(a + i * h) * (i % 2 ? 4 : 2);
  return s * h / 3;
}

double IntervalCost(double a, double c) {
  const double m0 = normal_cdf(c) - normal_cdf(a);
  const double m1 = normal_pdf(a) - normal_pdf(c);
  const double m2 = m0 + a * normal_pdf(a) - c * normal_pdf(c);
  return -a * c * m0 + (a + c) * m1 - m2;
}

// Plain O(K g^2) DP, no monotonicity assumption: the reference for larger g.
double ReferenceDp(int bits, int g, double p) {
  const int K = 1 << bits;
  const double t = truncation_threshold(p);
  auto q = [&](int k) { return -t + k * 2 * t / g; };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> prev(g + 1, inf), cur(g + 1);
  prev[0] = 0;
  for (int k = 1; k < K; ++k) {
    std::fill(cur.begin(), cur.end(), inf);
    for (int j = k; j <= g; ++j)
      for (int i = k - 1; i < j; ++i) cur[j] = std::min(cur[j], prev[i] + IntervalCost(q(i), q(j)));
    prev.swap(cur);
  }
  return prev[g];
}

void ExpectValidTable(const TableSolution& s) {
  const int K = 1 << s.bits;
  ASSERT_EQ(static_cast<int>(s.table.size()), K);
  EXPECT_EQ(s.table.front(), 0);
  EXPECT_EQ(s.table.back(), s.granularity);
  for (int i = 1; i < K; ++i) EXPECT_LT(s.table[i - 1], s.table[i]);
  std::vector<int> mirror(K);
  for (int i = 0; i < K; ++i) mirror[i] = s.granularity - s.table[K - 1 - i];
  EXPECT_LE(s.table, mirror);  // documented tie rule
}

TEST(NormalTest, PdfCdf) {
  EXPECT_NEAR(normal_pdf(0), 0.3989422804014327, 1e-16);
  EXPECT_NEAR(normal_pdf(1.5), normal_pdf(-1.5), 0);
  EXPECT_EQ(normal_cdf(0), 0.5);
  EXPECT_NEAR(normal_cdf(1.959963984540054), 0.975, 1e-15);
  EXPECT_NEAR(normal_cdf(-6.361340902404056) / 1e-10, 1.0, 1e-13);
}

TEST(NormalTest, QuantileKnownValues) {
  EXPECT_NEAR(normal_quantile(0.975), 1.959963984540054, 1e-12);
  EXPECT_NEAR(normal_quantile(0.025), -1.959963984540054, 1e-12);
  EXPECT_NEAR(normal_quantile(1e-10), -6.361340902404056, 1e-12);
  EXPECT_NEAR(normal_quantile(1e-5), -4.2648907939228246, 1e-12);
  EXPECT_NEAR(normal_quantile(0.3), -0.52440051270804082, 1e-12);
  EXPECT_NEAR(normal_quantile(1e-300), -37.0470962993612, 1e-12);
  EXPECT_EQ(normal_quantile(0.5), 0.0);
}

TEST(NormalTest, QuantileSymmetry) {
  // Dyadic q: 1 - q is exact, so the reflection must be exact too.
  for (int k = 1; k < 1024; ++k) {
    const double q = k / 1024.0;
    EXPECT_EQ(normal_quantile(1 - q), -normal_quantile(q)) << q;
  }
}

TEST(NormalTest, QuantileRoundTrip) {
  // x -> Phi(x) -> Phi^-1: in the lower tail Phi(x) keeps full relative precision.
  for (double x = -37.0; x <= 0.0; x += 0.0137) {
    EXPECT_NEAR(normal_quantile(normal_cdf(x)), x, 1e-12) << x;
  }
  // q -> Phi^-1(q) -> Phi over (1e-300, 1 - 1e-16).
  for (double e = -300; e <= -0.31; e += 0.173) {
    const double q = std::pow(10.0, e);
    const double x = normal_quantile(q);
    // Rounding x to double alone moves Phi(x) by a relative ~|x| * ulp(x) ~ x^2 * 1.1e-16.
    EXPECT_NEAR(normal_cdf(x) / q, 1.0, 4e-16 * (1 + x * x)) << q;
    const double up = 1.0 - q;  // the upper half, where only absolute accuracy is meaningful
    if (up < 1.0) {
      EXPECT_NEAR(normal_cdf(normal_quantile(up)), up, 2e-16) << up;
    }
  }
  EXPECT_GT(normal_quantile(1 - 1e-16), 8.2);
}

TEST(NormalTest, QuantileErrors) {
  ExpectInvalid([] { normal_quantile(0.0); });
  ExpectInvalid([] { normal_quantile(1.0); });
  ExpectInvalid([] { normal_quantile(-0.5); });
  ExpectInvalid([] { normal_quantile(std::nan("")); });
}

TEST(NormalTest, TruncationThreshold) {
  EXPECT_NEAR(truncation_threshold(1.0 / 32), 2.1538746940614564, 1e-12);
  EXPECT_NEAR(truncation_threshold(1e-20), 9.3360448492340600, 1e-12);  // 1 - p/2 would round to 1
  EXPECT_NEAR(truncation_threshold(0.05), normal_quantile(0.975), 1e-12);
  ExpectInvalid([] { truncation_threshold(0.0); }, "p must be in (0, 1)");
  ExpectInvalid([] { truncation_threshold(1.0); }, "p must be in (0, 1)");
}

TEST(TableVarianceTest, ReferenceFigures) {
  // Density phi restricted to [-t, t], not renormalised by 1/(1-p): matches these figures.
  EXPECT_NEAR(table_variance(kRef30, 30, 1.0 / 32), 0.0130746, 1e-7);
  EXPECT_NEAR(table_variance(kRef16, 16, 1.0 / 32), 0.0143832, 1e-7);
}

TEST(TableVarianceTest, MatchesNumericalIntegration) {
  for (const auto& [table, g] : {std::pair{kRef30, 30}, std::pair{kRef16, 16}}) {
    const double t = truncation_threshold(1.0 / 32);
    double expect = 0;
    for (size_t i = 1; i < table.size(); ++i)
      if (table[i] != table[i - 1])
        expect += SimpsonCost(-t + table[i - 1] * 2 * t / g, -t + table[i] * 2 * t / g);
    EXPECT_NEAR(table_variance(table, g, 1.0 / 32), expect, 1e-13);
  }
}

TEST(TableVarianceTest, DuplicatesAndIdentity) {
  // Duplicates merge into one interval; [0, g] alone is one interval over [-t, t].
  const double t = truncation_threshold(0.1);
  EXPECT_NEAR(table_variance({0, 0, 5, 5}, 5, 0.1), SimpsonCost(-t, t), 1e-12);
  EXPECT_NEAR(table_variance({0, 5}, 5, 0.1), SimpsonCost(-t, t), 1e-12);
  EXPECT_GT(table_variance({0, 0, 0, 5}, 5, 0.1), table_variance({0, 1, 4, 5}, 5, 0.1));
}

TEST(TableVarianceTest, Errors) {
  ExpectInvalid([] { table_variance({0}, 1, 0.1); }, "power of two");
  ExpectInvalid([] { table_variance({0, 1, 2}, 2, 0.1); }, "power of two");
  ExpectInvalid([] { table_variance({}, 2, 0.1); }, "power of two");
  ExpectInvalid([] { table_variance(std::vector<int>(512, 0), 0, 0.1); }, "power of two");
  ExpectInvalid([] { table_variance({1, 2, 3, 4}, 4, 0.1); }, "table[0] must be 0");
  ExpectInvalid([] { table_variance({0, 1, 2, 3}, 4, 0.1); }, "last table entry");
  ExpectInvalid([] { table_variance({0, 3, 2, 4}, 4, 0.1); }, "non-decreasing");
  ExpectInvalid([] { table_variance({0, -1, 2, 4}, 4, 0.1); }, "outside");
  ExpectInvalid([] { table_variance({0, 4}, 0, 0.1); }, "granularity");
  ExpectInvalid([] { table_variance({0, 4}, 4, 0.0); }, "p must be");
  ExpectInvalid([] { table_variance({0, 4}, 4, 1.0); }, "p must be");
}

TEST(SolverTest, ReferenceConfigurations) {
  const TableSolution s30 = solve_optimal_table(4, 30, 1.0 / 32);
  ExpectValidTable(s30);
  EXPECT_NEAR(s30.t_p, 2.1538746940614564, 1e-12);
  EXPECT_NEAR(s30.expected_variance, 0.0130625, 1e-7);
  EXPECT_LE(s30.expected_variance, table_variance(kRef30, 30, 1.0 / 32));
  EXPECT_DOUBLE_EQ(s30.expected_variance, table_variance(s30.table, 30, 1.0 / 32));
  // Asymmetric optimum (its mirror ties; the lexicographically smaller one is returned).
  EXPECT_EQ(s30.table, (std::vector<int>{0, 3, 5, 7, 9, 11, 13, 14, 15, 17, 19, 21, 23, 25, 27, 30}));

  const TableSolution s16 = solve_optimal_table(4, 16, 1.0 / 32);
  ExpectValidTable(s16);
  EXPECT_NEAR(s16.expected_variance, 0.0130446, 1e-7);
  EXPECT_LE(s16.expected_variance, table_variance(kRef16, 16, 1.0 / 32));
  EXPECT_EQ(s16.table, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16}));
}

TEST(SolverTest, EqualsBruteForce) {
  for (double p : {1.0 / 32, 0.5, 1e-6, 0.9, 1e-3}) {
    for (int b = 1; b <= 4; ++b) {
      const int K = 1 << b;
      for (int g = K - 1; g <= (b <= 3 ? 12 : 18); ++g) {
        // All (K-2)-subsets of {1..g-1} via a selection mask.
        std::vector<char> pick(g - 1, 0);
        std::fill(pick.end() - (K - 2), pick.end(), 1);
        std::vector<std::pair<double, std::vector<int>>> all;
        do {
          std::vector<int> table{0};
          for (int i = 0; i < g - 1; ++i)
            if (pick[i]) table.push_back(i + 1);
          table.push_back(g);
          all.emplace_back(table_variance(table, g, p), table);
        } while (std::next_permutation(pick.begin(), pick.end()));
        double best = std::numeric_limits<double>::infinity();
        for (const auto& e : all) best = std::min(best, e.first);

        const TableSolution s = solve_optimal_table(b, g, p);
        SCOPED_TRACE("b=" + std::to_string(b) + " g=" + std::to_string(g) + " p=" + std::to_string(p));
        ExpectValidTable(s);
        EXPECT_NEAR(s.expected_variance, best, 1e-14 + 1e-13 * best);
        // The solver's table must be one of the (numerically tied) brute-force optima.
        bool found = false;
        for (const auto& e : all)
          if (e.second == s.table) found = e.first <= best + 1e-14 + 1e-13 * best;
        EXPECT_TRUE(found);
      }
    }
  }
}

TEST(SolverTest, EqualsQuadraticDp) {
  for (double p : {1.0 / 32, 0.2}) {
    for (int b = 1; b <= 6; ++b) {
      const int K = 1 << b;
      for (int g : {K - 1, K, 2 * K, 3 * K + 1, 100, 257}) {
        if (g < K - 1) continue;
        const TableSolution s = solve_optimal_table(b, g, p);
        SCOPED_TRACE("b=" + std::to_string(b) + " g=" + std::to_string(g));
        ExpectValidTable(s);
        const double ref = ReferenceDp(b, g, p);
        EXPECT_NEAR(s.expected_variance, ref, 1e-12 * ref);
      }
    }
  }
  const TableSolution s = solve_optimal_table(5, 600, 1.0 / 512);
  EXPECT_NEAR(s.expected_variance, ReferenceDp(5, 600, 1.0 / 512), 1e-12 * s.expected_variance);
}

TEST(SolverTest, Identity) {
  for (int b = 1; b <= 8; ++b) {
    const int K = 1 << b;
    const TableSolution s = solve_optimal_table(b, K - 1, 1.0 / 32);
    ASSERT_EQ(static_cast<int>(s.table.size()), K);
    for (int i = 0; i < K; ++i) EXPECT_EQ(s.table[i], i);
    EXPECT_DOUBLE_EQ(s.expected_variance, table_variance(s.table, K - 1, 1.0 / 32));
  }
}

TEST(SolverTest, LargestSize) {
  const TableSolution s = solve_optimal_table(8, kMaxSolverGranularity, 1.0 / 32);
  ExpectValidTable(s);
  // Never worse than the evenly spread subset of the same grid.
  std::vector<int> even(256);
  for (int i = 0; i < 256; ++i) even[i] = static_cast<int>(std::lround(i * 4096.0 / 255));
  EXPECT_LE(s.expected_variance, table_variance(even, 4096, 1.0 / 32));
  // Finer grids can only help.
  EXPECT_LE(s.expected_variance, solve_optimal_table(8, 255, 1.0 / 32).expected_variance);
}

TEST(SolverTest, Errors) {
  ExpectInvalid([] { solve_optimal_table(0, 30, 0.1); }, "bits");
  ExpectInvalid([] { solve_optimal_table(9, 600, 0.1); }, "bits");
  ExpectInvalid([] { solve_optimal_table(4, 14, 0.1); }, "granularity g=14 must be >= 2^b-1=15");
  ExpectInvalid([] { solve_optimal_table(4, 4097, 0.1); }, "4096");
  ExpectInvalid([] { solve_optimal_table(4, 30, 0.0); }, "p must be");
  ExpectInvalid([] { solve_optimal_table(4, 30, 1.0); }, "p must be");
  ExpectInvalid([] { solve_optimal_table(4, 30, std::nan("")); }, "p must be");
}

TEST(SolverTest, Json) {
  const TableSolution s = solve_optimal_table(2, 4, 0.5);
  const std::string j = table_to_json(s);
  EXPECT_EQ(j.rfind("{\"bits\":2,\"granularity\":4,\"p\":0.5,\"t_p\":", 0), 0u) << j;
  EXPECT_NE(j.find(",\"table\":[0,"), std::string::npos) << j;
  EXPECT_NE(j.find(",4],\"expected_variance\":"), std::string::npos) << j;
  EXPECT_EQ(j.back(), '}');
  // Full precision: the printed numbers read back exactly.
  const size_t at = j.find("\"t_p\":") + 6;
  EXPECT_EQ(std::strtod(j.c_str() + at, nullptr), s.t_p);
  const size_t ev = j.find("\"expected_variance\":") + 20;
  EXPECT_EQ(std::strtod(j.c_str() + ev, nullptr), s.expected_variance);
}

}  // namespace
}  // namespace thc::codec
