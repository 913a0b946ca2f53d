// The THC aggregation protocol: the single definition of the packet format (spec:
// switch_offload/protocol/README.md). Clients, the software aggregator, the fuzzers and a future
// P4 program all use these constants and functions; nothing else may hand-roll a header.
//
// Parsing never reads outside [buf, buf+len) and never throws: a malformed datagram yields a
// ParseError the caller counts as a drop reason. Serialisation writes network byte order through
// byte shifts, so the code is endian- and alignment-agnostic.
#pragma once

#include <cstddef>
#include <cstdint>

namespace thc::switch_offload::proto {

constexpr uint32_t kMagic = 0x54484341;  // "THCA"
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = 56;

// Elements (lanes) per data packet. 256 keeps the widest payload (u32 values, 1 KiB) inside a
// 1500-byte MTU with the header, and is 4 passes of a 64-lane Tofino pipeline (SwitchML's
// recirculation scheme); the payload size depends only on the encoding, never on the count.
constexpr int kLanes = 256;
constexpr int kMaxWorkers = 64;        // one 64-bit bitmap per slot
constexpr int kMaxSlots = 1 << 15;     // 15-bit slot index, bit 15 is the shadow set
constexpr int kTableIds = 4;           // lookup tables a job may hold at once
constexpr int kMaxTableEntries = 256;  // b <= 8
constexpr int kMaxStatsCounters = 64;
// Largest datagram the protocol produces (a JOIN with a 256-entry table).
constexpr size_t kMaxPacketBytes = kHeaderBytes + 12 + 4 * kMaxTableEntries;

enum class MsgType : uint8_t {
  kJoin = 1,         // worker -> aggregator: create/join a job (may carry a table)
  kJoinAck = 2,      // aggregator -> worker: the job's seed and slot count
  kTable = 3,        // worker -> aggregator: install a lookup table under an id
  kTableAck = 4,
  kLeave = 5,
  kLeaveAck = 6,
  kDataValue = 16,   // upstream value form: 256 integers of `enc`
  kDataIndex = 17,   // upstream index form: 256 packed b-bit indices, summed as table[z]
  kDataMax = 18,     // upstream prelude: 256 u32, combined by MAX
  kResult = 19,      // downstream: 256 sums of `enc`, contributors and bitmap
  kAck = 20,         // downstream: contribution noted without a result yet (e.g. not counted)
  kError = 32,       // downstream: aux = ErrorCode
  kStats = 33,       // anyone -> aggregator: counters request
  kStatsReply = 34,
};

// Integer type of values and sums on the wire (network byte order, two's complement).
enum class WireInt : uint8_t { kNone = 0, kU8 = 1, kU16 = 2, kU32 = 3, kI8 = 4, kI16 = 5, kI32 = 6 };

enum Flag : uint16_t {
  kFlagNotCounted = 1u << 0,   // result/ack: the receiving worker is not in the bitmap
  kFlagRetransmit = 1u << 1,   // upstream: this is a retransmission (statistics only)
  kFlagPartial = 1u << 2,      // result: fewer than n workers were counted
  kKnownFlags = kFlagNotCounted | kFlagRetransmit | kFlagPartial,
};

enum class ErrorCode : uint32_t {
  kNone = 0,
  kBadToken = 1,        // the job exists with another token
  kUnknownJob = 2,      // no such job (never joined, expired, or the aggregator restarted)
  kBadWorker = 3,       // worker id >= n, not joined, or left
  kConfigMismatch = 4,  // join parameters differ from the job's, or a packet's op/encoding
                        // differs from the slot's
  kNoResources = 5,     // --max-jobs or --max-memory reached
  kBadVersion = 6,
  kNoTable = 7,         // index packet names a table id that is not installed (or wrong b/type)
  kMax = 7,
};

enum class ParseError : uint8_t {
  kOk = 0,
  kTruncated,    // shorter than the header
  kBadMagic,
  kBadVersion,
  kBadType,
  kBadField,     // a field out of range or inconsistent with the type
  kBadLength,    // payload length differs from what the type/encoding fixes
};
const char* parse_error_name(ParseError e);
const char* msg_type_name(MsgType t);
const char* error_code_name(ErrorCode e);

// Host-order view of a header. Only fields meaningful for the type are non-zero (the parser
// rejects stray non-zero values in fields a type does not use, so a P4 parser and this one agree
// on what is valid).
struct Header {
  MsgType type = MsgType::kJoin;
  uint16_t flags = 0;
  uint32_t job = 0;
  uint16_t worker = 0;
  uint16_t nworkers = 0;
  uint16_t slot = 0;     // index 0..32767
  uint8_t shadow = 0;    // 0 or 1
  WireInt enc = WireInt::kNone;
  uint8_t bits = 0;      // index form: b (1..8)
  uint16_t count = 0;    // valid lanes (1..256) of a data/result packet
  uint16_t contributors = 0;
  uint64_t token = 0;
  uint64_t seq = 0;      // data: packet sequence number within the job; control: request nonce
  uint32_t op = 0;       // data: operation sequence number within the job
  uint32_t aux = 0;      // index: table id; error: ErrorCode; stats reply: counter count
  uint64_t bitmap = 0;   // result/ack: workers counted
};

size_t wire_int_bytes(WireInt t);
bool wire_int_signed(WireInt t);
bool wire_int_valid(WireInt t);
const char* wire_int_name(WireInt t);

// Payload bytes fixed by a data/result header (0 for types without a fixed payload).
size_t data_payload_bytes(MsgType t, WireInt enc, int bits);

// Parse and validate a datagram. On kOk, *h holds the header and payload/payload_len the bytes
// after it (already checked against the type's length rule).
ParseError parse(const uint8_t* buf, size_t len, Header* h, const uint8_t** payload,
                 size_t* payload_len);

// Write the 56-byte header; returns kHeaderBytes, or 0 if cap is too small.
size_t write_header(const Header& h, uint8_t* out, size_t cap);

// ---- control payloads -------------------------------------------------------------------------

struct TableSpec {
  uint8_t id = 0;       // 0..3
  uint8_t bits = 0;     // 0 = no table (JOIN only), else 1..8
  WireInt sum = WireInt::kNone;
  int32_t values[kMaxTableEntries] = {};
  int entries() const { return bits ? 1 << bits : 0; }
};

struct JoinBody {
  uint16_t quorum = 0;           // k, 1..n
  uint16_t slots = 0;            // requested slot count (the first join decides)
  uint32_t quorum_timeout_us = 0;
  TableSpec table;               // optional (bits = 0: none)
};

struct JoinAckBody {
  uint64_t seed = 0;
  uint16_t slots = 0;
  uint16_t lanes = 0;
  uint16_t nworkers = 0;
  uint16_t quorum = 0;
  uint32_t quorum_timeout_us = 0;
};

constexpr size_t kJoinFixedBytes = 8;
constexpr size_t kTableHeaderBytes = 4;
constexpr size_t kJoinAckBytes = 20;

ParseError parse_join(const uint8_t* p, size_t len, uint16_t nworkers, JoinBody* out);
size_t write_join(const JoinBody& b, uint8_t* out, size_t cap);
ParseError parse_table(const uint8_t* p, size_t len, TableSpec* out);
size_t write_table(const TableSpec& t, uint8_t* out, size_t cap);
ParseError parse_join_ack(const uint8_t* p, size_t len, JoinAckBody* out);
size_t write_join_ack(const JoinAckBody& b, uint8_t* out, size_t cap);

// ---- byte order and lanes ---------------------------------------------------------------------

inline uint16_t load_be16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
inline uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}
inline uint64_t load_be64(const uint8_t* p) {
  return (uint64_t{load_be32(p)} << 32) | load_be32(p + 4);
}
inline void store_be16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void store_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}
inline void store_be64(uint8_t* p, uint64_t v) {
  store_be32(p, static_cast<uint32_t>(v >> 32));
  store_be32(p + 4, static_cast<uint32_t>(v));
}

// Lane i of a value payload of type t, as the low bits of a u32 (sums wrap modulo 2^32 and are
// truncated to the type's width on the way down, which equals wrapping in the narrow type).
inline uint32_t load_lane(WireInt t, const uint8_t* payload, int i) {
  switch (wire_int_bytes(t)) {
    case 1: return payload[i];
    case 2: return load_be16(payload + 2 * i);
    default: return load_be32(payload + 4 * i);
  }
}
inline void store_lane(WireInt t, uint8_t* payload, int i, uint32_t v) {
  switch (wire_int_bytes(t)) {
    case 1: payload[i] = static_cast<uint8_t>(v); break;
    case 2: store_be16(payload + 2 * i, static_cast<uint16_t>(v)); break;
    default: store_be32(payload + 4 * i, v); break;
  }
}
// Index i of a packed b-bit stream: bits [i*b, i*b+b), bit j of the stream is bit j%8 of byte j/8.
inline uint32_t get_index(const uint8_t* packed, uint64_t i, int b) {
  const uint64_t bit = i * static_cast<uint64_t>(b);
  const uint64_t byte = bit >> 3;
  const int sh = static_cast<int>(bit & 7);
  uint32_t w = packed[byte];
  if (sh + b > 8) w |= static_cast<uint32_t>(packed[byte + 1]) << 8;
  return (w >> sh) & ((1u << b) - 1u);
}
// Copy `count` indices starting at index `first` of src into dst starting at index 0 (dst must
// be zeroed and hold (count*b+7)/8 bytes).
void copy_indices(const uint8_t* src, uint64_t first, uint64_t count, int b, uint8_t* dst);

}  // namespace thc::switch_offload::proto
