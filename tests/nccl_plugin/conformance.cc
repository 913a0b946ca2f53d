// Conformance harness of libnccl-net-thc.so: dlopen()s the built plugin exactly as NCCL does
// (RTLD_NOW | RTLD_LOCAL, dlsym of ncclNetPlugin_vN / ncclCollNetPlugin_vN) and drives it the way
// NCCL's proxy does, over MPI processes that exchange the handles:
//
//   net       init (twice), devices, getProperties (and a bad device); a ring of connections
//             (rank r connects to r+1 and accepts from r-1) with connect/accept polled until
//             non-NULL and accept polled before anyone connected; the data moved by a second
//             thread, as NCCL's progress thread does: up to NCCL_NET_MAX_REQUESTS receives and as
//             many sends in flight, sizes 0, 1, odd, 4 MiB, receive buffers larger than the
//             messages, NULL requests retried, grouped receives of maxRecvs buffers whose sends
//             come in shuffled tag order, iflush on host memory; two rounds, closing send-then-
//             receive and receive-then-send.
//   collnet   CollNet devices mirror the net devices; reduceSupport matrix (types 0..11, ops 0..3);
//             connect with every rank's handle; iallreduce of float32/float16/bfloat16 at counts
//             1, odd, block-1, block+1 and several MiB against the exact sum (NMSE bound), every
//             rank's result bit-identical, all requests in flight at once and tested out of order,
//             twice; in place; count 0; a non-finite input (NaN result, the comm keeps working);
//             NCCL_NET_MAX_REQUESTS requests accepted at once. The thc-aggregator is started by
//             rank 0 (its extra arguments, e.g. loss injection, come from --aggregator-args) and
//             must have aggregated for the job.
//   kill      CollNet with an aggregator killed (SIGKILL) mid-run: the next iallreduce must not
//             block (the first test says not done), and test() must return an error within the
//             timeout (THC_TIMEOUT_MS, set small by the ctest entry); later requests fail too.
//   unreachable  CollNet connect to an address where no aggregator listens: an error, no hang.
//   off       no THC_COLLNET_AGGREGATOR: zero CollNet devices, the net still works.
//   bw        a measurement, not a check of times: per message size, the time per message and
//             the bandwidth of a ring stream with NCCL_NET_MAX_REQUESTS in flight (bytes checked).
//
//   nccl_plugin_conformance PLUGIN.so --version 8|9|10|11 --suite net,collnet|kill|unreachable|off|bw
//                           [--aggregator-args "--fault-drop 0.05 ..."] [--scheme-bound 0.1] [--peers]
//
// --peers: THC_COLLNET_AGGREGATOR=peers, no aggregator: the collnet suite's allreduces run among
// the ranks over UCX (the handles carry each rank's UCX address).
//
// Every failure prints the rank and what went wrong, then aborts the MPI job (non-zero exit);
// every polling loop has a deadline, so a plugin that hangs fails instead of stalling the test.
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "collectives/engine/dtype.h"
#include "nccl_plugin/abi.h"
#include "tests/switch_offload/aggregator_process.h"

namespace {

using namespace thc::nccl_abi;
using Clock = std::chrono::steady_clock;

bool g_peers = false;  // --peers: THC_COLLNET_AGGREGATOR=peers, no aggregator (the ranks reduce over UCX)
int g_rank = 0, g_size = 1;
constexpr auto kDeadline = std::chrono::seconds(120);  // generous: sanitizer builds on 2 busy cores

[[noreturn]] void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "[rank %d] FAILED: %s\n", g_rank, msg);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

#define CHECK(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond)) die("%s:%d: %s: %s", __FILE__, __LINE__, #cond, fmt_(__VA_ARGS__).c_str()); \
  } while (0)
#define CHECK_OK(call)                                                            \
  do {                                                                            \
    const ncclResult_t r_ = (call);                                               \
    if (r_ != ncclSuccess) die("%s:%d: %s returned %d", __FILE__, __LINE__, #call, static_cast<int>(r_)); \
  } while (0)

std::string fmt_(const char* fmt = "", ...) __attribute__((format(printf, 1, 2)));
std::string fmt_(const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return msg;
}

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  if (g_rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::printf("\n");
  std::fflush(stdout);
}

// ---- NCCL's logger, as the plugin sees it: keeps the messages for checks

std::mutex g_log_mu;
std::vector<std::string> g_log_info, g_log_warn;

void logger(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lk(g_log_mu);
  (level == NCCL_LOG_WARN ? g_log_warn : g_log_info).emplace_back(buf);
  if (std::getenv("THC_TEST_VERBOSE") || level == NCCL_LOG_WARN) std::fprintf(stderr, "[rank %d log %d] %s\n", g_rank, static_cast<int>(level), buf);
}

bool logged(const std::vector<std::string>& v, const std::string& needle) {
  std::lock_guard<std::mutex> lk(g_log_mu);
  for (const auto& s : v)
    if (s.find(needle) != std::string::npos) return true;
  return false;
}
void clear_warnings() {
  std::lock_guard<std::mutex> lk(g_log_mu);
  g_log_warn.clear();
}
size_t warn_count() {
  std::lock_guard<std::mutex> lk(g_log_mu);
  return g_log_warn.size();
}

// ---- the plugin's tables behind one version-neutral face (NCCL's adapters do the same)

struct Props {
  std::string name, pci;
  bool has_pci = false;
  uint64_t guid = 0;
  int ptr_support = 0, speed = 0, max_comms = 0, max_recvs = 0, device_type = -1;
  float latency = 0;
  bool v9 = false;  // the fields below exist
  int vdevs = 0, vdev0 = -1;
  size_t max_p2p = 0, max_coll = 0;
};

template <typename P>
Props props_from(const P& p) {
  Props o;
  o.name = p.name ? p.name : "";
  o.has_pci = p.pciPath != nullptr;
  o.pci = p.pciPath ? p.pciPath : "";
  o.guid = p.guid;
  o.ptr_support = p.ptrSupport;
  o.speed = p.speed;
  o.max_comms = p.maxComms;
  o.max_recvs = p.maxRecvs;
  o.device_type = p.netDeviceType;
  o.latency = p.latency;
  if constexpr (!std::is_same_v<P, ncclNetProperties_v8_t>) {
    o.v9 = true;
    o.vdevs = p.vProps.ndevs;
    o.vdev0 = p.vProps.devs[0];
    o.max_p2p = p.maxP2pBytes;
    o.max_coll = p.maxCollBytes;
  }
  return o;
}

struct Net {
  int version = 0;
  std::string name;
  std::function<ncclResult_t()> init;
  std::function<ncclResult_t(int*)> devices;
  std::function<ncclResult_t(int, Props*)> props;
  std::function<ncclResult_t(int, void*, void**)> listen;
  std::function<ncclResult_t(int, void*, void**)> connect;
  std::function<ncclResult_t(void*, void**)> accept;
  std::function<ncclResult_t(void*, void*, size_t, int, void**)> reg_mr;
  std::function<ncclResult_t(void*, void*)> dereg_mr;
  std::function<ncclResult_t(void*, void*, size_t, int, void*, void**)> isend;
  std::function<ncclResult_t(void*, int, void**, size_t*, int*, void**, void**)> irecv;
  std::function<ncclResult_t(void*, int, void**, int*, void**, void**)> iflush;
  std::function<ncclResult_t(void*, int*, int*)> test;
  std::function<ncclResult_t(void*)> close_send, close_recv, close_listen;
  std::function<ncclResult_t()> finalize;
};

struct CollNet {
  int version = 0;
  std::string name;
  std::function<ncclResult_t()> init;
  std::function<ncclResult_t(int*)> devices;
  std::function<ncclResult_t(int, Props*)> props;
  std::function<ncclResult_t(int, void*, void**)> listen;
  std::function<ncclResult_t(void**, int, int, void*, void**)> connect;
  std::function<ncclResult_t(ncclDataType_t, ncclRedOp_t, int*)> reduce_support;
  std::function<ncclResult_t(void*, void*, size_t, int, void**)> reg_mr;
  std::function<ncclResult_t(void*, void*)> dereg_mr;
  std::function<ncclResult_t(void*, void*, void*, size_t, ncclDataType_t, ncclRedOp_t, void*, void*, void**)> iallreduce;
  std::function<ncclResult_t(void*, void*, int, void*, void**)> iflush;
  std::function<ncclResult_t(void*, int*, int*)> test;
  std::function<ncclResult_t(void*)> close_coll, close_listen;
  std::function<ncclResult_t()> finalize;
  // v11: the ctx each init returned (NCCL keeps it as comm->collNetContext)
  std::shared_ptr<std::vector<void*>> ctxs;
};


template <typename T>
T* lookup(void* lib, const std::string& sym) {
  auto* t = static_cast<T*>(dlsym(lib, sym.c_str()));
  CHECK(t != nullptr, "dlsym(%s): %s", sym.c_str(), dlerror());
  return t;
}

// Entries NCCL calls without a NULL check must be there.
#define REQUIRE_FN(t, field) CHECK((t)->field != nullptr, #field " is NULL (NCCL calls it unconditionally)")

template <typename F>
struct PropsOf;
template <typename P>
struct PropsOf<ncclResult_t (*)(int, P*)> {
  using type = P;
};

template <typename T>
std::function<ncclResult_t(int, Props*)> props_fn(T* t) {
  return [t](int d, Props* out) {
    using P = typename PropsOf<decltype(t->getProperties)>::type;
    P p;
    std::memset(&p, 0xa5, sizeof p);  // fields the plugin forgets show up as garbage
    const ncclResult_t r = t->getProperties(d, &p);
    if (r == ncclSuccess) *out = props_from(p);
    return r;
  };
}

// accept / connect must leave no device handle for a host (NCCL_NET_DEVICE_HOST) device.
ncclNetDeviceHandle_t* const kPoison = reinterpret_cast<ncclNetDeviceHandle_t*>(0x10);
void check_dev_handle(ncclResult_t r, void* comm, ncclNetDeviceHandle_t* h, const char* what) {
  if (r == ncclSuccess && comm) CHECK(h == nullptr, "%s left a device handle for a host device", what);
}

template <typename T>
void fill_net_common(Net& n, T* t) {
  CHECK(t->name != nullptr, "name is NULL");
  n.name = t->name;
  REQUIRE_FN(t, init);
  REQUIRE_FN(t, devices);
  REQUIRE_FN(t, getProperties);
  REQUIRE_FN(t, listen);
  REQUIRE_FN(t, connect);
  REQUIRE_FN(t, accept);
  REQUIRE_FN(t, regMr);
  REQUIRE_FN(t, regMrDmaBuf);
  REQUIRE_FN(t, deregMr);
  REQUIRE_FN(t, isend);
  REQUIRE_FN(t, irecv);
  REQUIRE_FN(t, iflush);
  REQUIRE_FN(t, test);
  REQUIRE_FN(t, closeSend);
  REQUIRE_FN(t, closeRecv);
  REQUIRE_FN(t, closeListen);
  REQUIRE_FN(t, getDeviceMr);
  REQUIRE_FN(t, irecvConsumed);
  n.devices = t->devices;
  n.props = props_fn(t);
  n.accept = [t](void* l, void** r) {
    ncclNetDeviceHandle_t* h = kPoison;
    const ncclResult_t res = t->accept(l, r, &h);
    check_dev_handle(res, *r, h, "accept");
    return res;
  };
  n.reg_mr = t->regMr;
  n.dereg_mr = t->deregMr;
  n.iflush = t->iflush;
  n.test = t->test;
  n.close_send = t->closeSend;
  n.close_recv = t->closeRecv;
  n.close_listen = t->closeListen;
  n.finalize = [] { return ncclSuccess; };
}

Net load_net(void* lib, int v) {
  Net n;
  n.version = v;
  const std::string sym = "ncclNetPlugin_v" + std::to_string(v);
  if (v == 8 || v == 9) {
    auto go = [&](auto* t) {
      fill_net_common(n, t);
      n.init = [t] { return t->init(logger); };
      n.listen = t->listen;
      n.connect = [t](int d, void* h, void** s) {
        ncclNetDeviceHandle_t* dh = kPoison;
        const ncclResult_t r = t->connect(d, h, s, &dh);
        check_dev_handle(r, *s, dh, "connect");
        return r;
      };
    };
    if (v == 8) {
      auto* t = lookup<ncclNet_v8_t>(lib, sym);
      go(t);
      n.isend = [t](void* c, void* d, size_t s, int tag, void* mh, void** r) {
        CHECK(s <= INT32_MAX, "size");
        return t->isend(c, d, static_cast<int>(s), tag, mh, r);
      };
      n.irecv = [t](void* c, int k, void** d, size_t* s, int* tags, void** mh, void** r) {
        int si[8];
        for (int i = 0; i < k && i < 8; ++i) si[i] = static_cast<int>(s[i]);
        return t->irecv(c, k, d, si, tags, mh, r);
      };
    } else {
      auto* t = lookup<ncclNet_v9_t>(lib, sym);
      go(t);
      n.isend = t->isend;
      n.irecv = t->irecv;
    }
  } else if (v == 10) {
    auto* t = lookup<ncclNet_v10_t>(lib, sym);
    fill_net_common(n, t);
    n.init = [t] { return t->init(logger, nullptr); };
    n.listen = t->listen;
    n.connect = [t](int d, void* h, void** s) {
      ncclNetCommConfig_t cfg{-1};
      ncclNetDeviceHandle_t* dh = kPoison;
      const ncclResult_t r = t->connect(d, &cfg, h, s, &dh);
      check_dev_handle(r, *s, dh, "connect");
      return r;
    };
    n.isend = [t](void* c, void* d, size_t s, int tag, void* mh, void** r) { return t->isend(c, d, s, tag, mh, nullptr, r); };
    n.irecv = [t](void* c, int k, void** d, size_t* s, int* tags, void** mh, void** r) {
      void* ph[8] = {};
      return t->irecv(c, k, d, s, tags, mh, ph, r);
    };
  } else if (v == 11) {
    auto* t = lookup<ncclNet_v11_t>(lib, sym);
    fill_net_common(n, t);
    REQUIRE_FN(t, finalize);
    // NCCL >= 2.28: one ctx per init (per communicator); listen/connect/finalize take it back.
    auto ctx = std::make_shared<std::vector<void*>>();
    n.init = [t, ctx] {
      ncclNetCommConfig_t cfg{-1};
      void* c = nullptr;
      const ncclResult_t r = t->init(&c, 0x1234 + static_cast<uint64_t>(g_rank), &cfg, logger, nullptr);
      if (r == ncclSuccess) ctx->push_back(c);
      return r;
    };
    n.listen = [t, ctx](int d, void* h, void** l) { return t->listen(ctx->back(), d, h, l); };
    n.connect = [t, ctx](int d, void* h, void** s) {
      ncclNetDeviceHandle_t* dh = kPoison;
      const ncclResult_t r = t->connect(ctx->back(), d, h, s, &dh);
      check_dev_handle(r, *s, dh, "connect");
      return r;
    };
    n.isend = [t](void* c, void* d, size_t s, int tag, void* mh, void** r) { return t->isend(c, d, s, tag, mh, nullptr, r); };
    n.irecv = [t](void* c, int k, void** d, size_t* s, int* tags, void** mh, void** r) {
      void* ph[8] = {};
      return t->irecv(c, k, d, s, tags, mh, ph, r);
    };
    n.finalize = [t, ctx] {
      for (void* c : *ctx) {
        const ncclResult_t r = t->finalize(c);
        if (r != ncclSuccess) return r;
      }
      ctx->clear();
      return ncclSuccess;
    };
  } else {
    die("no such version %d", v);
  }
  return n;
}

template <typename T>
void fill_coll_common(CollNet& c, T* t) {
  CHECK(t->name != nullptr, "name is NULL");
  c.name = t->name;
  REQUIRE_FN(t, init);
  REQUIRE_FN(t, devices);
  REQUIRE_FN(t, getProperties);
  REQUIRE_FN(t, listen);
  REQUIRE_FN(t, connect);
  REQUIRE_FN(t, reduceSupport);
  REQUIRE_FN(t, regMr);
  REQUIRE_FN(t, regMrDmaBuf);
  REQUIRE_FN(t, deregMr);
  REQUIRE_FN(t, iallreduce);
  REQUIRE_FN(t, iflush);
  REQUIRE_FN(t, test);
  REQUIRE_FN(t, closeColl);
  REQUIRE_FN(t, closeListen);
  // Not offered: NULL tells NCCL's tuner to keep CollNet out of allgather / reduce-scatter.
  CHECK(t->iallgather == nullptr && t->ireducescatter == nullptr, "iallgather/ireducescatter should be NULL");
  c.devices = t->devices;
  c.props = props_fn(t);
  c.connect = t->connect;
  c.reduce_support = t->reduceSupport;
  c.reg_mr = t->regMr;
  c.dereg_mr = t->deregMr;
  c.iflush = t->iflush;
  c.test = t->test;
  c.close_coll = t->closeColl;
  c.close_listen = t->closeListen;
  c.finalize = [] { return ncclSuccess; };
}

CollNet load_collnet(void* lib, int v) {
  CollNet c;
  c.version = v;
  const std::string sym = "ncclCollNetPlugin_v" + std::to_string(v);
  if (v == 8) {
    auto* t = lookup<ncclCollNet_v8_t>(lib, sym);
    fill_coll_common(c, t);
    c.init = [t] { return t->init(logger); };
    c.listen = t->listen;
    c.iallreduce = [t](void* cc, void* s, void* r, size_t n, ncclDataType_t ty, ncclRedOp_t op, void* sm, void* rm,
                       void** req) {
      CHECK(n <= INT32_MAX, "count");
      return t->iallreduce(cc, s, r, static_cast<int>(n), ty, op, sm, rm, req);
    };
  } else if (v == 9 || v == 10) {
    auto go = [&](auto* t) {
      fill_coll_common(c, t);
      c.init = [t] { return t->init(logger); };
      c.listen = t->listen;
      c.iallreduce = t->iallreduce;
    };
    if (v == 9)
      go(lookup<ncclCollNet_v9_t>(lib, sym));
    else
      go(lookup<ncclCollNet_v10_t>(lib, sym));
  } else if (v == 11) {
    auto* t = lookup<ncclCollNet_v11_t>(lib, sym);
    fill_coll_common(c, t);
    REQUIRE_FN(t, finalize);
    auto ctx = std::make_shared<std::vector<void*>>();
    c.init = [t, ctx] {
      void* x = nullptr;
      const ncclResult_t r = t->init(&x, 0x4321 + static_cast<uint64_t>(g_rank), logger);
      if (r == ncclSuccess) ctx->push_back(x);
      return r;
    };
    c.ctxs = ctx;
    c.listen = [t, ctx](int d, void* h, void** l) { return t->listen(ctx->back(), d, h, l); };
    c.iallreduce = t->iallreduce;
    c.finalize = [t, ctx] {
      for (void* x : *ctx) {
        const ncclResult_t r = t->finalize(x);
        if (r != ncclSuccess) return r;
      }
      ctx->clear();
      return ncclSuccess;
    };
  } else {
    die("no such version %d", v);
  }
  return c;
}

// ---- helpers

uint8_t pattern_byte(uint64_t seed, size_t i) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x * 0x94d049bb133111ebull >> 56);
}
void fill_pattern(std::vector<uint8_t>& b, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) b[i] = pattern_byte(seed, i);
}
bool check_pattern(const std::vector<uint8_t>& b, size_t n, uint64_t seed, size_t* bad) {
  for (size_t i = 0; i < n; ++i)
    if (b[i] != pattern_byte(seed, i)) {
      *bad = i;
      return false;
    }
  return true;
}

template <typename Pred>
void poll_until(Pred done, const char* what) {
  const auto end = Clock::now() + kDeadline;
  while (!done()) {
    if (Clock::now() > end) die("%s: not done within %lld s", what, static_cast<long long>(kDeadline.count()));
  }
}

// ---- net suite

struct Ring {
  void* send = nullptr;
  void* recv = nullptr;
  int connect_null_calls = 0;
};

Ring connect_ring(Net& net, int dev) {
  const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  std::vector<char> mine(NCCL_NET_HANDLE_MAXSIZE, 0x5a), theirs(NCCL_NET_HANDLE_MAXSIZE, 0);
  void* lcomm = nullptr;
  CHECK_OK(net.listen(dev, mine.data(), &lcomm));
  CHECK(lcomm != nullptr, "listen returned a NULL comm (it must not block nor defer)");
  // Nobody has our handle yet: accept must return at once, with no comm.
  for (int i = 0; i < 20; ++i) {
    void* r = nullptr;
    CHECK_OK(net.accept(lcomm, &r));
    CHECK(r == nullptr, "accept returned a comm before anyone connected");
  }
  MPI_Sendrecv(mine.data(), NCCL_NET_HANDLE_MAXSIZE, MPI_BYTE, prev, 7, theirs.data(), NCCL_NET_HANDLE_MAXSIZE, MPI_BYTE,
               next, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  Ring ring;
  poll_until(
      [&] {
        if (!ring.send) {
          CHECK_OK(net.connect(dev, theirs.data(), &ring.send));
          if (!ring.send) ++ring.connect_null_calls;
        }
        if (!ring.recv) CHECK_OK(net.accept(lcomm, &ring.recv));
        return ring.send && ring.recv;
      },
      "ring connect/accept");
  CHECK_OK(net.close_listen(lcomm));
  return ring;
}

struct Msg {
  size_t size, cap;
  int tag;
};

// The same schedule on every rank: sizes 0, 1, odd, 4 MiB, ..., receive capacity a bit larger.
std::vector<Msg> schedule(int n) {
  const size_t sizes[] = {0, 1, 7, size_t{4} << 20, 4093, 65536, 3, 100000, 12, 1 << 20};
  std::vector<Msg> m;
  for (int i = 0; i < n; ++i) {
    const size_t s = sizes[static_cast<size_t>(i) % (sizeof sizes / sizeof sizes[0])];
    m.push_back({s, s + static_cast<size_t>(i % 3) * 8, 1});
  }
  return m;
}

// NCCL_NET_MAX_REQUESTS send and receive buffers of `bytes` each, registered on the ring's comms
// (host memory), as NCCL's proxy keeps one slot per request in flight.
struct Window {
  static constexpr size_t kSlots = NCCL_NET_MAX_REQUESTS;
  std::vector<std::vector<uint8_t>> sbuf, rbuf;
  std::vector<void*> smh, rmh;
  Window(Net& net, const Ring& ring, size_t bytes) : sbuf(kSlots), rbuf(kSlots), smh(kSlots), rmh(kSlots) {
    for (size_t w = 0; w < kSlots; ++w) {
      sbuf[w].resize(bytes);
      rbuf[w].resize(bytes);
      CHECK_OK(net.reg_mr(ring.send, sbuf[w].data(), bytes, NCCL_PTR_HOST, &smh[w]));
      CHECK_OK(net.reg_mr(ring.recv, rbuf[w].data(), bytes, NCCL_PTR_HOST, &rmh[w]));
    }
  }
  void release(Net& net, const Ring& ring) {
    for (size_t w = 0; w < kSlots; ++w) {
      CHECK_OK(net.dereg_mr(ring.send, smh[w]));
      CHECK_OK(net.dereg_mr(ring.recv, rmh[w]));
    }
  }
};

// NCCL's progress thread: a window of receives and sends, refilled as test() completes them.
void stream_messages(Net& net, const Ring& ring, int nmsg, int round) {
  const int prev = (g_rank + g_size - 1) % g_size;
  const std::vector<Msg> sched = schedule(nmsg);
  const int window = NCCL_NET_MAX_REQUESTS;
  Window win(net, ring, (size_t{4} << 20) + 64);
  auto &sbuf = win.sbuf, &rbuf = win.rbuf;
  auto &smh = win.smh, &rmh = win.rmh;
  std::vector<void*> sreq(static_cast<size_t>(window), nullptr), rreq(static_cast<size_t>(window), nullptr);
  int posted_s = 0, posted_r = 0, done_s = 0, done_r = 0, null_sends = 0;
  int max_recv_in_flight = 0;
  const auto end = Clock::now() + kDeadline;
  while (done_s < nmsg || done_r < nmsg) {
    // receives first, as NCCL posts them ahead of the data; every slot must be accepted
    while (posted_r < nmsg && posted_r - done_r < window) {
      const size_t w = static_cast<size_t>(posted_r % window);
      if (rreq[w]) break;
      const Msg& m = sched[static_cast<size_t>(posted_r)];
      void* data = rbuf[w].data();
      size_t cap = m.cap;
      int tag = m.tag;
      void* mh = rmh[w];
      std::memset(rbuf[w].data(), 0xee, m.cap);
      CHECK_OK(net.irecv(ring.recv, 1, &data, &cap, &tag, &mh, &rreq[w]));
      CHECK(rreq[w] != nullptr, "irecv returned a NULL request with %d in flight (< NCCL_NET_MAX_REQUESTS)",
            posted_r - done_r);
      ++posted_r;
      max_recv_in_flight = std::max(max_recv_in_flight, posted_r - done_r);
    }
    while (posted_s < nmsg && posted_s - done_s < window) {
      const size_t w = static_cast<size_t>(posted_s % window);
      if (sreq[w]) break;
      const Msg& m = sched[static_cast<size_t>(posted_s)];
      fill_pattern(sbuf[w], m.size, static_cast<uint64_t>(g_rank) * 1000003u + static_cast<uint64_t>(posted_s) * 31u + round);
      CHECK_OK(net.isend(ring.send, sbuf[w].data(), m.size, m.tag, smh[w], &sreq[w]));
      if (!sreq[w]) {  // "try again later" is allowed
        ++null_sends;
        break;
      }
      ++posted_s;
    }
    // test in posting order, like NCCL
    if (done_r < posted_r) {
      const size_t w = static_cast<size_t>(done_r % window);
      int done = 0, size = -1;
      CHECK_OK(net.test(rreq[w], &done, &size));
      if (done) {
        const Msg& m = sched[static_cast<size_t>(done_r)];
        CHECK(size == static_cast<int>(m.size), "receive %d: test reported %d bytes, %zu were sent", done_r, size, m.size);
        size_t bad = 0;
        CHECK(check_pattern(rbuf[w], m.size, static_cast<uint64_t>(prev) * 1000003u + static_cast<uint64_t>(done_r) * 31u + round, &bad),
              "receive %d of %zu bytes from rank %d: byte %zu differs", done_r, m.size, prev, bad);
        // host memory: iflush is a no-op (NULL request, or one that completes)
        void* freq = reinterpret_cast<void*>(0x1);
        void* data = rbuf[w].data();
        int fs = static_cast<int>(m.size);
        void* mh = rmh[w];
        CHECK_OK(net.iflush(ring.recv, 1, &data, &fs, &mh, &freq));
        if (freq) poll_until([&] { int d = 0; CHECK_OK(net.test(freq, &d, nullptr)); return d != 0; }, "iflush");
        rreq[w] = nullptr;
        ++done_r;
      }
    }
    if (done_s < posted_s) {
      const size_t w = static_cast<size_t>(done_s % window);
      int done = 0, size = -1;
      CHECK_OK(net.test(sreq[w], &done, &size));
      if (done) {
        CHECK(size == static_cast<int>(sched[static_cast<size_t>(done_s)].size), "send %d: test reported %d bytes", done_s, size);
        sreq[w] = nullptr;
        ++done_s;
      }
    }
    if (Clock::now() > end) die("streaming: %d/%d sends, %d/%d receives done", done_s, nmsg, done_r, nmsg);
  }
  CHECK(max_recv_in_flight >= std::min(nmsg, window), "only %d receives were in flight", max_recv_in_flight);
  win.release(net, ring);
  (void)null_sends;
}

// Grouped receives: each irecv takes `group` buffers with distinct tags; the sender sends the
// group's messages in a shuffled tag order, and each must land in the buffer of its tag.
void grouped_messages(Net& net, const Ring& ring, int group, int ngroups) {
  const int prev = (g_rank + g_size - 1) % g_size;
  auto seed = [](int rank, int g, int j) { return static_cast<uint64_t>(rank) * 7919u + static_cast<uint64_t>(g) * 131u + static_cast<uint64_t>(j) + 99; };
  auto msg_size = [](int g, int j) { return static_cast<size_t>((g * 37 + j * 1001) % 5000 + (j == 0 ? 0 : 1)); };
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(group * ngroups)), in(static_cast<size_t>(group * ngroups));
  std::vector<void*> rreq(static_cast<size_t>(ngroups), nullptr);
  std::vector<void*> sreq;
  for (int g = 0; g < ngroups; ++g) {
    std::vector<void*> data(static_cast<size_t>(group));
    std::vector<size_t> caps(static_cast<size_t>(group));
    std::vector<int> tags(static_cast<size_t>(group));
    std::vector<void*> mhs(static_cast<size_t>(group), nullptr);
    for (int j = 0; j < group; ++j) {
      auto& b = in[static_cast<size_t>(g * group + j)];
      b.assign(6000, 0xee);
      data[static_cast<size_t>(j)] = b.data();
      caps[static_cast<size_t>(j)] = b.size();
      tags[static_cast<size_t>(j)] = 500 + j;
    }
    CHECK_OK(net.irecv(ring.recv, group, data.data(), caps.data(), tags.data(), mhs.data(), &rreq[static_cast<size_t>(g)]));
    CHECK(rreq[static_cast<size_t>(g)] != nullptr, "grouped irecv %d returned a NULL request", g);
  }
  std::mt19937 shuffle(static_cast<unsigned>(g_rank) + 5);
  for (int g = 0; g < ngroups; ++g) {
    std::vector<int> order(static_cast<size_t>(group));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), shuffle);
    for (int j : order) {
      auto& b = out[static_cast<size_t>(g * group + j)];
      b.resize(msg_size(g, j) + 1);
      fill_pattern(b, msg_size(g, j), seed(g_rank, g, j));
      void* r = nullptr;
      poll_until([&] { CHECK_OK(net.isend(ring.send, b.data(), msg_size(g, j), 500 + j, nullptr, &r)); return r != nullptr; },
                 "grouped isend");
      sreq.push_back(r);
    }
  }
  std::vector<bool> sdone(sreq.size(), false), rdone(static_cast<size_t>(ngroups), false);
  poll_until(
      [&] {
        bool all = true;
        for (size_t i = 0; i < sreq.size(); ++i) {
          if (sdone[i]) continue;
          int d = 0;
          CHECK_OK(net.test(sreq[i], &d, nullptr));
          sdone[i] = d != 0;
          all = all && sdone[i];
        }
        for (int g = 0; g < ngroups; ++g) {
          if (rdone[static_cast<size_t>(g)]) continue;
          int d = 0;
          std::vector<int> sizes(static_cast<size_t>(group), -1);
          CHECK_OK(net.test(rreq[static_cast<size_t>(g)], &d, sizes.data()));
          if (d) {
            for (int j = 0; j < group; ++j) {
              CHECK(sizes[static_cast<size_t>(j)] == static_cast<int>(msg_size(g, j)), "group %d buffer %d: size %d, sent %zu", g, j,
                    sizes[static_cast<size_t>(j)], msg_size(g, j));
              size_t bad = 0;
              CHECK(check_pattern(in[static_cast<size_t>(g * group + j)], msg_size(g, j), seed(prev, g, j), &bad),
                    "group %d buffer %d (tag %d): byte %zu differs: a message landed in the wrong buffer", g, j, 500 + j, bad);
            }
            rdone[static_cast<size_t>(g)] = true;
          }
          all = all && rdone[static_cast<size_t>(g)];
        }
        return all;
      },
      "grouped receives");
}

void net_suite(Net& net) {
  CHECK_OK(net.init());
  CHECK_OK(net.init());  // NCCL >= 2.28 initialises once per communicator
  int ndev = 0;
  CHECK_OK(net.devices(&ndev));
  CHECK(ndev >= 1, "devices() = %d", ndev);
  for (int d = 0; d < ndev; ++d) {
    Props p;
    CHECK_OK(net.props(d, &p));
    CHECK(!p.name.empty(), "device %d has no name", d);
    CHECK(p.ptr_support & NCCL_PTR_HOST, "device %d: ptrSupport %d lacks NCCL_PTR_HOST", d, p.ptr_support);
    CHECK(!(p.ptr_support & NCCL_PTR_CUDA), "device %d claims GPU Direct RDMA", d);
    CHECK(p.speed > 0, "device %d: speed %d", d, p.speed);
    CHECK(p.max_comms > 0 && p.max_recvs >= 1 && p.max_recvs <= 8, "device %d: maxComms %d maxRecvs %d", d, p.max_comms, p.max_recvs);
    CHECK(p.device_type == NCCL_NET_DEVICE_HOST, "device %d: netDeviceType %d", d, p.device_type);
    CHECK(p.latency >= 0 && p.latency < 1e6, "latency %g", static_cast<double>(p.latency));
    if (p.v9) {
      CHECK(p.vdevs == 1 && p.vdev0 == d, "device %d: vProps {%d, %d}", d, p.vdevs, p.vdev0);
      CHECK(p.max_p2p > 0 && p.max_p2p <= NCCL_MAX_NET_SIZE_BYTES && p.max_p2p <= INT32_MAX, "maxP2pBytes %zu", p.max_p2p);
      CHECK(p.max_coll > 0 && p.max_coll <= NCCL_MAX_NET_SIZE_BYTES, "maxCollBytes %zu", p.max_coll);
    }
    say("  net v%d device %d: %s pci %s speed %d Mb/s maxComms %d maxRecvs %d", net.version, d, p.name.c_str(),
        p.has_pci ? p.pci.c_str() : "(virtual)", p.speed, p.max_comms, p.max_recvs);
  }
  Props bad;
  CHECK(net.props(ndev, &bad) != ncclSuccess, "getProperties of device %d (of %d) succeeded", ndev, ndev);
  CHECK(warn_count() == 1, "a bad device number should give one warning, not %zu", warn_count());
  clear_warnings();
  Props p0;
  CHECK_OK(net.props(0, &p0));

  for (int round = 0; round < 2; ++round) {
    Ring ring = connect_ring(net, 0);
    // The comms move to another thread for the data, as NCCL's proxy hands them to its
    // progress thread.
    std::thread progress([&] {
      stream_messages(net, ring, 3 * NCCL_NET_MAX_REQUESTS, round);
      grouped_messages(net, ring, p0.max_recvs, 6);
    });
    progress.join();
    if (round == 0) {
      CHECK_OK(net.close_send(ring.send));
      CHECK_OK(net.close_recv(ring.recv));
    } else {
      CHECK_OK(net.close_recv(ring.recv));
      CHECK_OK(net.close_send(ring.send));
    }
    say("  net v%d round %d: ring of %d connected (connect returned NULL %d times on rank 0), %d messages + %d grouped "
        "receives of %d, closed %s",
        net.version, round, g_size, ring.connect_null_calls, 3 * NCCL_NET_MAX_REQUESTS, 6, p0.max_recvs,
        round == 0 ? "send then receive" : "receive then send");
  }
  CHECK(logged(g_log_info, "UCX lanes"), "NCCL's logger never heard which UCX transport carries the data");
  CHECK(warn_count() == 0, "the plugin warned during a clean run");
  CHECK_OK(net.finalize());
}

// ---- bw: what the net moves (a measurement; it checks the bytes, never the times)
// Each rank streams `iters` messages of each size to the next rank of the ring and receives as
// many from the previous one, NCCL_NET_MAX_REQUESTS of each in flight as NCCL's proxy keeps them,
// test() polled in posting order. Prints, per size, the time per message and the bandwidth of the
// slowest rank (max over ranks of its elapsed time).
void bw_suite(Net& net) {
  CHECK_OK(net.init());
  Ring ring = connect_ring(net, 0);
  const int window = NCCL_NET_MAX_REQUESTS;
  const size_t sizes[] = {4096, 65536, 524288, size_t{4} << 20};
  Window win(net, ring, size_t{4} << 20);
  auto &sbuf = win.sbuf, &rbuf = win.rbuf;
  auto &smh = win.smh, &rmh = win.rmh;
  for (size_t w = 0; w < Window::kSlots; ++w) std::fill(sbuf[w].begin(), sbuf[w].end(), static_cast<uint8_t>(g_rank * 16 + w));
  const int prev = (g_rank + g_size - 1) % g_size;
  say("  bw: %d ranks in a ring, %d messages in flight each way; slowest rank", g_size, window);
  say("  %10s %8s %12s %10s", "bytes", "msgs", "us/msg", "GB/s");
  std::thread progress([&] {
    for (size_t size : sizes) {
      const int iters = static_cast<int>(std::max<size_t>(32, std::min<size_t>(2000, (size_t{256} << 20) / size)));
      std::vector<void*> sreq(static_cast<size_t>(window), nullptr), rreq(static_cast<size_t>(window), nullptr);
      int ps = 0, pr = 0, ds = 0, dr = 0;
      const auto end = Clock::now() + kDeadline;
      const auto t0 = Clock::now();
      while (ds < iters || dr < iters) {
        while (pr < iters && pr - dr < window) {
          const size_t w = static_cast<size_t>(pr % window);
          void* data = rbuf[w].data();
          size_t cap = size;
          int tag = 1;
          void* mh = rmh[w];
          CHECK_OK(net.irecv(ring.recv, 1, &data, &cap, &tag, &mh, &rreq[w]));
          CHECK(rreq[w] != nullptr, "bw: irecv returned NULL");
          ++pr;
        }
        while (ps < iters && ps - ds < window) {
          const size_t w = static_cast<size_t>(ps % window);
          CHECK_OK(net.isend(ring.send, sbuf[w].data(), size, 1, smh[w], &sreq[w]));
          if (!sreq[w]) break;
          ++ps;
        }
        if (dr < pr) {
          const size_t w = static_cast<size_t>(dr % window);
          int done = 0, got = -1;
          CHECK_OK(net.test(rreq[w], &done, &got));
          if (done) {
            CHECK(got == static_cast<int>(size), "bw: received %d bytes of %zu", got, size);
            const uint8_t want = static_cast<uint8_t>(prev * 16 + dr % window);
            CHECK(rbuf[w][0] == want && rbuf[w][size - 1] == want, "bw: message %d of %zu bytes has the wrong bytes", dr, size);
            ++dr;
          }
        }
        if (ds < ps) {
          const size_t w = static_cast<size_t>(ds % window);
          int done = 0;
          CHECK_OK(net.test(sreq[w], &done, nullptr));
          if (done) ++ds;
        }
        if (Clock::now() > end) die("bw: %zu-byte messages: %d/%d sends, %d/%d receives done", size, ds, iters, dr, iters);
      }
      double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      MPI_Allreduce(MPI_IN_PLACE, &secs, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      say("  %10zu %8d %12.1f %10.3f", size, iters, secs * 1e6 / iters, static_cast<double>(size) * iters / secs / 1e9);
    }
  });
  progress.join();
  win.release(net, ring);
  CHECK_OK(net.close_send(ring.send));
  CHECK_OK(net.close_recv(ring.recv));
  CHECK_OK(net.finalize());
}

// ---- CollNet suite

enum class Ty { f32, f16, bf16 };
struct TypeDesc {
  Ty ty;
  ncclDataType_t nccl;
  size_t size;
  const char* name;
};
const TypeDesc kTypes[] = {{Ty::f32, ncclFloat32, 4, "float32"}, {Ty::f16, ncclFloat16, 2, "float16"},
                           {Ty::bf16, ncclBfloat16, 2, "bfloat16"}};

double load(const std::vector<uint8_t>& b, Ty t, size_t i) {
  if (t == Ty::f32) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return t == Ty::f16 ? thc::engine::half_to_float(h) : thc::engine::bf16_to_float(h);
}
void store(std::vector<uint8_t>& b, Ty t, size_t i, double v) {
  if (t == Ty::f32) {
    const float f = static_cast<float>(v);
    std::memcpy(b.data() + 4 * i, &f, 4);
    return;
  }
  const uint16_t h = t == Ty::f16 ? thc::engine::float_to_half(static_cast<float>(v)) : thc::engine::float_to_bf16(static_cast<float>(v));
  std::memcpy(b.data() + 2 * i, &h, 2);
}

// Tiny allreduces (a single padded block) are checked together: one element's squared error is
// one draw of a heavy-tailed distribution, a sum of them is not.
constexpr size_t kTiny = 64;

// Rank r's input of case c: Gaussian, distinct per rank and case; tiny cases get positive values,
// so that their exact sum cannot cancel to nearly zero.
std::vector<uint8_t> make_input(const TypeDesc& t, size_t count, int rank, int c) {
  std::vector<uint8_t> b(count * t.size + 1);
  std::mt19937_64 g(static_cast<uint64_t>(rank) * 1000003u + static_cast<uint64_t>(c) * 7919u + 17);
  std::normal_distribution<double> n01;
  for (size_t i = 0; i < count; ++i) store(b, t.ty, i, count < kTiny ? 1.0 + std::fabs(n01(g)) : n01(g));
  return b;
}

uint64_t fnv(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Case {
  TypeDesc t;
  size_t count;
  bool in_place;
  int id;
  std::vector<uint8_t> send, recv;
  void *smh = nullptr, *rmh = nullptr, *req = nullptr;
  bool done = false;
};

double g_bound = 0.1;
double g_tiny_err = 0, g_tiny_ref = 0;  // pooled over every tiny case of the run

// Exact sum over all ranks (inputs regenerated locally, in double), NMSE, identical results.
void verify_case(const Case& c, int n) {
  std::vector<double> exact(c.count, 0.0);
  for (int r = 0; r < n; ++r) {
    const std::vector<uint8_t> in = make_input(c.t, c.count, r, c.id);
    for (size_t i = 0; i < c.count; ++i) exact[i] += load(in, c.t.ty, i);
  }
  double err = 0, ref = 0;
  const std::vector<uint8_t>& out = c.in_place ? c.send : c.recv;
  for (size_t i = 0; i < c.count; ++i) {
    const double d = load(out, c.t.ty, i) - exact[i];
    err += d * d;
    ref += exact[i] * exact[i];
  }
  const double nmse = ref > 0 ? err / ref : err;
  if (c.count < kTiny) {
    CHECK(std::isfinite(err), "%s count %zu: non-finite result", c.t.name, c.count);
    g_tiny_err += err;
    g_tiny_ref += ref;
  } else {
    CHECK(std::isfinite(nmse) && nmse <= g_bound, "%s count %zu%s: NMSE %.4g above the bound %g", c.t.name, c.count,
          c.in_place ? " in place" : "", nmse, g_bound);
  }
  uint64_t h = fnv(out.data(), c.count * c.t.size);
  std::vector<uint64_t> all(static_cast<size_t>(n));
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (int r = 0; r < n; ++r)
    CHECK(all[static_cast<size_t>(r)] == all[0], "%s count %zu: rank %d's result differs from rank 0's", c.t.name, c.count, r);
  if (c.count >= 1000) say("    %-8s count %8zu%s NMSE %.4f", c.t.name, c.count, c.in_place ? " (in place)" : "", nmse);
}

double nmse_const(const std::vector<float>& v, double want) {
  double err = 0;
  for (float x : v) err += (x - want) * (x - want);
  return err / (want * want * static_cast<double>(v.size()));
}

void* collnet_connect(CollNet& cn, int dev) {
  std::vector<char> mine(NCCL_NET_HANDLE_MAXSIZE, 0x5a);
  void* lcomm = nullptr;
  CHECK_OK(cn.listen(dev, mine.data(), &lcomm));
  CHECK(lcomm != nullptr, "CollNet listen returned no comm");
  std::vector<char> all(static_cast<size_t>(NCCL_NET_HANDLE_MAXSIZE) * static_cast<size_t>(g_size));
  MPI_Allgather(mine.data(), NCCL_NET_HANDLE_MAXSIZE, MPI_BYTE, all.data(), NCCL_NET_HANDLE_MAXSIZE, MPI_BYTE, MPI_COMM_WORLD);
  std::vector<void*> handles(static_cast<size_t>(g_size));
  for (int r = 0; r < g_size; ++r) handles[static_cast<size_t>(r)] = all.data() + static_cast<size_t>(r) * NCCL_NET_HANDLE_MAXSIZE;
  void* coll = nullptr;
  CHECK_OK(cn.connect(handles.data(), g_size, g_rank, lcomm, &coll));
  CHECK(coll != nullptr, "CollNet connect succeeded without a comm");
  CHECK_OK(cn.close_listen(lcomm));  // NCCL closes it right after connect
  return coll;
}

void wait_request(CollNet& cn, void* req, int* size, const char* what) {
  poll_until([&] { int d = 0; CHECK_OK(cn.test(req, &d, size)); return d != 0; }, what);
}

void collnet_devices_mirror_net(Net& net, CollNet& cn) {
  int nd = 0, cd = 0;
  CHECK_OK(net.devices(&nd));
  CHECK_OK(cn.devices(&cd));
  CHECK(cd == nd, "%d CollNet devices, %d net devices", cd, nd);
  for (int d = 0; d < cd; ++d) {
    Props a, b;
    CHECK_OK(net.props(d, &a));
    CHECK_OK(cn.props(d, &b));
    CHECK(a.name == b.name && a.pci == b.pci && a.has_pci == b.has_pci && a.guid == b.guid,
          "CollNet device %d (%s) is not net device %d (%s): NCCL pairs them by name/pciPath/guid", d, b.name.c_str(), d,
          a.name.c_str());
    CHECK(b.ptr_support & NCCL_PTR_HOST, "CollNet ptrSupport %d", b.ptr_support);
  }
}

void collnet_suite(Net& net, CollNet& cn, thc::test::AggregatorProcess* agg) {
  CHECK_OK(net.init());
  CHECK_OK(cn.init());
  CHECK_OK(cn.init());
  collnet_devices_mirror_net(net, cn);
  // reduceSupport: exactly float32/float16/bfloat16 with sum.
  for (int t = 0; t < ncclNumTypesMax; ++t)
    for (int op = 0; op < 4; ++op) {
      int sup = -1;
      CHECK_OK(cn.reduce_support(static_cast<ncclDataType_t>(t), static_cast<ncclRedOp_t>(op), &sup));
      const bool want = op == ncclSum && (t == ncclFloat32 || t == ncclFloat16 || t == ncclBfloat16);
      CHECK(sup == (want ? 1 : 0), "reduceSupport(type %d, op %d) = %d", t, op, sup);
    }
  CHECK(logged(g_log_info, "CollNet:"), "NCCL's logger never heard the CollNet configuration");

  void* coll = collnet_connect(cn, 0);
  if (g_peers) {
    CHECK(logged(g_log_info, "over UCX"), "no log line about connecting to the peers over UCX");
  } else {
    CHECK(logged(g_log_info, "joined job"), "no log line about joining the aggregator job");
  }

  const long block = [] {
    const char* b = std::getenv("THC_BLOCK");
    return b ? std::atol(b) : 16384L;
  }();
  const size_t counts[] = {1, 1001, static_cast<size_t>(block - 1), static_cast<size_t>(block + 1), (size_t{1} << 20) + 3};
  std::vector<Case> cases;
  int id = 0;
  for (const TypeDesc& t : kTypes)
    for (size_t count : counts) cases.push_back(Case{t, count, false, id++, {}, {}});
  cases.push_back(Case{kTypes[0], 40000, true, id++, {}, {}});  // in place

  for (int pass = 0; pass < 2; ++pass) {
    // every request in flight at once, tested in a scrambled order
    for (Case& c : cases) {
      c.send = make_input(c.t, c.count, g_rank, c.id);
      c.recv.assign(c.count * c.t.size + 1, 0xee);
      c.done = false;
      CHECK_OK(cn.reg_mr(coll, c.send.data(), c.send.size(), NCCL_PTR_HOST, &c.smh));
      CHECK_OK(cn.reg_mr(coll, c.recv.data(), c.recv.size(), NCCL_PTR_HOST, &c.rmh));
      void* out = c.in_place ? c.send.data() : c.recv.data();
      CHECK_OK(cn.iallreduce(coll, c.send.data(), out, c.count, c.t.nccl, ncclSum, c.smh, c.in_place ? c.smh : c.rmh, &c.req));
      CHECK(c.req != nullptr, "iallreduce returned a NULL request with %zu in flight", cases.size());
    }
    std::vector<size_t> order(cases.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(pass * 10 + g_rank)));
    poll_until(
        [&] {
          bool all = true;
          for (size_t k : order) {
            Case& c = cases[k];
            if (c.done) continue;
            int d = 0, size = -1;
            CHECK_OK(cn.test(c.req, &d, &size));
            if (d) {
              CHECK(size == static_cast<int>(c.count * c.t.size), "%s count %zu: test size %d", c.t.name, c.count, size);
              c.done = true;
            }
            all = all && c.done;
          }
          return all;
        },
        "CollNet iallreduce requests");
    say("  collnet v%d pass %d: %zu allreduces in flight together, %d ranks", cn.version, pass, cases.size(), g_size);
    for (Case& c : cases) {
      verify_case(c, g_size);
      CHECK_OK(cn.dereg_mr(coll, c.smh));
      CHECK_OK(cn.dereg_mr(coll, c.rmh));
    }
  }

  {
    const double tiny = g_tiny_err / g_tiny_ref;
    CHECK(tiny <= g_bound, "count-1 allreduces: pooled NMSE %.4g above the bound %g", tiny, g_bound);
    say("    count 1 (all types, both passes): pooled NMSE %.4f", tiny);
  }

  // count 0, and iflush (host memory: nothing to do)
  {
    float x = 1.f, y = 2.f;
    void* req = nullptr;
    CHECK_OK(cn.iallreduce(coll, &x, &y, 0, ncclFloat32, ncclSum, nullptr, nullptr, &req));
    CHECK(req != nullptr, "iallreduce of 0 elements gave no request");
    int size = -1;
    wait_request(cn, req, &size, "count 0");
    CHECK(size == 0 && y == 2.f, "count 0: size %d, output touched (%g)", size, static_cast<double>(y));
    void* freq = reinterpret_cast<void*>(0x1);
    CHECK_OK(cn.iflush(coll, &y, 4, nullptr, &freq));
    if (freq) wait_request(cn, freq, nullptr, "iflush");
  }

  // NCCL_NET_MAX_REQUESTS requests accepted at once
  {
    std::vector<std::vector<float>> in(NCCL_NET_MAX_REQUESTS, std::vector<float>(64)), out(NCCL_NET_MAX_REQUESTS, std::vector<float>(64));
    std::vector<void*> reqs(NCCL_NET_MAX_REQUESTS, nullptr);
    for (int i = 0; i < NCCL_NET_MAX_REQUESTS; ++i) {
      for (int j = 0; j < 64; ++j) in[static_cast<size_t>(i)][static_cast<size_t>(j)] = static_cast<float>(g_rank + 1) * 0.25f;
      CHECK_OK(cn.iallreduce(coll, in[static_cast<size_t>(i)].data(), out[static_cast<size_t>(i)].data(), 64, ncclFloat32, ncclSum,
                             nullptr, nullptr, &reqs[static_cast<size_t>(i)]));
      CHECK(reqs[static_cast<size_t>(i)] != nullptr, "request %d of %d refused", i + 1, NCCL_NET_MAX_REQUESTS);
    }
    const double want = 0.25 * g_size * (g_size + 1) / 2.0;
    for (int i = NCCL_NET_MAX_REQUESTS - 1; i >= 0; --i) {
      wait_request(cn, reqs[static_cast<size_t>(i)], nullptr, "32 requests");
      const double e = nmse_const(out[static_cast<size_t>(i)], want);
      CHECK(e <= g_bound, "request %d: NMSE %g against the constant sum %g", i, e, want);
    }
  }

  // a non-finite input on one rank: NaN everywhere, and the comm goes on working
  {
    std::vector<float> in(1001, 1.0f), out(1001, 0.0f);
    if (g_rank == g_size - 1) in[500] = std::nanf("");
    void* req = nullptr;
    CHECK_OK(cn.iallreduce(coll, in.data(), out.data(), in.size(), ncclFloat32, ncclSum, nullptr, nullptr, &req));
    int size = -1;
    wait_request(cn, req, &size, "non-finite input");
    for (float v : out) CHECK(std::isnan(v), "a non-finite input gave %g, not NaN", static_cast<double>(v));
    in[500] = 1.0f;
    CHECK_OK(cn.iallreduce(coll, in.data(), out.data(), in.size(), ncclFloat32, ncclSum, nullptr, nullptr, &req));
    wait_request(cn, req, &size, "after the non-finite input");
    const double e = nmse_const(out, g_size);
    CHECK(e <= g_bound, "after the non-finite input: NMSE %g against %d", e, g_size);
  }

  CHECK_OK(cn.close_coll(coll));
  CHECK_OK(cn.finalize());
  CHECK(warn_count() == 0, "the plugin warned during a clean run");
  MPI_Barrier(MPI_COMM_WORLD);
  if (agg) {
    const uint64_t elems = agg->stat("elements");
    CHECK(elems > 0, "thc-aggregator aggregated nothing: the allreduces did not go through it");
    say("  thc-aggregator: %llu elements aggregated", static_cast<unsigned long long>(elems));
  }
}

// ---- failure suites

void kill_suite(CollNet& cn, thc::test::AggregatorProcess* agg) {
  CHECK_OK(cn.init());
  void* coll = collnet_connect(cn, 0);
  std::vector<float> in(100000, 1.0f), out(100000, 0.0f);
  void* req = nullptr;
  CHECK_OK(cn.iallreduce(coll, in.data(), out.data(), in.size(), ncclFloat32, ncclSum, nullptr, nullptr, &req));
  wait_request(cn, req, nullptr, "allreduce before the kill");
  MPI_Barrier(MPI_COMM_WORLD);
  if (agg) {
    agg->stop(SIGKILL);
    say("  thc-aggregator killed");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const size_t warns = warn_count();
  CHECK_OK(cn.iallreduce(coll, in.data(), out.data(), in.size(), ncclFloat32, ncclSum, nullptr, nullptr, &req));
  CHECK(req != nullptr, "iallreduce refused");
  int done = 0;
  const ncclResult_t first = cn.test(req, &done, nullptr);
  // With the aggregator gone the allreduce cannot finish before the timeout: had iallreduce or
  // test run it on the caller's thread, it would be over already.
  CHECK(first == ncclSuccess && done == 0, "the first test() after iallreduce returned %d, done %d: the call blocked", static_cast<int>(first), done);
  ncclResult_t res = ncclSuccess;
  const auto t0 = Clock::now();
  const auto end = t0 + kDeadline;
  while (!done) {
    res = cn.test(req, &done, nullptr);
    if (res != ncclSuccess) break;
    CHECK(Clock::now() < end, "no error within %lld s of killing the aggregator", static_cast<long long>(kDeadline.count()));
  }
  CHECK(res != ncclSuccess, "the allreduce succeeded without an aggregator");
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  CHECK(warn_count() > warns, "the failure was not reported through NCCL's logger");
  // later requests fail at once (no second timeout)
  CHECK_OK(cn.iallreduce(coll, in.data(), out.data(), in.size(), ncclFloat32, ncclSum, nullptr, nullptr, &req));
  done = 0;
  res = ncclSuccess;
  poll_until([&] { res = cn.test(req, &done, nullptr); return res != ncclSuccess || done; }, "request after the failure");
  CHECK(res != ncclSuccess, "a request after the failure succeeded");
  CHECK_OK(cn.close_coll(coll));
  CHECK_OK(cn.finalize());
  say("  collnet v%d: aggregator killed -> error %d from test() after %.1f s (THC_TIMEOUT_MS=%s); later requests fail too",
      cn.version, static_cast<int>(res), secs, std::getenv("THC_TIMEOUT_MS") ? std::getenv("THC_TIMEOUT_MS") : "default");
}

void unreachable_suite(CollNet& cn) {
  CHECK_OK(cn.init());
  int nd = 0;
  CHECK_OK(cn.devices(&nd));
  CHECK(nd >= 1, "no CollNet device although THC_COLLNET_AGGREGATOR is set");
  std::vector<char> mine(NCCL_NET_HANDLE_MAXSIZE, 0);
  void* lcomm = nullptr;
  CHECK_OK(cn.listen(0, mine.data(), &lcomm));
  std::vector<char> all(static_cast<size_t>(NCCL_NET_HANDLE_MAXSIZE) * static_cast<size_t>(g_size));
  MPI_Allgather(mine.data(), NCCL_NET_HANDLE_MAXSIZE, MPI_BYTE, all.data(), NCCL_NET_HANDLE_MAXSIZE, MPI_BYTE, MPI_COMM_WORLD);
  std::vector<void*> handles(static_cast<size_t>(g_size));
  for (int r = 0; r < g_size; ++r) handles[static_cast<size_t>(r)] = all.data() + static_cast<size_t>(r) * NCCL_NET_HANDLE_MAXSIZE;
  void* coll = nullptr;
  const ncclResult_t r = cn.connect(handles.data(), g_size, g_rank, lcomm, &coll);
  CHECK(r != ncclSuccess && coll == nullptr, "CollNet connect to no aggregator returned %d", static_cast<int>(r));
  CHECK_OK(cn.close_listen(lcomm));
  CHECK_OK(cn.finalize());
  say("  collnet v%d: connect without an aggregator -> error %d (NCCL falls back to its own algorithms)", cn.version,
      static_cast<int>(r));
}

void off_suite(Net& net, CollNet& cn) {
  CHECK_OK(net.init());
  CHECK_OK(cn.init());
  int nd = -1, cd = -1;
  CHECK_OK(net.devices(&nd));
  CHECK_OK(cn.devices(&cd));
  CHECK(nd >= 1 && cd == 0, "without THC_COLLNET_AGGREGATOR: %d net devices, %d CollNet devices", nd, cd);
  // NCCL 2.28 (ncclNetFinalize) calls comm->ncclCollNet->finalize(comm->collNetContext) whenever
  // that ctx is non-NULL, but leaves comm->ncclCollNet NULL when devices() said 0: a disabled
  // CollNet must hand back a NULL ctx, or every ncclCommDestroy of a net-only job faults (seen
  // with NCCL 2.28.3 on an H200: SIGSEGV at address 0x90, the finalize field).
  if (cn.ctxs) CHECK(!cn.ctxs->empty() && cn.ctxs->back() == nullptr, "v11 CollNet init without an aggregator returned a non-NULL ctx");
  CHECK_OK(cn.finalize());
  say("  collnet v%d without THC_COLLNET_AGGREGATOR: 0 devices; net: %d", cn.version, nd);
}

// A UDP port where nothing listens (bound once by the kernel's choice, then released).
uint16_t unused_udp_port() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  CHECK(fd >= 0, "socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0, "bind");
  socklen_t len = sizeof a;
  CHECK(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0, "getsockname");
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  std::string so, suites = "net,collnet", agg_args;
  int version = 11;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("%s needs a value", a.c_str());
      return argv[++i];
    };
    if (a == "--version") version = std::atoi(next().c_str());
    else if (a == "--suite") suites = next();
    else if (a == "--aggregator-args") agg_args = next();
    else if (a == "--peers") g_peers = true;
    else if (a == "--nmse-bound") g_bound = std::atof(next().c_str());
    else if (so.empty() && a[0] != '-') so = a;
    else die("unknown argument %s", a.c_str());
  }
  CHECK(!so.empty(), "usage: nccl_plugin_conformance PLUGIN.so [--version N] [--suite LIST] [--aggregator-args ARGS]");
  auto has = [&](const char* s) { return ("," + suites + ",").find(std::string(",") + s + ",") != std::string::npos; };

  // The aggregator (rank 0 starts it) and the address every rank's plugin reads at init; the
  // tenant key its key file holds (thc::test::test_key, the same on every rank).
  setenv("THC_AGGREGATOR_KEY", thc::switch_offload::auth::format_key(thc::test::test_key(1)).c_str(), 1);
  std::unique_ptr<thc::test::AggregatorProcess> agg;
  char url[256] = {0};
  if (g_peers) {
    CHECK(!has("kill") && !has("unreachable") && !has("off"), "--peers takes the net and collnet suites");
    std::snprintf(url, sizeof url, "peers");
    setenv("THC_COLLNET_AGGREGATOR", url, 1);
  } else if (has("collnet") || has("kill")) {
    if (g_rank == 0) {
      std::vector<std::string> extra;
      std::istringstream in(agg_args);
      for (std::string w; in >> w;) extra.push_back(w);
      agg = std::make_unique<thc::test::AggregatorProcess>(extra);
      std::snprintf(url, sizeof url, "%s", agg->url().c_str());
    }
    MPI_Bcast(url, sizeof url, MPI_CHAR, 0, MPI_COMM_WORLD);
    setenv("THC_COLLNET_AGGREGATOR", url, 1);
  } else if (has("unreachable")) {
    if (g_rank == 0) std::snprintf(url, sizeof url, "udp://127.0.0.1:%u", static_cast<unsigned>(unused_udp_port()));
    MPI_Bcast(url, sizeof url, MPI_CHAR, 0, MPI_COMM_WORLD);
    setenv("THC_COLLNET_AGGREGATOR", url, 1);
  } else if (has("off")) {
    unsetenv("THC_COLLNET_AGGREGATOR");
  }

  // As NCCL loads it.
  void* lib = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  CHECK(lib != nullptr, "dlopen(%s): %s", so.c_str(), dlerror());
  for (int v = 8; v <= 11; ++v) {
    CHECK(dlsym(lib, ("ncclNetPlugin_v" + std::to_string(v)).c_str()) != nullptr, "ncclNetPlugin_v%d missing", v);
    CHECK(dlsym(lib, ("ncclCollNetPlugin_v" + std::to_string(v)).c_str()) != nullptr, "ncclCollNetPlugin_v%d missing", v);
  }
  // (dlsym on the handle searches the plugin and its dependencies; libthc is not one of them)
  CHECK(dlsym(lib, "thc_allreduce_scheme") == nullptr && dlsym(lib, "thc_comm_create_aggregator") == nullptr,
        "the plugin exports thc's own symbols");
  Net net = load_net(lib, version);
  CollNet cn = load_collnet(lib, version);
  say("# nccl_plugin_conformance: %s, net \"%s\" / collnet \"%s\" v%d, %d ranks, suites %s%s%s", so.c_str(),
      net.name.c_str(), cn.name.c_str(), version, g_size, suites.c_str(), url[0] ? (g_peers ? ", " : ", aggregator ") : "",
      url);

  if (has("net")) net_suite(net);
  if (has("collnet")) collnet_suite(net, cn, agg.get());
  if (has("kill")) kill_suite(cn, agg.get());
  if (has("unreachable")) unreachable_suite(cn);
  if (has("off")) off_suite(net, cn);
  if (has("bw")) bw_suite(net);

  MPI_Barrier(MPI_COMM_WORLD);
  say("# PASSED");
  agg.reset();
  // NCCL never dlclose()s a plugin it uses; neither does the harness.
  MPI_Finalize();
  return 0;
}
