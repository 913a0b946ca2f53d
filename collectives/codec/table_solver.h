// Normal-distribution helpers and the exact optimal THC lookup-table solver.
#pragma once

#include <string>
#include <vector>

namespace thc::codec {

double normal_pdf(double x);
double normal_cdf(double x);
// Phi^-1(q) for q in (0, 1), accurate to 1e-12 (absolute) or better. Throws thc::Error
// (kInvalidArgument) outside (0, 1).
double normal_quantile(double q);
// t_p = Phi^-1(1 - p/2), the two-sided truncation threshold. p in (0, 1).
double truncation_threshold(double p);

struct TableSolution {
  int bits = 0;
  int granularity = 0;
  double p = 0;
  double t_p = 0;
  std::vector<int> table;  // 2^bits entries, non-decreasing, table[0] = 0, table.back() = g
  double expected_variance = 0;
};

// Expected stochastic-rounding variance (units of sigma^2 = 1) of X ~ N(0,1) clamped to ±t_p,
// quantised without bias onto the grid points -t_p + T[i] * 2t_p/g; clamped mass costs nothing
// (it lands exactly on ±t_p). Duplicate entries are allowed. Throws on a malformed table.
double table_variance(const std::vector<int>& table, int granularity, double p);

// The exact optimum of table_variance over all tables of 2^bits entries drawn from {0..g} that
// contain 0 and g (not only symmetric ones). bits in 1..8, g in [2^bits - 1, kMaxSolverGranularity].
// Throws thc::Error (kInvalidArgument) with a message otherwise.
constexpr int kMaxSolverGranularity = 4096;
TableSolution solve_optimal_table(int bits, int granularity, double p);

std::string table_to_json(const TableSolution& s);

}  // namespace thc::codec
