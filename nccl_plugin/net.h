// The point-to-point half of the plugin, version-neutral: NCCL's net calls mapped onto the UCX
// transport (transport/ucx). versions.cc adapts these to ncclNet_v8 ... v11.
//
// NCCL's contract, as implemented here:
//   listen      never blocks; the handle carries the listener's IPv4 address, port and nonce
//   connect     never blocks: returns success with a NULL comm until the connection is up; the
//               Connector in progress is kept in the last 8 bytes of NCCL's copy of the handle
//               (NCCL calls again with the same handle)
//   accept      never blocks: NULL until a connection whose hello matched arrived
//   isend/irecv NULL request when the comm's request slots are full (NCCL retries); receives
//               may be larger than sends; grouped receives up to kMaxRecvs buffers
//   test        per-buffer sizes; a failed transfer returns ncclRemoteError (and a WARN)
//   iflush      host memory only (ptrSupport = NCCL_PTR_HOST): nothing to flush, NULL request
//   close*      return at once; the endpoint's flush and close finish on the transport's closer
//               thread (the flush needs the peer's progress)
#pragma once

#include <cstddef>
#include <cstdint>

#include "nccl_plugin/abi.h"

namespace thc::nccl_plugin::net {

using nccl_abi::ncclResult_t;

constexpr int kMaxRecvs = 8;
// Per comm: NCCL_NET_MAX_REQUESTS receives, and as many sends times the receiver's grouping.
constexpr int kMaxRequests = nccl_abi::NCCL_NET_MAX_REQUESTS * kMaxRecvs;
// test() reports int sizes, so a transfer stays below 2 GiB; NCCL splits larger ones.
constexpr size_t kMaxP2pBytes = size_t{1} << 30;
constexpr size_t kMaxCollBytes = size_t{1} << 30;

// Every field any version reports.
struct Props {
  const char* name = nullptr;
  const char* pci_path = nullptr;
  uint64_t guid = 0;
  int ptr_support = 0;
  int reg_is_global = 0;
  int force_flush = 0;
  int speed = 0;
  int port = 0;
  float latency = 0;
  int max_comms = 0;
  int max_recvs = 0;
  int dev = 0;
  size_t max_p2p_bytes = 0;
  size_t max_coll_bytes = 0;
  int max_multi_request_size = 1;
};

ncclResult_t init(nccl_abi::ncclDebugLogger_t logger);  // idempotent (v11 calls it per communicator)
ncclResult_t devices(int* ndev);
ncclResult_t properties(int dev, Props* props);
ncclResult_t listen(int dev, void* handle, void** listen_comm);
ncclResult_t connect(int dev, void* handle, void** send_comm);
ncclResult_t accept(void* listen_comm, void** recv_comm);
ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
ncclResult_t dereg_mr(void* comm, void* mhandle);
ncclResult_t isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void** request);
ncclResult_t irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
                   void** request);
ncclResult_t iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request);
ncclResult_t test(void* request, int* done, int* sizes);
ncclResult_t close_send(void* send_comm);
ncclResult_t close_recv(void* recv_comm);
ncclResult_t close_listen(void* listen_comm);
ncclResult_t get_device_mr(void* comm, void* mhandle, void** dptr_mhandle);
ncclResult_t irecv_consumed(void* recv_comm, int n, void* request);

}  // namespace thc::nccl_plugin::net
