// The aggregator state machine, without sockets: datagrams in, datagrams out. One Engine serves
// the jobs of one server thread (the UDP server shards jobs over threads; see servers/udp), so
// nothing in here locks. Time is passed in, which makes the engine deterministic under test and
// fuzzing.
//
// Slot state machine (README.md "Slots"): packet seq p of a job lives in slot p % S, shadow set
// (p / S) % 2. A shadow set is Free -> Open (first packet of its use) -> Done (every member
// counted, or quorum reached at the timeout) and is reopened for p + 2S only once every worker
// has sent p + S, which proves every worker received the result of p. Done slots answer
// retransmissions with the stored result.
//
// Partial aggregation is decided per operation (op): the first slot of an op to complete fixes
// the op's members (all n, or the quorum that arrived by the timeout). Every other slot of that
// op completes exactly when its counted set equals the members, so all packets of a request carry
// one contributor set and the decode of a whole chunk uses one count. A non-member whose packet
// was added before the decision has it subtracted again when it retransmits (the payload is
// identical), which keeps the slot integer-exact.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "switch_offload/aggregator/stats.h"
#include "common/net.h"
#include "switch_offload/protocol/wire.h"

namespace thc::switch_offload {

// Limits shared by every engine of a server.
class Budget {
 public:
  Budget(int64_t max_jobs, int64_t max_bytes) : jobs_(max_jobs), bytes_(max_bytes) {}
  bool reserve(int64_t bytes);
  void release(int64_t bytes);
  int64_t jobs_left() const { return jobs_.load(); }
  int64_t bytes_left() const { return bytes_.load(); }

 private:
  std::atomic<int64_t> jobs_;
  std::atomic<int64_t> bytes_;
};

struct EngineConfig {
  uint32_t max_slots_per_job = 4096;
  uint64_t job_idle_timeout_us = 600'000'000;  // a job nobody talked to for this long is freed
  uint64_t seed = 0;                           // job seeds derive from it; 0 = random
  std::shared_ptr<Budget> budget;              // null = a private budget of 64 jobs / 1 GiB
  // Server-wide counters for STATS requests (the server sums its shards); null = this engine's.
  std::function<std::vector<uint64_t>()> stats_snapshot;
};

class Sink {
 public:
  virtual ~Sink() = default;
  virtual void send(const PeerAddr& to, const uint8_t* data, size_t len) = 0;
};

class Engine {
 public:
  Engine(const EngineConfig& cfg, Stats* stats);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One datagram from `from`. Never throws on malformed input; drops are counted in stats.
  void handle(const uint8_t* data, size_t len, const PeerAddr& from, uint64_t now_us, Sink& out);
  // Quorum timeouts and idle-job expiry. Call at least every tick_interval_us().
  void tick(uint64_t now_us, Sink& out);
  // 1 ms while some open slot may complete by timeout, else 100 ms.
  uint64_t tick_interval_us() const;

  size_t job_count() const { return jobs_.size(); }
  int64_t memory_bytes() const { return memory_; }
  Stats& stats() { return *stats_; }

 private:
  struct Job;
  struct Shadow;
  struct OpenRef {
    uint32_t job;
    uint32_t slot;
    uint8_t shadow;
    uint64_t seq;
  };

  void drop(Drop d) { stats_->drops[static_cast<int>(d)].add(); }
  void reply_error(const proto::Header& h, proto::ErrorCode code, const PeerAddr& to, Sink& out);
  void send_packet(const PeerAddr& to, const uint8_t* p, size_t n, Sink& out);
  void on_join(const proto::Header& h, const uint8_t* pl, size_t plen, const PeerAddr& from, uint64_t now, Sink& out);
  void on_table(const proto::Header& h, const uint8_t* pl, size_t plen, const PeerAddr& from, uint64_t now, Sink& out);
  void on_leave(const proto::Header& h, const PeerAddr& from, Sink& out);
  void on_stats(const proto::Header& h, const PeerAddr& from, Sink& out);
  void on_data(const proto::Header& h, const uint8_t* pl, const PeerAddr& from, uint64_t now, Sink& out);
  Job* auth(const proto::Header& h, const PeerAddr& from, Sink& out);
  void accumulate(Job& j, Shadow& sh, const proto::Header& h, const uint8_t* pl, bool subtract);
  bool try_complete(Job& j, uint32_t slot, Shadow& sh, uint64_t now, Sink& out);
  void send_result(Job& j, uint32_t slot, const Shadow& sh, uint64_t to_mask, bool resend, Sink& out);
  void free_job(uint32_t id);

  EngineConfig cfg_;
  Stats* stats_;
  std::shared_ptr<Budget> budget_;
  uint64_t seed_state_ = 0;
  std::unordered_map<uint32_t, std::unique_ptr<Job>> jobs_;
  std::vector<OpenRef> open_;
  int64_t memory_ = 0;
  uint64_t last_gc_us_ = 0;
  std::vector<uint8_t> buf_;
};

}  // namespace thc::switch_offload
