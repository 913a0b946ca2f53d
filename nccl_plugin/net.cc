#include "nccl_plugin/net.h"

#include <arpa/inet.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "nccl_plugin/guard.h"
#include "nccl_plugin/log.h"
#include "thc/thc.h"
#include "transport/ucx/ucx_p2p.h"

namespace thc::nccl_plugin::net {
namespace {

using namespace nccl_abi;
namespace ucx = thc::transport::ucx;

// What listen() writes into NCCL's 128-byte handle.
struct Handle {
  ucx::Address addr;
  int32_t dev;  // the listener's device (for the log)
};
static_assert(sizeof(Handle) <= 64, "handle payload");
// The connecting process keeps its Connector here while connect() is in progress; the listener
// writes zeros, so the first call finds none.
constexpr size_t kStageOffset = NCCL_NET_HANDLE_MAXSIZE - sizeof(void*);

constexpr uint32_t kListenMagic = 0x6c697374;  // "list"
constexpr uint32_t kSendMagic = 0x73656e64;    // "send"
constexpr uint32_t kRecvMagic = 0x72656376;    // "recv"
constexpr uint32_t kMrMagic = 0x6d726567;      // "mreg"

struct ListenComm {
  uint32_t magic = kListenMagic;
  int dev = 0;
  std::unique_ptr<ucx::Listener> listener;
};
struct Comm {  // a send or a receive comm
  uint32_t magic = 0;
  int dev = 0;
  std::unique_ptr<ucx::Endpoint> ep;
};
struct Mr {
  uint32_t magic = kMrMagic;
  void* comm = nullptr;
  int type = 0;
};

struct State {
  std::mutex mu;
  bool inited = false;
  std::vector<ucx::Device> devices;
  std::vector<std::shared_ptr<ucx::Context>> contexts;  // created on first use of a device
  std::vector<bool> lanes_logged;
  std::string note;
  ucx::Limits limits;
  int max_comms = 0;
};
State& state() {
  static State* s = new State;  // never destroyed: NCCL may call in while the process exits
  return *s;
}

std::shared_ptr<ucx::Context> context(int dev) {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  if (!s.inited) fail(Status::kInvalidArgument, "the plugin was not initialised (init not called)");
  if (dev < 0 || dev >= static_cast<int>(s.devices.size()))
    fail(Status::kInvalidArgument, "no device " + std::to_string(dev) + " (" + std::to_string(s.devices.size()) + " devices)");
  auto& c = s.contexts[static_cast<size_t>(dev)];
  if (!c) {
    c = std::make_shared<ucx::Context>(s.devices[static_cast<size_t>(dev)]);
    THC_PLUGIN_INFO(NCCL_INIT | NCCL_NET, "device %d (%s): UCX context with UCX_NET_DEVICES=%s", dev,
                    s.devices[static_cast<size_t>(dev)].name.c_str(), c->net_devices().c_str());
  }
  return c;
}

ucx::Limits limits() {
  State& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.limits;
}

// The lanes UCX chose, once per device and direction (NCCL_DEBUG=INFO); every connection at TRACE.
void log_lanes(int dev, const ucx::Endpoint& ep, const char* dir) {
  std::string lanes;
  std::istringstream in(ep.describe());
  for (std::string line; std::getline(in, line);) {
    const size_t p = line.find("lane[");
    if (p == std::string::npos) continue;
    std::string l = line.substr(p);
    l.erase(std::unique(l.begin(), l.end(), [](char a, char b) { return a == ' ' && b == ' '; }), l.end());
    lanes += (lanes.empty() ? "" : "; ") + l;
  }
  bool first = false;
  {
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    const size_t i = static_cast<size_t>(dev) * 2 + (dir[0] == 's' ? 0 : 1);
    if (i < s.lanes_logged.size() && !s.lanes_logged[i]) first = s.lanes_logged[i] = true;
  }
  if (first)
    THC_PLUGIN_INFO(NCCL_INIT | NCCL_NET, "device %d %s connection: UCX lanes %s", dev, dir, lanes.c_str());
  else
    THC_PLUGIN_TRACE(NCCL_NET, "device %d %s connection: UCX lanes %s", dev, dir, lanes.c_str());
}

Comm* as_comm(void* p, uint32_t magic, const char* what) {
  auto* c = static_cast<Comm*>(p);
  if (!c || c->magic != magic) fail(Status::kInvalidArgument, std::string("not a ") + what + " comm");
  return c;
}

Comm* as_any_comm(void* p) {
  auto* c = static_cast<Comm*>(p);
  if (!c || (c->magic != kSendMagic && c->magic != kRecvMagic)) fail(Status::kInvalidArgument, "not a send or receive comm");
  return c;
}

}  // namespace

ncclResult_t init(ncclDebugLogger_t logger) {
  set_logger(logger);
  return guard("init", [&] {
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.inited) return;
    thc_config_t cfg;
    if (thc_config_init(&cfg) != THC_SUCCESS) fail(Status::kInvalidArgument, std::string("THC_* environment: ") + thc_last_error());
    if (cfg.timeout_ms > 0) s.limits.timeout_ms = cfg.timeout_ms;
    s.limits.max_requests = kMaxRequests;
    s.limits.max_recvs = kMaxRecvs;
    ucx::Discovery d = ucx::discover_devices();
    s.devices = d.devices;
    s.note = d.note;
    s.contexts.assign(s.devices.size(), nullptr);
    s.lanes_logged.assign(s.devices.size() * 2, false);
    // Each comm owns a UCX worker: 8 descriptors with UCX 1.13's TCP transport (interfaces,
    // sockets, event fds); half the process's limit goes to comms.
    rlimit rl{};
    const long nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? static_cast<long>(rl.rlim_cur) : 65536;
    s.max_comms = static_cast<int>(std::clamp(nofile / 16, 16L, 65536L));
    unsigned major = 0, minor = 0, release = 0;
    ucp_get_version(&major, &minor, &release);
    THC_PLUGIN_INFO(NCCL_INIT | NCCL_NET, "thc %s, UCX %u.%u.%u: %zu device(s) (%s), maxComms %d", thc_version(), major,
                    minor, release, s.devices.size(), s.note.c_str(), s.max_comms);
    for (size_t i = 0; i < s.devices.size(); ++i) {
      const ucx::Device& dv = s.devices[i];
      char ip[INET_ADDRSTRLEN] = {0};
      inet_ntop(AF_INET, &dv.ipv4, ip, sizeof ip);
      THC_PLUGIN_INFO(NCCL_INIT | NCCL_NET, "device %zu: %s %s, %d Mb/s%s, %s", i, dv.name.c_str(), ip, dv.speed_mbps,
                      dv.speed_known ? "" : " (speed unknown, assumed)",
                      dv.pci_path.empty() ? "virtual" : dv.pci_path.c_str());
    }
    s.inited = true;
  });
}

ncclResult_t devices(int* ndev) {
  return guard("devices", [&] {
    if (!ndev) fail(Status::kInvalidArgument, "ndev is NULL");
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    if (!s.inited) fail(Status::kInvalidArgument, "init not called");
    *ndev = static_cast<int>(s.devices.size());
  });
}

ncclResult_t properties(int dev, Props* p) {
  return guard("getProperties", [&] {
    if (!p) fail(Status::kInvalidArgument, "props is NULL");
    State& s = state();
    std::lock_guard<std::mutex> lk(s.mu);
    if (!s.inited) fail(Status::kInvalidArgument, "init not called");
    if (dev < 0 || dev >= static_cast<int>(s.devices.size()))
      fail(Status::kInvalidArgument, "no device " + std::to_string(dev));
    const ucx::Device& d = s.devices[static_cast<size_t>(dev)];
    *p = Props{};
    p->name = d.name.c_str();
    p->pci_path = d.pci_path.empty() ? nullptr : d.pci_path.c_str();
    p->guid = static_cast<uint64_t>(dev);
    p->ptr_support = NCCL_PTR_HOST;
    p->speed = d.speed_mbps;
    p->latency = 0;  // unknown: NCCL's own base latency applies
    p->max_comms = s.max_comms;
    p->max_recvs = kMaxRecvs;
    p->dev = dev;
    p->max_p2p_bytes = kMaxP2pBytes;
    p->max_coll_bytes = kMaxCollBytes;
    p->max_multi_request_size = 1;
  });
}

ncclResult_t listen(int dev, void* handle, void** listen_comm) {
  return guard("listen", [&] {
    if (!handle || !listen_comm) fail(Status::kInvalidArgument, "handle or listenComm is NULL");
    *listen_comm = nullptr;
    auto l = std::make_unique<ListenComm>();
    l->dev = dev;
    l->listener = std::make_unique<ucx::Listener>(context(dev), limits());
    Handle h{};
    h.addr = l->listener->address();
    h.dev = dev;
    std::memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
    std::memcpy(handle, &h, sizeof h);
    *listen_comm = l.release();
  });
}

ncclResult_t connect(int dev, void* handle, void** send_comm) {
  return guard("connect", [&] {
    if (!handle || !send_comm) fail(Status::kInvalidArgument, "handle or sendComm is NULL");
    *send_comm = nullptr;
    char* stage = static_cast<char*>(handle) + kStageOffset;
    ucx::Connector* c = nullptr;
    std::memcpy(&c, stage, sizeof c);
    if (!c) {
      Handle h;
      std::memcpy(&h, handle, sizeof h);
      c = new ucx::Connector(context(dev), h.addr, limits());
      std::memcpy(stage, &c, sizeof c);
    }
    std::unique_ptr<ucx::Endpoint> ep;
    try {
      ep = c->poll();
    } catch (...) {
      delete c;
      std::memset(stage, 0, sizeof c);
      throw;
    }
    if (!ep) return;
    delete c;
    std::memset(stage, 0, sizeof c);
    log_lanes(dev, *ep, "send");
    auto comm = std::make_unique<Comm>();
    comm->magic = kSendMagic;
    comm->dev = dev;
    comm->ep = std::move(ep);
    *send_comm = comm.release();
  });
}

ncclResult_t accept(void* listen_comm, void** recv_comm) {
  return guard("accept", [&] {
    auto* l = static_cast<ListenComm*>(listen_comm);
    if (!l || l->magic != kListenMagic || !recv_comm) fail(Status::kInvalidArgument, "not a listen comm");
    *recv_comm = nullptr;
    std::unique_ptr<ucx::Endpoint> ep = l->listener->poll_accept();
    if (!ep) return;
    log_lanes(l->dev, *ep, "receive");
    auto comm = std::make_unique<Comm>();
    comm->magic = kRecvMagic;
    comm->dev = l->dev;
    comm->ep = std::move(ep);
    *recv_comm = comm.release();
  });
}

ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return guard("regMr", [&] {
    as_any_comm(comm);
    if (!mhandle) fail(Status::kInvalidArgument, "mhandle is NULL");
    if (type != NCCL_PTR_HOST)
      fail(Status::kUnsupported, "memory type " + std::to_string(type) + ": this plugin takes host memory only (ptrSupport)");
    (void)data;
    (void)size;
    // UCX registers (and caches) what a transfer needs by itself; the handle only ties the
    // region to its comm.
    auto* m = new Mr;
    m->comm = comm;
    m->type = type;
    *mhandle = m;
  });
}

ncclResult_t reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  if (type == NCCL_PTR_HOST) return reg_mr(comm, data, size, type, mhandle);
  (void)offset;
  (void)fd;
  return guard("regMrDmaBuf", [&] { fail(Status::kUnsupported, "DMA-BUF registration: this plugin takes host memory only"); });
}

ncclResult_t dereg_mr(void* comm, void* mhandle) {
  return guard("deregMr", [&] {
    auto* m = static_cast<Mr*>(mhandle);
    if (!m || m->magic != kMrMagic || m->comm != comm) fail(Status::kInvalidArgument, "not a memory handle of this comm");
    m->magic = 0;
    delete m;
  });
}

ncclResult_t isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request) {
  return guard("isend", [&] {
    Comm* c = as_comm(send_comm, kSendMagic, "send");
    if (!request) fail(Status::kInvalidArgument, "request is NULL");
    if (size > kMaxP2pBytes) fail(Status::kInvalidArgument, "isend of " + std::to_string(size) + " bytes (maxP2pBytes 1 GiB)");
    (void)mhandle;
    *request = c->ep->send(data, size, static_cast<uint32_t>(tag));
  });
}

ncclResult_t irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
                   void** request) {
  return guard("irecv", [&] {
    Comm* c = as_comm(recv_comm, kRecvMagic, "receive");
    if (!request || !data || !sizes || !tags) fail(Status::kInvalidArgument, "NULL argument");
    if (n < 1 || n > kMaxRecvs) fail(Status::kInvalidArgument, "irecv of " + std::to_string(n) + " buffers (maxRecvs 8)");
    (void)mhandles;
    // *request may hold NCCL_NET_OPTIONAL_RECV_COMPLETION: the completion is reported anyway.
    *request = nullptr;
    uint32_t t[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
      if (sizes[i] > kMaxP2pBytes) fail(Status::kInvalidArgument, "irecv buffer of " + std::to_string(sizes[i]) + " bytes");
      t[i] = static_cast<uint32_t>(tags[i]);
    }
    *request = c->ep->recv(n, data, sizes, t);
  });
}

ncclResult_t iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request) {
  return guard("iflush", [&] {
    as_comm(recv_comm, kRecvMagic, "receive");
    if (!request) fail(Status::kInvalidArgument, "request is NULL");
    (void)n, (void)data, (void)sizes, (void)mhandles;
    *request = nullptr;  // host memory: the data is where the CPU sees it once test() said done
  });
}

ncclResult_t test(void* request, int* done, int* sizes) {
  return guard("test", [&] {
    auto* r = static_cast<ucx::Request*>(request);
    ucx::Endpoint* ep = ucx::endpoint_of(r);
    if (!ep || !done) fail(Status::kInvalidArgument, "not a request in flight");
    const int n = ucx::buffers_of(r);
    size_t got[kMaxRecvs];
    *done = ep->test(r, got) ? 1 : 0;
    if (*done && sizes)
      for (int i = 0; i < n; ++i) sizes[i] = static_cast<int>(got[i]);
  });
}

// Closing never waits for the peer: the flush that delivers what a send comm sent last needs the
// peer's progress, so the endpoint finishes closing on the transport's closer thread.
ncclResult_t close_send(void* send_comm) {
  return guard("closeSend", [&] {
    Comm* c = as_comm(send_comm, kSendMagic, "send");
    c->magic = 0;
    ucx::close_in_background(std::move(c->ep));
    delete c;
  });
}

ncclResult_t close_recv(void* recv_comm) {
  return guard("closeRecv", [&] {
    Comm* c = as_comm(recv_comm, kRecvMagic, "receive");
    c->magic = 0;
    ucx::close_in_background(std::move(c->ep));
    delete c;
  });
}

ncclResult_t close_listen(void* listen_comm) {
  return guard("closeListen", [&] {
    auto* l = static_cast<ListenComm*>(listen_comm);
    if (!l || l->magic != kListenMagic) fail(Status::kInvalidArgument, "not a listen comm");
    l->magic = 0;
    delete l;
  });
}

ncclResult_t get_device_mr(void* comm, void* mhandle, void** dptr_mhandle) {
  (void)comm;
  (void)mhandle;
  if (dptr_mhandle) *dptr_mhandle = nullptr;  // host device type: nothing lives on the GPU
  return ncclSuccess;
}

ncclResult_t irecv_consumed(void* recv_comm, int n, void* request) {
  (void)recv_comm, (void)n, (void)request;
  return ncclSuccess;  // receive buffers are NCCL's: nothing to give back
}

}  // namespace thc::nccl_plugin::net
