#include "nccl_plugin/aggregator_job.h"

namespace thc::nccl_plugin {

thc_status_t open_aggregator_job(const std::string& addresses, int rank, int size, uint32_t job, uint64_t credential,
                                 const thc_config_t& cfg, thc_comm_t* comm) {
  // The aggregator authenticates jobs with the tenant key every rank holds (THC_AGGREGATOR_KEY or
  // THC_AGGREGATOR_KEY_FILE, read by the client); what tells this communicator's job from the
  // others' under that key is its 32-bit label, folded from the handles' nonces.
  const uint32_t label = job ^ static_cast<uint32_t>(credential) ^ static_cast<uint32_t>(credential >> 32);
  return thc_comm_create_aggregator(addresses.c_str(), rank, size, label ? label : 1, nullptr, &cfg, comm);
}

}  // namespace thc::nccl_plugin
