// thc_udp_worker: one rank of the workload (workload.h) through make_udp_client, as its own
// process. Used by udp_client_test for the fork/exec runs; fault injection comes from the
// THC_FAULT_* environment, like in any application. A dpdk://IPv4:PORT address (DPDK builds)
// sends through a DPDK port instead, configured like the library's: THC_DPDK_EAL, THC_DPDK_LOCAL,
// THC_DPDK_PORT_ID.
//
//   thc_udp_worker ADDRESS RANK WORLD JOB COUNT OUTFILE
// Writes the result bytes to OUTFILE; exit 0 on success, 1 with the error on stderr otherwise.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "common/status.h"
#include "tests/transport/switch_client/workload.h"
#include "transport/switch_client/udp/udp_client.h"
#if defined(THC_WORKER_DPDK)
#include "transport/switch_client/dpdk/dpdk_channel.h"
#endif

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s ADDRESS RANK WORLD JOB COUNT OUTFILE\n", argv[0]);
    return 2;
  }
  thc::transport::UdpClientOptions o;
  o.address = argv[1];
  o.rank = std::atoi(argv[2]);
  o.world = std::atoi(argv[3]);
  o.job_label = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10));
  o.max_wait_ms = 60000;
  o.fault.seed = 1000 + static_cast<uint64_t>(o.rank);  // THC_FAULT_SEED overrides
  const uint64_t count = std::strtoull(argv[5], nullptr, 10);
  try {
    o.key = thc::transport::aggregator_key_from_env();
    std::unique_ptr<thc::transport::Reducer> red;
    if (o.address.rfind("dpdk://", 0) == 0) {
#if defined(THC_WORKER_DPDK)
      thc::transport::DpdkChannelOptions d;
      const char* eal = std::getenv("THC_DPDK_EAL");
      const char* local = std::getenv("THC_DPDK_LOCAL");
      const char* pid = std::getenv("THC_DPDK_PORT_ID");
      d.eal_args = eal ? eal : "";
      d.local = local ? local : "";
      d.port_id = pid ? std::atoi(pid) : 0;
      d.rank = o.rank;
      red = std::make_unique<thc::transport::UdpReducer>(o, thc::transport::make_dpdk_channel(o.address, d));
#else
      std::fprintf(stderr, "thc_udp_worker: built without DPDK\n");
      return 2;
#endif
    } else {
      red = thc::transport::make_udp_client(o);
    }
    const auto res = thc::test::wl_run(*red, count, 7);
    std::ofstream f(argv[6], std::ios::binary);
    f.write(reinterpret_cast<const char*>(res.bytes.data()), static_cast<std::streamsize>(res.bytes.size()));
    if (!f) {
      std::fprintf(stderr, "thc_udp_worker: cannot write %s\n", argv[6]);
      return 1;
    }
    std::printf("rank %d %s\n", o.rank, red->wire_stats().c_str());
    return res.all_full ? 0 : 3;
  } catch (const thc::Error& e) {
    std::fprintf(stderr, "thc_udp_worker rank %d: %s\n", o.rank, e.what());
    return 1;
  }
}
