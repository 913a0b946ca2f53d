// The UCX backend: a group of processes that reach each other over UCX (shared memory on one
// host, TCP or RDMA between hosts; UCX chooses, UCX_TLS / UCX_NET_DEVICES steer it), with no MPI
// and no aggregator. The integer allreduce is transport/schedules (the colocated PS and the ring,
// the same code the MPI backend runs) over a Link on ucx_p2p endpoints, one per peer.
//
// Bootstrap (what torchrun-style launchers give: an address, a rank and a size): rank 0 listens
// on the rendezvous TCP address HOST:PORT; every other rank connects to it (retrying until rank 0
// is up, within the timeout) and sends its rank, the group size and its UCX listener's address;
// rank 0 answers each with every rank's address once all have come. Then rank i connects to every
// rank below it over UCX and accepts from every rank above it. The rendezvous is not
// authenticated (like a TCPStore): anyone who can reach the port during setup can disturb it, and
// it is closed once the group is up. What the UCX listeners accept is bound to the nonce each
// published through the rendezvous.
//
// Errors: a malformed rendezvous, sizes or ranks that do not agree, a duplicate rank, or a group
// not complete within the timeout fail creation with a message naming what (kInvalidArgument,
// kConfigMismatch, kTimeout); a connection from something that is not a rank of this protocol is
// dropped and setup goes on. A peer that dies later fails the operation in flight (kTransport
// where UCX reports the disconnect, else kTimeout after THC_TIMEOUT_MS without progress).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/link.h"
#include "transport/reducer.h"
#include "transport/ucx/ucx_p2p.h"

namespace thc::transport {

struct UcxGroupOptions {
  std::string rendezvous;  // "HOST:PORT" or "tcp://HOST:PORT": where rank 0 listens
  int rank = 0;
  int size = 1;
  long timeout_ms = 60000;  // setup (all ranks up and connected), and the link's progress bound
};

// Collective over the group: returns once every rank is connected. Throws thc::Error.
std::unique_ptr<Link> make_ucx_link(const UcxGroupOptions& opt);
std::unique_ptr<Reducer> make_ucx_reducer(const UcxGroupOptions& opt);

// The same without the TCP rendezvous, for callers that exchange addresses themselves (the NCCL
// plugin's CollNet handles): each rank makes a listener, publishes address(), and once it holds
// every rank's address (in rank order, its own included) connects.
class UcxPeerListener {
 public:
  virtual ~UcxPeerListener() = default;
  virtual const ucx::Address& address() const = 0;
};
std::unique_ptr<UcxPeerListener> ucx_listen(long timeout_ms);  // throws thc::Error
// Collective over the ranks: rank i connects to every rank below it and accepts every rank above
// it through `listener` (each connection's first message names its rank); returns once every
// peer is connected, or throws (kTimeout naming the ranks missing after timeout_ms).
std::unique_ptr<Link> ucx_connect_peers(UcxPeerListener& listener, const std::vector<ucx::Address>& addrs, int rank,
                                        long timeout_ms);

}  // namespace thc::transport
