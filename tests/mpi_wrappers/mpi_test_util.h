// Helpers of the MPI tests (run under mpirun): ranks, inputs, exact sums, NMSE.
#pragma once

#include <mpi.h>

#include <random>
#include <vector>

namespace thc::test {

inline int rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world() {
  int n;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

inline std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// The sum over MPI_COMM_WORLD in double precision.
inline std::vector<double> exact_sum(const std::vector<float>& x) {
  std::vector<double> in(x.begin(), x.end()), out(x.size());
  MPI_Allreduce(in.data(), out.data(), static_cast<int>(in.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return out;
}

inline double nmse(const std::vector<float>& est, const std::vector<double>& ref, double scale = 1.0) {
  double e = 0, r = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = est[i] * scale - ref[i];
    e += d * d;
    r += ref[i] * ref[i];
  }
  return e / r;
}

// Whether every rank holds the same bits as rank 0.
inline bool same_on_every_rank(const std::vector<float>& v) {
  std::vector<float> r0 = v;
  MPI_Bcast(r0.data(), static_cast<int>(r0.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int mine = r0 == v ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

}  // namespace thc::test
