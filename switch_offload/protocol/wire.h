// The THC aggregation protocol, version 3: the single definition of the packet format (spec:
// switch_offload/protocol/README.md). Clients, the software and DPDK aggregators, the fuzzers and a
// P4 program all use these constants and functions; nothing else may hand-roll a header.
//
// Parsing never reads outside [buf, buf+len) and never throws: a malformed datagram yields a
// ParseError the caller counts as a drop reason. Serialisation writes network byte order through
// byte shifts, so the code is endian- and alignment-agnostic. Authentication (the tag field) is
// in auth.h: parse() checks the format only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace thc::switch_offload::proto {

constexpr uint32_t kMagic = 0x54484341;  // "THCA"
constexpr uint8_t kVersion = 3;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kTagOffset = 56;  // 8-byte tag, the last header field

// Lanes (elements) per data packet are negotiated per job at JOIN and may differ per encoding: a
// packet carries as many lanes as fit the job's payload budget for the widest direction of its
// type (see lanes_for). They are multiples of kLaneQuantum, so packed indices of any b start on
// a byte and a P4 pipeline works in whole passes of 64 lanes. 256 lanes in a 1024-byte budget is
// the Tofino profile (every encoding 256 lanes, as in version 1).
constexpr int kLaneQuantum = 64;
constexpr int kMaxLanes = 8192;
constexpr int kTofinoLanes = 256;
constexpr int kTofinoPayloadBudget = 1024;
// Payload budget for a 1500-byte MTU: 1500 - 20 (IPv4) - 8 (UDP) - 64 (header); IPv6 is 20 more.
constexpr int kPayloadBudget1500 = 1500 - 20 - 8 - 64;
// Jumbo frames: 9000 - 20 - 8 - 64. The largest payload an aggregator of this implementation offers.
constexpr int kMaxPayloadBudget = 9000 - 20 - 8 - 64;

constexpr int kMaxWorkers = 64;        // one 64-bit bitmap per slot
constexpr int kMaxSlots = 1 << 15;     // 15-bit slot index, bit 15 is the shadow set
constexpr int kMaxShards = 256;        // job instances (server threads) behind one address
constexpr int kTableIds = 4;           // lookup tables a job may hold at once
constexpr int kMaxTableEntries = 256;  // b <= 8
constexpr int kMaxStatsCounters = 64;
constexpr size_t kCookieBytes = 16;
// A STATS request carries this many zero bytes: as long as the longest reply, so no reply to it is
// ever larger than the request (no amplification, even when a recorded request is replayed).
constexpr size_t kStatsRequestBytes = 8 * kMaxStatsCounters;
// Largest datagram this implementation accepts: header + the largest payload budget it offers.
constexpr size_t kMaxPacketBytes = kHeaderBytes + kMaxPayloadBudget;

enum class MsgType : uint8_t {
  kJoin = 1,         // worker -> aggregator: create/join a job (may carry a table)
  kJoinAck = 2,      // aggregator -> worker: the job's seed, slots, lanes, shards
  kTable = 3,        // worker -> aggregator: install a lookup table under an id
  kTableAck = 4,
  kLeave = 5,
  kLeaveAck = 6,
  kChallenge = 7,    // aggregator -> worker: a JOIN needs this address cookie first
  kDataValue = 16,   // upstream value form: `lanes` integers of `enc`
  kDataIndex = 17,   // upstream index form: `lanes` packed b-bit indices, summed as table[z]
  kDataMax = 18,     // upstream prelude: `lanes` u32, combined by MAX
  kResult = 19,      // downstream: `lanes` sums of `enc`, contributors and bitmap
  kAck = 20,         // downstream: contribution noted without a result yet (e.g. not counted)
  kError = 32,       // downstream: aux = ErrorCode
  kStats = 33,       // operator -> aggregator: counters request
  kStatsReply = 34,
};

// Integer type of values and sums on the wire (network byte order, two's complement).
enum class WireInt : uint8_t { kNone = 0, kU8 = 1, kU16 = 2, kU32 = 3, kI8 = 4, kI16 = 5, kI32 = 6 };

enum Flag : uint16_t {
  kFlagNotCounted = 1u << 0,   // result/ack: the receiving worker is not in the bitmap
  kFlagRetransmit = 1u << 1,   // upstream: this is a retransmission (statistics only)
  kFlagPartial = 1u << 2,      // result: fewer than n workers were counted
  kFlagFirst = 1u << 3,        // upstream data: the first packet of its operation
  kKnownFlags = kFlagNotCounted | kFlagRetransmit | kFlagPartial | kFlagFirst,
};

enum class ErrorCode : uint32_t {
  kNone = 0,
  kUnknownJob = 2,      // no such job (never joined, expired, or the aggregator restarted)
  kBadWorker = 3,       // worker id >= n, not joined, or left
  kConfigMismatch = 4,  // join parameters differ from the job's, or a packet's op/encoding
                        // differs from the slot's
  kNoResources = 5,     // --max-jobs, --max-memory or the per-source job limit reached
  kNoTable = 7,         // index packet names a table id that is not installed (or wrong b/type)
  kLeftBehind = 8,      // partial aggregation went on without this worker and the result of
                        // this packet's slot is gone: the worker must rejoin
  kNotSupported = 9,    // a JOIN this aggregator cannot serve: a switch data plane takes no quorum
                        // jobs (k < n) and only the Tofino profile, and reaches only routed workers
  kJobBusy = 10,        // a restarted worker's fresh JOIN while the job's earlier run (some of its
                        // workers have neither restarted nor left) still holds the job instance
  kMax = 10,
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

// Job ids are 64-bit: the id of the key that authenticates the job (bits 63..32) and a label the
// workers chose (bits 31..0). Jobs of different keys can therefore never collide or squat.
inline uint64_t make_job_id(uint32_t key_id, uint32_t label) { return (uint64_t{key_id} << 32) | label; }
inline uint32_t job_key_id(uint64_t job) { return static_cast<uint32_t>(job >> 32); }

// Host-order view of a header. Only fields meaningful for the type are non-zero (the parser
// rejects stray non-zero values in fields a type does not use, so a P4 parser and this one agree
// on what is valid).
struct Header {
  MsgType type = MsgType::kJoin;
  uint16_t flags = 0;
  uint64_t job = 0;
  uint16_t worker = 0;
  uint16_t nworkers = 0;
  uint16_t slot = 0;     // index 0..32767
  uint8_t shadow = 0;    // 0 or 1
  uint16_t lanes = 0;    // data/result: lanes of the payload (a multiple of 64, <= kMaxLanes)
  WireInt enc = WireInt::kNone;
  uint8_t bits = 0;      // index form: b (1..8)
  uint16_t count = 0;    // valid lanes (1..lanes) of a data/result packet
  uint16_t contributors = 0;  // result: workers counted
  uint16_t attempt = 0;  // upstream data: 0 for the first transmission, k for the k-th resend
                         // (the same header bytes as contributors; RETRANSMIT iff attempt > 0)
  uint16_t shard = 0;    // which of the job's instances at this address (< JOIN_ACK shards)
  uint64_t seq = 0;      // data: packet sequence number within the job; control: request nonce
  uint32_t op = 0;       // data: operation sequence number within the job
  uint32_t aux = 0;      // index: table id; error: ErrorCode; stats reply: counter count
  uint64_t bitmap = 0;   // result/ack: workers counted
  uint64_t tag = 0;      // authentication tag (auth.h)
};

size_t wire_int_bytes(WireInt t);
bool wire_int_signed(WireInt t);
bool wire_int_valid(WireInt t);
const char* wire_int_name(WireInt t);

// Payload bytes fixed by a data/result header (0 for types without a fixed payload).
size_t data_payload_bytes(MsgType t, WireInt enc, int bits, int lanes);
// Lanes of a packet of type t (the upstream type of an operation) for a job whose JOIN_ACK gave
// max_lanes and payload_budget: the largest multiple of 64 such that both the upstream payload
// and its RESULT (sums of `enc`) fit the budget, capped by max_lanes. 0 if even 64 do not fit.
int lanes_for(MsgType t, WireInt enc, int bits, int max_lanes, int payload_budget);

// Parse and validate a datagram. On kOk, *h holds the header and payload/payload_len the bytes
// after it (already checked against the type's length rule).
ParseError parse(const uint8_t* buf, size_t len, Header* h, const uint8_t** payload,
                 size_t* payload_len);

// Write the 64-byte header (tag included as given); returns kHeaderBytes, or 0 if cap is too
// small.
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
  uint8_t cookie[kCookieBytes] = {};  // zero in a first JOIN; then the CHALLENGE's cookie
  uint16_t quorum = 0;                // k, 1..n
  uint16_t slots = 0;                 // requested slot count (the first join decides)
  uint32_t quorum_timeout_us = 0;
  uint16_t max_lanes = 0;             // largest lanes per packet this worker takes (64..8192)
  uint16_t payload_budget = 0;        // largest payload this worker's path carries, bytes
  uint32_t flags = 0;                 // kJoinRejoin
  TableSpec table;                    // optional (bits = 0: none)
};
// A worker that was left behind (or restarted) asks where to resume (JOIN_ACK resume fields).
constexpr uint32_t kJoinRejoin = 1;

struct JoinAckBody {
  uint64_t seed = 0;                 // job seed: shared RHT seed and the key's incarnation nonce
  uint16_t slots = 0;
  uint16_t max_lanes = 0;
  uint16_t payload_budget = 0;
  uint16_t nworkers = 0;
  uint16_t quorum = 0;
  uint16_t shards = 0;               // job instances behind this address (server threads)
  uint32_t quorum_timeout_us = 0;
  uint32_t resume_op = 0;            // first op this worker takes part in (0 for a fresh job)
  uint64_t resume_seq = 0;           // its first packet seq (valid with kResumeKnown)
  uint32_t resume_flags = 0;
};
constexpr uint32_t kResumeKnown = 1;  // resume_seq is known (else: ask again with a JOIN)
// Aggregation runs in a switch data plane (thc-switchd answered the JOIN): its RESULTs carry tag 0
// (a pipeline cannot compute SipHash), it sends no ACK or ERROR on the data path, and it takes
// index form only for b in {1, 2, 4, 8} (switch_offload/p4/CONTRACT.md).
constexpr uint32_t kAckDataPlane = 2;

// The JOIN's fixed part ends in 8 reserved zero bytes: they make the smallest JOIN (no table) at
// least as large as the JOIN_ACK, so no answer to a JOIN, repeated or not, amplifies.
constexpr size_t kJoinReservedBytes = 8;
constexpr size_t kJoinFixedBytes = kCookieBytes + 16 + kJoinReservedBytes;
constexpr size_t kTableHeaderBytes = 4;
constexpr size_t kJoinAckBytes = 40;
static_assert(kJoinFixedBytes + kTableHeaderBytes >= kJoinAckBytes, "a JOIN_ACK must not be larger than its JOIN");

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
