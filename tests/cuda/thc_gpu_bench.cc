// thc_gpu_bench: each CUDA codec kernel timed against a device-to-device copy of the same input
// bytes (count float32 values), and the NCCL-like allreduce on one rank against ncclAllReduce.
//
//   thc_gpu_bench [--count N] [--iters K] [--blocks 10,16,20] [--variants 0,1,...,7] [--csv FILE]
//
// --variants: THC's encode (packed, and values with error feedback) and decode are also timed
// with each listed LaunchOpts::kernel_variant (rows "... v<bits>"), each after its own parity check.
//
// Prints one table: kernel, block, time per call, input GB/s, and time / copy time (the copy is
// the floor any kernel that reads the input once and writes something can approach). Before
// timing, each configuration's codes and decode are compared with the host codec (exit 4 if
// they differ), so the bench is also a parity check that needs no test framework.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "cuda/thc_cuda.h"
#if defined(THC_CUDA_HAVE_NCCL)
#include "thc/thc_nccl.h"
#endif

namespace {

using thc::codec::Codec;
using thc::codec::Layout;
using thc::codec::Scheme;
namespace tc = thc::cuda;

#define CHECK(expr)                                                                              \
  do {                                                                                           \
    const cudaError_t e_ = (expr);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

struct Row {
  std::string name;
  int block_log2;
  double ms;
  double gbs;
  double vs_copy;
};

double time_ms(const std::function<void()>& f, int iters, cudaStream_t s) {
  f();  // warm-up (and first-call attribute setup)
  CHECK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) f();
  CHECK(cudaEventRecord(b, s));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / iters;
}

// GPU codes and decode against the host codec on 2B + 77 elements (bit-identical expected).
// Needs no test framework, so the parity check runs even where GoogleTest is missing.
uint64_t verify(const Codec& c, const tc::DeviceCodec& dc, cudaStream_t s, uint64_t* checked,
                const tc::LaunchOpts& opts = tc::LaunchOpts()) {
  const uint64_t n = 2 * c.block() + 77;
  const Layout lay = c.layout(n);
  std::vector<float> x(n);
  std::mt19937 gen(5);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(gen);
  std::vector<float> stats(lay.nblocks);
  c.prelude(x.data(), n, stats.data());
  const size_t wsz = thc::codec::int_size(c.sum_type());
  std::vector<uint8_t> hv(lay.wire_count * wsz + 8);
  Codec::EncodeOut ho;
  ho.values = hv.data();
  const thc::codec::CallRng hr{99, 1, 3};
  c.encode(lay, 0, lay.nblocks, x.data(), stats.data(), hr, ho);
  std::vector<float> hout(n);
  c.decode(lay, 0, lay.nblocks, hv.data(), stats.data(), hr, 1, false, hout.data());

  float *dx, *ds, *dout;
  uint8_t* dv;
  CHECK(cudaMalloc(&dx, n * 4));
  CHECK(cudaMalloc(&ds, lay.nblocks * 4));
  CHECK(cudaMalloc(&dout, n * 4));
  CHECK(cudaMalloc(&dv, hv.size()));
  CHECK(cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ds, stats.data(), lay.nblocks * 4, cudaMemcpyHostToDevice));
  tc::Rng rng;
  rng.seed = 99;
  rng.rank = 1;
  rng.round = 3;
  size_t et = 0, dt = 0;
  CHECK(tc::encode(nullptr, &et, dc, lay, 0, lay.nblocks, dx, tc::InType::kF32, nullptr, ds, rng, tc::EncodeOut(),
                   nullptr, s, opts));
  CHECK(tc::decode(nullptr, &dt, dc, lay, 0, lay.nblocks, dv, tc::ValueLayout::kNative, ds, rng, 1, false, dout,
                   tc::InType::kF32, nullptr, nullptr, s, opts));
  size_t tb = std::max(et, dt);
  void* temp;
  CHECK(cudaMalloc(&temp, tb));
  tc::EncodeOut o;
  o.values = dv;
  CHECK(tc::encode(temp, &tb, dc, lay, 0, lay.nblocks, dx, tc::InType::kF32, nullptr, ds, rng, o, nullptr, s, opts));
  std::vector<uint8_t> gv(hv.size());
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(gv.data(), dv, lay.wire_count * wsz, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(dv, hv.data(), hv.size(), cudaMemcpyHostToDevice));  // decode the host's values
  CHECK(tc::decode(temp, &tb, dc, lay, 0, lay.nblocks, dv, tc::ValueLayout::kNative, ds, rng, 1, false, dout,
                   tc::InType::kF32, nullptr, nullptr, s, opts));
  std::vector<float> gout(n);
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(gout.data(), dout, n * 4, cudaMemcpyDeviceToHost));
  uint64_t bad = 0;
  for (uint64_t i = 0; i < lay.wire_count; ++i)
    bad += thc::codec::load_int(c.sum_type(), hv.data(), i) != thc::codec::load_int(c.sum_type(), gv.data(), i);
  for (uint64_t i = 0; i < n; ++i) bad += std::memcmp(&hout[i], &gout[i], 4) != 0;
  *checked = lay.wire_count + n;
  cudaFree(temp);
  cudaFree(dx);
  cudaFree(ds);
  cudaFree(dout);
  cudaFree(dv);
  return bad;
}

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t count = uint64_t{1} << 26;
  int iters = 20;
  std::vector<int> blocks = {10, 16, 20};
  std::vector<int> variants = {0};
  const char* csv = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--count" && i + 1 < argc) count = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--blocks" && i + 1 < argc) blocks = parse_list(argv[++i]);
    else if (a == "--variants" && i + 1 < argc) variants = parse_list(argv[++i]);
    else if (a == "--csv" && i + 1 < argc) csv = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--count N] [--iters K] [--blocks 10,16,20] [--variants 0,1,2,3] [--csv FILE]\n",
                   argv[0]);
      return 1;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("thc_gpu_bench: no CUDA device, nothing to time\n");
    return 77;  // skipped (ctest SKIP_RETURN_CODE)
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("thc_gpu_bench: %s, %d SMs, count=%llu floats (%.1f MiB), %d iterations\n", prop.name,
              prop.multiProcessorCount, static_cast<unsigned long long>(count), count * 4.0 / (1 << 20), iters);

  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<float> hx(count);
  std::mt19937 gen(1);
  std::normal_distribution<float> nd;
  for (auto& v : hx) v = nd(gen);
  float *x, *y, *ef;
  CHECK(cudaMalloc(&x, count * 4));
  CHECK(cudaMalloc(&y, count * 4));
  CHECK(cudaMalloc(&ef, count * 4));
  CHECK(cudaMemcpy(x, hx.data(), count * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(ef, 0, count * 4));
  uint8_t *vals, *packed;
  CHECK(cudaMalloc(&vals, count * 4 + (1 << 21)));
  CHECK(cudaMalloc(&packed, count + (1 << 21)));

  const double bytes = count * 4.0;
  const double copy_ms = time_ms([&] { CHECK(cudaMemcpyAsync(y, x, count * 4, cudaMemcpyDeviceToDevice, s)); }, iters, s);
  std::vector<Row> rows;
  rows.push_back({"d2d copy", 0, copy_ms, bytes / copy_ms / 1e6, 1.0});
  auto add = [&](const std::string& name, int bl, double ms) {
    rows.push_back({name, bl, ms, bytes / ms / 1e6, ms / copy_ms});
  };

  uint64_t parity_bad = 0;
  for (int bl : blocks) {
    for (Scheme sch : {Scheme::kThc, Scheme::kCnat}) {
      thc::codec::Params p;
      p.scheme = sch;
      p.block_log2 = bl;
      const Codec c(p, 4);
      tc::DeviceCodec dc;
      CHECK(dc.init(c));
      uint64_t checked = 0;
      const uint64_t bad = verify(c, dc, s, &checked);
      std::printf("parity %-5s block 2^%-2d: %llu of %llu codes and outputs differ from the host codec\n",
                  thc::codec::scheme_name(sch), bl, static_cast<unsigned long long>(bad),
                  static_cast<unsigned long long>(checked));
      parity_bad += bad;
      const Layout lay = c.layout(count);
      float* stats;
      CHECK(cudaMalloc(&stats, lay.nblocks * 4 + 64));
      uint32_t* check;
      CHECK(cudaMalloc(&check, 64));
      size_t pt = 0, et = 0, dt = 0;
      CHECK(tc::prelude(nullptr, &pt, dc, lay, x, tc::InType::kF32, nullptr, stats, check, 0, s));
      CHECK(tc::encode(nullptr, &et, dc, lay, 0, lay.nblocks, x, tc::InType::kF32, nullptr, stats, tc::Rng(),
                       tc::EncodeOut(), nullptr, s));
      CHECK(tc::decode(nullptr, &dt, dc, lay, 0, lay.nblocks, vals, tc::ValueLayout::kNative, stats, tc::Rng(), 4, false,
                       y, tc::InType::kF32, nullptr, nullptr, s));
      size_t tb = std::max({pt, et, dt});
      void* temp;
      CHECK(cudaMalloc(&temp, tb));
      const std::string sn = thc::codec::scheme_name(sch);
      add(sn + " prelude", bl,
          time_ms([&] { CHECK(tc::prelude(temp, &tb, dc, lay, x, tc::InType::kF32, nullptr, stats, check, 0, s)); }, iters, s));
      tc::Rng rng;
      rng.seed = 7;
      tc::EncodeOut ov;
      ov.values = vals;
      ov.layout = tc::ValueLayout::kPairs;
      add(sn + " encode values", bl, time_ms([&] {
            CHECK(tc::encode(temp, &tb, dc, lay, 0, lay.nblocks, x, tc::InType::kF32, nullptr, stats, rng, ov, check, s));
          }, iters, s));
      tc::EncodeOut op;
      op.packed = packed;
      add(sn + " encode packed", bl, time_ms([&] {
            CHECK(tc::encode(temp, &tb, dc, lay, 0, lay.nblocks, x, tc::InType::kF32, nullptr, stats, rng, op, check, s));
          }, iters, s));
      tc::EncodeOut oe = ov;
      oe.residual = ef;
      add(sn + " encode values+EF", bl, time_ms([&] {
            CHECK(tc::encode(temp, &tb, dc, lay, 0, lay.nblocks, x, tc::InType::kF32, ef, stats, rng, oe, check, s));
          }, iters, s));
      add(sn + " decode", bl, time_ms([&] {
            CHECK(tc::decode(temp, &tb, dc, lay, 0, lay.nblocks, vals, tc::ValueLayout::kPairs, stats, rng, 4, false, y,
                             tc::InType::kF32, check, nullptr, s));
          }, iters, s));
      if (sch == Scheme::kThc) {
        for (int v : variants) {
          if (v == 0) continue;  // the rows above
          tc::LaunchOpts vo;
          vo.kernel_variant = v;
          uint64_t vchecked = 0;
          const uint64_t vbad = verify(c, dc, s, &vchecked, vo);
          std::printf("parity %-5s block 2^%-2d variant %d: %llu of %llu codes and outputs differ from the host codec\n",
                      sn.c_str(), bl, v, static_cast<unsigned long long>(vbad), static_cast<unsigned long long>(vchecked));
          parity_bad += vbad;
          const std::string vs = " v" + std::to_string(v);
          add(sn + " encode packed" + vs, bl, time_ms([&] {
                CHECK(tc::encode(temp, &tb, dc, lay, 0, lay.nblocks, x, tc::InType::kF32, nullptr, stats, rng, op, check,
                                 s, vo));
              }, iters, s));
          add(sn + " encode values+EF" + vs, bl, time_ms([&] {
                CHECK(tc::encode(temp, &tb, dc, lay, 0, lay.nblocks, x, tc::InType::kF32, ef, stats, rng, oe, check, s,
                                 vo));
              }, iters, s));
          add(sn + " decode" + vs, bl, time_ms([&] {
                CHECK(tc::decode(temp, &tb, dc, lay, 0, lay.nblocks, vals, tc::ValueLayout::kPairs, stats, rng, 4, false,
                                 y, tc::InType::kF32, check, nullptr, s, vo));
              }, iters, s));
        }
        // four ranks' shards of count/4 elements each: one aggregator's share of the whole tensor
        const uint64_t shard = count / 4 / 8 * 8;
        const size_t stride = shard * c.index_bits() / 8;
        add(sn + " lookup-sum 4 ranks", bl,
            time_ms([&] { CHECK(tc::lookup_sum(dc, packed, 4, stride, shard, vals, s)); }, iters, s));
      }
      cudaFree(temp);
      cudaFree(stats);
      cudaFree(check);
    }
  }

#if defined(THC_CUDA_HAVE_NCCL)
  {
    ncclComm_t nccl;
    const int dev = 0;
    if (ncclCommInitAll(&nccl, 1, &dev) == ncclSuccess) {
      const double nccl_ms = time_ms([&] {
        if (ncclAllReduce(x, y, count, ncclFloat32, ncclSum, nccl, s) != ncclSuccess) std::exit(3);
      }, iters, s);
      add("ncclAllReduce f32 (1 rank)", 0, nccl_ms);
      thc_config_t cfg;
      thc_config_init(&cfg);
      for (int algo : {THC_ALGO_INT, THC_ALGO_PS}) {
        cfg.algo = algo;
        thcNcclComm_t h;
        if (thcNcclCommInit(nccl, &cfg, &h) != ncclSuccess) {
          std::fprintf(stderr, "thcNcclCommInit: %s\n", thcNcclGetLastError());
          return 3;
        }
        for (thc_scheme_t sch : {THC_SCHEME_THC, THC_SCHEME_CNAT}) {
          const double ms = time_ms([&] {
            if (thcAllReduceEx(x, y, count, ncclFloat32, ncclSum, sch, h, nullptr, s) != ncclSuccess) {
              std::fprintf(stderr, "thcAllReduceEx: %s\n", thcNcclGetLastError());
              std::exit(3);
            }
          }, iters, s);
          add(std::string(sch == THC_SCHEME_THC ? "thcAllReduce" : "cnatAllReduce") + (algo == THC_ALGO_PS ? " ps" : " int") +
                  " (1 rank)",
              static_cast<int>(std::log2(static_cast<double>(cfg.block))), ms);
        }
        thcNcclCommDestroy(h);
      }
      ncclCommDestroy(nccl);
    }
  }
#endif

  std::printf("\n%-34s %6s %10s %10s %9s\n", "kernel", "block", "ms", "GB/s in", "x copy");
  for (const Row& r : rows) {
    char b[16] = "-";
    if (r.block_log2) std::snprintf(b, sizeof b, "2^%d", r.block_log2);
    std::printf("%-34s %6s %10.4f %10.1f %9.2f\n", r.name.c_str(), b, r.ms, r.gbs, r.vs_copy);
  }
  if (csv) {
    FILE* f = std::fopen(csv, "w");
    if (f) {
      std::fprintf(f, "kernel,block_log2,ms,gbs_in,x_copy\n");
      for (const Row& r : rows) std::fprintf(f, "%s,%d,%.6f,%.3f,%.4f\n", r.name.c_str(), r.block_log2, r.ms, r.gbs, r.vs_copy);
      std::fclose(f);
    }
  }
  std::printf("parity with the host codec: %s\n", parity_bad == 0 ? "ok (bit-identical)" : "DIFFERENCES (see above)");
  cudaFree(x);
  cudaFree(y);
  cudaFree(ef);
  cudaFree(vals);
  cudaFree(packed);
  return parity_bad == 0 ? 0 : 4;
}
