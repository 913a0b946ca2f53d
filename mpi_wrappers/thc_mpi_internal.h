// What the PMPI interposer (libthc_mpi.so, built from this tree with libthc) needs of the MPI-like
// API beyond thc_mpi.h: nonblocking calls with hooks that run in the order the calls were started.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

#include "thc/thc_mpi.h"

namespace thc::mpi {

struct IallreduceHooks {
  // NaN/Inf in some rank's input (THC_ERR_NONFINITE on every rank, nothing reduced): redo the call
  // exactly, with MPI's own sum, on a private duplicate of comm, so NaN and Inf propagate element
  // by element as in MPI_Iallreduce. The redo runs where the call ran, in start order.
  bool nonfinite_exact = false;
  // The MPI error code of a failed call (default MPI_ERR_OTHER).
  std::function<int(thc_status_t)> code_of;
  // Once the call is over (after a redo), before its request completes, on the thread that ran it:
  // the MPI code the request will report, the thc status of the compressed call (THC_SUCCESS,
  // THC_ERR_NONFINITE when redone, ...) and its message.
  std::function<void(int code, thc_status_t st, const std::string& msg)> done;
};

// THC_Iallreduce_x with hooks. Returns an MPI code; *request is an MPI generalized request (or an
// ordinary one from PMPI_Iallreduce when the call is not compressed).
int iallreduce(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count, MPI_Datatype datatype,
               MPI_Op op, MPI_Comm comm, thc_state_t state, MPI_Request* request, const IallreduceHooks& hooks);

// The op MPI itself must run for (datatype, op), for exact redos and calls passed to MPI: MPI_SUM,
// MPI_PROD, MPI_MAX and MPI_MIN of thc's byte-based 16-bit types are THC_MPI_SUM16, ..._PROD16,
// ..._MAX16, ..._MIN16 (MPI's own refuse them with MPI_ERR_OP); anything else is op itself.
MPI_Op exact_op(MPI_Datatype datatype, MPI_Op op);

// Waits for the nonblocking calls in flight on the thc communicator cached on comm, if any (before
// freeing what those calls use; attribute delete callbacks).
void quiesce(MPI_Comm comm);

}  // namespace thc::mpi
