// thc_gpu_mpi_check: several MPI processes (sharing one GPU or not) each compress a device
// buffer with the CUDA codec and aggregate through MPI integer allreduces -- the shape of a
// device-buffer MPI path: prelude on the GPU, MPI_Allreduce(MAX) of the statistics, GPU encode
// to value form, MPI_Allreduce(SUM) of the integers, GPU decode. Each rank checks the result
// against the host codec run on the same global statistics (bit-identical expected) and prints
// one line; rank 0 prints the verdict and timings.
//
//   mpirun -np 4 thc_gpu_mpi_check [count] [scheme thc|cnat]
#include <cuda_runtime.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "cuda/device_pointer.h"
#include "cuda/thc_cuda.h"

namespace {

using thc::codec::Codec;
using thc::codec::IntType;
using thc::codec::Layout;
namespace tc = thc::cuda;

#define CHECK(expr)                                                                                   \
  do {                                                                                                \
    const cudaError_t e_ = (expr);                                                                    \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));     \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                                   \
    }                                                                                                 \
  } while (0)

MPI_Datatype mpi_type(IntType t) {
  switch (t) {
    case IntType::kU8: return MPI_UINT8_T;
    case IntType::kU16: return MPI_UINT16_T;
    case IntType::kU32: return MPI_UINT32_T;
    case IntType::kI8: return MPI_INT8_T;
    case IntType::kI16: return MPI_INT16_T;
    case IntType::kI32: return MPI_INT32_T;
  }
  return MPI_DATATYPE_NULL;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const uint64_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (uint64_t{1} << 22) + 17;
  const std::string scheme = argc > 2 ? argv[2] : "thc";
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    if (rank == 0) std::printf("thc_gpu_mpi_check: no CUDA device, skipped\n");
    MPI_Finalize();
    return 0;
  }
  CHECK(cudaSetDevice(rank % ndev));

  thc::codec::Params p;
  if (!thc::codec::parse_scheme(scheme, &p.scheme)) {
    if (rank == 0) std::fprintf(stderr, "unknown scheme %s\n", scheme.c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  const Codec c(p, size);
  tc::DeviceCodec dc;
  CHECK(dc.init(c));
  const Layout lay = c.layout(count);
  const IntType st = c.sum_type();
  const size_t wsz = thc::codec::int_size(st);

  std::vector<float> hx(count);
  std::mt19937 gen(1000 + rank);
  std::normal_distribution<float> nd;
  for (auto& v : hx) v = nd(gen);

  float *dx, *dstats, *dout;
  uint8_t* dvals;
  CHECK(cudaMalloc(&dx, count * 4));
  CHECK(cudaMalloc(&dout, count * 4));
  CHECK(cudaMalloc(&dstats, lay.nblocks * 4 + 4));
  CHECK(cudaMalloc(&dvals, lay.wire_count * wsz + 8));
  CHECK(cudaMemcpy(dx, hx.data(), count * 4, cudaMemcpyHostToDevice));
  const int devptr_ok = thc_cuda_is_device_pointer(dx) == 1 && thc_cuda_is_device_pointer(hx.data()) == 0;

  size_t pt = 0, et = 0, dt = 0;
  CHECK(tc::prelude(nullptr, &pt, dc, lay, dx, tc::InType::kF32, nullptr, dstats, nullptr, 0, nullptr));
  CHECK(tc::encode(nullptr, &et, dc, lay, 0, lay.nblocks, dx, tc::InType::kF32, nullptr, dstats, tc::Rng(),
                   tc::EncodeOut(), nullptr, nullptr));
  CHECK(tc::decode(nullptr, &dt, dc, lay, 0, lay.nblocks, dvals, tc::ValueLayout::kNative, dstats, tc::Rng(), size,
                   false, dout, tc::InType::kF32, nullptr, nullptr, nullptr));
  size_t tb = std::max(pt, std::max(et, dt));
  void* temp;
  CHECK(cudaMalloc(&temp, tb));

  tc::Rng rng;
  rng.seed = 42;
  rng.rank = static_cast<uint32_t>(rank);
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  // 1. prelude on the GPU, MAX across ranks (as uint32 bit patterns)
  std::vector<float> stats(lay.nblocks);
  CHECK(tc::prelude(temp, &tb, dc, lay, dx, tc::InType::kF32, nullptr, dstats, nullptr, 0, nullptr));
  CHECK(cudaMemcpy(stats.data(), dstats, lay.nblocks * 4, cudaMemcpyDeviceToHost));
  MPI_Allreduce(MPI_IN_PLACE, stats.data(), static_cast<int>(lay.nblocks), MPI_UINT32_T, MPI_MAX, MPI_COMM_WORLD);
  CHECK(cudaMemcpy(dstats, stats.data(), lay.nblocks * 4, cudaMemcpyHostToDevice));
  // 2. encode on the GPU, integer SUM through MPI (host staging)
  tc::EncodeOut o;
  o.values = dvals;
  CHECK(tc::encode(temp, &tb, dc, lay, 0, lay.nblocks, dx, tc::InType::kF32, nullptr, dstats, rng, o, nullptr, nullptr));
  std::vector<uint8_t> vals(lay.wire_count * wsz + 8);
  CHECK(cudaMemcpy(vals.data(), dvals, lay.wire_count * wsz, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> gpu_own = vals;
  MPI_Allreduce(MPI_IN_PLACE, vals.data(), static_cast<int>(lay.wire_count), mpi_type(st), MPI_SUM, MPI_COMM_WORLD);
  CHECK(cudaMemcpy(dvals, vals.data(), lay.wire_count * wsz, cudaMemcpyHostToDevice));
  // 3. decode on the GPU
  CHECK(tc::decode(temp, &tb, dc, lay, 0, lay.nblocks, dvals, tc::ValueLayout::kNative, dstats, rng, size, true, dout,
                   tc::InType::kF32, nullptr, nullptr, nullptr));
  std::vector<float> out(count);
  CHECK(cudaMemcpy(out.data(), dout, count * 4, cudaMemcpyDeviceToHost));
  const double t1 = now();

  // host reference on the same global statistics
  const thc::codec::CallRng hr{42, static_cast<uint32_t>(rank), 0};
  std::vector<uint8_t> hvals(lay.wire_count * wsz + 8);
  thc::codec::Codec::EncodeOut ho;
  ho.values = hvals.data();
  c.encode(lay, 0, lay.nblocks, hx.data(), stats.data(), hr, ho);
  uint64_t code_mismatch = 0;
  for (uint64_t i = 0; i < lay.wire_count; ++i)
    code_mismatch += thc::codec::load_int(st, hvals.data(), i) != thc::codec::load_int(st, gpu_own.data(), i);
  MPI_Allreduce(MPI_IN_PLACE, hvals.data(), static_cast<int>(lay.wire_count), mpi_type(st), MPI_SUM, MPI_COMM_WORLD);
  std::vector<float> ref(count);
  c.decode(lay, 0, lay.nblocks, hvals.data(), stats.data(), hr, size, true, ref.data());
  uint64_t out_mismatch = 0;
  double num = 0, den = 0;
  std::vector<float> mean_x(count);
  for (uint64_t i = 0; i < count; ++i) out_mismatch += std::memcmp(&out[i], &ref[i], 4) != 0;
  // accuracy against the true mean
  MPI_Allreduce(hx.data(), mean_x.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  for (uint64_t i = 0; i < count; ++i) {
    const double m = mean_x[i] / size, d = out[i] - m;
    num += d * d;
    den += m * m;
  }
  uint64_t bad[3] = {code_mismatch, out_mismatch, devptr_ok ? 0u : 1u};
  MPI_Allreduce(MPI_IN_PLACE, bad, 3, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("thc_gpu_mpi_check: np=%d devices=%d scheme=%s count=%llu sums=%s  gpu+mpi %.2f ms  "
                "code mismatches %llu  output mismatches %llu  device-pointer check %s  NMSE vs mean %.3g\n",
                size, ndev, scheme.c_str(), static_cast<unsigned long long>(count), thc::codec::int_name(st),
                (t1 - t0) * 1e3, static_cast<unsigned long long>(bad[0]), static_cast<unsigned long long>(bad[1]),
                bad[2] ? "FAILED" : "ok", den > 0 ? num / den : 0.0);
    std::printf("%s\n", bad[0] == 0 && bad[1] == 0 && bad[2] == 0 ? "RESULT ok" : "RESULT FAILED");
  }
  cudaFree(temp);
  cudaFree(dx);
  cudaFree(dout);
  cudaFree(dstats);
  cudaFree(dvals);
  MPI_Finalize();
  return bad[0] == 0 && bad[1] == 0 && bad[2] == 0 ? 0 : 1;
}
