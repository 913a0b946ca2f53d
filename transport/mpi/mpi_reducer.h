// MPI backend. Uses only PMPI_* entry points so that the PMPI interposer (libthc_mpi.so), which
// replaces MPI_Allreduce, never re-enters itself.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "transport/reducer.h"

namespace thc::transport {

// Throws thc::Error(kTransport) recording the call text, file:line and MPI's error string.
#define THC_CHECK_MPI(call)                                                          \
  do {                                                                               \
    const int thc_mpi_rc_ = (call);                                                  \
    if (thc_mpi_rc_ != MPI_SUCCESS) ::thc::transport::mpi_fail(thc_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
[[noreturn]] void mpi_fail(int rc, const char* call, const char* file, int line);

// Duplicates comm (so thc traffic never matches the application's) and sets MPI_ERRORS_RETURN
// on the duplicate. Collective over comm.
//
// Every wait (the duplication included) gives up after timeout_ms (THC_TIMEOUT_MS; <= 0: no
// bound, as in MPI) with kTimeout. MPI can neither cancel nor free a started collective, so the
// operation stays with MPI: the buffers this backend owns for it are kept for the life of the
// process, and the communicator refuses every later operation (kTransport), since the ranks are
// no longer in step. Buffers the caller passed (the engine's sums and codes) are the caller's to
// keep alive if the missing peer may still join the abandoned operation.
std::unique_ptr<Reducer> make_mpi_reducer(MPI_Comm comm, long timeout_ms);

}  // namespace thc::transport
