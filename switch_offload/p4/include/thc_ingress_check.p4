// Statements shared by every architecture's ingress, run on a THC v3 data packet addressed to the
// service (thc_service hit): the wire rules an aggregator checks on upstream data (wire.cc
// check(), protocol/README.md), then admission (CONTRACT.md "Jobs in the data plane"). A packet
// that breaks one gets meta.drop = 1 and its reason; one that passes has the job's parameters in
// meta. Included inside an apply block.
    if (meta.shape == SHAPE_NOT_PROFILE) {
        meta.drop = 1;
        meta.drop_reason = DROP_BAD_SHAPE;
    } else if (meta.shape == SHAPE_UNSUPPORTED) {
        meta.drop = 1;
        meta.drop_reason = DROP_UNSUPPORTED;
    } else if (meta.shape == SHAPE_BAD || meta.data_ok == 0 ||
               hdr.ipv4.total_len != hdr.udp.length + IPV4_HEADER_BYTES ||
               (hdr.thc.flags & FLAGS_UPSTREAM_MASK) != 0 ||
               ((hdr.thc.flags & FLAG_RETRANSMIT) == 0) != (hdr.thc.contributors == 0) ||
               hdr.thc.count == 0 || hdr.thc.count > THC_PROFILE_LANES ||
               hdr.thc.bitmap != 0 || hdr.thc.enc == 0 || hdr.thc.enc > ENC_I32 ||
               hdr.thc.nworkers == 0 || hdr.thc.nworkers > 64 || hdr.thc.worker >= hdr.thc.nworkers ||
               (hdr.thc.type != THC_DATA_INDEX && (hdr.thc.bits != 0 || hdr.thc.aux != 0)) ||
               (hdr.thc.type == THC_DATA_INDEX && hdr.thc.aux >= THC_TABLE_IDS)) {
        meta.drop = 1;
        meta.drop_reason = DROP_BAD_FORMAT;
    } else if (!admit.apply().hit) {
        meta.drop = 1;
        meta.drop_reason = DROP_NOT_ADMITTED;
    } else if (hdr.thc.nworkers != meta.nworkers) {
        meta.drop = 1;
        meta.drop_reason = DROP_BAD_NWORKERS;
    } else if (hdr.thc.shard != 0) {
        meta.drop = 1;
        meta.drop_reason = DROP_BAD_SHAPE;
    } else if ((bit<16>)hdr.thc.slot >= meta.nslots) {
        meta.drop = 1;
        meta.drop_reason = DROP_BAD_SLOT;
    }
