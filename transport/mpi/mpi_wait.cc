#include "transport/mpi/mpi_wait.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/keep_forever.h"
#include "common/status.h"

namespace thc::transport {

MpiClock::time_point mpi_deadline(long timeout_ms) {
  return timeout_ms > 0 ? MpiClock::now() + std::chrono::milliseconds(timeout_ms) : MpiClock::time_point::max();
}

std::string mpi_error_text(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (PMPI_Error_string(rc, msg, &len) != MPI_SUCCESS) std::snprintf(msg, sizeof msg, "error %d", rc);
  return msg;
}

MpiWait mpi_wait_until(MPI_Request* req, MpiClock::time_point until, int* rc) {
  const auto start = MpiClock::now();
  uint64_t nap = 0;
  while (true) {
    int flag = 0;
    const int r = PMPI_Test(req, &flag, MPI_STATUS_IGNORE);
    if (r != MPI_SUCCESS) {
      if (rc) *rc = r;
      return MpiWait::kError;
    }
    if (flag) return MpiWait::kDone;
    const auto now = MpiClock::now();
    if (now >= until) return MpiWait::kTimeout;
    if (now - start < std::chrono::microseconds(50)) continue;
    nap = nap ? std::min<uint64_t>(2 * nap, 20) : 10;
    std::this_thread::sleep_for(std::chrono::microseconds(nap));
  }
}

MPI_Comm mpi_idup_bounded(MPI_Comm comm, long timeout_ms, const std::string& who) {
  // The handle is written when the duplicate completes: on a timeout it must outlive us.
  std::vector<uint8_t> slot(sizeof(MPI_Comm));
  MPI_Comm* out = reinterpret_cast<MPI_Comm*>(slot.data());
  *out = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = PMPI_Comm_idup(comm, out, &req);
  if (rc != MPI_SUCCESS)
    fail(Status::kTransport, who + ": creating the communicator (MPI_Comm_idup) failed: " + mpi_error_text(rc));
  switch (mpi_wait_until(&req, mpi_deadline(timeout_ms), &rc)) {
    case MpiWait::kDone:
      return *out;
    case MpiWait::kTimeout:
      keep_forever(std::move(slot));
      fail(Status::kTimeout, who + ": creating the communicator (MPI_Comm_idup): a peer did not take part within " +
                                 std::to_string(timeout_ms) + " ms (THC_TIMEOUT_MS)");
    case MpiWait::kError:
      break;
  }
  keep_forever(std::move(slot));
  fail(Status::kTransport, who + ": creating the communicator (MPI_Comm_idup) failed: " + mpi_error_text(rc));
}

}  // namespace thc::transport
