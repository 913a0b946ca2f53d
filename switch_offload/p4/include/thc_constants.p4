// Constants of the THC aggregation protocol, version 3 (switch_offload/protocol/README.md, wire.h)
// and of the data plane <-> thc-switchd contract (../CONTRACT.md). Shared by every architecture.
#ifndef THC_CONSTANTS_P4
#define THC_CONSTANTS_P4

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8> IPPROTO_UDP = 17;

const bit<32> THC_MAGIC = 0x54484341;  // "THCA"
const bit<8> THC_VERSION = 3;

// Message types the data plane acts on (wire.h MsgType).
const bit<8> THC_DATA_VALUE = 16;
const bit<8> THC_DATA_INDEX = 17;
const bit<8> THC_DATA_MAX = 18;
const bit<8> THC_RESULT = 19;

// Integer types on the wire (wire.h WireInt). Sums wrap modulo 2^32 in the registers and are
// truncated to the width on the way down, so the signed types add exactly like the unsigned ones.
const bit<8> ENC_U8 = 1;
const bit<8> ENC_U16 = 2;
const bit<8> ENC_U32 = 3;
const bit<8> ENC_I8 = 4;
const bit<8> ENC_I16 = 5;
const bit<8> ENC_I32 = 6;

// Header flags (wire.h Flag): upstream data may carry RETRANSMIT and FIRST only.
const bit<16> FLAG_RETRANSMIT = 2;
const bit<16> FLAGS_UPSTREAM_MASK = 0xfff5;  // every bit except RETRANSMIT (2) and FIRST (8)

// The Tofino profile: every data packet carries 256 lanes (payload budget 1024 bytes).
#define THC_LANES 256
const bit<16> THC_PROFILE_LANES = 256;
const bit<16> IPV4_HEADER_BYTES = 20;

// Jobs a data plane holds at once (admit's job_idx, counter and LUT index space).
#define THC_JOBS 64
// Lookup tables per job (protocol: table ids 0..3) and entries per table (b <= 8).
#define THC_TABLE_IDS 4
#define THC_TABLE_ENTRIES 256

// Drop reasons: index of the c_drop counter (CONTRACT.md lists them for thc-switchd's STATS).
const bit<8> DROP_NOT_ADMITTED = 0;   // data packet to the service from a (job, worker, ip, port) not installed
const bit<8> DROP_BAD_FORMAT = 1;     // THC data type to the service that breaks a wire rule (length, fields)
const bit<8> DROP_BAD_SLOT = 2;       // slot >= the job's nslots
const bit<8> DROP_BAD_NWORKERS = 3;   // nworkers differs from the job's
const bit<8> DROP_BAD_SHAPE = 4;      // shard != 0 or lanes != 256 (not the Tofino profile)
const bit<8> DROP_NO_TABLE = 5;       // index packet: table id not installed, or another b / sum type
const bit<8> DROP_UNSUPPORTED = 6;    // index width b the data plane does not parse (3, 5, 6, 7); BMv2:
                                      // an index packet with a 32-bit sum type
const bit<8> DROP_STALE = 7;          // older than the slot set's current use (a delayed duplicate)
const bit<8> DROP_DUPLICATE = 8;      // contribution already counted, slot set not complete yet
const bit<8> DROP_NO_ROUTE = 9;       // ipv4_fwd has no entry for the destination
const bit<8> DROP_NOT_IPV4 = 10;      // not an IPv4 frame (ARP, IPv6): the testbed uses static neighbours
const bit<8> DROP_NO_REPLICA = 11;    // egress: a result replica without a replica entry
#define THC_DROP_REASONS 16

// meta.shape: the payload layout found (or why none was extracted).
const bit<8> SHAPE_NONE = 0;           // not an upstream THC v3 data packet
const bit<8> SHAPE_V8 = 1;             // 256 x 8 bits: value u8/i8, or index b = 8
const bit<8> SHAPE_V16 = 2;            // 256 x 16 bits: value u16/i16
const bit<8> SHAPE_V32 = 3;            // 256 x 32 bits: value u32/i32, MAX
const bit<8> SHAPE_I1 = 4;             // 256 x 1-bit indices (32 bytes)
const bit<8> SHAPE_I2 = 5;             // 256 x 2-bit indices (64 bytes)
const bit<8> SHAPE_I4 = 6;             // 256 x 4-bit indices (128 bytes)
const bit<8> SHAPE_BAD = 8;            // a data type whose enc, b or length breaks the wire rules
const bit<8> SHAPE_UNSUPPORTED = 9;    // index width 3, 5, 6 or 7
const bit<8> SHAPE_NOT_PROFILE = 10;   // lanes != 256

// UDP length = 8 + 64 + payload bytes of 256 lanes.
#define THC_UDP_LEN_V8 328
#define THC_UDP_LEN_V16 584
#define THC_UDP_LEN_V32 1096
#define THC_UDP_LEN_I1 104
#define THC_UDP_LEN_I2 136
#define THC_UDP_LEN_I4 200

#endif
