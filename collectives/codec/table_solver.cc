// Normal-distribution helpers and the exact optimal THC lookup-table solver.
//
// Cost model: X ~ N(0,1) clamped to [-t, t]; the grid is q_k = -t + k * 2t/g. Between two
// consecutive distinct table values a < c, unbiased stochastic rounding of x costs
// (x - q_a)(q_c - x). The density is phi restricted to [-t, t] (not renormalised by 1/(1-p)):
// that is the normalisation that reproduces the reference figures (see the tests).
//
// With A = q_a, C = q_c and the partial moments of phi over [A, C]
//   M0 = Phi(C) - Phi(A), M1 = phi(A) - phi(C), M2 = M0 + A phi(A) - C phi(C),
// the interval cost -AC M0 + (A+C) M1 - M2 simplifies to
//   w(A, C) = C phi(A) - A phi(C) - (1 + AC) M0.
//
// Solver: the cost is additive over intervals, so the optimum is a layered DP
//   D[k][j] = min_{i<j} D[k-1][i] + w(i, j).
// w satisfies the quadrangle inequality w(a,c) + w(b,d) <= w(a,d) + w(b,c) for a<=b<=c<=d
// (d^2 w / dA dC = -M0 < 0 for any positive density), so the leftmost argmin of each layer is
// non-decreasing in j and divide-and-conquer evaluates each layer exactly in O(g log g).
// Total O(2^bits * g log g) time and O(2^bits * g) memory (argmins for the traceback).
// Ties: the leftmost optimal predecessor at every DP step, then the lexicographically smaller of
// the table and its mirror image (see solve_optimal_table).
#include "collectives/codec/table_solver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/status.h"

namespace thc::codec {
namespace {

constexpr double kInvSqrt2Pi = 0.398942280401432677939946059934381868;
constexpr double kInvSqrt2 = 0.707106781186547524400844362104849039;

[[noreturn]] void invalid(const std::string& msg) { thc::fail(thc::Status::kInvalidArgument, msg); }

std::string fmt(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void check_p(double p) {
  if (!(p > 0.0 && p < 1.0)) invalid("p must be in (0, 1), got " + fmt(p));
}

// Acklam's rational approximation of Phi^-1 on (0, 0.5] (relative error < 1.15e-9).
double acklam_lower(double q) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01,  -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  if (q < 0.02425) {
    const double r = std::sqrt(-2.0 * std::log(q));
    return (((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]) /
           ((((d[0] * r + d[1]) * r + d[2]) * r + d[3]) * r + 1.0);
  }
  const double s = q - 0.5;
  const double r = s * s;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * s /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
}

// Phi^-1(q) for q in (0, 0.5]: x <= 0, where 0.5 * erfc(-x/sqrt2) keeps full relative accuracy.
// Halley steps run in long double so the result rounds correctly in nearly all cases, and so
// exp(x^2/2) cannot overflow even for subnormal q (where long double is wider than double).
double quantile_lower(double q) {
  long double x = acklam_lower(q);
  const long double ql = q;
  const long double inv_sqrt2 = 0.707106781186547524400844362104849039L;
  const long double inv_sqrt2pi = 0.398942280401432677939946059934381868L;
  for (int it = 0; it < 4; ++it) {
    const long double pdf = inv_sqrt2pi * std::exp(-0.5L * x * x);
    if (!(pdf > std::numeric_limits<long double>::min())) break;  // keep Acklam's estimate
    const long double u = (0.5L * std::erfc(-x * inv_sqrt2) - ql) / pdf;
    const long double nx = x - u / (1.0L + 0.5L * x * u);
    if (nx == x) break;
    x = nx;
  }
  return static_cast<double>(x);
}

// Interval cost in long double: the DP compares sums of ~2^bits terms, and the extra precision
// keeps rounding well below any real cost difference between grid tables.
using Real = long double;

struct Grid {
  std::vector<Real> q, pdf, cdf;  // q_k, phi(q_k), Phi(q_k)

  Grid(int g, double t) : q(g + 1), pdf(g + 1), cdf(g + 1) {
    const Real tt = t;
    for (int k = 0; k <= g; ++k) {
      // Computed as t*(2k-g)/g so the grid is exactly symmetric about 0.
      const Real x = tt * static_cast<Real>(2 * k - g) / static_cast<Real>(g);
      q[k] = x;
      pdf[k] = std::exp(-0.5L * x * x) / std::sqrt(2.0L * 3.141592653589793238462643383279502884L);
      cdf[k] = 0.5L * std::erfc(-x / std::sqrt(2.0L));
    }
  }

  Real cost(int i, int j) const {
    const Real a = q[i], c = q[j];
    return c * pdf[i] - a * pdf[j] - (1.0L + a * c) * (cdf[j] - cdf[i]);
  }
};

// One DP layer: cur[j] = min_{lo_i <= i < j} prev[i] + w(i, j) for j in [jlo, jhi], leftmost argmin.
struct Layer {
  const Grid& grid;
  const std::vector<Real>& prev;
  std::vector<Real>& cur;
  std::vector<int>& arg;

  void solve(int jlo, int jhi, int olo, int ohi) {
    while (jlo <= jhi) {
      const int mid = jlo + (jhi - jlo) / 2;
      const int top = std::min(ohi, mid - 1);
      Real best = std::numeric_limits<Real>::infinity();
      int besti = olo;
      for (int i = olo; i <= top; ++i) {
        const Real v = prev[i] + grid.cost(i, mid);
        if (v < best) {  // strict: keeps the leftmost argmin, which is what makes argmins monotone
          best = v;
          besti = i;
        }
      }
      cur[mid] = best;
      arg[mid] = besti;
      // Recurse on the smaller side to bound the stack depth; loop on the other.
      if (mid - jlo < jhi - mid) {
        solve(jlo, mid - 1, olo, besti);
        jlo = mid + 1;
        olo = besti;
      } else {
        solve(mid + 1, jhi, besti, ohi);
        jhi = mid - 1;
        ohi = besti;
      }
    }
  }
};

}  // namespace

double normal_pdf(double x) { return kInvSqrt2Pi * std::exp(-0.5 * x * x); }

double normal_cdf(double x) { return 0.5 * std::erfc(-x * kInvSqrt2); }

double normal_quantile(double q) {
  if (!(q > 0.0 && q < 1.0)) invalid("normal_quantile: q must be in (0, 1), got " + fmt(q));
  if (q > 0.5) return -quantile_lower(1.0 - q);  // 1 - q is exact for q in [0.5, 1)
  return quantile_lower(q);
}

double truncation_threshold(double p) {
  check_p(p);
  // -Phi^-1(p/2) rather than Phi^-1(1 - p/2): no rounding of 1 - p/2 for small p.
  return -quantile_lower(0.5 * p);
}

double table_variance(const std::vector<int>& table, int granularity, double p) {
  const size_t n = table.size();
  if (n < 2 || n > 256 || (n & (n - 1)) != 0)
    invalid("table size must be a power of two in 2..256, got " + std::to_string(n));
  if (granularity < 1) invalid("granularity must be >= 1, got " + std::to_string(granularity));
  check_p(p);
  if (table.front() != 0) invalid("table[0] must be 0, got " + std::to_string(table.front()));
  if (table.back() != granularity)
    invalid("last table entry must be g=" + std::to_string(granularity) + ", got " +
            std::to_string(table.back()));
  for (size_t i = 0; i < n; ++i) {
    if (table[i] < 0 || table[i] > granularity)
      invalid("table[" + std::to_string(i) + "]=" + std::to_string(table[i]) + " outside 0.." +
              std::to_string(granularity));
    if (i > 0 && table[i] < table[i - 1])
      invalid("table must be non-decreasing (table[" + std::to_string(i) + "]=" +
              std::to_string(table[i]) + " < table[" + std::to_string(i - 1) + "]=" +
              std::to_string(table[i - 1]) + ")");
  }
  const double t = truncation_threshold(p);
  const double step = 2.0 * t / granularity;
  double total = 0.0;
  for (size_t i = 1; i < n; ++i) {
    if (table[i] == table[i - 1]) continue;
    const double a = -t + table[i - 1] * step;
    const double c = -t + table[i] * step;
    // Mass in [a, c] from the tail that keeps it small, so the difference stays accurate.
    const double m0 = (a >= 0.0) ? 0.5 * (std::erfc(a * kInvSqrt2) - std::erfc(c * kInvSqrt2))
                                 : 0.5 * (std::erfc(-c * kInvSqrt2) - std::erfc(-a * kInvSqrt2));
    total += c * normal_pdf(a) - a * normal_pdf(c) - (1.0 + a * c) * m0;
  }
  return total;
}

TableSolution solve_optimal_table(int bits, int granularity, double p) {
  if (bits < 1 || bits > 8) invalid("bits must be in 1..8, got " + std::to_string(bits));
  const int K = 1 << bits;
  const int g = granularity;
  if (g < K - 1)
    invalid("granularity g=" + std::to_string(g) + " must be >= 2^b-1=" + std::to_string(K - 1));
  if (g > kMaxSolverGranularity)
    invalid("granularity g=" + std::to_string(g) + " must be <= " +
            std::to_string(kMaxSolverGranularity));
  check_p(p);

  TableSolution s;
  s.bits = bits;
  s.granularity = g;
  s.p = p;
  s.t_p = truncation_threshold(p);
  s.table.assign(K, 0);

  if (g == K - 1) {
    for (int i = 0; i < K; ++i) s.table[i] = i;  // the only subset: the identity table
  } else {
    const Grid grid(g, s.t_p);
    // Layer k places point k (k = 1..K-1); point k can sit at j in [k, g - (K-1-k)].
    std::vector<Real> prev(g + 1, std::numeric_limits<Real>::infinity()), cur(g + 1);
    prev[0] = 0;  // layer 0: point 0 at grid 0
    std::vector<std::vector<int>> arg(K, std::vector<int>(g + 1, 0));
    for (int k = 1; k < K; ++k) {
      std::fill(cur.begin(), cur.end(), std::numeric_limits<Real>::infinity());
      const int jlo = (k == K - 1) ? g : k;
      const int jhi = g - (K - 1 - k);
      Layer layer{grid, prev, cur, arg[k]};
      layer.solve(jlo, jhi, k - 1, jhi - 1);
      prev.swap(cur);
    }
    int j = g;
    for (int k = K - 1; k >= 0; --k) {
      s.table[k] = j;
      if (k > 0) j = arg[k][j];
    }
    // The problem is symmetric, so the mirror image g - T[K-1-i] of an optimum costs exactly the
    // same; which of the two the DP lands on depends on rounding. Return the lexicographically
    // smaller one so the answer is stable.
    std::vector<int> mirror(K);
    for (int i = 0; i < K; ++i) mirror[i] = g - s.table[K - 1 - i];
    if (mirror < s.table) s.table.swap(mirror);
  }
  s.expected_variance = table_variance(s.table, g, p);
  return s;
}

std::string table_to_json(const TableSolution& s) {
  std::string out = "{\"bits\":" + std::to_string(s.bits) +
                    ",\"granularity\":" + std::to_string(s.granularity) + ",\"p\":" + fmt(s.p) +
                    ",\"t_p\":" + fmt(s.t_p) + ",\"table\":[";
  for (size_t i = 0; i < s.table.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s.table[i]);
  }
  out += "],\"expected_variance\":" + fmt(s.expected_variance) + "}";
  return out;
}

}  // namespace thc::codec
