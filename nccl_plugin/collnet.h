// The CollNet half of the plugin, version-neutral: NCCL hands whole allreduces of float chunks to
// iallreduce, and each runs as a compressed allreduce at the aggregator(s) named by
// THC_COLLNET_AGGREGATOR: THC (or THC_COLLNET_SCHEME) encodes the buffer (host memory: the host
// codec; device memory, NCCL_PTR_CUDA: the GPU codec, only the codes staged through pinned host
// memory, nccl_plugin/device.h), the aggregator adds integers after its table lookup, every rank
// decodes the same sums into recvData. The shape of SHARP offload, with compressed codes on the
// wire instead of floats.
//
//   regMr        NCCL_PTR_HOST, or NCCL_PTR_CUDA when built with CUDA and a device answers; the
//                type is checked against what the CUDA runtime says of the range
//
//   devices      0 without THC_COLLNET_AGGREGATOR (NCCL then runs without CollNet); otherwise
//                the net devices, with the same name, pciPath and guid (NCCL pairs them)
//   connect      joins one aggregator job per CollNet communicator; job id and credential are
//                derived from the nonces in every rank's listen handle, so all ranks agree and
//                two communicators never share a job (may block up to THC_TIMEOUT_MS)
//   reduceSupport  float32, float16, bfloat16 with sum; everything else no (NCCL keeps its own
//                algorithms for those)
//   iallreduce   queued to the comm's worker thread, never run on NCCL's proxy thread; test()
//                polls. Requests of a comm run one after another in posting order, which is the
//                order every rank posts them in (the aggregator job needs the same sequence).
//                A non-finite input gives NaN results (as a float sum would), a failure (an
//                aggregator that stopped answering: THC_TIMEOUT_MS) an error from test() on that
//                and every later request of the comm.
//   iallgather / ireducescatter  not offered (NULL in the tables): the tuner then never picks
//                CollNet for them.
#pragma once

#include <cstddef>

#include "nccl_plugin/abi.h"
#include "nccl_plugin/net.h"

namespace thc::nccl_plugin::collnet {

using nccl_abi::ncclDataType_t;
using nccl_abi::ncclRedOp_t;
using nccl_abi::ncclResult_t;

ncclResult_t init(nccl_abi::ncclDebugLogger_t logger);
ncclResult_t devices(int* ndev);
ncclResult_t properties(int dev, net::Props* props);
ncclResult_t listen(int dev, void* handle, void** listen_comm);
ncclResult_t connect(void* handles[], int nranks, int rank, void* listen_comm, void** coll_comm);
ncclResult_t reduce_support(ncclDataType_t type, ncclRedOp_t op, int* supported);
ncclResult_t reg_mr(void* coll_comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t reg_mr_dmabuf(void* coll_comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
ncclResult_t dereg_mr(void* coll_comm, void* mhandle);
ncclResult_t iallreduce(void* coll_comm, void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        void* send_mhandle, void* recv_mhandle, void** request);
ncclResult_t iflush(void* coll_comm, void* data, int size, void* mhandle, void** request);
ncclResult_t test(void* request, int* done, int* size);
ncclResult_t close_coll(void* coll_comm);
ncclResult_t close_listen(void* listen_comm);

}  // namespace thc::nccl_plugin::collnet
