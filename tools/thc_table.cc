// thc-table: the exact optimal THC lookup table for a bit budget, granularity and truncation p.
//   thc-table -b 4 -g 30 -p 1/32 [--json]
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "common/status.h"
#include "collectives/codec/table_solver.h"

namespace {

// A finite decimal using the whole string, or false.
bool parse_number(const std::string& s, double* out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// "0.03125" or a fraction "1/32".
bool parse_p(const std::string& s, double* out) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return parse_number(s, out);
  double num = 0, den = 0;
  if (!parse_number(s.substr(0, slash), &num) || !parse_number(s.substr(slash + 1), &den) || den == 0)
    return false;
  *out = num / den;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Exact optimal THC lookup table (minimum expected stochastic-rounding variance of a "
               "N(0,1) coordinate truncated at t_p = Phi^-1(1 - p/2))"};
  int bits = 4;
  int granularity = 30;
  std::string p_text = "1/32";
  bool json = false;
  app.add_option("-b,--bits", bits, "bits per coordinate, 1..8")->capture_default_str();
  app.add_option("-g,--granularity", granularity,
                 "granularity g, 2^b-1.." + std::to_string(thc::codec::kMaxSolverGranularity))
      ->capture_default_str();
  app.add_option("-p,--p", p_text, "truncated fraction p in (0,1), decimal or fraction like 1/32")
      ->capture_default_str();
  app.add_flag("--json", json, "print one JSON object");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message
    return 2;
  }

  double p = 0;
  if (!parse_p(p_text, &p)) {
    std::fprintf(stderr, "thc-table: invalid -p '%s' (expected a decimal like 0.03125 or a fraction like 1/32)\n",
                 p_text.c_str());
    return 2;
  }

  thc::codec::TableSolution s;
  try {
    s = thc::codec::solve_optimal_table(bits, granularity, p);
  } catch (const thc::Error& e) {
    std::fprintf(stderr, "thc-table: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "thc-table: internal error: %s\n", e.what());
    return 1;
  }

  if (json) {
    std::printf("%s\n", thc::codec::table_to_json(s).c_str());
    return 0;
  }
  std::printf("bits:              %d\n", s.bits);
  std::printf("granularity:       %d\n", s.granularity);
  std::printf("p:                 %.17g\n", s.p);
  std::printf("t_p:               %.17g\n", s.t_p);
  std::printf("table:            ");
  for (int v : s.table) std::printf(" %d", v);
  std::printf("\nexpected variance: %.17g  (sigma^2 = 1, truncation error not counted)\n",
              s.expected_variance);
  return 0;
}
