// Whole-packet builders over wire.h, for tests, the corpus generator and tools that speak the
// protocol by hand. The UDP client builds its packets in place instead (no allocation per packet).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "switch_offload/protocol/wire.h"

namespace thc::switch_offload::proto {

inline std::vector<uint8_t> make_packet(const Header& h, const std::vector<uint8_t>& payload = {}) {
  std::vector<uint8_t> p(kHeaderBytes + payload.size());
  write_header(h, p.data(), p.size());
  std::copy(payload.begin(), payload.end(), p.begin() + kHeaderBytes);
  return p;
}

struct JobId {
  uint32_t job = 1;
  uint64_t token = 0;
  uint16_t nworkers = 1;
};

inline Header control_header(MsgType t, const JobId& j, uint16_t worker, uint64_t nonce) {
  Header h;
  h.type = t;
  h.job = j.job;
  h.token = j.token;
  h.nworkers = j.nworkers;
  h.worker = worker;
  h.seq = nonce;
  return h;
}

inline std::vector<uint8_t> make_join(const JobId& j, uint16_t worker, uint16_t quorum, uint16_t slots,
                                      uint32_t quorum_timeout_us, const TableSpec* table = nullptr,
                                      uint64_t nonce = 1) {
  JoinBody b;
  b.quorum = quorum;
  b.slots = slots;
  b.quorum_timeout_us = quorum_timeout_us;
  if (table) b.table = *table;
  std::vector<uint8_t> body(kMaxPacketBytes);
  body.resize(write_join(b, body.data(), body.size()));
  return make_packet(control_header(MsgType::kJoin, j, worker, nonce), body);
}

inline std::vector<uint8_t> make_table(const JobId& j, uint16_t worker, const TableSpec& t, uint64_t nonce = 2) {
  std::vector<uint8_t> body(kMaxPacketBytes);
  body.resize(write_table(t, body.data(), body.size()));
  return make_packet(control_header(MsgType::kTable, j, worker, nonce), body);
}

inline std::vector<uint8_t> make_leave(const JobId& j, uint16_t worker, uint64_t nonce = 3) {
  return make_packet(control_header(MsgType::kLeave, j, worker, nonce));
}

// A data packet for packet sequence number `seq` of a job with `slots` slots.
inline Header data_header(MsgType t, const JobId& j, uint16_t worker, uint32_t slots, uint64_t seq, uint32_t op,
                          WireInt enc, uint16_t count, uint8_t bits = 0, uint32_t table_id = 0) {
  Header h;
  h.type = t;
  h.job = j.job;
  h.token = j.token;
  h.nworkers = j.nworkers;
  h.worker = worker;
  h.slot = static_cast<uint16_t>(seq % slots);
  h.shadow = static_cast<uint8_t>((seq / slots) & 1);
  h.seq = seq;
  h.op = op;
  h.enc = enc;
  h.count = count;
  h.bits = bits;
  h.aux = table_id;
  return h;
}

// Value form: values[i] (low bits of the type) for i < values.size() <= kLanes.
inline std::vector<uint8_t> make_values(const JobId& j, uint16_t worker, uint32_t slots, uint64_t seq, uint32_t op,
                                        WireInt enc, const std::vector<uint32_t>& values,
                                        MsgType type = MsgType::kDataValue) {
  const Header h = data_header(type, j, worker, slots, seq, op, enc, static_cast<uint16_t>(values.size()));
  std::vector<uint8_t> pl(data_payload_bytes(type, enc, 0), 0);
  for (size_t i = 0; i < values.size(); ++i) store_lane(enc, pl.data(), static_cast<int>(i), values[i]);
  return make_packet(h, pl);
}

// Index form: codes[i] < 2^bits, packed LSB-first.
inline std::vector<uint8_t> make_indices(const JobId& j, uint16_t worker, uint32_t slots, uint64_t seq, uint32_t op,
                                         WireInt sum, int bits, uint32_t table_id, const std::vector<uint8_t>& codes) {
  const Header h = data_header(MsgType::kDataIndex, j, worker, slots, seq, op, sum, static_cast<uint16_t>(codes.size()),
                               static_cast<uint8_t>(bits), table_id);
  std::vector<uint8_t> pl(data_payload_bytes(MsgType::kDataIndex, sum, bits), 0);
  for (size_t i = 0; i < codes.size(); ++i) {
    const uint64_t bit = i * static_cast<uint64_t>(bits);
    pl[bit >> 3] |= static_cast<uint8_t>(codes[i] << (bit & 7));
    if ((bit & 7) + bits > 8) pl[(bit >> 3) + 1] |= static_cast<uint8_t>(codes[i] >> (8 - (bit & 7)));
  }
  return make_packet(h, pl);
}

}  // namespace thc::switch_offload::proto
