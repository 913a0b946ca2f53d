// The aggregator over DPDK: the same Engine as thc-aggregator, behind a DPDK port instead of
// sockets. Frames are parsed and built in frames.h (pure functions); this file owns the port,
// the lcores and the mbufs.
//
// Threading (README "DPDK server"): the main lcore is the RX lcore. It polls the rx queue(s) in
// bursts, answers ARP requests for our IP itself, drops and counts every frame that is not
// IPv4/UDP to our IP and port (frames::classify), and hands each accepted frame, mbuf and all,
// to worker `(job + shard) % workers` through that worker's single-producer/single-consumer
// rte_ring (the low word of the job id + the shard, exactly the UDP server's BPF steering; every
// job has one instance per worker lcore, JOIN_ACK shards; payloads too short to carry them go to
// worker 0, whose engine drops and counts them). Each worker lcore owns one Engine (no
// locks on the data path; a job's state machine stays single-threaded), calls handle() and
// tick(), and transmits its replies as Ethernet/IPv4/UDP frames on its own tx queue, addressed
// to the MAC the peer's frames came from (a per-worker IP -> MAC table, learned on receive).
// With workers = 0 the main lcore runs the one Engine itself (single-core mode).
//
// Rx is software demultiplexed because rte_flow is not available on the vdevs this runs on
// (af_packet, memif, ring); one rx queue (af_packet: one per queue pair, all polled by the RX
// lcore, since the kernel fans frames out over its sockets). When the device has fewer tx queues
// than lcores that transmit, lcores share tx queues under a spinlock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/servers/dpdk/frames.h"
#include "switch_offload/servers/engine_options.h"

struct rte_mempool;
struct rte_mbuf;

namespace thc::switch_offload {

// EngineOptions (engine_options.h): limits, timers, seeds, MTU, lanes and keys.
struct DpdkServerOptions : EngineOptions {
  uint32_t ip = 0;      // our IPv4 address, host byte order (required)
  uint16_t port = 9471; // UDP port
  uint16_t port_id = 0; // DPDK port
  int workers = 1;      // aggregation lcores; 0 = the main lcore aggregates itself
  bool verify_udp_checksum = true;  // false: accept frames with a wrong (e.g. unfilled offload) UDP checksum
  bool tx_udp_checksum = true;      // false: send UDP checksum 0 (allowed for IPv4)
  uint32_t idle_sleep_us = 50;      // sleep this long when a poll loop found nothing for a while; 0 = pure polling
  uint16_t rx_desc = 1024;
  uint16_t tx_desc = 1024;
  uint32_t ring_size = 4096;        // per worker, a power of two
};

class DpdkServer {
 public:
  // Needs rte_eal_init done. Checks the lcores, creates the mbuf pool and the rings, configures
  // and starts the port (frames that arrive before run() wait in the rx queue). Throws thc::Error.
  explicit DpdkServer(const DpdkServerOptions& opt);
  // Stops and closes the port, frees rings and pool. Call run() to completion first.
  ~DpdkServer();
  DpdkServer(const DpdkServer&) = delete;
  DpdkServer& operator=(const DpdkServer&) = delete;

  // Launches the workers on their lcores and runs the RX loop on the calling thread, which must be
  // the EAL main lcore, until request_stop(); returns once every worker lcore has returned.
  void run();
  // Any thread: every loop notices it within its idle sleep (well under a millisecond by default).
  void request_stop() { stop_.store(true, std::memory_order_relaxed); }

  // Engine counters summed over the workers, in stats_names() order.
  std::vector<uint64_t> stats() const;
  size_t jobs() const;
  // DPDK port counters (rte_eth_stats) and the L2/L3 / ring / tx counters of this server, in a
  // fixed order; frame_drop_* entries are present for every reason.
  std::vector<std::pair<std::string, uint64_t>> port_counters() const;
  // "name=value ..." of port_counters(), zero frame_drop_* entries left out (like stats_line).
  std::string port_stats_line() const;
  // One line about the port: driver, MAC, queues, lcores.
  std::string describe() const;
  const frames::Local& local() const { return local_; }

 private:
  struct Lane;
  struct TxQueue;
  struct RxCounters;
  class TxSink;

  void setup_port();
  void release();  // idempotent: port stopped and closed, rings and pool freed
  void rx_loop();
  static int lane_main(void* arg);
  void lane_loop(Lane& lane);
  void process(Lane& lane, rte_mbuf** pkts, unsigned n, uint64_t now);
  void transmit(TxQueue& q, rte_mbuf** pkts, unsigned n, Counter* sent, Counter* dropped);
  void idle(unsigned* idle_polls) const;

  DpdkServerOptions opt_;
  frames::Local local_;
  std::shared_ptr<Budget> budget_;
  rte_mempool* pool_ = nullptr;
  std::string driver_;
  uint16_t nb_rxq_ = 1;
  uint16_t nb_txq_ = 1;
  bool port_started_ = false;
  bool port_configured_ = false;
  std::vector<std::unique_ptr<TxQueue>> txqs_;
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::unique_ptr<RxCounters> rx_;
  std::atomic<bool> stop_{false};
  bool ran_ = false;
};

}  // namespace thc::switch_offload
