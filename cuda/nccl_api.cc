// The NCCL-like API (include/thc/thc_nccl.h) over the CUDA codec (cuda/thc_cuda.h).
//
// Exceptions and error codes of the layers below become ncclResult_t here, with the message kept
// per thread for thcNcclGetLastError.
#include "thc/thc_nccl.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>

#include "collectives/codec/codec.h"
#include "collectives/engine/knobs.h"
#include "collectives/engine/plan_rules.h"
#include "cuda/nccl_api_internal.h"
#include "cuda/thc_cuda.h"

namespace {

using thc::codec::Codec;
using thc::codec::IntType;
using thc::codec::Layout;
using thc::codec::Scheme;
namespace tc = thc::cuda;

thread_local std::string g_last_error;

// Carries an ncclResult_t and a message out of the implementation to the C boundary.
struct CallError {
  ncclResult_t result;
  std::string msg;
};

[[noreturn]] void raise(ncclResult_t r, const std::string& msg) { throw CallError{r, msg}; }

#define THC_CHECK_CUDA(expr)                                                                         \
  do {                                                                                               \
    const cudaError_t e_ = (expr);                                                                   \
    if (e_ != cudaSuccess)                                                                           \
      raise(ncclUnhandledCudaError, std::string(#expr) + ": " + cudaGetErrorString(e_) + " at " +    \
                                        __FILE__ + ":" + std::to_string(__LINE__));                  \
  } while (0)

#define THC_CHECK_NCCL(expr)                                                                         \
  do {                                                                                               \
    const ncclResult_t r_ = (expr);                                                                  \
    if (r_ != ncclSuccess && r_ != ncclInProgress)                                                   \
      raise(r_, std::string(#expr) + ": " + ncclGetErrorString(r_) + " at " + __FILE__ + ":" +      \
                    std::to_string(__LINE__));                                                       \
  } while (0)

template <class F>
ncclResult_t guard(const char* where, F&& f) {
  try {
    f();
    return ncclSuccess;
  } catch (const CallError& e) {
    g_last_error = std::string(where) + ": " + e.msg;
    return e.result;
  } catch (const thc::Error& e) {
    g_last_error = std::string(where) + ": " + e.what();
    return e.status() == thc::Status::kOutOfMemory ? ncclSystemError : ncclInvalidArgument;
  } catch (const std::bad_alloc&) {
    g_last_error = std::string(where) + ": out of host memory";
    return ncclSystemError;
  } catch (const std::exception& e) {
    g_last_error = std::string(where) + ": " + e.what();
    return ncclInternalError;
  }
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (dev != prev_) THC_CHECK_CUDA(cudaSetDevice(dev));
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }

 private:
  int prev_ = -1;
};

bool is_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) return false;
  return st != cudaStreamCaptureStatusNone;
}

std::atomic<size_t> g_min_chunk_bytes{size_t{64} << 20};
constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// NCCL type and element count of value-form data on the wire (kPairs layout).
void value_wire(IntType t, uint64_t wire, ncclDataType_t* dt, size_t* n) {
  switch (t) {
    case IntType::kU8: *dt = ncclUint8; *n = wire; return;
    case IntType::kI8: *dt = ncclInt8; *n = wire; return;
    case IntType::kU16:
    case IntType::kI16: *dt = ncclUint32; *n = (wire + 1) / 2; return;  // pairs, see ValueLayout::kPairs
    case IntType::kU32: *dt = ncclUint32; *n = wire; return;
    case IntType::kI32: *dt = ncclInt32; *n = wire; return;
  }
}

}  // namespace

struct thcNcclEf_s {
  float* d = nullptr;
  size_t count = 0;
  int device = 0;
};

struct thcNcclComm_s {
  std::mutex mu;
  ncclComm_t nccl = nullptr;
  int rank = 0;
  int nranks = 1;
  int device = 0;
  thc_config_t cfg{};
  uint64_t seed = 0;
  uint32_t* d_state = nullptr;  // [0] call counter (round), [1] sticky status bits
  std::map<int, std::unique_ptr<Codec>> codecs;
  std::map<int, std::unique_ptr<tc::DeviceCodec>> dcodecs;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  cudaEvent_t done = nullptr;  // recorded at the end of each call
  cudaStream_t last_stream = nullptr;
  bool called = false;

  thc::codec::Params params_for(Scheme s) const { return thc::engine::codec_params(cfg, s); }

  // Host codec and its device twin, built on first use (the current device is the comm's).
  std::pair<const Codec*, const tc::DeviceCodec*> codec_for(Scheme s) {
    const int k = static_cast<int>(s);
    auto it = codecs.find(k);
    if (it == codecs.end()) {
      auto c = std::make_unique<Codec>(params_for(s), nranks);
      auto d = std::make_unique<tc::DeviceCodec>();
      THC_CHECK_CUDA(d->init(*c));
      dcodecs[k] = std::move(d);
      it = codecs.emplace(k, std::move(c)).first;
    }
    return {it->second.get(), dcodecs[k].get()};
  }

  bool use_ps(const Codec& c) const {
    if (cfg.algo == THC_ALGO_INT) return false;
    if (cfg.algo == THC_ALGO_PS) return true;
    // The engine's bytes rule (no downstream re-compression on this path).
    const int w = static_cast<int>(thc::codec::int_size(c.sum_type())) * 8;
    return thc::engine::ps_moves_fewer_bits(c.index_bits(), w, w);
  }

  uint64_t chunk_blocks(const Layout& lay) const {
    return thc::engine::chunk_blocks_for(
        std::max<int64_t>(static_cast<int64_t>(g_min_chunk_bytes.load()), static_cast<int64_t>(cfg.chunk_bytes)), lay.block);
  }
};

namespace {

// Workspace of one call: offsets into the handle's single device buffer.
struct WsPlan {
  size_t pre = 0, pre_temp = 0, vals = 0, packed = 0, gathered = 0, shard = 0, codec_temp = 0, total = 0;
  size_t pre_temp_bytes = 0, codec_temp_bytes = 0;
};

uint64_t chunk_wire(const Layout& lay, uint64_t b0, uint64_t nblk) {
  return (nblk - 1) * lay.block + lay.wire(b0 + nblk - 1);
}
uint64_t shard_elems(uint64_t wire, int n) {
  const uint64_t per = (wire + 8ull * n - 1) / (8ull * n);
  return per * 8;
}

WsPlan plan_ws(const Codec& c, const tc::DeviceCodec& dc, const Layout& lay, uint64_t chunk_blocks, bool ps, int n) {
  WsPlan w;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off = align_up(off + std::max<size_t>(bytes, 1));
    return at;
  };
  w.pre = take((lay.nblocks + tc::kCheckWords) * sizeof(uint32_t));
  THC_CHECK_CUDA(tc::prelude(nullptr, &w.pre_temp_bytes, dc, lay, nullptr, tc::InType::kF32, nullptr, nullptr,
                             nullptr, 0, nullptr));
  w.pre_temp = take(w.pre_temp_bytes);
  const uint64_t cb = std::min(chunk_blocks, lay.nblocks);
  const uint64_t wire_max = cb * lay.block;
  if (ps) {
    const uint64_t sh = shard_elems(wire_max, n);
    const size_t wsz = thc::codec::int_size(c.sum_type());
    w.packed = take(static_cast<size_t>(n) * sh * c.index_bits() / 8);
    w.gathered = take(static_cast<size_t>(n) * sh * c.index_bits() / 8);
    w.shard = take(sh * wsz);
    w.vals = take(static_cast<size_t>(n) * sh * wsz);
  } else {
    w.vals = take(tc::value_bytes(c.sum_type(), tc::ValueLayout::kPairs, wire_max));
  }
  size_t eb = 0, db = 0;
  THC_CHECK_CUDA(tc::encode(nullptr, &eb, dc, lay, 0, cb, nullptr, tc::InType::kF32, nullptr, nullptr, tc::Rng(),
                            tc::EncodeOut(), nullptr, nullptr));
  THC_CHECK_CUDA(tc::decode(nullptr, &db, dc, lay, 0, cb, nullptr, tc::ValueLayout::kNative, nullptr, tc::Rng(), 1,
                            false, nullptr, tc::InType::kF32, nullptr, nullptr, nullptr));
  w.codec_temp_bytes = std::max(eb, db);  // encode and decode of a chunk never overlap
  w.codec_temp = take(w.codec_temp_bytes);
  w.total = off;
  return w;
}

void ensure_ws(thcNcclComm_s* c, size_t bytes, cudaStream_t stream) {
  if (bytes <= c->ws_bytes) return;
  if (is_capturing(stream))
    raise(ncclInvalidUsage, "the call needs " + std::to_string(bytes) + " bytes of workspace (have " +
                                std::to_string(c->ws_bytes) +
                                ") while the stream is capturing a CUDA graph; call thcNcclCommReserve before capture");
  // Earlier calls may still use the old buffer (on any stream).
  if (c->called) THC_CHECK_CUDA(cudaEventSynchronize(c->done));
  const size_t grown = std::max(bytes, c->ws_bytes + c->ws_bytes / 2);
  if (c->ws) THC_CHECK_CUDA(cudaFree(c->ws));
  c->ws = nullptr;
  c->ws_bytes = 0;
  if (cudaMalloc(&c->ws, grown) != cudaSuccess) {
    cudaGetLastError();
    raise(ncclSystemError, "cannot allocate " + std::to_string(grown) + " bytes of device workspace");
  }
  c->ws_bytes = grown;
}

bool in_type(ncclDataType_t dt, tc::InType* t) {
  switch (dt) {
    case ncclFloat32: *t = tc::InType::kF32; return true;
    case ncclFloat16: *t = tc::InType::kF16; return true;
    case ncclBfloat16: *t = tc::InType::kBF16; return true;
    default: return false;
  }
}

void allreduce(thcNcclComm_s* c, const void* send, void* recv, size_t count, ncclDataType_t dt, ncclRedOp_t op,
               Scheme scheme, thcNcclEf_s* ef, cudaStream_t stream) {
  std::lock_guard<std::mutex> lk(c->mu);
  // The comm's device (NCCL's rule): workspace, codecs and launches belong there even when the
  // caller's current device is another one.
  DeviceGuard dg(c->device);
  tc::InType it;
  if (count == 0) return;
  if (!recv) raise(ncclInvalidArgument, "recvbuff is NULL");
  if (!send) raise(ncclInvalidArgument, "sendbuff is NULL");
  if (!in_type(dt, &it) || (op != ncclSum && op != ncclAvg)) {
    // Not compressible: the exact collective, untouched.
    THC_CHECK_NCCL(ncclAllReduce(send, recv, count, dt, op, c->nccl, stream));
    return;
  }
  if (ef && ef->count != count)
    raise(ncclInvalidArgument, "error-feedback state was created for count " + std::to_string(ef->count) +
                                   ", used with count " + std::to_string(count));
  if (!c->codecs.count(static_cast<int>(scheme)) && is_capturing(stream))
    raise(ncclInvalidUsage, std::string("scheme ") + thc::codec::scheme_name(scheme) +
                                " is first used while the stream is capturing a CUDA graph (its tables would be "
                                "allocated inside the capture); call thcNcclCommReserve before capture");
  auto [cod, dcod] = c->codec_for(scheme);
  const Layout lay = cod->layout(count);
  const uint64_t B = lay.block;
  const uint64_t nb = lay.nblocks;
  const int n = c->nranks;
  const bool ps = c->use_ps(*cod);
  const uint64_t cb = c->chunk_blocks(lay);
  const WsPlan w = plan_ws(*cod, *dcod, lay, cb, ps, n);
  ensure_ws(c, w.total, stream);
  const bool capturing = is_capturing(stream);
  if (c->called && c->last_stream != stream && !capturing) THC_CHECK_CUDA(cudaStreamWaitEvent(stream, c->done, 0));

  char* base = static_cast<char*>(c->ws);
  uint32_t* pre = reinterpret_cast<uint32_t*>(base + w.pre);
  float* stats = reinterpret_cast<float*>(pre);
  uint32_t* check = pre + nb;
  void* codec_temp = base + w.codec_temp;
  size_t codec_temp_bytes = w.codec_temp_bytes;
  size_t pre_temp_bytes = w.pre_temp_bytes;
  const bool mean = op == ncclAvg;
  const size_t esz = tc::in_size(it);
  float* efr = ef ? ef->d : nullptr;

  uint64_t h = cod->digest();
  h = thc::engine::digest_mix(h, count);
  h = thc::engine::digest_mix(h, mean ? 1 : 0);
  h = thc::engine::digest_mix(h, static_cast<uint64_t>(dt));
  h = thc::engine::digest_mix(h, ps ? 1 : 0);

  // 1. prelude: statistics + check words, one MAX
  THC_CHECK_CUDA(tc::prelude(base + w.pre_temp, &pre_temp_bytes, *dcod, lay, send, it, efr, stats, check, h, stream));
  THC_CHECK_NCCL(ncclAllReduce(pre, pre, nb + tc::kCheckWords, ncclUint32, ncclMax, c->nccl, stream));

  tc::Rng rng;
  rng.seed = c->seed;
  rng.rank = static_cast<uint32_t>(c->rank);
  rng.round_ptr = c->d_state;

  // 2./3. chunks: encode, aggregate, decode
  for (uint64_t b0 = 0; b0 < nb; b0 += cb) {
    const uint64_t nblk = std::min(cb, nb - b0);
    const uint64_t first = b0 * B;
    const uint64_t wire = chunk_wire(lay, b0, nblk);
    const char* xs = static_cast<const char*>(send) + first * esz;
    char* xr = static_cast<char*>(recv) + first * esz;
    float* ef_c = efr ? efr + first : nullptr;
    tc::EncodeOut out;
    out.residual = ef_c;
    if (!ps) {
      void* vals = base + w.vals;
      out.values = vals;
      out.layout = tc::ValueLayout::kPairs;
      THC_CHECK_CUDA(tc::encode(codec_temp, &codec_temp_bytes, *dcod, lay, b0, nblk, xs, it, ef_c, stats + b0, rng,
                                out, check, stream));
      ncclDataType_t vt;
      size_t vn;
      value_wire(cod->sum_type(), wire, &vt, &vn);
      THC_CHECK_NCCL(ncclAllReduce(vals, vals, vn, vt, ncclSum, c->nccl, stream));
      THC_CHECK_CUDA(tc::decode(codec_temp, &codec_temp_bytes, *dcod, lay, b0, nblk, vals, tc::ValueLayout::kPairs,
                                stats + b0, rng, n, mean, xr, it, check, c->d_state + 1, stream));
    } else {
      const int bits = cod->index_bits();
      const uint64_t sh = shard_elems(wire, n);
      const size_t shard_bytes = sh * bits / 8;
      uint8_t* packed = reinterpret_cast<uint8_t*>(base + w.packed);
      uint8_t* gathered = reinterpret_cast<uint8_t*>(base + w.gathered);
      void* shard = base + w.shard;
      void* vals = base + w.vals;
      const size_t used = cod->packed_bytes(wire);
      const size_t total = static_cast<size_t>(n) * shard_bytes;
      // Padding indices are 0, whose table value is 0 for every scheme; the sums are ignored.
      if (total > used) THC_CHECK_CUDA(cudaMemsetAsync(packed + used, 0, total - used, stream));
      out.packed = packed;
      THC_CHECK_CUDA(tc::encode(codec_temp, &codec_temp_bytes, *dcod, lay, b0, nblk, xs, it, ef_c, stats + b0, rng,
                                out, check, stream));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
      THC_CHECK_NCCL(ncclAlltoAll(packed, gathered, shard_bytes, ncclUint8, c->nccl, stream));
#else
      // NCCL without ncclAlltoAll: the same exchange as grouped point-to-point operations
      THC_CHECK_NCCL(ncclGroupStart());
      for (int r = 0; r < n; ++r) {
        THC_CHECK_NCCL(ncclSend(packed + r * shard_bytes, shard_bytes, ncclUint8, r, c->nccl, stream));
        THC_CHECK_NCCL(ncclRecv(gathered + r * shard_bytes, shard_bytes, ncclUint8, r, c->nccl, stream));
      }
      THC_CHECK_NCCL(ncclGroupEnd());
#endif
      THC_CHECK_CUDA(tc::lookup_sum(*dcod, gathered, n, shard_bytes, sh, shard, stream));
      const size_t wsz = thc::codec::int_size(cod->sum_type());
      THC_CHECK_NCCL(ncclAllGather(shard, vals, sh * wsz, ncclUint8, c->nccl, stream));
      THC_CHECK_CUDA(tc::decode(codec_temp, &codec_temp_bytes, *dcod, lay, b0, nblk, vals, tc::ValueLayout::kNative,
                                stats + b0, rng, n, mean, xr, it, check, c->d_state + 1, stream));
    }
  }
  THC_CHECK_CUDA(tc::increment(c->d_state, stream));
  if (!capturing) {
    // (an event recorded inside a capture belongs to the graph; ordering against graph
    // launches is the caller's, like for any workspace shared with a graph)
    THC_CHECK_CUDA(cudaEventRecord(c->done, stream));
    c->last_stream = stream;
    c->called = true;
  }
}

void destroy(thcNcclComm_s* c) {
  if (!c) return;
  {
    DeviceGuard g(c->device);
    if (c->called) cudaEventSynchronize(c->done);
    c->dcodecs.clear();
    if (c->ws) cudaFree(c->ws);
    if (c->d_state) cudaFree(c->d_state);
    if (c->done) cudaEventDestroy(c->done);
  }
  delete c;
}

uint64_t config_digest(const thc_config_t& cfg) {
  uint64_t h = 0x7468636e63636cull;  // "thcnccl"
  uint64_t pb;
  std::memcpy(&pb, &cfg.p, sizeof pb);
  for (uint64_t v : {static_cast<uint64_t>(cfg.bits), static_cast<uint64_t>(cfg.granularity), pb,
                     static_cast<uint64_t>(cfg.uniform), static_cast<uint64_t>(cfg.block),
                     static_cast<uint64_t>(cfg.nat_scheme), static_cast<uint64_t>(cfg.nat_width),
                     static_cast<uint64_t>(cfg.nat_levels), static_cast<uint64_t>(cfg.dnat_norm),
                     static_cast<uint64_t>(cfg.chunk_bytes), static_cast<uint64_t>(cfg.algo)})
    h = thc::engine::digest_mix(h, v);
  return h;
}

Scheme thc_scheme_of(const thc_config_t& cfg) { return cfg.uniform ? Scheme::kUniformThc : Scheme::kThc; }
Scheme nat_scheme_of(const thc_config_t& cfg) {
  return cfg.nat_scheme == THC_SCHEME_DNAT ? Scheme::kDnat : Scheme::kCnat;
}

thcNcclComm_s* create(ncclComm_t nccl, const thc_config_t* cfg_in) {
  if (!nccl) raise(ncclInvalidArgument, "comm is NULL");
  thc_config_t cfg;
  if (cfg_in) {
    cfg = *cfg_in;
  } else if (thc_config_init(&cfg) != THC_SUCCESS) {
    raise(ncclInvalidArgument, std::string("configuration: ") + thc_last_error());
  }
  const int bl = thc::engine::log2_exact(cfg.block);
  if (bl < 10 || bl > 20)
    raise(ncclInvalidArgument, "THC_BLOCK=" + std::to_string(cfg.block) + " must be a power of two in 1024..1048576");
  std::unique_ptr<thcNcclComm_s, void (*)(thcNcclComm_s*)> c(new thcNcclComm_s, destroy);
  c->nccl = nccl;
  c->cfg = cfg;
  THC_CHECK_NCCL(ncclCommCount(nccl, &c->nranks));
  THC_CHECK_NCCL(ncclCommUserRank(nccl, &c->rank));
  THC_CHECK_NCCL(ncclCommCuDevice(nccl, &c->device));
  DeviceGuard g(c->device);
  THC_CHECK_CUDA(cudaMalloc(&c->d_state, 2 * sizeof(uint32_t)));
  THC_CHECK_CUDA(cudaMemset(c->d_state, 0, 2 * sizeof(uint32_t)));
  THC_CHECK_CUDA(cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming));
  THC_CHECK_CUDA(tc::prepare_device());
  // Fail early on a bad configuration, identically on every rank.
  c->codec_for(thc_scheme_of(cfg));
  c->codec_for(nat_scheme_of(cfg));

  // Seed and configuration agreement: rank 0's seed wins a MAX where the others send zeros;
  // (h, ~h) stays consistent under MAX only if every rank has the same h.
  uint64_t mine = cfg.seed;
  if (mine == 0) {
    std::random_device rd;
    mine = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;
  }
  const uint64_t h = config_digest(cfg);
  uint32_t words[6] = {0, 0, static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32), ~static_cast<uint32_t>(h),
                       ~static_cast<uint32_t>(h >> 32)};
  if (c->rank == 0) {
    words[0] = static_cast<uint32_t>(mine);
    words[1] = static_cast<uint32_t>(mine >> 32);
  }
  uint32_t* d_words = nullptr;
  cudaStream_t s = nullptr;
  THC_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct Cleanup {
    cudaStream_t s;
    uint32_t** p;
    ~Cleanup() {
      if (*p) cudaFree(*p);
      cudaStreamDestroy(s);
    }
  } cleanup{s, &d_words};
  THC_CHECK_CUDA(cudaMalloc(&d_words, sizeof words));
  THC_CHECK_CUDA(cudaMemcpyAsync(d_words, words, sizeof words, cudaMemcpyHostToDevice, s));
  THC_CHECK_NCCL(ncclAllReduce(d_words, d_words, 6, ncclUint32, ncclMax, nccl, s));
  THC_CHECK_CUDA(cudaMemcpyAsync(words, d_words, sizeof words, cudaMemcpyDeviceToHost, s));
  THC_CHECK_CUDA(cudaStreamSynchronize(s));
  if (words[2] != ~words[4] || words[3] != ~words[5])
    raise(ncclInvalidUsage, "ranks disagree on the thc configuration (THC_BITS, THC_GRANULARITY, THC_P, THC_UNIFORM, "
                            "THC_BLOCK, THC_NAT_*, THC_DNAT_NORM, THC_CHUNK_BYTES, THC_ALGO)");
  c->seed = (static_cast<uint64_t>(words[1]) << 32) | words[0];
  return c.release();
}

// Handles of the drop-in functions, one per ncclComm_t. Creation is collective (it runs NCCL
// collectives and waits for them), so it must not happen under the registry lock: a process that
// drives several ranks from several threads would deadlock. Each entry is created once, outside.
struct Entry {
  std::once_flag once;
  thcNcclComm_s* comm = nullptr;
};
std::mutex g_registry_mu;
std::unordered_map<ncclComm_t, std::shared_ptr<Entry>>& registry() {
  static auto* r = new std::unordered_map<ncclComm_t, std::shared_ptr<Entry>>();
  return *r;
}

thcNcclComm_s* cached(ncclComm_t nccl) {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lk(g_registry_mu);
    auto& slot = registry()[nccl];
    if (!slot) slot = std::make_shared<Entry>();
    e = slot;
  }
  std::call_once(e->once, [&] { e->comm = create(nccl, nullptr); });  // rethrows; retried next time
  return e->comm;
}

}  // namespace

extern "C" {

ncclResult_t thcNcclCommInit(ncclComm_t comm, const thc_config_t* cfg, thcNcclComm_t* out) {
  return guard("thcNcclCommInit", [&] {
    if (!out) raise(ncclInvalidArgument, "out is NULL");
    *out = create(comm, cfg);
  });
}

ncclResult_t thcNcclCommDestroy(thcNcclComm_t comm) {
  return guard("thcNcclCommDestroy", [&] { destroy(comm); });
}

ncclResult_t thcNcclCommGet(ncclComm_t comm, thcNcclComm_t* out) {
  return guard("thcNcclCommGet", [&] {
    if (!out) raise(ncclInvalidArgument, "out is NULL");
    *out = cached(comm);
  });
}

ncclResult_t thcNcclCommRelease(ncclComm_t comm) {
  return guard("thcNcclCommRelease", [&] {
    std::shared_ptr<Entry> e;
    {
      std::lock_guard<std::mutex> lk(g_registry_mu);
      auto& r = registry();
      auto it = r.find(comm);
      if (it == r.end()) return;
      e = it->second;
      r.erase(it);
    }
    destroy(e->comm);
  });
}

ncclResult_t thcNcclCommReserve(thcNcclComm_t comm, size_t max_count) {
  return guard("thcNcclCommReserve", [&] {
    if (!comm) raise(ncclInvalidArgument, "comm is NULL");
    std::lock_guard<std::mutex> lk(comm->mu);
    DeviceGuard g(comm->device);
    size_t need = 0;
    for (Scheme s : {Scheme::kThc, Scheme::kUniformThc, Scheme::kCnat, Scheme::kDnat}) {
      auto [cod, dcod] = comm->codec_for(s);
      const Layout lay = cod->layout(max_count);
      if (lay.nblocks == 0) continue;
      const uint64_t cb = comm->chunk_blocks(lay);
      for (bool ps : {false, true}) need = std::max(need, plan_ws(*cod, *dcod, lay, cb, ps, comm->nranks).total);
    }
    ensure_ws(comm, need, comm->called ? comm->last_stream : nullptr);
  });
}

ncclResult_t thcNcclCommGetAsyncError(thcNcclComm_t comm, cudaStream_t stream, thc_status_t* status) {
  return guard("thcNcclCommGetAsyncError", [&] {
    if (!comm || !status) raise(ncclInvalidArgument, "comm or status is NULL");
    THC_CHECK_CUDA(cudaStreamSynchronize(stream));
    uint32_t bits = 0;
    THC_CHECK_CUDA(cudaMemcpy(&bits, comm->d_state + 1, sizeof bits, cudaMemcpyDeviceToHost));
    *status = (bits & tc::kStatusMismatch)    ? THC_ERR_CONFIG_MISMATCH
              : (bits & tc::kStatusNonFinite) ? THC_ERR_NONFINITE
                                              : THC_SUCCESS;
  });
}

ncclResult_t thcNcclEfCreate(size_t count, thcNcclEf_t* ef) {
  return guard("thcNcclEfCreate", [&] {
    if (!ef) raise(ncclInvalidArgument, "ef is NULL");
    auto e = std::make_unique<thcNcclEf_s>();
    e->count = count;
    THC_CHECK_CUDA(cudaGetDevice(&e->device));
    THC_CHECK_CUDA(cudaMalloc(&e->d, std::max<size_t>(count, 1) * sizeof(float)));
    THC_CHECK_CUDA(cudaMemset(e->d, 0, std::max<size_t>(count, 1) * sizeof(float)));
    // cudaMemset is asynchronous (default stream): finish it before a non-blocking stream reads ef
    THC_CHECK_CUDA(cudaStreamSynchronize(0));
    *ef = e.release();
  });
}

ncclResult_t thcNcclEfDestroy(thcNcclEf_t ef) {
  return guard("thcNcclEfDestroy", [&] {
    if (!ef) return;
    {
      DeviceGuard g(ef->device);
      cudaFree(ef->d);
    }
    delete ef;
  });
}

ncclResult_t thcNcclEfReset(thcNcclEf_t ef, cudaStream_t stream) {
  return guard("thcNcclEfReset", [&] {
    if (!ef) raise(ncclInvalidArgument, "ef is NULL");
    THC_CHECK_CUDA(cudaMemsetAsync(ef->d, 0, std::max<size_t>(ef->count, 1) * sizeof(float), stream));
  });
}

ncclResult_t thcNcclEfResidual(thcNcclEf_t ef, float** residual, size_t* count) {
  return guard("thcNcclEfResidual", [&] {
    if (!ef) raise(ncclInvalidArgument, "ef is NULL");
    if (residual) *residual = ef->d;
    if (count) *count = ef->count;
  });
}

ncclResult_t thcAllReduceEx(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, thc_scheme_t scheme, thcNcclComm_t comm, thcNcclEf_t ef,
                            cudaStream_t stream) {
  return guard("thcAllReduceEx", [&] {
    if (!comm) raise(ncclInvalidArgument, "comm is NULL");
    if (scheme < THC_SCHEME_THC || scheme > THC_SCHEME_DNAT)
      raise(ncclInvalidArgument, "unknown scheme " + std::to_string(static_cast<int>(scheme)));
    allreduce(comm, sendbuff, recvbuff, count, datatype, op, static_cast<Scheme>(scheme), ef, stream);
  });
}

ncclResult_t thcAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return guard("thcAllReduce", [&] {
    thcNcclComm_s* c = cached(comm);
    allreduce(c, sendbuff, recvbuff, count, datatype, op, thc_scheme_of(c->cfg), nullptr, stream);
  });
}

ncclResult_t cnatAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return guard("cnatAllReduce", [&] {
    thcNcclComm_s* c = cached(comm);
    allreduce(c, sendbuff, recvbuff, count, datatype, op, nat_scheme_of(c->cfg), nullptr, stream);
  });
}

const char* thcNcclGetLastError(void) { return g_last_error.c_str(); }

}  // extern "C"

namespace thc::cuda {
void set_min_chunk_bytes(size_t bytes) { g_min_chunk_bytes.store(std::max<size_t>(bytes, 4)); }
size_t min_chunk_bytes() { return g_min_chunk_bytes.load(); }
}  // namespace thc::cuda
