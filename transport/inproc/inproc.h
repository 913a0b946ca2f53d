// In-process backend: ranks are threads of one process sharing an InprocGroup. Always built;
// used by tests and the demo. Each operation copies its contribution into the group, so buffers
// may be reused (and in-place results written) as soon as wait() returns.
#pragma once

#include <memory>

#include "transport/reducer.h"

namespace thc::transport {

class InprocGroup;
std::shared_ptr<InprocGroup> make_inproc_group(int size, long timeout_ms = 120000);
std::unique_ptr<Reducer> make_inproc_reducer(std::shared_ptr<InprocGroup> group, int rank);

}  // namespace thc::transport
