// MPI backend. Uses only PMPI_* entry points so that the PMPI interposer (libthc_mpi.so), which
// replaces MPI_Allreduce, never re-enters itself.
#pragma once

#include <mpi.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "transport/link.h"
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
// on the duplicate. Collective over comm. The integer sums run as the point-to-point schedules of
// transport/schedules over PMPI_Isend/PMPI_Irecv on the duplicate; the prelude's MAX is an
// MPI_Iallreduce.
//
// Every wait (the duplication included) gives up after timeout_ms (THC_TIMEOUT_MS; <= 0: no
// bound, as in MPI) with kTimeout, naming the ranks it was waiting for. Receives of an abandoned
// operation are cancelled; buffers MPI may still touch belong to the backend and are kept for
// the life of the process (never the caller's), and the communicator refuses every later
// operation (kTransport), since the ranks are no longer in step.
std::unique_ptr<Reducer> make_mpi_reducer(MPI_Comm comm, long timeout_ms);

// The point-to-point link alone (for tests and for composing other schedules).
std::unique_ptr<Link> make_mpi_link(MPI_Comm comm, long timeout_ms);

// A private duplicate of a communicator that several links of this process share (the
// hierarchical communicator's slices and its hosts). Freed with its last holder, unless an
// operation on it was abandoned (its context id must not be reused while that operation may
// still deliver messages) or MPI is finalized.
struct MpiSharedComm {
  explicit MpiSharedComm(MPI_Comm c) : comm(c) {}
  ~MpiSharedComm();
  MpiSharedComm(const MpiSharedComm&) = delete;
  MpiSharedComm& operator=(const MpiSharedComm&) = delete;
  MPI_Comm comm;
  std::atomic<bool> abandoned{false};
};

// The reducer of a group of ranks of shared->comm: members (distinct ranks of the communicator,
// this rank among them) become the link's ranks 0..size-1 in that order. Not collective and
// creates no communicator (MPI cannot split one within a bound: MPI_Comm_split blocks): its
// messages are point-to-point on shared->comm, and its MAX is a gather at members[0] and a send
// back. No two ranks may be members of two groups of one communicator at once (their messages
// would mix). Waits, abandoning and refusal after a failure as for make_mpi_reducer.
std::unique_ptr<Reducer> make_mpi_group_reducer(std::shared_ptr<MpiSharedComm> shared, std::vector<int> members,
                                                long timeout_ms);

}  // namespace thc::transport
