// Hierarchical allreduce on MPI communicators (THC_HIER): several ranks per host.
//
// A call on a communicator that spans H > 1 hosts (ranks that share a kernel and a PID namespace)
// with more than one rank on some host runs as
//   1. every rank writes its input (as float32) into a shared-memory arena of its host (an
//      anonymous memfd of at most THC_HIER_ARENA_BYTES; calls that do not fit stream through it
//      in rounds);
//   2. local rank i < S of every host sums slice i of the host's inputs (S = the fewest ranks
//      any host has; slices are whole codec blocks): an intra-host float reduce-scatter;
//   3. local rank i of every host runs the compressed allreduce (an Engine over MPI) of slice i
//      with local rank i of the other hosts: only compressed codes cross hosts, and every local
//      rank's cores and share of the host's link are busy;
//   4. every rank reads the reduced slices back from the arena (intra-host allgather).
// Hosts with different rank counts work: the ranks beyond S only contribute and read.
// AVG is the sum of the host sums over all ranks of the communicator.
//
// What the flat engine guarantees holds here too: a fixed-size first exchange over the whole
// communicator (failures before it, the codec and its configuration, count, op, chunking,
// THC_ALGO, THC_BIDIR, the call sequence, NaN/Inf), so every rank fails alike and nothing is
// reduced; a second one after the compressed stage, so a failure there fails every rank before
// any output is written (and the residual stays as it was); every wait bounded by
// THC_TIMEOUT_MS, and nothing blocks in MPI (no communicator is split: MPI_Comm_split cannot be
// bounded). Error feedback applies to the compressed stage (the residual of slice i lives on
// local rank i). A group (thc_allreduce_group, fused nonblocking allreduces) is one such call:
// each tensor sliced as its own call would be, slice i holding the tensors' slices i one after
// another, one pass through the arena, and per slice one compressed group (the engine's stream
// path) over the pieces, so the results are bit for bit those of the separate calls. So is a
// reduce-scatter or allgather, with the ranks' shards as the tensors and a compressed stage that
// is itself a reduce-scatter (each host decodes only its ranks' shards) or an allgather (each
// shard gathered on its rank's host, encoded there once, decoded everywhere). Device buffers on
// any rank make the call run flat (the engine's GPU path, or its stream path) on every rank.
#pragma once

#include <mpi.h>

#include <memory>

#include "collectives/capi/capi.h"

namespace thc::mpi {

// Collective over comm: decides whether comm's calls run hierarchically (THC_HIER,
// THC_HIER_HOSTS, THC_HIER_ARENA_BYTES; every rank the same way, a disagreement is
// kConfigMismatch on every rank; a host without shared memory makes it flat) and returns what
// runs them, or nullptr for the flat engine. THC_DEBUG: rank 0 prints the decision and the
// layout. *fusing (if given; left alone for an intercommunicator): whether some rank has
// THC_FUSION_BYTES > 0, agreed in the same exchange, hierarchical or flat. Throws thc::Error.
std::unique_ptr<capi::Composite> make_hier(MPI_Comm comm, const thc_config_t& cfg, bool* fusing = nullptr);

}  // namespace thc::mpi
