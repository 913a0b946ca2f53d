// Parser states shared by every architecture: Ethernet -> IPv4 -> UDP -> THC header, then the
// choice of the payload layout of an upstream data packet. Included inside each architecture's
// ingress parser, whose parameters are named pkt, hdr and meta; that parser provides the payload
// states thc_pay_v8, thc_pay_v16, thc_pay_v32, thc_pay_i1, thc_pay_i2 and thc_pay_i4 (each
// extracts its layout and sets meta.shape and meta.data_ok).
//
// The parser does not know the service address (the control plane installs it in thc_service), so
// it reads a THC header from every UDP datagram long enough to hold one; whatever the ingress does
// not aggregate is emitted again byte for byte. The payload layout is chosen by (type, enc / b)
// and only when the UDP length is exactly the Tofino profile's (256 lanes), so an extraction never
// runs past the datagram; anything else is marked and dropped by the ingress with its reason.
#ifndef THC_PARSER_P4
#define THC_PARSER_P4

    state parse_ethernet {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    // Only unfragmented IPv4 without options carries a datagram we read (a first fragment has
    // offset 0 but MF set: its payload is incomplete).
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.flags[0:0], hdr.ipv4.frag_offset,
                          hdr.ipv4.protocol) {
            (4, 5, 0, 0, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.length) {
            0 &&& 0xffc0: accept;   // 0..63: shorter than UDP + THC header
            64 &&& 0xfff8: accept;  // 64..71
            default: parse_thc;
        }
    }

    state parse_thc {
        pkt.extract(hdr.thc);
        transition select(hdr.thc.magic, hdr.thc.version, hdr.thc.type, hdr.thc.lanes) {
            (THC_MAGIC, THC_VERSION, THC_DATA_VALUE, THC_PROFILE_LANES): thc_value;
            (THC_MAGIC, THC_VERSION, THC_DATA_INDEX, THC_PROFILE_LANES): thc_index;
            (THC_MAGIC, THC_VERSION, THC_DATA_MAX, THC_PROFILE_LANES): thc_max;
            (THC_MAGIC, THC_VERSION, THC_DATA_VALUE, _): thc_not_profile;
            (THC_MAGIC, THC_VERSION, THC_DATA_INDEX, _): thc_not_profile;
            (THC_MAGIC, THC_VERSION, THC_DATA_MAX, _): thc_not_profile;
            default: accept;  // control messages and everything else: forwarded as they are
        }
    }

    state thc_value {
        transition select(hdr.thc.enc, hdr.udp.length) {
            (ENC_U8, THC_UDP_LEN_V8): thc_pay_v8;
            (ENC_I8, THC_UDP_LEN_V8): thc_pay_v8;
            (ENC_U16, THC_UDP_LEN_V16): thc_pay_v16;
            (ENC_I16, THC_UDP_LEN_V16): thc_pay_v16;
            (ENC_U32, THC_UDP_LEN_V32): thc_pay_v32;
            (ENC_I32, THC_UDP_LEN_V32): thc_pay_v32;
            default: thc_bad;
        }
    }

    state thc_index {
        transition select(hdr.thc.bits, hdr.udp.length) {
            (1, THC_UDP_LEN_I1): thc_pay_i1;
            (2, THC_UDP_LEN_I2): thc_pay_i2;
            (4, THC_UDP_LEN_I4): thc_pay_i4;
            (8, THC_UDP_LEN_V8): thc_pay_v8;
            (3, _): thc_unsupported;
            (5, _): thc_unsupported;
            (6, _): thc_unsupported;
            (7, _): thc_unsupported;
            default: thc_bad;
        }
    }

    state thc_max {
        transition select(hdr.thc.enc, hdr.udp.length) {
            (ENC_U32, THC_UDP_LEN_V32): thc_pay_v32;
            default: thc_bad;
        }
    }

    state thc_bad {
        meta.shape = SHAPE_BAD;
        transition accept;
    }

    state thc_unsupported {
        meta.shape = SHAPE_UNSUPPORTED;
        transition accept;
    }

    state thc_not_profile {
        meta.shape = SHAPE_NOT_PROFILE;
        transition accept;
    }

#endif
