// Aggregator counters. Each engine (one per server thread) is the single writer of its Stats;
// the stats printer and STATS requests read them from other threads, hence relaxed atomics
// updated with load+store (no locked read-modify-write on the data path).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace thc::switch_offload {

// Why a datagram was dropped. The first six mirror proto::ParseError. Appended only: the order is
// the STATS_REPLY layout.
enum class Drop : int {
  kTruncated = 0,
  kBadMagic,
  kBadVersion,
  kBadType,
  kBadField,
  kBadLength,
  kWrongDirection,  // a downstream type (RESULT, ACK, ...) sent to the aggregator
  kUnknownJob,
  kBadTag,          // the authentication tag does not verify (or no key for the job's key id)
  kBadWorker,       // worker >= n, n differs from the job's, not joined, or left
  kBadSlot,         // slot index >= the job's slots, or slot/shadow inconsistent with seq
  kStale,           // seq older than the slot's current use (a delayed duplicate)
  kSlotBusy,        // next use of a shadow set before every worker moved past the previous one
  kMismatch,        // op/type/encoding/count differ from the slot's current use
  kNoTable,         // index packet for a table id not installed (or with other b / sum type)
  kNoResources,     // join refused: --max-jobs or --max-memory
  kConfigMismatch,  // join parameters differ from the existing job's
  kFault,           // server-side fault injection
  kReplay,          // a control request not newer than the worker's last one (a repeat draws its
                    // answer again), a copy of an answered data attempt, an old STATS nonce
  kCookie,          // JOIN without a valid address cookie (answered with CHALLENGE)
  kStatsDenied,     // STATS neither from loopback nor tagged with the operator key
  kBadLanes,        // lanes differ from what the job negotiated for the packet's encoding
  kJobBusy,         // a restarted worker's JOIN while the job's earlier run still holds it
  kNotSupported,    // join refused by a data-plane engine (quorum job, other profile, no route)
  kDataPlane,       // a data packet reached a control-only engine (the data plane aggregates)
  kCount
};
const char* drop_name(Drop d);

struct Counter {
  std::atomic<uint64_t> v{0};
  void add(uint64_t n = 1) { v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  uint64_t get() const { return v.load(std::memory_order_relaxed); }
};

struct Stats {
  Counter rx_packets, rx_bytes, tx_packets, tx_bytes;
  Counter elements;             // lanes added into slots (lookups or values)
  Counter slots_completed, partial_completions;
  Counter results_sent;
  Counter retransmissions;      // data packets flagged as retransmissions by their sender
  Counter duplicates;           // data from a worker already counted in an open slot
  Counter result_resends;       // results re-sent for a completed slot (lost downstream)
  Counter late_not_counted;     // workers told they were not counted
  Counter retractions;          // contributions removed from a slot (worker excluded from the op)
  Counter left_behind;          // stragglers told their slot was reused (they rejoin)
  Counter stuck_completions;    // slots of a decided op completed without a member that stopped
  Counter challenges;           // CHALLENGE replies (JOINs without a valid cookie)
  Counter jobs_created, jobs_freed, jobs_expired;
  Counter jobs_replaced;        // dead instances (every worker restarted) replaced by a new one
  Counter tx_errors;            // sendmsg failures (full socket buffer)
  Counter drops[static_cast<int>(Drop::kCount)];
};

// A flat, ordered snapshot (the STATS_REPLY payload and the printed line use the same order).
std::vector<std::string> stats_names();
std::vector<uint64_t> stats_values(const Stats& s);
// Element-wise sum of snapshots (server-wide view over the shards).
void stats_accumulate(std::vector<uint64_t>* acc, const std::vector<uint64_t>& v);
std::string stats_line(const std::vector<uint64_t>& v);
// Value of a named counter in a snapshot (tests); UINT64_MAX if the name is unknown.
uint64_t stats_get(const std::vector<uint64_t>& v, const std::string& name);

}  // namespace thc::switch_offload
