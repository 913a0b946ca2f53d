// One job's pre-signed upstream stream, shared by aggregator_bench's engine replay and
// dpdk_aggregator_bench: W workers of THC b=4 -> u8 at the lanes the path MTU allows, P packet
// sequence numbers per worker, in seq order (every worker's p before anybody's p + 1, as a window
// of in-flight packets does). The JOIN handshake goes through a caller's exchange function (the
// engine directly, or Ethernet frames through a DPDK port), so the same code signs the data for
// either.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "switch_offload/protocol/auth.h"
#include "switch_offload/protocol/builder.h"
#include "switch_offload/protocol/wire.h"

namespace thc::bench {

namespace proto = thc::switch_offload::proto;
namespace auth = thc::switch_offload::auth;

struct ReplayStream {
  int workers = 4, lanes = 0, slots = 256;
  int budget = proto::kPayloadBudget1500;  // payload bytes: the path MTU's
  uint64_t packets = 0;                    // per worker
  auth::Key key;
  proto::JobId id;
  proto::TableSpec table;
  std::vector<uint8_t> bytes;  // the datagrams back to back, as in a receive buffer
  std::vector<size_t> off, len;
  std::vector<int> from;

  // Sends one worker's request, returns the one reply it draws (throws if there is none).
  using Exchange = std::function<std::vector<uint8_t>(int worker, const std::vector<uint8_t>& request)>;

  // JOIN handshake of every worker (the first installs the table); returns the job's data key
  // (from the JOIN_ACK's seed), which sign_data() expects in id.dkey.
  auth::TagKey join(const Exchange& exchange) const {
    proto::JobId j = id;
    for (int w = 0; w < workers; ++w) {
      proto::JoinParams p;
      p.quorum = static_cast<uint16_t>(workers);
      p.slots = static_cast<uint16_t>(slots);
      p.max_lanes = proto::kMaxLanes;
      p.payload_budget = budget;
      p.table = w == 0 ? &table : nullptr;
      const std::vector<uint8_t> challenge = exchange(w, proto::make_join(j, static_cast<uint16_t>(w), p, 10));
      proto::Header h;
      const uint8_t* pl;
      size_t plen;
      if (proto::parse(challenge.data(), challenge.size(), &h, &pl, &plen) != proto::ParseError::kOk ||
          h.type != proto::MsgType::kChallenge)
        throw std::runtime_error("replay: no CHALLENGE");
      p.cookie = pl;
      const std::vector<uint8_t> ack_dgm = exchange(w, proto::make_join(j, static_cast<uint16_t>(w), p, 11));
      proto::JoinAckBody ack;
      if (proto::parse(ack_dgm.data(), ack_dgm.size(), &h, &pl, &plen) != proto::ParseError::kOk ||
          h.type != proto::MsgType::kJoinAck || proto::parse_join_ack(pl, plen, &ack) != proto::ParseError::kOk)
        throw std::runtime_error("replay: JOIN refused");
      j.with_seed(ack.seed);
    }
    return j.dkey;
  }

  // The data stream under id's data key (after join): P packets per worker, random indices
  // (fixed seed), a new op every 2^20 elements.
  void sign_data() {
    bytes.clear();
    off.clear();
    len.clear();
    from.clear();
    std::mt19937_64 rng(5);
    const uint64_t per_op = (uint64_t{1} << 20) / static_cast<uint64_t>(lanes);
    const size_t plen = proto::data_payload_bytes(proto::MsgType::kDataIndex, proto::WireInt::kU8, 4, lanes);
    std::vector<uint8_t> pl(plen);
    for (uint64_t seq = 0; seq < packets; ++seq) {
      for (int w = 0; w < workers; ++w) {
        proto::Header h = proto::data_header(proto::MsgType::kDataIndex, id, static_cast<uint16_t>(w),
                                             static_cast<uint32_t>(slots), seq, static_cast<uint32_t>(seq / per_op),
                                             proto::WireInt::kU8, static_cast<uint16_t>(lanes),
                                             static_cast<uint16_t>(lanes), 4, 0);
        if (seq % per_op == 0) h.flags = proto::kFlagFirst;
        for (size_t i = 0; i < pl.size(); i += 8) {  // random indices, 8 bytes per draw
          const uint64_t r = rng();
          std::memcpy(pl.data() + i, &r, std::min<size_t>(8, pl.size() - i));
        }
        const std::vector<uint8_t> d = proto::make_packet(h, pl, &id.dkey);
        off.push_back(bytes.size());
        len.push_back(d.size());
        from.push_back(w);
        bytes.insert(bytes.end(), d.begin(), d.end());
      }
    }
  }

  // The sum of packet seq's lanes over the workers: what its RESULT payload must hold.
  std::vector<uint8_t> expected_sum(uint64_t seq) const {
    std::vector<uint8_t> s(static_cast<size_t>(lanes), 0);
    for (int w = 0; w < workers; ++w) {
      const size_t i = static_cast<size_t>(seq) * static_cast<size_t>(workers) + static_cast<size_t>(w);
      const uint8_t* p = bytes.data() + off[i] + proto::kHeaderBytes;
      for (int l = 0; l < lanes; ++l) {
        const int idx = (p[l / 2] >> (4 * (l & 1))) & 0xF;
        s[static_cast<size_t>(l)] = static_cast<uint8_t>(s[static_cast<size_t>(l)] + table.values[idx]);
      }
    }
    return s;
  }
};

// A job of `workers` workers with a fixed key and table; job_nonce tells jobs of one process apart.
inline ReplayStream make_stream(int workers, uint64_t packets, int slots, int mtu, uint32_t job_nonce = 77) {
  ReplayStream r;
  r.budget = mtu - 28 - static_cast<int>(proto::kHeaderBytes);
  r.workers = workers;
  r.slots = slots;
  r.packets = packets;
  r.key = auth::Key{};
  r.key.id = 1;
  for (size_t i = 0; i < auth::kKeyBytes; ++i) r.key.bytes[i] = static_cast<uint8_t>(i * 13 + 1);
  r.id = proto::JobId::make(r.key, job_nonce, static_cast<uint16_t>(workers));
  r.table.id = 0;
  r.table.bits = 4;
  r.table.sum = proto::WireInt::kU8;
  for (int z = 0; z < 16; ++z) r.table.values[z] = z % 31;
  r.lanes = proto::lanes_for(proto::MsgType::kDataIndex, proto::WireInt::kU8, 4, proto::kMaxLanes, r.budget);
  return r;
}

}  // namespace thc::bench
