// thc_comm_create_aggregator: a communicator whose reductions run at aggregators speaking
// switch_offload/protocol (thc-aggregator over UDP, thc-aggregator-dpdk, a switch), one or several.
#include <algorithm>
#include <string>

#include "collectives/capi/capi.h"
#include "collectives/engine/knobs.h"
#include "thc/config.h"
#include "transport/switch_client/udp/udp_client.h"
#if THC_HAVE_DPDK
#include "transport/switch_client/dpdk/dpdk_channel.h"
#endif

namespace {
#if THC_HAVE_DPDK
std::unique_ptr<thc::transport::DatagramChannel> dpdk_channel(const std::string& address, const void* ctx) {
  return thc::transport::make_dpdk_channel(address, *static_cast<const thc::transport::DpdkChannelOptions*>(ctx));
}
#endif
}  // namespace

extern "C" thc_status_t thc_comm_create_aggregator(const char* urls, int rank, int size, uint32_t job,
                                                   const char* key, const thc_config_t* cfg, thc_comm_t* comm) {
  std::unique_ptr<thc::transport::Reducer> r;
  thc_config_t c;
  const thc_status_t st = thc::capi::guard("thc_comm_create_aggregator", [&] {
    if (!urls) thc::fail(thc::Status::kInvalidArgument, "urls is NULL");
    if (cfg) {
      c = *cfg;
    } else {
      thc::engine::config_from_env(&c);
    }
    namespace auth = thc::switch_offload::auth;
    thc::transport::UdpClientOptions o;
    o.address = urls;
    o.rank = rank;
    o.world = size;
    o.job_label = job;
    if (key) {
      std::string err;
      if (!auth::parse_key(key, &o.key, &err)) thc::fail(thc::Status::kInvalidArgument, "key: " + err);
      if (o.key.id == auth::kOperatorKeyId)
        thc::fail(thc::Status::kInvalidArgument, "key id 0 is the operator key; workers need a tenant key");
    } else {
      o.key = thc::transport::aggregator_key_from_env();
    }
    o.quorum = c.quorum;
    if (c.quorum_timeout_ms < 0 || c.quorum_timeout_ms > 3'600'000)
      thc::fail(thc::Status::kInvalidArgument, "THC_QUORUM_TIMEOUT_MS must be 0..3600000");
    o.quorum_timeout_us = static_cast<uint32_t>(c.quorum_timeout_ms * 1000);
    if (c.agg_slots < 1 || c.agg_slots > 32768) thc::fail(thc::Status::kInvalidArgument, "THC_AGG_SLOTS must be 1..32768");
    o.slots = c.agg_slots;
    if (c.agg_lanes < 64 || c.agg_lanes > 8192 || c.agg_lanes % 64)
      thc::fail(thc::Status::kInvalidArgument, "THC_AGG_LANES must be a multiple of 64 in 64..8192");
    o.max_lanes = c.agg_lanes;
    if (c.agg_shards < 0) thc::fail(thc::Status::kInvalidArgument, "THC_AGG_SHARDS must be >= 0");
    o.max_shards = c.agg_shards;
    if (!(c.agg_delay_ms > 0)) thc::fail(thc::Status::kInvalidArgument, "THC_AGG_DELAY_MS must be > 0");
    o.target_delay_ms = c.agg_delay_ms;
    if (c.timeout_ms > 0) o.max_wait_ms = static_cast<double>(c.timeout_ms);
    o.fault.drop = c.fault_drop;
    o.fault.dup = c.fault_dup;
    o.fault.reorder = c.fault_reorder;
    if (c.fault_delay_us > 0) {
      o.fault.delay_us = static_cast<uint32_t>(c.fault_delay_us);
      o.fault.delay_prob = 1.0;
    }
    o.fault.seed = 0x5eedull + static_cast<uint64_t>(rank);
    o.fault_from_env = true;  // THC_FAULT_* (including DELAY_PROB and SEED) override
#if THC_HAVE_DPDK
    thc::transport::DpdkChannelOptions d;
    d.eal_args = c.dpdk_eal;
    d.port_id = c.dpdk_port_id;
    d.local = c.dpdk_local;
    d.rank = rank;
    if (c.timeout_ms > 0) d.resolve_ms = std::min<double>(static_cast<double>(c.timeout_ms), 10000.0);
    r = thc::transport::make_aggregator_reducer(o, dpdk_channel, &d);
#else
    r = thc::transport::make_aggregator_reducer(o);
#endif
  });
  if (st != THC_SUCCESS) return st;
  return thc::capi::create_comm(std::move(r), &c, comm);  // the configuration read once, above
}
