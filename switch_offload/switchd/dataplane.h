// What thc-switchd needs of a switch's data plane (switch_offload/p4/CONTRACT.md): forwarding
// entries, the job's slot registers, admission entries, multicast replication of results to the
// job's workers, lookup tables, and counters. One interface, two backends:
//   Bmv2DataPlane   simple_switch's Thrift runtime API (bmv2_dataplane.h), tested here;
//   BfrtDataPlane   a Tofino through BfRt gRPC (bfrt_dataplane.h), THC_WITH_TOFINO_BFRT=ON, untested.
// Every call either did what it says or throws thc::Error with the backend's reason; thc-switchd
// turns a failure during a JOIN into an ERROR to that JOIN, so a worker is never acknowledged
// into a job the data plane does not hold.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "switch_offload/protocol/wire.h"

namespace thc::switch_offload::switchd {

using Mac = std::array<uint8_t, 6>;

// An IPv4 host reachable through a switch port (the ipv4_fwd table: exact destination address).
struct Route {
  uint32_t ip = 0;     // host order
  uint16_t port = 0;   // switch port (BMv2: the -i PORT@IFACE number)
  Mac mac{};           // destination MAC on that port (the host's, or its next hop's)
};

std::string ip_str(uint32_t ip);
std::string mac_str(const Mac& m);
bool parse_ip(const std::string& s, uint32_t* ip);
bool parse_mac(const std::string& s, Mac* m);
// "IP,PORT,MAC" (what --route takes); false with *err on a bad spec.
bool parse_route(const std::string& spec, Route* r, std::string* err);
// A routes file: one "IP,PORT,MAC" (or "IP PORT MAC") per line; '#' starts a comment.
bool load_routes(const std::string& path, std::vector<Route>* out, std::string* err);

// A job as the data plane holds it (CONTRACT.md "Jobs in the data plane").
struct DpJob {
  uint64_t id = 0;         // the protocol's 64-bit job id (admit key)
  int index = 0;           // job index j in [0, max_jobs()): counters, lookup registers, rids
  uint16_t n = 0;          // workers
  uint32_t slot_base = 0;  // first slot of the job's range in the slot registers
  uint32_t nslots = 0;     // S
  uint64_t all_mask = 0;   // bits 0..n-1
  uint16_t mgid = 0;       // multicast group: index + 1
};

// A worker admitted to a job: the address its datagrams come from (and its results go to), and
// the switch port and MAC its route gives.
struct DpWorker {
  uint16_t worker = 0;
  uint32_t ip = 0;  // host order
  uint16_t udp_port = 0;
  Route route;
};

struct DpCounters {
  std::vector<uint64_t> job_rx;  // packets aggregated, per job index (c_job_rx)
  std::vector<uint64_t> result;  // results sent, per job index (c_result)
  std::vector<uint64_t> drop;    // drops by reason (c_drop; reasons numbered in the P4 source)
};

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  virtual std::string describe() const = 0;
  // Job indices the program has (64) and slots its slot registers hold (P4_SLOTS).
  virtual int max_jobs() const = 0;
  virtual uint32_t slot_capacity() const = 0;

  // Remove every entry, group and node thc-switchd may have installed (a clean start).
  virtual void clear() = 0;
  // ipv4_fwd: packets to r.ip leave on r.port from smac to r.mac.
  virtual void add_route(const Route& r, const Mac& smac) = 0;
  // thc_service: THC data packets to ip:udp_port are aggregated (everything else is forwarded).
  virtual void add_service(uint32_t ip, uint16_t udp_port) = 0;

  // r_seq, r_bitmap, r_count := 0 over the slot sets of slots [first, first + count).
  virtual void reset_slots(uint32_t first, uint32_t count) = 0;
  // The job's multicast group (empty until workers are admitted).
  virtual void install_job(const DpJob& j) = 0;
  // Admit worker w.worker of job j: its admit entry, multicast node (rid j.index*64 + worker on its
  // route's port) and replica entry (results to w's address, from smac). Replaces an earlier
  // admission of the same worker in this job (a worker that joined again from another address).
  virtual void admit_worker(const DpJob& j, const DpWorker& w, const Mac& smac) = 0;
  // Lookup table tid of job j: r_lut entries and the lut_meta entry (b, sum type).
  virtual void write_table(const DpJob& j, int tid, int bits, proto::WireInt sum, const int32_t* values) = 0;
  // Every entry, node and group of job j.
  virtual void remove_job(const DpJob& j) = 0;

  virtual uint64_t job_rx(int index) = 0;
  virtual DpCounters counters() = 0;
};

}  // namespace thc::switch_offload::switchd
