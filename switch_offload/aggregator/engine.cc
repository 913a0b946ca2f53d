#include "switch_offload/aggregator/engine.h"

#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <limits>
#include <random>

#include "common/fault.h"
#include "switch_offload/aggregator/lanes.h"

namespace thc::switch_offload {

using proto::ErrorCode;
using proto::Header;
using proto::MsgType;
using proto::WireInt;

namespace {
constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();
constexpr uint8_t kFree = 0, kOpen = 1, kDone = 2;
constexpr uint64_t kGcIntervalUs = 1'000'000;

int popcount(uint64_t v) { return __builtin_popcountll(v); }
uint64_t all_mask(int n) { return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1; }

// The source's address without its port: what per-source limits count.
std::string host_of(const PeerAddr& a) {
  const std::string s = a.str();
  const size_t colon = s.rfind(':');
  return colon == std::string::npos ? s : s.substr(0, colon);
}

bool is_loopback(const PeerAddr& a) {
  if (a.ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a.ss);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a.ss);
    static const uint8_t lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    return std::memcmp(in6->sin6_addr.s6_addr, lo, 16) == 0;
  }
  return false;
}
}  // namespace

uint64_t wall_clock_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::shared_ptr<Budget> make_server_budget(int64_t max_jobs, int64_t max_bytes, int64_t max_jobs_per_source,
                                           int64_t max_jobs_per_tenant, int64_t max_bytes_per_tenant,
                                           const auth::KeyRing& keys) {
  const size_t tenants = keys.size() - (keys.find(auth::kOperatorKeyId) ? 1 : 0);
  return std::make_shared<Budget>(max_jobs, max_bytes, max_jobs_per_source,
                                  max_jobs_per_tenant > 0 ? max_jobs_per_tenant : Budget::share(max_jobs, tenants),
                                  max_bytes_per_tenant > 0 ? max_bytes_per_tenant : Budget::share(max_bytes, tenants));
}

bool Budget::reserve(int64_t bytes, const std::string& source, uint32_t tenant) {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t& mine = by_source_[source];
  Use& t = by_tenant_[tenant];
  if (mine >= per_source_ || jobs_.load() <= 0 || bytes_.load() < bytes || (tenant_jobs_ > 0 && t.jobs >= tenant_jobs_) ||
      (tenant_bytes_ > 0 && t.bytes + bytes > tenant_bytes_)) {
    if (mine == 0) by_source_.erase(source);
    if (t.jobs == 0) by_tenant_.erase(tenant);
    return false;
  }
  ++mine;
  ++t.jobs;
  t.bytes += bytes;
  jobs_.fetch_sub(1);
  bytes_.fetch_sub(bytes);
  return true;
}

void Budget::release(int64_t bytes, const std::string& source, uint32_t tenant) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_source_.find(source);
  if (it != by_source_.end() && --it->second <= 0) by_source_.erase(it);
  auto t = by_tenant_.find(tenant);
  if (t != by_tenant_.end()) {
    t->second.bytes -= bytes;
    if (--t->second.jobs <= 0) by_tenant_.erase(t);
  }
  bytes_.fetch_add(bytes);
  jobs_.fetch_add(1);
}

struct Engine::Shadow {
  uint64_t seq = kEmpty;
  uint64_t counted = 0;  // workers whose contribution is in the lanes
  uint64_t seen = 0;     // workers that sent this packet at all (counted or not)
  uint64_t t_open = 0;
  uint32_t op = 0;
  uint16_t count = 0;
  uint16_t lanes = 0;
  MsgType type = MsgType::kDataValue;
  WireInt enc = WireInt::kNone;
  uint8_t bits = 0;
  uint8_t table = 0;
  uint8_t state = kFree;
  uint8_t rw = 4;            // register width in bytes: the sum type's (4 for the MAX prelude)
  // The registers hold nothing of this use yet (stale bytes of an earlier one): the first
  // contribution writes them instead of being added to zeros (lanes::set_*), and a result of
  // none (zero contributors) zeroes them first.
  bool fresh = false;
  // Per worker: the newest attempt number seen (valid for the workers in `seen`), and the newest
  // one answered (valid for the workers in `answered_any`). A finished slot answers a packet only
  // for an attempt it has not answered yet: a recorded packet replayed (whatever its source) draws
  // no more than the one reply its genuine copy drew. Every attempt number the header carries
  // (0..65535) has its own value.
  uint64_t answered_any = 0;
  uint16_t seen_attempt[proto::kMaxWorkers] = {};
  uint16_t answered[proto::kMaxWorkers] = {};
  uint8_t* reg = nullptr;    // job.reg_bytes of registers, each up to 4 bytes wide (lanes.h)
};

namespace {
// An op's ring entry: its membership decision, and where it starts (for rejoining workers).
struct OpRecord {
  uint32_t op = 0;
  bool used = false;
  bool decided = false;
  bool first_known = false;
  bool is_max = false;  // a MAX op: the prelude that starts every collective call (a rejoin point)
  uint64_t members = 0;
  uint64_t first_seq = 0;
};
struct Table {
  bool valid = false;
  uint8_t bits = 0;
  WireInt sum = WireInt::kNone;
  int32_t values[proto::kMaxTableEntries] = {};
};
struct OpenRef {
  uint32_t idx;  // slot * 2 + shadow
  uint64_t seq;
};
}  // namespace

struct Engine::Job {
  JobKey key{};
  auth::TagKey jkey, dkey;
  uint16_t n = 0, k = 0;
  uint32_t qt_us = 0;
  uint32_t S = 0;
  int L = 0;            // max lanes per packet
  int budget = 0;       // payload budget, bytes
  uint64_t all = 0;
  uint64_t joined = 0, left = 0;
  uint64_t view = 0;    // workers the job currently waits for (see engine.h)
  uint64_t rejoin_pending = 0;  // rejoining workers, added to the view at the next call's prelude
  uint64_t rejoined = 0;        // workers that came back at resume_seq (they never send earlier seqs)
  uint64_t resume_seq[proto::kMaxWorkers] = {};

  // The view members a packet of `seq` waits for: a worker that rejoined after it never sends it.
  uint64_t needed(uint64_t seq) const {
    uint64_t need = view;
    for (uint64_t m = rejoined & view; m; m &= m - 1) {
      const int w = __builtin_ctzll(m);
      if (resume_seq[w] > seq) need &= ~(uint64_t{1} << w);
    }
    return need;
  }
  uint64_t seed = 0;
  uint64_t last_active = 0;  // last genuine new request or first copy of a data packet (idle expiry)
  int64_t footprint = 0;
  std::string source;   // creator's host, for the per-source budget
  uint32_t tenant = 0;  // key id, for the per-tenant budget
  int reg_bytes = 0;    // registers per shadow set: what the widest packet of the job can fill
  PeerAddr peer[proto::kMaxWorkers];
  // Control requests (JOIN, TABLE, LEAVE), one rule for all: per worker, the newest nonce acted
  // upon (valid in `floor_set`) and its answer. A request under a newer nonce is acted upon; the
  // same nonce again (a retransmission whose answer was lost, or a recording) draws that answer
  // again and changes nothing, liveness included; an older one draws nothing.
  uint64_t floor_set = 0;
  uint64_t ctl_nonce[proto::kMaxWorkers] = {};
  struct Answer {
    MsgType type = MsgType::kError;  // kJoinAck, kTableAck, kLeaveAck, or kError (with `error`)
    ErrorCode error = ErrorCode::kNone;
    proto::JoinAckBody ack;
  };
  Answer answer[proto::kMaxWorkers];
  // Workers that joined and later sent a fresh JOIN while the job ran: their earlier lives are
  // over (a live client sends one fresh JOIN per life; a lost JOIN_ACK is retransmitted under the
  // same nonce, a rejoin carries REJOIN). See on_join.
  uint64_t restarted = 0;
  uint64_t heard[proto::kMaxWorkers] = {};  // last time a genuine new packet came from each worker
  Table tables[proto::kTableIds];
  // Two shadow sets per slot: while one holds a finished result that slow workers may still
  // ask for, the other takes the next use of the slot.
  std::vector<Shadow> shadows;  // [slot * 2 + shadow]
  std::vector<uint8_t> regs;    // [(slot * 2 + shadow) * L * 4 + lane * rw]
  // Op records, a ring indexed by op % size. Ops in flight among the view span at most 2S
  // packets (a shadow set is not reused before every view member passed it), hence at most 2S
  // ops: 4S entries never alias a live op.
  std::vector<OpRecord> ops;
  std::vector<OpenRef> open;  // this job's open shadow sets (stale entries are pruned in tick)
  bool any_op = false;
  uint32_t max_op = 0;        // newest op any worker sent
  uint64_t last_decided_op = 0;
  bool any_decided = false;

  Shadow& sh(uint32_t idx) { return shadows[idx]; }
  OpRecord* find_op(uint32_t op) {
    OpRecord& r = ops[op % ops.size()];
    return r.used && r.op == op ? &r : nullptr;
  }
  OpRecord& op_entry(uint32_t op) {
    OpRecord& r = ops[op % ops.size()];
    if (!r.used || r.op != op) r = OpRecord{op, true, false, false, false, 0, 0};
    return r;
  }
  // Register bytes per shadow set for lanes L and a payload budget: the most any packet's sums can
  // fill. A RESULT of lanes x w-byte sums fits the budget (lanes_for), so this is at most the
  // budget, never L x 4 bytes a packet could not carry.
  static int register_bytes(int L, int budget) {
    int most = 0;
    for (WireInt e : {WireInt::kU8, WireInt::kU16, WireInt::kU32})
      most = std::max<int>(most, proto::lanes_for(MsgType::kDataValue, e, 0, L, budget) * static_cast<int>(proto::wire_int_bytes(e)));
    return std::max<int>(most, proto::lanes_for(MsgType::kDataMax, WireInt::kU32, 0, L, budget) * 4);
  }
  static int64_t footprint_for(uint32_t S, int reg_bytes) {
    return static_cast<int64_t>(sizeof(Job) + S * 2ull * (sizeof(Shadow) + static_cast<uint64_t>(reg_bytes)) +
                                S * 4ull * sizeof(OpRecord));
  }
};

Engine::Engine(const EngineConfig& cfg, Stats* stats)
    : cfg_(cfg), stats_(stats), budget_(cfg.budget), keys_(cfg.keys), cookies_(cfg.cookie_bucket_us) {
  if (!budget_) budget_ = std::make_shared<Budget>(64, int64_t{1} << 30);
  if (!keys_) keys_ = std::make_shared<auth::KeyRing>();
  if (cfg_.shards < 1) cfg_.shards = 1;
  if (cfg_.data_plane) {
    // What a switch pipeline takes (switch_offload/p4/CONTRACT.md): one instance, the Tofino profile.
    cfg_.shards = 1;
    cfg_.max_lanes = proto::kTofinoLanes;
    cfg_.payload_budget = proto::kTofinoPayloadBudget;
  }
  cfg_.max_lanes = std::clamp(cfg_.max_lanes - cfg_.max_lanes % proto::kLaneQuantum, proto::kLaneQuantum, proto::kMaxLanes);
  cfg_.payload_budget = std::clamp(cfg_.payload_budget, proto::kLaneQuantum / 2, proto::kMaxPayloadBudget);
  std::random_device rd;
  auto random64 = [&] { return (static_cast<uint64_t>(rd()) << 32) ^ rd(); };
  seed_state_ = cfg.seed ? cfg.seed : random64();
  incarnation_ = cfg.incarnation ? cfg.incarnation : random64();
  last_stats_nonce_ = cfg.stats_nonce_floor;
  buf_.resize(proto::kMaxPacketBytes + 64);
}

Engine::~Engine() {
  for (auto& kv : jobs_) budget_->release(kv.second->footprint, kv.second->source, kv.second->tenant);
}

uint64_t Engine::new_seed(uint64_t job) {
  uint64_t s = seed_state_ ^ (job * 0x9E3779B97F4A7C15ull) ^ stats_->jobs_created.get();
  // The incarnation goes into every seed: a fixed --seed repeats the sequence of one life only.
  uint64_t v = splitmix64(s) ^ incarnation_;
  v = splitmix64(v);
  seed_state_ = s;
  return v ? v : 1;
}

Engine::Job* Engine::find(uint64_t id, uint16_t shard) {
  auto it = jobs_.find(JobKey{id, shard});
  return it == jobs_.end() ? nullptr : it->second.get();
}

void Sink::send_parts(const PeerAddr& to, const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen) {
  joined_.resize(hlen + tlen);
  std::memcpy(joined_.data(), head, hlen);
  if (tlen) std::memcpy(joined_.data() + hlen, tail, tlen);
  send(to, joined_.data(), joined_.size());
}

void Engine::send_packet(const PeerAddr& to, uint8_t* p, size_t n, const auth::TagKey* key, Sink& out) {
  if (key) auth::sign(*key, p, n);
  stats_->tx_packets.add();
  stats_->tx_bytes.add(n);
  out.send(to, p, n);
}

void Engine::reply_error(const Job* j, const Header& h, ErrorCode code, const auth::TagKey& key, const PeerAddr& to,
                         Sink& out) {
  Header r;
  r.type = MsgType::kError;
  r.job = h.job;
  r.shard = h.shard;
  r.worker = h.worker < proto::kMaxWorkers ? h.worker : 0;
  r.nworkers = j ? j->n : (h.nworkers <= proto::kMaxWorkers ? h.nworkers : 0);
  r.slot = h.slot;
  r.shadow = h.shadow;
  r.seq = h.seq;
  r.op = h.op;
  r.aux = static_cast<uint32_t>(code);
  uint8_t b[proto::kHeaderBytes];
  proto::write_header(r, b, sizeof b);
  send_packet(to, b, sizeof b, &key, out);
}

void Engine::handle_batch(const Datagram* in, size_t n, uint64_t now, Sink& out, Handled* results) {
  if (pre_of_.size() < n) {
    pre_of_.resize(n);
    pre_.resize(n);
    pre_keys_.resize(n);
    pre_data_.resize(n);
    pre_len_.resize(n);
    pre_tags_.resize(n);
  }
  // Data packets of jobs that exist: their tags under the job's current data key, side by side.
  size_t m = 0;
  uint64_t last_id = 0;
  uint16_t last_shard = 0;
  Job* last = nullptr;
  for (size_t i = 0; i < n; ++i) {
    pre_of_[i] = -1;
    const uint8_t* d = in[i].data;
    if (cfg_.data_plane || in[i].len < proto::kHeaderBytes) continue;
    const auto type = static_cast<MsgType>(d[5]);
    if (type != MsgType::kDataValue && type != MsgType::kDataIndex && type != MsgType::kDataMax) continue;
    const uint64_t id = proto::load_be64(d + 8);
    const uint16_t shard = proto::load_be16(d + 30);
    if (!last || id != last_id || shard != last_shard) {
      last = find(id, shard);
      last_id = id;
      last_shard = shard;
    }
    if (!last) continue;
    pre_of_[i] = static_cast<int32_t>(m);
    pre_[m].key = last->dkey;
    pre_keys_[m] = &pre_[m].key;
    pre_data_[m] = d;
    pre_len_[m] = in[i].len;
    ++m;
  }
  if (m > 1) {
    auth::compute_tags(pre_keys_.data(), pre_data_.data(), pre_len_.data(), m, pre_tags_.data());
    for (size_t k = 0; k < m; ++k) pre_[k].tag = pre_tags_[k];
  }
  batching_ = n > 1;
  for (size_t i = 0; i < n; ++i) {
    // A single data packet is verified as handle() does (no vector to fill).
    cur_pre_ = m > 1 && pre_of_[i] >= 0 ? &pre_[static_cast<size_t>(pre_of_[i])] : nullptr;
    const Handled r = handle(in[i].data, in[i].len, *in[i].from, now, out);
    if (results) results[i] = r;
  }
  cur_pre_ = nullptr;
  batching_ = false;
  flush_results(out);
}

void Engine::flush_results(Sink& out) {
  const size_t nr = pend_.size(), nh = pend_rcpt_.size();
  if (!nr) return;
  if (pend_keys_.size() < nh) {
    pend_keys_.resize(nh);
    pend_ptrs_.resize(nh);
    pend_lens_.resize(nh);
    pend_hash_.resize(nh);
    pend_tags_.resize(nh);
  }
  for (size_t i = 0; i < nr; ++i) {
    pend_keys_[i] = &pend_[i].key;
    pend_ptrs_[i] = pend_pay_.data() + pend_[i].pay_off;
    pend_lens_[i] = pend_[i].plen;
  }
  auth::payload_hashes(pend_keys_.data(), pend_ptrs_.data(), pend_lens_.data(), nr, pend_hash_.data());
  // Per recipient: its result's key and payload hash (pend_lens_ is free again: it holds the hash).
  for (size_t i = 0; i < nr; ++i)
    for (size_t k = pend_[i].first; k < pend_[i].first + pend_[i].count; ++k) pend_lens_[k] = i;
  for (size_t k = 0; k < nh; ++k) pend_ptrs_[k] = pend_hdr_.data() + k * proto::kHeaderBytes;
  for (size_t k = nh; k-- > 0;) {
    // Backwards: pend_keys_[k] / pend_hash_[k] for k >= nr are free; below, [result] is read first.
    const size_t res = pend_lens_[k];
    pend_keys_[k] = &pend_[res].key;
    pend_hash_[k] = pend_hash_[res];
  }
  auth::tags_from_hashes(pend_keys_.data(), pend_ptrs_.data(), pend_hash_.data(), nh, pend_tags_.data());
  for (size_t i = 0; i < nr; ++i) {
    const PendingResult& pr = pend_[i];
    // Every recipient's header, then the one payload: pend_pay_ is not touched again before the
    // next call into the engine (clear() keeps the bytes), which is what send_parts promises.
    const uint8_t* pay = pend_pay_.data() + pr.pay_off;
    out.next_payload();
    for (size_t k = pr.first; k < pr.first + pr.count; ++k) {
      uint8_t* hdr = pend_hdr_.data() + k * proto::kHeaderBytes;
      proto::store_be64(hdr + proto::kTagOffset, pend_tags_[k]);
      stats_->tx_packets.add();
      stats_->tx_bytes.add(proto::kHeaderBytes + pr.plen);
      out.send_parts(pend_rcpt_[k].to, hdr, proto::kHeaderBytes, pay, pr.plen);
      stats_->results_sent.add();
      if (pend_rcpt_[k].resend) stats_->result_resends.add();
    }
  }
  pend_.clear();
  pend_rcpt_.clear();
  pend_pay_.clear();
  pend_hdr_.clear();
}

Handled Engine::handle(const uint8_t* data, size_t len, const PeerAddr& from, uint64_t now, Sink& out) {
  stats_->rx_packets.add();
  stats_->rx_bytes.add(len);
  Header h;
  const uint8_t* pl = nullptr;
  size_t plen = 0;
  const proto::ParseError e = proto::parse(data, len, &h, &pl, &plen);
  if (e != proto::ParseError::kOk) {
    // No reply of any kind: an unauthenticated source learns nothing (not even our version).
    drop(static_cast<Drop>(static_cast<int>(e) - 1));
    return Handled::kDropped;
  }
  if (h.shard >= cfg_.shards) {
    drop(Drop::kBadField);
    return Handled::kDropped;
  }
  switch (h.type) {
    case MsgType::kJoin: return on_join(h, data, len, pl, plen, from, now, out);
    case MsgType::kTable:
    case MsgType::kLeave: return on_control(h, data, len, pl, plen, from, now, out);
    case MsgType::kStats: return on_stats(h, data, len, from, out);
    case MsgType::kDataValue:
    case MsgType::kDataIndex:
    case MsgType::kDataMax:
      if (cfg_.data_plane) {
        drop(Drop::kDataPlane);
        return Handled::kDropped;
      }
      return on_data(h, data, len, pl, from, now, out);
    default: drop(Drop::kWrongDirection); return Handled::kDropped;
  }
}

void Engine::remember_floor(uint64_t job, uint16_t shard, uint16_t worker, uint64_t nonce, ErrorCode answer,
                            uint64_t now) {
  const FloorKey k{job, shard, worker};
  auto it = floors_.find(k);
  if (it == floors_.end() && floors_.size() >= cfg_.max_join_floors) {
    // Full (a key holder creating and refusing jobs at a high rate): forget every floor and take a
    // new cookie secret, so that no JOIN they protected against (nor this one) verifies any more.
    // Workers in the middle of joining get one more CHALLENGE.
    floors_.clear();
    cookies_.rotate();
    return;
  }
  Floor& f = it == floors_.end() ? floors_[k] : it->second;
  if (nonce >= f.nonce) {
    f.nonce = nonce;
    f.answer = answer;
  }
  f.until_us = cookies_.valid_until(now);
}

void Engine::send_join_ack(const Job& j, const Header& h, const proto::JoinAckBody& a, const PeerAddr& to, Sink& out) {
  Header r;
  r.type = MsgType::kJoinAck;
  r.job = j.key.id;
  r.shard = h.shard;
  r.worker = h.worker;
  r.nworkers = j.n;
  r.seq = h.seq;
  uint8_t* p = buf_.data();
  size_t n = proto::write_header(r, p, buf_.size());
  n += proto::write_join_ack(a, p + n, buf_.size() - n);
  send_packet(to, p, n, &j.jkey, out);
}

Handled Engine::refuse_join(Job* j, const Header& h, ErrorCode code, Drop why, const auth::TagKey& jkey, const PeerAddr& to,
                            uint64_t now, Sink& out) {
  drop(why);
  // The refusal is this nonce's answer: a repeat gets it again, an older JOIN nothing, and a
  // replay can never turn it into a job later (when resources are free, or the job is gone).
  if (j) {
    const uint64_t bit = uint64_t{1} << h.worker;
    j->floor_set |= bit;
    j->ctl_nonce[h.worker] = h.seq;
    j->answer[h.worker].type = MsgType::kError;
    j->answer[h.worker].error = code;
  } else {
    remember_floor(h.job, h.shard, h.worker, h.seq, code, now);
  }
  reply_error(j, h, code, jkey, to, out);
  return Handled::kAuthentic;
}

Handled Engine::on_join(const Header& h, const uint8_t* data, size_t len, const uint8_t* pl, size_t plen,
                     const PeerAddr& from, uint64_t now, Sink& out) {
  const uint32_t kid = proto::job_key_id(h.job);
  const auth::Key* tenant = kid == auth::kOperatorKeyId ? nullptr : keys_->find(kid);
  Job* j = find(h.job, h.shard);
  // The join key is derived from the tenant key; an existing job has it at hand.
  auth::TagKey jkey;
  if (j) {
    jkey = j->jkey;
  } else if (tenant) {
    jkey = auth::join_key(*tenant, h.job);
  } else {
    drop(Drop::kBadTag);
    return Handled::kDropped;
  }
  if (!auth::verify(jkey, data, len)) {
    drop(Drop::kBadTag);
    return Handled::kDropped;
  }
  proto::JoinBody b;
  const proto::ParseError e = proto::parse_join(pl, plen, h.nworkers, &b);
  if (e != proto::ParseError::kOk) {
    drop(static_cast<Drop>(static_cast<int>(e) - 1));
    return Handled::kAuthentic;
  }
  // Return routability: only a JOIN carrying the cookie of its own source address changes state,
  // so a replayed JOIN from a spoofed address cannot redirect a worker's results.
  if (!cookies_.check(&from.ss, from.len, h.job, h.worker, now, b.cookie)) {
    drop(Drop::kCookie);
    Header r;
    r.type = MsgType::kChallenge;
    r.job = h.job;
    r.shard = h.shard;
    r.worker = h.worker;
    r.nworkers = h.nworkers;
    r.seq = h.seq;
    uint8_t* p = buf_.data();
    size_t n = proto::write_header(r, p, buf_.size());
    cookies_.make(&from.ss, from.len, h.job, h.worker, now, p + n);
    n += proto::kCookieBytes;
    stats_->challenges.add();
    send_packet(from, p, n, &jkey, out);  // smaller than the JOIN it answers
    return Handled::kAuthentic;
  }
  const uint64_t bit = uint64_t{1} << h.worker;
  // The control rule (Job::floor_set): a worker's request nonces grow over all its lives (a
  // restarted worker's start from the clock). The floor is the job's, or, for a worker of a job
  // freed lately or a JOIN refused without a job, the one remembered while its cookie can verify:
  // a replayed JOIN can neither re-create a finished job nor turn an old refusal into a job.
  {
    bool have = false;
    uint64_t floor = 0;
    const Job::Answer* ans = nullptr;
    ErrorCode remembered = ErrorCode::kNone;
    if (j && (j->floor_set & bit)) {
      have = true;
      floor = j->ctl_nonce[h.worker];
      ans = &j->answer[h.worker];
    }
    auto fit = floors_.find(FloorKey{h.job, h.shard, h.worker});
    if (fit != floors_.end() && fit->second.until_us > now && (!have || fit->second.nonce > floor)) {
      have = true;
      floor = fit->second.nonce;
      ans = nullptr;
      remembered = fit->second.answer;
    }
    if (have && h.seq <= floor) {
      if (h.seq == floor && ans && ans->type == MsgType::kJoinAck) {
        send_join_ack(*j, h, ans->ack, from, out);  // no larger than the JOIN (wire.h)
        return Handled::kAuthentic;  // not kJoined: a recording proves nothing about its source
      }
      const ErrorCode again = ans ? (ans->type == MsgType::kError ? ans->error : ErrorCode::kNone) : remembered;
      if (h.seq == floor && again != ErrorCode::kNone) {
        reply_error(j, h, again, jkey, from, out);
        return Handled::kAuthentic;
      }
      drop(Drop::kReplay);
      return Handled::kAuthentic;
    }
  }
  if (j && !(b.flags & proto::kJoinRejoin) && (j->joined & ~j->left & bit) && j->any_op) {
    // A worker of this instance sends a fresh JOIN while the instance runs: it restarted, and its
    // calls start at op 0, which the instance is past. Once every worker of the instance has
    // restarted (or left), the instance is dead and a new incarnation replaces it (new seed: nothing
    // of the old one verifies in it); until then the JOIN is refused as busy, and the worker asks
    // again (a run restarted after a crash comes back one worker at a time).
    j->restarted |= bit;
    if ((j->joined & ~j->left & ~j->restarted) != 0)
      return refuse_join(j, h, ErrorCode::kJobBusy, Drop::kJobBusy, jkey, from, now, out);
    stats_->jobs_replaced.add();
    free_job(j->key, now);
    j = nullptr;
  }
  if (!j) {
    const uint32_t S = std::max<uint32_t>(1, std::min<uint32_t>({b.slots, cfg_.max_slots_per_job,
                                                                 static_cast<uint32_t>(proto::kMaxSlots)}));
    const int budget = std::min<int>(b.payload_budget, cfg_.payload_budget);
    // Lanes beyond what the payload budget carries in any encoding would be registers no packet
    // fills: the job gets (and is charged for) what its packets can use.
    const int L = proto::lanes_for(MsgType::kDataValue, WireInt::kU8, 0, std::min<int>(b.max_lanes, cfg_.max_lanes), budget);
    const int reg_bytes = Job::register_bytes(L, budget);
    // A data-plane job keeps its slots in the switch's registers (and its ops, which only data
    // packets create, never get here): none here.
    const int64_t fp = cfg_.data_plane ? static_cast<int64_t>(sizeof(Job)) : Job::footprint_for(S, reg_bytes);
    const std::string src = host_of(from);
    if (cfg_.data_plane && (b.quorum < h.nworkers || L != proto::kTofinoLanes || budget < proto::kTofinoPayloadBudget))
      return refuse_join(nullptr, h, ErrorCode::kNotSupported, Drop::kNotSupported, jkey, from, now, out);
    if (L < proto::kLaneQuantum || !budget_->reserve(fp, src, kid))
      return refuse_join(nullptr, h, ErrorCode::kNoResources, Drop::kNoResources, jkey, from, now, out);
    auto nj = std::make_unique<Job>();
    nj->key = JobKey{h.job, h.shard};
    nj->jkey = jkey;
    nj->n = h.nworkers;
    nj->k = b.quorum;
    nj->qt_us = b.quorum_timeout_us;
    nj->S = S;
    nj->L = L;
    nj->budget = budget;
    nj->reg_bytes = reg_bytes;
    nj->all = all_mask(h.nworkers);
    nj->view = nj->all;
    nj->seed = new_seed(h.job);
    nj->dkey = auth::data_key(*tenant, h.job, nj->seed);
    nj->footprint = fp;
    nj->source = src;
    nj->tenant = kid;
    if (!cfg_.data_plane) {
      nj->shadows.resize(S * 2u);
      nj->regs.assign(S * 2ull * static_cast<uint64_t>(reg_bytes), 0);
      for (uint32_t i = 0; i < S * 2u; ++i)
        nj->shadows[i].reg = nj->regs.data() + static_cast<uint64_t>(i) * static_cast<uint64_t>(reg_bytes);
      nj->ops.resize(S * 4ull);
    } else {
      const ErrorCode ec = cfg_.data_plane->job_created(dp_job(*nj));
      if (ec != ErrorCode::kNone) {
        budget_->release(fp, src, kid);
        return refuse_join(nullptr, h, ec, ec == ErrorCode::kNoResources ? Drop::kNoResources : Drop::kNotSupported,
                           jkey, from, now, out);
      }
    }
    memory_ += fp;
    stats_->jobs_created.add();
    j = nj.get();
    jobs_.emplace(nj->key, std::move(nj));
  } else if (h.nworkers != j->n || b.quorum != j->k || b.quorum_timeout_us != j->qt_us || b.max_lanes < j->L ||
             b.payload_budget < j->budget) {
    return refuse_join(j, h, ErrorCode::kConfigMismatch, Drop::kConfigMismatch, jkey, from, now, out);
  }
  if (cfg_.data_plane) {
    // The data plane admits the worker (and holds the JOIN's table) before the JOIN_ACK lets it send.
    ErrorCode ec = cfg_.data_plane->worker_joined(dp_job(*j), h.worker, from);
    if (ec == ErrorCode::kNone && b.table.bits) ec = cfg_.data_plane->table_installed(dp_job(*j), b.table);
    if (ec != ErrorCode::kNone) {
      const Drop why = ec == ErrorCode::kNoResources ? Drop::kNoResources : Drop::kNotSupported;
      if (j->joined) return refuse_join(j, h, ec, why, jkey, from, now, out);
      free_job(j->key, now);  // created by this JOIN, held by nobody
      return refuse_join(nullptr, h, ec, why, jkey, from, now, out);
    }
  }
  j->joined |= bit;
  j->left &= ~bit;
  j->peer[h.worker] = from;
  j->heard[h.worker] = now;
  j->last_active = now;
  if (b.table.bits) {
    Table& t = j->tables[b.table.id];
    t.valid = true;
    t.bits = b.table.bits;
    t.sum = b.table.sum;
    std::memcpy(t.values, b.table.values, sizeof t.values);
  }
  proto::JoinAckBody a;
  a.seed = j->seed;
  a.slots = static_cast<uint16_t>(j->S);
  a.max_lanes = static_cast<uint16_t>(j->L);
  a.payload_budget = static_cast<uint16_t>(j->budget);
  a.nworkers = j->n;
  a.quorum = j->k;
  a.shards = cfg_.shards;
  a.quorum_timeout_us = j->qt_us;
  if (!(b.flags & proto::kJoinRejoin) || !j->any_op) {
    a.resume_flags = proto::kResumeKnown;  // from the start: op 0 at seq 0
  } else {
    // A worker rejoining a job under way (left behind) comes back at the start of a collective
    // call, i.e. at a MAX op (every call begins with its prelude): the newest op if it is one, has
    // started and is undecided (the worker joins its view now), else the next MAX op to start (the
    // worker is put into the view when its first packet arrives, so that op waits for it up to the
    // quorum timeout). Until that op has started, the worker asks again (a new nonce: a repeat of
    // this JOIN only draws this answer again and applies nothing).
    const OpRecord* cur = j->find_op(j->max_op);
    if (cur && cur->is_max && cur->first_known && !cur->decided) {
      j->view |= bit;
      j->rejoined |= bit;
      j->resume_seq[h.worker] = cur->first_seq;
      a.resume_op = j->max_op;
      a.resume_seq = cur->first_seq;
      a.resume_flags = proto::kResumeKnown;
    } else {
      j->rejoin_pending |= bit;
      a.resume_op = j->max_op + 1;
    }
  }
  if (cfg_.data_plane) a.resume_flags |= proto::kAckDataPlane;
  j->floor_set |= bit;
  j->ctl_nonce[h.worker] = h.seq;
  j->answer[h.worker].type = MsgType::kJoinAck;
  j->answer[h.worker].ack = a;
  send_join_ack(*j, h, a, from, out);
  return Handled::kJoined;
}

Handled Engine::on_control(const Header& h, const uint8_t* data, size_t len, const uint8_t* pl, size_t plen,
                        const PeerAddr& from, uint64_t now, Sink& out) {
  Job* j = find(h.job, h.shard);
  if (!j) {
    drop(Drop::kUnknownJob);  // unverifiable: no reply
    return Handled::kDropped;
  }
  if (!auth::verify(j->dkey, data, len)) {
    drop(Drop::kBadTag);
    return Handled::kDropped;
  }
  const uint64_t bit = uint64_t{1} << h.worker;
  if (h.nworkers != j->n || !(j->joined & bit)) {
    // A key holder's packet, but from a worker that never joined: it has no registered address,
    // so the (header-sized, never larger) error goes to the source.
    drop(Drop::kBadWorker);
    reply_error(j, h, ErrorCode::kBadWorker, j->dkey, (j->joined & bit) ? j->peer[h.worker] : from, out);
    return Handled::kAuthentic;
  }
  Header r;
  r.type = h.type == MsgType::kTable ? MsgType::kTableAck : MsgType::kLeaveAck;
  r.job = j->key.id;
  r.shard = h.shard;
  r.worker = h.worker;
  r.nworkers = j->n;
  r.seq = h.seq;
  const PeerAddr to = j->peer[h.worker];
  uint8_t ack[proto::kHeaderBytes];
  proto::write_header(r, ack, sizeof ack);
  // The control rule (Job::floor_set): the newest request again (its ack was lost) is acknowledged
  // again and changes nothing, not even when the worker was last heard; an older one is a replay.
  if (j->floor_set & bit) {
    const uint64_t floor = j->ctl_nonce[h.worker];
    if (h.seq == floor && j->answer[h.worker].type == r.type) {
      send_packet(to, ack, sizeof ack, &j->dkey, out);
      return Handled::kAuthentic;
    }
    if (h.seq <= floor) {
      drop(Drop::kReplay);
      return Handled::kAuthentic;
    }
  }
  if (h.type == MsgType::kTable) {
    proto::TableSpec t;
    const proto::ParseError e = proto::parse_table(pl, plen, &t);
    if (e != proto::ParseError::kOk) {
      drop(static_cast<Drop>(static_cast<int>(e) - 1));
      return Handled::kAuthentic;
    }
    if (cfg_.data_plane) {
      const ErrorCode ec = cfg_.data_plane->table_installed(dp_job(*j), t);
      if (ec != ErrorCode::kNone) {
        drop(ec == ErrorCode::kNoResources ? Drop::kNoResources : Drop::kNotSupported);
        reply_error(j, h, ec, j->dkey, to, out);
        return Handled::kAuthentic;
      }
    }
    // Re-installing an id is safe without a barrier: a client only recycles an id after its own
    // earlier requests completed, and then every slot of those ops is Done (README "Tables").
    Table& x = j->tables[t.id];
    x.valid = true;
    x.bits = t.bits;
    x.sum = t.sum;
    std::memcpy(x.values, t.values, sizeof x.values);
  } else {
    j->left |= bit;
  }
  j->floor_set |= bit;
  j->ctl_nonce[h.worker] = h.seq;
  j->answer[h.worker].type = r.type;
  j->heard[h.worker] = now;
  j->last_active = now;
  const auth::TagKey dkey = j->dkey;
  const bool all_left = h.type == MsgType::kLeave && (j->left & j->joined) == j->joined;
  send_packet(to, ack, sizeof ack, &dkey, out);
  if (all_left) free_job(j->key, now);
  return Handled::kAuthentic;
}

Handled Engine::on_stats(const Header& h, const uint8_t* data, size_t len, const PeerAddr& from, Sink& out) {
  const auth::Key* op = keys_->find(auth::kOperatorKeyId);
  const bool local = cfg_.stats_from_loopback && is_loopback(from);
  auth::TagKey skey;
  bool tagged = false;
  if (op && proto::job_key_id(h.job) == auth::kOperatorKeyId) {
    skey = auth::stats_key(*op);
    tagged = auth::verify(skey, data, len);
  }
  if (!local && !tagged) {
    drop(Drop::kStatsDenied);
    return Handled::kDropped;
  }
  if (tagged) {
    // Operator nonces grow: a recorded request replayed (from anywhere) draws nothing.
    if (h.seq <= last_stats_nonce_) {
      drop(Drop::kReplay);
      return Handled::kDropped;
    }
    last_stats_nonce_ = h.seq;
  }
  std::vector<uint64_t> v = cfg_.stats_snapshot ? cfg_.stats_snapshot() : stats_values(*stats_);
  if (v.size() > proto::kMaxStatsCounters) v.resize(proto::kMaxStatsCounters);
  if (v.empty()) return Handled::kAuthentic;
  Header r;
  r.type = MsgType::kStatsReply;
  r.job = h.job;
  r.worker = h.worker;
  r.nworkers = h.nworkers;
  r.seq = h.seq;
  r.aux = static_cast<uint32_t>(v.size());
  uint8_t* p = buf_.data();
  size_t n = proto::write_header(r, p, buf_.size());
  for (uint64_t x : v) {
    proto::store_be64(p + n, x);
    n += 8;
  }
  send_packet(from, p, n, tagged ? &skey : nullptr, out);
  return Handled::kAuthentic;
}

void Engine::accumulate(Job& j, Shadow& sh, const Header& h, const uint8_t* pl, bool subtract) {
  if (sh.fresh) {
    sh.fresh = false;
    // Lanes [count, lanes) stay zero in the result (every packet of a slot has the same count).
    const size_t used = static_cast<size_t>(h.count) * sh.rw, all = static_cast<size_t>(sh.lanes) * sh.rw;
    if (all > used) std::memset(sh.reg + used, 0, all - used);
    if (!subtract) {
      switch (h.type) {
        // MAX onto zeros is the value itself.
        case MsgType::kDataValue: lanes::set_values(sh.reg, sh.rw, pl, h.count); return;
        case MsgType::kDataMax: lanes::set_values(sh.reg, 4, pl, h.count); return;
        case MsgType::kDataIndex:
          lanes::set_lookup(sh.reg, sh.rw, pl, h.count, h.bits, j.tables[h.aux].values);
          return;
        default: break;
      }
    }
    std::memset(sh.reg, 0, used);
  }
  switch (h.type) {
    case MsgType::kDataValue: lanes::add_values(sh.reg, sh.rw, pl, h.count, subtract); break;
    case MsgType::kDataIndex:
      // Two's complement: a negative table entry added in the register's width gives the same
      // bits as a signed sum, so one code path serves signed and unsigned sum types.
      lanes::add_lookup(sh.reg, sh.rw, pl, h.count, h.bits, j.tables[h.aux].values, subtract);
      break;
    case MsgType::kDataMax: lanes::max_u32(sh.reg, pl, h.count); break;
    default: break;
  }
}

void Engine::send_result(Job& j, uint32_t idx, uint64_t to_mask, bool resend, Sink& out) {
  Shadow& sh = j.sh(idx);
  if (sh.fresh) {
    sh.fresh = false;
    std::memset(sh.reg, 0, static_cast<size_t>(sh.lanes) * sh.rw);
  }
  to_mask &= j.joined;
  to_mask &= sh.seen;  // an attempt is answered, and only one a worker sent
  for (uint64_t m = to_mask; m; m &= m - 1) {
    const int wk = __builtin_ctzll(m);
    const uint64_t b = uint64_t{1} << wk;
    if ((sh.answered_any & b) && sh.answered[wk] >= sh.seen_attempt[wk]) {
      to_mask &= ~b;  // answered already
    } else {
      sh.answered_any |= b;
      sh.answered[wk] = sh.seen_attempt[wk];
    }
  }
  if (!to_mask) return;
  Header r;
  r.type = MsgType::kResult;
  r.job = j.key.id;
  r.shard = j.key.shard;
  r.nworkers = j.n;
  r.slot = static_cast<uint16_t>(idx >> 1);
  r.shadow = static_cast<uint8_t>(idx & 1);
  r.lanes = sh.lanes;
  r.enc = sh.type == MsgType::kDataMax ? WireInt::kU32 : sh.enc;
  r.count = sh.count;
  r.contributors = static_cast<uint16_t>(popcount(sh.counted));
  r.seq = sh.seq;
  r.op = sh.op;
  r.bitmap = sh.counted;
  uint8_t* p = buf_.data();
  const size_t plen = proto::data_payload_bytes(MsgType::kResult, r.enc, 0, sh.lanes);
  if (batching_) {
    // Signed with the batch's other results at its end (flush_results).
    PendingResult pr;
    pr.key = j.dkey;
    pr.pay_off = pend_pay_.size();
    pr.plen = plen;
    pr.first = pend_rcpt_.size();
    pend_pay_.resize(pend_pay_.size() + plen);
    lanes::store(sh.reg, sh.rw, sh.lanes, pend_pay_.data() + pr.pay_off);
    for (uint64_t m = to_mask; m; m &= m - 1) {
      const int wk = __builtin_ctzll(m);
      r.worker = static_cast<uint16_t>(wk);
      r.flags = static_cast<uint16_t>((r.contributors < j.n ? proto::kFlagPartial : 0) |
                                      ((sh.counted >> wk) & 1 ? 0 : proto::kFlagNotCounted));
      r.tag = 0;
      const size_t at = pend_hdr_.size();
      pend_hdr_.resize(at + proto::kHeaderBytes);
      proto::write_header(r, pend_hdr_.data() + at, proto::kHeaderBytes);
      pend_rcpt_.push_back(PendingRecipient{j.peer[wk], resend});
      ++pr.count;
    }
    pend_.push_back(pr);
    return;
  }
  uint8_t* pay = p + proto::kHeaderBytes;
  lanes::store(sh.reg, sh.rw, sh.lanes, pay);
  // One payload hash serves every recipient; only the header differs (auth.h). The recipients'
  // headers are tagged side by side.
  const uint64_t ph = auth::payload_hash(j.dkey, pay, plen);
  const size_t nrec = static_cast<size_t>(popcount(to_mask));
  if (res_hdrs_.size() < nrec * proto::kHeaderBytes) res_hdrs_.resize(proto::kMaxWorkers * proto::kHeaderBytes);
  if (res_ptrs_.size() < nrec) {
    res_ptrs_.resize(proto::kMaxWorkers);
    res_tags_.resize(proto::kMaxWorkers);
  }
  size_t k = 0;
  for (uint64_t m = to_mask; m; m &= m - 1, ++k) {
    const int wk = __builtin_ctzll(m);
    r.worker = static_cast<uint16_t>(wk);
    r.flags = static_cast<uint16_t>((r.contributors < j.n ? proto::kFlagPartial : 0) |
                                    ((sh.counted >> wk) & 1 ? 0 : proto::kFlagNotCounted));
    r.tag = 0;
    res_ptrs_[k] = res_hdrs_.data() + k * proto::kHeaderBytes;
    proto::write_header(r, res_hdrs_.data() + k * proto::kHeaderBytes, proto::kHeaderBytes);
  }
  auth::tags_from_hash(j.dkey, res_ptrs_.data(), nrec, ph, res_tags_.data());
  k = 0;
  for (uint64_t m = to_mask; m; m &= m - 1, ++k) {
    const int wk = __builtin_ctzll(m);
    std::memcpy(p, res_ptrs_[k], proto::kTagOffset);
    proto::store_be64(p + proto::kTagOffset, res_tags_[k]);
    send_packet(j.peer[wk], p, proto::kHeaderBytes + plen, nullptr, out);
    stats_->results_sent.add();
    if (resend) stats_->result_resends.add();
  }
}

void Engine::send_ack_not_counted(Job& j, const Header& h, Sink& out) {
  Header a;
  a.type = MsgType::kAck;
  a.flags = proto::kFlagNotCounted;
  a.job = j.key.id;
  a.shard = j.key.shard;
  a.worker = h.worker;
  a.nworkers = j.n;
  a.slot = h.slot;
  a.shadow = h.shadow;
  a.seq = h.seq;
  a.op = h.op;
  uint8_t b[proto::kHeaderBytes];
  proto::write_header(a, b, sizeof b);
  send_packet(j.peer[h.worker], b, sizeof b, &j.dkey, out);
}

void Engine::complete(Job& j, uint32_t idx, uint64_t counted, bool decided_now, uint64_t now, Sink& out) {
  Shadow& sh = j.sh(idx);
  if (decided_now) {
    OpRecord& r = j.op_entry(sh.op);
    r.decided = true;
    r.members = counted;
    // The view follows the newest decision (engine.h): a left-out worker stops gating slot reuse
    // and completions; a straggler that made it into this op is back.
    if (!j.any_decided || sh.op >= j.last_decided_op) {
      j.view = counted;
      j.last_decided_op = sh.op;
      j.any_decided = true;
    }
  }
  sh.state = kDone;
  stats_->slots_completed.add();
  if (sh.counted != j.all) stats_->partial_completions.add();
  send_result(j, idx, sh.seen, false, out);
  if (decided_now && counted != j.all) {
    // Other open slots of this op may now hold exactly the members (software shortcut: a switch
    // completes them on the next retransmission instead).
    const uint32_t op = sh.op;
    for (size_t i = 0; i < j.open.size(); ++i) {
      const OpenRef o = j.open[i];
      Shadow& x = j.sh(o.idx);
      if (x.state == kOpen && x.seq == o.seq && x.op == op) try_complete(j, o.idx, now, out);
    }
  }
}

bool Engine::try_complete(Job& j, uint32_t idx, uint64_t now, Sink& out, bool judge_silence) {
  Shadow& sh = j.sh(idx);
  if (sh.state != kOpen) return false;
  const OpRecord* rec = j.find_op(sh.op);
  if (rec && rec->decided) {
    const uint64_t need = rec->members;
    // MAX cannot take a value back out, and needs not: any superset of the members gives every
    // recipient the same maximum.
    const bool done = sh.type == MsgType::kDataMax ? (sh.counted & need) == need : sh.counted == need;
    if (done) {
      complete(j, idx, need, false, now, out);
      return true;
    }
    // A member of the decided op stopped sending (it died inside the op): once the quorum timeout
    // passed for this slot and every missing member has been silent for dead_worker_us (at least
    // the quorum timeout), complete with what is here. Its bitmap differs from the op's other
    // results, which tells every worker that the op is incomplete (the client fails that call; the
    // job goes on without the dead worker). Judged by the timer only (see try_complete's caller).
    const uint64_t missing = need & ~sh.counted;
    if (judge_silence && j.k < j.n && now - sh.t_open >= j.qt_us && popcount(sh.counted & need) >= j.k) {
      const uint64_t dead_after = std::max<uint64_t>(j.qt_us, cfg_.dead_worker_us);
      bool silent = true;
      for (uint64_t m = missing; m; m &= m - 1)
        if (now - j.heard[__builtin_ctzll(m)] < dead_after) silent = false;
      if (silent) {
        const uint64_t keep = sh.counted & need;
        if (sh.counted != keep) return false;  // non-member values are retracted on retransmission
        stats_->stuck_completions.add();
        j.view &= ~missing;
        complete(j, idx, keep, false, now, out);
        return true;
      }
    }
    return false;
  }
  const uint64_t need = j.needed(sh.seq);
  const bool view_done = (sh.counted & need) == need && popcount(sh.counted) >= j.k;
  const bool quorum_done = j.k < j.n && popcount(sh.counted) >= j.k && now - sh.t_open >= j.qt_us;
  if (!(sh.counted == j.all || view_done || quorum_done)) return false;
  complete(j, idx, sh.counted, true, now, out);
  return true;
}

Handled Engine::on_data(const Header& h, const uint8_t* data, size_t len, const uint8_t* pl, const PeerAddr& from,
                     uint64_t now, Sink& out) {
  Job* jp = find(h.job, h.shard);
  if (!jp) {
    drop(Drop::kUnknownJob);  // unverifiable without the job's key: no reply
    return Handled::kDropped;
  }
  Job& j = *jp;
  // A tag handle_batch computed counts only under the key the job has now (a job freed and
  // created again within the batch has another).
  const PreTag* pre = cur_pre_;
  cur_pre_ = nullptr;
  const bool authentic = pre && std::memcmp(&pre->key, &j.dkey, sizeof j.dkey) == 0
                             ? (pre->tag ^ auth::tag_field(data)) == 0
                             : auth::verify(j.dkey, data, len);
  if (!authentic) {
    drop(Drop::kBadTag);
    return Handled::kDropped;
  }
  const uint64_t bit = uint64_t{1} << h.worker;
  if (h.nworkers != j.n || !(j.joined & bit) || (j.left & bit)) {
    drop(Drop::kBadWorker);
    reply_error(&j, h, ErrorCode::kBadWorker, j.dkey, (j.joined & bit) ? j.peer[h.worker] : from, out);
    return Handled::kAuthentic;
  }
  const uint64_t S = j.S;
  if (h.slot >= S || h.seq == kEmpty || h.seq % S != h.slot || ((h.seq / S) & 1) != h.shadow) {
    drop(Drop::kBadSlot);
    return Handled::kAuthentic;
  }
  const uint32_t idx = static_cast<uint32_t>(h.slot) * 2u + h.shadow;
  Shadow& sh = j.sh(idx);
  // Older than its slot's current use: a delayed duplicate, or a recording replayed by somebody
  // who sniffed it (its tag is genuine). It is checked first, against nothing but the slot, so
  // that it neither draws an error about state that has moved on since (a recycled table id)
  // nor touches that state (op records, when the worker was last heard).
  if (sh.seq != kEmpty && sh.seq > h.seq) {
    if (!(j.view & bit)) {
      // A straggler outside the view whose slot was reused: its result is gone for good.
      stats_->left_behind.add();
      reply_error(&j, h, ErrorCode::kLeftBehind, j.dkey, j.peer[h.worker], out);
      return Handled::kAuthentic;
    }
    drop(Drop::kStale);
    return Handled::kAuthentic;
  }
  if (h.lanes != proto::lanes_for(h.type, h.enc, h.bits, j.L, j.budget)) {
    drop(Drop::kBadLanes);
    reply_error(&j, h, ErrorCode::kConfigMismatch, j.dkey, j.peer[h.worker], out);
    return Handled::kAuthentic;
  }
  // A duplicate of a finished use only gets the stored result: the table it was summed with may
  // have been replaced since (ids are recycled once every op using them is done).
  if (h.type == MsgType::kDataIndex && !(sh.seq == h.seq && sh.state == kDone)) {
    const Table& t = j.tables[h.aux];
    if (!t.valid || t.bits != h.bits || t.sum != h.enc) {
      drop(Drop::kNoTable);
      reply_error(&j, h, ErrorCode::kNoTable, j.dkey, j.peer[h.worker], out);
      return Handled::kAuthentic;
    }
  }
  if (!j.any_op || h.op > j.max_op) j.max_op = h.op;
  j.any_op = true;
  if (h.flags & proto::kFlagFirst) {
    OpRecord& r = j.op_entry(h.op);
    if (!r.first_known && h.type == MsgType::kDataMax && !r.decided && j.rejoin_pending) {
      // A new call starts: rejoining workers are part of it (and of nothing before it).
      j.view |= j.rejoin_pending;
      j.rejoined |= j.rejoin_pending;
      for (uint64_t m = j.rejoin_pending; m; m &= m - 1) j.resume_seq[__builtin_ctzll(m)] = h.seq;
      j.rejoin_pending = 0;
    }
    r.first_known = true;
    r.first_seq = h.seq;
    r.is_max = h.type == MsgType::kDataMax;
  }
  if (sh.seq == kEmpty || sh.seq < h.seq) {
    // Opening the next use of this shadow set.
    if (sh.seq != kEmpty) {
      if (sh.seq + 2 * S != h.seq) {
        drop(Drop::kBadSlot);  // a skipped use: no correct worker numbers packets like that
        return Handled::kAuthentic;
      }
      const Shadow& other = j.sh(idx ^ 1u);
      // Every view member sent seq - S, so each of them holds the result of seq - 2S, the result
      // this shadow set still keeps for retransmissions.
      const uint64_t need = j.needed(other.seq);
      if (sh.state != kDone || other.seq + S != h.seq || (other.seen & need) != need) {
        drop(Drop::kSlotBusy);
        return Handled::kAuthentic;
      }
    } else if (h.seq >= 2 * S) {
      drop(Drop::kBadSlot);  // the first use of a shadow set is seq < 2S
      return Handled::kAuthentic;
    }
    sh.seq = h.seq;
    sh.op = h.op;
    sh.type = h.type;
    sh.enc = h.enc;
    sh.bits = h.bits;
    sh.table = static_cast<uint8_t>(h.type == MsgType::kDataIndex ? h.aux : 0);
    sh.count = h.count;
    sh.lanes = h.lanes;
    sh.counted = 0;
    sh.seen = 0;
    sh.t_open = now;
    sh.state = kOpen;
    sh.rw = static_cast<uint8_t>(h.type == MsgType::kDataMax ? 4 : proto::wire_int_bytes(h.enc));
    sh.answered_any = 0;
    sh.fresh = true;
    j.open.push_back(OpenRef{idx, h.seq});
  }
  if (sh.op != h.op || sh.type != h.type || sh.enc != h.enc || sh.bits != h.bits || sh.count != h.count ||
      (h.type == MsgType::kDataIndex && sh.table != h.aux)) {
    drop(Drop::kMismatch);
    reply_error(&j, h, ErrorCode::kConfigMismatch, j.dkey, j.peer[h.worker], out);
    return Handled::kAuthentic;
  }
  if (h.flags & proto::kFlagRetransmit) stats_->retransmissions.add();
  const bool was_seen = (sh.seen & bit) != 0;
  sh.seen |= bit;
  const bool new_attempt = !was_seen || h.attempt > sh.seen_attempt[h.worker];
  if (new_attempt) sh.seen_attempt[h.worker] = h.attempt;
  // Liveness (stuck-op recovery, idle expiry) follows first copies only: a copy of a packet
  // already seen may be anybody's recording, and would keep a dead worker or job alive.
  if (!was_seen) {
    j.heard[h.worker] = now;
    j.last_active = now;
  }
  if (sh.state == kDone) {
    if (!(sh.counted & bit) && !was_seen) stats_->late_not_counted.add();
    if (!new_attempt) {
      drop(Drop::kReplay);  // a copy of an attempt already answered: a duplicate or a recording
      return Handled::kAuthentic;
    }
    send_result(j, idx, bit, was_seen, out);
    return Handled::kAuthentic;
  }
  const OpRecord* rec = j.find_op(h.op);
  if (rec && rec->decided && !(rec->members & bit)) {
    // Left out of this op by an earlier partial completion.
    if ((sh.counted & bit) && h.type != MsgType::kDataMax) {
      accumulate(j, sh, h, pl, /*subtract=*/true);
      sh.counted &= ~bit;
      stats_->retractions.add();
    }
    if (!was_seen) stats_->late_not_counted.add();
    if (new_attempt) send_ack_not_counted(j, h, out);
  } else if (sh.counted & bit) {
    stats_->duplicates.add();
  } else {
    accumulate(j, sh, h, pl, /*subtract=*/false);
    sh.counted |= bit;
    stats_->elements.add(h.count);
  }
  try_complete(j, idx, now, out);
  return Handled::kAuthentic;
}

void Engine::free_job(const JobKey& key, uint64_t now) {
  auto it = jobs_.find(key);
  if (it == jobs_.end()) return;
  if (cfg_.data_plane) cfg_.data_plane->job_freed(dp_job(*it->second));
  // Its workers' control floors outlive it for as long as their JOINs' cookies can verify.
  const Job& j = *it->second;
  for (uint64_t m = j.floor_set; m; m &= m - 1) {
    const int w = __builtin_ctzll(m);
    const ErrorCode again = j.answer[w].type == MsgType::kError ? j.answer[w].error : ErrorCode::kNone;
    remember_floor(key.id, key.shard, static_cast<uint16_t>(w), j.ctl_nonce[w], again, now);
  }
  budget_->release(it->second->footprint, it->second->source, it->second->tenant);
  memory_ -= it->second->footprint;
  jobs_.erase(it);  // its open list goes with it: nothing engine-wide refers to a job
  stats_->jobs_freed.add();
}

DataPlaneJob Engine::dp_job(const Job& j) const {
  DataPlaneJob d;
  d.id = j.key.id;
  d.shard = j.key.shard;
  d.n = j.n;
  d.slots = j.S;
  d.lanes = j.L;
  d.payload_budget = j.budget;
  return d;
}

bool Engine::touch(uint64_t job, uint16_t shard, uint64_t now) {
  Job* j = find(job, shard);
  if (!j) return false;
  if (now > j->last_active) j->last_active = now;
  return true;
}

void Engine::tick(uint64_t now, Sink& out) {
  for (auto& kv : jobs_) {
    Job& j = *kv.second;
    if (j.open.empty()) continue;
    // Quorum timeouts (try_complete may scan j.open but never changes it).
    if (j.k < j.n) {
      for (size_t i = 0; i < j.open.size(); ++i) {
        const OpenRef o = j.open[i];
        const Shadow& sh = j.sh(o.idx);
        if (sh.seq == o.seq && sh.state == kOpen) try_complete(j, o.idx, now, out, /*judge_silence=*/true);
      }
    }
    // Forget shadow sets that are no longer open in this use.
    size_t k = 0;
    for (size_t i = 0; i < j.open.size(); ++i) {
      const OpenRef o = j.open[i];
      const Shadow& sh = j.sh(o.idx);
      if (sh.seq == o.seq && sh.state == kOpen) j.open[k++] = o;
    }
    j.open.resize(k);
  }
  if (now - last_gc_us_ >= kGcIntervalUs || now < last_gc_us_) {
    last_gc_us_ = now;
    std::vector<JobKey> idle;
    for (auto& kv : jobs_)
      if (now > kv.second->last_active && now - kv.second->last_active > cfg_.job_idle_timeout_us) idle.push_back(kv.first);
    for (const JobKey& id : idle) {
      free_job(id, now);
      stats_->jobs_expired.add();
    }
    for (auto it = floors_.begin(); it != floors_.end();) it = it->second.until_us <= now ? floors_.erase(it) : std::next(it);
  }
}

uint64_t Engine::tick_interval_us() const {
  for (const auto& kv : jobs_)
    if (!kv.second->open.empty() && kv.second->k < kv.second->n) return 1'000;
  return 100'000;
}

}  // namespace thc::switch_offload
