// THC aggregation data plane for BMv2 simple_switch (v1model). Protocol v3, Tofino profile: 256
// lanes per packet, one 32-bit register per lane per slot set (two shadow sets per slot), per-slot
// worker bitmaps, lookup tables in a register, the result multicast to every worker of the job.
// The control plane (thc-switchd) drives it through the names in ../CONTRACT.md.
//
//   p4c-bm2-ss --std p4-16 -I ../include thc_v1model.p4 -o thc_v1model.json
//
// BMv2 runs one pass per packet, so all 256 lanes are handled at once (each lane's code is
// unrolled by the C preprocessor, include/thc_lanes.p4). The Tofino version (../tna/) splits
// them into 64-lane passes.
#include <core.p4>
#include <v1model.p4>

#include "thc_constants.p4"
#include "thc_lanes.p4"
#include "thc_headers.p4"

// Slots a data plane holds for all its jobs together; register arrays hold 2 shadow sets each.
#ifndef THC_SLOTS
#define THC_SLOTS 4096
#endif
#define THC_SETS (THC_SLOTS * 2)

// ---- payload layouts of 256 lanes (the RESULT reuses the value layouts) ------------------------

#define THC_FIELD8(k) bit<8> v##k;
#define THC_FIELD16(k) bit<16> v##k;
#define THC_FIELD32(k) bit<32> v##k;
header pay8_h { THC_LANES_256(THC_FIELD8) }
header pay16_h { THC_LANES_256(THC_FIELD16) }
header pay32_h { THC_LANES_256(THC_FIELD32) }
// Packed indices as one field each: lane k is a constant slice (THC_IDX).
header idx1_h { bit<256> z; }
header idx2_h { bit<512> z; }
header idx4_h { bit<1024> z; }

struct headers_t {
    ethernet_h eth;
    ipv4_h ipv4;
    udp_h udp;
    thc_h thc;
    pay8_h p8;
    pay16_h p16;
    pay32_h p32;
    idx1_h i1;
    idx2_h i2;
    idx4_h i4;
}

struct meta_t {
    bit<8> shape;        // SHAPE_* (include/thc_parser.p4)
    bit<1> data_ok;      // the payload was extracted
    bit<1> drop;         // drop and count under drop_reason
    bit<8> drop_reason;  // DROP_*
    bit<1> result;       // this packet leaves as a RESULT (IPv4 checksum recomputed)
    bit<1> result_mc;    // ... to the job's multicast group (egress: replica)
    // admit_worker's parameters
    bit<8> job_idx;
    bit<16> slot_base;
    bit<16> nslots;
    bit<16> nworkers;
    bit<64> all_mask;
    bit<16> mgid;
    // lut_ok's parameters
    bit<8> lut_bits;
    bit<8> lut_enc;
    bit<32> lut_base;    // r_lut index of T[0] of the packet's table
    bit<32> idx;         // slot set: (slot_base + slot) * 2 + shadow
    // per lane: the contribution, then the sum
    THC_LANES_256(THC_FIELD32)
}

// ---- parser ------------------------------------------------------------------------------------

parser ThcParser(packet_in pkt, out headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    state start {
        meta.shape = SHAPE_NONE;
        meta.data_ok = 0;
        transition parse_ethernet;
    }

#include "thc_parser.p4"

    state thc_pay_v8 {
        pkt.extract(hdr.p8);
        meta.shape = SHAPE_V8;
        meta.data_ok = 1;
        transition accept;
    }
    state thc_pay_v16 {
        pkt.extract(hdr.p16);
        meta.shape = SHAPE_V16;
        meta.data_ok = 1;
        transition accept;
    }
    state thc_pay_v32 {
        pkt.extract(hdr.p32);
        meta.shape = SHAPE_V32;
        meta.data_ok = 1;
        transition accept;
    }
    state thc_pay_i1 {
        pkt.extract(hdr.i1);
        meta.shape = SHAPE_I1;
        meta.data_ok = 1;
        transition accept;
    }
    state thc_pay_i2 {
        pkt.extract(hdr.i2);
        meta.shape = SHAPE_I2;
        meta.data_ok = 1;
        transition accept;
    }
    state thc_pay_i4 {
        pkt.extract(hdr.i4);
        meta.shape = SHAPE_I4;
        meta.data_ok = 1;
        transition accept;
    }
}

control ThcVerifyChecksum(inout headers_t hdr, inout meta_t meta) {
    apply { }
}

// ---- ingress -----------------------------------------------------------------------------------

#define THC_SET_EGRESS_PORT(p) sm.egress_spec = (p)
#define THC_INGRESS_PORT sm.ingress_port
#define THC_SET_MCAST_GROUP(g) sm.mcast_grp = (g)

control ThcIngress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {

#include "thc_ingress_tables.p4"

    // Lookup tables of every job: entry job_idx * 1024 + table_id * 256 + z holds T[z].
    register<bit<32>>(THC_JOBS * THC_TABLE_IDS * THC_TABLE_ENTRIES) r_lut;

    // Slot-set state: r_seq = low 32 bits of the seq it holds + 1 (0: never used), the workers
    // counted, how many; then one 32-bit sum per lane.
    register<bit<32>>(THC_SETS) r_seq;
    register<bit<64>>(THC_SETS) r_bitmap;
    register<bit<16>>(THC_SETS) r_count;
#define THC_LANE_REG(k) register<bit<32>>(THC_SETS) r_lane_##k;
    THC_LANES_256(THC_LANE_REG)

    counter(THC_JOBS, CounterType.packets) c_job_rx;    // admitted data packets per job
    counter(THC_DROP_REASONS, CounterType.packets) c_drop;
    counter(THC_JOBS, CounterType.packets) c_result;    // RESULTs sent (a group send counts once)

    action lut_ok(bit<8> bits, bit<8> enc) {
        meta.lut_bits = bits;
        meta.lut_enc = enc;
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

    // ---- contributions: meta.v<k> = the lane's value, or T[index] ------------------------------
#define THC_LOAD8(k) meta.v##k = (bit<32>)hdr.p8.v##k;
#define THC_LOAD16(k) meta.v##k = (bit<32>)hdr.p16.v##k;
#define THC_LOAD32(k) meta.v##k = hdr.p32.v##k;
#define THC_LUT8(k) r_lut.read(meta.v##k, meta.lut_base + (bit<32>)hdr.p8.v##k);
#define THC_LUT1(k) r_lut.read(meta.v##k, meta.lut_base + (bit<32>)THC_IDX(hdr.i1.z, 256, 1, k));
#define THC_LUT2(k) r_lut.read(meta.v##k, meta.lut_base + (bit<32>)THC_IDX(hdr.i2.z, 512, 2, k));
#define THC_LUT4(k) r_lut.read(meta.v##k, meta.lut_base + (bit<32>)THC_IDX(hdr.i4.z, 1024, 4, k));
    action load_v8() { THC_LANES_256(THC_LOAD8) }
    action load_v16() { THC_LANES_256(THC_LOAD16) }
    action load_v32() { THC_LANES_256(THC_LOAD32) }
    action lut_i1() { THC_LANES_256(THC_LUT1) }
    action lut_i2() { THC_LANES_256(THC_LUT2) }
    action lut_i4() { THC_LANES_256(THC_LUT4) }
    action lut_i8() { THC_LANES_256(THC_LUT8) }

    // ---- the slot set's lanes; afterwards meta.v<k> holds the lane's sum -----------------------
#define THC_LANE_NEW(k) r_lane_##k.write(meta.idx, meta.v##k);
#define THC_LANE_ADD(k) r_lane_##k.read(t, meta.idx); meta.v##k = meta.v##k + t; r_lane_##k.write(meta.idx, meta.v##k);
#define THC_LANE_MAX(k) r_lane_##k.read(t, meta.idx); meta.v##k = (t > meta.v##k) ? t : meta.v##k; \
    r_lane_##k.write(meta.idx, meta.v##k);
#define THC_LANE_READ(k) r_lane_##k.read(meta.v##k, meta.idx);
    action lanes_new() { THC_LANES_256(THC_LANE_NEW) }
    action lanes_add() { bit<32> t; THC_LANES_256(THC_LANE_ADD) }
    action lanes_max() { bit<32> t; THC_LANES_256(THC_LANE_MAX) }
    action lanes_read() { THC_LANES_256(THC_LANE_READ) }

    // ---- the RESULT payload: the low bits of each sum, in the packet's enc ---------------------
#define THC_STORE8(k) hdr.p8.v##k = meta.v##k[7:0];
#define THC_STORE16(k) hdr.p16.v##k = meta.v##k[15:0];
#define THC_STORE32(k) hdr.p32.v##k = meta.v##k;
    action payload_clear() {
        hdr.p8.setInvalid();
        hdr.p16.setInvalid();
        hdr.p32.setInvalid();
        hdr.i1.setInvalid();
        hdr.i2.setInvalid();
        hdr.i4.setInvalid();
    }
    action store_8() {
        payload_clear();
        hdr.p8.setValid();
        THC_LANES_256(THC_STORE8)
        hdr.udp.length = THC_UDP_LEN_V8;
        hdr.ipv4.total_len = THC_UDP_LEN_V8 + IPV4_HEADER_BYTES;
    }
    action store_16() {
        payload_clear();
        hdr.p16.setValid();
        THC_LANES_256(THC_STORE16)
        hdr.udp.length = THC_UDP_LEN_V16;
        hdr.ipv4.total_len = THC_UDP_LEN_V16 + IPV4_HEADER_BYTES;
    }
    action store_32() {
        payload_clear();
        hdr.p32.setValid();
        THC_LANES_256(THC_STORE32)
        hdr.udp.length = THC_UDP_LEN_V32;
        hdr.ipv4.total_len = THC_UDP_LEN_V32 + IPV4_HEADER_BYTES;
    }

    // Contribution of this packet into meta.v<k>; false when its table is missing.
    apply {
        meta.drop = 0;
        meta.result = 0;
        meta.result_mc = 0;
        if (!hdr.ipv4.isValid()) {
            meta.drop = 1;
            meta.drop_reason = DROP_NOT_IPV4;
        } else if (meta.shape == SHAPE_NONE || !thc_service.apply().hit) {
            ipv4_fwd.apply();
        } else {
#include "thc_ingress_check.p4"
            // simple_switch gives a packet room for 512 more bytes than it came with
            // (simple_switch.cpp: PacketBuffer(len + 512)) and corrupts memory beyond that; 256
            // sums of 32 bits (1024 bytes) from at most 256 bytes of indices do not fit.
            if (meta.drop == 0 && hdr.thc.type == THC_DATA_INDEX &&
                (hdr.thc.enc == ENC_U32 || hdr.thc.enc == ENC_I32)) {
                meta.drop = 1;
                meta.drop_reason = DROP_UNSUPPORTED;
            }
            // The table is checked once the slot set has said whether this packet adds: a
            // retransmission to a complete set is answered with the stored result whatever
            // lut_meta holds now (the client may have re-installed the id since; CONTRACT.md).
            bool no_table = false;
            if (meta.drop == 0 && hdr.thc.type == THC_DATA_INDEX) {
                if (!lut_meta.apply().hit || meta.lut_bits != hdr.thc.bits || meta.lut_enc != hdr.thc.enc) {
                    no_table = true;
                }
            }
            if (meta.drop == 0) {
                meta.idx = ((bit<32>)(meta.slot_base + (bit<16>)hdr.thc.slot) << 1) + (bit<32>)hdr.thc.shadow;
                meta.lut_base = ((bit<32>)meta.job_idx << 10) + ((bit<32>)hdr.thc.aux[1:0] << 8);

                // Serial-number comparison on 32 bits (RFC 1982): seqs of one slot set differ by
                // 2S < 2^16, so the sign of the difference orders them across the wrap at 2^32.
                bit<32> sq = hdr.thc.seq[31:0] + 1;
                bit<32> stored;
                r_seq.read(stored, meta.idx);
                bit<32> diff = sq - stored;
                bit<64> bitmap;
                r_bitmap.read(bitmap, meta.idx);
                bit<16> count;
                r_count.read(count, meta.idx);
                bit<64> me = (bit<64>)1 << hdr.thc.worker[5:0];  // worker < nworkers <= 64 (checked)

                // 0: nothing to add (drop or answer), 1: first packet of a new use, 2: add
                bit<2> step = 0;
                bool answer = false;
                if (diff[31:31] == 1) {
                    meta.drop = 1;
                    meta.drop_reason = DROP_STALE;
                } else if (diff != 0) {
                    bitmap = me;
                    count = 1;
                    step = 1;
                } else if ((bitmap & me) != 0) {
                    // A retransmission: answered with the stored result once the set is complete
                    // (the worker lost it), else dropped (the result will come).
                    if (count == meta.nworkers) {
                        answer = true;
                    } else {
                        meta.drop = 1;
                        meta.drop_reason = DROP_DUPLICATE;
                    }
                } else {
                    // count 0: a set thc-switchd zeroed whose first seq has low 32 bits
                    // 0xffffffff (sq 0); its lanes hold nothing of this use yet.
                    step = count == 0 ? 2w1 : 2w2;
                    bitmap = bitmap | me;
                    count = count + 1;
                }

                // Any other packet without its table changes nothing and is counted as no table,
                // a stale or duplicate one too (its table is what the sender got wrong).
                if (no_table && !answer) {
                    meta.drop = 1;
                    meta.drop_reason = DROP_NO_TABLE;
                    step = 0;
                } else {
                    c_job_rx.count((bit<32>)meta.job_idx);
                }

                if (step != 0) {
                    if (diff != 0) {
                        r_seq.write(meta.idx, sq);
                    }
                    r_bitmap.write(meta.idx, bitmap);
                    r_count.write(meta.idx, count);
                    if (hdr.thc.type == THC_DATA_INDEX) {
                        if (meta.shape == SHAPE_I1) {
                            lut_i1();
                        } else if (meta.shape == SHAPE_I2) {
                            lut_i2();
                        } else if (meta.shape == SHAPE_I4) {
                            lut_i4();
                        } else {
                            lut_i8();
                        }
                    } else if (meta.shape == SHAPE_V8) {
                        load_v8();
                    } else if (meta.shape == SHAPE_V16) {
                        load_v16();
                    } else {
                        load_v32();
                    }
                    if (step == 1) {
                        lanes_new();
                    } else if (hdr.thc.type == THC_DATA_MAX) {
                        lanes_max();
                    } else {
                        lanes_add();
                    }
                } else if (answer) {
                    lanes_read();
                }

                if (answer || (step != 0 && count == meta.nworkers)) {
                    if (hdr.thc.enc == ENC_U8 || hdr.thc.enc == ENC_I8) {
                        store_8();
                    } else if (hdr.thc.enc == ENC_U16 || hdr.thc.enc == ENC_I16) {
                        store_16();
                    } else {
                        store_32();
                    }
                    if (answer) {
                        result_to_sender();
                    } else {
                        result_to_group();
                    }
                    c_result.count((bit<32>)meta.job_idx);
                } else if (step != 0) {
                    mark_to_drop(sm);  // added; the result goes out with the last contribution
                }
            }
        }
        if (meta.drop == 1) {
            c_drop.count((bit<32>)meta.drop_reason);
            mark_to_drop(sm);
        }
    }
}

// ---- egress ------------------------------------------------------------------------------------

#define THC_EGRESS_RID sm.egress_rid

control ThcEgress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {

#include "thc_egress_tables.p4"

    counter(THC_DROP_REASONS, CounterType.packets) c_egress_drop;

    apply {
        // rid 0 is a valid node (job 0, worker 0): result_mc, copied into every replica, tells a
        // replica from a unicast packet.
        if (meta.result_mc == 1) {
            meta.drop = 0;
            replica.apply();
            if (meta.drop == 1) {
                c_egress_drop.count((bit<32>)meta.drop_reason);
                mark_to_drop(sm);
            }
        }
    }
}

control ThcComputeChecksum(inout headers_t hdr, inout meta_t meta) {
    apply {
        update_checksum(meta.result == 1,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.frag_offset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.src, hdr.ipv4.dst },
            hdr.ipv4.hdr_checksum, HashAlgorithm.csum16);
    }
}

control ThcDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.eth);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.thc);
        pkt.emit(hdr.p8);
        pkt.emit(hdr.p16);
        pkt.emit(hdr.p32);
        pkt.emit(hdr.i1);
        pkt.emit(hdr.i2);
        pkt.emit(hdr.i4);
    }
}

V1Switch(ThcParser(), ThcVerifyChecksum(), ThcIngress(), ThcEgress(), ThcComputeChecksum(), ThcDeparser()) main;
