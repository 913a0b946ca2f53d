// Ethernet, IPv4, UDP and the 64-byte THC header (protocol v3; the layout is v2's), field for
// field as switch_offload/protocol/README.md ("Header") and wire.h write_header() lay them out. P4
// packs a header's fields in declaration order, most significant bit first, which is network byte
// order.
#ifndef THC_HEADERS_P4
#define THC_HEADERS_P4

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header ipv4_h {
    bit<4> version;
    bit<4> ihl;
    bit<8> diffserv;
    bit<16> total_len;
    bit<16> identification;
    bit<3> flags;
    bit<13> frag_offset;
    bit<8> ttl;
    bit<8> protocol;
    bit<16> hdr_checksum;
    bit<32> src;
    bit<32> dst;
}

header udp_h {
    bit<16> src_port;
    bit<16> dst_port;
    bit<16> length;
    bit<16> checksum;
}

// Offsets in bytes as in the protocol README's table.
header thc_h {
    bit<32> magic;         //  0 "THCA"
    bit<8> version;        //  4 2
    bit<8> type;           //  5 message type
    bit<16> flags;         //  6
    bit<64> job;           //  8 key id (63..32) | label (31..0)
    bit<16> worker;        // 16
    bit<16> nworkers;      // 18
    bit<1> shadow;         // 20 bit 15 of the slot field
    bit<15> slot;          // 20 bits 0..14
    bit<16> lanes;         // 22
    bit<8> enc;            // 24
    bit<8> bits;           // 25
    bit<16> count;         // 26
    bit<16> contributors;  // 28 result: workers counted; upstream data: attempt
    bit<16> shard;         // 30
    bit<64> seq;           // 32
    bit<32> op;            // 40
    bit<32> aux;           // 44 index: table id
    bit<64> bitmap;        // 48
    bit<64> tag;           // 56 SipHash tag: carried, never checked (a pipeline cannot compute it)
}

#endif
