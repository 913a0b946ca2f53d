// The DPDK channel of the switch client: a worker reaches its aggregator (thc-aggregator-dpdk, the
// UDP thc-aggregator on another host, a switch) through a DPDK port instead of the kernel's UDP
// stack. The protocol logic is the UDP client's (udp_client.h); only the datagrams travel
// differently: Ethernet/IPv4/UDP frames built and checked by switch_offload/servers/dpdk/frames.h,
// ARP answered for the worker's own address and used to resolve the aggregator's MAC.
//
// DPDK's EAL can be initialised once per process: the first channel initialises it (with
// THC_DPDK_EAL's arguments; without a --file-prefix it adds --in-memory, or --no-shconf with
// --no-huge, so several worker processes on one machine do not collide; without -l/-c/--lcores
// it maps EAL's main lcore onto the calling thread's CPUs instead of pinning it to one core) and configures the port (one rx and one tx queue);
// later channels of the process reuse them. One channel may be open at a time per process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport/switch_client/channel.h"

namespace thc::transport {

struct DpdkChannelOptions {
  std::string eal_args;       // EAL arguments, space separated (THC_DPDK_EAL)
  int port_id = 0;            // DPDK port (THC_DPDK_PORT_ID)
  std::string local;          // this worker's "IPv4[:UDP port]" (THC_DPDK_LOCAL); required;
                              // "A.B.C.D+" means A.B.C.D + rank (one setting for all ranks)
  int rank = 0;               // default UDP port: 40000 + rank
  double resolve_ms = 5000;   // how long to ARP for the aggregator before failing
};

// address: "dpdk://IPv4:PORT" of the aggregator. Throws thc::Error (kInvalidArgument for bad
// options, kTransport when DPDK or the port fails, kTimeout when the aggregator's MAC cannot be
// resolved).
std::unique_ptr<DatagramChannel> make_dpdk_channel(const std::string& address, const DpdkChannelOptions& opt);

}  // namespace thc::transport
