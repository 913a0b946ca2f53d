// The CollNet plugin's device-buffer path (NCCL_PTR_CUDA) against its host-buffer path, as NCCL's
// proxy would drive both: R ranks as threads of one process, each with two CollNet communicators
// at one real thc-aggregator, one fed host buffers and one fed device buffers with the same inputs
// in the same order (same THC_SEED, so the same dithering): every result must be bit-identical.
// Then the refusals (wrong memory type, bad sizes, ranges outside their registration, a mix of
// host and device buffers) with their WARN text, a non-finite device input, and with --iters the
// time per call of the device path against NCCL's host-staged path (float32 copied to pinned host
// memory, the host codec, copied back) and the bytes each moves across PCIe.
//
// Two builds of this source:
//   collnet_device_emu_check  the plugin's sources linked in, the CUDA runtime emulated by the
//                             CPU emulator (tests/cuda/emu): "device" memory is the emulator's
//                             cudaMalloc, kernels run on CPU fibers. ctest; timings mean nothing.
//   collnet_device_check      dlopen()s the built libnccl-net-thc.so as NCCL does, real device
//                             buffers (perf/gpu_check.sh). Exit 77 when no device answers.
//
//   collnet_device_check [PLUGIN.so] [--ranks R] [--iters N] [--count C] [--scheme-bound B]
// Exit status: 0 every check passed, 1 a check failed, 77 no CUDA device.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/barrier.h"
#include "nccl_plugin/abi.h"
#include "switch_offload/protocol/auth.h"
#include "tests/switch_offload/aggregator_process.h"

using namespace thc::nccl_abi;

#if defined(THC_CUDA_EMULATION)
#include "tests/cuda/emu/cuda_emu.h"
extern "C" ncclCollNet_v11_t ncclCollNetPlugin_v11;  // nccl_plugin/versions.cc, linked in
#endif

namespace {

std::atomic<int> g_failures{0};
std::mutex g_out_mu;
std::unique_ptr<thc::test::AggregatorProcess> g_agg;
std::atomic<uint64_t> g_device_calls{0};

void say(const char* fmt, ...) {
  std::lock_guard<std::mutex> lk(g_out_mu);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stdout, fmt, ap);
  va_end(ap);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

// Ends the check at once: other ranks' requests may still run on buffers that unwinding would free.
// The aggregator is stopped first (it is a child process).
[[noreturn]] void abort_check() {
  static std::mutex mu;
  mu.lock();  // never unlocked: the first caller ends the process
  say("RESULT FAILED");
  g_agg.reset();
  std::_Exit(1);
}

#define CHECK(cond, ...)                                  \
  do {                                                    \
    if (!(cond)) {                                        \
      say("FAIL %s:%d: " #cond, __FILE__, __LINE__);      \
      say(__VA_ARGS__);                                   \
      g_failures.fetch_add(1);                            \
    }                                                     \
  } while (0)

#define CUDA_OK(expr)                                                                        \
  do {                                                                                       \
    const cudaError_t e_ = (expr);                                                           \
    if (e_ != cudaSuccess) {                                                                 \
      say("FAIL %s:%d: %s: %s", __FILE__, __LINE__, #expr, cudaGetErrorString(e_));          \
      abort_check();                                                                         \
    }                                                                                        \
  } while (0)

// ---- NCCL's logger: the WARNs are kept, so that a refusal's message can be checked
std::mutex g_log_mu;
std::vector<std::string> g_warns;
std::vector<std::string> g_infos;

void logger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lk(g_log_mu);
  (level == NCCL_LOG_WARN ? g_warns : g_infos).emplace_back(buf);
  if (std::getenv("THC_TEST_VERBOSE")) std::fprintf(stderr, "[log %d] %s\n", static_cast<int>(level), buf);
}

// The WARNs logged since mark that contain every word of want (the refusals run on one thread at
// a time, see refusals()).
size_t warn_mark() {
  std::lock_guard<std::mutex> lk(g_log_mu);
  return g_warns.size();
}
bool warned_since(size_t mark, const std::vector<const char*>& want) {
  std::lock_guard<std::mutex> lk(g_log_mu);
  for (size_t i = mark; i < g_warns.size(); ++i) {
    bool all = true;
    for (const char* w : want) all = all && g_warns[i].find(w) != std::string::npos;
    if (all) return true;
  }
  return false;
}

using thc_testing::Barrier;

struct TypeDesc {
  const char* name;
  ncclDataType_t nccl;
  size_t size;
};
constexpr TypeDesc kTypes[] = {{"float32", ncclFloat32, 4}, {"float16", ncclFloat16, 2}, {"bfloat16", ncclBfloat16, 2}};

uint16_t to_half(float f) {
  // Round to nearest even through the bit pattern; the inputs are small normal numbers.
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(h);
}
uint16_t to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
float from_half(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | (static_cast<uint32_t>(exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Deterministic per (rank, case); the exact float sum is recomputed from the same generator.
std::vector<float> input_values(int rank, int id, size_t count) {
  std::mt19937 g(static_cast<unsigned>(1000 * id + rank + 1));
  std::normal_distribution<float> d(0.5f * static_cast<float>(rank % 3), 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = d(g);
  return v;
}
std::vector<uint8_t> encode_as(const TypeDesc& t, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * t.size);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.nccl == ncclFloat32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = t.nccl == ncclFloat16 ? to_half(v[i]) : to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}
float value_at(const TypeDesc& t, const uint8_t* p, size_t i) {
  if (t.nccl == ncclFloat32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return t.nccl == ncclFloat16 ? from_half(h) : from_bf16(h);
}

struct Options {
  int ranks = 3;
  int iters = 0;
  size_t count = size_t{1} << 22;
  double bound = 0.1;
};

struct Shared {
  ncclCollNet_v11_t* cn = nullptr;
  Options opt;
  std::unique_ptr<Barrier> barrier;
  std::vector<std::vector<char>> handles[2];  // [comm][rank]
  // timing (rank 0 reports the slowest rank's median)
  std::mutex t_mu;
  std::vector<double> t_dev, t_host;
};

// A call that should have worked and did not: the requests of every rank may still be running on
// buffers this thread would free, so the check ends here.
#define NCCL_OK(expr)                                                                   \
  do {                                                                                  \
    const ncclResult_t r_ = (expr);                                                     \
    if (r_ != ncclSuccess) {                                                            \
      say("FAIL %s:%d: %s returned %d", __FILE__, __LINE__, #expr, static_cast<int>(r_)); \
      abort_check();                                                                    \
    }                                                                                   \
  } while (0)

// Polls test() until done (120 s at most, a hang is a failure).
ncclResult_t wait_req(ncclCollNet_v11_t* cn, void* req, int* size) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    int done = 0;
    const ncclResult_t r = cn->test(req, &done, size);
    if (r != ncclSuccess || done) return r;
    if (std::chrono::steady_clock::now() > end) {
      say("FAIL: a request did not finish within 120 s");
      abort_check();
    }
    std::this_thread::yield();
  }
}

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) { CUDA_OK(cudaMalloc(&p, std::max<size_t>(bytes, 1))); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

// One allreduce on host buffers through comm h, and the same on device buffers through comm d;
// returns the host result and the device result copied back.
void host_and_device(Shared& s, void* h, void* d, const TypeDesc& t, const std::vector<uint8_t>& in, bool in_place,
                     std::vector<uint8_t>* host_out, std::vector<uint8_t>* dev_out) {
  ncclCollNet_v11_t* cn = s.cn;
  const size_t count = in.size() / t.size;
  const size_t bytes = in.size();
  // host
  std::vector<uint8_t> hs = in, hr(bytes, 0xee);
  void *hsm = nullptr, *hrm = nullptr;
  NCCL_OK(cn->regMr(h, hs.data(), bytes, NCCL_PTR_HOST, &hsm));
  NCCL_OK(cn->regMr(h, hr.data(), bytes, NCCL_PTR_HOST, &hrm));
  void* hreq = nullptr;
  NCCL_OK(cn->iallreduce(h, hs.data(), in_place ? hs.data() : hr.data(), count, t.nccl, ncclSum, hsm,
                         in_place ? hsm : hrm, &hreq));
  // device, posted while the host request runs (the two comms are independent)
  DevBuf ds(bytes), dr(bytes);
  CUDA_OK(cudaMemcpy(ds.p, in.data(), bytes, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dr.p, 0xee, bytes));
  void *dsm = nullptr, *drm = nullptr;
  NCCL_OK(cn->regMr(d, ds.p, bytes, NCCL_PTR_CUDA, &dsm));
  NCCL_OK(cn->regMr(d, dr.p, bytes, NCCL_PTR_CUDA, &drm));
  void* dreq = nullptr;
  NCCL_OK(cn->iallreduce(d, ds.p, in_place ? ds.p : dr.p, count, t.nccl, ncclSum, dsm, in_place ? dsm : drm, &dreq));
  g_device_calls.fetch_add(1);
  CHECK(hreq && dreq, "a NULL request with two in flight");
  int hsize = -1, dsize = -1;
  NCCL_OK(wait_req(cn, hreq, &hsize));
  NCCL_OK(wait_req(cn, dreq, &dsize));
  CHECK(hsize == static_cast<int>(bytes) && dsize == static_cast<int>(bytes), "sizes %d / %d, want %zu", hsize, dsize,
        bytes);
  *host_out = in_place ? hs : hr;
  dev_out->assign(bytes, 0);
  CUDA_OK(cudaMemcpy(dev_out->data(), in_place ? ds.p : dr.p, bytes, cudaMemcpyDeviceToHost));
  NCCL_OK(cn->deregMr(h, hsm));
  NCCL_OK(cn->deregMr(h, hrm));
  NCCL_OK(cn->deregMr(d, dsm));
  NCCL_OK(cn->deregMr(d, drm));
}

void parity(Shared& s, int rank, void* h, void* d) {
  const long block = [] {
    const char* b = std::getenv("THC_BLOCK");
    return b ? std::atol(b) : 16384L;
  }();
  const size_t counts[] = {1, 1001, static_cast<size_t>(block - 1), static_cast<size_t>(block + 1),
                           static_cast<size_t>(3 * block + 17)};
  int id = 0;
  double err = 0, ref = 0;
  for (const TypeDesc& t : kTypes)
    for (size_t count : counts)
      for (bool in_place : {false, true}) {
        if (in_place && count != counts[4]) continue;
        ++id;
        const std::vector<uint8_t> in = encode_as(t, input_values(rank, id, count));
        std::vector<uint8_t> ho, dout;
        host_and_device(s, h, d, t, in, in_place, &ho, &dout);
        size_t first = ho.size();
        for (size_t i = 0; i < ho.size(); ++i)
          if (ho[i] != dout[i]) {
            first = i;
            break;
          }
        CHECK(first == ho.size(), "rank %d %s count %zu%s: device result differs from the host result at byte %zu", rank,
              t.name, count, in_place ? " in place" : "", first);
        // and both are the sum (loosely: the host path's accuracy is conformance's business)
        std::vector<float> exact(count, 0.0f);
        for (int r = 0; r < s.opt.ranks; ++r) {
          const std::vector<uint8_t> e = encode_as(t, input_values(r, id, count));
          for (size_t i = 0; i < count; ++i) exact[i] += value_at(t, e.data(), i);
        }
        for (size_t i = 0; i < count; ++i) {
          const double diff = static_cast<double>(value_at(t, dout.data(), i)) - exact[i];
          err += diff * diff;
          ref += static_cast<double>(exact[i]) * exact[i];
        }
        if (rank == 0) say("  %s count %zu%s: device result bit-identical to the host result", t.name, count,
                           in_place ? " (in place)" : "");
      }
  const double nmse = err / ref;
  CHECK(nmse <= s.opt.bound, "rank %d: pooled NMSE %g of the device results above %g", rank, nmse, s.opt.bound);
  if (rank == 0) say("  pooled NMSE of rank 0's device results against the exact sum: %.4f", nmse);
}

// A non-finite input on one rank: NaN in every rank's device result, and the comm goes on.
void nonfinite(Shared& s, int rank, void* h, void* d) {
  const size_t count = 1001;
  std::vector<float> v(count, 1.0f);
  if (rank == s.opt.ranks - 1) v[500] = std::nanf("");
  const std::vector<uint8_t> in = encode_as(kTypes[0], v);
  std::vector<uint8_t> ho, dout;
  host_and_device(s, h, d, kTypes[0], in, false, &ho, &dout);
  for (size_t i = 0; i < count; ++i) {
    CHECK(std::isnan(value_at(kTypes[0], dout.data(), i)), "rank %d: element %zu of the device result is not NaN", rank, i);
    if (!std::isnan(value_at(kTypes[0], dout.data(), i))) break;
  }
  if (rank == 0) say("  a non-finite input on rank %d: NaN in the device result", s.opt.ranks - 1);
}

// Refusals on rank 0's device comm: each fails at once with ncclInvalidArgument (nothing reaches
// the aggregator, so the comms stay in step) and a WARN that says what was wrong.
void refusals(Shared& s, void* d) {
  ncclCollNet_v11_t* cn = s.cn;
  DevBuf dev(4096);
  std::vector<float> host(1024, 1.0f);
  void* mh = nullptr;
  struct Case {
    const char* what;
    std::function<ncclResult_t()> call;
    std::vector<const char*> words;
  };
  void *dm = nullptr, *hm = nullptr;
  NCCL_OK(cn->regMr(d, dev.p, 4096, NCCL_PTR_CUDA, &dm));
  NCCL_OK(cn->regMr(d, host.data(), 4096, NCCL_PTR_HOST, &hm));
  void* req = nullptr;
  const Case cases[] = {
      {"NCCL_PTR_CUDA on host memory", [&] { return cn->regMr(d, host.data(), 4096, NCCL_PTR_CUDA, &mh); },
       {"NCCL_PTR_CUDA", "not CUDA device memory"}},
      {"NCCL_PTR_HOST on device memory", [&] { return cn->regMr(d, dev.p, 4096, NCCL_PTR_HOST, &mh); },
       {"NCCL_PTR_HOST", "device memory"}},
      {"memory type 4 (DMA-BUF alone)", [&] { return cn->regMr(d, dev.p, 4096, NCCL_PTR_DMABUF, &mh); },
       {"memory type 4"}},
      {"memory type 0", [&] { return cn->regMr(d, dev.p, 4096, 0, &mh); }, {"memory type 0"}},
      {"size 0", [&] { return cn->regMr(d, dev.p, 0, NCCL_PTR_CUDA, &mh); }, {"0 bytes"}},
      {"NULL data", [&] { return cn->regMr(d, nullptr, 4096, NCCL_PTR_CUDA, &mh); }, {"NULL"}},
      {"a size far beyond the allocation",
       [&] { return cn->regMr(d, dev.p, size_t{1} << 40, NCCL_PTR_CUDA, &mh); },
       {"NCCL_PTR_CUDA", "last byte"}},
      {"device send, host recv",
       [&] { return cn->iallreduce(d, dev.p, host.data(), 1024, ncclFloat32, ncclSum, dm, hm, &req); },
       {"both must be host memory or both device memory"}},
      {"a count beyond the registration",
       [&] { return cn->iallreduce(d, dev.p, dev.p, 1025, ncclFloat32, ncclSum, dm, dm, &req); },
       {"outside its registration"}},
      {"a buffer outside its registration",
       [&] { return cn->iallreduce(d, host.data(), dev.p, 16, ncclFloat32, ncclSum, dm, dm, &req); },
       {"outside its registration"}},
  };
  for (const Case& c : cases) {
    const size_t mark = warn_mark();
    mh = nullptr;
    req = nullptr;
    const ncclResult_t r = c.call();
    CHECK(r == ncclInvalidArgument, "%s: returned %d, want ncclInvalidArgument (%d)", c.what, static_cast<int>(r),
          static_cast<int>(ncclInvalidArgument));
    CHECK(mh == nullptr && req == nullptr, "%s: a handle or request came back with the error", c.what);
    CHECK(warned_since(mark, c.words), "%s: no WARN naming the problem", c.what);
    say("  refused: %s", c.what);
  }
  // DMA-BUF registration of a device range: the descriptor is not needed, the range is taken.
  void* dbm = nullptr;
  NCCL_OK(cn->regMrDmaBuf(d, dev.p, 4096, NCCL_PTR_CUDA, 0, -1, &dbm));
  CHECK(dbm != nullptr, "regMrDmaBuf of a device range gave no handle");
  NCCL_OK(cn->deregMr(d, dbm));
  NCCL_OK(cn->deregMr(d, dm));
  NCCL_OK(cn->deregMr(d, hm));
  say("  regMrDmaBuf of a device range (fd -1): registered");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Time per call: the device path (codes across PCIe) against NCCL's host-staged path (float32
// across PCIe both ways, host codec). Every rank times its own calls; the slowest rank's median
// per path is reported.
void timing(Shared& s, int rank, void* h, void* d) {
  ncclCollNet_v11_t* cn = s.cn;
  const size_t count = s.opt.count;
  const size_t bytes = count * 4;
  const std::vector<uint8_t> in = encode_as(kTypes[0], input_values(rank, 999, count));
  DevBuf ds(bytes), dr(bytes);
  CUDA_OK(cudaMemcpy(ds.p, in.data(), bytes, cudaMemcpyHostToDevice));
  void *pin_s = nullptr, *pin_r = nullptr;
  CUDA_OK(cudaMallocHost(&pin_s, bytes));
  CUDA_OK(cudaMallocHost(&pin_r, bytes));
  void *dsm, *drm, *hsm, *hrm;
  NCCL_OK(cn->regMr(d, ds.p, bytes, NCCL_PTR_CUDA, &dsm));
  NCCL_OK(cn->regMr(d, dr.p, bytes, NCCL_PTR_CUDA, &drm));
  NCCL_OK(cn->regMr(h, pin_s, bytes, NCCL_PTR_HOST, &hsm));
  NCCL_OK(cn->regMr(h, pin_r, bytes, NCCL_PTR_HOST, &hrm));
  std::vector<double> tdev, thost;
  using Clock = std::chrono::steady_clock;
  for (int it = 0; it < s.opt.iters + 1; ++it) {  // the first of each is a warm-up
    s.barrier->arrive_and_wait();
    auto t0 = Clock::now();
    void* req = nullptr;
    NCCL_OK(cn->iallreduce(d, ds.p, dr.p, count, ncclFloat32, ncclSum, dsm, drm, &req));
    NCCL_OK(wait_req(cn, req, nullptr));
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    s.barrier->arrive_and_wait();
    t0 = Clock::now();
    CUDA_OK(cudaMemcpy(pin_s, ds.p, bytes, cudaMemcpyDeviceToHost));
    NCCL_OK(cn->iallreduce(h, pin_s, pin_r, count, ncclFloat32, ncclSum, hsm, hrm, &req));
    NCCL_OK(wait_req(cn, req, nullptr));
    CUDA_OK(cudaMemcpy(dr.p, pin_r, bytes, cudaMemcpyHostToDevice));
    const double ht = std::chrono::duration<double>(Clock::now() - t0).count();
    if (it > 0) {
      tdev.push_back(dt);
      thost.push_back(ht);
    }
  }
  NCCL_OK(cn->deregMr(d, dsm));
  NCCL_OK(cn->deregMr(d, drm));
  NCCL_OK(cn->deregMr(h, hsm));
  NCCL_OK(cn->deregMr(h, hrm));
  cudaFreeHost(pin_s);
  cudaFreeHost(pin_r);
  std::lock_guard<std::mutex> lk(s.t_mu);
  s.t_dev.push_back(median(tdev));
  s.t_host.push_back(median(thost));
}

void rank_main(Shared& s, int rank) {
  ncclCollNet_v11_t* cn = s.cn;
  void* ctx = nullptr;
  NCCL_OK(cn->init(&ctx, 0x5150 + static_cast<uint64_t>(rank), logger));
  int ndev = 0;
  NCCL_OK(cn->devices(&ndev));
  CHECK(ndev >= 1, "no CollNet device (THC_COLLNET_AGGREGATOR is set)");
  ncclNetProperties_v11_t p{};
  NCCL_OK(cn->getProperties(0, &p));
  CHECK((p.ptrSupport & NCCL_PTR_HOST) && (p.ptrSupport & NCCL_PTR_CUDA) && !(p.ptrSupport & NCCL_PTR_DMABUF),
        "CollNet ptrSupport %d: want NCCL_PTR_HOST | NCCL_PTR_CUDA with a device", p.ptrSupport);
  void* listen[2] = {nullptr, nullptr};
  for (int k = 0; k < 2; ++k) {
    std::vector<char> handle(NCCL_NET_HANDLE_MAXSIZE);
    NCCL_OK(cn->listen(ctx, 0, handle.data(), &listen[k]));
    s.handles[k][static_cast<size_t>(rank)] = handle;
  }
  s.barrier->arrive_and_wait();
  void* comm[2] = {nullptr, nullptr};  // [0] host buffers, [1] device buffers
  for (int k = 0; k < 2; ++k) {
    std::vector<void*> hs;
    for (auto& x : s.handles[k]) hs.push_back(x.data());
    NCCL_OK(cn->connect(hs.data(), s.opt.ranks, rank, listen[k], &comm[k]));
    NCCL_OK(cn->closeListen(listen[k]));
  }
  if (rank == 0) say("  %d ranks joined two jobs (host buffers, device buffers); ptrSupport %d", s.opt.ranks, p.ptrSupport);
#if defined(THC_CUDA_EMULATION)
  // Emulated device memory is host memory, so the engine's host path would give the same bits on
  // it: the device calls must be seen running kernels (a prelude, an encode and a decode each at
  // least), and host calls none.
  s.barrier->arrive_and_wait();
  const uint64_t grids0 = thc_emu::grids_run();
  const uint64_t calls0 = g_device_calls.load();
  s.barrier->arrive_and_wait();
#endif
  parity(s, rank, comm[0], comm[1]);
#if defined(THC_CUDA_EMULATION)
  s.barrier->arrive_and_wait();
  if (rank == 0) {
    const uint64_t grids = thc_emu::grids_run() - grids0, calls = g_device_calls.load() - calls0;
    CHECK(grids >= 3 * calls, "%llu device calls ran only %llu kernels: did they take the host path?",
          static_cast<unsigned long long>(calls), static_cast<unsigned long long>(grids));
    say("  %llu device calls ran %llu emulated kernels", static_cast<unsigned long long>(calls),
        static_cast<unsigned long long>(grids));
  }
  s.barrier->arrive_and_wait();
  {
    // host buffers on both comms (the device comm too: it takes either): no kernel may run
    const uint64_t g1 = thc_emu::grids_run();
    const std::vector<uint8_t> in = encode_as(kTypes[0], input_values(rank, 77, 3000));
    std::vector<uint8_t> out[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<uint8_t> snd = in;
      out[k].assign(in.size(), 0);
      void* req = nullptr;
      NCCL_OK(cn->iallreduce(comm[k], snd.data(), out[k].data(), 3000, ncclFloat32, ncclSum, nullptr, nullptr, &req));
      NCCL_OK(wait_req(cn, req, nullptr));
    }
    CHECK(out[0] == out[1], "rank %d: host buffers on the two comms gave different bits", rank);
    s.barrier->arrive_and_wait();
    CHECK(thc_emu::grids_run() == g1, "host buffers ran %llu emulated kernels",
          static_cast<unsigned long long>(thc_emu::grids_run() - g1));
    s.barrier->arrive_and_wait();
  }
#endif
  nonfinite(s, rank, comm[0], comm[1]);
  s.barrier->arrive_and_wait();
  if (rank == 0) refusals(s, comm[1]);
  s.barrier->arrive_and_wait();
  // still in step after the refusals
  {
    const std::vector<uint8_t> in = encode_as(kTypes[0], input_values(rank, 4242, 5000));
    std::vector<uint8_t> ho, dout;
    host_and_device(s, comm[0], comm[1], kTypes[0], in, false, &ho, &dout);
    CHECK(ho == dout, "rank %d: after the refusals the device result differs from the host result", rank);
  }
  if (s.opt.iters > 0) timing(s, rank, comm[0], comm[1]);
  for (void* c : comm) NCCL_OK(cn->closeColl(c));
  NCCL_OK(cn->finalize(ctx));
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  std::string so;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--ranks") opt.ranks = std::atoi(next());
    else if (a == "--iters") opt.iters = std::atoi(next());
    else if (a == "--count") opt.count = std::strtoull(next(), nullptr, 10);
    else if (a == "--nmse-bound") opt.bound = std::atof(next());
    else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 1;
    } else so = a;
  }
  if (opt.ranks < 1 || opt.ranks > 16 || opt.count < 1) {
    std::fprintf(stderr, "--ranks in 1..16, --count > 0\n");
    return 1;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    std::printf("no CUDA device: nothing to check\n");
    return 77;
  }
  // The same seed on both comms: the host and device calls dither alike.
  setenv("THC_SEED", std::getenv("THC_SEED") ? std::getenv("THC_SEED") : "4242", 1);
  setenv("THC_AGGREGATOR_KEY", thc::switch_offload::auth::format_key(thc::test::test_key(1)).c_str(), 1);
  g_agg = std::make_unique<thc::test::AggregatorProcess>();
  setenv("THC_COLLNET_AGGREGATOR", g_agg->url().c_str(), 1);

  Shared s;
  s.opt = opt;
#if defined(THC_CUDA_EMULATION)
  s.cn = &ncclCollNetPlugin_v11;
  std::printf("collnet device check: the plugin's sources on the CUDA emulator, %d ranks\n", opt.ranks);
#else
  if (so.empty()) {
    std::fprintf(stderr, "usage: collnet_device_check PLUGIN.so [--ranks R] [--iters N] [--count C]\n");
    return 1;
  }
  void* lib = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::printf("FAIL dlopen(%s): %s\n", so.c_str(), dlerror());
    return 1;
  }
  s.cn = static_cast<ncclCollNet_v11_t*>(dlsym(lib, "ncclCollNetPlugin_v11"));
  if (!s.cn) {
    std::printf("FAIL %s has no ncclCollNetPlugin_v11\n", so.c_str());
    return 1;
  }
  std::printf("collnet device check: %s on a CUDA device, %d ranks\n", so.c_str(), opt.ranks);
#endif
  s.barrier = std::make_unique<Barrier>(opt.ranks);
  for (auto& h : s.handles) h.resize(static_cast<size_t>(opt.ranks));
  std::vector<std::thread> ts;
  for (int r = 0; r < opt.ranks; ++r) ts.emplace_back(rank_main, std::ref(s), r);
  for (auto& t : ts) t.join();

  const uint64_t elems = g_agg->stat("elements");
  CHECK(elems > 0, "thc-aggregator aggregated nothing: the allreduces did not go through it");
  if (opt.iters > 0 && !s.t_dev.empty()) {
    const double td = *std::max_element(s.t_dev.begin(), s.t_dev.end());
    const double th = *std::max_element(s.t_host.begin(), s.t_host.end());
    // PCIe bytes per element: host-staged float32 down and back; the device path's codes up (the
    // comm's wire bytes per element, from the plugin's closing log line) and sums back.
    double up = -1, down = -1;
    {
      std::lock_guard<std::mutex> lk(g_log_mu);
      for (const std::string& l : g_infos) {
        double u, dn;
        const size_t at = l.find("allreduces, ");
        if (at != std::string::npos && std::sscanf(l.c_str() + l.find("elements, ") + 10,
                                                   "%lf wire bytes/element up, %lf down", &u, &dn) == 2)
          up = std::max(up, u), down = std::max(down, dn);
      }
    }
    std::printf("TIMING count %zu float32, %d ranks, %d iterations, median of the slowest rank:\n", opt.count, opt.ranks,
                opt.iters);
    std::printf("  device path (GPU codec, codes across PCIe)          %9.3f ms per call\n", td * 1e3);
    std::printf("  host-staged (float32 across PCIe, host codec)        %9.3f ms per call   ratio host/device %.2fx\n",
                th * 1e3, th / td);
    std::printf("PCIe bytes per element: host-staged 4 down + 4 back = 8; device path %.3f up + %.3f back (the comm's "
                "wire bytes per element from the plugin's closing log line: the codes and sums it stages; the per-block "
                "statistics add 8 bytes per block)\n",
                up, down);
#if defined(THC_CUDA_EMULATION)
    std::printf("(the CPU emulator: these timings mean nothing)\n");
#endif
  }
  std::printf("aggregator: %llu elements aggregated\n", static_cast<unsigned long long>(elems));
  std::printf("%s (%d failures)\n", g_failures.load() == 0 ? "RESULT ok" : "RESULT FAILED", g_failures.load());
  return g_failures.load() == 0 ? 0 : 1;
}
