// The plugin's only use of the aggregator client: one job at the aggregator(s) for one CollNet
// communicator. Kept to this one function because the client and its protocol change under it
// (address lists sharding a job over several aggregators, the 64-bit credential becoming a job
// secret); the address string goes to the client exactly as the user wrote it.
#pragma once

#include <cstdint>
#include <string>

#include "thc/thc.h"

namespace thc::nccl_plugin {

// Joins job `job` as `rank` of `size` at `addresses` (THC_COLLNET_AGGREGATOR, unchanged), proving
// membership with `credential`; may block up to cfg.timeout_ms. On failure returns the status and
// leaves thc_last_error() set.
thc_status_t open_aggregator_job(const std::string& addresses, int rank, int size, uint32_t job, uint64_t credential,
                                 const thc_config_t& cfg, thc_comm_t* comm);

}  // namespace thc::nccl_plugin
