// The README's demo: every rank allreduces the same synthetic gradients with float32
// MPI_Allreduce, THC and Cnat, and rank 0 prints time, bytes on the wire per element and NMSE
// against an exact float64 allreduce.
//   mpirun -np 4 ./examples/thc_demo [elements]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "examples/synthetic.h"
#include "thc/thc_mpi.h"

namespace {

double nmse(const std::vector<float>& est, const std::vector<double>& ref) {
  double e = 0, r = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    e += (est[i] - ref[i]) * (est[i] - ref[i]);
    r += ref[i] * ref[i];
  }
  return e / r;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (size_t{1} << 23);
  const auto grad = thc::examples::synthetic_gradients(count, rank);

  std::vector<double> gd(grad.begin(), grad.end()), exact(count);
  MPI_Allreduce(gd.data(), exact.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) {
    std::fprintf(stderr, "%s\n", thc_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  thc_comm_t comm;
  if (thc_comm_create_mpi(MPI_COMM_WORLD, &cfg, &comm) != THC_SUCCESS) {
    std::fprintf(stderr, "%s\n", thc_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) {
    std::printf("thc %s demo: %d ranks, %zu float32 elements (%.1f MB) per rank\n", thc_version(), n, count,
                count * 4 / 1e6);
    std::printf("%-28s %10s %14s %12s\n", "method", "time_ms", "wire_B/elem", "nmse");
  }
  std::vector<float> out(count);
  struct Row {
    const char* name;
    int kind;  // -1 float32, else thc_scheme_t
    int algo;
  };
  const Row rows[] = {{"float32 MPI_Allreduce", -1, 0},  {"THC b=4 g=30 (int allreduce)", THC_SCHEME_THC, 1},
                      {"THC b=4 g=30 (colocated PS)", THC_SCHEME_THC, 2}, {"Cnat (int allreduce)", THC_SCHEME_CNAT, 1},
                      {"Cnat (colocated PS)", THC_SCHEME_CNAT, 2}};
  int rc = 0;
  for (const Row& r : rows) {
    thc_comm_t c = comm;
    if (r.kind >= 0) {
      thc_config_t k = cfg;
      k.algo = r.algo;
      if (thc_comm_create_mpi(MPI_COMM_WORLD, &k, &c) != THC_SUCCESS) {
        std::fprintf(stderr, "%s\n", thc_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    double best = 1e30;
    for (int it = 0; it < 3; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      if (r.kind < 0) {
        MPI_Allreduce(grad.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      } else if (thc_allreduce_scheme(static_cast<thc_scheme_t>(r.kind), grad.data(), out.data(), count,
                                      THC_FLOAT32, THC_OP_SUM, c, nullptr) != THC_SUCCESS) {
        std::fprintf(stderr, "rank %d: %s\n", rank, thc_last_error());
        rc = 1;
        break;
      }
      double dt = MPI_Wtime() - t0, mx;
      MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      best = mx < best ? mx : best;
    }
    double wire = n > 1 ? 2.0 * (n - 1) / n * 4 : 0;  // ring allreduce of float32
    if (r.kind >= 0) {
      thc_stats_t st;
      thc_comm_stats(c, &st);
      // Per element and rank: each rank sends its codes (value or index form) and receives sums;
      // the MPI algorithm moves (n-1)/n of that (PS) or 2(n-1)/n (ring allreduce of values).
      const double up = static_cast<double>(st.wire_bytes_up) / st.elements;
      const double down = static_cast<double>(st.wire_bytes_down) / st.elements;
      wire = n > 1 ? (st.last_algo == THC_ALGO_PS ? (n - 1.0) / n * (up + down) : 2.0 * (n - 1) / n * up) : 0;
      thc_comm_destroy(c);
    }
    if (rank == 0) std::printf("%-28s %10.1f %14.3f %12.3g\n", r.name, best * 1e3, wire, nmse(out, exact));
  }
  thc_comm_destroy(comm);
  MPI_Finalize();
  return rc;
}
