// Device buffers on the engine's path (collectives/engine/device.h): the C API, THC_Allreduce /
// CNAT_Allreduce and the aggregator clients take CUDA device memory.
//
// A call runs the CUDA codec on the device and stages only compressed integers through pinned
// host memory, where the engine's backend (MPI, parameter server, switch) reduces them:
//
//   stream:  prelude ─ D2H ──────────── H2D stats ─ encode 0 ─ D2H 0 ─ encode 1 ─ D2H 1 ─ H2D 0 ─ decode 0 ─ ...
//   host:           wait ─ MAX (backend) ─┘              wait 0 ─ start 0 ┘    wait 1 ─ start 1, wait op 0 ┘
//
// Two slots pipeline the chunks as on the host path: the GPU encodes chunk k+1 while the
// backend reduces chunk k. The prelude's statistics and check words use the host path's layout
// and digest, so ranks with host buffers and ranks with device buffers can share a call.
//
// Built into libthc_cuda, which registers the backend when loaded, and into the CPU emulator's
// test library (tests/cuda/emu), where "device memory" is what the emulator's cudaMalloc gave.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "collectives/engine/device.h"
#include "collectives/engine/engine.h"
#include "collectives/engine/device_pointer.h"
#include "collectives/engine/plan_rules.h"
#include "cuda/thc_cuda.h"

namespace thc::cuda {
namespace {

using engine::Algo;
using engine::CallPlan;
using engine::DType;

#define THC_ENGINE_CUDA(expr)                                                                        \
  do {                                                                                               \
    const cudaError_t e_ = (expr);                                                                   \
    if (e_ != cudaSuccess) {                                                                         \
      cudaGetLastError();                                                                            \
      ::thc::fail(e_ == cudaErrorMemoryAllocation ? ::thc::Status::kOutOfMemory : ::thc::Status::kInternal, \
                  std::string(#expr) + ": " + cudaGetErrorString(e_));                               \
    }                                                                                                \
  } while (0)

InType in_type(DType t) {
  switch (t) {
    case DType::kF32: return InType::kF32;
    case DType::kF16: return InType::kF16;
    case DType::kBF16: return InType::kBF16;
    case DType::kF64: break;
  }
  fail(Status::kUnsupported, "float64 device buffers: the GPU codec takes float32, float16 and bfloat16");
}

int device_of(const void* p) {
  cudaPointerAttributes a{};
  THC_ENGINE_CUDA(cudaPointerGetAttributes(&a, p));
  return a.device;
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (dev != prev_) THC_ENGINE_CUDA(cudaSetDevice(dev));
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// A growable buffer of device or pinned host memory.
template <bool Pinned>
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    release();
    const size_t want = std::max<size_t>(bytes, 256);
    if (Pinned) {
      THC_ENGINE_CUDA(cudaMallocHost(&p_, want));
    } else {
      THC_ENGINE_CUDA(cudaMalloc(&p_, want));
    }
    bytes_ = want;
  }
  template <class T = uint8_t>
  T* get(size_t offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(p_) + offset);
  }

 private:
  void release() {
    if (!p_) return;
    if (Pinned) {
      cudaFreeHost(p_);
    } else {
      cudaFree(p_);
    }
    p_ = nullptr;
    bytes_ = 0;
  }
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Everything one device needs; the engine's calls are serialised, so no locking here.
struct PerDevice {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t staged[2] = {nullptr, nullptr};
  std::map<const codec::Codec*, std::unique_ptr<DeviceCodec>> codecs;
  Buffer<false> dev;  // prelude words, prelude temp, codec temp, per-slot wire data, partial-path scratch
  Buffer<true> host;  // prelude words, per-slot wire data
  // The stream path's (groups, reduce-scatter, allgather: StreamWork below), kept across calls.
  struct {
    Buffer<false> pre, pre_temp, stats, temp, wire, sums, tmp, keep[2];
    Buffer<true> h_pre, h_codes;
  } st;

  explicit PerDevice(int d) : device(d) {
    // A blocking stream: ordered after work on the legacy default stream, like cudaMemcpy.
    THC_ENGINE_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
    for (cudaEvent_t& e : staged) THC_ENGINE_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    THC_ENGINE_CUDA(prepare_device());
  }
  ~PerDevice() {
    DeviceGuard g(device);
    cudaStreamSynchronize(stream);
    codecs.clear();
    for (cudaEvent_t e : staged) cudaEventDestroy(e);
    cudaStreamDestroy(stream);
  }
  PerDevice(const PerDevice&) = delete;
  PerDevice& operator=(const PerDevice&) = delete;

  const DeviceCodec& codec_for(const codec::Codec& c) {
    auto& slot = codecs[&c];
    if (!slot) {
      auto d = std::make_unique<DeviceCodec>();
      THC_ENGINE_CUDA(d->init(c));
      slot = std::move(d);
    }
    return *slot;
  }
};

// Byte offsets of one call's buffers.
struct Plan {
  size_t d_pre = 0, d_pre_temp = 0, d_codec_temp = 0, d_wire[2] = {0, 0}, d_packed[2] = {0, 0},
         d_saved_x[2] = {0, 0}, d_float = 0, d_total = 0;
  size_t h_pre = 0, h_wire[2] = {0, 0}, h_packed[2] = {0, 0}, h_total = 0;
  size_t pre_temp_bytes = 0, codec_temp_bytes = 0;
};

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// The device residual of ef (count floats), allocated and zeroed on first use.
float* device_residual(engine::ErrorFeedback& ef, uint64_t count, int device, cudaStream_t stream) {
  if (!ef.device) {
    if (ef.count != 0)
      fail(Status::kInvalidArgument, "error-feedback state was bound to host buffers, used with device buffers");
    float* p = nullptr;
    THC_ENGINE_CUDA(cudaMalloc(&p, std::max<uint64_t>(count, 1) * sizeof(float)));
    ef.device = std::shared_ptr<float>(p, [device](float* q) {
      DeviceGuard g(device);
      cudaFree(q);
    });
    ef.device_id = device;
    ef.count = count;
    THC_ENGINE_CUDA(cudaMemsetAsync(p, 0, count * sizeof(float), stream));
  } else if (ef.device_id != device) {
    fail(Status::kInvalidArgument, "error-feedback state lives on CUDA device " + std::to_string(ef.device_id) +
                                       ", the buffers on device " + std::to_string(device));
  }
  return ef.device.get();
}

Rng rng_of(const codec::CallRng& r) {
  Rng g;
  g.seed = r.seed;
  g.rank = r.rank;
  g.round = r.round;
  return g;
}

// Elements and wire elements of blocks [b0, b0 + nblk) of lay.
uint64_t run_elems(const codec::Layout& lay, uint64_t b0, uint64_t nblk) {
  return (nblk - 1) * lay.block + lay.elems(b0 + nblk - 1);
}
uint64_t run_wire(const codec::Layout& lay, uint64_t b0, uint64_t nblk) {
  return (nblk - 1) * lay.block + lay.wire(b0 + nblk - 1);
}

// engine::DeviceStream on one device: the stream path's device work, on the device's stream.
class StreamWork final : public engine::DeviceStream {
 public:
  explicit StreamWork(PerDevice& pd) : guard_(pd.device), pd_(pd), b_(pd.st) {}
  ~StreamWork() override {
    cudaStreamSynchronize(pd_.stream);
    for (void* p : scratch_) cudaFree(p);
  }

  float* residual(engine::ErrorFeedback& ef, uint64_t count) override {
    return device_residual(ef, count, pd_.device, pd_.stream);
  }

  bool prelude(const codec::Codec& cod, const codec::Layout& lay, const void* x, DType t, const float* res,
               float* stats) override {
    const DeviceCodec& dc = pd_.codec_for(cod);
    const InType it = in_type(t);
    size_t tb = 0;
    THC_ENGINE_CUDA(cuda::prelude(nullptr, &tb, dc, lay, nullptr, it, nullptr, nullptr, nullptr, 0, nullptr));
    b_.pre_temp.reserve(tb);
    const size_t words = lay.nblocks + kCheckWords;
    b_.pre.reserve(words * sizeof(uint32_t));
    b_.h_pre.reserve(words * sizeof(uint32_t));
    uint32_t* d = b_.pre.get<uint32_t>();
    uint32_t* h = b_.h_pre.get<uint32_t>();
    THC_ENGINE_CUDA(cuda::prelude(b_.pre_temp.get(), &tb, dc, lay, x, it, res, reinterpret_cast<float*>(d),
                                  d + lay.nblocks, 0, pd_.stream));
    THC_ENGINE_CUDA(cudaMemcpyAsync(h, d, words * sizeof(uint32_t), cudaMemcpyDeviceToHost, pd_.stream));
    THC_ENGINE_CUDA(cudaStreamSynchronize(pd_.stream));
    std::memcpy(stats, h, lay.nblocks * sizeof(float));
    return h[lay.nblocks] == 0;
  }

  void reserve(uint64_t nb, uint64_t max_wire, uint64_t max_elems, bool keep_x) override {
    b_.stats.reserve(nb * sizeof(float));
    // A chunk's codes: packed indices (at most 8 bits each) or values of the sum type (at most 4
    // bytes); its sums; and the host sums of one allgather group (at most a chunk's).
    const size_t wire_bytes = max_wire * 4 + 64;
    b_.wire.reserve(wire_bytes);
    b_.h_codes.reserve(wire_bytes);
    b_.sums.reserve(2 * wire_bytes);
    b_.tmp.reserve(max_elems * sizeof(float));
    if (keep_x)
      for (auto& k : b_.keep) k.reserve(max_elems * sizeof(float));
    wire_bytes_ = wire_bytes;
  }
  void set_stats(const float* stats, uint64_t nb) override {
    THC_ENGINE_CUDA(cudaMemcpyAsync(b_.stats.get(), stats, nb * sizeof(float), cudaMemcpyHostToDevice, pd_.stream));
    // Host memory handed in may be reused once a call returns (a pageable copy returns when its
    // source is read; waiting here makes that hold for pinned memory too).
    THC_ENGINE_CUDA(cudaStreamSynchronize(pd_.stream));
  }

  void encode(const codec::Codec& cod, const codec::Layout& lay, uint64_t g0, uint64_t b0, uint64_t nblk,
              const void* x, DType t, float* res, const codec::CallRng& rng, bool packed, uint64_t woff, int keep_slot,
              uint64_t xoff) override {
    const DeviceCodec& dc = pd_.codec_for(cod);
    const InType it = in_type(t);
    const uint64_t first = b0 * lay.block;
    const uint64_t m = run_elems(lay, b0, nblk);
    const void* xs = static_cast<const char*>(x) + first * in_size(it);
    float* ef = res ? res + first : nullptr;
    if (keep_slot >= 0)  // x + e before encode updates e
      THC_ENGINE_CUDA(add_input(xs, it, ef, m, b_.keep[keep_slot].get<float>() + xoff, pd_.stream));
    const uint64_t w = run_wire(lay, b0, nblk);
    const size_t at = packed ? woff * cod.index_bits() / 8 : woff * codec::int_size(cod.sum_type());
    const size_t bytes = packed ? cod.packed_bytes(w) : w * codec::int_size(cod.sum_type());
    if (at + bytes > wire_bytes_) fail(Status::kInternal, "device stream: a run beyond the chunk's buffer");
    EncodeOut o;
    o.residual = ef;
    if (packed) {
      o.packed = b_.wire.get<uint8_t>(at);
    } else {
      o.values = b_.wire.get(at);
      o.layout = ValueLayout::kNative;
    }
    size_t tb = 0;
    THC_ENGINE_CUDA(cuda::encode(nullptr, &tb, dc, lay, b0, nblk, nullptr, it, nullptr, nullptr, Rng(), EncodeOut(),
                                 nullptr, nullptr));
    b_.temp.reserve(tb);
    THC_ENGINE_CUDA(cuda::encode(b_.temp.get(), &tb, dc, lay, b0, nblk, xs, it, ef, b_.stats.get<float>() + g0 + b0,
                                 rng_of(rng), o, nullptr, pd_.stream));
    runs_.push_back({at, bytes});
  }

  void codes_to_host(void* out) override {
    if (runs_.empty()) return;
    size_t lo = runs_[0].at, hi = 0;
    for (const ByteRun& r : runs_) {
      lo = std::min(lo, r.at);
      hi = std::max(hi, r.at + r.bytes);
    }
    // One copy of the span (the gaps between runs come along and are not used) and one wait.
    THC_ENGINE_CUDA(cudaMemcpyAsync(b_.h_codes.get(lo), b_.wire.get(lo), hi - lo, cudaMemcpyDeviceToHost, pd_.stream));
    THC_ENGINE_CUDA(cudaStreamSynchronize(pd_.stream));
    for (const ByteRun& r : runs_) std::memcpy(static_cast<char*>(out) + r.at, b_.h_codes.get(r.at), r.bytes);
    runs_.clear();
  }

  void sums_to_device(const codec::Codec& cod, const void* sums, uint64_t lo, uint64_t wire) override {
    const size_t wsz = codec::int_size(cod.sum_type());
    if (wire * wsz > wire_bytes_) fail(Status::kInternal, "device stream: sums beyond the chunk's buffer");
    THC_ENGINE_CUDA(cudaMemcpyAsync(b_.sums.get(), sums, wire * wsz, cudaMemcpyHostToDevice, pd_.stream));
    sums_lo_ = lo;
  }

  void decode(const codec::Codec& cod, const codec::Layout& lay, uint64_t g0, uint64_t b0, uint64_t nblk,
              uint64_t woff, const void* host_sums, const codec::CallRng& rng, int contributors, bool as_mean,
              float scale, void* out, DType ot) override {
    const DeviceCodec& dc = pd_.codec_for(cod);
    const InType it = in_type(ot);
    const uint64_t first = b0 * lay.block;
    const uint64_t m = run_elems(lay, b0, nblk);
    const size_t wsz = codec::int_size(cod.sum_type());
    const void* d_sums;
    if (host_sums) {
      // (the second half of the sums buffer: the chunk's sums stay in the first)
      const size_t bytes = run_wire(lay, b0, nblk) * wsz;
      if (bytes > wire_bytes_) fail(Status::kInternal, "device stream: sums beyond the chunk's buffer");
      d_sums = b_.sums.get(wire_bytes_);
      THC_ENGINE_CUDA(cudaMemcpyAsync(b_.sums.get(wire_bytes_), host_sums, bytes, cudaMemcpyHostToDevice, pd_.stream));
    } else {
      if (woff < sums_lo_) fail(Status::kInternal, "device stream: a run's sums before the chunk's on the device");
      d_sums = b_.sums.get((woff - sums_lo_) * wsz);
    }
    void* o = static_cast<char*>(out) + first * in_size(it);
    const float* st = b_.stats.get<float>() + g0 + b0;
    size_t tb = 0;
    THC_ENGINE_CUDA(cuda::decode(nullptr, &tb, dc, lay, b0, nblk, nullptr, ValueLayout::kNative, nullptr, Rng(), 1,
                                 false, nullptr, it, nullptr, nullptr, nullptr));
    b_.temp.reserve(tb);
    if (scale == 1.0f) {
      THC_ENGINE_CUDA(cuda::decode(b_.temp.get(), &tb, dc, lay, b0, nblk, d_sums, ValueLayout::kNative, st,
                                   rng_of(rng), contributors, as_mean, o, it, nullptr, nullptr, pd_.stream));
    } else {
      float* tmp = b_.tmp.get<float>();
      THC_ENGINE_CUDA(cuda::decode(b_.temp.get(), &tb, dc, lay, b0, nblk, d_sums, ValueLayout::kNative, st,
                                   rng_of(rng), contributors, as_mean, tmp, InType::kF32, nullptr, nullptr,
                                   pd_.stream));
      THC_ENGINE_CUDA(scale_store(tmp, m, scale, o, it, pd_.stream));
    }
    if (host_sums) THC_ENGINE_CUDA(cudaStreamSynchronize(pd_.stream));  // host_sums may change after the return
  }

  void restore(int slot, uint64_t xoff, float* res, uint64_t m) override {
    THC_ENGINE_CUDA(cudaMemcpyAsync(res, b_.keep[slot].get<float>() + xoff, m * sizeof(float),
                                    cudaMemcpyDeviceToDevice, pd_.stream));
  }
  void add_into(const void* x, DType t, float* res, uint64_t m) override {
    THC_ENGINE_CUDA(add_input(x, in_type(t), res, m, res, pd_.stream));
  }
  void* scratch(size_t bytes) override {
    void* p = nullptr;
    THC_ENGINE_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    scratch_.push_back(p);
    return p;
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    THC_ENGINE_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, pd_.stream));
  }
  void sync() override { THC_ENGINE_CUDA(cudaStreamSynchronize(pd_.stream)); }

 private:
  struct ByteRun {
    size_t at, bytes;  // in the chunk's codes
  };
  DeviceGuard guard_;
  PerDevice& pd_;
  decltype(PerDevice::st)& b_;
  std::vector<void*> scratch_;
  std::vector<ByteRun> runs_;  // encoded since the last codes_to_host
  size_t wire_bytes_ = 0;      // a chunk's codes or sums, at most (reserve)
  uint64_t sums_lo_ = 0;       // the wire element the device's chunk sums start at
};

class Session final : public engine::DeviceSession {
 public:
  void allreduce(engine::Engine& eng, const CallPlan& plan, const void* send, void* recv,
                 engine::ErrorFeedback* ef) override;
  std::unique_ptr<engine::DeviceStream> stream(const std::vector<const void*>& ptrs) override {
    if (ptrs.empty()) fail(Status::kInternal, "a device stream without device buffers");
    const int device = device_of(ptrs[0]);
    for (const void* p : ptrs)
      if (device_of(p) != device)
        fail(Status::kInvalidArgument, "the call's device buffers are on different CUDA devices");
    DeviceGuard guard(device);
    return std::make_unique<StreamWork>(per_device(device));
  }

 private:
  PerDevice& per_device(int device) {
    auto& slot = devices_[device];
    if (!slot) slot = std::make_unique<PerDevice>(device);
    return *slot;
  }
  std::map<int, std::unique_ptr<PerDevice>> devices_;
};

void Session::allreduce(engine::Engine& eng, const CallPlan& plan, const void* send, void* recv,
                        engine::ErrorFeedback* ef) {
  const InType it = in_type(plan.dtype);
  const int device = device_of(recv);
  if (device_of(send) != device) fail(Status::kInvalidArgument, "sendbuf and recvbuf are on different CUDA devices");
  DeviceGuard guard(device);
  PerDevice& pd = per_device(device);
  cudaStream_t stream = pd.stream;

  const codec::Codec& cod = *plan.cod;
  const DeviceCodec& dcod = pd.codec_for(cod);
  const codec::Layout& lay = plan.lay;
  const uint64_t B = lay.block;
  const uint64_t nb = lay.nblocks;
  const uint64_t count = plan.count;
  const int n = eng.size();
  const bool ps = plan.algo == Algo::kPs;
  const codec::IntType st = cod.sum_type();
  const size_t wsz = codec::int_size(st);
  const size_t esz = in_size(it);
  transport::Reducer& red = eng.reducer();
  // The host path's chunks (engine::chunk_runs with the backend's growth): ranks passing host
  // buffers and ranks passing device buffers take part in one call, so every rank must cut the
  // call into the same chunks, or the backend's messages do not match.
  const std::vector<uint64_t> runs = engine::chunk_runs(nb, plan.chunk_blocks, red.chunk_growth());
  const uint64_t cb = runs.empty() ? 1 : *std::max_element(runs.begin(), runs.end());
  const bool partial = red.partial_results();
  red.set_part_granule(lay.block);

  // Error feedback: a device residual beside the buffers, zeroed on first use.
  float* const efr = ef ? device_residual(*ef, count, device, stream) : nullptr;

  // ---- buffers
  Plan w;
  const uint64_t wire_max = cb * B;
  {
    size_t d = 0, h = 0;
    auto dt = [&](size_t bytes) {
      const size_t at = d;
      d = align256(d + std::max<size_t>(bytes, 1));
      return at;
    };
    auto ht = [&](size_t bytes) {
      const size_t at = h;
      h = align256(h + std::max<size_t>(bytes, 1));
      return at;
    };
    const size_t pre_bytes = (nb + engine::Engine::kPreludeCheck) * sizeof(uint32_t);
    w.d_pre = dt(pre_bytes);
    w.h_pre = ht(pre_bytes);
    THC_ENGINE_CUDA(prelude(nullptr, &w.pre_temp_bytes, dcod, lay, nullptr, it, nullptr, nullptr, nullptr, 0, nullptr));
    w.d_pre_temp = dt(w.pre_temp_bytes);
    size_t eb = 0, db = 0;
    THC_ENGINE_CUDA(encode(nullptr, &eb, dcod, lay, 0, cb, nullptr, it, nullptr, nullptr, Rng(), EncodeOut(), nullptr,
                           nullptr));
    THC_ENGINE_CUDA(decode(nullptr, &db, dcod, lay, 0, cb, nullptr, ValueLayout::kNative, nullptr, Rng(), 1, false,
                           nullptr, it, nullptr, nullptr, nullptr));
    w.codec_temp_bytes = std::max(eb, db);  // encode and decode run one after the other on the stream
    w.d_codec_temp = dt(w.codec_temp_bytes);
    for (int s = 0; s < 2; ++s) {
      w.d_wire[s] = dt(wire_max * wsz);
      w.h_wire[s] = ht(wire_max * wsz);
      if (ps) {
        w.d_packed[s] = dt(cod.packed_bytes(wire_max) + 8);
        w.h_packed[s] = ht(cod.packed_bytes(wire_max) + 8);
      }
      if (partial && ef) w.d_saved_x[s] = dt(wire_max * sizeof(float));
    }
    if (partial) w.d_float = dt(wire_max * sizeof(float));
    w.d_total = d;
    w.h_total = h;
  }
  pd.dev.reserve(w.d_total);
  pd.host.reserve(w.h_total);
  char* const dbase = pd.dev.get<char>();
  char* const hbase = pd.host.get<char>();

  // ---- 1. prelude on the device, one MAX through the backend, statistics back to the device
  uint32_t* d_pre = reinterpret_cast<uint32_t*>(dbase + w.d_pre);
  uint32_t* h_pre = reinterpret_cast<uint32_t*>(hbase + w.h_pre);
  float* d_stats = reinterpret_cast<float*>(d_pre);
  size_t pre_temp = w.pre_temp_bytes;
  THC_ENGINE_CUDA(prelude(dbase + w.d_pre_temp, &pre_temp, dcod, lay, send, it, efr, d_stats, d_pre + nb,
                          plan.digest, stream));
  THC_ENGINE_CUDA(cudaMemcpyAsync(h_pre, d_pre, (nb + kCheckWords) * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream));
  THC_ENGINE_CUDA(cudaStreamSynchronize(stream));
  static_assert(kCheckWords == engine::Engine::kPreludeCheck, "one layout of the prelude's check words");
  const uint32_t round = eng.exchange_prelude(plan, h_pre, h_pre[nb] == 0);
  THC_ENGINE_CUDA(cudaMemcpyAsync(d_stats, h_pre, nb * sizeof(float), cudaMemcpyHostToDevice, stream));

  Rng rng = rng_of(plan.rng);
  rng.round = round;
  size_t codec_temp = w.codec_temp_bytes;
  void* const d_codec_temp = dbase + w.d_codec_temp;

  // ---- 2./3. chunks: encode + D2H, backend, H2D + decode
  struct Slot {
    uint64_t b0 = 0, nblk = 0, wire = 0;
    std::unique_ptr<transport::Request> req;
  };
  Slot slots[2];

  auto finish = [&](int si) {
    Slot& s = slots[si];
    s.req->wait();
    const std::vector<engine::BlockPart> parts = engine::block_parts(*s.req, s.b0, s.nblk, B, n);
    s.req.reset();
    void* d_sums = dbase + w.d_wire[si];
    THC_ENGINE_CUDA(cudaMemcpyAsync(d_sums, hbase + w.h_wire[si], s.wire * wsz, cudaMemcpyHostToDevice, stream));
    // Each part (one per aggregator instance the backend split the op over) decodes with its own
    // contributor set; most requests have one part.
    for (const engine::BlockPart& p : parts) {
      const uint64_t first = p.b0 * B;
      const uint64_t m = std::min<uint64_t>(count - first, p.nblk * B);
      const void* psums = static_cast<const char*>(d_sums) + (p.b0 - s.b0) * B * wsz;
      char* out = static_cast<char*>(recv) + first * esz;
      const int contrib = p.contributors;
      if (contrib == n) {
        THC_ENGINE_CUDA(decode(d_codec_temp, &codec_temp, dcod, lay, p.b0, p.nblk, psums, ValueLayout::kNative,
                               d_stats + p.b0, rng, contrib, plan.mean, out, it, nullptr, nullptr, stream));
      } else {
        // Partial aggregation: the counted workers' mean, scaled to all n for SUM, rounded once.
        float* tmp = reinterpret_cast<float*>(dbase + w.d_float);
        THC_ENGINE_CUDA(decode(d_codec_temp, &codec_temp, dcod, lay, p.b0, p.nblk, psums, ValueLayout::kNative,
                               d_stats + p.b0, rng, contrib, true, tmp, InType::kF32, nullptr, nullptr, stream));
        THC_ENGINE_CUDA(scale_store(tmp, m, plan.mean ? 1.0f : static_cast<float>(n), out, it, stream));
      }
      if (ef && !p.self_counted) {
        // Left out of the aggregate: the whole contribution x = grad + e stays in the residual.
        THC_ENGINE_CUDA(cudaMemcpyAsync(efr + first, dbase + w.d_saved_x[si] + (first - s.b0 * B) * sizeof(float),
                                        m * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      }
    }
  };

  uint64_t wire_total = 0;
  int pending = -1;
  int cur = 0;
  uint64_t next_b0 = 0;
  for (const uint64_t run : runs) {
    const uint64_t b0 = next_b0;
    next_b0 += run;
    Slot& s = slots[cur];
    s.b0 = b0;
    s.nblk = run;
    s.wire = run_wire(lay, b0, s.nblk);
    const uint64_t first = b0 * B;
    const uint64_t m = std::min<uint64_t>(count - first, s.nblk * B);
    const char* xs = static_cast<const char*>(send) + first * esz;
    float* ef_c = efr ? efr + first : nullptr;
    // A worker the aggregate may leave out keeps x = grad + e (saved before encode updates e;
    // in place, decode overwrites grad).
    if (ef && partial)
      THC_ENGINE_CUDA(add_input(xs, it, ef_c, m, reinterpret_cast<float*>(dbase + w.d_saved_x[cur]), stream));
    EncodeOut out;
    out.residual = ef_c;
    uint8_t* h_up;
    size_t up_bytes;
    if (ps) {
      out.packed = reinterpret_cast<uint8_t*>(dbase + w.d_packed[cur]);
      h_up = reinterpret_cast<uint8_t*>(hbase + w.h_packed[cur]);
      up_bytes = cod.packed_bytes(s.wire);
    } else {
      out.values = dbase + w.d_wire[cur];
      out.layout = ValueLayout::kNative;
      h_up = reinterpret_cast<uint8_t*>(hbase + w.h_wire[cur]);
      up_bytes = s.wire * wsz;
    }
    THC_ENGINE_CUDA(encode(d_codec_temp, &codec_temp, dcod, lay, b0, s.nblk, xs, it, ef_c, d_stats + b0, rng, out,
                           nullptr, stream));
    THC_ENGINE_CUDA(cudaMemcpyAsync(h_up, ps ? static_cast<void*>(out.packed) : out.values, up_bytes,
                                    cudaMemcpyDeviceToHost, stream));
    THC_ENGINE_CUDA(cudaEventRecord(pd.staged[cur], stream));
    // The backend reduces the previous chunk while the GPU encodes this one.
    if (pending >= 0) finish(pending);
    THC_ENGINE_CUDA(cudaEventSynchronize(pd.staged[cur]));
    if (ps) {
      s.req = red.start_lookup_sum(h_up, s.wire, plan.table, hbase + w.h_wire[cur], st, plan.down.get());
    } else {
      s.req = red.start_sum(h_up, s.wire, st);
    }
    wire_total += s.wire;
    pending = cur;
    cur ^= 1;
  }
  if (pending >= 0) finish(pending);
  THC_ENGINE_CUDA(cudaStreamSynchronize(stream));
  eng.account(plan, wire_total);
}

class Backend final : public engine::DeviceBackend {
 public:
  bool is_device(const void* p) const override {
#if defined(THC_CUDA_EMULATION)
    // The emulator's cudaMalloc memory (host memory standing in for the device).
    if (!p) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) return false;
    return a.type == cudaMemoryTypeDevice;
#else
    return thc_cuda_is_device_pointer(p) != 0;
#endif
  }
  std::unique_ptr<engine::DeviceSession> open() override { return std::make_unique<Session>(); }
};

Backend g_backend;

// Registers the backend while libthc_cuda is loaded.
struct Registrar {
  Registrar() { engine::set_device_backend(&g_backend); }
  ~Registrar() {
    if (engine::device_backend(false) == &g_backend) engine::set_device_backend(nullptr);
  }
} g_registrar;

}  // namespace

engine::DeviceBackend* engine_backend() { return &g_backend; }

}  // namespace thc::cuda
