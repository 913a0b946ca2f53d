#include "nccl_plugin/collnet.h"

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "nccl_plugin/aggregator_job.h"
#include "nccl_plugin/device.h"
#include "nccl_plugin/guard.h"
#include "collectives/capi/capi.h"
#include "nccl_plugin/log.h"
#include "thc/thc.h"
#include "transport/schedules/schedules.h"
#include "transport/ucx/ucx_reducer.h"

namespace thc::nccl_plugin::collnet {
namespace {

using namespace nccl_abi;

constexpr uint64_t kHandleMagic = 0x7468632d636f6c6cull;  // "thc-coll"
constexpr uint32_t kHandleVersion = 1;

// What listen() writes into NCCL's handle. connect() gets every rank's.
struct Handle {
  uint64_t magic;
  uint32_t version;
  int32_t dev;
  uint64_t nonce;  // random per listen
  transport::ucx::Address peer;  // THC_COLLNET_AGGREGATOR=peers: the rank's UCX listener (else zero)
};
static_assert(sizeof(Handle) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large for NCCL");

constexpr uint32_t kListenMagic = 0x636c7374;  // "clst"
constexpr uint32_t kCommMagic = 0x63636f6d;    // "ccom"
constexpr uint32_t kRequestMagic = 0x63726571; // "creq"
constexpr uint32_t kMrMagic = 0x636d7267;      // "cmrg"

struct ListenComm {
  uint32_t magic = kListenMagic;
  int dev = 0;
  // THC_COLLNET_AGGREGATOR=peers: this rank's UCX listener, whose address the handle carries.
  std::unique_ptr<transport::UcxPeerListener> peers;
};

// THC_COLLNET_AGGREGATOR=peers: no aggregator; the CollNet ranks (NCCL's node leaders) reduce
// among themselves with thc's schedules (colocated PS or ring, THC_ALGO) over UCX endpoints, the
// addresses travelling in NCCL's own handle exchange.
constexpr const char* kPeers = "peers";

struct Settings {
  bool inited = false;
  std::string aggregator;
  thc_scheme_t scheme = THC_SCHEME_THC;
  thc_config_t cfg{};
};
std::mutex g_mu;
Settings& settings() {
  static Settings* s = new Settings;  // never destroyed: NCCL may call in while the process exits
  return *s;
}

const char* scheme_name(thc_scheme_t s) {
  switch (s) {
    case THC_SCHEME_THC: return "thc";
    case THC_SCHEME_UHC: return "uhc";
    case THC_SCHEME_CNAT: return "cnat";
    case THC_SCHEME_DNAT: return "dnat";
    default: return "?";
  }
}

struct CollComm;

struct Request {
  uint32_t magic = kRequestMagic;
  CollComm* comm = nullptr;
  bool in_use = false;  // NCCL's proxy thread only
  std::atomic<bool> done{false};
  // the work
  void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  thc_dtype_t dtype = THC_FLOAT32;
  thc_op_t op = THC_OP_SUM;
  bool on_device = false;  // send and recv are CUDA device memory
  // the outcome, written by the worker before done
  ncclResult_t result = ncclSuccess;
};

struct CollComm {
  uint32_t magic = kCommMagic;
  thc_comm_t comm = nullptr;
  int rank = 0;
  int nranks = 0;
  uint32_t job = 0;
  thc_scheme_t scheme = THC_SCHEME_THC;
  std::array<Request, NCCL_NET_MAX_REQUESTS> pool;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Request*> queue;
  bool stop = false;
  // The first failure; every later request fails at once with it instead of waiting out the
  // timeout again.
  ncclResult_t broken = ncclSuccess;
  std::string broken_why;
  uint64_t calls = 0;  // worker thread only
  std::thread worker;
};

bool map_type(ncclDataType_t t, thc_dtype_t* out) {
  switch (t) {
    case ncclFloat32: *out = THC_FLOAT32; return true;
    case ncclFloat16: *out = THC_FLOAT16; return true;
    case ncclBfloat16: *out = THC_BFLOAT16; return true;
    default: return false;
  }
}

bool map_op(ncclRedOp_t op, thc_op_t* out) {
  switch (op) {
    case ncclSum: *out = THC_OP_SUM; return true;
    case ncclAvg: *out = THC_OP_AVG; return true;  // never asked by NCCL (it sums and scales), exact anyway
    default: return false;
  }
}

size_t elem_size(thc_dtype_t t) { return t == THC_FLOAT32 ? 4 : 2; }

ncclResult_t from_thc(thc_status_t s) {
  switch (s) {
    case THC_SUCCESS: return ncclSuccess;
    case THC_ERR_TIMEOUT:
    case THC_ERR_TRANSPORT: return ncclRemoteError;
    case THC_ERR_INVALID_ARG: return ncclInvalidArgument;
    case THC_ERR_CONFIG_MISMATCH:
    case THC_ERR_OVERFLOW:
    case THC_ERR_UNSUPPORTED: return ncclInvalidUsage;
    case THC_ERR_NO_MEMORY: return ncclSystemError;
    default: return ncclInternalError;
  }
}

// NaN of the element type over the whole result when some rank's input was not finite: what a
// float sum would have produced somewhere, so mixed-precision training sees a non-finite gradient
// and skips the step (its loss scaler relies on that) instead of NCCL failing the communicator.
void fill_nan(void* out, size_t count, thc_dtype_t t) {
  if (t == THC_FLOAT32) {
    float* f = static_cast<float*>(out);
    for (size_t i = 0; i < count; ++i) f[i] = std::numeric_limits<float>::quiet_NaN();
  } else {
    const uint16_t bits = t == THC_FLOAT16 ? 0x7e00 : 0x7fc0;  // quiet NaN in half / bfloat16
    uint16_t* h = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < count; ++i) h[i] = bits;
  }
}

void run(CollComm* c, Request* r) {
  ncclResult_t res;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    res = c->broken;
  }
  if (res == ncclSuccess) {
    const thc_status_t st = thc_allreduce_scheme(c->scheme, r->send, r->recv, r->count, r->dtype, r->op, c->comm, nullptr);
    ++c->calls;
    if (st == THC_ERR_NONFINITE) {
      THC_PLUGIN_INFO(NCCL_COLL, "CollNet rank %d job %u: non-finite input in an allreduce of %zu elements: result set to NaN",
                      c->rank, c->job, r->count);
      if (r->on_device) {
        std::string why;
        if (!device::fill_nan(r->recv, r->count, r->dtype == THC_FLOAT32 ? 4 : 2,
                              r->dtype == THC_FLOAT32 ? 0x7fc00000u : r->dtype == THC_FLOAT16 ? 0x7e00u : 0x7fc0u, &why)) {
          res = ncclInternalError;
          std::lock_guard<std::mutex> lk(c->mu);
          if (c->broken == ncclSuccess) {
            c->broken = res;
            c->broken_why = "writing NaN into the device result: " + why;
          }
        }
      } else {
        fill_nan(r->recv, r->count, r->dtype);
      }
    } else if (st != THC_SUCCESS) {
      res = from_thc(st);
      std::lock_guard<std::mutex> lk(c->mu);
      if (c->broken == ncclSuccess) {
        c->broken = res;
        c->broken_why = std::string(thc_status_string(st)) + ": " + thc_last_error();
      }
    } else if (c->calls == 1) {
      THC_PLUGIN_INFO(NCCL_COLL, "CollNet rank %d job %u: first %s allreduce of %zu elements done", c->rank, c->job,
                      scheme_name(c->scheme), r->count);
    }
  }
  r->result = res;
  r->done.store(true, std::memory_order_release);
}

void worker_main(CollComm* c) {
  for (;;) {
    Request* r = nullptr;
    {
      std::unique_lock<std::mutex> lk(c->mu);
      c->cv.wait(lk, [&] { return c->stop || !c->queue.empty(); });
      if (c->queue.empty()) return;  // stopping, nothing left
      r = c->queue.front();
      c->queue.pop_front();
    }
    run(c, r);
  }
}

CollComm* as_comm(void* p) {
  auto* c = static_cast<CollComm*>(p);
  if (!c || c->magic != kCommMagic) fail(Status::kInvalidArgument, "not a CollNet comm");
  return c;
}

// splitmix64: spreads the nonces so that job ids of different communicators differ in every bit.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A registration: the memory type NCCL declared and the range, so that iallreduce can check
// that each buffer lies in its handle's range and that send and receive are of one kind.
struct Mr {
  uint32_t magic = kMrMagic;
  void* comm = nullptr;
  int type = NCCL_PTR_HOST;
  const char* base = nullptr;
  size_t size = 0;
};

const char* type_name(int type) { return type == NCCL_PTR_CUDA ? "NCCL_PTR_CUDA" : "NCCL_PTR_HOST"; }

// The buffer's memory type from its registration (NCCL always passes one); without a handle, what
// the CUDA runtime says of the pointer.
int buffer_type(void* coll_comm, const char* what, const void* p, size_t bytes, void* mhandle) {
  if (!mhandle) return device::is_device(p) ? NCCL_PTR_CUDA : NCCL_PTR_HOST;
  auto* m = static_cast<Mr*>(mhandle);
  if (m->magic != kMrMagic || m->comm != coll_comm) fail(Status::kInvalidArgument, std::string(what) + ": not a memory handle of this comm");
  const char* c = static_cast<const char*>(p);
  if (c < m->base || bytes > m->size || static_cast<size_t>(c - m->base) > m->size - bytes)
    fail(Status::kInvalidArgument, std::string(what) + " [" + std::to_string(reinterpret_cast<uintptr_t>(p)) + ", +" +
                                       std::to_string(bytes) + ") lies outside its registration (" +
                                       std::to_string(m->size) + " bytes)");
  return m->type;
}

}  // namespace

ncclResult_t init(ncclDebugLogger_t logger) {
  const ncclResult_t r = net::init(logger);  // CollNet devices are the net devices
  if (r != ncclSuccess) return r;
  return guard("CollNet init", [&] {
    std::lock_guard<std::mutex> lk(g_mu);
    Settings& s = settings();
    if (s.inited) return;
    if (thc_config_init(&s.cfg) != THC_SUCCESS) fail(Status::kInvalidArgument, std::string("THC_* environment: ") + thc_last_error());
    s.aggregator = s.cfg.collnet_aggregator;
    s.scheme = static_cast<thc_scheme_t>(s.cfg.collnet_scheme);
    s.inited = true;
    const std::string at = s.aggregator == kPeers ? std::string("the ranks themselves (peers, over UCX)")
                                                  : "aggregator " + s.aggregator;
    if (s.aggregator.empty()) {
      THC_PLUGIN_INFO(NCCL_INIT | NCCL_NET, "CollNet: off (THC_COLLNET_AGGREGATOR not set): no CollNet device");
    } else if (s.scheme == THC_SCHEME_THC || s.scheme == THC_SCHEME_UHC) {
      THC_PLUGIN_INFO(NCCL_INIT | NCCL_NET,
                      "CollNet: %s-compressed allreduce (bits %d, granularity %d, p %g, block %ld) at %s, "
                      "timeout %ld ms",
                      scheme_name(s.scheme), s.cfg.bits, s.cfg.granularity, s.cfg.p, s.cfg.block, at.c_str(),
                      s.cfg.timeout_ms);
    } else {
      THC_PLUGIN_INFO(NCCL_INIT | NCCL_NET,
                      "CollNet: %s-compressed allreduce (sum width %d, levels %d, block %ld) at %s, "
                      "timeout %ld ms",
                      scheme_name(s.scheme), s.cfg.nat_width, s.cfg.nat_levels, s.cfg.block, at.c_str(),
                      s.cfg.timeout_ms);
    }
  });
}

ncclResult_t devices(int* ndev) {
  if (!ndev) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!settings().inited) return ncclInvalidUsage;
    if (settings().aggregator.empty()) {
      *ndev = 0;
      return ncclSuccess;
    }
  }
  return net::devices(ndev);
}

ncclResult_t properties(int dev, net::Props* props) {
  const ncclResult_t r = net::properties(dev, props);
  if (r != ncclSuccess) return r;
  props->max_recvs = 1;
  // Device buffers when a CUDA device is usable: the codec then runs on the GPU and only the codes
  // cross PCIe. Not NCCL_PTR_DMABUF: the plugin reaches device memory through CUDA kernels, never
  // through the NIC, so a DMA-BUF file descriptor would give it nothing (regMrDmaBuf still takes
  // a device range, ignoring the descriptor).
  if (device::available()) props->ptr_support |= NCCL_PTR_CUDA;
  return ncclSuccess;
}

ncclResult_t listen(int dev, void* handle, void** listen_comm) {
  return guard("CollNet listen", [&] {
    if (!handle || !listen_comm) fail(Status::kInvalidArgument, "handle or listenComm is NULL");
    *listen_comm = nullptr;
    int ndev = 0;
    if (devices(&ndev) != ncclSuccess || dev < 0 || dev >= ndev)
      fail(Status::kInvalidArgument, "no CollNet device " + std::to_string(dev) + " (is THC_COLLNET_AGGREGATOR set?)");
    Handle h{};
    h.magic = kHandleMagic;
    h.version = kHandleVersion;
    h.dev = dev;
    std::random_device rd;
    h.nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    auto l = std::make_unique<ListenComm>();
    l->dev = dev;
    bool peers = false;
    long timeout_ms = 0;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      peers = settings().aggregator == kPeers;
      timeout_ms = settings().cfg.timeout_ms;
    }
    if (peers) {
      l->peers = transport::ucx_listen(timeout_ms);
      h.peer = l->peers->address();
    }
    std::memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
    std::memcpy(handle, &h, sizeof h);
    *listen_comm = l.release();
  });
}

ncclResult_t connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm) {
  return guard("CollNet connect", [&] {
    auto* l = static_cast<ListenComm*>(listen_comm);
    if (!handles || !coll_comm || !l || l->magic != kListenMagic || nranks < 1 || rank < 0 || rank >= nranks)
      fail(Status::kInvalidArgument,
           "bad arguments (nranks " + std::to_string(nranks) + ", rank " + std::to_string(rank) + ")");
    *coll_comm = nullptr;
    // Every rank sees the same handles in the same order: the job id and the credential follow
    // from all of them, so no rank has to decide and tell the others.
    uint64_t h = mix(static_cast<uint64_t>(nranks));
    std::vector<transport::ucx::Address> peer_addrs(static_cast<size_t>(nranks));
    for (int i = 0; i < nranks; ++i) {
      Handle hi{};
      if (!handles[i]) fail(Status::kInvalidArgument, "handle of rank " + std::to_string(i) + " is NULL");
      std::memcpy(&hi, handles[i], sizeof hi);
      if (hi.magic != kHandleMagic || hi.version != kHandleVersion)
        fail(Status::kInvalidArgument, "handle of rank " + std::to_string(i) + " is not a thc CollNet handle");
      h = mix(h ^ hi.nonce);
      peer_addrs[static_cast<size_t>(i)] = hi.peer;
    }
    uint32_t job = static_cast<uint32_t>(h >> 32);
    if (job == 0) job = 1;
    const uint64_t credential = mix(h ^ 0x746863636f6c6c6eull);
    Settings s;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      s = settings();
    }
    if (s.aggregator.empty()) fail(Status::kInvalidArgument, "THC_COLLNET_AGGREGATOR is not set");
    // Before the first allreduce: a usable device registers the engine's device path.
    std::string no_device;
    const std::string buffers =
        device::available(&no_device) ? "device buffers: GPU codec" : "host buffers only: " + no_device;
    auto c = std::make_unique<CollComm>();
    c->rank = rank;
    c->nranks = nranks;
    c->job = job;
    c->scheme = s.scheme;
    std::string joined;  // the log's word on where the sums are added
    if (s.aggregator == kPeers) {
      if (!l->peers) fail(Status::kInvalidArgument, "the listen comm of a peers CollNet has no UCX listener");
      for (int i = 0; i < nranks; ++i)
        if (peer_addrs[static_cast<size_t>(i)].magic != transport::ucx::Address::kMagic)
          fail(Status::kConfigMismatch, "rank " + std::to_string(i) +
                                            "'s handle carries no UCX address: every rank must run with "
                                            "THC_COLLNET_AGGREGATOR=peers");
      std::unique_ptr<transport::Reducer> red = transport::make_scheduled_reducer(
          transport::ucx_connect_peers(*l->peers, peer_addrs, rank, s.cfg.timeout_ms));
      if (capi::create_comm(std::move(red), &s.cfg, &c->comm) != THC_SUCCESS)
        fail(Status::kTransport, "rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                                     ": the peers' communicator: " + thc_last_error());
      joined = "connected to its " + std::to_string(nranks - 1) + " peers over UCX";
    } else {
      const thc_status_t st = open_aggregator_job(s.aggregator, rank, nranks, job, credential, s.cfg, &c->comm);
      if (st != THC_SUCCESS)
        fail(st == THC_ERR_TIMEOUT       ? Status::kTimeout
             : st == THC_ERR_INVALID_ARG ? Status::kInvalidArgument
             : st == THC_ERR_UNSUPPORTED ? Status::kUnsupported
                                         : Status::kTransport,
             "rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " joining job " + std::to_string(job) +
                 " at " + s.aggregator + ": " + thc_last_error());
      joined = "joined job " + std::to_string(job) + " at " + s.aggregator;
    }
    for (auto& r : c->pool) r.comm = c.get();
    c->worker = std::thread(worker_main, c.get());
    THC_PLUGIN_INFO(NCCL_INIT | NCCL_NET, "CollNet: rank %d of %d %s (%s; %s)", rank, nranks, joined.c_str(),
                    scheme_name(s.scheme), buffers.c_str());
    *coll_comm = c.release();
  });
}

ncclResult_t reduce_support(ncclDataType_t type, ncclRedOp_t op, int* supported) {
  if (!supported) return ncclInvalidArgument;
  thc_dtype_t t;
  thc_op_t o;
  // Only what THC compresses; integer and float64 sums, products, min and max stay with NCCL.
  *supported = map_type(type, &t) && op == ncclSum && map_op(op, &o) ? 1 : 0;
  return ncclSuccess;
}

ncclResult_t reg_mr(void* coll_comm, void* data, size_t size, int type, void** mhandle) {
  return guard("CollNet regMr", [&] {
    as_comm(coll_comm);
    if (!mhandle) fail(Status::kInvalidArgument, "mhandle is NULL");
    *mhandle = nullptr;
    if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA)
      fail(Status::kInvalidArgument, "memory type " + std::to_string(type) +
                                         ": the thc CollNet takes NCCL_PTR_HOST (1) or NCCL_PTR_CUDA (2)");
    if (!data || size == 0)
      fail(Status::kInvalidArgument, "registration of " + std::to_string(size) + " bytes at " +
                                         (data ? "a buffer" : "NULL") + ": needs a buffer and a size > 0");
    if (type == NCCL_PTR_CUDA) {
      std::string why;
      if (!device::available(&why))
        fail(Status::kUnsupported, "NCCL_PTR_CUDA: " + why + " (getProperties offers host memory only)");
      if (!device::is_device_range(data, size, &why))
        fail(Status::kInvalidArgument, "NCCL_PTR_CUDA registration of " + std::to_string(size) + " bytes: " + why);
    } else if (device::is_device(data)) {
      fail(Status::kInvalidArgument, "NCCL_PTR_HOST registration of CUDA device memory");
    }
    auto* m = new Mr;
    m->comm = coll_comm;
    m->type = type;
    m->base = static_cast<const char*>(data);
    m->size = size;
    *mhandle = m;
  });
}

ncclResult_t reg_mr_dmabuf(void* coll_comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  // The descriptor would matter to a NIC reading the memory; the codec reads it through its
  // device address, so the range is registered as regMr would.
  (void)offset;
  (void)fd;
  return reg_mr(coll_comm, data, size, type, mhandle);
}

ncclResult_t dereg_mr(void* coll_comm, void* mhandle) {
  return guard("CollNet deregMr", [&] {
    auto* m = static_cast<Mr*>(mhandle);
    if (!m || m->magic != kMrMagic || m->comm != coll_comm) fail(Status::kInvalidArgument, "not a memory handle of this comm");
    m->magic = 0;
    delete m;
  });
}

ncclResult_t iallreduce(void* coll_comm, void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        void* send_mhandle, void* recv_mhandle, void** request) {
  return guard("CollNet iallreduce", [&] {
    CollComm* c = as_comm(coll_comm);
    if (!request || (count > 0 && (!send || !recv))) fail(Status::kInvalidArgument, "NULL buffer or request");
    thc_dtype_t t;
    thc_op_t o;
    if (!map_type(type, &t) || !map_op(op, &o))
      fail(Status::kInvalidArgument, "type " + std::to_string(static_cast<int>(type)) + " / op " +
                                         std::to_string(static_cast<int>(op)) + " (reduceSupport said no)");
    bool on_device = false;
    if (count * elem_size(t) > net::kMaxCollBytes)
      fail(Status::kInvalidArgument, "iallreduce of " + std::to_string(count) + " elements (maxCollBytes 1 GiB)");
    if (count > 0) {
      // Both on the device (the engine's device path: GPU codec, codes staged to pinned host
      // memory) or both on the host; the engine refuses a mix too, but here it is NCCL's
      // registration that is wrong, and NCCL should hear it at once, not from test().
      const size_t bytes = count * elem_size(t);
      const int st = buffer_type(coll_comm, "sendData", send, bytes, send_mhandle);
      const int rt = buffer_type(coll_comm, "recvData", recv, bytes, recv_mhandle);
      if (st != rt)
        fail(Status::kInvalidArgument, std::string("sendData is ") + type_name(st) + ", recvData " + type_name(rt) +
                                           ": both must be host memory or both device memory");
      on_device = st == NCCL_PTR_CUDA;
    }
    *request = nullptr;
    Request* r = nullptr;
    for (auto& q : c->pool)
      if (!q.in_use) {
        r = &q;
        break;
      }
    if (!r) return;  // every slot in flight: NCCL retries later
    r->in_use = true;
    r->done.store(false, std::memory_order_relaxed);
    r->send = send;
    r->recv = recv;
    r->count = count;
    r->dtype = t;
    r->op = o;
    r->on_device = on_device;
    r->result = ncclSuccess;
    {
      std::lock_guard<std::mutex> lk(c->mu);
      c->queue.push_back(r);
    }
    c->cv.notify_one();
    *request = r;
  });
}

ncclResult_t iflush(void* coll_comm, void* data, int size, void* mhandle, void** request) {
  return guard("CollNet iflush", [&] {
    as_comm(coll_comm);
    if (!request) fail(Status::kInvalidArgument, "request is NULL");
    (void)data, (void)size, (void)mhandle;
    // Nothing to flush: host results are written by the worker, device results by the decode
    // kernel, whose stream test() has waited for (no NIC wrote to GPU memory behind CUDA's back).
    *request = nullptr;
  });
}

ncclResult_t test(void* request, int* done, int* size) {
  auto* r = static_cast<Request*>(request);
  if (!r || r->magic != kRequestMagic || !r->in_use || !done) {
    THC_PLUGIN_WARN("CollNet test: not a request in flight");
    return ncclInvalidArgument;
  }
  if (!r->done.load(std::memory_order_acquire)) {
    *done = 0;
    return ncclSuccess;
  }
  *done = 1;
  if (size) *size = static_cast<int>(r->count * elem_size(r->dtype));
  const ncclResult_t res = r->result;
  if (res != ncclSuccess) {
    CollComm* c = r->comm;
    std::string why;
    {
      std::lock_guard<std::mutex> lk(c->mu);
      why = c->broken_why;
    }
    THC_PLUGIN_WARN("CollNet rank %d job %u: allreduce of %zu elements failed: %s", c->rank, c->job, r->count, why.c_str());
  }
  r->in_use = false;
  return res;
}

ncclResult_t close_coll(void* coll_comm) {
  return guard("CollNet closeColl", [&] {
    CollComm* c = as_comm(coll_comm);
    {
      // Requests still queued fail at once; only the running one finishes (bounded by the timeout).
      std::lock_guard<std::mutex> lk(c->mu);
      c->stop = true;
      if (c->broken == ncclSuccess) {
        c->broken = ncclInternalError;
        c->broken_why = "the comm was closed";
      }
    }
    c->cv.notify_one();
    c->worker.join();
    thc_stats_t st{};
    if (thc_comm_stats(c->comm, &st) == THC_SUCCESS && st.calls > 0)
      THC_PLUGIN_INFO(NCCL_NET, "CollNet rank %d job %u: %llu allreduces, %llu elements, %.3f wire bytes/element up, %.3f down",
                      c->rank, c->job, static_cast<unsigned long long>(st.calls),
                      static_cast<unsigned long long>(st.elements),
                      st.elements ? static_cast<double>(st.wire_bytes_up) / static_cast<double>(st.elements) : 0.0,
                      st.elements ? static_cast<double>(st.wire_bytes_down) / static_cast<double>(st.elements) : 0.0);
    const thc_status_t ds = thc_comm_destroy(c->comm);
    c->magic = 0;
    delete c;
    if (ds != THC_SUCCESS) fail(Status::kInternal, std::string("leaving the aggregator job: ") + thc_last_error());
  });
}

ncclResult_t close_listen(void* listen_comm) {
  return guard("CollNet closeListen", [&] {
    auto* l = static_cast<ListenComm*>(listen_comm);
    if (!l || l->magic != kListenMagic) fail(Status::kInvalidArgument, "not a CollNet listen comm");
    l->magic = 0;
    delete l;
  });
}

}  // namespace thc::nccl_plugin::collnet
