// thc-switchd: the control plane of a switch that aggregates in its data plane. It holds the key
// file and answers JOIN / CHALLENGE / TABLE / LEAVE / STATS on the switch's behalf with the
// software aggregator's own Engine in its control-only mode (EngineConfig::data_plane): the same
// code and rules, so authentication, cookies, replay windows and job limits are those of
// thc-aggregator. Through the Engine's hooks it installs each job in the data plane (a job index,
// a range of slot registers reset to zero, a multicast group; per worker an admission entry, a
// multicast node and a replica entry, all before that worker's JOIN_ACK; the job's lookup tables)
// and removes it when the Engine frees the job (every worker left, or idle). The Engine sees only
// control traffic, so the data plane's per-job packet counter (c_job_rx) is read every poll
// interval and a job whose counter moved is marked active (Engine::touch).
//
// Control datagrams arrive on an ordinary UDP socket bound to the switch's IP on the kernel
// interface behind the switch's CPU port: the data plane forwards everything to that IP that is
// not a THC data packet (CONTRACT.md: ipv4_fwd, thc_service).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/switchd/dataplane.h"

namespace thc::switch_offload::switchd {

struct SwitchdOptions {
  uint32_t ip = 0;                   // the switch's IPv4 address (host order): bound, and the service address
  uint16_t port = 9471;              // 0: ephemeral (tests)
  std::shared_ptr<const auth::KeyRing> keys;
  std::vector<Route> routes;         // must include one for `ip` (to the CPU port)
  Mac switch_mac{{0x02, 0x54, 0x48, 0x43, 0x00, 0x01}};  // source MAC of what the switch sends
  int max_jobs = 64;                 // at most the data plane's job indices
  int max_jobs_per_source = 16;
  uint32_t max_slots = 1024;         // per job (the data plane's slot registers are shared by all jobs)
  uint64_t job_idle_timeout_us = 600'000'000;
  uint64_t seed = 0;                 // job seeds (0: random)
  uint64_t poll_us = 1'000'000;      // how often the per-job packet counters are read
  bool stats_from_loopback = true;
  bool clear = true;                 // start from an empty data plane (entries, groups, nodes)
};

class Switchd {
 public:
  // Binds the socket, clears the data plane, installs the routes and the service entry (throws
  // thc::Error with the reason).
  Switchd(const SwitchdOptions& opt, std::unique_ptr<DataPlane> dp);
  // Removes the jobs it installed.
  ~Switchd();
  Switchd(const Switchd&) = delete;
  Switchd& operator=(const Switchd&) = delete;

  uint16_t port() const { return port_; }
  // Handles what arrives within max_wait_ms, then timers (engine tick, counter poll).
  void run_once(int max_wait_ms);
  void run(const std::atomic<bool>& stop);

  // The engine's counters (stats_names() order) followed by the data plane's (names()).
  std::vector<uint64_t> stats();
  static std::vector<std::string> names();
  size_t jobs() const { return jobs_.size(); }
  DataPlane& dataplane() { return *dp_; }
  std::string describe() const;

 private:
  class Hooks;
  struct JobEntry {
    DpJob dp;
    uint64_t rx_seen = 0;
  };
  proto::ErrorCode on_job_created(const DataPlaneJob& j);
  proto::ErrorCode on_worker_joined(const DataPlaneJob& j, uint16_t w, const PeerAddr& at);
  proto::ErrorCode on_table(const DataPlaneJob& j, const proto::TableSpec& t);
  void on_job_freed(const DataPlaneJob& j);
  void poll_counters(uint64_t now);
  const Route* route_for(uint32_t ip) const;

  SwitchdOptions opt_;
  std::unique_ptr<DataPlane> dp_;
  std::unique_ptr<Hooks> hooks_;
  Stats stats_;
  std::unique_ptr<Engine> engine_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::map<uint64_t, JobEntry> jobs_;     // by job id (one shard)
  std::vector<bool> index_used_;
  std::map<uint32_t, uint32_t> slot_ranges_;  // used: first slot -> count
  uint64_t next_tick_ = 0, next_poll_ = 0;
  std::vector<uint8_t> buf_;
};

}  // namespace thc::switch_offload::switchd
