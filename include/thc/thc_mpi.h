/* thc over MPI: communicators from an MPI_Comm, and the MPI-like API.
 *
 * THC_Allreduce / CNAT_Allreduce have MPI_Allreduce's signature. They compress float, half
 * (MPIX_C_FLOAT16 where the MPI has it, or THC_MPI_FLOAT16 below) and bfloat16 (THC_MPI_BFLOAT16)
 * and double with op MPI_SUM or THC_MPI_AVG; any other datatype or op goes to the exact
 * PMPI_Allreduce untouched. The communicator's thc state is cached on the MPI_Comm (attribute),
 * created on first use (collectively) and freed with the communicator.
 *
 * Buffers may be CUDA device memory (float, half, bfloat16; both buffers on one device): the
 * codec then runs on the GPU and only compressed integers pass through pinned host memory to
 * MPI, so no CUDA-aware MPI is needed. As with a CUDA-aware MPI, work on other streams that
 * writes sendbuf must be complete before the call; the call returns with recvbuf written.
 * Ranks may mix host and device buffers in one call.
 *
 * Several ranks per host (THC_HIER, default auto): on a communicator that spans several hosts with
 * more than one rank on some host (a host: the ranks that share a kernel and a PID namespace),
 * calls reduce the floats inside each host over shared memory (an anonymous memfd of at most
 * THC_HIER_ARENA_BYTES, nothing in /dev/shm), run the compressed allreduce across hosts sharded
 * over the host's ranks, and share the result inside the host; thc_comm_create_mpi decides
 * collectively, and runs flat where a host cannot have shared memory (README, "Several ranks per
 * host").
 *
 * Waits: every MPI wait of thc (communicator creation included) gives up with THC_ERR_TIMEOUT
 * after THC_TIMEOUT_MS without progress (<= 0: no bound, as in MPI), and no step blocks in MPI, so
 * a rank that comes after the others gave up fails too. MPI can neither cancel nor free a started
 * collective: the timed-out operation stays posted, the communicator refuses later calls
 * (THC_ERR_TRANSPORT) and never frees its duplicated MPI communicators (a reused context id
 * would receive the abandoned operation's messages), and the buffers of the abandoned operation
 * are kept for the life of the process (a late rank's data never land in memory handed back).
 * End the job (MPI_Abort) after a timeout. A timeout in thc_comm_create_mpi leaves a duplication
 * posted on comm itself: comm is out of step too.
 */
#ifndef THC_THC_MPI_H_
#define THC_THC_MPI_H_

#include <mpi.h>

#include "thc/thc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over comm. cfg may be NULL (defaults + environment). */
thc_status_t thc_comm_create_mpi(MPI_Comm comm, const thc_config_t* cfg, thc_comm_t* out);

/* A user op meaning "average" (MPI has no MPI_AVG); valid after MPI_Init, created on first use.
 * An op for THC_Allreduce / CNAT_Allreduce / THC_Allreduce_x on float, double, half and bfloat16;
 * integer types are refused (MPI_ERR_OP). Handed to MPI_Allreduce itself it only sums. */
MPI_Op THC_MPI_AVG(void);
/* 16-bit float types for the MPI-like API (contiguous 2-byte types created on first use). MPI's
 * own ops do not know them (MPI_ERR_OP): reduce them exactly with THC_MPI_SUM16. */
MPI_Datatype THC_MPI_FLOAT16(void);
MPI_Datatype THC_MPI_BFLOAT16(void);
/* MPI_SUM for THC_MPI_FLOAT16 and THC_MPI_BFLOAT16 (also float and double): a commutative user op,
 * each element added in float and rounded to the type, NaN and Inf propagating as in an IEEE sum.
 * Valid after MPI_Init, created on first use. The PMPI interposer hands it to MPI for these types
 * (the exact redo of a call with NaN/Inf, calls below THC_MIN_BYTES). */
MPI_Op THC_MPI_SUM16(void);
/* MPI_PROD, MPI_MAX and MPI_MIN for the same types, alike: in float, rounded once to the type;
 * MAX and MIN return NaN where any rank has NaN. THC_Allreduce*, THC_Iallreduce*, the
 * reduce-scatters and the interposer hand them to MPI in place of MPI_PROD/MAX/MIN on these types. */
MPI_Op THC_MPI_PROD16(void);
MPI_Op THC_MPI_MAX16(void);
MPI_Op THC_MPI_MIN16(void);

/* Return MPI error codes (MPI_SUCCESS, or MPI_ERR_OTHER / MPI_ERR_OP / MPI_ERR_COUNT with
 * thc_last_error() set) without calling the communicator's error handler; the PMPI interposer
 * (libthc_mpi.so), which stands in for MPI_Allreduce, does call it. */
int THC_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm);
int CNAT_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm);
/* Any scheme, with an explicit error-feedback state (may be NULL) and 64-bit count. */
int THC_Allreduce_x(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count, MPI_Datatype datatype,
                    MPI_Op op, MPI_Comm comm, thc_state_t state);

/* Nonblocking (thc.h, "Nonblocking calls"): MPI_Iallreduce's signature. *request is an MPI
 * generalized request (MPI_Grequest_start): MPI_Wait, MPI_Test, MPI_Waitall, MPI_Waitany,
 * MPI_Testall, ... complete it like any MPI request, and MPI_Request_free lets go of it (the call
 * still completes). The call runs on the progress thread of the thc communicator cached on comm,
 * which calls MPI: with MPI_THREAD_MULTIPLE it overlaps the caller's work; at a lower thread level
 * it completes before the start call returns and the request is already complete. A failure is
 * the request's status (status.MPI_ERROR, and what MPI_Wait returns: MPI_ERR_OTHER, or
 * MPI_ERR_IN_STATUS from the multiple-completion calls), the same on every rank; the message goes
 * to stderr. Invalid start arguments (count < 0, THC_MPI_AVG on integers) are returned by the start
 * call (MPI_ERR_COUNT, MPI_ERR_OP) before anything starts, as THC_Allreduce does. Uncompressed
 * types and ops start PMPI_Iallreduce (an ordinary MPI request). Unlike MPI, the first call on a
 * communicator creates its thc state collectively before returning. */
int THC_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request);
int CNAT_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                    MPI_Request* request);
int THC_Iallreduce_x(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count, MPI_Datatype datatype,
                     MPI_Op op, MPI_Comm comm, thc_state_t state, MPI_Request* request);

/* Compressed reduce-scatter (thc_reduce_scatter) with MPI_Reduce_scatter's and
 * MPI_Reduce_scatter_block's signatures; THC scheme (uniform THC if THC_UNIFORM). Types and ops
 * that are not compressed go to PMPI_Reduce_scatter(_block) untouched. */
int THC_Reduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[], MPI_Datatype datatype, MPI_Op op,
                       MPI_Comm comm);
int THC_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype datatype, MPI_Op op,
                             MPI_Comm comm);
/* Any scheme, explicit error-feedback state (may be NULL). */
int THC_Reduce_scatter_x(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const int recvcounts[],
                         MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, thc_state_t state);
/* LOSSY allgather (thc_allgather) with MPI_Allgather's signature, for float, half and bfloat16
 * (sendtype == recvtype, sendcount == recvcount); other types go to PMPI_Allgather. */
int THC_Allgather_x(thc_scheme_t scheme, const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                    int recvcount, MPI_Datatype recvtype, MPI_Comm comm, thc_state_t state);

/* The thc communicator cached on comm, created collectively on first use (as THC_Allreduce does)
 * and destroyed with comm: for thc_allreduce_scheme's status codes on an MPI communicator. */
thc_status_t THC_Comm_get(MPI_Comm comm, thc_comm_t* comm_out);

/* Statistics of the thc state cached on comm (THC_ERR_INVALID_ARG if thc never ran on it). */
thc_status_t THC_Comm_stats(MPI_Comm comm, thc_stats_t* stats);

#ifdef __cplusplus
}
#endif

#endif /* THC_THC_MPI_H_ */
