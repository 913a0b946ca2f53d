// In-process backend: ranks are threads of one process sharing an InprocGroup. Always built;
// used by tests and the demo. Its Link copies every message into the group at send time, and the
// integer sums run as the same point-to-point schedules the MPI backend uses
// (transport/schedules), so threads exercise the very code MPI processes run.
#pragma once

#include <memory>

#include "transport/link.h"
#include "transport/reducer.h"

namespace thc::transport {

class InprocGroup;
std::shared_ptr<InprocGroup> make_inproc_group(int size, long timeout_ms = 120000);
std::unique_ptr<Reducer> make_inproc_reducer(std::shared_ptr<InprocGroup> group, int rank);
// The point-to-point link alone (tests of the schedules).
std::unique_ptr<Link> make_inproc_link(std::shared_ptr<InprocGroup> group, int rank);

}  // namespace thc::transport
