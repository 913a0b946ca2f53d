// The software aggregator over UDP ("THC-Software PS"): the engine behind sockets.
//
// Threading: N threads, each with its own SO_REUSEPORT socket on the same port and its own
// Engine. Every job has N instances ("shards", JOIN_ACK says how many): a client spreads a job's
// slots over them, and a classic BPF program attached to the reuseport group steers every
// datagram by (low 32 bits of the job id + shard) % N (header bytes 12..15 and 30..31), so each
// job instance lives on exactly one thread: the data path takes no lock and shares no cache
// line, and one job still scales over all cores. Short or garbage datagrams the program cannot
// read go to socket 0, whose engine drops and counts them.
//
// I/O is batched (common/udp_batch.h): recvmmsg with UDP GRO in, replies grouped per worker and
// sent as UDP GSO buffers with sendmmsg out.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/servers/engine_options.h"
#include "common/fault.h"
#include "common/udp_batch.h"

namespace thc::switch_offload {

// EngineOptions (engine_options.h): limits, timers, seeds, MTU, lanes and keys.
struct ServerOptions : EngineOptions {
  std::string bind = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port (see UdpServer::port())
  int threads = 1;
  int socket_buffer = 8 << 20;
  bool stats_from_loopback = true;        // STATS from 127.0.0.0/8 and ::1 without the operator key
  bool gso = true, gro = true;            // UDP segmentation offloads where the kernel has them
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
  // Whether replies go out as GSO buffers / arrive through GRO (thread 0's socket).
  bool gso() const;
  bool gro() const;
  // The sockets' batching counters (sum over threads): datagrams per system call, GSO buffers
  // sent, GRO buffers received. Read it after stop(): the threads update it unlocked.
  UdpBatchStats io_stats() const;
  void start();
  void stop();  // idempotent; joins the threads
  // Server-wide counters (sum over threads), in stats_names() order.
  std::vector<uint64_t> stats() const;
  size_t jobs() const;
  // CPU seconds the aggregation threads used so far (all threads together).
  double cpu_seconds() const;
  // The same split into user and kernel time (/proc, clock-tick resolution: 10 ms).
  void cpu_split(double* user, double* kernel) const;

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

}  // namespace thc::switch_offload
