/* An unmodified MPI program (knows nothing of thc): used to test the PMPI interposer.
 * It checks its own results against exact double-precision allreduces and prints one line.
 * Exit status: 0 if everything matches the expectation given by argv[1]:
 *   "compressed BOUND": large float sums are approximate (not bit-exact): the first call's NMSE
 *     is at most BOUND, and the mean of the repeated calls at most BOUND / 2 (with error
 *     feedback, the interposer's default, each later call also carries the previous call's
 *     residual, so a later single call is up to about twice as far off; their mean is closer);
 *   "exact": everything is bit-exact. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int expect_compressed = argc > 1 && strcmp(argv[1], "compressed") == 0;
  const double bound = argc > 2 ? atof(argv[2]) : 0.1;
  int bad = 0;

  /* Large float SUM: compressed when the interposer is active. */
  const int big = 1 << 18;
  float* f = malloc(sizeof(float) * big);
  float* g = malloc(sizeof(float) * big);
  double* d = malloc(sizeof(double) * big);
  double* e = malloc(sizeof(double) * big);
  srand(rank + 1);
  for (int i = 0; i < big; ++i) {
    f[i] = (float)((rand() / (double)RAND_MAX) - 0.5);
    d[i] = f[i];
  }
  MPI_Allreduce(d, e, big, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  enum { kCalls = 4 };
  double* mean = calloc(big, sizeof(double));
  double err1 = 0, errm = 0, ref = 0;
  int exact = 1;
  for (int it = 0; it < kCalls; ++it) {
    MPI_Allreduce(f, g, big, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < big; ++i) {
      mean[i] += g[i] / (double)kCalls;
      if (it == 0) {
        err1 += (g[i] - e[i]) * (g[i] - e[i]);
        ref += e[i] * e[i];
      }
      if (fabs(g[i] - e[i]) > 1e-5) exact = 0;
    }
  }
  for (int i = 0; i < big; ++i) errm += (mean[i] - e[i]) * (mean[i] - e[i]);
  const double nmse = err1 / ref, nmse_mean = errm / ref;
  if (expect_compressed && (exact || nmse > bound || nmse_mean > bound / 2)) bad |= 1;
  if (!expect_compressed && !exact) bad |= 1;

  /* Small float SUM (below THC_MIN_BYTES) and integers: always exact. */
  float sf[16], sg[16];
  for (int i = 0; i < 16; ++i) sf[i] = (float)(i + rank);
  MPI_Allreduce(sf, sg, 16, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < 16; ++i)
    if (sg[i] != (float)(n * i + n * (n - 1) / 2)) bad |= 2;
  int* ia = malloc(sizeof(int) * big);
  int* ib = malloc(sizeof(int) * big);
  for (int i = 0; i < big; ++i) ia[i] = i % 1000 + rank;
  MPI_Allreduce(ia, ib, big, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < big; ++i)
    if (ib[i] != n * (i % 1000) + n * (n - 1) / 2) bad |= 4;
  /* A float MAX is never compressed. */
  MPI_Allreduce(f, g, big, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
  for (int i = 0; i < big; ++i)
    if (g[i] < f[i]) bad |= 8;

  int worst = 0;
  MPI_Allreduce(&bad, &worst, 1, MPI_INT, MPI_BOR, MPI_COMM_WORLD);
  if (rank == 0)
    printf("plain_allreduce_prog: expect=%s nmse(first call)=%.3g nmse(mean of %d calls)=%.3g bound=%g bitexact=%d "
           "status=%d\n",
           expect_compressed ? "compressed" : "exact", nmse, kCalls, nmse_mean, expect_compressed ? bound : 0.0, exact,
           worst);
  free(f); free(g); free(d); free(e); free(ia); free(ib); free(mean);
  MPI_Finalize();
  return worst ? 1 : 0;
}
