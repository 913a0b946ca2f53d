#include "nccl_plugin/aggregator_job.h"

namespace thc::nccl_plugin {

thc_status_t open_aggregator_job(const std::string& addresses, int rank, int size, uint32_t job, uint64_t credential,
                                 const thc_config_t& cfg, thc_comm_t* comm) {
  return thc_comm_create_aggregator(addresses.c_str(), rank, size, job, credential, &cfg, comm);
}

}  // namespace thc::nccl_plugin
