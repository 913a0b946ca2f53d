// What thc_overlap_perf and thc_fusion_perf share: the fatal error that ends every rank, byte
// sizes with K/M/G suffixes, the slowest rank's time, a median.
#pragma once

#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace thc_nb_perf {

inline int g_rank = 0, g_size = 1;
inline int g_provided = 0;  // the thread level MPI gave
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

// MPI with MPI_THREAD_MULTIPLE (the progress thread may use MPI), this rank and the world, then
// the command line; -1 to go on, else the exit status (help or a bad option; MPI finalized).
inline int init(CLI::App& app, int& argc, char**& argv, const char* tool) {
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &g_provided);
  g_tool = tool;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = g_rank == 0 ? app.exit(e) : e.get_exit_code();
    MPI_Finalize();
    return rc;
  }
  return -1;
}

}  // namespace thc_nb_perf
