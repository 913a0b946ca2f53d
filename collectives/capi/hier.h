// Hierarchical allreduce (THC_HIER): several ranks per host, over any transport that supplies a
// HierNet (MPI: mpi_wrappers/hier.cc; UCX: collectives/capi/ucx.cc).
//
// A call on a communicator that spans H > 1 hosts (ranks that share a kernel and a PID namespace)
// with more than one rank on some host runs as
//   1. every rank writes its input (as float32) into a shared-memory arena of its host (an
//      anonymous memfd of at most THC_HIER_ARENA_BYTES; calls that do not fit stream through it
//      in rounds);
//   2. local rank i < S of every host sums slice i of the host's inputs (S = the fewest ranks
//      any host has; slices are whole codec blocks): an intra-host float reduce-scatter;
//   3. local rank i of every host runs the compressed allreduce (an Engine over the transport's
//      reducer of those ranks) of slice i with local rank i of the other hosts: only compressed
//      codes cross hosts, and every local rank's cores and share of the host's link are busy;
//   4. every rank reads the reduced slices back from the arena (intra-host allgather).
// Hosts with different rank counts work: the ranks beyond S only contribute and read.
// AVG is the sum of the host sums over all ranks of the communicator.
//
// What the flat engine guarantees holds here too: a fixed-size first exchange over the whole
// communicator (failures before it, the codec and its configuration, count, op, chunking,
// THC_ALGO, THC_BIDIR, the call sequence, NaN/Inf), so every rank fails alike and nothing is
// reduced; a second one after the compressed stage, so a failure there fails every rank before
// any output is written (and the residual stays as it was); every wait bounded by
// THC_TIMEOUT_MS. Error feedback applies to the compressed stage (the residual of slice i lives on
// local rank i). A group (thc_allreduce_group, fused nonblocking allreduces) is one such call:
// each tensor sliced as its own call would be, slice i holding the tensors' slices i one after
// another, one pass through the arena, and per slice one compressed group (the engine's stream
// path) over the pieces, so the results are bit for bit those of the separate calls. So is a
// reduce-scatter or allgather, with the ranks' shards as the tensors and a compressed stage that
// is itself a reduce-scatter (each host decodes only its ranks' shards) or an allgather (each
// shard gathered on its rank's host, encoded there once, decoded everywhere). Device buffers on
// any rank make the call run flat (the engine's GPU path, or its stream path) on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "collectives/capi/capi.h"
#include "transport/reducer.h"

namespace thc::capi {

// What the hierarchical communicator needs of its transport. Every operation is bounded by
// THC_TIMEOUT_MS and throws thc::Error (kTimeout, kTransport) with a message naming what failed;
// after one, the communicator is broken (its ranks are out of step) and broken() is called.
class HierNet {
 public:
  virtual ~HierNet() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Element-wise MAX of n words over every rank, in place. `what`: the step, for messages.
  virtual void max_u32(uint32_t* w, size_t n, const char* what) = 0;
  // Every rank's 64-bit key, by rank (the host layout). Default: through max_u32.
  virtual std::vector<uint64_t> allgather_u64(uint64_t mine, const char* what);
  // Rank local[0]'s n bytes at buf to the other ranks of `local` (one host's ranks, this rank
  // among them): the arena's handle. Collective over every rank of the net (hosts = the number of
  // hosts, host = this rank's). Default: through max_u32, each host's bytes in a slot of its own.
  virtual void share_from_first(const std::vector<int>& local, int host, int hosts, void* buf, size_t n,
                                const char* what);
  // Collective over every rank once the layout is known: what group_reducer needs (MPI: a
  // duplicate communicator for the slice groups).
  virtual void prepare_groups() {}
  // A reducer of the ranks `members` (one per host; this rank among them), made by each of them.
  virtual std::unique_ptr<transport::Reducer> group_reducer(const std::vector<int>& members, long timeout_ms) = 0;
  // A reducer of every rank (calls with device buffers), made by every rank alike.
  virtual std::unique_ptr<transport::Reducer> flat_reducer(long timeout_ms) = 0;
  // The communicator failed an operation: keep whatever the transport may still touch.
  virtual void broken() {}
};

// The ranks' layout input: THC_HIER_HOSTS emulates hosts as blocks of consecutive ranks of a
// "world" (MPI_COMM_WORLD; a UCX group is its own world). world_name: for messages.
struct HierWorld {
  int rank = 0;
  int size = 1;
  const char* name = "the world";
};

// Collective over net's ranks: decides whether their calls run hierarchically (THC_HIER,
// THC_HIER_HOSTS, THC_HIER_ARENA_BYTES; every rank the same way, a disagreement is
// kConfigMismatch on every rank; a host without shared memory makes it flat) and returns what
// runs them, or nullptr for the flat engine (net is then released). THC_DEBUG: rank 0 prints the
// decision and the layout. *fusing (if given): whether some rank has THC_FUSION_BYTES > 0, agreed
// in the same exchange, hierarchical or flat. Throws thc::Error.
std::unique_ptr<Composite> make_hier(std::unique_ptr<HierNet> net, const thc_config_t& cfg, const HierWorld& world,
                                     bool* fusing = nullptr);

}  // namespace thc::capi
