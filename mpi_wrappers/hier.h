// Hierarchical allreduce on MPI communicators (THC_HIER): several ranks per host. What a call
// does is collectives/capi/hier.h; this is its MPI transport (mpi_wrappers/hier.cc).
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
