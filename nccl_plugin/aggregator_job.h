// The plugin's only use of the aggregator client: one job at the aggregator(s) for one CollNet
// communicator. The address string (one or a comma-separated list) goes to the client exactly as
// the user wrote it; the tenant key comes from THC_AGGREGATOR_KEY / THC_AGGREGATOR_KEY_FILE.
#pragma once

#include <cstdint>
#include <string>

#include "thc/thc.h"

namespace thc::nccl_plugin {

// Joins the job labelled by (job, credential) as `rank` of `size` at `addresses`
// (THC_COLLNET_AGGREGATOR, unchanged); may block up to cfg.timeout_ms. On failure returns the status and
// leaves thc_last_error() set.
thc_status_t open_aggregator_job(const std::string& addresses, int rank, int size, uint32_t job, uint64_t credential,
                                 const thc_config_t& cfg, thc_comm_t* comm);

}  // namespace thc::nccl_plugin
