#include "switch_offload/aggregator/engine.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include "common/fault.h"

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
}  // namespace

bool Budget::reserve(int64_t bytes) {
  if (jobs_.fetch_sub(1) <= 0) {
    jobs_.fetch_add(1);
    return false;
  }
  if (bytes_.fetch_sub(bytes) < bytes) {
    bytes_.fetch_add(bytes);
    jobs_.fetch_add(1);
    return false;
  }
  return true;
}

void Budget::release(int64_t bytes) {
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
  MsgType type = MsgType::kDataValue;
  WireInt enc = WireInt::kNone;
  uint8_t bits = 0;
  uint8_t table = 0;
  uint8_t state = kFree;
  uint32_t* lanes = nullptr;  // kLanes registers; sums wrap modulo 2^32
};

namespace {
struct OpRecord {
  uint32_t op = 0;
  bool valid = false;
  uint64_t members = 0;
};
struct Table {
  bool valid = false;
  uint8_t bits = 0;
  WireInt sum = WireInt::kNone;
  int32_t values[proto::kMaxTableEntries] = {};
};
}  // namespace

struct Engine::Job {
  uint32_t id = 0;
  uint64_t token = 0;
  uint16_t n = 0, k = 0;
  uint32_t qt_us = 0;
  uint32_t S = 0;
  uint64_t all = 0;
  uint64_t joined = 0, left = 0;
  uint64_t seed = 0;
  uint64_t last_active = 0;
  int64_t footprint = 0;
  PeerAddr peer[proto::kMaxWorkers];
  Table tables[proto::kTableIds];
  // Two shadow sets per slot: while one holds a finished result that slow workers may still
  // ask for, the other takes the next use of the slot.
  std::vector<Shadow> shadows;  // [slot * 2 + shadow]
  std::vector<uint32_t> lanes;  // [(slot * 2 + shadow) * kLanes + lane]
  // Op membership decisions, a ring indexed by op % size. In-flight ops span at most 2S packets
  // (a shadow set is not reused before every worker passed it), hence at most 2S ops: 4S
  // entries never alias a live op.
  std::vector<OpRecord> ops;

  Shadow& sh(uint32_t slot, int shadow) { return shadows[slot * 2u + static_cast<uint32_t>(shadow)]; }
  OpRecord* find_op(uint32_t op) {
    OpRecord& r = ops[op % ops.size()];
    return r.valid && r.op == op ? &r : nullptr;
  }
  static int64_t footprint_for(uint32_t S) {
    return static_cast<int64_t>(sizeof(Job) + S * 2ull * (sizeof(Shadow) + proto::kLanes * 4ull) +
                                S * 4ull * sizeof(OpRecord));
  }
};

Engine::Engine(const EngineConfig& cfg, Stats* stats) : cfg_(cfg), stats_(stats), budget_(cfg.budget) {
  if (!budget_) budget_ = std::make_shared<Budget>(64, int64_t{1} << 30);
  seed_state_ = cfg.seed;
  if (seed_state_ == 0) {
    std::random_device rd;
    seed_state_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  buf_.resize(proto::kMaxPacketBytes + 64);
}

Engine::~Engine() {
  for (auto& kv : jobs_) budget_->release(kv.second->footprint);
}

void Engine::send_packet(const PeerAddr& to, const uint8_t* p, size_t n, Sink& out) {
  stats_->tx_packets.add();
  stats_->tx_bytes.add(n);
  out.send(to, p, n);
}

void Engine::reply_error(const Header& h, ErrorCode code, const PeerAddr& to, Sink& out) {
  Header r;
  r.type = MsgType::kError;
  r.job = h.job;
  r.worker = h.worker < proto::kMaxWorkers ? h.worker : 0;
  r.nworkers = h.nworkers <= proto::kMaxWorkers ? h.nworkers : 0;
  r.slot = h.slot;
  r.shadow = h.shadow;
  r.token = h.token;
  r.seq = h.seq;
  r.op = h.op;
  r.aux = static_cast<uint32_t>(code);
  uint8_t b[proto::kHeaderBytes];
  proto::write_header(r, b, sizeof b);
  send_packet(to, b, sizeof b, out);
}

void Engine::handle(const uint8_t* data, size_t len, const PeerAddr& from, uint64_t now, Sink& out) {
  stats_->rx_packets.add();
  stats_->rx_bytes.add(len);
  Header h;
  const uint8_t* pl = nullptr;
  size_t plen = 0;
  const proto::ParseError e = proto::parse(data, len, &h, &pl, &plen);
  if (e != proto::ParseError::kOk) {
    drop(static_cast<Drop>(static_cast<int>(e) - 1));
    if (e == proto::ParseError::kBadVersion) {
      // Tell an old/new client why it gets nothing back; the fixed offsets of job, worker and
      // seq are part of the version-independent prefix (README "Versioning").
      Header r;
      r.job = proto::load_be32(data + 8);
      r.worker = proto::load_be16(data + 12);
      r.nworkers = proto::load_be16(data + 14);
      r.seq = proto::load_be64(data + 32);
      r.token = proto::load_be64(data + 24);
      reply_error(r, ErrorCode::kBadVersion, from, out);
    }
    return;
  }
  switch (h.type) {
    case MsgType::kJoin: return on_join(h, pl, plen, from, now, out);
    case MsgType::kTable: return on_table(h, pl, plen, from, now, out);
    case MsgType::kLeave: return on_leave(h, from, out);
    case MsgType::kStats: return on_stats(h, from, out);
    case MsgType::kDataValue:
    case MsgType::kDataIndex:
    case MsgType::kDataMax: return on_data(h, pl, from, now, out);
    default: drop(Drop::kWrongDirection); return;
  }
}

void Engine::on_join(const Header& h, const uint8_t* pl, size_t plen, const PeerAddr& from, uint64_t now, Sink& out) {
  proto::JoinBody b;
  const proto::ParseError e = proto::parse_join(pl, plen, h.nworkers, &b);
  if (e != proto::ParseError::kOk) {
    drop(static_cast<Drop>(static_cast<int>(e) - 1));
    return;
  }
  auto it = jobs_.find(h.job);
  Job* j = it == jobs_.end() ? nullptr : it->second.get();
  if (j == nullptr) {
    const uint32_t S = std::max<uint32_t>(1, std::min<uint32_t>({b.slots, cfg_.max_slots_per_job,
                                                                 static_cast<uint32_t>(proto::kMaxSlots)}));
    const int64_t fp = Job::footprint_for(S);
    if (!budget_->reserve(fp)) {
      drop(Drop::kNoResources);
      reply_error(h, ErrorCode::kNoResources, from, out);
      return;
    }
    auto nj = std::make_unique<Job>();
    nj->id = h.job;
    nj->token = h.token;
    nj->n = h.nworkers;
    nj->k = b.quorum;
    nj->qt_us = b.quorum_timeout_us;
    nj->S = S;
    nj->all = all_mask(h.nworkers);
    uint64_t s = seed_state_ ^ (uint64_t{h.job} << 32) ^ stats_->jobs_created.get();
    nj->seed = splitmix64(s);
    seed_state_ = s;
    if (nj->seed == 0) nj->seed = 1;
    nj->footprint = fp;
    nj->shadows.resize(S * 2u);
    nj->lanes.assign(S * 2ull * proto::kLanes, 0);
    for (uint32_t i = 0; i < S * 2u; ++i) nj->shadows[i].lanes = nj->lanes.data() + i * proto::kLanes;
    nj->ops.resize(S * 4ull);
    memory_ += fp;
    stats_->jobs_created.add();
    j = nj.get();
    jobs_.emplace(h.job, std::move(nj));
  } else {
    if (h.token != j->token) {
      drop(Drop::kBadToken);
      reply_error(h, ErrorCode::kBadToken, from, out);
      return;
    }
    if (h.nworkers != j->n || b.quorum != j->k || b.quorum_timeout_us != j->qt_us) {
      drop(Drop::kConfigMismatch);
      reply_error(h, ErrorCode::kConfigMismatch, from, out);
      return;
    }
  }
  const uint64_t bit = uint64_t{1} << h.worker;
  j->joined |= bit;
  j->left &= ~bit;
  j->peer[h.worker] = from;
  j->last_active = now;
  if (b.table.bits) {
    Table& t = j->tables[b.table.id];
    t.valid = true;
    t.bits = b.table.bits;
    t.sum = b.table.sum;
    std::memcpy(t.values, b.table.values, sizeof t.values);
  }
  Header r;
  r.type = MsgType::kJoinAck;
  r.job = j->id;
  r.worker = h.worker;
  r.nworkers = j->n;
  r.token = j->token;
  r.seq = h.seq;
  proto::JoinAckBody a;
  a.seed = j->seed;
  a.slots = static_cast<uint16_t>(j->S);
  a.lanes = proto::kLanes;
  a.nworkers = j->n;
  a.quorum = j->k;
  a.quorum_timeout_us = j->qt_us;
  uint8_t* p = buf_.data();
  size_t n = proto::write_header(r, p, buf_.size());
  n += proto::write_join_ack(a, p + n, buf_.size() - n);
  send_packet(from, p, n, out);
}

Engine::Job* Engine::auth(const Header& h, const PeerAddr& from, Sink& out) {
  auto it = jobs_.find(h.job);
  if (it == jobs_.end()) {
    drop(Drop::kUnknownJob);
    reply_error(h, ErrorCode::kUnknownJob, from, out);
    return nullptr;
  }
  Job* j = it->second.get();
  if (h.token != j->token) {
    drop(Drop::kBadToken);
    reply_error(h, ErrorCode::kBadToken, from, out);
    return nullptr;
  }
  const uint64_t bit = uint64_t{1} << h.worker;
  if (h.nworkers != j->n || !(j->joined & bit) || (j->left & bit)) {
    drop(Drop::kBadWorker);
    reply_error(h, ErrorCode::kBadWorker, from, out);
    return nullptr;
  }
  return j;
}

void Engine::on_table(const Header& h, const uint8_t* pl, size_t plen, const PeerAddr& from, uint64_t now, Sink& out) {
  proto::TableSpec t;
  const proto::ParseError e = proto::parse_table(pl, plen, &t);
  if (e != proto::ParseError::kOk) {
    drop(static_cast<Drop>(static_cast<int>(e) - 1));
    return;
  }
  Job* j = auth(h, from, out);
  if (!j) return;
  // Re-installing an id is safe without a barrier: a client only recycles an id after its own
  // earlier requests completed, and then every slot of those ops is Done (README "Tables").
  Table& x = j->tables[t.id];
  x.valid = true;
  x.bits = t.bits;
  x.sum = t.sum;
  std::memcpy(x.values, t.values, sizeof x.values);
  j->peer[h.worker] = from;
  j->last_active = now;
  Header r;
  r.type = MsgType::kTableAck;
  r.job = j->id;
  r.worker = h.worker;
  r.nworkers = j->n;
  r.token = j->token;
  r.seq = h.seq;
  uint8_t b[proto::kHeaderBytes];
  proto::write_header(r, b, sizeof b);
  send_packet(from, b, sizeof b, out);
}

void Engine::on_leave(const Header& h, const PeerAddr& from, Sink& out) {
  auto it = jobs_.find(h.job);
  if (it != jobs_.end()) {
    Job* j = it->second.get();
    if (h.token != j->token) {
      drop(Drop::kBadToken);
      reply_error(h, ErrorCode::kBadToken, from, out);
      return;
    }
    if (h.nworkers != j->n) {
      drop(Drop::kBadWorker);
      reply_error(h, ErrorCode::kBadWorker, from, out);
      return;
    }
    j->left |= uint64_t{1} << h.worker;
    if ((j->left & j->joined) == j->joined) free_job(h.job);
  }
  // A LEAVE for a job that is already gone is acknowledged: it is a retransmission whose ack was
  // lost after the last worker freed the job.
  Header r;
  r.type = MsgType::kLeaveAck;
  r.job = h.job;
  r.worker = h.worker;
  r.nworkers = h.nworkers;
  r.token = h.token;
  r.seq = h.seq;
  uint8_t b[proto::kHeaderBytes];
  proto::write_header(r, b, sizeof b);
  send_packet(from, b, sizeof b, out);
}

void Engine::on_stats(const Header& h, const PeerAddr& from, Sink& out) {
  std::vector<uint64_t> v = cfg_.stats_snapshot ? cfg_.stats_snapshot() : stats_values(*stats_);
  if (v.size() > proto::kMaxStatsCounters) v.resize(proto::kMaxStatsCounters);
  if (v.empty()) return;
  Header r;
  r.type = MsgType::kStatsReply;
  r.job = h.job;
  r.worker = h.worker;
  r.nworkers = h.nworkers;
  r.token = h.token;
  r.seq = h.seq;
  r.aux = static_cast<uint32_t>(v.size());
  uint8_t* p = buf_.data();
  size_t n = proto::write_header(r, p, buf_.size());
  for (uint64_t x : v) {
    proto::store_be64(p + n, x);
    n += 8;
  }
  send_packet(from, p, n, out);
}

void Engine::accumulate(Job& j, Shadow& sh, const Header& h, const uint8_t* pl, bool subtract) {
  uint32_t* L = sh.lanes;
  const int cnt = h.count;
  switch (h.type) {
    case MsgType::kDataValue: {
      const WireInt t = h.enc;
      if (subtract) {
        for (int i = 0; i < cnt; ++i) L[i] -= proto::load_lane(t, pl, i);
      } else if (proto::wire_int_bytes(t) == 1) {
        for (int i = 0; i < cnt; ++i) L[i] += pl[i];
      } else if (proto::wire_int_bytes(t) == 2) {
        for (int i = 0; i < cnt; ++i) L[i] += proto::load_be16(pl + 2 * i);
      } else {
        for (int i = 0; i < cnt; ++i) L[i] += proto::load_be32(pl + 4 * i);
      }
      break;
    }
    case MsgType::kDataIndex: {
      // Two's complement: a negative table entry added as u32 gives the same low bits as a
      // signed sum, so one code path serves signed and unsigned sum types.
      const int32_t* T = j.tables[h.aux].values;
      const int b = h.bits;
      const uint32_t sign = subtract ? ~0u : 1u;  // multiply by +-1 modulo 2^32
      if (b == 4) {
        for (int i = 0; i + 1 < cnt; i += 2) {
          const uint8_t byte = pl[i / 2];
          L[i] += sign * static_cast<uint32_t>(T[byte & 0xF]);
          L[i + 1] += sign * static_cast<uint32_t>(T[byte >> 4]);
        }
        if (cnt & 1) L[cnt - 1] += sign * static_cast<uint32_t>(T[pl[(cnt - 1) / 2] & 0xF]);
      } else if (b == 8) {
        for (int i = 0; i < cnt; ++i) L[i] += sign * static_cast<uint32_t>(T[pl[i]]);
      } else {
        for (int i = 0; i < cnt; ++i) L[i] += sign * static_cast<uint32_t>(T[proto::get_index(pl, i, b)]);
      }
      break;
    }
    case MsgType::kDataMax:
      for (int i = 0; i < cnt; ++i) L[i] = std::max(L[i], proto::load_be32(pl + 4 * i));
      break;
    default: break;
  }
}

void Engine::send_result(Job& j, uint32_t slot, const Shadow& sh, uint64_t to_mask, bool resend, Sink& out) {
  Header r;
  r.type = MsgType::kResult;
  r.job = j.id;
  r.nworkers = j.n;
  r.slot = static_cast<uint16_t>(slot);
  r.shadow = static_cast<uint8_t>((sh.seq / j.S) & 1);
  r.enc = sh.type == MsgType::kDataMax ? WireInt::kU32 : sh.enc;
  r.count = sh.count;
  r.contributors = static_cast<uint16_t>(popcount(sh.counted));
  r.token = j.token;
  r.seq = sh.seq;
  r.op = sh.op;
  r.bitmap = sh.counted;
  uint8_t* p = buf_.data();
  const size_t plen = proto::data_payload_bytes(MsgType::kResult, r.enc, 0);
  for (int i = 0; i < proto::kLanes; ++i) proto::store_lane(r.enc, p + proto::kHeaderBytes, i, sh.lanes[i]);
  for (uint64_t m = to_mask; m; m &= m - 1) {
    const int w = __builtin_ctzll(m);
    r.worker = static_cast<uint16_t>(w);
    r.flags = static_cast<uint16_t>((r.contributors < j.n ? proto::kFlagPartial : 0) |
                                    ((sh.counted >> w) & 1 ? 0 : proto::kFlagNotCounted));
    proto::write_header(r, p, buf_.size());
    send_packet(j.peer[w], p, proto::kHeaderBytes + plen, out);
    stats_->results_sent.add();
    if (resend) stats_->result_resends.add();
  }
}

bool Engine::try_complete(Job& j, uint32_t slot, Shadow& sh, uint64_t now, Sink& out) {
  if (sh.state != kOpen) return false;
  OpRecord* rec = j.find_op(sh.op);
  bool done;
  if (rec) {
    const uint64_t need = rec->members;
    // MAX cannot take a value back out, and needs not: any superset of the members gives every
    // recipient the same maximum.
    done = sh.type == MsgType::kDataMax ? (sh.counted & need) == need : sh.counted == need;
  } else {
    done = sh.counted == j.all ||
           (j.k < j.n && popcount(sh.counted) >= j.k && now - sh.t_open >= j.qt_us);
  }
  if (!done) return false;
  const bool decided_now = rec == nullptr;
  if (decided_now) {
    OpRecord& r = j.ops[sh.op % j.ops.size()];
    r.op = sh.op;
    r.valid = true;
    r.members = sh.counted;
  }
  sh.state = kDone;
  stats_->slots_completed.add();
  if (sh.counted != j.all) stats_->partial_completions.add();
  send_result(j, slot, sh, sh.seen, false, out);
  if (decided_now && sh.counted != j.all) {
    // Other open slots of this op may now hold exactly the members (software shortcut: a switch
    // completes them on the next retransmission instead).
    const uint32_t op = sh.op;
    for (size_t i = 0; i < open_.size(); ++i) {
      const OpenRef o = open_[i];
      if (o.job != j.id) continue;
      Shadow& x = j.sh(o.slot, o.shadow);
      if (x.state == kOpen && x.seq == o.seq && x.op == op) try_complete(j, o.slot, x, now, out);
    }
  }
  return true;
}

void Engine::on_data(const Header& h, const uint8_t* pl, const PeerAddr& from, uint64_t now, Sink& out) {
  Job* jp = auth(h, from, out);
  if (!jp) return;
  Job& j = *jp;
  const uint64_t S = j.S;
  if (h.slot >= S || h.seq == kEmpty || h.seq % S != h.slot || ((h.seq / S) & 1) != h.shadow) {
    drop(Drop::kBadSlot);
    return;
  }
  if (h.type == MsgType::kDataIndex) {
    const Table& t = j.tables[h.aux];
    if (!t.valid || t.bits != h.bits || t.sum != h.enc) {
      drop(Drop::kNoTable);
      reply_error(h, ErrorCode::kNoTable, from, out);
      return;
    }
  }
  j.peer[h.worker] = from;
  j.last_active = now;
  Shadow& sh = j.sh(h.slot, h.shadow);
  if (sh.seq == kEmpty || sh.seq < h.seq) {
    // Opening the next use of this shadow set.
    if (sh.seq != kEmpty) {
      if (sh.seq + 2 * S != h.seq) {
        drop(Drop::kBadSlot);  // a skipped use: no correct worker numbers packets like that
        return;
      }
      const Shadow& other = j.sh(h.slot, h.shadow ^ 1);
      // Every worker sent seq - S, so every worker holds the result of seq - 2S, the result this
      // shadow set still keeps for retransmissions.
      if (sh.state != kDone || other.seq + S != h.seq || other.seen != j.all) {
        drop(Drop::kSlotBusy);
        return;
      }
    } else if (h.seq >= 2 * S) {
      drop(Drop::kBadSlot);
      return;
    }
    sh.seq = h.seq;
    sh.op = h.op;
    sh.type = h.type;
    sh.enc = h.enc;
    sh.bits = h.bits;
    sh.table = static_cast<uint8_t>(h.type == MsgType::kDataIndex ? h.aux : 0);
    sh.count = h.count;
    sh.counted = 0;
    sh.seen = 0;
    sh.t_open = now;
    sh.state = kOpen;
    std::memset(sh.lanes, 0, proto::kLanes * sizeof(uint32_t));
    open_.push_back(OpenRef{j.id, h.slot, h.shadow, h.seq});
  } else if (sh.seq > h.seq) {
    drop(Drop::kStale);
    return;
  }
  if (sh.op != h.op || sh.type != h.type || sh.enc != h.enc || sh.bits != h.bits || sh.count != h.count ||
      (h.type == MsgType::kDataIndex && sh.table != h.aux)) {
    drop(Drop::kMismatch);
    reply_error(h, ErrorCode::kConfigMismatch, from, out);
    return;
  }
  if (h.flags & proto::kFlagRetransmit) stats_->retransmissions.add();
  const uint64_t bit = uint64_t{1} << h.worker;
  const bool was_seen = (sh.seen & bit) != 0;
  sh.seen |= bit;
  if (sh.state == kDone) {
    if (!(sh.counted & bit) && !was_seen) stats_->late_not_counted.add();
    send_result(j, h.slot, sh, bit, was_seen, out);
    return;
  }
  const OpRecord* rec = j.find_op(h.op);
  if (rec && !(rec->members & bit)) {
    // Left out of this op by an earlier partial completion.
    if ((sh.counted & bit) && h.type != MsgType::kDataMax) {
      accumulate(j, sh, h, pl, /*subtract=*/true);
      sh.counted &= ~bit;
      stats_->retractions.add();
    }
    if (!was_seen) stats_->late_not_counted.add();
    Header a;
    a.type = MsgType::kAck;
    a.flags = proto::kFlagNotCounted;
    a.job = j.id;
    a.worker = h.worker;
    a.nworkers = j.n;
    a.slot = h.slot;
    a.shadow = h.shadow;
    a.token = j.token;
    a.seq = h.seq;
    a.op = h.op;
    uint8_t b[proto::kHeaderBytes];
    proto::write_header(a, b, sizeof b);
    send_packet(from, b, sizeof b, out);
  } else if (sh.counted & bit) {
    stats_->duplicates.add();
  } else {
    accumulate(j, sh, h, pl, /*subtract=*/false);
    sh.counted |= bit;
    stats_->elements.add(h.count);
  }
  try_complete(j, h.slot, sh, now, out);
}

void Engine::free_job(uint32_t id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  budget_->release(it->second->footprint);
  memory_ -= it->second->footprint;
  jobs_.erase(it);
  stats_->jobs_freed.add();
}

void Engine::tick(uint64_t now, Sink& out) {
  // Pass 1: quorum timeouts (try_complete may scan open_ but never changes it).
  for (size_t i = 0; i < open_.size(); ++i) {
    const OpenRef o = open_[i];
    auto it = jobs_.find(o.job);
    if (it == jobs_.end()) continue;
    Job& j = *it->second;
    Shadow& sh = j.sh(o.slot, o.shadow);
    if (sh.seq == o.seq && sh.state == kOpen) try_complete(j, o.slot, sh, now, out);
  }
  // Pass 2: forget slots that are no longer open.
  size_t k = 0;
  for (size_t i = 0; i < open_.size(); ++i) {
    const OpenRef o = open_[i];
    auto it = jobs_.find(o.job);
    if (it == jobs_.end()) continue;
    const Shadow& sh = it->second->sh(o.slot, o.shadow);
    if (sh.seq == o.seq && sh.state == kOpen) open_[k++] = o;
  }
  open_.resize(k);
  if (now - last_gc_us_ >= kGcIntervalUs || now < last_gc_us_) {
    last_gc_us_ = now;
    std::vector<uint32_t> idle;
    for (auto& kv : jobs_)
      if (now > kv.second->last_active && now - kv.second->last_active > cfg_.job_idle_timeout_us) idle.push_back(kv.first);
    for (uint32_t id : idle) {
      free_job(id);
      stats_->jobs_expired.add();
    }
  }
}

uint64_t Engine::tick_interval_us() const { return open_.empty() ? 100'000 : 1'000; }

}  // namespace thc::switch_offload
