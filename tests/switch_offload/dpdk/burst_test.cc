// The DPDK server's receive bursts (servers/dpdk/burst.h): a burst through Engine::handle_batch in
// runs gives exactly what one frame at a time gives (the same replies, bytes and destination MACs
// per burst, the same counters and the same learned table), under the learning rules' every case:
// JOINs from a moved station (with and without the address cookie), authentic replays from
// another MAC, garbage from unknown addresses, and a table small enough to be reset.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <algorithm>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/protocol/builder.h"
#include "switch_offload/servers/dpdk/burst.h"

namespace {

using namespace thc::switch_offload;
using namespace thc::switch_offload::proto;
using Bytes = std::vector<uint8_t>;

auth::Key test_key() {
  auth::Key k;
  k.id = 1;
  for (size_t i = 0; i < auth::kKeyBytes; ++i) k.bytes[i] = static_cast<uint8_t>(0x21 + 3 * i);
  return k;
}

frames::Mac mac_of(int station) { return frames::Mac{0x02, 0, 0, 0, 0, static_cast<uint8_t>(station)}; }

// What the TX path does: the destination MAC looked up in the lane's table at send time.
struct Out {
  uint32_t ip;
  uint16_t port;
  bool has_mac;
  frames::Mac mac;
  uint8_t type;
  Bytes bytes;  // empty for a CHALLENGE (its cookie is the engine's own secret)
  bool operator<(const Out& o) const {
    return std::tie(ip, port, has_mac, mac, type, bytes) < std::tie(o.ip, o.port, o.has_mac, o.mac, o.type, o.bytes);
  }
  bool operator==(const Out& o) const {
    return std::tie(ip, port, has_mac, mac, type, bytes) == std::tie(o.ip, o.port, o.has_mac, o.mac, o.type, o.bytes);
  }
};
class MacSink final : public Sink {
 public:
  explicit MacSink(const PeerMacs& m) : macs_(m) {}
  void send(const thc::PeerAddr& to, const uint8_t* d, size_t len) override {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&to.ss);
    Out o{ntohl(a->sin_addr.s_addr), ntohs(a->sin_port), false, {}, len > 5 ? d[5] : uint8_t{0}, {}};
    if (const frames::Mac* m = macs_.find(o.ip)) {
      o.has_mac = true;
      o.mac = *m;
    }
    if (o.type != static_cast<uint8_t>(MsgType::kChallenge)) o.bytes.assign(d, d + len);
    out.push_back(o);
  }
  std::vector<Out> out;

 private:
  const PeerMacs& macs_;
};

struct Side {
  Stats stats;
  std::unique_ptr<Engine> engine;
  PeerMacs macs{6};  // small: the flood of unknown addresses below resets it
  BurstScratch scratch;
  std::unique_ptr<MacSink> sink;
  Side() {
    EngineConfig c;
    c.seed = 5;
    c.incarnation = 9;
    c.max_slots_per_job = 8;
    c.keys = std::make_shared<auth::KeyRing>(std::vector<auth::Key>{test_key()});
    engine = std::make_unique<Engine>(c, &stats);
    sink = std::make_unique<MacSink>(macs);
  }
};

// A JOIN handshake on one side; returns the JOIN_ACK's seed.
uint64_t handshake(Side& s, const JobId& j, uint16_t w, const JoinParams& p0, uint32_t ip, uint16_t port, int station,
                   uint64_t nonce) {
  // The CHALLENGE carries the cookie: capture it with a sink of our own.
  struct Grab final : public Sink {
    void send(const thc::PeerAddr&, const uint8_t* d, size_t len) override { last.assign(d, d + len); }
    Bytes last;
  } g;
  const Bytes join = make_join(j, w, p0, nonce);
  s.macs.handle_one(*s.engine, join.data(), join.size(), ip, port, mac_of(station), 1000, g);
  Header h;
  const uint8_t* pl;
  size_t plen;
  EXPECT_EQ(parse(g.last.data(), g.last.size(), &h, &pl, &plen), ParseError::kOk);
  EXPECT_EQ(h.type, MsgType::kChallenge);
  JoinParams p = p0;
  const Bytes cookie(pl, pl + plen);
  p.cookie = cookie.data();
  const Bytes again = make_join(j, w, p, nonce + 1);
  g.last.clear();
  EXPECT_EQ(s.macs.handle_one(*s.engine, again.data(), again.size(), ip, port, mac_of(station), 1000, g),
            Handled::kJoined);
  JoinAckBody ack;
  EXPECT_EQ(parse(g.last.data(), g.last.size(), &h, &pl, &plen), ParseError::kOk);
  EXPECT_EQ(parse_join_ack(pl, plen, &ack), ParseError::kOk);
  return ack.seed;
}

TEST(DpdkBurst, BatchedIsOneFrameAtATime) {
  Side a, b;  // a: one frame at a time; b: batched
  const int W = 4;
  JobId j = JobId::make(test_key(), 7, W);
  JobId j2 = JobId::make(test_key(), 8, 1);
  JoinParams p;
  p.quorum = W;
  p.slots = 8;
  p.max_lanes = kTofinoLanes;
  p.payload_budget = kTofinoPayloadBudget;
  JoinParams p2 = p;
  p2.quorum = 1;
  const uint32_t base_ip = 0x0A000010;
  uint64_t seed = 0;
  for (uint16_t w = 0; w < W; ++w) {
    const uint64_t sa = handshake(a, j, w, p, base_ip + w, 40000, w, 10);
    const uint64_t sb = handshake(b, j, w, p, base_ip + w, 40000, w, 10);
    ASSERT_EQ(sa, sb) << "fixed seeds: both engines give the job one seed";
    seed = sa;
  }
  j.with_seed(seed);
  // Job 2's worker will join from worker 3's address at a new station (a moved host): the cookie
  // of each engine for that address, fetched now (a cookie-less JOIN changes nothing).
  auto cookie_of = [&](Side& s) {
    struct Grab final : public Sink {
      void send(const thc::PeerAddr&, const uint8_t* d, size_t len) override { last.assign(d, d + len); }
      Bytes last;
    } g;
    const Bytes join = make_join(j2, 0, p2, 50);
    s.macs.handle_one(*s.engine, join.data(), join.size(), base_ip + 3, 40000, mac_of(33), 1000, g);
    Header h;
    const uint8_t* pl;
    size_t plen;
    EXPECT_EQ(parse(g.last.data(), g.last.size(), &h, &pl, &plen), ParseError::kOk);
    return Bytes(pl, pl + plen);
  };
  const Bytes ca = cookie_of(a), cb = cookie_of(b);

  // The stream: per frame the bytes for side a and side b (equal but for job 2's cookie JOIN).
  struct F {
    Bytes pa, pb;
    uint32_t ip;
    uint16_t port;
    int station;
  };
  std::vector<F> stream;
  std::mt19937 rng(17);
  auto add = [&](const Bytes& pkt, uint32_t ip, uint16_t port, int station) {
    stream.push_back(F{pkt, pkt, ip, port, station});
  };
  for (uint64_t seq = 0; seq < 40; ++seq) {
    const uint32_t op = static_cast<uint32_t>(seq / 10);
    const size_t count = 1 + rng() % 200;  // every worker's packet of a seq has the same count
    for (uint16_t w = 0; w < W; ++w) {
      std::vector<uint32_t> v(count);
      for (auto& x : v) x = rng() & 0xFF;
      const Bytes d = make_values(j, w, 8, seq, op, WireInt::kU16, v);
      add(d, base_ip + w, 40000, w);
      if (rng() % 5 == 0) add(d, base_ip + w, 40000, w);  // duplicate
      if (rng() % 7 == 0) add(d, base_ip + w, 40000, 20 + w);  // authentic replay from another station
    }
    switch (rng() % 6) {
      case 0: {  // garbage from a fresh address: inserted, dropped, erased (and the table resets)
        Bytes g(100);
        for (auto& x : g) x = static_cast<uint8_t>(rng());
        add(g, 0x0B000000 + static_cast<uint32_t>(rng() % 50), 999, 40);
        break;
      }
      case 1:  // a JOIN without the cookie from a moved station: CHALLENGE there, then moved back
        add(make_join(j, static_cast<uint16_t>(rng() % W), p, 100 + seq), base_ip + static_cast<uint32_t>(rng() % W),
            40000, 30);
        break;
      case 2:  // an authentic data packet from an address nobody joined from (kept: authentic)
        add(make_values(j, 1, 8, seq, op, WireInt::kU16, {1}), 0x0C000000 + static_cast<uint32_t>(seq), 4000, 41);
        break;
      default: break;
    }
    if (seq == 21) {
      // Worker 3's host moves: a cookie-checked JOIN from its address and a new station draws
      // JOIN_ACK and re-points the address, in the middle of a burst whose earlier results went
      // to the old station.
      F f{{}, {}, base_ip + 3, 40000, 33};
      JoinParams qa = p2, qb = p2;
      qa.cookie = ca.data();
      qb.cookie = cb.data();
      f.pa = make_join(j2, 0, qa, 51);
      f.pb = make_join(j2, 0, qb, 51);
      stream.push_back(f);
    }
  }
  // Bursts of 1..32 frames, like rte_ring_dequeue_burst.
  size_t i = 0, bursts = 0, results_at_moved = 0;
  uint64_t now = 2000;
  while (i < stream.size()) {
    const size_t n = std::min(stream.size() - i, static_cast<size_t>(1 + rng() % 32));
    std::vector<RxDatagram> ra(n), rb(n);
    for (size_t k = 0; k < n; ++k) {
      const F& f = stream[i + k];
      ra[k] = RxDatagram{f.pa.data(), f.pa.size(), f.ip, f.port, mac_of(f.station)};
      rb[k] = RxDatagram{f.pb.data(), f.pb.size(), f.ip, f.port, mac_of(f.station)};
    }
    a.sink->out.clear();
    b.sink->out.clear();
    handle_burst(*a.engine, a.macs, ra.data(), n, now, *a.sink, false, a.scratch);
    handle_burst(*b.engine, b.macs, rb.data(), n, now, *b.sink, true, b.scratch);
    for (const Out& o : a.sink->out)
      if (o.ip == base_ip + 3 && o.has_mac && o.mac == mac_of(33) && o.type == static_cast<uint8_t>(MsgType::kResult))
        ++results_at_moved;
    std::sort(a.sink->out.begin(), a.sink->out.end());
    std::sort(b.sink->out.begin(), b.sink->out.end());
    ASSERT_EQ(a.sink->out.size(), b.sink->out.size()) << "burst " << bursts;
    for (size_t k = 0; k < a.sink->out.size(); ++k)
      ASSERT_TRUE(a.sink->out[k] == b.sink->out[k]) << "burst " << bursts << " reply " << k;
    ASSERT_EQ(a.macs.entries(), b.macs.entries()) << "burst " << bursts;
    i += n;
    ++bursts;
    now += 100;
  }
  EXPECT_EQ(stats_values(a.stats), stats_values(b.stats));
  EXPECT_EQ(a.macs.resets(), b.macs.resets());
  // The stream exercised what it is meant to.
  EXPECT_GT(a.macs.resets(), 0u);
  EXPECT_EQ(stats_get(stats_values(a.stats), "slots_completed"), 40u);
  EXPECT_EQ(stats_get(stats_values(a.stats), "jobs_created"), 2u) << "the cookie-checked JOIN was accepted";
  EXPECT_GT(results_at_moved, 0u) << "worker 3's results followed its address to the new station";
}

}  // namespace
