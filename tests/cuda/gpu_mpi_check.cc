// thc_gpu_mpi_check: several MPI processes (sharing one GPU or not) run THC_Allreduce /
// CNAT_Allreduce on device buffers -- the library's device path: prelude, encode and decode on
// the GPU, compressed integers staged through pinned host memory into MPI -- and compare every
// result bit with the same call on host buffers (same seed; dyadic inputs make both preludes
// exact). Rank 0 prints one line with the timings and the verdict.
//
//   mpirun -np 4 thc_gpu_mpi_check [count] [scheme thc|cnat] [iters]
#include <cuda_runtime.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/engine/device.h"
#include "cuda/thc_cuda.h"
#include "thc/thc_mpi.h"

namespace {

#define CHECK(expr)                                                                                   \
  do {                                                                                                \
    const cudaError_t e_ = (expr);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));     \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                                   \
    }                                                                                                 \
  } while (0)

#define CHECK_MPI(expr)                                                                               \
  do {                                                                                                \
    if ((expr) != MPI_SUCCESS) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, thc_last_error());           \
      MPI_Abort(MPI_COMM_WORLD, 3);                                                                   \
    }                                                                                                 \
  } while (0)

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  setenv("THC_SEED", "4242", 0);  // host and device communicators draw the same randomness
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int count = argc > 1 ? std::atoi(argv[1]) : (1 << 22) + 17;
  const std::string scheme = argc > 2 ? argv[2] : "thc";
  const int iters = argc > 3 ? std::atoi(argv[3]) : 5;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    if (rank == 0) std::printf("thc_gpu_mpi_check: no CUDA device, skipped\n");
    MPI_Finalize();
    return 77;  // ctest SKIP_RETURN_CODE
  }
  CHECK(cudaSetDevice(rank % ndev));
  // libthc_cuda registers its device path when loaded (libthc would load it on demand); naming
  // it here also serves the emulator build, a static library.
  thc::engine::set_device_backend(thc::cuda::engine_backend());
  auto fn = scheme == "cnat" ? CNAT_Allreduce : THC_Allreduce;

  std::vector<float> hx(count);
  std::mt19937 gen(1000 + rank);
  std::uniform_int_distribution<int> d(-128, 128);
  for (auto& v : hx) v = static_cast<float>(d(gen)) / 64.0f;

  float *dx, *dout;
  CHECK(cudaMalloc(&dx, count * sizeof(float)));
  CHECK(cudaMalloc(&dout, count * sizeof(float)));
  CHECK(cudaMemcpy(dx, hx.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  const bool devptr_ok = thc::engine::is_device_buffer(dx) && !thc::engine::is_device_buffer(hx.data());

  MPI_Comm host_comm, dev_comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &host_comm);
  MPI_Comm_dup(MPI_COMM_WORLD, &dev_comm);
  std::vector<float> href(count), out(count);
  uint64_t mismatch = 0;
  double t_dev = 0, t_host = 0;
  for (int it = 0; it < iters; ++it) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    CHECK_MPI(fn(dx, dout, count, MPI_FLOAT, MPI_SUM, dev_comm));
    double t1 = now();
    MPI_Barrier(MPI_COMM_WORLD);
    double t2 = now();
    CHECK_MPI(fn(hx.data(), href.data(), count, MPI_FLOAT, MPI_SUM, host_comm));
    double t3 = now();
    if (it > 0 || iters == 1) {  // the first call pays for set-up
      t_dev += t1 - t0;
      t_host += t3 - t2;
    }
    CHECK(cudaMemcpy(out.data(), dout, count * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < count; ++i) mismatch += std::memcmp(&out[i], &href[i], 4) != 0;
  }
  const int timed = iters > 1 ? iters - 1 : 1;

  // accuracy against the exact sum
  std::vector<float> sum(count);
  MPI_Allreduce(hx.data(), sum.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double num = 0, den = 0;
  for (int i = 0; i < count; ++i) {
    const double e = out[i] - sum[i];
    num += e * e;
    den += double(sum[i]) * sum[i];
  }
  thc_stats_t st{};
  THC_Comm_stats(dev_comm, &st);
  uint64_t bad[2] = {mismatch, devptr_ok ? 0u : 1u};
  MPI_Allreduce(MPI_IN_PLACE, bad, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  double tmax[2] = {t_dev / timed, t_host / timed};
  MPI_Allreduce(MPI_IN_PLACE, tmax, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  const bool ok = bad[0] == 0 && bad[1] == 0;
  if (rank == 0) {
    std::printf("thc_gpu_mpi_check: np=%d devices=%d scheme=%s count=%d algo=%s  device buffers %.2f ms  host buffers "
                "%.2f ms  mismatches %llu  device-pointer check %s  NMSE %.3g\n",
                size, ndev, scheme.c_str(), count, st.last_algo == THC_ALGO_PS ? "ps" : "int", tmax[0] * 1e3,
                tmax[1] * 1e3, static_cast<unsigned long long>(bad[0]), bad[1] ? "FAILED" : "ok",
                den > 0 ? num / den : 0.0);
    std::printf("%s\n", ok ? "RESULT ok" : "RESULT FAILED");
  }
  MPI_Comm_free(&host_comm);
  MPI_Comm_free(&dev_comm);
  cudaFree(dx);
  cudaFree(dout);
  MPI_Finalize();
  return ok ? 0 : 1;
}
