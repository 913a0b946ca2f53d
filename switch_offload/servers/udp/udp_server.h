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
#include "common/fault.h"
#include "common/udp_batch.h"

namespace thc::switch_offload {

struct ServerOptions {
  std::string bind = "127.0.0.1";
  uint16_t port = 0;  // 0: an ephemeral port (see UdpServer::port())
  int threads = 1;
  int max_jobs = 64;
  int64_t max_memory = int64_t{1} << 30;  // bytes of slot state over all jobs
  uint32_t max_slots = 4096;              // per job
  uint64_t job_idle_timeout_us = 600'000'000;
  uint64_t dead_worker_us = 1'000'000;  // EngineConfig::dead_worker_us
  uint64_t seed = 0;                      // 0: random job seeds (a random per-process value is mixed
                                          // into every seed anyway: none repeats after a restart)
  int socket_buffer = 8 << 20;
  int max_lanes = 8192;                   // lanes per packet offered at most (256: Tofino profile)
  int mtu = 1500;                         // the aggregator's path MTU: payload budget per packet
  int max_jobs_per_source = 16;           // jobs one source address may hold at once
  int max_jobs_per_tenant = 0;            // jobs one tenant key may hold (0: max_jobs / tenant keys)
  int64_t max_memory_per_tenant = 0;      // slot memory one tenant key may hold (0: max_memory / tenants)
  bool stats_from_loopback = true;        // STATS from 127.0.0.0/8 and ::1 without the operator key
  bool gso = true, gro = true;            // UDP segmentation offloads where the kernel has them
  std::shared_ptr<const auth::KeyRing> keys;  // tenant keys (and the operator key, id 0)
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

// Parses "123", "64K", "16M", "1G" (binary units). Returns false if malformed.
bool parse_bytes(const std::string& s, int64_t* out);

}  // namespace thc::switch_offload
