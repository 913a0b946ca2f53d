// Links over another link's ranks (transport/link.h), for the hierarchical communicator on a
// transport of its own (collectives/capi/hier.h over UCX): a link of a subset of the ranks (a
// slice group: one rank per host), and a link that forwards to a shared one (the flat calls).
// The two split the parent's tag space: a forwarding link uses the lower half, a group link the
// upper half (its MAX the top tag of it), so a pair of ranks in both never matches one's message
// with the other's receive.
#pragma once

#include <memory>
#include <vector>

#include "transport/link.h"

namespace thc::transport {

// Ranks members[0..k) of parent (each distinct, this rank among them) as ranks 0..k-1. Its
// max_u32 is a gather to member 0 and a broadcast, point to point, bounded by the parent's
// timeout_ms; a failure or timeout throws thc::Error (kTimeout names the members missing).
std::unique_ptr<Link> make_group_link(std::shared_ptr<Link> parent, std::vector<int> members);
// parent's ranks and MAX, in the lower half of its tags.
std::unique_ptr<Link> make_forward_link(std::shared_ptr<Link> parent);

}  // namespace thc::transport
