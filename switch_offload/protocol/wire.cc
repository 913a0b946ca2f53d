#include "switch_offload/protocol/wire.h"

#include <cstring>

namespace thc::switch_offload::proto {

const char* parse_error_name(ParseError e) {
  switch (e) {
    case ParseError::kOk: return "ok";
    case ParseError::kTruncated: return "truncated";
    case ParseError::kBadMagic: return "bad_magic";
    case ParseError::kBadVersion: return "bad_version";
    case ParseError::kBadType: return "bad_type";
    case ParseError::kBadField: return "bad_field";
    case ParseError::kBadLength: return "bad_length";
  }
  return "?";
}

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kJoin: return "JOIN";
    case MsgType::kJoinAck: return "JOIN_ACK";
    case MsgType::kTable: return "TABLE";
    case MsgType::kTableAck: return "TABLE_ACK";
    case MsgType::kLeave: return "LEAVE";
    case MsgType::kLeaveAck: return "LEAVE_ACK";
    case MsgType::kChallenge: return "CHALLENGE";
    case MsgType::kDataValue: return "DATA_VALUE";
    case MsgType::kDataIndex: return "DATA_INDEX";
    case MsgType::kDataMax: return "DATA_MAX";
    case MsgType::kResult: return "RESULT";
    case MsgType::kAck: return "ACK";
    case MsgType::kError: return "ERROR";
    case MsgType::kStats: return "STATS";
    case MsgType::kStatsReply: return "STATS_REPLY";
  }
  return "?";
}

const char* error_code_name(ErrorCode e) {
  switch (e) {
    case ErrorCode::kNone: return "none";
    case ErrorCode::kUnknownJob: return "unknown job";
    case ErrorCode::kBadWorker: return "bad worker";
    case ErrorCode::kConfigMismatch: return "config mismatch";
    case ErrorCode::kNoResources: return "no resources";
    case ErrorCode::kNoTable: return "no table";
    case ErrorCode::kLeftBehind: return "left behind";
    case ErrorCode::kNotSupported: return "not supported";
    case ErrorCode::kJobBusy: return "job busy";
  }
  return "?";
}

size_t wire_int_bytes(WireInt t) {
  switch (t) {
    case WireInt::kU8: case WireInt::kI8: return 1;
    case WireInt::kU16: case WireInt::kI16: return 2;
    case WireInt::kU32: case WireInt::kI32: return 4;
    case WireInt::kNone: return 0;
  }
  return 0;
}
bool wire_int_signed(WireInt t) { return t == WireInt::kI8 || t == WireInt::kI16 || t == WireInt::kI32; }
bool wire_int_valid(WireInt t) {
  const auto v = static_cast<uint8_t>(t);
  return v >= 1 && v <= 6;
}
const char* wire_int_name(WireInt t) {
  switch (t) {
    case WireInt::kU8: return "u8";
    case WireInt::kU16: return "u16";
    case WireInt::kU32: return "u32";
    case WireInt::kI8: return "i8";
    case WireInt::kI16: return "i16";
    case WireInt::kI32: return "i32";
    case WireInt::kNone: return "none";
  }
  return "?";
}

size_t data_payload_bytes(MsgType t, WireInt enc, int bits, int lanes) {
  if (lanes < kLaneQuantum || lanes > kMaxLanes || lanes % kLaneQuantum != 0) return 0;
  const size_t L = static_cast<size_t>(lanes);
  switch (t) {
    case MsgType::kDataValue:
    case MsgType::kResult: return L * wire_int_bytes(enc);
    case MsgType::kDataMax: return L * 4;
    case MsgType::kDataIndex: return (bits >= 1 && bits <= 8) ? L / 8 * static_cast<size_t>(bits) : 0;
    default: return 0;
  }
}

int lanes_for(MsgType t, WireInt enc, int bits, int max_lanes, int payload_budget) {
  // Bytes per 8 lanes in the wider direction: upstream payload or the RESULT of `enc` sums.
  const WireInt sum = t == MsgType::kDataMax ? WireInt::kU32 : enc;
  size_t up8 = 0;
  switch (t) {
    case MsgType::kDataValue: up8 = 8 * wire_int_bytes(enc); break;
    case MsgType::kDataMax: up8 = 32; break;
    case MsgType::kDataIndex: up8 = (bits >= 1 && bits <= 8) ? static_cast<size_t>(bits) : 0; break;
    default: return 0;
  }
  const size_t down8 = 8 * wire_int_bytes(sum);
  const size_t per8 = up8 > down8 ? up8 : down8;
  if (per8 == 0 || payload_budget <= 0) return 0;
  size_t lanes = static_cast<size_t>(payload_budget) / per8 * 8;
  lanes -= lanes % kLaneQuantum;
  const size_t cap = static_cast<size_t>(max_lanes < kMaxLanes ? max_lanes : kMaxLanes);
  if (lanes > cap) lanes = cap - cap % kLaneQuantum;
  return static_cast<int>(lanes);
}

namespace {

bool known_type(uint8_t t) {
  switch (static_cast<MsgType>(t)) {
    case MsgType::kJoin: case MsgType::kJoinAck: case MsgType::kTable: case MsgType::kTableAck:
    case MsgType::kLeave: case MsgType::kLeaveAck: case MsgType::kChallenge: case MsgType::kDataValue: case MsgType::kDataIndex:
    case MsgType::kDataMax: case MsgType::kResult: case MsgType::kAck: case MsgType::kError:
    case MsgType::kStats: case MsgType::kStatsReply:
      return true;
  }
  return false;
}

int popcount64(uint64_t v) { return __builtin_popcountll(v); }

bool is_upstream_data(MsgType t) {
  return t == MsgType::kDataValue || t == MsgType::kDataIndex || t == MsgType::kDataMax;
}

bool error_code_known(uint32_t c) {
  switch (static_cast<ErrorCode>(c)) {
    case ErrorCode::kUnknownJob: case ErrorCode::kBadWorker: case ErrorCode::kConfigMismatch:
    case ErrorCode::kNoResources: case ErrorCode::kNoTable: case ErrorCode::kLeftBehind: case ErrorCode::kJobBusy:
    case ErrorCode::kNotSupported:
      return true;
    case ErrorCode::kNone: break;
  }
  return false;
}

bool workers_ok(const Header& h) { return h.nworkers >= 1 && h.nworkers <= kMaxWorkers && h.worker < h.nworkers; }
bool bitmap_fits(const Header& h) { return h.nworkers >= 64 || (h.bitmap >> h.nworkers) == 0; }
// Fields a control message does not use must be zero.
bool control_clean(const Header& h) {
  return h.slot == 0 && h.shadow == 0 && h.lanes == 0 && h.enc == WireInt::kNone && h.bits == 0 && h.count == 0 &&
         h.contributors == 0 && h.op == 0 && h.aux == 0 && h.bitmap == 0 && h.flags == 0;
}
bool lanes_ok(const Header& h) {
  return h.lanes >= kLaneQuantum && h.lanes <= kMaxLanes && h.lanes % kLaneQuantum == 0 && h.count >= 1 &&
         h.count <= h.lanes;
}

// Per-type validation: field ranges, then the payload length the type fixes.
ParseError check(const Header& h, size_t plen, const uint8_t* payload) {
  switch (h.type) {
    case MsgType::kDataValue:
    case MsgType::kDataIndex:
    case MsgType::kDataMax: {
      if (!workers_ok(h) || !wire_int_valid(h.enc) || !lanes_ok(h) || h.contributors != 0 || h.bitmap != 0 ||
          (h.flags & ~(kFlagRetransmit | kFlagFirst)) != 0 || ((h.flags & kFlagRetransmit) != 0) != (h.attempt > 0))
        return ParseError::kBadField;
      if (h.type == MsgType::kDataIndex) {
        if (h.bits < 1 || h.bits > 8 || h.aux >= kTableIds) return ParseError::kBadField;
      } else {
        if (h.bits != 0 || h.aux != 0) return ParseError::kBadField;
        if (h.type == MsgType::kDataMax && h.enc != WireInt::kU32) return ParseError::kBadField;
      }
      return plen == data_payload_bytes(h.type, h.enc, h.bits, h.lanes) ? ParseError::kOk : ParseError::kBadLength;
    }
    case MsgType::kResult: {
      if (!workers_ok(h) || !wire_int_valid(h.enc) || h.bits != 0 || !lanes_ok(h) ||
          h.contributors > h.nworkers || popcount64(h.bitmap) != h.contributors || !bitmap_fits(h) ||
          h.aux != 0 || (h.flags & ~(kFlagNotCounted | kFlagPartial)) != 0)
        return ParseError::kBadField;
      return plen == data_payload_bytes(h.type, h.enc, 0, h.lanes) ? ParseError::kOk : ParseError::kBadLength;
    }
    case MsgType::kAck: {
      if (!workers_ok(h) || h.lanes != 0 || h.enc != WireInt::kNone || h.bits != 0 || h.count != 0 || h.contributors != 0 ||
          h.bitmap != 0 || h.aux != 0 || (h.flags & ~kFlagNotCounted) != 0)
        return ParseError::kBadField;
      return plen == 0 ? ParseError::kOk : ParseError::kBadLength;
    }
    case MsgType::kJoin: {
      if (!workers_ok(h) || !control_clean(h)) return ParseError::kBadField;
      if (plen < kJoinFixedBytes + kTableHeaderBytes) return ParseError::kBadLength;
      const int bits = payload[kJoinFixedBytes + 1];
      if (bits > 8) return ParseError::kBadField;
      const size_t want = kJoinFixedBytes + kTableHeaderBytes + (bits ? 4u << bits : 0u);
      return plen == want ? ParseError::kOk : ParseError::kBadLength;
    }
    case MsgType::kTable: {
      if (!workers_ok(h) || !control_clean(h)) return ParseError::kBadField;
      if (plen < kTableHeaderBytes) return ParseError::kBadLength;
      const int bits = payload[1];
      if (bits < 1 || bits > 8) return ParseError::kBadField;
      return plen == kTableHeaderBytes + (4u << bits) ? ParseError::kOk : ParseError::kBadLength;
    }
    case MsgType::kJoinAck:
      if (!workers_ok(h) || !control_clean(h)) return ParseError::kBadField;
      return plen == kJoinAckBytes ? ParseError::kOk : ParseError::kBadLength;
    case MsgType::kChallenge:
      if (!workers_ok(h) || !control_clean(h)) return ParseError::kBadField;
      return plen == kCookieBytes ? ParseError::kOk : ParseError::kBadLength;
    case MsgType::kTableAck:
    case MsgType::kLeave:
    case MsgType::kLeaveAck:
      if (!workers_ok(h) || !control_clean(h)) return ParseError::kBadField;
      return plen == 0 ? ParseError::kOk : ParseError::kBadLength;
    case MsgType::kError: {
      // Errors echo whatever identified the offending packet, so only ranges are checked.
      if (h.nworkers > kMaxWorkers || h.worker >= kMaxWorkers || !error_code_known(h.aux) || h.lanes != 0 || h.enc != WireInt::kNone || h.bits != 0 ||
          h.count != 0 || h.contributors != 0 || h.bitmap != 0 || h.flags != 0)
        return ParseError::kBadField;
      return plen == 0 ? ParseError::kOk : ParseError::kBadLength;
    }
    case MsgType::kStats:
      if (h.lanes != 0 || h.enc != WireInt::kNone || h.bits != 0 || h.count != 0 || h.contributors != 0 || h.bitmap != 0 ||
          h.aux != 0 || h.flags != 0)
        return ParseError::kBadField;
      if (plen != kStatsRequestBytes) return ParseError::kBadLength;
      for (size_t i = 0; i < plen; ++i)
        if (payload[i] != 0) return ParseError::kBadField;
      return ParseError::kOk;
    case MsgType::kStatsReply:
      if (h.aux < 1 || h.aux > kMaxStatsCounters || h.lanes != 0 || h.enc != WireInt::kNone || h.bits != 0 || h.count != 0 ||
          h.contributors != 0 || h.bitmap != 0 || h.flags != 0)
        return ParseError::kBadField;
      return plen == 8u * h.aux ? ParseError::kOk : ParseError::kBadLength;
  }
  return ParseError::kBadType;
}

}  // namespace

ParseError parse(const uint8_t* buf, size_t len, Header* h, const uint8_t** payload, size_t* payload_len) {
  if (buf == nullptr || len < kHeaderBytes) return ParseError::kTruncated;
  if (load_be32(buf) != kMagic) return ParseError::kBadMagic;
  if (buf[4] != kVersion) return ParseError::kBadVersion;
  if (!known_type(buf[5])) return ParseError::kBadType;
  if (len > kMaxPacketBytes) return ParseError::kBadLength;
  Header x;
  x.type = static_cast<MsgType>(buf[5]);
  x.flags = load_be16(buf + 6);
  if ((x.flags & ~kKnownFlags) != 0) return ParseError::kBadField;
  x.job = load_be64(buf + 8);
  x.worker = load_be16(buf + 16);
  x.nworkers = load_be16(buf + 18);
  const uint16_t slot = load_be16(buf + 20);
  x.slot = slot & 0x7FFF;
  x.shadow = static_cast<uint8_t>(slot >> 15);
  x.lanes = load_be16(buf + 22);
  const uint8_t enc = buf[24];
  if (enc > 6) return ParseError::kBadField;
  x.enc = static_cast<WireInt>(enc);
  x.bits = buf[25];
  x.count = load_be16(buf + 26);
  x.contributors = load_be16(buf + 28);
  if (is_upstream_data(x.type)) {
    // Upstream data carry their attempt number where results carry their contributors.
    x.attempt = x.contributors;
    x.contributors = 0;
  }
  x.shard = load_be16(buf + 30);
  if (x.shard >= kMaxShards) return ParseError::kBadField;
  x.seq = load_be64(buf + 32);
  x.op = load_be32(buf + 40);
  x.aux = load_be32(buf + 44);
  x.bitmap = load_be64(buf + 48);
  x.tag = load_be64(buf + kTagOffset);
  const uint8_t* p = buf + kHeaderBytes;
  const size_t plen = len - kHeaderBytes;
  const ParseError e = check(x, plen, p);
  if (e != ParseError::kOk) return e;
  if (h) *h = x;
  if (payload) *payload = p;
  if (payload_len) *payload_len = plen;
  return ParseError::kOk;
}

size_t write_header(const Header& h, uint8_t* out, size_t cap) {
  if (out == nullptr || cap < kHeaderBytes) return 0;
  store_be32(out, kMagic);
  out[4] = kVersion;
  out[5] = static_cast<uint8_t>(h.type);
  store_be16(out + 6, h.flags);
  store_be64(out + 8, h.job);
  store_be16(out + 16, h.worker);
  store_be16(out + 18, h.nworkers);
  store_be16(out + 20, static_cast<uint16_t>((h.slot & 0x7FFF) | ((h.shadow & 1) << 15)));
  store_be16(out + 22, h.lanes);
  out[24] = static_cast<uint8_t>(h.enc);
  out[25] = h.bits;
  store_be16(out + 26, h.count);
  store_be16(out + 28, is_upstream_data(h.type) ? h.attempt : h.contributors);
  store_be16(out + 30, h.shard);
  store_be64(out + 32, h.seq);
  store_be32(out + 40, h.op);
  store_be32(out + 44, h.aux);
  store_be64(out + 48, h.bitmap);
  store_be64(out + kTagOffset, h.tag);
  return kHeaderBytes;
}

ParseError parse_table(const uint8_t* p, size_t len, TableSpec* out) {
  if (len < kTableHeaderBytes) return ParseError::kBadLength;
  TableSpec t;
  t.id = p[0];
  t.bits = p[1];
  t.sum = static_cast<WireInt>(p[2] <= 6 ? p[2] : 0);
  if (t.id >= kTableIds || t.bits > 8 || p[3] != 0) return ParseError::kBadField;
  if (t.bits == 0) {
    if (p[2] != 0) return ParseError::kBadField;
  } else if (p[2] > 6 || !wire_int_valid(t.sum)) {
    return ParseError::kBadField;
  }
  if (len != kTableHeaderBytes + 4u * t.entries()) return ParseError::kBadLength;
  for (int i = 0; i < t.entries(); ++i)
    t.values[i] = static_cast<int32_t>(load_be32(p + kTableHeaderBytes + 4 * i));
  if (out) *out = t;
  return ParseError::kOk;
}

size_t write_table(const TableSpec& t, uint8_t* out, size_t cap) {
  const size_t need = kTableHeaderBytes + 4u * t.entries();
  if (out == nullptr || cap < need || t.bits > 8) return 0;
  out[0] = t.id;
  out[1] = t.bits;
  out[2] = static_cast<uint8_t>(t.bits ? t.sum : WireInt::kNone);
  out[3] = 0;
  for (int i = 0; i < t.entries(); ++i) store_be32(out + kTableHeaderBytes + 4 * i, static_cast<uint32_t>(t.values[i]));
  return need;
}

ParseError parse_join(const uint8_t* p, size_t len, uint16_t nworkers, JoinBody* out) {
  if (len < kJoinFixedBytes + kTableHeaderBytes) return ParseError::kBadLength;
  JoinBody b;
  std::memcpy(b.cookie, p, kCookieBytes);
  const uint8_t* q = p + kCookieBytes;
  b.quorum = load_be16(q);
  b.slots = load_be16(q + 2);
  b.quorum_timeout_us = load_be32(q + 4);
  b.max_lanes = load_be16(q + 8);
  b.payload_budget = load_be16(q + 10);
  b.flags = load_be32(q + 12);
  if ((b.flags & ~kJoinRejoin) != 0) return ParseError::kBadField;
  for (size_t i = 16; i < 16 + kJoinReservedBytes; ++i)
    if (q[i] != 0) return ParseError::kBadField;
  if (b.quorum < 1 || b.quorum > nworkers || b.slots < 1 || b.slots > kMaxSlots || b.max_lanes < kLaneQuantum ||
      b.max_lanes > kMaxLanes || b.payload_budget < kLaneQuantum / 2)
    return ParseError::kBadField;
  const ParseError e = parse_table(p + kJoinFixedBytes, len - kJoinFixedBytes, &b.table);
  if (e != ParseError::kOk) return e;
  if (out) *out = b;
  return ParseError::kOk;
}

size_t write_join(const JoinBody& b, uint8_t* out, size_t cap) {
  if (out == nullptr || cap < kJoinFixedBytes) return 0;
  std::memcpy(out, b.cookie, kCookieBytes);
  uint8_t* q = out + kCookieBytes;
  store_be16(q, b.quorum);
  store_be16(q + 2, b.slots);
  store_be32(q + 4, b.quorum_timeout_us);
  store_be16(q + 8, b.max_lanes);
  store_be16(q + 10, b.payload_budget);
  store_be32(q + 12, b.flags);
  std::memset(q + 16, 0, kJoinReservedBytes);
  const size_t t = write_table(b.table, out + kJoinFixedBytes, cap - kJoinFixedBytes);
  return t ? kJoinFixedBytes + t : 0;
}

ParseError parse_join_ack(const uint8_t* p, size_t len, JoinAckBody* out) {
  if (len != kJoinAckBytes) return ParseError::kBadLength;
  JoinAckBody b;
  b.seed = load_be64(p);
  b.slots = load_be16(p + 8);
  b.max_lanes = load_be16(p + 10);
  b.payload_budget = load_be16(p + 12);
  b.nworkers = load_be16(p + 14);
  b.quorum = load_be16(p + 16);
  b.shards = load_be16(p + 18);
  b.quorum_timeout_us = load_be32(p + 20);
  b.resume_op = load_be32(p + 24);
  b.resume_seq = load_be64(p + 28);
  b.resume_flags = load_be32(p + 36);
  if (b.slots < 1 || b.slots > kMaxSlots || b.max_lanes < kLaneQuantum || b.max_lanes > kMaxLanes ||
      b.max_lanes % kLaneQuantum != 0 || b.payload_budget < kLaneQuantum / 2 ||
      b.payload_budget > kMaxPayloadBudget || b.nworkers < 1 || b.nworkers > kMaxWorkers || b.quorum < 1 ||
      b.quorum > b.nworkers || b.shards < 1 || b.shards > kMaxShards || (b.resume_flags & ~(kResumeKnown | kAckDataPlane)) != 0)
    return ParseError::kBadField;
  if (out) *out = b;
  return ParseError::kOk;
}

size_t write_join_ack(const JoinAckBody& b, uint8_t* out, size_t cap) {
  if (out == nullptr || cap < kJoinAckBytes) return 0;
  store_be64(out, b.seed);
  store_be16(out + 8, b.slots);
  store_be16(out + 10, b.max_lanes);
  store_be16(out + 12, b.payload_budget);
  store_be16(out + 14, b.nworkers);
  store_be16(out + 16, b.quorum);
  store_be16(out + 18, b.shards);
  store_be32(out + 20, b.quorum_timeout_us);
  store_be32(out + 24, b.resume_op);
  store_be64(out + 28, b.resume_seq);
  store_be32(out + 36, b.resume_flags);
  return kJoinAckBytes;
}

void copy_indices(const uint8_t* src, uint64_t first, uint64_t count, int b, uint8_t* dst) {
  if ((first * static_cast<uint64_t>(b)) % 8 == 0) {
    // Byte-aligned start (always the case for whole packets: lanes are multiples of 64): a plain copy, with the
    // bits past the last index of a partial final byte cleared.
    const uint64_t bits = count * static_cast<uint64_t>(b);
    const uint64_t bytes = (bits + 7) / 8;
    std::memcpy(dst, src + first * b / 8, bytes);
    if (bits % 8) dst[bytes - 1] &= static_cast<uint8_t>((1u << (bits % 8)) - 1u);
    return;
  }
  for (uint64_t i = 0; i < count; ++i) {
    const uint32_t z = get_index(src, first + i, b);
    const uint64_t bit = i * static_cast<uint64_t>(b);
    dst[bit >> 3] |= static_cast<uint8_t>(z << (bit & 7));
    if ((bit & 7) + b > 8) dst[(bit >> 3) + 1] |= static_cast<uint8_t>(z >> (8 - (bit & 7)));
  }
}

}  // namespace thc::switch_offload::proto
