#include "switch_offload/fuzz/harness.h"

#include <netinet/in.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/protocol/wire.h"

namespace thc::switch_offload::fuzz {

namespace {

[[noreturn]] void violated() { std::abort(); }

class CheckingSink final : public Sink {
 public:
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override {
    proto::Header h;
    const uint8_t* pl = nullptr;
    size_t plen = 0;
    if (proto::parse(data, len, &h, &pl, &plen) != proto::ParseError::kOk) violated();
    if (to.len == 0) violated();
    if (h.type == proto::MsgType::kResult && h.contributors > h.nworkers) violated();
  }
};

PeerAddr peer(int i) {
  PeerAddr a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(static_cast<uint16_t>(40000 + i));
  in->sin_addr.s_addr = htonl(0x7F000001);
  a.len = sizeof(sockaddr_in);
  return a;
}

}  // namespace

int packet_one(const uint8_t* data, size_t size) {
  proto::Header h;
  const uint8_t* pl = nullptr;
  size_t plen = 0;
  if (proto::parse(data, size, &h, &pl, &plen) != proto::ParseError::kOk) return 0;
  if (pl != data + proto::kHeaderBytes || plen != size - proto::kHeaderBytes) violated();
  uint8_t back[proto::kHeaderBytes];
  if (proto::write_header(h, back, sizeof back) != proto::kHeaderBytes) violated();
  if (std::memcmp(back, data, proto::kHeaderBytes) != 0) violated();
  std::vector<uint8_t> body(proto::kMaxPacketBytes);
  switch (h.type) {
    case proto::MsgType::kJoin: {
      proto::JoinBody b;
      if (proto::parse_join(pl, plen, h.nworkers, &b) == proto::ParseError::kOk) {
        const size_t n = proto::write_join(b, body.data(), body.size());
        if (n != plen || std::memcmp(body.data(), pl, n) != 0) violated();
      }
      break;
    }
    case proto::MsgType::kTable: {
      proto::TableSpec t;
      if (proto::parse_table(pl, plen, &t) == proto::ParseError::kOk) {
        const size_t n = proto::write_table(t, body.data(), body.size());
        if (n != plen || std::memcmp(body.data(), pl, n) != 0) violated();
      }
      break;
    }
    case proto::MsgType::kJoinAck: {
      proto::JoinAckBody a;
      if (proto::parse_join_ack(pl, plen, &a) == proto::ParseError::kOk) {
        const size_t n = proto::write_join_ack(a, body.data(), body.size());
        if (n != plen || std::memcmp(body.data(), pl, n) != 0) violated();
      }
      break;
    }
    case proto::MsgType::kDataIndex: {
      uint32_t acc = 0;
      for (int i = 0; i < h.count; ++i) acc += proto::get_index(pl, static_cast<uint64_t>(i), h.bits);
      if (acc > static_cast<uint32_t>(h.count) * 255u) violated();
      break;
    }
    case proto::MsgType::kDataValue:
    case proto::MsgType::kResult: {
      uint32_t acc = 0;
      for (int i = 0; i < proto::kLanes; ++i) acc += proto::load_lane(h.enc, pl, i);
      (void)acc;
      break;
    }
    default: break;
  }
  return 0;
}

int engine_one(const uint8_t* data, size_t size) {
  Stats stats;
  EngineConfig cfg;
  cfg.max_slots_per_job = kFuzzMaxSlots;
  cfg.seed = 42;
  cfg.job_idle_timeout_us = 5'000'000;
  cfg.budget = std::make_shared<Budget>(4, 4 << 20);
  Engine eng(cfg, &stats);
  CheckingSink sink;
  uint64_t now = 1'000'000;
  size_t off = 0;
  while (off < size) {
    const uint8_t ctl = data[off];
    uint16_t adv = 0, len = 0;
    if (off + 3 <= size) adv = static_cast<uint16_t>((data[off + 1] << 8) | data[off + 2]);
    if (off + 5 <= size) len = static_cast<uint16_t>((data[off + 3] << 8) | data[off + 4]);
    off = off + 5 <= size ? off + 5 : size;
    const size_t n = std::min<size_t>(len, size - off);
    now += static_cast<uint64_t>(adv) * 100;
    if (ctl & 0x80) eng.tick(now, sink);
    eng.handle(data + off, n, peer(ctl & 3), now, sink);
    off += n;
  }
  eng.tick(now + 10'000'000, sink);  // expire everything: exercises the free path
  if (eng.job_count() != 0 || eng.memory_bytes() != 0) violated();
  return 0;
}

void frame(std::vector<uint8_t>* out, int peer_index, uint16_t advance_100us, const std::vector<uint8_t>& dgram,
           bool tick_first) {
  out->push_back(static_cast<uint8_t>((peer_index & 3) | (tick_first ? 0x80 : 0)));
  out->push_back(static_cast<uint8_t>(advance_100us >> 8));
  out->push_back(static_cast<uint8_t>(advance_100us));
  out->push_back(static_cast<uint8_t>(dgram.size() >> 8));
  out->push_back(static_cast<uint8_t>(dgram.size()));
  out->insert(out->end(), dgram.begin(), dgram.end());
}

}  // namespace thc::switch_offload::fuzz
