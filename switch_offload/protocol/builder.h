// Whole-packet builders over wire.h and auth.h, for tests, the corpus generator and tools that
// speak the protocol by hand. The UDP client builds its packets in place instead (no allocation
// per packet).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "switch_offload/protocol/auth.h"
#include "switch_offload/protocol/wire.h"

namespace thc::switch_offload::proto {

// What identifies and authenticates a job instance for a hand-made packet. The data key depends
// on the job's seed (JOIN_ACK); tests set it once they know the seed (with_seed).
struct JobId {
  uint64_t job = make_job_id(1, 1);
  uint16_t nworkers = 1;
  uint16_t shard = 0;
  auth::Key key;            // the tenant key (id must match job_key_id(job))
  auth::TagKey jkey, dkey;  // join and data tag keys
  static JobId make(const auth::Key& k, uint32_t label, uint16_t n, uint16_t shard = 0) {
    JobId j;
    j.job = make_job_id(k.id, label);
    j.nworkers = n;
    j.shard = shard;
    j.key = k;
    j.jkey = auth::join_key(k, j.job);
    return j;
  }
  void with_seed(uint64_t seed) { dkey = auth::data_key(key, job, seed); }
};

inline std::vector<uint8_t> make_packet(const Header& h, const std::vector<uint8_t>& payload,
                                        const auth::TagKey* key) {
  std::vector<uint8_t> p(kHeaderBytes + payload.size());
  write_header(h, p.data(), p.size());
  std::copy(payload.begin(), payload.end(), p.begin() + kHeaderBytes);
  if (key) auth::sign(*key, p.data(), p.size());
  return p;
}

inline Header control_header(MsgType t, const JobId& j, uint16_t worker, uint64_t nonce) {
  Header h;
  h.type = t;
  h.job = j.job;
  h.shard = j.shard;
  h.nworkers = j.nworkers;
  h.worker = worker;
  h.seq = nonce;
  return h;
}

// A STATS request (padded to kStatsRequestBytes): key = the operator's stats key, or null from
// loopback. seq must grow from request to request (the aggregator refuses replays).
inline std::vector<uint8_t> make_stats(uint64_t seq, const auth::TagKey* key) {
  Header h;
  h.type = MsgType::kStats;
  h.job = make_job_id(0, 0);
  h.seq = seq;
  return make_packet(h, std::vector<uint8_t>(kStatsRequestBytes, 0), key);
}

struct JoinParams {
  uint16_t quorum = 1;
  uint16_t slots = 8;
  uint32_t quorum_timeout_us = 100'000;
  uint16_t max_lanes = kTofinoLanes;
  uint16_t payload_budget = kTofinoPayloadBudget;
  uint32_t flags = 0;
  const uint8_t* cookie = nullptr;  // null: zero (a first JOIN, answered with CHALLENGE)
  const TableSpec* table = nullptr;
};

inline std::vector<uint8_t> make_join(const JobId& j, uint16_t worker, const JoinParams& p, uint64_t nonce = 1) {
  JoinBody b;
  if (p.cookie) std::copy(p.cookie, p.cookie + kCookieBytes, b.cookie);
  b.quorum = p.quorum;
  b.slots = p.slots;
  b.quorum_timeout_us = p.quorum_timeout_us;
  b.max_lanes = p.max_lanes;
  b.payload_budget = p.payload_budget;
  b.flags = p.flags;
  if (p.table) b.table = *p.table;
  std::vector<uint8_t> body(kMaxPacketBytes);
  body.resize(write_join(b, body.data(), body.size()));
  return make_packet(control_header(MsgType::kJoin, j, worker, nonce), body, &j.jkey);
}

inline std::vector<uint8_t> make_table(const JobId& j, uint16_t worker, const TableSpec& t, uint64_t nonce = 2) {
  std::vector<uint8_t> body(kMaxPacketBytes);
  body.resize(write_table(t, body.data(), body.size()));
  return make_packet(control_header(MsgType::kTable, j, worker, nonce), body, &j.dkey);
}

inline std::vector<uint8_t> make_leave(const JobId& j, uint16_t worker, uint64_t nonce = 3) {
  return make_packet(control_header(MsgType::kLeave, j, worker, nonce), {}, &j.dkey);
}

// A data packet for packet sequence number `seq` of a job with `slots` slots and `lanes` lanes.
inline Header data_header(MsgType t, const JobId& j, uint16_t worker, uint32_t slots, uint64_t seq, uint32_t op,
                          WireInt enc, uint16_t count, uint16_t lanes, uint8_t bits = 0, uint32_t table_id = 0) {
  Header h;
  h.type = t;
  h.job = j.job;
  h.shard = j.shard;
  h.nworkers = j.nworkers;
  h.worker = worker;
  h.slot = static_cast<uint16_t>(seq % slots);
  h.shadow = static_cast<uint8_t>((seq / slots) & 1);
  h.seq = seq;
  h.op = op;
  h.lanes = lanes;
  h.enc = enc;
  h.count = count;
  h.bits = bits;
  h.aux = table_id;
  return h;
}

// Value form: values[i] (low bits of the type) for i < values.size() <= lanes.
inline std::vector<uint8_t> make_values(const JobId& j, uint16_t worker, uint32_t slots, uint64_t seq, uint32_t op,
                                        WireInt enc, const std::vector<uint32_t>& values,
                                        MsgType type = MsgType::kDataValue, uint16_t lanes = kTofinoLanes) {
  const Header h = data_header(type, j, worker, slots, seq, op, enc, static_cast<uint16_t>(values.size()), lanes);
  std::vector<uint8_t> pl(data_payload_bytes(type, enc, 0, lanes), 0);
  for (size_t i = 0; i < values.size(); ++i) store_lane(enc, pl.data(), static_cast<int>(i), values[i]);
  return make_packet(h, pl, &j.dkey);
}

// Index form: codes[i] < 2^bits, packed LSB-first.
inline std::vector<uint8_t> make_indices(const JobId& j, uint16_t worker, uint32_t slots, uint64_t seq, uint32_t op,
                                         WireInt sum, int bits, uint32_t table_id, const std::vector<uint8_t>& codes,
                                         uint16_t lanes = kTofinoLanes) {
  const Header h = data_header(MsgType::kDataIndex, j, worker, slots, seq, op, sum, static_cast<uint16_t>(codes.size()),
                               lanes, static_cast<uint8_t>(bits), table_id);
  std::vector<uint8_t> pl(data_payload_bytes(MsgType::kDataIndex, sum, bits, lanes), 0);
  for (size_t i = 0; i < codes.size(); ++i) {
    const uint64_t bit = i * static_cast<uint64_t>(bits);
    pl[bit >> 3] |= static_cast<uint8_t>(codes[i] << (bit & 7));
    if ((bit & 7) + bits > 8) pl[(bit >> 3) + 1] |= static_cast<uint8_t>(codes[i] >> (8 - (bit & 7)));
  }
  return make_packet(h, pl, &j.dkey);
}

// The k-th resend (k >= 1) of an upstream data packet built above: RETRANSMIT set, attempt k,
// signed again with the job's data key.
inline std::vector<uint8_t> as_resend(std::vector<uint8_t> p, uint16_t attempt, const JobId& j) {
  store_be16(p.data() + 6, static_cast<uint16_t>(load_be16(p.data() + 6) | kFlagRetransmit));
  store_be16(p.data() + 28, attempt);
  auth::sign(j.dkey, p.data(), p.size());
  return p;
}

}  // namespace thc::switch_offload::proto
