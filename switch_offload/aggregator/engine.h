// The aggregator state machine, without sockets: datagrams in, datagrams out. One Engine serves
// the job instances one server thread owns (the servers steer every datagram of a (job, shard)
// to one thread), so nothing in here locks. Time is passed in, which makes the engine
// deterministic under test and fuzzing.
//
// Slot state machine (README.md "Slots"): packet seq p of a job lives in slot p % S, shadow set
// (p / S) % 2. A shadow set is Free -> Open (first packet of its use) -> Done (every member
// counted, or quorum reached at the timeout) and is reopened for p + 2S only once every worker of
// the job's current view has sent p + S, which proves each of them received the result of p.
// Done slots answer retransmissions with the stored result.
//
// Partial aggregation: the first slot of an op to complete fixes the op's members (the view, or
// the quorum that arrived by the timeout). Every other slot of that op completes exactly when its
// counted set equals the members, so all packets of a request carry one contributor set. The
// job's view follows the newest decision: once a straggler is left out, later slots complete as
// soon as the view is counted (no second quorum timeout) and slot reuse no longer waits for it; a
// straggler that catches up and is counted is back in the view. A straggler whose slot has been
// reused since gets ERROR left-behind and rejoins at the job's frontier (JOIN_ACK resume fields).
//
// Every datagram is authenticated (protocol/auth.h); what does not verify is dropped without a
// reply, and replies go to the address a verified, cookie-checked JOIN registered.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/net.h"
#include "switch_offload/aggregator/stats.h"
#include "switch_offload/protocol/auth.h"
#include "switch_offload/protocol/wire.h"

namespace thc::switch_offload {

// Limits shared by every engine of a server: jobs and slot memory in all, per source address, and
// per tenant (key id). With per-tenant limits whose sum is within the totals (the servers' default:
// an equal share for every tenant key), no tenant can take what another is guaranteed.
class Budget {
 public:
  // 0 for a per-tenant limit: none.
  Budget(int64_t max_jobs, int64_t max_bytes, int64_t max_jobs_per_source = 16, int64_t max_jobs_per_tenant = 0,
         int64_t max_bytes_per_tenant = 0)
      : jobs_(max_jobs), bytes_(max_bytes), per_source_(max_jobs_per_source), tenant_jobs_(max_jobs_per_tenant),
        tenant_bytes_(max_bytes_per_tenant) {}
  // A job of `bytes` created on behalf of `source` (an address without port) under tenant key id
  // `tenant`.
  bool reserve(int64_t bytes, const std::string& source, uint32_t tenant = 0);
  void release(int64_t bytes, const std::string& source, uint32_t tenant = 0);
  int64_t jobs_left() const { return jobs_.load(); }
  int64_t bytes_left() const { return bytes_.load(); }
  // A tenant's equal share of a total (the default per-tenant limit): total / tenants, at least 1.
  static int64_t share(int64_t total, size_t tenants) {
    return std::max<int64_t>(1, total / static_cast<int64_t>(std::max<size_t>(1, tenants)));
  }

 private:
  struct Use {
    int64_t jobs = 0, bytes = 0;
  };
  std::atomic<int64_t> jobs_;
  std::atomic<int64_t> bytes_;
  int64_t per_source_;
  int64_t tenant_jobs_, tenant_bytes_;
  std::mutex mu_;  // job creation and release only, never the data path
  std::map<std::string, int64_t> by_source_;
  std::map<uint32_t, Use> by_tenant_;
};

// Control-only mode for a switch data plane (thc-switchd): the engine runs the authenticated JOIN /
// CHALLENGE / TABLE / LEAVE / STATS exchange by the same rules as the software aggregator and tells
// the data plane what to install through these hooks; the data plane aggregates. The engine then
// allocates no slot state, drops data packets (Drop::kDataPlane), offers one shard and the Tofino
// profile (256 lanes, 1024-byte budget), refuses quorum jobs (k < n: partial aggregation needs
// timers a pipeline lacks) with ERROR kNotSupported, and sets kAckDataPlane in every JOIN_ACK.
struct DataPlaneJob {
  uint64_t id = 0;
  uint16_t shard = 0;
  uint16_t n = 0;
  uint32_t slots = 0;      // S: the job's window, slot indices 0..S-1 (each with two shadow sets)
  int lanes = 0;           // max lanes per packet (256)
  int payload_budget = 0;  // bytes (1024)
};
class DataPlaneHooks {
 public:
  virtual ~DataPlaneHooks() = default;
  // The first cookie-checked JOIN of a job instance creates it. kNone accepts; any other code
  // refuses that JOIN with an ERROR of the code, and no job exists.
  virtual proto::ErrorCode job_created(const DataPlaneJob& j) = 0;
  // A cookie-checked JOIN of worker w from `at`, before its JOIN_ACK is sent (so the data plane
  // admits the worker's datagrams before the worker may send any). Called for every JOIN that
  // draws a new JOIN_ACK, also a worker's JOIN from a new address (whose old admission it
  // replaces); a repeat of the worker's newest JOIN gets the same answer again without a call.
  // kNone accepts; otherwise the JOIN gets an ERROR of that code.
  virtual proto::ErrorCode worker_joined(const DataPlaneJob& j, uint16_t w, const PeerAddr& at) = 0;
  // A table installed by a JOIN or TABLE, before its acknowledgement; a retransmitted TABLE does
  // not call it again. kNone accepts; otherwise the request gets an ERROR of that code.
  virtual proto::ErrorCode table_installed(const DataPlaneJob& j, const proto::TableSpec& t) = 0;
  // The job instance was freed (every worker left, or it was idle): remove it from the data plane.
  virtual void job_freed(const DataPlaneJob& j) = 0;
};

struct EngineConfig {
  uint32_t max_slots_per_job = 4096;
  int max_lanes = proto::kMaxLanes;               // lanes per packet offered at most
  int payload_budget = proto::kPayloadBudget1500;  // the aggregator's own path: payload bytes
  uint64_t job_idle_timeout_us = 600'000'000;      // a job nobody talked to for this long is freed
  // A member of a started quorum op that sent nothing new for this long (and at least the job's
  // quorum timeout) is taken for dead: the op's stuck slots complete without it, which fails that
  // call on every rank. Well above a worker's longest retransmission timeout (200 ms by default)
  // and a scheduling hiccup, whose cost would otherwise be that failed call.
  uint64_t dead_worker_us = 1'000'000;
  uint64_t seed = 0;                               // job seeds derive from it; 0 = random
  // Mixed into every job seed, so that no seed (hence no data key) of one engine's life repeats in
  // another's, --seed or not: a datagram recorded before a restart never verifies after it. 0 = a
  // random value from the OS (what the servers use); tests and the fuzzer fix it to be replayable.
  uint64_t incarnation = 0;
  // Operator STATS nonces must exceed this (and every nonce answered since). The servers pass the
  // wall clock at start in ns, the unit of the nonces: a request recorded before a restart carries
  // an older time and draws nothing from the new process.
  uint64_t stats_nonce_floor = 0;
  std::shared_ptr<Budget> budget;                  // null = a private budget of 64 jobs / 1 GiB
  std::shared_ptr<const auth::KeyRing> keys;       // tenant keys (and operator key id 0)
  uint16_t shards = 1;                             // job instances per job (server threads)
  bool stats_from_loopback = true;                 // STATS without the operator key from 127/8, ::1
  uint64_t cookie_bucket_us = 30'000'000;
  // Control nonces remembered for jobs that no longer exist (Engine::floors_) at most; when full,
  // the cookie secret is rotated instead (no JOIN they guarded against verifies any more).
  size_t max_join_floors = size_t{1} << 16;
  // Server-wide counters for STATS requests (the server sums its shards); null = this engine's.
  std::function<std::vector<uint64_t>()> stats_snapshot;
  // Non-null: control-only mode for a data plane (see DataPlaneHooks). Not owned.
  DataPlaneHooks* data_plane = nullptr;
};

// Nanoseconds since the epoch (the unit of operator STATS nonces).
uint64_t wall_clock_ns();

// A server's budget. A per-tenant limit of 0 means an equal share of the total for every tenant
// key of the ring (Budget::share), so that the tenants' limits never add up to more than there is.
std::shared_ptr<Budget> make_server_budget(int64_t max_jobs, int64_t max_bytes, int64_t max_jobs_per_source,
                                           int64_t max_jobs_per_tenant, int64_t max_bytes_per_tenant,
                                           const auth::KeyRing& keys);

class Sink {
 public:
  virtual ~Sink() = default;
  virtual void send(const PeerAddr& to, const uint8_t* data, size_t len) = 0;
  // One datagram in two parts, head then tail: a batch's results, one payload for every
  // recipient. The tail stays valid and unchanged until the engine is next called, so a sink
  // that sends before that may point at it instead of copying it (the UDP server's GSO queue);
  // the head is valid only during the call. By default the parts are joined and sent.
  virtual void send_parts(const PeerAddr& to, const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen);
  // Called before the send_parts calls of each result: until the next call, every tail is the
  // same payload (same bytes at the same address), which a sink may prepare once (the DPDK
  // server sums its UDP checksum once per result, not per recipient); after it, a tail may sit
  // where an earlier, different payload was.
  virtual void next_payload() {}

 private:
  std::vector<uint8_t> joined_;
};

// What handle() made of a datagram (the DPDK server learns link-layer addresses by it).
enum class Handled {
  kDropped,    // malformed, unauthenticated, a replay the engine recognised, or refused silently
  kAuthentic,  // authenticated (possibly a replay of a genuine datagram)
  kJoined,     // a JOIN that passed the address cookie: its source has proven it receives there
};

// A received datagram, for Engine::handle_batch.
struct Datagram {
  const uint8_t* data;
  size_t len;
  const PeerAddr* from;
};

class Engine {
 public:
  Engine(const EngineConfig& cfg, Stats* stats);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One datagram from `from`. Never throws on malformed input; drops are counted in stats.
  Handled handle(const uint8_t* data, size_t len, const PeerAddr& from, uint64_t now_us, Sink& out);
  // A receive batch: exactly handle() on each datagram in order, but the data packets' tags are
  // computed side by side first (auth::compute_tags: several datagrams per SIMD vector). A tag
  // computed under a job's key is used only if the job still has that key when its datagram's
  // turn comes. results (optional): handle()'s answer per datagram.
  void handle_batch(const Datagram* in, size_t n, uint64_t now_us, Sink& out, Handled* results = nullptr);
  // Quorum timeouts, stuck-op recovery and idle-job expiry. Call at least every tick_interval_us().
  void tick(uint64_t now_us, Sink& out);
  // 1 ms while some open slot may complete by timeout, else 100 ms.
  uint64_t tick_interval_us() const;

  // A data plane saw traffic of this job instance: it is alive (the engine sees only control
  // traffic of a data-plane job, so its idle timeout would otherwise free a busy job). Returns
  // whether the job exists.
  bool touch(uint64_t job, uint16_t shard, uint64_t now_us);

  size_t job_count() const { return jobs_.size(); }
  int64_t memory_bytes() const { return memory_; }
  Stats& stats() { return *stats_; }

 private:
  struct Job;
  struct Shadow;
  struct JobKey {
    uint64_t id;
    uint16_t shard;
    bool operator==(const JobKey& o) const { return id == o.id && shard == o.shard; }
  };
  struct JobKeyHash {
    size_t operator()(const JobKey& k) const { return std::hash<uint64_t>()(k.id * 0x9E3779B97F4A7C15ull ^ k.shard); }
  };

  void drop(Drop d) { stats_->drops[static_cast<int>(d)].add(); }
  void send_packet(const PeerAddr& to, uint8_t* p, size_t n, const auth::TagKey* key, Sink& out);
  void reply_error(const Job* j, const proto::Header& h, proto::ErrorCode code, const auth::TagKey& key,
                   const PeerAddr& to, Sink& out);
  Handled on_join(const proto::Header& h, const uint8_t* data, size_t len, const uint8_t* pl, size_t plen,
               const PeerAddr& from, uint64_t now, Sink& out);
  Handled on_control(const proto::Header& h, const uint8_t* data, size_t len, const uint8_t* pl, size_t plen,
                  const PeerAddr& from, uint64_t now, Sink& out);
  Handled on_stats(const proto::Header& h, const uint8_t* data, size_t len, const PeerAddr& from, Sink& out);
  Handled on_data(const proto::Header& h, const uint8_t* data, size_t len, const uint8_t* pl, const PeerAddr& from,
               uint64_t now, Sink& out);
  Job* find(uint64_t id, uint16_t shard);
  void accumulate(Job& j, Shadow& sh, const proto::Header& h, const uint8_t* pl, bool subtract);
  // judge_silence: the caller is the timer, after the server read its input (only then may a
  // member's silence mean anything: packets being handled may sit in front of its newest one).
  bool try_complete(Job& j, uint32_t idx, uint64_t now, Sink& out, bool judge_silence = false);
  void complete(Job& j, uint32_t idx, uint64_t counted, bool decided_now, uint64_t now, Sink& out);
  void send_result(Job& j, uint32_t idx, uint64_t to_mask, bool resend, Sink& out);
  void send_ack_not_counted(Job& j, const proto::Header& h, Sink& out);
  void free_job(const JobKey& key, uint64_t now);
  DataPlaneJob dp_job(const Job& j) const;
  uint64_t new_seed(uint64_t job);
  // Control nonces of workers of jobs that do not exist (freed, or never created because their
  // JOIN was refused), kept while a cookie their JOINs carried can still verify (see on_join).
  struct FloorKey {
    uint64_t job;
    uint16_t shard, worker;
    bool operator==(const FloorKey& o) const { return job == o.job && shard == o.shard && worker == o.worker; }
  };
  struct FloorKeyHash {
    size_t operator()(const FloorKey& k) const {
      return std::hash<uint64_t>()(k.job * 0x9E3779B97F4A7C15ull ^ (uint64_t{k.shard} << 16 | k.worker));
    }
  };
  struct Floor {
    uint64_t nonce = 0;
    uint64_t until_us = 0;  // no cookie made before the entry was written verifies after this
    proto::ErrorCode answer = proto::ErrorCode::kNone;  // what a repeat of the nonce gets again
  };
  void remember_floor(uint64_t job, uint16_t shard, uint16_t worker, uint64_t nonce, proto::ErrorCode answer,
                      uint64_t now);
  Handled refuse_join(Job* j, const proto::Header& h, proto::ErrorCode code, Drop why, const auth::TagKey& jkey,
                      const PeerAddr& to, uint64_t now, Sink& out);
  void send_join_ack(const Job& j, const proto::Header& h, const proto::JoinAckBody& a, const PeerAddr& to, Sink& out);

  EngineConfig cfg_;
  Stats* stats_;
  std::shared_ptr<Budget> budget_;
  std::shared_ptr<const auth::KeyRing> keys_;
  auth::CookieJar cookies_;
  uint64_t seed_state_ = 0;
  uint64_t incarnation_ = 0;
  std::unordered_map<FloorKey, Floor, FloorKeyHash> floors_;
  std::unordered_map<JobKey, std::unique_ptr<Job>, JobKeyHash> jobs_;
  int64_t memory_ = 0;
  uint64_t last_gc_us_ = 0;
  uint64_t last_stats_nonce_ = 0;  // operator STATS nonces must grow (a recorded one is a replay)
  std::vector<uint8_t> buf_;
  // handle_batch's scratch (grown once, reused: no allocation per batch).
  struct PreTag {
    auth::TagKey key;  // the key the tag was computed under
    uint64_t tag = 0;
  };
  std::vector<PreTag> pre_;
  std::vector<int32_t> pre_of_;  // per datagram of the batch: its pre_ entry, or -1
  std::vector<const auth::TagKey*> pre_keys_;
  std::vector<const uint8_t*> pre_data_;
  std::vector<size_t> pre_len_;
  std::vector<uint64_t> pre_tags_;
  const PreTag* cur_pre_ = nullptr;  // the datagram being handled: its precomputed tag, if any
  // Results of a batch, signed together at its end (their payload hashes side by side too): the
  // payload and each recipient's header as they were when the result was due.
  struct PendingResult {
    auth::TagKey key;
    size_t pay_off = 0, plen = 0;
    size_t first = 0, count = 0;  // recipients [first, first + count) of pend_rcpt_
  };
  struct PendingRecipient {
    PeerAddr to;
    bool resend = false;
  };
  void flush_results(Sink& out);
  bool batching_ = false;
  std::vector<PendingResult> pend_;
  std::vector<PendingRecipient> pend_rcpt_;
  std::vector<uint8_t> pend_pay_, pend_hdr_;  // payloads back to back; kHeaderBytes per recipient
  std::vector<const auth::TagKey*> pend_keys_;
  std::vector<const uint8_t*> pend_ptrs_;
  std::vector<size_t> pend_lens_;
  std::vector<uint64_t> pend_hash_, pend_tags_;
  std::vector<uint8_t> res_hdrs_;  // send_result: the recipients' headers, tagged side by side
  std::vector<const uint8_t*> res_ptrs_;
  std::vector<uint64_t> res_tags_;
};

}  // namespace thc::switch_offload
