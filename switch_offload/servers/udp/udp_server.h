// The software aggregator over UDP ("THC-Software PS"): the engine behind sockets.
//
// Threading: N threads, each with its own SO_REUSEPORT socket on the same port and its own
// Engine. A classic BPF program attached to the reuseport group steers every datagram by its job
// id (header bytes 8..11) to socket job % N, so a job lives on exactly one thread: the data path
// takes no lock and shares no cache line, and a job's state machine stays single-threaded (the
// same property a Tofino pipe or a DPDK lcore gives). Scaling therefore comes from concurrent
// jobs; one job is bounded by one core. Short or garbage datagrams the program cannot read go to
// socket 0, whose engine drops and counts them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "switch_offload/aggregator/engine.h"
#include "common/fault.h"

namespace thc::switch_offload {

struct ServerOptions {
  std::string bind = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port (see UdpServer::port())
  int threads = 1;
  int max_jobs = 64;
  int64_t max_memory = int64_t{1} << 30;  // bytes of slot state over all jobs
  uint32_t max_slots = 4096;              // per job
  uint64_t job_idle_timeout_us = 600'000'000;
  uint64_t seed = 0;                      // 0: random job seeds
  int socket_buffer = 8 << 20;
  FaultOptions fault;                     // applied to received and sent datagrams
};

class UdpServer {
 public:
  // Binds every socket (throws thc::Error on failure); threads start with start().
  explicit UdpServer(const ServerOptions& opt);
  ~UdpServer();
  UdpServer(const UdpServer&) = delete;
  UdpServer& operator=(const UdpServer&) = delete;

  uint16_t port() const { return port_; }
  std::string address() const;
  // Whether the job-steering BPF program is attached (false with one thread).
  bool steering() const { return steering_; }
  void start();
  void stop();  // idempotent; joins the threads
  // Server-wide counters (sum over threads), in stats_names() order.
  std::vector<uint64_t> stats() const;
  size_t jobs() const;

 private:
  struct Shard;
  void run(Shard* s);

  ServerOptions opt_;
  uint16_t port_ = 0;
  bool steering_ = false;
  std::shared_ptr<Budget> budget_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<bool> stop_{false};
  bool started_ = false;
};

// Parses "123", "64K", "16M", "1G" (binary units). Returns false if malformed.
bool parse_bytes(const std::string& s, int64_t* out);

}  // namespace thc::switch_offload
