/* thc on NCCL: compressed allreduce of device buffers, stream-ordered like ncclAllReduce.
 *
 * Drop-in (library: libthc_cuda):
 *
 *   thcAllReduce(sendbuff, recvbuff, count, ncclFloat32, ncclSum, comm, stream);   // THC
 *   cnatAllReduce(sendbuff, recvbuff, count, ncclBfloat16, ncclAvg, comm, stream); // Cnat
 *
 * Same contract as ncclAllReduce: every rank calls with the same count, datatype and op, in the
 * same order as its other collectives on comm; the call returns once the work is enqueued on
 * stream; sendbuff == recvbuff works in place; count 0 is a no-op. ncclFloat32, ncclFloat16
 * and ncclBfloat16 with ncclSum (estimated sum) or ncclAvg (estimated mean) are compressed (math
 * in float32); any other datatype or op is passed to ncclAllReduce unchanged.
 *
 * Explicit handle: thcNcclCommInit builds a handle with a configuration (thc_config_t: bits,
 * granularity, p, block, Cnat width, algorithm, seed, ...) and thcAllReduceEx takes it, the
 * scheme and an optional error-feedback state. The drop-in functions use a handle cached per
 * ncclComm_t, created on first use from THC_* environment variables (thcNcclCommGet gives it to
 * you, e.g. to reserve memory before capturing a graph).
 *
 * Per call, on the stream, with no host synchronisation:
 *   1. a prelude kernel computes each block's statistic (and a finiteness flag and a digest of
 *      scheme, count and op); one ncclAllReduce(ncclUint32, ncclMax) combines them (non-negative
 *      floats order like their bit patterns);
 *   2. an encode kernel (RHT, scaling, stochastic rounding onto the table) writes either
 *        value form: T[z] as integers, reduced by ncclAllReduce(ncclSum) in the codec's sum type
 *          (u8 -> ncclUint8, i8 -> ncclInt8, u32/i32 -> ncclUint32/ncclInt32, and 16-bit sums,
 *          which NCCL has no type for, as pairs v0 + 65536 v1 in ncclUint32 words: exact because
 *          the codec sizes every lane's total to fit 16 bits), or
 *        index form (colocated parameter server): packed b-bit indices, ncclAlltoAll of equal
 *          shards, a lookup-and-sum kernel on each shard owner, ncclAllGather of the shard sums;
 *      THC_ALGO chooses (auto: index form when it moves fewer bytes);
 *   3. a decode kernel writes recvbuff.
 * Large tensors run in chunks of max(THC_CHUNK_BYTES, 64 MiB) float32 bytes, which bounds the
 * workspace. The per-call counter that freshens the randomness lives on the device, so a
 * captured CUDA graph draws new randomness on every replay.
 *
 * Errors a host cannot see without synchronising (NaN or Inf in some rank's input, ranks
 * disagreeing on count or op) make every rank's recvbuff NaN, leave error-feedback state
 * untouched, and are reported by thcNcclCommGetAsyncError. Argument and configuration errors
 * return ncclInvalidArgument / ncclInvalidUsage with thcNcclGetLastError() describing them.
 *
 * CUDA graphs: capture works when no allocation is needed: create handles and error-feedback
 * states and call thcNcclCommReserve (or run the call once) before capturing; a call that would
 * have to grow the workspace while the stream is capturing fails with ncclInvalidUsage.
 * Calls on one handle must be ordered (one stream at a time, like a single NCCL communicator used
 * from one thread); the handle serialises its host side with a mutex. A call is a sequence of
 * NCCL collectives and kernels: do not make it inside ncclGroupStart/ncclGroupEnd (NCCL would
 * defer its collectives past the kernels that need their results). Drive each rank from its own
 * thread or process, as NCCL requires for blocking sequences.
 *
 * Not supported on this path: partial aggregation (NCCL has no stragglers) and THC_BIDIR
 * (re-compressed shard sums); the colocated parameter server sends the sums uncompressed.
 */
#ifndef THC_THC_NCCL_H_
#define THC_THC_NCCL_H_

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#include "thc/thc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct thcNcclComm_s* thcNcclComm_t;
/* Error-feedback state of one tensor (THC Algorithm 3): a device residual of `count` floats. */
typedef struct thcNcclEf_s* thcNcclEf_t;

/* Collective over every rank of comm (it agrees on the seed and checks that all ranks have the
 * same configuration; it synchronises an internal stream). cfg NULL: thc_config_init (defaults,
 * then THC_* environment). Uses comm's CUDA device. */
ncclResult_t thcNcclCommInit(ncclComm_t comm, const thc_config_t* cfg, thcNcclComm_t* out);
/* Frees the handle's device memory (waits for its work). Not collective. Call before
 * ncclCommDestroy(comm). */
ncclResult_t thcNcclCommDestroy(thcNcclComm_t comm);

/* The handle the drop-in functions use for comm, created (collectively) on first use. */
ncclResult_t thcNcclCommGet(ncclComm_t comm, thcNcclComm_t* out);
/* Destroys the cached handle of comm, if any. Call before ncclCommDestroy(comm). */
ncclResult_t thcNcclCommRelease(ncclComm_t comm);

/* Grows the workspace so that calls of up to max_count elements (any scheme, datatype and
 * algorithm) need no allocation: then they can be captured in a CUDA graph. */
ncclResult_t thcNcclCommReserve(thcNcclComm_t comm, size_t max_count);

/* Sticky errors of calls on comm that completed: THC_SUCCESS, or THC_ERR_NONFINITE /
 * THC_ERR_CONFIG_MISMATCH. Synchronises stream first (pass the stream of the calls). */
ncclResult_t thcNcclCommGetAsyncError(thcNcclComm_t comm, cudaStream_t stream, thc_status_t* status);

/* Error feedback for a tensor of `count` elements, on the current device, zero-initialised. */
ncclResult_t thcNcclEfCreate(size_t count, thcNcclEf_t* ef);
ncclResult_t thcNcclEfDestroy(thcNcclEf_t ef);
/* Zero the residual (stream-ordered). */
ncclResult_t thcNcclEfReset(thcNcclEf_t ef, cudaStream_t stream);
/* The residual (device, count floats) for inspection. */
ncclResult_t thcNcclEfResidual(thcNcclEf_t ef, float** residual, size_t* count);

/* Any scheme with an explicit handle. ef (nullable) must have been created for `count`; the call
 * compresses sendbuff + residual and updates the residual (x - own dequantised contribution). */
ncclResult_t thcAllReduceEx(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, thc_scheme_t scheme, thcNcclComm_t comm, thcNcclEf_t ef,
                            cudaStream_t stream);

/* Drop-in replacements for ncclAllReduce. thcAllReduce: THC (uniform THC when THC_UNIFORM=1);
 * cnatAllReduce: Cnat (natural dithering when THC_NAT_SCHEME=dnat). */
ncclResult_t thcAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t cnatAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/* Message of the calling thread's last failed thc NCCL call ("" if none). */
const char* thcNcclGetLastError(void);

/* 1 when ptr is device memory the host cannot dereference (see collectives/engine/device_pointer.h). */
int thc_cuda_is_device_pointer(const void* ptr);

#ifdef __cplusplus
}
#endif

#endif /* THC_THC_NCCL_H_ */
