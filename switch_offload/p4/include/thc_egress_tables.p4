// Egress declarations shared by every architecture: one replica of a RESULT per worker of the job
// (the multicast group's node rid = job_idx * 64 + worker) gets that worker's address and id.
// Included inside each architecture's control Egress, which defines THC_EGRESS_RID (the
// replication id the packet replication engine gave this copy). Names: Egress.replica,
// Egress.to_worker (../CONTRACT.md).
#ifndef THC_EGRESS_TABLES_P4
#define THC_EGRESS_TABLES_P4

    action to_worker(bit<16> worker, bit<32> ip, bit<16> udp_port, bit<48> smac, bit<48> dmac) {
        hdr.thc.worker = worker;
        hdr.ipv4.dst = ip;
        hdr.udp.dst_port = udp_port;
        hdr.eth.src = smac;
        hdr.eth.dst = dmac;
    }

    action no_replica() {
        meta.drop = 1;
        meta.drop_reason = DROP_NO_REPLICA;
    }

    table replica {
        key = {
            THC_EGRESS_RID: exact;
        }
        actions = {
            to_worker;
            @defaultonly no_replica;
        }
        default_action = no_replica();
        size = 4096;
    }

#endif
