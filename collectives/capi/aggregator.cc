// thc_comm_create_aggregator: a communicator whose reductions run at an aggregator speaking
// switch_offload/protocol (thc-aggregator over UDP today).
#include <algorithm>
#include <string>

#include "collectives/capi/capi.h"
#include "collectives/engine/knobs.h"
#include "thc/config.h"
#include "transport/switch_client/udp/udp_client.h"
#if THC_HAVE_DPDK
#include "transport/switch_client/dpdk/dpdk_channel.h"
#endif

extern "C" thc_status_t thc_comm_create_aggregator(const char* url, int rank, int size, uint32_t job,
                                                   uint64_t token, const thc_config_t* cfg, thc_comm_t* comm) {
  std::unique_ptr<thc::transport::Reducer> r;
  thc_config_t c;
  const thc_status_t st = thc::capi::guard("thc_comm_create_aggregator", [&] {
    if (!url) thc::fail(thc::Status::kInvalidArgument, "url is NULL");
    const std::string u(url);
    const bool dpdk = u.rfind("dpdk://", 0) == 0;
    if (u.rfind("udp://", 0) != 0 && !dpdk)
      thc::fail(thc::Status::kInvalidArgument,
                "unsupported aggregator url '" + u + "' (expected udp://HOST:PORT or dpdk://IPv4:PORT)");
    if (cfg) {
      c = *cfg;
    } else {
      thc::engine::config_from_env(&c);
    }
    thc::transport::UdpClientOptions o;
    o.address = u;
    o.rank = rank;
    o.world = size;
    o.job_id = job;
    o.token = token;
    o.quorum = c.quorum;
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
    if (dpdk) {
#if THC_HAVE_DPDK
      thc::transport::DpdkChannelOptions d;
      d.eal_args = c.dpdk_eal;
      d.port_id = c.dpdk_port_id;
      d.local = c.dpdk_local;
      d.rank = rank;
      if (c.timeout_ms > 0) d.resolve_ms = std::min<double>(static_cast<double>(c.timeout_ms), 10000.0);
      r = std::make_unique<thc::transport::UdpReducer>(o, thc::transport::make_dpdk_channel(u, d));
#else
      thc::fail(thc::Status::kUnsupported, "dpdk:// aggregator: this libthc was built without DPDK (THC_WITH_DPDK)");
#endif
    } else {
      r = thc::transport::make_udp_client(o);
    }
  });
  if (st != THC_SUCCESS) return st;
  return thc::capi::create_comm(std::move(r), &c, comm);  // the configuration read once, above
}
