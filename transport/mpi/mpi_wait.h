#pragma once
// Bounded waits on MPI requests, shared by the MPI link (transport/mpi/mpi_reducer.cc) and the
// hierarchical communicator (mpi_wrappers/hier.cc): both poll with PMPI_Test, spin about 50 us,
// then sleep with a short backoff (10, 20, 20.. us) so that ranks sharing cores leave them to the
// ranks doing the work, and give up at a deadline (THC_TIMEOUT_MS; none when <= 0). The naps stay
// short: these are exchanges of a few words, and Open MPI's TCP transport advances a collective
// only when polled, so each of its steps would otherwise wait out a nap (up to 200 us each, which
// doubled a small hierarchical call's time; README "Waits on exchanges").
#include <mpi.h>

#include <chrono>
#include <string>

namespace thc::transport {

using MpiClock = std::chrono::steady_clock;

// The deadline timeout_ms from now (time_point::max() when timeout_ms <= 0).
MpiClock::time_point mpi_deadline(long timeout_ms);

// MPI's text for an error code ("error N" if MPI has none).
std::string mpi_error_text(int rc);

enum class MpiWait { kDone, kTimeout, kError };
// Polls *req until it completes (kDone), the deadline passes (kTimeout, the request left live) or
// PMPI_Test fails (kError, *rc = its code).
MpiWait mpi_wait_until(MPI_Request* req, MpiClock::time_point until, int* rc);

// MPI_Comm_idup of comm, bounded by timeout_ms. On a timeout or an error the handle slot stays
// parked (keep_forever: MPI writes it when the duplicate completes) and thc::Error is thrown,
// its message starting with `who` (kTimeout or kTransport).
MPI_Comm mpi_idup_bounded(MPI_Comm comm, long timeout_ms, const std::string& who);

}  // namespace thc::transport
