// THC aggregation data plane for Tofino (TNA, Tofino 1). The same protocol, profile and control
// interface as ../v1model (CONTRACT.md), laid out as a Tofino pipe can run it:
//
//   bf-p4c --target tofino --arch tna -I ../include thc_tna.p4
//
// Not compiled by a Tofino back end here (none is public enough to build quickly; the p4 tests run
// p4c's front end on it, and p4c-barefoot when installed). ../README.md has the hand estimate of
// its resources and what of the profile does and does not fit a pipe.
//
// How 256 lanes fit a 12-stage pipe with 48 stateful ALUs (4 per stage), each reading or writing
// one 64-bit register word (a pair of 32-bit lanes) per packet and returning one 32-bit value:
//
//  * pass 0 (the packet from the worker): parse, checks, admission and the slot set's control
//    words: r_seq -> class -> r_bitmap -> duplicate? -> r_count -> complete?, a chain of three
//    stateful ALUs with a table between each (about 7 stages), after which too few stages are
//    left for 8 stages of lane ALUs: the lanes start in the next pass;
//  * passes 1..4 (recirculated with a bridged header in front, the chunk of the previous pass
//    removed): chunk 0..3 of 64 lanes through 32 lane-pair registers (8 stages x 4 ALUs) at
//    index set * 4 + chunk; pair k = lanes k and k + 32 of the chunk;
//  * if the set completed (or the packet is a retransmission to a completed set, which walks
//    through passes 1..4 without adding, so that it cannot overtake the packet that completed
//    the set): 8 harvest passes, each reading 32 lanes (one 32-bit output per ALU) into a header placed in front of
//    the lanes already read; last lanes first, so the payload ends in wire order; egress narrows
//    them to the result's width;
//  * the last harvest pass multicasts to the job's group (or answers the sender), and egress
//    writes each worker's address (replica), as on BMv2.
//
// A data packet costs 5 passes, the one that completes a set 13 (README.md: resources, rates).
//
// Index form: the b-bit codes of a chunk are unpacked into bytes and looked up in 64 exact-match
// tables (one per lane of a chunk) keyed by (table handle, code): a register per lane would need
// 64 more stateful ALUs. A handle names one installed table (16 at once); lut_meta maps (job
// index, table id) to it. This differs from v1model's r_lut register (README.md).
#include <core.p4>
#include <tna.p4>

#include "thc_constants.p4"
#include "thc_lanes.p4"
#include "thc_headers.p4"

// Slots for all jobs together: lane registers hold slots x 2 shadow sets x 4 chunks = 16384
// pairs, the largest power-of-two 64-bit register a Tofino 1 stage holds (SwitchML uses the same).
#ifndef THC_SLOTS
#define THC_SLOTS 2048
#endif
#define THC_SETS (THC_SLOTS * 2)
typedef bit<12> set_index_t;   // (slot_base + slot) ++ shadow
typedef bit<14> lane_index_t;  // set ++ chunk
// Tables installed at once, switch-wide (each 256 entries in every lane's lookup table).
#ifndef THC_LUT_HANDLES
#define THC_LUT_HANDLES 16
#endif
// The port recirculated passes come back on: pipe 0's recirculation port on Tofino 1. A
// front-panel port in loopback adds recirculation bandwidth (-DTHC_RECIRC_PORT=...).
#ifndef THC_RECIRC_PORT
#define THC_RECIRC_PORT 68
#endif

// ---- bridged header: from ingress to egress, and from one pass to the next --------------------

const bit<8> BRIDGE_FORWARD = 0;  // not ours to aggregate: leaves as it came
const bit<8> BRIDGE_ADD = 1;      // next pass adds chunk `pass` (0..3)
const bit<8> BRIDGE_HARVEST = 2;  // next pass reads 32 lanes (h = `pass`, 0..7)
const bit<8> BRIDGE_OUT = 3;      // leaves to the workers (egress: replica) or the sender

header thc_bridge_h {
    bit<8> kind;
    bit<8> pass;
    bit<8> shape;       // layout of the input chunks (SHAPE_*)
    bit<8> form;        // the packet's type (16/17/18): its THC header may already be the RESULT's
    bit<1> first;       // lanes: the first contribution of a new use (write, do not add)
    bit<1> maxop;       // lanes: MAX instead of +
    bit<1> complete;    // the set completes with this packet: harvest after the last chunk
    bit<1> unicast;     // the result goes to the sender alone (a retransmission)
    bit<1> has_out;     // an out32 header (32 result lanes) follows the THC header
    bit<3> pad;
    bit<8> job_idx;
    bit<16> mgid;
    bit<16> set;        // set_index_t in the low bits
    bit<8> lut_handle;
    bit<7> pad2;
    bit<9> out_port;    // unicast: the sender's port
}

// ---- one 64-lane chunk of the payload, and 32 result lanes --------------------------------------
// A chunk's lanes 0..31 are lo0..lo31, lanes 32..63 hi0..hi31: lane pair k holds lo<k> and hi<k>,
// so a harvest pass that reads every pair's lo (hi) half yields 32 consecutive lanes.

#define THC_FIELD8(k) bit<8> v##k;
#define THC_FIELD16(k) bit<16> v##k;
#define THC_FIELD32(k) bit<32> v##k;
#define THC_LO8(k) bit<8> lo##k;
#define THC_HI8(k) bit<8> hi##k;
#define THC_LO16(k) bit<16> lo##k;
#define THC_HI16(k) bit<16> hi##k;
#define THC_LO32(k) bit<32> lo##k;
#define THC_HI32(k) bit<32> hi##k;
header chunk8_h { THC_LANES_32(THC_LO8) THC_LANES_32(THC_HI8) }
header chunk16_h { THC_LANES_32(THC_LO16) THC_LANES_32(THC_HI16) }
header chunk32_h { THC_LANES_32(THC_LO32) THC_LANES_32(THC_HI32) }
header chunki1_h { bit<64> z; }
header chunki2_h { bit<128> z; }
header chunki4_h { bit<256> z; }
header out8_h { THC_LANES_32(THC_FIELD8) }
header out16_h { THC_LANES_32(THC_FIELD16) }
header out32_h { THC_LANES_32(THC_FIELD32) }

struct headers_t {
    thc_bridge_h bridge;
    ethernet_h eth;
    ipv4_h ipv4;
    udp_h udp;
    thc_h thc;
    chunk8_h c8;
    chunk16_h c16;
    chunk32_h c32;     // the lanes' inputs, whatever the form (widened or looked up into it)
    chunki1_h ci1;
    chunki2_h ci2;
    chunki4_h ci4;
    out8_h o8;
    out16_h o16;
    out32_h o32;
}

// Lane operations of a pass.
const bit<8> LANES_NONE = 0;
const bit<8> LANES_ACC = 1;      // first ? write : add
const bit<8> LANES_MAX = 2;
const bit<8> LANES_READ_LO = 3;  // harvest lanes 0..31 of the chunk
const bit<8> LANES_READ_HI = 4;  // harvest lanes 32..63

// Slot-set classes (from r_seq).
const bit<8> SEQ_STALE = 0;
const bit<8> SEQ_SAME = 1;
const bit<8> SEQ_NEW = 2;

// Parser-initialised metadata (the fields the shared includes use), then the ingress control's
// own working fields (a control-local variable: nothing to initialise in the parser).
struct ig_meta_t {
    bit<8> shape;
    bit<1> data_ok;
    bit<1> drop;
    bit<8> drop_reason;
    bit<1> result;
    bit<1> result_mc;
    bit<8> job_idx;
    bit<16> slot_base;
    bit<16> nslots;
    bit<16> nworkers;
    bit<64> all_mask;
    bit<16> mgid;
    bit<8> lut_bits;
    bit<8> lut_enc;
    bit<8> lut_handle;
    // read by stateful ALUs
    bit<32> sq;           // low 32 bits of seq + 1
    bit<32> bit_lo;       // this worker's bit in the 64-bit bitmap, as two halves
    bit<32> bit_hi;
    bit<32> add_lo;       // what the bitmap takes: the bit, or 0 for a packet without its table
    bit<32> add_hi;
    bit<1> lane_first;    // lanes: write instead of add
}

#define THC_ZBYTES(k) bit<8> zlo##k; bit<8> zhi##k;
struct ig_work_t {
    set_index_t set;
    bit<2> chunk;
    bit<32> old_seq;
    bit<32> seq_diff;
    bit<8> seq_class;
    bit<32> old_half;     // the bitmap half holding this worker's bit, before this packet
    bit<1> dup;
    bit<16> count;
    bit<8> lane_op;
    bit<8> form;          // the data packet's type (the bridged copy on passes 1..)
    bit<1> need_lut;
    bit<1> no_table;      // an index packet whose table (lut_meta) is missing or differs
    THC_LANES_32(THC_ZBYTES)  // unpacked codes of the chunk
}

struct eg_meta_t {
    bit<1> drop;
    bit<8> drop_reason;
    bit<1> update_checksum;  // a RESULT leaves: its IPv4 header changed
}

// ---- ingress parser ----------------------------------------------------------------------------

parser ThcIngressParser(packet_in pkt, out headers_t hdr, out ig_meta_t meta,
                        out ingress_intrinsic_metadata_t ig_intr_md) {
    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        meta.shape = SHAPE_NONE;
        meta.data_ok = 0;
        meta.drop = 0;
        meta.drop_reason = 0;
        meta.result = 0;
        meta.result_mc = 0;
        meta.job_idx = 0;
        meta.slot_base = 0;
        meta.nslots = 0;
        meta.nworkers = 0;
        meta.all_mask = 0;
        meta.mgid = 0;
        meta.lut_bits = 0;
        meta.lut_enc = 0;
        meta.lut_handle = 0;
        meta.sq = 0;
        meta.bit_lo = 0;
        meta.bit_hi = 0;
        meta.add_lo = 0;
        meta.add_hi = 0;
        meta.lane_first = 0;
        transition select(ig_intr_md.ingress_port) {
            THC_RECIRC_PORT: parse_bridge;
            default: parse_ethernet;
        }
    }

#include "thc_parser.p4"

    // Pass 0 reads no lanes: the payload stays in the packet for passes 1..4. The shared states
    // checked its length already.
    state thc_pay_v8 { meta.shape = SHAPE_V8; meta.data_ok = 1; transition accept; }
    state thc_pay_v16 { meta.shape = SHAPE_V16; meta.data_ok = 1; transition accept; }
    state thc_pay_v32 { meta.shape = SHAPE_V32; meta.data_ok = 1; transition accept; }
    state thc_pay_i1 { meta.shape = SHAPE_I1; meta.data_ok = 1; transition accept; }
    state thc_pay_i2 { meta.shape = SHAPE_I2; meta.data_ok = 1; transition accept; }
    state thc_pay_i4 { meta.shape = SHAPE_I4; meta.data_ok = 1; transition accept; }

    // Passes 1..: the bridged header, the packet's own headers, then the next chunk (a harvest
    // pass reads none: the lanes read so far follow).
    state parse_bridge {
        pkt.extract(hdr.bridge);
        pkt.extract(hdr.eth);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.thc);
        meta.shape = hdr.bridge.shape;
        meta.data_ok = 1;
        transition select(hdr.bridge.kind, hdr.bridge.shape) {
            (BRIDGE_ADD, SHAPE_V8): chunk_v8;
            (BRIDGE_ADD, SHAPE_V16): chunk_v16;
            (BRIDGE_ADD, SHAPE_V32): chunk_v32;
            (BRIDGE_ADD, SHAPE_I1): chunk_i1;
            (BRIDGE_ADD, SHAPE_I2): chunk_i2;
            (BRIDGE_ADD, SHAPE_I4): chunk_i4;
            default: accept;  // harvest: the lanes read so far follow, untouched
        }
    }
    state chunk_v8 { pkt.extract(hdr.c8); transition accept; }
    state chunk_v16 { pkt.extract(hdr.c16); transition accept; }
    state chunk_v32 { pkt.extract(hdr.c32); transition accept; }
    state chunk_i1 { pkt.extract(hdr.ci1); transition accept; }
    state chunk_i2 { pkt.extract(hdr.ci2); transition accept; }
    state chunk_i4 { pkt.extract(hdr.ci4); transition accept; }
}

// ---- a pair of lanes (k, k + 32 of a chunk): one stateful ALU ----------------------------------

struct lane_pair_t {
    bit<32> lo;
    bit<32> hi;
}

control LanePair(in bit<32> a, in bit<32> b, inout bit<32> out_v, in bit<8> lane_op, in bit<1> first,
                 in lane_index_t index) {
    Register<lane_pair_t, lane_index_t>(THC_SETS * 4) sums;

    // Sums wrap modulo 2^32; the first contribution of a new use overwrites what an older use left.
    RegisterAction<lane_pair_t, lane_index_t, bit<32>>(sums) acc = {
        void apply(inout lane_pair_t v) {
            if (first == 1) {
                v.lo = a;
                v.hi = b;
            } else {
                v.lo = v.lo + a;
                v.hi = v.hi + b;
            }
        }
    };
    // MAX prelude (unsigned 32-bit); the first contribution goes through acc.
    RegisterAction<lane_pair_t, lane_index_t, bit<32>>(sums) maximum = {
        void apply(inout lane_pair_t v) {
            if (a > v.lo) {
                v.lo = a;
            }
            if (b > v.hi) {
                v.hi = b;
            }
        }
    };
    RegisterAction<lane_pair_t, lane_index_t, bit<32>>(sums) read_lo = {
        void apply(inout lane_pair_t v, out bit<32> rv) {
            rv = v.lo;
        }
    };
    RegisterAction<lane_pair_t, lane_index_t, bit<32>>(sums) read_hi = {
        void apply(inout lane_pair_t v, out bit<32> rv) {
            rv = v.hi;
        }
    };

    action do_acc() { acc.execute(index); }
    action do_max() { maximum.execute(index); }
    action do_read_lo() { out_v = read_lo.execute(index); }
    action do_read_hi() { out_v = read_hi.execute(index); }

    table op {
        key = {
            lane_op: exact;
        }
        actions = {
            do_acc;
            do_max;
            do_read_lo;
            do_read_hi;
            @defaultonly NoAction;
        }
        const entries = {
            LANES_ACC: do_acc();
            LANES_MAX: do_max();
            LANES_READ_LO: do_read_lo();
            LANES_READ_HI: do_read_hi();
        }
        const default_action = NoAction();
    }

    apply {
        op.apply();
    }
}

// ---- ingress -----------------------------------------------------------------------------------

#define THC_SET_EGRESS_PORT(p) ig_tm_md.ucast_egress_port = (p)
#define THC_INGRESS_PORT ig_intr_md.ingress_port
// A result leaves on the last harvest pass: remember the group until then.
#define THC_SET_MCAST_GROUP(g) hdr.bridge.mgid = (g)

control ThcIngress(inout headers_t hdr, inout ig_meta_t meta,
                   in ingress_intrinsic_metadata_t ig_intr_md,
                   in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                   inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                   inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {

#include "thc_ingress_tables.p4"

    ig_work_t w;

    Counter<bit<32>, bit<8>>(THC_JOBS, CounterType_t.PACKETS) c_job_rx;
    Counter<bit<32>, bit<8>>(THC_DROP_REASONS, CounterType_t.PACKETS) c_drop;
    Counter<bit<32>, bit<8>>(THC_JOBS, CounterType_t.PACKETS) c_result;

    // (job index, table id) -> the installed table's b, sum type and handle.
    action lut_ok(bit<8> bits, bit<8> enc, bit<8> handle) {
        meta.lut_bits = bits;
        meta.lut_enc = enc;
        meta.lut_handle = handle;
    }
    table lut_meta {
        key = {
            meta.job_idx: exact;
            hdr.thc.aux: exact;
        }
        actions = {
            lut_ok;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = THC_JOBS * THC_TABLE_IDS;
    }

    // The worker's bit, as two 32-bit halves (a stateful ALU works on 32-bit halves).
    action set_bit(bit<64> b) {
        meta.bit_lo = b[31:0];
        meta.bit_hi = b[63:32];
    }
#define THC_BIT_ENTRY(k) k: set_bit(64w1 << k);
    table worker_bit {
        key = {
            hdr.thc.worker: exact;
        }
        actions = {
            set_bit;
            @defaultonly NoAction;
        }
        const entries = {
            THC_LANES_64(THC_BIT_ENTRY)
        }
        const default_action = NoAction();
    }

    // ---- the slot set's control words ----------------------------------------------------------

    // r_seq: low 32 bits of seq + 1 (0: never used). Returns the old value; takes the packet's
    // when it is newer (serial-number order, CONTRACT.md).
    Register<bit<32>, set_index_t>(THC_SETS, 0) r_seq;
    RegisterAction<bit<32>, set_index_t, bit<32>>(r_seq) seq_update = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v;
            if ((int<32>)(meta.sq - v) > 0) {
                v = meta.sq;
            }
        }
    };
    // For a packet without its table: it may only be answered, never open a new use.
    RegisterAction<bit<32>, set_index_t, bit<32>>(r_seq) seq_read = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v;
        }
    };

    // r_bitmap: the workers counted, 64 bits as two halves.
    Register<lane_pair_t, set_index_t>(THC_SETS) r_bitmap;
    RegisterAction<lane_pair_t, set_index_t, bit<32>>(r_bitmap) bitmap_new = {
        void apply(inout lane_pair_t v) {
            v.lo = meta.bit_lo;
            v.hi = meta.bit_hi;
        }
    };
    RegisterAction<lane_pair_t, set_index_t, bit<32>>(r_bitmap) bitmap_add_lo = {
        void apply(inout lane_pair_t v, out bit<32> rv) {
            rv = v.lo;
            v.lo = v.lo | meta.add_lo;
        }
    };
    RegisterAction<lane_pair_t, set_index_t, bit<32>>(r_bitmap) bitmap_add_hi = {
        void apply(inout lane_pair_t v, out bit<32> rv) {
            rv = v.hi;
            v.hi = v.hi | meta.add_hi;
        }
    };

    // r_count: how many are counted; returns the count after this packet.
    Register<bit<32>, set_index_t>(THC_SETS, 0) r_count;
    RegisterAction<bit<32>, set_index_t, bit<16>>(r_count) count_new = {
        void apply(inout bit<32> v, out bit<16> rv) {
            v = 1;
            rv = 1;
        }
    };
    RegisterAction<bit<32>, set_index_t, bit<16>>(r_count) count_add = {
        void apply(inout bit<32> v, out bit<16> rv) {
            v = v + 1;
            rv = (bit<16>)v;
        }
    };
    RegisterAction<bit<32>, set_index_t, bit<16>>(r_count) count_read = {
        void apply(inout bit<32> v, out bit<16> rv) {
            rv = (bit<16>)v;
        }
    };

    // ---- lane inputs: every form becomes 64 x 32 bits in c32 ------------------------------------

#define THC_WIDEN8(k) hdr.c32.lo##k = (bit<32>)hdr.c8.lo##k; hdr.c32.hi##k = (bit<32>)hdr.c8.hi##k;
#define THC_WIDEN16(k) hdr.c32.lo##k = (bit<32>)hdr.c16.lo##k; hdr.c32.hi##k = (bit<32>)hdr.c16.hi##k;
#define THC_UNPACK8(k) w.zlo##k = hdr.c8.lo##k; w.zhi##k = hdr.c8.hi##k;
#define THC_UNPACK(k, F, P, B) w.zlo##k = (bit<8>)THC_IDX(F, P, B, k); w.zhi##k = (bit<8>)THC_IDX(F, P, B, (k) + 32);
#define THC_UNPACK1(k) THC_UNPACK(k, hdr.ci1.z, 64, 1)
#define THC_UNPACK2(k) THC_UNPACK(k, hdr.ci2.z, 128, 2)
#define THC_UNPACK4(k) THC_UNPACK(k, hdr.ci4.z, 256, 4)
    action widen_v8() { hdr.c32.setValid(); THC_LANES_32(THC_WIDEN8) hdr.c8.setInvalid(); }
    action widen_v16() { hdr.c32.setValid(); THC_LANES_32(THC_WIDEN16) hdr.c16.setInvalid(); }
    action unpack_i1() { THC_LANES_32(THC_UNPACK1) hdr.ci1.setInvalid(); hdr.c32.setValid(); }
    action unpack_i2() { THC_LANES_32(THC_UNPACK2) hdr.ci2.setInvalid(); hdr.c32.setValid(); }
    action unpack_i4() { THC_LANES_32(THC_UNPACK4) hdr.ci4.setInvalid(); hdr.c32.setValid(); }
    action unpack_i8() { THC_LANES_32(THC_UNPACK8) hdr.c8.setInvalid(); hdr.c32.setValid(); }
    table lane_inputs {
        key = {
            w.form: exact;
            meta.shape: exact;
        }
        actions = {
            widen_v8;
            widen_v16;
            unpack_i1;
            unpack_i2;
            unpack_i4;
            unpack_i8;
            @defaultonly NoAction;
        }
        const entries = {
            (THC_DATA_VALUE, SHAPE_V8): widen_v8();
            (THC_DATA_VALUE, SHAPE_V16): widen_v16();
            (THC_DATA_INDEX, SHAPE_I1): unpack_i1();
            (THC_DATA_INDEX, SHAPE_I2): unpack_i2();
            (THC_DATA_INDEX, SHAPE_I4): unpack_i4();
            (THC_DATA_INDEX, SHAPE_V8): unpack_i8();
        }
        const default_action = NoAction();  // u32 / i32 / MAX: already 32 bits wide
    }

    // One lookup table per lane of a chunk: (handle, code) -> T[code].
#define THC_LUT_TABLE(name) \
    action lut_value_##name(bit<32> value) { hdr.c32.name = value; } \
    table lut_##name { \
        key = { meta.lut_handle: exact; w.z##name: exact; } \
        actions = { lut_value_##name; @defaultonly NoAction; } \
        default_action = NoAction(); \
        size = THC_LUT_HANDLES * THC_TABLE_ENTRIES; \
    }
#define THC_LUT_TABLES(k) THC_LUT_TABLE(lo##k) THC_LUT_TABLE(hi##k)
    THC_LANES_32(THC_LUT_TABLES)

    // ---- the lanes -----------------------------------------------------------------------------
#define THC_PAIR_DECL(k) LanePair() pair_##k;
    THC_LANES_32(THC_PAIR_DECL)

    // ---- pass bookkeeping ----------------------------------------------------------------------

    // Every field defined: egress and the next pass read them.
    action bridge_init(bit<8> kind) {
        hdr.bridge.setValid();
        hdr.bridge.kind = kind;
        hdr.bridge.pass = 0;
        hdr.bridge.shape = meta.shape;
        hdr.bridge.form = hdr.thc.type;
        hdr.bridge.first = 0;
        hdr.bridge.maxop = 0;
        hdr.bridge.complete = 0;
        hdr.bridge.unicast = 0;
        hdr.bridge.has_out = 0;
        hdr.bridge.pad = 0;
        hdr.bridge.job_idx = meta.job_idx;
        hdr.bridge.mgid = 0;
        hdr.bridge.set = 0;
        hdr.bridge.lut_handle = meta.lut_handle;
        hdr.bridge.pad2 = 0;
        hdr.bridge.out_port = 0;
    }

    action recirculate(bit<8> kind, bit<8> pass) {
        hdr.bridge.kind = kind;
        hdr.bridge.pass = pass;
        ig_tm_md.ucast_egress_port = THC_RECIRC_PORT;
    }

    action out_to_group() {
        hdr.bridge.kind = BRIDGE_OUT;
        ig_tm_md.mcast_grp_a = hdr.bridge.mgid;
    }

    action out_to_sender() {
        hdr.bridge.kind = BRIDGE_OUT;
        ig_tm_md.ucast_egress_port = hdr.bridge.out_port;
    }

    // UDP and IPv4 lengths of the RESULT (256 lanes of the sum type).
    action result_lengths(bit<16> udp_len) {
        hdr.udp.length = udp_len;
        hdr.ipv4.total_len = udp_len + IPV4_HEADER_BYTES;
    }
    table result_size {
        key = {
            hdr.thc.enc: exact;
        }
        actions = {
            result_lengths;
            @defaultonly NoAction;
        }
        const entries = {
            ENC_U8: result_lengths(THC_UDP_LEN_V8);
            ENC_I8: result_lengths(THC_UDP_LEN_V8);
            ENC_U16: result_lengths(THC_UDP_LEN_V16);
            ENC_I16: result_lengths(THC_UDP_LEN_V16);
            ENC_U32: result_lengths(THC_UDP_LEN_V32);
            ENC_I32: result_lengths(THC_UDP_LEN_V32);
        }
        const default_action = NoAction();
    }

    apply {
        // The working fields start at zero on every path (Tofino zeroes metadata anyway; p4c's
        // flow analysis cannot see that a code is only looked up once it was unpacked).
#define THC_ZINIT(k) w.zlo##k = 0; w.zhi##k = 0;
        THC_LANES_32(THC_ZINIT)
        w.set = 0;
        w.chunk = 0;
        meta.sq = 0;
        w.old_seq = 0;
        w.seq_diff = 0;
        w.seq_class = SEQ_STALE;
        w.old_half = 0;
        w.dup = 0;
        w.count = 0;
        w.lane_op = LANES_NONE;
        w.form = hdr.thc.type;
        w.need_lut = 0;
        w.no_table = 0;

        if (hdr.bridge.isValid()) {
            // ---- a recirculated pass ----
            w.set = hdr.bridge.set[11:0];
            w.form = hdr.bridge.form;
            meta.lut_handle = hdr.bridge.lut_handle;
            if (hdr.bridge.kind == BRIDGE_ADD) {
                w.chunk = hdr.bridge.pass[1:0];
                meta.lane_first = hdr.bridge.first;
                // An answer (unicast) only walks through its chunks: its harvest then starts after
                // the packet that completed the set has added its last chunk (one recirculation
                // path keeps passes in order).
                if (hdr.bridge.unicast == 0) {
                    w.lane_op = hdr.bridge.maxop == 1 && hdr.bridge.first == 0 ? LANES_MAX : LANES_ACC;
                }
                w.need_lut = w.form == THC_DATA_INDEX ? 1w1 : 1w0;
                if (hdr.bridge.pass != 3) {
                    recirculate(BRIDGE_ADD, hdr.bridge.pass + 1);
                } else if (hdr.bridge.complete == 1) {
                    recirculate(BRIDGE_HARVEST, 0);
                } else {
                    ig_dprsr_md.drop_ctl = 1;  // added; the result leaves with the last contribution
                }
            } else if (hdr.bridge.kind == BRIDGE_HARVEST) {
                // h = 0, 1: chunk 3 hi, lo; ... h = 6, 7: chunk 0 hi, lo.
                w.chunk = 3 - hdr.bridge.pass[2:1];
                w.lane_op = hdr.bridge.pass[0:0] == 0 ? LANES_READ_HI : LANES_READ_LO;
                hdr.bridge.has_out = 1;
                hdr.o32.setValid();
                if (hdr.bridge.pass != 7) {
                    recirculate(BRIDGE_HARVEST, hdr.bridge.pass + 1);
                } else if (hdr.bridge.unicast == 1) {
                    out_to_sender();
                } else {
                    out_to_group();
                }
            }
        } else if (!hdr.ipv4.isValid()) {
            meta.drop = 1;
            meta.drop_reason = DROP_NOT_IPV4;
        } else if (meta.shape == SHAPE_NONE || !thc_service.apply().hit) {
            bridge_init(BRIDGE_FORWARD);
            ipv4_fwd.apply();
        } else {
            // ---- pass 0: a data packet from a worker ----
#include "thc_ingress_check.p4"
            // The table is checked once the slot set has said whether this packet adds: a
            // retransmission to a complete set is answered with the stored result whatever
            // lut_meta holds now (the client may have re-installed the id since; CONTRACT.md).
            // Without its table a packet reads the control words and writes none.
            if (meta.drop == 0 && hdr.thc.type == THC_DATA_INDEX) {
                if (!lut_meta.apply().hit || meta.lut_bits != hdr.thc.bits || meta.lut_enc != hdr.thc.enc) {
                    w.no_table = 1;
                }
            }
            if (meta.drop == 0) {
                worker_bit.apply();
                if (w.no_table == 0) {
                    meta.add_lo = meta.bit_lo;
                    meta.add_hi = meta.bit_hi;
                }
                w.set = (bit<11>)(meta.slot_base + (bit<16>)hdr.thc.slot) ++ hdr.thc.shadow;
                meta.sq = hdr.thc.seq[31:0] + 1;
                if (w.no_table == 0) {
                    w.old_seq = seq_update.execute(w.set);
                } else {
                    w.old_seq = seq_read.execute(w.set);
                }
                w.seq_diff = meta.sq - w.old_seq;
                if (w.seq_diff == 0) {
                    w.seq_class = SEQ_SAME;
                } else if (w.seq_diff[31:31] == 1) {
                    w.seq_class = SEQ_STALE;
                } else {
                    w.seq_class = SEQ_NEW;
                }

                w.dup = 0;
                if (w.seq_class == SEQ_NEW) {
                    if (w.no_table == 0) {
                        bitmap_new.execute(w.set);
                        w.count = count_new.execute(w.set);
                    }
                } else if (w.seq_class == SEQ_SAME) {
                    if (hdr.thc.worker < 32) {
                        w.old_half = bitmap_add_lo.execute(w.set);
                        w.dup = (w.old_half & meta.bit_lo) != 0 ? 1w1 : 1w0;
                    } else {
                        w.old_half = bitmap_add_hi.execute(w.set);
                        w.dup = (w.old_half & meta.bit_hi) != 0 ? 1w1 : 1w0;
                    }
                    if (w.dup == 1 || w.no_table == 1) {
                        w.count = count_read.execute(w.set);
                    } else {
                        w.count = count_add.execute(w.set);
                    }
                }

                bridge_init(BRIDGE_ADD);
                hdr.bridge.set = (bit<16>)w.set;
                hdr.bridge.first = w.seq_class == SEQ_NEW ? 1w1 : 1w0;
                hdr.bridge.maxop = hdr.thc.type == THC_DATA_MAX ? 1w1 : 1w0;
                hdr.bridge.complete = w.count == meta.nworkers ? 1w1 : 1w0;

                if (w.no_table == 1 && (w.dup == 0 || hdr.bridge.complete == 0)) {
                    // Any other packet without its table is counted as no table, a stale or
                    // duplicate one too (its table is what the sender got wrong).
                    meta.drop = 1;
                    meta.drop_reason = DROP_NO_TABLE;
                } else {
                    c_job_rx.count(meta.job_idx);
                    if (w.seq_class == SEQ_STALE) {
                        meta.drop = 1;
                        meta.drop_reason = DROP_STALE;
                    } else if (w.dup == 1 && hdr.bridge.complete == 0) {
                        meta.drop = 1;
                        meta.drop_reason = DROP_DUPLICATE;
                    } else if (w.dup == 1) {
                        // A retransmission to a completed set: the stored result to the sender alone.
                        result_to_sender();
                        result_size.apply();
                        hdr.bridge.unicast = 1;
                        hdr.bridge.out_port = ig_intr_md.ingress_port;
                        c_result.count(meta.job_idx);
                        recirculate(BRIDGE_ADD, 0);
                    } else {
                        // Counted: its lanes are added in the next four passes.
                        if (hdr.bridge.complete == 1) {
                            result_to_group();
                            result_size.apply();
                            c_result.count(meta.job_idx);
                        }
                        recirculate(BRIDGE_ADD, 0);
                    }
                }
            }
        }

        // Lanes of this pass (one application of each table, whatever the branch).
        if (w.lane_op == LANES_ACC || w.lane_op == LANES_MAX) {
            lane_inputs.apply();
            if (w.need_lut == 1) {
#define THC_LUT_APPLY(k) lut_lo##k.apply(); lut_hi##k.apply();
                THC_LANES_32(THC_LUT_APPLY)
            }
        }
        if (w.lane_op != LANES_NONE) {
            lane_index_t li = w.set ++ w.chunk;
#define THC_PAIR_APPLY(k) pair_##k.apply(hdr.c32.lo##k, hdr.c32.hi##k, hdr.o32.v##k, w.lane_op, meta.lane_first, li);
            THC_LANES_32(THC_PAIR_APPLY)
        }
        // The consumed chunk does not travel on.
        hdr.c8.setInvalid();
        hdr.c16.setInvalid();
        hdr.c32.setInvalid();
        hdr.ci1.setInvalid();
        hdr.ci2.setInvalid();
        hdr.ci4.setInvalid();

        if (meta.drop == 1) {
            c_drop.count(meta.drop_reason);
            ig_dprsr_md.drop_ctl = 1;
        }
    }
}

control ThcIngressDeparser(packet_out pkt, inout headers_t hdr, in ig_meta_t meta,
                           in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr);
    }
}

// ---- egress ------------------------------------------------------------------------------------

parser ThcEgressParser(packet_in pkt, out headers_t hdr, out eg_meta_t meta,
                       out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        meta.drop = 0;
        meta.drop_reason = 0;
        meta.update_checksum = 0;
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.kind) {
            BRIDGE_FORWARD: accept;
            default: parse_ours;
        }
    }
    state parse_ours {
        pkt.extract(hdr.eth);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.thc);
        transition select(hdr.bridge.has_out) {
            1: parse_out;
            default: accept;
        }
    }
    state parse_out {
        pkt.extract(hdr.o32);
        transition accept;
    }
}

#define THC_EGRESS_RID eg_intr_md.egress_rid

control ThcEgress(inout headers_t hdr, inout eg_meta_t meta,
                  in egress_intrinsic_metadata_t eg_intr_md,
                  in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                  inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                  inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {

#include "thc_egress_tables.p4"

    Counter<bit<32>, bit<8>>(THC_DROP_REASONS, CounterType_t.PACKETS) c_egress_drop;

    // 32 result lanes, read as 32 bits, narrowed to the sum type's width.
#define THC_NARROW8(k) hdr.o8.v##k = hdr.o32.v##k[7:0];
#define THC_NARROW16(k) hdr.o16.v##k = hdr.o32.v##k[15:0];
    action narrow_8() { hdr.o8.setValid(); THC_LANES_32(THC_NARROW8) hdr.o32.setInvalid(); }
    action narrow_16() { hdr.o16.setValid(); THC_LANES_32(THC_NARROW16) hdr.o32.setInvalid(); }
    table narrow {
        key = {
            hdr.thc.enc: exact;
        }
        actions = {
            narrow_8;
            narrow_16;
            @defaultonly NoAction;
        }
        const entries = {
            ENC_U8: narrow_8();
            ENC_I8: narrow_8();
            ENC_U16: narrow_16();
            ENC_I16: narrow_16();
        }
        const default_action = NoAction();
    }

    apply {
        meta.update_checksum = 0;
        if (hdr.o32.isValid()) {
            narrow.apply();
            hdr.bridge.has_out = 0;  // the next pass finds the lanes in its unparsed tail
        }
        if (hdr.bridge.kind == BRIDGE_OUT) {
            // rid 0 is a valid node (job 0, worker 0): the bridged kind tells replicas apart.
            if (hdr.bridge.unicast == 0) {
                replica.apply();
            }
            hdr.bridge.setInvalid();
            meta.update_checksum = 1;
        } else if (hdr.bridge.kind == BRIDGE_FORWARD) {
            hdr.bridge.setInvalid();
        }
        if (meta.drop == 1) {
            c_egress_drop.count(meta.drop_reason);
            eg_dprsr_md.drop_ctl = 1;
        }
    }
}

control ThcEgressDeparser(packet_out pkt, inout headers_t hdr, in eg_meta_t meta,
                          in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_checksum;
    apply {
        if (meta.update_checksum == 1) {
            hdr.ipv4.hdr_checksum = ipv4_checksum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
                hdr.ipv4.protocol, hdr.ipv4.src, hdr.ipv4.dst });
        }
        pkt.emit(hdr);
    }
}

Pipeline(ThcIngressParser(), ThcIngress(), ThcIngressDeparser(),
         ThcEgressParser(), ThcEgress(), ThcEgressDeparser()) pipe;

Switch(pipe) main;
