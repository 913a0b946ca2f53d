#include "switch_offload/fuzz/harness.h"

#include <netinet/in.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <tuple>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/protocol/wire.h"

namespace thc::switch_offload::fuzz {

namespace {

[[noreturn]] void violated() { std::abort(); }

PeerAddr peer(int i) {
  PeerAddr a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(static_cast<uint16_t>(40000 + i));
  // Peers 0..2 are remote; peer 3 is loopback (STATS without the operator key).
  in->sin_addr.s_addr = htonl(i == 3 ? 0x7F000001u : 0x0A000001u + static_cast<uint32_t>(i));
  a.len = sizeof(sockaddr_in);
  return a;
}

bool is_loopback(const PeerAddr& a) {
  const auto* in = reinterpret_cast<const sockaddr_in*>(&a.ss);
  return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
}

// What a cooperating worker knows: the cookies the engine handed out and the seeds of the job
// instances it created (from JOIN_ACKs), hence the data keys.
struct Client {
  std::map<std::tuple<int, uint64_t, uint16_t>, std::vector<uint8_t>> cookies;  // (peer, job, worker)
  std::map<std::pair<uint64_t, uint16_t>, uint64_t> seeds;                        // (job, shard)
  auth::Key tenant = fuzz_key(1);
};

class CheckingSink final : public Sink {
 public:
  explicit CheckingSink(Client* c) : c_(c) {}
  size_t sent = 0;
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override {
    ++sent;
    proto::Header h;
    const uint8_t* pl = nullptr;
    size_t plen = 0;
    if (proto::parse(data, len, &h, &pl, &plen) != proto::ParseError::kOk) violated();
    if (to.len == 0) violated();
    if (h.type == proto::MsgType::kResult && h.contributors > h.nworkers) violated();
    if (h.type == proto::MsgType::kStatsReply) {
      if (!is_loopback(to) && !auth::verify(auth::stats_key(fuzz_key(0)), data, len)) violated();
      return;
    }
    if (proto::job_key_id(h.job) != 1) violated();  // only tenant 1 can have a job here
    const auth::TagKey jk = auth::join_key(c_->tenant, h.job);
    const bool join_tagged = auth::verify(jk, data, len);
    auto it = c_->seeds.find({h.job, h.shard});
    const bool data_tagged = it != c_->seeds.end() && auth::verify(auth::data_key(c_->tenant, h.job, it->second), data, len);
    if (h.type == proto::MsgType::kJoinAck) {
      if (!join_tagged) violated();
      proto::JoinAckBody a;
      if (proto::parse_join_ack(pl, plen, &a) != proto::ParseError::kOk) violated();
      c_->seeds[{h.job, h.shard}] = a.seed;
      return;
    }
    if (h.type == proto::MsgType::kChallenge) {
      if (!join_tagged) violated();
      int p = -1;
      for (int i = 0; i < 4; ++i)
        if (peer(i) == to) p = i;
      if (p < 0) violated();
      c_->cookies[{p, h.job, h.worker}].assign(pl, pl + proto::kCookieBytes);
      return;
    }
    if (!join_tagged && !data_tagged) violated();
  }

 private:
  Client* c_;
};

// Sign (and for a JOIN, add the cookie to) a datagram as a cooperating worker would.
std::vector<uint8_t> authenticate(const Client& c, int p, const uint8_t* data, size_t n) {
  std::vector<uint8_t> d(data, data + n);
  proto::Header h;
  const uint8_t* pl = nullptr;
  size_t plen = 0;
  if (proto::parse(d.data(), d.size(), &h, &pl, &plen) != proto::ParseError::kOk) return d;
  if (proto::job_key_id(h.job) != c.tenant.id) {
    if (h.type == proto::MsgType::kStats && proto::job_key_id(h.job) == 0) auth::sign(auth::stats_key(fuzz_key(0)), d.data(), d.size());
    return d;
  }
  if (h.type == proto::MsgType::kJoin) {
    auto it = c.cookies.find({p, h.job, h.worker});
    if (it != c.cookies.end() && plen >= proto::kCookieBytes)
      std::memcpy(d.data() + proto::kHeaderBytes, it->second.data(), proto::kCookieBytes);
    auth::sign(auth::join_key(c.tenant, h.job), d.data(), d.size());
    return d;
  }
  auto it = c.seeds.find({h.job, h.shard});
  if (it != c.seeds.end()) auth::sign(auth::data_key(c.tenant, h.job, it->second), d.data(), d.size());
  return d;
}

}  // namespace

auth::Key fuzz_key(uint32_t id) {
  auth::Key k;
  k.id = id;
  for (size_t i = 0; i < auth::kKeyBytes; ++i) k.bytes[i] = static_cast<uint8_t>(0x5A ^ (i * 31) ^ id);
  return k;
}

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
      for (int i = 0; i < h.lanes; ++i) acc += proto::load_lane(h.enc, pl, i);
      (void)acc;
      break;
    }
    default: break;
  }
  // The lane rule agrees with the payload rule for every encoding it admits.
  if (h.type == proto::MsgType::kDataValue || h.type == proto::MsgType::kDataIndex || h.type == proto::MsgType::kDataMax) {
    const int l = proto::lanes_for(h.type, h.enc, h.bits, h.lanes, proto::kMaxPayloadBudget);
    if (l != 0 && l > h.lanes) violated();
  }
  return 0;
}

int engine_one(const uint8_t* data, size_t size) {
  Stats stats;
  EngineConfig cfg;
  cfg.max_slots_per_job = kFuzzMaxSlots;
  cfg.seed = 42;
  cfg.incarnation = 42;  // job seeds replayable from run to run (the cookie secret is random anyway)
  cfg.job_idle_timeout_us = 5'000'000;
  cfg.budget = std::make_shared<Budget>(4, 4 << 20, 3);
  cfg.keys = std::make_shared<auth::KeyRing>(std::vector<auth::Key>{fuzz_key(0), fuzz_key(1)});
  cfg.shards = 2;
  cfg.max_lanes = 512;
  cfg.payload_budget = 1024;
  Engine eng(cfg, &stats);
  Client client;
  CheckingSink sink(&client);
  uint64_t now = 1'000'000;
  size_t off = 0;
  // Frames with 0x10 go through Engine::handle_batch (as the UDP server hands it a receive
  // batch), the batch ending at the next frame without it or at the end of the input.
  std::vector<std::vector<uint8_t>> pending;
  std::vector<PeerAddr> pending_peer;
  auto flush = [&] {
    if (pending.empty()) return;
    std::vector<Datagram> in;
    for (size_t i = 0; i < pending.size(); ++i)
      in.push_back(Datagram{pending[i].data(), pending[i].size(), &pending_peer[i]});
    std::vector<Handled> res(in.size());
    const size_t before = sink.sent;
    eng.handle_batch(in.data(), in.size(), now, sink, res.data());
    bool any = false;
    for (Handled h : res) any = any || h != Handled::kDropped;
    if (!any && sink.sent != before) violated();  // nothing answers what is not authenticated
    pending.clear();
    pending_peer.clear();
  };
  while (off < size) {
    const uint8_t ctl = data[off];
    uint16_t adv = 0, len = 0;
    if (off + 3 <= size) adv = static_cast<uint16_t>((data[off + 1] << 8) | data[off + 2]);
    if (off + 5 <= size) len = static_cast<uint16_t>((data[off + 3] << 8) | data[off + 4]);
    off = off + 5 <= size ? off + 5 : size;
    const size_t n = std::min<size_t>(len, size - off);
    now += static_cast<uint64_t>(adv) * 100;
    if (ctl & 0x20) now += 1'000'000;
    const int p = ctl & 3;
    if (!(ctl & 0x10) || (ctl & 0x80)) flush();
    if (ctl & 0x80) eng.tick(now, sink);
    if (ctl & 0x10) {
      pending.push_back(ctl & 0x40 ? authenticate(client, p, data + off, n)
                                   : std::vector<uint8_t>(data + off, data + off + n));
      pending_peer.push_back(peer(p));
      off += n;
      continue;
    }
    const size_t before = sink.sent;
    bool verified;
    if (ctl & 0x40) {
      const std::vector<uint8_t> d = authenticate(client, p, data + off, n);
      verified = eng.handle(d.data(), d.size(), peer(p), now, sink) != Handled::kDropped;
    } else {
      verified = eng.handle(data + off, n, peer(p), now, sink) != Handled::kDropped;
    }
    if (!verified && sink.sent != before) violated();  // nothing answers what is not authenticated
    off += n;
  }
  flush();
  eng.tick(now + 10'000'000, sink);  // expire everything: exercises the free path
  if (eng.job_count() != 0 || eng.memory_bytes() != 0) violated();
  return 0;
}

void frame(std::vector<uint8_t>* out, int peer_index, uint16_t advance_100us, const std::vector<uint8_t>& dgram,
           bool tick_first, bool authenticate, bool jump_second) {
  out->push_back(static_cast<uint8_t>((peer_index & 3) | (tick_first ? 0x80 : 0) | (authenticate ? 0x40 : 0) |
                                      (jump_second ? 0x20 : 0)));
  out->push_back(static_cast<uint8_t>(advance_100us >> 8));
  out->push_back(static_cast<uint8_t>(advance_100us));
  out->push_back(static_cast<uint8_t>(dgram.size() >> 8));
  out->push_back(static_cast<uint8_t>(dgram.size()));
  out->insert(out->end(), dgram.begin(), dgram.end());
}

}  // namespace thc::switch_offload::fuzz
