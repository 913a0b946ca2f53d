/* thc: compressed homomorphic allreduce (THC and Cnat). C API.
 *
 * Every function returns a thc_status_t; on failure thc_last_error() returns a message for the
 * calling thread that says what went wrong and where. The library never aborts the process.
 *
 * Semantics follow MPI_Allreduce: every rank of a communicator calls the same collective in the
 * same order with the same count, datatype and op. THC_OP_SUM returns the estimated sum,
 * THC_OP_AVG the estimated mean. sendbuf == recvbuf (or THC_IN_PLACE) works in place; count 0
 * is a no-op without communication (so it must be 0 on every rank). The result is identical on
 * every rank.
 *
 * Every call starts with one exchange of a fixed size, whatever the count, that checks what the
 * ranks must agree on (the codec and its configuration, count, op, THC_CHUNK_BYTES, THC_ALGO,
 * THC_BIDIR, the number of calls made so far on the communicator, and the tensors' counts of a
 * call on several) and looks for NaN/Inf in the input. A disagreement is THC_ERR_CONFIG_MISMATCH
 * on every rank, NaN/Inf is THC_ERR_NONFINITE on every rank, and a rank whose call fails before
 * that exchange (a bad argument such as an unknown datatype, op or scheme, or a thc_state_t in
 * use by another call; a configuration that overflows) still takes part in it, so every rank
 * fails the call with that rank's status, and the call counts on every rank. After these errors
 * nothing was reduced, recvbuf is untouched and the communicator stays usable; the message names
 * the ranks concerned.
 * A peer that does not answer is THC_ERR_TIMEOUT once a wait has gone THC_TIMEOUT_MS without
 * progress (an inactivity bound, not a bound on the call; <= 0: no bound on MPI and in-process
 * communicators); on an MPI communicator that communicator is then unusable (see thc_mpi.h).
 *
 * Threads: any function may be called from any thread. A thc_comm_t takes one call at a time,
 * like an MPI communicator (whose collectives must come in the same order on every rank anyway):
 * a call made while another thread's call on the same communicator is running fails with
 * THC_ERR_INVALID_ARG on its own thread instead of racing it; it cannot take part in the
 * collective, so it does not count (the program's error, as concurrent collectives on one MPI
 * communicator are). Nonblocking calls (below) queue instead of being refused. A call with a
 * thc_state_t in use by another call (another thread's, or a nonblocking call in flight), on a
 * free communicator, is a bad argument like any other (above). Calls on different communicators
 * may run concurrently (MPI communicators then need MPI_THREAD_MULTIPLE). thc_comm_rank,
 * thc_comm_size and thc_comm_stats are safe at any time;
 * thc_comm_destroy and thc_state_destroy must not overlap a call on the same object.
 * thc_last_error is per thread.
 */
#ifndef THC_THC_H_
#define THC_THC_H_

#include <stddef.h>
#include <stdint.h>

#include "thc/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  THC_SUCCESS = 0,
  THC_ERR_INVALID_ARG = 1,   /* bad argument or configuration */
  THC_ERR_NONFINITE = 2,     /* NaN or Inf in the input of some rank (reported on every rank) */
  THC_ERR_CONFIG_MISMATCH = 3, /* ranks disagree on configuration, count or op */
  THC_ERR_OVERFLOW = 4,      /* the configuration's integer sums cannot fit any width */
  THC_ERR_TRANSPORT = 5,     /* the reduction backend failed */
  THC_ERR_TIMEOUT = 6,       /* a peer or the aggregator did not answer in time */
  THC_ERR_UNSUPPORTED = 7,   /* feature not built in or not available */
  THC_ERR_NO_MEMORY = 8,
  THC_ERR_INTERNAL = 9,
  THC_ERR_LEFT_BEHIND = 10,  /* partial aggregation went on without this rank: the call's result
                              * is gone (its input stays in the error-feedback residual); the next
                              * call rejoins the job at its newest operation */
  THC_STATUS_MAX_ENUM = 0x7FFFFFFF
} thc_status_t;

/* Each enum carries a *_MAX_ENUM member so any int a C caller passes is a valid value of the
 * type (the library then rejects unknown values with THC_ERR_INVALID_ARG). */
typedef enum { THC_FLOAT32 = 0, THC_FLOAT16 = 1, THC_BFLOAT16 = 2, THC_FLOAT64 = 3, THC_DTYPE_MAX_ENUM = 0x7FFFFFFF } thc_dtype_t;
typedef enum { THC_OP_SUM = 0, THC_OP_AVG = 1, THC_OP_MAX_ENUM = 0x7FFFFFFF } thc_op_t;
typedef enum { THC_SCHEME_THC = 0, THC_SCHEME_UHC = 1, THC_SCHEME_CNAT = 2, THC_SCHEME_DNAT = 3, THC_SCHEME_MAX_ENUM = 0x7FFFFFFF } thc_scheme_t;
typedef enum { THC_ALGO_AUTO = 0, THC_ALGO_INT = 1, THC_ALGO_PS = 2, THC_ALGO_MAX_ENUM = 0x7FFFFFFF } thc_algo_t;

#define THC_IN_PLACE ((const void*)1)

/* Every knob; each is also a THC_* environment variable (thc-info lists them with defaults and
 * help). thc_config_init fills defaults and then applies the environment. */
typedef struct thc_config {
  int bits;              /* THC_BITS: THC index bits b (1..8) */
  int granularity;       /* THC_GRANULARITY: THC grid g >= 2^b-1 */
  double p;              /* THC_P: THC truncation fraction, t_p = Phi^-1(1-p/2) */
  int uniform;           /* THC_UNIFORM: thc_allreduce uses uniform THC (identity table) */
  long block;            /* THC_BLOCK: RHT / prelude block in elements (power of two, 2^10..2^20) */
  int nat_scheme;        /* THC_NAT_SCHEME: cnat_allreduce uses THC_SCHEME_CNAT or THC_SCHEME_DNAT */
  int nat_width;         /* THC_NAT_WIDTH: Cnat/Dnat sum width in bits (8, 16, 32) */
  int nat_levels;        /* THC_NAT_LEVELS: Cnat/Dnat levels (0 = widest that fits) */
  int dnat_norm;         /* THC_DNAT_NORM: 2 or 0 (= infinity) */
  long chunk_bytes;      /* THC_CHUNK_BYTES: pipelining unit (float32 bytes) */
  int algo;              /* THC_ALGO: thc_algo_t */
  int bidir;             /* THC_BIDIR: colocated PS re-compresses Cnat shard sums */
  uint64_t seed;         /* THC_SEED: 0 = random (rank 0 decides) */
  long timeout_ms;       /* THC_TIMEOUT_MS: how long to wait for peers */
  long min_bytes;        /* THC_MIN_BYTES: PMPI interposer compresses messages at least this big */
  int mpi_allreduce;     /* THC_MPI_ALLREDUCE: interposer scheme: -1 off, else thc_scheme_t */
  int ef;                /* THC_EF: interposer keeps error feedback per (buffer, count, comm) */
  long ef_max_bytes;     /* THC_EF_MAX_BYTES: bound on the interposer's error-feedback memory */
  int debug;             /* THC_DEBUG: print a summary at finalize */
  double fault_drop;     /* THC_FAULT_DROP: aggregator client drop probability */
  double fault_dup;      /* THC_FAULT_DUP: duplicate probability */
  double fault_reorder;  /* THC_FAULT_REORDER: reorder probability */
  long fault_delay_us;   /* THC_FAULT_DELAY_US: max injected delay */
  int quorum;            /* THC_QUORUM: aggregator quorum (0 = all workers) */
  long quorum_timeout_ms;/* THC_QUORUM_TIMEOUT_MS: wait before a slot completes with the quorum */
  int agg_slots;         /* THC_AGG_SLOTS: slots (window bound) a job asks its aggregators for */
  int agg_lanes;         /* THC_AGG_LANES: lanes per packet at most (256: Tofino profile) */
  int agg_shards;        /* THC_AGG_SHARDS: job instances per aggregator address (0: all offered) */
  double agg_delay_ms;   /* THC_AGG_DELAY_MS: queueing delay the congestion control tolerates */
  char dpdk_eal[512];    /* THC_DPDK_EAL: EAL arguments of a dpdk:// aggregator client */
  char dpdk_local[64];   /* THC_DPDK_LOCAL: this worker's IPv4[:UDP port] on the DPDK port */
  int dpdk_port_id;      /* THC_DPDK_PORT_ID: DPDK port of a dpdk:// aggregator client */
  char collnet_aggregator[512]; /* THC_COLLNET_AGGREGATOR: NCCL plugin: aggregator address(es); "" = no CollNet */
  int collnet_scheme;    /* THC_COLLNET_SCHEME: NCCL plugin: thc_scheme_t of CollNet allreduces */
  int threads;           /* THC_THREADS: host codec threads per rank (1 = the calling thread only) */
  int hier;              /* THC_HIER: hierarchical allreduce on MPI and UCX communicators: -1 auto, 0 off, 1 on */
  char hier_hosts[256];  /* THC_HIER_HOSTS: test aid: emulated hosts ("2,2": MPI_COMM_WORLD ranks, or a
                          * UCX group's, 0-1 on one host, 2-3 on another) instead of the real ones;
                          * "" = the real split */
  long hier_arena_bytes; /* THC_HIER_ARENA_BYTES: shared memory per host for THC_HIER's intra-host stage
                          * (larger calls stream through it in rounds) */
  long fusion_bytes;     /* THC_FUSION_BYTES: nonblocking allreduces started back to back are fused into one
                          * stream of at most this many input bytes (0: never fused) */
  double fusion_cycle_ms;/* THC_FUSION_CYCLE_MS: how long the progress thread waits for more calls to fuse */
  int mpi_allgather;     /* THC_MPI_ALLGATHER: interposer: lossy MPI_Allgather of floats: -1 off, else thc_scheme_t */
} thc_config_t;

typedef struct thc_comm_s* thc_comm_t;
typedef struct thc_state_s* thc_state_t; /* error-feedback residual of one tensor */
typedef struct thc_inproc_group_s* thc_inproc_group_t;

/* Defaults, then THC_* environment variables. Returns THC_ERR_INVALID_ARG on a malformed value. */
thc_status_t thc_config_init(thc_config_t* cfg);
const char* thc_status_string(thc_status_t s);
/* Message of the calling thread's last failure ("" if none). */
const char* thc_last_error(void);
const char* thc_version(void);

/* In-process workers (threads): a group of `size`, then one communicator per thread. The
 * creation of each communicator is collective over the group's threads. */
thc_status_t thc_inproc_group_create(int size, thc_inproc_group_t* group);
thc_status_t thc_inproc_group_destroy(thc_inproc_group_t group);
thc_status_t thc_comm_create_inproc(thc_inproc_group_t group, int rank, const thc_config_t* cfg,
                                    thc_comm_t* comm);
/* Aggregators (thc-aggregator, thc-aggregator-dpdk, a switch): urls "udp://HOST:PORT" or
 * "dpdk://IPv4:PORT", or a comma-separated list of them (the job's slots are sharded over all of
 * them, and over every thread each one offers). job: the job's label, the same on every rank and
 * distinct for concurrent jobs under one key. key: the tenant key "ID:HEX" the aggregators hold
 * (their --key-file), or NULL to take THC_AGGREGATOR_KEY / THC_AGGREGATOR_KEY_FILE; it
 * authenticates every datagram and never travels. Collective over the `size` ranks. */
thc_status_t thc_comm_create_aggregator(const char* urls, int rank, int size, uint32_t job,
                                        const char* key, const thc_config_t* cfg, thc_comm_t* comm);
/* Peer to peer over UCX (shared memory on one host, TCP or RDMA between hosts, as UCX chooses;
 * UCX_TLS and UCX_NET_DEVICES steer it), no MPI and no aggregator: what a launcher that gives a
 * rank, a size and an address (torchrun's) needs. rendezvous "HOST:PORT" (or "tcp://HOST:PORT"):
 * rank 0 listens there for the other ranks during creation only (unauthenticated, like a
 * TCPStore; closed once the group is up). Collective over the `size` ranks; every rank waits
 * for the others up to cfg.timeout_ms (THC_TIMEOUT_MS). With several ranks on some host and
 * more than one host, calls run hierarchically (THC_HIER, as on MPI communicators: the host's
 * ranks reduce over shared memory, one slice each crosses hosts compressed). THC_ERR_UNSUPPORTED
 * in a build without UCX. */
thc_status_t thc_comm_create_ucx(const char* rendezvous, int rank, int size, const thc_config_t* cfg,
                                 thc_comm_t* comm);
thc_status_t thc_comm_destroy(thc_comm_t comm);
thc_status_t thc_comm_rank(thc_comm_t comm, int* rank);
thc_status_t thc_comm_size(thc_comm_t comm, int* size);

/* Error-feedback state: bound to the first count it is used with. */
thc_status_t thc_state_create(thc_state_t* state);
thc_status_t thc_state_destroy(thc_state_t state);
thc_status_t thc_state_reset(thc_state_t state);

/* THC (non-uniform; uniform if cfg.uniform). state may be NULL (no error feedback).
 * sendbuf/recvbuf may be host memory or CUDA device memory (float32, float16, bfloat16; needs
 * libthc_cuda, loaded on demand): on device memory the codec runs on the GPU and the state's
 * residual lives on that device. A state stays bound to the count, and to host or device
 * memory, of its first call (thc_state_reset unbinds it). */
thc_status_t thc_allreduce(const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype,
                           thc_op_t op, thc_comm_t comm, thc_state_t state);
/* Cnat (or natural dithering if cfg.nat_scheme is THC_SCHEME_DNAT). */
thc_status_t cnat_allreduce(const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype,
                            thc_op_t op, thc_comm_t comm, thc_state_t state);
/* Any scheme explicitly. */
thc_status_t thc_allreduce_scheme(thc_scheme_t scheme, const void* sendbuf, void* recvbuf,
                                  size_t count, thc_dtype_t dtype, thc_op_t op, thc_comm_t comm,
                                  thc_state_t state);

/* Statistics of a communicator since creation. */
typedef struct thc_stats {
  uint64_t calls;
  uint64_t elements;
  uint64_t wire_bytes_up;    /* bytes this rank's codes occupy upstream (index or value form);
                              * on an aggregator communicator: the datagrams sent, headers included */
  uint64_t wire_bytes_down;  /* bytes of sums this rank received (aggregator: datagrams received) */
  uint64_t float_bytes;      /* what the same calls would be as float32 */
  int last_algo;             /* thc_algo_t of the last call (INT or PS) */
  int measured_wire;         /* 1: the wire bytes are counted datagrams (aggregator communicators) */
  uint64_t packets;          /* aggregator communicators: data packets sent (first transmissions) */
  uint64_t retransmissions;  /* aggregator communicators: data packets sent again */
  int hier_hosts;            /* hierarchical MPI and UCX communicators (THC_HIER): the hosts the compressed
                              * stage spans; the wire bytes are this rank's share of that stage (what
                              * crosses hosts), elements and float_bytes the whole calls'. 0: flat */
  uint64_t groups;           /* calls that ran several tensors as one stream (thc_allreduce_group,
                              * fused nonblocking allreduces) */
  uint64_t grouped_tensors;  /* the tensors of those calls (each also counts in `calls`) */
} thc_stats_t;
thc_status_t thc_comm_stats(thc_comm_t comm, thc_stats_t* stats);

/* ---- Nonblocking calls ---------------------------------------------------------------------
 *
 * thc_iallreduce (and every thc_i* call below) starts a collective and returns at once with a
 * request. The call runs on the communicator's progress thread (one per communicator, started by
 * its first nonblocking call and joined by thc_comm_destroy), so it progresses while the caller
 * computes, without the caller polling. The rules are MPI's for nonblocking collectives:
 *
 * - Every rank starts the same collectives on a communicator in the same order, blocking and
 *   nonblocking alike, and they complete in that order. Any number may be in flight. A blocking
 *   call on a communicator with calls in flight runs after them. Ranks that start them in
 *   different orders get THC_ERR_CONFIG_MISMATCH on every rank (what was matched differs: counts,
 *   tensors, schemes), as for blocking calls.
 * - Until its request completes, a call owns its buffers and its state: do not write sendbuf or
 *   touch recvbuf or the state before thc_test says done or thc_wait returns.
 * - Errors are reported on the request: thc_test / thc_wait return the call's status (and set
 *   thc_last_error() on the thread that completes the request); it is the same on every rank, as
 *   for a blocking call (a rank's bad argument fails the call on every rank, NaN/Inf anywhere is
 *   THC_ERR_NONFINITE everywhere, with recvbuf and the state untouched). The start call itself
 *   fails (and makes no request) only when there is no call to report on: comm or request NULL,
 *   or, for groups, tensors NULL with ntensors > 0.
 * - Completing a request (thc_test saying done, thc_wait, thc_waitall) frees it and sets the
 *   handle to THC_REQUEST_NULL; completing THC_REQUEST_NULL succeeds at once. thc_request_free
 *   lets go of a request without waiting: the call still runs to the end (its buffers stay in use
 *   until then) and its status is lost. A started call cannot be cancelled: its peers take part in
 *   it (MPI cannot cancel collectives either).
 * - thc_comm_destroy first waits for the calls in flight on the communicator (each bounded by
 *   THC_TIMEOUT_MS); their requests stay valid until completed or freed.
 * - Fusion: nonblocking allreduces (host or device buffers) with the same scheme and op, started
 *   back to back, are fused into one compressed stream (as thc_iallreduce_group) of at most
 *   THC_FUSION_BYTES input bytes; the progress thread waits up to THC_FUSION_CYCLE_MS for more
 *   (Horovod's fusion threshold and cycle time), no longer once a request of the group is waited
 *   on. The ranks agree on each group's members (the calls every rank has started), so fusion
 *   depends on timing but never breaks the order; a fused call returns the same bits as unfused
 *   ones (each tensor keeps its own blocks, statistics and randomness).
 * - Progress needs a thread in the backend. On an MPI communicator that means
 *   MPI_THREAD_MULTIPLE; at a lower thread level nonblocking calls run to completion before the
 *   start call returns (correct results, no overlap; their requests still complete as usual).
 *   In-process and aggregator communicators always have the progress thread.
 * - Device buffers (CUDA) work in every call here as in thc_allreduce (writes to sendbuf on other
 *   streams must be complete before the start call): the device codec encodes and decodes them,
 *   only codes and sums pass through host memory. A group may mix host and device tensors (each
 *   tensor's sendbuf and recvbuf on one side). On a hierarchical MPI or UCX communicator (THC_HIER)
 *   a call with device buffers on any rank runs flat on every rank.
 */
typedef struct thc_request_s* thc_request_t;
#define THC_REQUEST_NULL ((thc_request_t)0)

thc_status_t thc_iallreduce(const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype, thc_op_t op,
                            thc_comm_t comm, thc_state_t state, thc_request_t* request);
thc_status_t cnat_iallreduce(const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype, thc_op_t op,
                             thc_comm_t comm, thc_state_t state, thc_request_t* request);
thc_status_t thc_iallreduce_scheme(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count,
                                   thc_dtype_t dtype, thc_op_t op, thc_comm_t comm, thc_state_t state,
                                   thc_request_t* request);

/* *done = 1 and the call's status once it has completed (the request is freed, *request becomes
 * THC_REQUEST_NULL); *done = 0 and THC_SUCCESS while it runs. Never blocks. */
thc_status_t thc_test(thc_request_t* request, int* done);
/* Blocks until the call completes; returns its status; frees the request. */
thc_status_t thc_wait(thc_request_t* request);
/* Waits for every request; statuses (may be NULL) receives each call's status. Returns
 * THC_SUCCESS when every call succeeded, otherwise the status of the first failed one (lowest
 * index; thc_last_error() says why). Every request is freed. */
thc_status_t thc_waitall(size_t count, thc_request_t* requests, thc_status_t* statuses);
/* Lets go of a request without waiting (see above); *request becomes THC_REQUEST_NULL. */
thc_status_t thc_request_free(thc_request_t* request);

/* ---- Groups: several tensors compressed as one stream ---------------------------------------
 *
 * One call for a list of tensors (a DDP bucket, Horovod's fused tensors, every gradient of a
 * model): one first exchange (prelude) for all of them and one pipeline of chunks over their
 * blocks, so small tensors share the per-call cost that makes them slow alone. Each tensor keeps
 * whole blocks of its own (statistics, rotation and error feedback per tensor, in `state`), so
 * every tensor's result is bit-identical to a thc_allreduce_scheme of it alone in the same place
 * in the sequence of calls (THC_BIDIR aside); a group counts as one call per tensor with
 * elements. Tensors may differ in dtype; scheme and op are the group's. On a hierarchical MPI or
 * UCX communicator (THC_HIER) a group is one hierarchical call (one compressed stream per slice, the
 * same bits; with device buffers on any rank: one stream, flat). A tensor's sendbuf NULL or
 * THC_IN_PLACE works in place. The array may be freed once the start call returns; the buffers
 * belong to the call until it completes. Count 0 tensors are allowed (nothing of them travels). Ranks must pass the same
 * number of tensors with the same counts (THC_ERR_CONFIG_MISMATCH otherwise). */
typedef struct thc_tensor {
  const void* sendbuf;
  void* recvbuf;
  size_t count;
  thc_dtype_t dtype;
  thc_state_t state; /* error feedback of this tensor, or NULL */
} thc_tensor_t;
thc_status_t thc_allreduce_group(thc_scheme_t scheme, const thc_tensor_t* tensors, size_t ntensors, thc_op_t op,
                                 thc_comm_t comm);
thc_status_t thc_iallreduce_group(thc_scheme_t scheme, const thc_tensor_t* tensors, size_t ntensors, thc_op_t op,
                                  thc_comm_t comm, thc_request_t* request);

/* ---- Reduce-scatter and allgather ------------------------------------------------------------
 *
 * thc_reduce_scatter: sendbuf holds sum(recvcounts[0..size)) elements; rank r receives in recvbuf
 * its shard, elements [sum(recvcounts[0..r)), + recvcounts[r]) of the decoded SUM (or AVG) over
 * the ranks: the first half of the colocated parameter server, without the allgather. Shards of
 * any sizes (0 included). Each shard is compressed as a tensor of its own (whole blocks, as in a
 * group), so rank r's result is bit-identical to its shard of a thc_allreduce_group of the shards;
 * the call counts as one call per non-empty shard. sendbuf THC_IN_PLACE (or NULL): the input is
 * read from recvbuf, which then holds all sum(recvcounts) elements and receives the shard at its
 * front (as MPI_Reduce_scatter with MPI_IN_PLACE). state: error feedback of the whole input (bound to
 * sum(recvcounts)): each shard's residual is kept by every rank for its own contribution.
 * recvcounts must be the same on every rank (THC_ERR_CONFIG_MISMATCH otherwise).
 *
 * thc_allgather: a LOSSY allgather, for when that is what is wanted (parameters are usually
 * gathered exactly, with MPI_Allgather or ncclAllGather): rank r's recvcounts[r] elements
 * (sendbuf) are encoded once by rank r (the scheme's b-bit codes: THC 4 bits per element instead
 * of 32) and decoded by every rank; recvbuf receives sum(recvcounts) elements, rank r's at offset
 * sum(recvcounts[0..r)), identical bits on every rank, rank r's own shard included (it gets the
 * decoded value too, so all ranks hold the same parameters). Same error bound per shard as one
 * worker's contribution to an allreduce (no averaging over workers). state: error feedback of
 * this rank's shard (bound to recvcounts[rank]). sendbuf THC_IN_PLACE (or NULL): the own shard is
 * read from its place in recvbuf. Counts as one call per non-empty shard. On a hierarchical MPI or
 * UCX communicator (THC_HIER) both run hierarchically on host buffers: the shards are summed (reduce-
 * scatter) or gathered (allgather) over each host's shared memory, and the compressed stage across
 * the hosts is itself a reduce-scatter (each host receives the sums of its own ranks' shards) or
 * an allgather (each shard encoded once, on its rank's host); the results are those of the
 * hierarchical allreduce group of the shards (reduce-scatter, bit for bit) and are the same on
 * every rank (allgather). Error feedback is then that of the rank that encodes a piece (the
 * hierarchical allreduce's rule: the residual of its slice), in its state. With device buffers on
 * some rank they run flat, as here. */
thc_status_t thc_reduce_scatter(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const size_t* recvcounts,
                                thc_dtype_t dtype, thc_op_t op, thc_comm_t comm, thc_state_t state);
thc_status_t thc_ireduce_scatter(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const size_t* recvcounts,
                                 thc_dtype_t dtype, thc_op_t op, thc_comm_t comm, thc_state_t state,
                                 thc_request_t* request);
thc_status_t thc_allgather(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const size_t* recvcounts,
                           thc_dtype_t dtype, thc_comm_t comm, thc_state_t state);
thc_status_t thc_iallgather(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const size_t* recvcounts,
                            thc_dtype_t dtype, thc_comm_t comm, thc_state_t state, thc_request_t* request);

/* Print every knob (name, default, current value, help) to stdout. */
void thc_print_knobs(void);

/* Knobs by name, spelled as their environment variables ("THC_BITS", "2"; "THC_P", "1/32";
 * "THC_ALGO", "ps"): the parsing thc_config_init applies to the environment, for bindings and
 * command lines. Ranges are checked where the configuration is used (communicator creation, a
 * call), as for the environment. THC_ERR_INVALID_ARG for an unknown name or a malformed value
 * (cfg is then unchanged). */
thc_status_t thc_config_set(thc_config_t* cfg, const char* name, const char* value);
/* The value of knob `name` in cfg as the environment would spell it, NUL-terminated in buf
 * (THC_ERR_INVALID_ARG for an unknown name or a buf of fewer than the value's bytes + 1). */
thc_status_t thc_config_get(const thc_config_t* cfg, const char* name, char* buf, size_t len);
/* Name of knob i (0, 1, ...; NULL after the last), to enumerate them. */
const char* thc_knob_name(int i);

#ifdef __cplusplus
}
#endif

#endif /* THC_THC_H_ */
