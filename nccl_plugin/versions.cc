// The tables NCCL dlsym()s: ncclNetPlugin_v8..v11 and ncclCollNetPlugin_v8..v11, thin adapters over
// one implementation (net.cc, collnet.cc). NCCL takes the newest version it knows (2.28: v11,
// 2.26-2.27: v10, 2.24-2.25: v9, 2.20-2.23: v8). exports.map keeps every other symbol local.
//
// The tables are plain (non-const) variables with constant initialisers: valid before any code of
// the library runs, and writable in case an NCCL version patches a table it was handed.
#include <cstring>

#include "nccl_plugin/abi.h"
#include "nccl_plugin/collnet.h"
#include "nccl_plugin/net.h"

namespace {

using namespace thc::nccl_abi;
namespace net = thc::nccl_plugin::net;
namespace collnet = thc::nccl_plugin::collnet;

// ---- properties in each version's layout

template <typename P>
void fill_common(const net::Props& s, P* p) {
  p->name = const_cast<char*>(s.name);
  p->pciPath = const_cast<char*>(s.pci_path);
  p->guid = s.guid;
  p->ptrSupport = s.ptr_support;
  p->regIsGlobal = s.reg_is_global;
  p->speed = s.speed;
  p->port = s.port;
  p->latency = s.latency;
  p->maxComms = s.max_comms;
  p->maxRecvs = s.max_recvs;
  p->netDeviceType = NCCL_NET_DEVICE_HOST;
  p->netDeviceVersion = 0;
}

template <typename P>
void fill_v9(const net::Props& s, P* p) {
  fill_common(s, p);
  p->forceFlush = s.force_flush;
  p->vProps.ndevs = 1;
  p->vProps.devs[0] = s.dev;
  p->maxP2pBytes = s.max_p2p_bytes;
  p->maxCollBytes = s.max_coll_bytes;
}

template <ncclResult_t (*Get)(int, net::Props*), typename P, void (*Fill)(const net::Props&, P*)>
ncclResult_t get_props(int dev, P* out) {
  if (!out) return ncclInvalidArgument;
  net::Props s;
  const ncclResult_t r = Get(dev, &s);
  if (r != ncclSuccess) return r;
  std::memset(out, 0, sizeof *out);
  Fill(s, out);
  return ncclSuccess;
}

void fill_v8(const net::Props& s, ncclNetProperties_v8_t* p) { fill_common(s, p); }
void fill_v11(const net::Props& s, ncclNetProperties_v11_t* p) {
  fill_v9(s, p);
  p->maxMultiRequestSize = s.max_multi_request_size;
}

// ---- net adapters

ncclResult_t no_dev_comm(ncclResult_t r, ncclNetDeviceHandle_t** dev_comm) {
  if (dev_comm) *dev_comm = nullptr;  // host device type: no device-side handle
  return r;
}

ncclResult_t net_init_v8(ncclDebugLogger_t logger) { return net::init(logger); }
ncclResult_t net_init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t) { return net::init(logger); }

// v11: one init per NCCL communicator; the ctx only has to be distinct and freed by finalize.
struct NetCtx {
  uint64_t comm_id;
  int traffic_class;
};
ncclResult_t net_init_v11(void** ctx, uint64_t comm_id, ncclNetCommConfig_t* config, ncclDebugLogger_t logger,
                          ncclProfilerCallback_t) {
  if (!ctx) return ncclInvalidArgument;
  const ncclResult_t r = net::init(logger);
  if (r != ncclSuccess) return r;
  *ctx = new NetCtx{comm_id, config ? config->trafficClass : -1};
  return ncclSuccess;
}
ncclResult_t net_finalize_v11(void* ctx) {
  delete static_cast<NetCtx*>(ctx);
  return ncclSuccess;
}
ncclResult_t net_set_attr_v11(void*, ncclNetAttr_t*) { return ncclSuccess; }  // no tunables

ncclResult_t net_listen_v11(void*, int dev, void* handle, void** listen_comm) { return net::listen(dev, handle, listen_comm); }

ncclResult_t net_connect_v8(int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm) {
  return no_dev_comm(net::connect(dev, handle, send_comm), dev_comm);
}
ncclResult_t net_connect_v10(int dev, ncclNetCommConfig_t*, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm) {
  return no_dev_comm(net::connect(dev, handle, send_comm), dev_comm);
}
ncclResult_t net_connect_v11(void*, int dev, void* handle, void** send_comm, ncclNetDeviceHandle_t** dev_comm) {
  return no_dev_comm(net::connect(dev, handle, send_comm), dev_comm);
}
ncclResult_t net_accept(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_t** dev_comm) {
  return no_dev_comm(net::accept(listen_comm, recv_comm), dev_comm);
}

ncclResult_t net_isend_v8(void* comm, void* data, int size, int tag, void* mh, void** request) {
  if (size < 0) return ncclInvalidArgument;
  return net::isend(comm, data, static_cast<size_t>(size), tag, mh, request);
}
ncclResult_t net_isend_v9(void* comm, void* data, size_t size, int tag, void* mh, void** request) {
  return net::isend(comm, data, size, tag, mh, request);
}
ncclResult_t net_isend_v10(void* comm, void* data, size_t size, int tag, void* mh, void*, void** request) {
  return net::isend(comm, data, size, tag, mh, request);
}

ncclResult_t net_irecv_v8(void* comm, int n, void** data, int* sizes, int* tags, void** mhs, void** request) {
  if (n < 1 || n > net::kMaxRecvs || !sizes) return net::irecv(comm, n, data, nullptr, tags, mhs, request);
  size_t s[net::kMaxRecvs];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) return ncclInvalidArgument;
    s[i] = static_cast<size_t>(sizes[i]);
  }
  return net::irecv(comm, n, data, s, tags, mhs, request);
}
ncclResult_t net_irecv_v9(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs, void** request) {
  return net::irecv(comm, n, data, sizes, tags, mhs, request);
}
ncclResult_t net_irecv_v10(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs, void**, void** request) {
  return net::irecv(comm, n, data, sizes, tags, mhs, request);
}

ncclResult_t net_iflush(void* comm, int n, void** data, int* sizes, void** mhs, void** request) {
  return net::iflush(comm, n, data, sizes, mhs, request);
}

// ---- CollNet adapters

ncclResult_t cn_init_v8(ncclDebugLogger_t logger) { return collnet::init(logger); }
struct CollCtx {
  uint64_t comm_id;
};
ncclResult_t cn_init_v11(void** ctx, uint64_t comm_id, ncclDebugLogger_t logger) {
  if (!ctx) return ncclInvalidArgument;
  *ctx = nullptr;
  const ncclResult_t r = collnet::init(logger);
  if (r != ncclSuccess) return r;
  // No CollNet device (no THC_COLLNET_AGGREGATOR): no ctx. NCCL 2.28's ncclNetFinalize calls
  // comm->ncclCollNet->finalize(ctx) whenever the ctx is non-NULL, while comm->ncclCollNet stays
  // NULL for a CollNet whose devices() said 0: a ctx here made every ncclCommDestroy of a net-only
  // job fault (NCCL 2.28.3, H200: SIGSEGV at address 0x90, the finalize field).
  int ndev = 0;
  if (collnet::devices(&ndev) != ncclSuccess || ndev <= 0) return ncclSuccess;
  *ctx = new CollCtx{comm_id};
  return ncclSuccess;
}
ncclResult_t cn_finalize_v11(void* ctx) {
  delete static_cast<CollCtx*>(ctx);
  return ncclSuccess;
}
ncclResult_t cn_listen_v11(void*, int dev, void* handle, void** listen_comm) {
  return collnet::listen(dev, handle, listen_comm);
}
ncclResult_t cn_iallreduce_v8(void* comm, void* send, void* recv, int count, ncclDataType_t type, ncclRedOp_t op,
                              void* smh, void* rmh, void** request) {
  if (count < 0) return ncclInvalidArgument;
  return collnet::iallreduce(comm, send, recv, static_cast<size_t>(count), type, op, smh, rmh, request);
}

}  // namespace

#define THC_PLUGIN_EXPORT __attribute__((visibility("default")))

extern "C" {

THC_PLUGIN_EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
    "THC",
    net_init_v8,
    net::devices,
    get_props<net::properties, ncclNetProperties_v8_t, fill_v8>,
    net::listen,
    net_connect_v8,
    net_accept,
    net::reg_mr,
    net::reg_mr_dmabuf,
    net::dereg_mr,
    net_isend_v8,
    net_irecv_v8,
    net_iflush,
    net::test,
    net::close_send,
    net::close_recv,
    net::close_listen,
    net::get_device_mr,
    net::irecv_consumed,
};

THC_PLUGIN_EXPORT ncclNet_v9_t ncclNetPlugin_v9 = {
    "THC",
    net_init_v8,
    net::devices,
    get_props<net::properties, ncclNetProperties_v9_t, fill_v9<ncclNetProperties_v9_t>>,
    net::listen,
    net_connect_v8,
    net_accept,
    net::reg_mr,
    net::reg_mr_dmabuf,
    net::dereg_mr,
    net_isend_v9,
    net_irecv_v9,
    net_iflush,
    net::test,
    net::close_send,
    net::close_recv,
    net::close_listen,
    net::get_device_mr,
    net::irecv_consumed,
    nullptr,  // makeVDevice: no virtual devices (each device is one interface)
};

THC_PLUGIN_EXPORT ncclNet_v10_t ncclNetPlugin_v10 = {
    "THC",
    net_init_v10,
    net::devices,
    get_props<net::properties, ncclNetProperties_v10_t, fill_v9<ncclNetProperties_v10_t>>,
    net::listen,
    net_connect_v10,
    net_accept,
    net::reg_mr,
    net::reg_mr_dmabuf,
    net::dereg_mr,
    net_isend_v10,
    net_irecv_v10,
    net_iflush,
    net::test,
    net::close_send,
    net::close_recv,
    net::close_listen,
    net::get_device_mr,
    net::irecv_consumed,
    nullptr,
};

THC_PLUGIN_EXPORT ncclNet_v11_t ncclNetPlugin_v11 = {
    "THC",
    net_init_v11,
    net::devices,
    get_props<net::properties, ncclNetProperties_v11_t, fill_v11>,
    net_listen_v11,
    net_connect_v11,
    net_accept,
    net::reg_mr,
    net::reg_mr_dmabuf,
    net::dereg_mr,
    net_isend_v10,
    net_irecv_v10,
    net_iflush,
    net::test,
    net::close_send,
    net::close_recv,
    net::close_listen,
    net::get_device_mr,
    net::irecv_consumed,
    nullptr,
    net_finalize_v11,
    net_set_attr_v11,
};

THC_PLUGIN_EXPORT ncclCollNet_v8_t ncclCollNetPlugin_v8 = {
    "THC",
    cn_init_v8,
    collnet::devices,
    get_props<collnet::properties, ncclNetProperties_v8_t, fill_v8>,
    collnet::listen,
    collnet::connect,
    collnet::reduce_support,
    collnet::reg_mr,
    collnet::reg_mr_dmabuf,
    collnet::dereg_mr,
    cn_iallreduce_v8,
    nullptr,  // iallgather: not offered (NCCL's tuner then leaves CollNet out for allgather)
    nullptr,  // ireducescatter: likewise
    collnet::iflush,
    collnet::test,
    collnet::close_coll,
    collnet::close_listen,
};

THC_PLUGIN_EXPORT ncclCollNet_v9_t ncclCollNetPlugin_v9 = {
    "THC",
    cn_init_v8,
    collnet::devices,
    get_props<collnet::properties, ncclNetProperties_v9_t, fill_v9<ncclNetProperties_v9_t>>,
    collnet::listen,
    collnet::connect,
    collnet::reduce_support,
    collnet::reg_mr,
    collnet::reg_mr_dmabuf,
    collnet::dereg_mr,
    collnet::iallreduce,
    nullptr,
    nullptr,
    collnet::iflush,
    collnet::test,
    collnet::close_coll,
    collnet::close_listen,
    nullptr,
};

THC_PLUGIN_EXPORT ncclCollNet_v10_t ncclCollNetPlugin_v10 = {
    "THC",
    cn_init_v8,
    collnet::devices,
    get_props<collnet::properties, ncclNetProperties_v10_t, fill_v9<ncclNetProperties_v10_t>>,
    collnet::listen,
    collnet::connect,
    collnet::reduce_support,
    collnet::reg_mr,
    collnet::reg_mr_dmabuf,
    collnet::dereg_mr,
    collnet::iallreduce,
    nullptr,
    nullptr,
    collnet::iflush,
    collnet::test,
    collnet::close_coll,
    collnet::close_listen,
    nullptr,
};

THC_PLUGIN_EXPORT ncclCollNet_v11_t ncclCollNetPlugin_v11 = {
    "THC",
    cn_init_v11,
    collnet::devices,
    get_props<collnet::properties, ncclNetProperties_v11_t, fill_v11>,
    cn_listen_v11,
    collnet::connect,
    collnet::reduce_support,
    collnet::reg_mr,
    collnet::reg_mr_dmabuf,
    collnet::dereg_mr,
    collnet::iallreduce,
    nullptr,
    nullptr,
    collnet::iflush,
    collnet::test,
    collnet::close_coll,
    collnet::close_listen,
    nullptr,
    cn_finalize_v11,
};

}  // extern "C"
