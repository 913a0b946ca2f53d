// What thc_overlap_perf and thc_fusion_perf share: the fatal error that ends every rank, byte
// sizes with K/M/G suffixes, the slowest rank's time, a median.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace thc_nb_perf {

inline int g_rank = 0, g_size = 1;
inline const char* g_tool = "thc_nb_perf";

[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "%s[%d]: %s\n", g_tool, g_rank, msg.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

// "64M", "1K", "4096", "1GB"... into bytes; false if it is not such a size.
inline bool parse_size(const std::string& s, uint64_t* out) {
  size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  if (i == 0) return false;
  uint64_t v = std::stoull(s.substr(0, i)), mul = 1;
  const std::string suf = s.substr(i);
  if (suf == "K" || suf == "k") mul = 1ull << 10;
  else if (suf == "M" || suf == "m") mul = 1ull << 20;
  else if (suf == "G" || suf == "g") mul = 1ull << 30;
  else if (!suf.empty() && suf != "B") return false;
  *out = v * mul;
  return true;
}

inline double slowest(double t) {
  double m = 0;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace thc_nb_perf
