// Ingress declarations shared by every architecture: forwarding, the service address, worker
// admission and the RESULT rewrite. Included inside each architecture's control Ingress, so the
// control-plane names are Ingress.ipv4_fwd, Ingress.forward, Ingress.admit, ... on every target
// (../CONTRACT.md). The including control defines:
//   THC_SET_EGRESS_PORT(p)  send the packet out of port p (unicast)
//   THC_INGRESS_PORT        the port the packet came in on
//   THC_SET_MCAST_GROUP(g)  replicate to multicast group g
// and its metadata `meta` holds the fields named below.
#ifndef THC_INGRESS_TABLES_P4
#define THC_INGRESS_TABLES_P4

    // ---- plain IPv4 switching (also carries the control path to and from thc-switchd) ----------

    action drop() {
        meta.drop = 1;
        meta.drop_reason = DROP_NO_ROUTE;
    }

    // Only the MAC addresses change: the switch forwards, it does not route (no TTL decrement),
    // so a control message reaches thc-switchd exactly as the worker sent it.
    action forward(bit<9> port, bit<48> smac, bit<48> dmac) {
        THC_SET_EGRESS_PORT(port);
        hdr.eth.src = smac;
        hdr.eth.dst = dmac;
    }

    table ipv4_fwd {
        key = {
            hdr.ipv4.dst: exact;
        }
        actions = {
            forward;
            drop;
        }
        default_action = drop();
        size = 1024;
    }

    // ---- the aggregation service's address: data packets to it are aggregated here -------------

    action thc_here() {
    }

    table thc_service {
        key = {
            hdr.ipv4.dst: exact;
            hdr.udp.dst_port: exact;
        }
        actions = {
            thc_here;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = 16;
    }

    // ---- admission: one entry per (job, worker, the address its JOIN registered) ---------------

    action admit_worker(bit<8> job_idx, bit<16> slot_base, bit<16> nslots, bit<16> nworkers,
                        bit<64> all_mask, bit<16> mgid) {
        meta.job_idx = job_idx;
        meta.slot_base = slot_base;
        meta.nslots = nslots;
        meta.nworkers = nworkers;
        meta.all_mask = all_mask;
        meta.mgid = mgid;
    }

    table admit {
        key = {
            hdr.thc.job: exact;
            hdr.thc.worker: exact;
            hdr.ipv4.src: exact;
            hdr.udp.src_port: exact;
        }
        actions = {
            admit_worker;
            @defaultonly NoAction;
        }
        default_action = NoAction();
        size = 4096;  // 64 jobs x 64 workers
    }

    // ---- RESULT (CONTRACT.md "RESULT"): the header of the packet that completed a slot set, or
    // of a retransmission answered with the stored result, becomes the result's header ----------

    action result_header() {
        hdr.thc.type = THC_RESULT;
        hdr.thc.flags = 0;
        hdr.thc.bits = 0;
        hdr.thc.contributors = meta.nworkers;
        hdr.thc.shard = 0;
        hdr.thc.aux = 0;
        hdr.thc.bitmap = meta.all_mask;
        hdr.thc.tag = 0;  // a pipeline cannot compute SipHash (JOIN_ACK kAckDataPlane)
        meta.result = 1;
        hdr.ipv4.ttl = 64;
        hdr.udp.checksum = 0;  // optional in IPv4
    }

    // To every worker of the job: the egress replica table writes each recipient's address.
    action result_to_group() {
        result_header();
        hdr.ipv4.src = hdr.ipv4.dst;
        hdr.udp.src_port = hdr.udp.dst_port;
        THC_SET_MCAST_GROUP(meta.mgid);
        meta.result_mc = 1;
    }

    // To the sender alone, back where it came from: admit matched its source address and port,
    // which are the ones its JOIN registered.
    action result_to_sender() {
        result_header();
        bit<32> ip = hdr.ipv4.src;
        hdr.ipv4.src = hdr.ipv4.dst;
        hdr.ipv4.dst = ip;
        bit<16> port = hdr.udp.src_port;
        hdr.udp.src_port = hdr.udp.dst_port;
        hdr.udp.dst_port = port;
        bit<48> mac = hdr.eth.src;
        hdr.eth.src = hdr.eth.dst;
        hdr.eth.dst = mac;
        THC_SET_EGRESS_PORT(THC_INGRESS_PORT);
    }

#endif
