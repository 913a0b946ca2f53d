// The aggregator state machine without sockets, on a fake clock: authentication and the JOIN
// handshake, slot lifecycle, idempotence, shadow-set reuse, partial aggregation with a job view
// (stragglers, left-behind workers and their rejoin, a member that dies inside an op),
// retraction, job isolation and resource limits.
#include <gtest/gtest.h>

#include <netinet/in.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/protocol/builder.h"

namespace {

using namespace thc::switch_offload;
using thc::PeerAddr;
using namespace thc::switch_offload::proto;

PeerAddr addr(int i, uint32_t ip = 0x0A000001) {
  PeerAddr a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(static_cast<uint16_t>(50000 + i));
  in->sin_addr.s_addr = htonl(ip);
  a.len = sizeof(sockaddr_in);
  return a;
}

auth::Key test_key(uint32_t id) {
  auth::Key k;
  k.id = id;
  for (size_t i = 0; i < auth::kKeyBytes; ++i) k.bytes[i] = static_cast<uint8_t>(0x33 + i * 5 + id);
  return k;
}

struct Sent {
  PeerAddr to;
  Header h;
  std::vector<uint8_t> payload;
  size_t len = 0;
  std::vector<uint8_t> bytes;
};

class Capture final : public Sink {
 public:
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override {
    Sent s;
    s.to = to;
    s.len = len;
    s.bytes.assign(data, data + len);
    const uint8_t* pl;
    size_t plen;
    ASSERT_EQ(parse(data, len, &s.h, &pl, &plen), ParseError::kOk) << "engine emitted a malformed packet";
    s.payload.assign(pl, pl + plen);
    out.push_back(s);
  }
  // Results arrive as send_parts; the tails between two next_payload() calls must be one payload.
  void send_parts(const PeerAddr& to, const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen) override {
    parts.push_back({payloads, std::vector<uint8_t>(tail, tail + tlen), tail});
    Sink::send_parts(to, head, hlen, tail, tlen);
  }
  void next_payload() override { ++payloads; }
  struct Part {
    uint64_t payload;  // next_payload() calls before it
    std::vector<uint8_t> tail;
    const uint8_t* at;
  };
  std::vector<Part> parts;
  uint64_t payloads = 0;
  std::vector<Sent> take() {
    std::vector<Sent> r;
    r.swap(out);
    return r;
  }
  static std::vector<Sent> of(const std::vector<Sent>& v, MsgType t) {
    std::vector<Sent> r;
    for (const Sent& s : v)
      if (s.h.type == t) r.push_back(s);
    return r;
  }
  std::vector<Sent> out;
};

// Tofino-profile joins (256 lanes for every encoding in a 1024-byte budget) keep the packets small.
JoinParams params(uint16_t k, uint16_t S, uint32_t qt) {
  JoinParams p;
  p.quorum = k;
  p.slots = S;
  p.quorum_timeout_us = qt;
  p.max_lanes = kTofinoLanes;
  p.payload_budget = kTofinoPayloadBudget;
  return p;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override { make_engine(64, int64_t{1} << 30); }
  void make_engine(int jobs, int64_t bytes, int per_source = 16, uint16_t shards = 1) {
    cfg.seed = 99;
    cfg.max_slots_per_job = 64;
    cfg.budget = std::make_shared<Budget>(jobs, bytes, per_source);
    cfg.job_idle_timeout_us = 10'000'000;
    cfg.keys = std::make_shared<auth::KeyRing>(std::vector<auth::Key>{test_key(0), test_key(1), test_key(2)});
    cfg.shards = shards;
    eng = std::make_unique<Engine>(cfg, &stats);
  }
  bool feed(int from, const std::vector<uint8_t>& p) { return feed_at(addr(from), p); }
  bool feed_at(const PeerAddr& a, const std::vector<uint8_t>& p) {
    return eng->handle(p.data(), p.size(), a, now, sink) != Handled::kDropped;
  }
  JobId job(uint32_t label, uint16_t n, uint32_t key_id = 1, uint16_t shard = 0) {
    return JobId::make(test_key(key_id), label, n, shard);
  }
  // The handshake of one worker: a JOIN draws a CHALLENGE with a cookie; the JOIN with the
  // cookie gets the JOIN_ACK. Returns the JOIN_ACK body (and sets the job's data key).
  JoinAckBody join_one(JobId* j, uint16_t w, const JoinParams& p, int from = -1) {
    const PeerAddr a = addr(from < 0 ? w : from);
    JoinParams q = p;
    feed_at(a, make_join(*j, w, q, ++nonce_));
    auto r = sink.take();
    EXPECT_EQ(r.size(), 1u);
    JoinAckBody ack;
    if (r.empty()) return ack;
    EXPECT_EQ(r[0].h.type, MsgType::kChallenge);
    EXPECT_LT(r[0].len, make_join(*j, w, q).size()) << "a challenge is smaller than the JOIN it answers";
    EXPECT_TRUE(auth::verify(j->jkey, r[0].bytes.data(), r[0].len));
    q.cookie = r[0].payload.data();
    feed_at(a, make_join(*j, w, q, ++nonce_));
    r = sink.take();
    EXPECT_EQ(r.size(), 1u);
    if (r.empty()) return ack;
    EXPECT_EQ(r[0].h.type, MsgType::kJoinAck);
    EXPECT_TRUE(auth::verify(j->jkey, r[0].bytes.data(), r[0].len));
    EXPECT_EQ(parse_join_ack(r[0].payload.data(), r[0].payload.size(), &ack), ParseError::kOk);
    j->with_seed(ack.seed);
    return ack;
  }
  std::vector<uint64_t> join_all(JobId* j, uint16_t k, uint16_t S, uint32_t qt, const TableSpec* t = nullptr) {
    std::vector<uint64_t> seeds;
    for (uint16_t w = 0; w < j->nworkers; ++w) {
      JoinParams p = params(k, S, qt);
      p.table = w == 0 ? t : nullptr;
      seeds.push_back(join_one(j, w, p).seed);
    }
    return seeds;
  }
  uint64_t drops(Drop d) const { return stats.drops[static_cast<int>(d)].get(); }
  static std::vector<Sent> of_type(const std::vector<Sent>& v, MsgType t) {
    std::vector<Sent> r;
    for (const Sent& s : v)
      if (s.h.type == t) r.push_back(s);
    return r;
  }

  EngineConfig cfg;
  Stats stats;
  std::unique_ptr<Engine> eng;
  Capture sink;
  uint64_t now = 1'000'000;
  uint64_t nonce_ = 0;
};

TEST_F(EngineTest, JoinGivesEveryWorkerTheSameSeedAndTheNegotiatedLanes) {
  JobId j = job(5, 3);
  auto seeds = join_all(&j, 3, 8, 0);
  ASSERT_EQ(seeds.size(), 3u);
  EXPECT_EQ(seeds[0], seeds[1]);
  EXPECT_EQ(seeds[1], seeds[2]);
  EXPECT_NE(seeds[0], 0u);
  // Re-joining is idempotent and keeps the seed.
  EXPECT_EQ(join_all(&j, 3, 8, 0)[0], seeds[0]);
  // A different job gets a different seed.
  JobId k = job(6, 3);
  EXPECT_NE(join_all(&k, 3, 8, 0)[0], seeds[0]);
  EXPECT_EQ(stats.jobs_created.get(), 2u);
  // A job that asks for more: the aggregator's own path (1500-byte MTU) bounds the budget.
  JobId big = job(7, 1);
  JoinParams p = params(1, 8, 0);
  p.max_lanes = 8192;
  p.payload_budget = 8000;
  const JoinAckBody a = join_one(&big, 0, p);
  // Lanes no packet of the budget can carry are not granted (nor charged as registers).
  EXPECT_EQ(a.max_lanes, 1408);
  EXPECT_EQ(a.payload_budget, kPayloadBudget1500);
  EXPECT_EQ(a.shards, 1);
  const int lanes = lanes_for(MsgType::kDataIndex, WireInt::kU8, 4, a.max_lanes, a.payload_budget);
  EXPECT_EQ(lanes, 1408);
  // Packets of that job carry the negotiated lanes; any other count of lanes is refused.
  feed(0, make_indices(big, 0, 8, 0, 0, WireInt::kU8, 4, 0, {1}, kTofinoLanes));
  EXPECT_EQ(drops(Drop::kBadLanes), 1u);
  sink.take();
}

TEST_F(EngineTest, NothingUnauthenticatedIsAnswered) {
  JobId j = job(5, 3);
  join_all(&j, 3, 8, 0);
  const size_t created = stats.jobs_created.get();
  // A JOIN under a key the aggregator does not hold, one under the operator key, a forged tag,
  // a data packet signed with the join key, one without any tag: all dropped without a reply.
  JobId stranger = job(5, 3, 9);
  JobId op = job(5, 3, 0);
  EXPECT_FALSE(feed(2, make_join(stranger, 0, params(3, 8, 0))));
  EXPECT_FALSE(feed(2, make_join(op, 0, params(3, 8, 0))));
  auto forged = make_join(j, 0, params(3, 8, 0));
  forged[kTagOffset] ^= 1;
  EXPECT_FALSE(feed(2, forged));
  auto wrong_key = make_values(j, 0, 8, 0, 0, WireInt::kU8, {1});
  auth::sign(j.jkey, wrong_key.data(), wrong_key.size());
  EXPECT_FALSE(feed(2, wrong_key));
  EXPECT_FALSE(feed(2, make_packet(data_header(MsgType::kDataValue, j, 0, 8, 0, 0, WireInt::kU8, 1, 256),
                                   std::vector<uint8_t>(256), nullptr)));
  EXPECT_TRUE(sink.take().empty());
  EXPECT_EQ(drops(Drop::kBadTag), 5u);
  EXPECT_EQ(stats.jobs_created.get(), created);
  // Garbage and other versions are not answered either (not even with "bad version").
  auto v = make_values(j, 0, 8, 0, 0, WireInt::kU8, {1});
  v[4] = 1;
  EXPECT_FALSE(feed(2, v));
  EXPECT_FALSE(feed(2, std::vector<uint8_t>(300, 0x5A)));
  EXPECT_TRUE(sink.take().empty());
}

TEST_F(EngineTest, JoinNeedsTheCookieOfItsOwnAddress) {
  JobId j = job(5, 2);
  feed(0, make_join(j, 0, params(2, 8, 0)));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].h.type, MsgType::kChallenge);
  // The cookie replayed from another address (a spoofed source) gets a challenge of its own, and
  // creates nothing.
  JoinParams p = params(2, 8, 0);
  p.cookie = r[0].payload.data();
  feed(1, make_join(j, 0, p));
  r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kChallenge);
  EXPECT_EQ(eng->job_count(), 0u);
  // Cookies expire.
  feed(0, make_join(j, 0, params(2, 8, 0)));
  r = sink.take();
  std::vector<uint8_t> cookie = r.at(0).payload;
  now += 61'000'000;
  p.cookie = cookie.data();
  feed(0, make_join(j, 0, p));
  EXPECT_EQ(sink.take().at(0).h.type, MsgType::kChallenge);
  EXPECT_EQ(eng->job_count(), 0u);
  EXPECT_EQ(drops(Drop::kCookie), 4u);
}

TEST_F(EngineTest, JoinRejectsMismatch) {
  JobId j = job(5, 3);
  join_all(&j, 3, 8, 0);
  JoinParams p = params(2, 8, 0);  // other quorum
  // A worker's later requests carry larger nonces (an older JOIN would be a replay).
  feed(0, make_join(j, 0, p, ++nonce_));
  auto ch = sink.take();
  p.cookie = ch.at(0).payload.data();
  feed(0, make_join(j, 0, p, ++nonce_));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kError);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kConfigMismatch));
  EXPECT_TRUE(auth::verify(j.jkey, r[0].bytes.data(), r[0].len)) << "errors are authenticated too";
  EXPECT_EQ(drops(Drop::kConfigMismatch), 1u);
}

TEST_F(EngineTest, ValueSumCompletesAndResultGoesToEveryWorker) {
  JobId j = job(1, 2);
  join_all(&j, 2, 4, 0);
  feed(0, make_values(j, 0, 4, 0, 0, WireInt::kI16, {1, 0xFFFF, 100}));
  EXPECT_TRUE(sink.take().empty()) << "no result before every worker arrived";
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kI16, {2, 0xFFFE, 0x7FFF}));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 2u);
  for (const Sent& s : r) {
    EXPECT_EQ(s.h.type, MsgType::kResult);
    EXPECT_TRUE(auth::verify(j.dkey, s.bytes.data(), s.len));
    EXPECT_EQ(s.h.contributors, 2);
    EXPECT_EQ(s.h.bitmap, 0b11u);
    EXPECT_EQ(s.h.flags, 0);
    EXPECT_EQ(s.h.count, 3);
    EXPECT_EQ(s.h.lanes, 256);
    EXPECT_EQ(load_lane(WireInt::kI16, s.payload.data(), 0), 3u);
    EXPECT_EQ(load_lane(WireInt::kI16, s.payload.data(), 1), 0xFFFDu);  // -1 + -2
    EXPECT_EQ(load_lane(WireInt::kI16, s.payload.data(), 2), 0x8063u);  // wraps like int16
    EXPECT_EQ(load_lane(WireInt::kI16, s.payload.data(), 3), 0u);
  }
  EXPECT_TRUE((r[0].h.worker == 0 && r[0].to == addr(0)) || (r[0].h.worker == 1 && r[0].to == addr(1)));
  EXPECT_EQ(stats.elements.get(), 6u);
  EXPECT_EQ(stats.slots_completed.get(), 1u);
}

TEST_F(EngineTest, RepliesGoToTheJoinedAddressOnly) {
  JobId j = job(1, 2);
  join_all(&j, 2, 4, 0);
  // Worker 1's (authentic) packet arrives from elsewhere (a replay with a spoofed source): it
  // counts, but nothing goes to that source.
  feed(0, make_values(j, 0, 4, 0, 0, WireInt::kU8, {1}));
  feed_at(addr(7, 0x0A0000FE), make_values(j, 1, 4, 0, 0, WireInt::kU8, {2}));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 2u);
  for (const Sent& s : r) EXPECT_TRUE(s.to == addr(s.h.worker)) << s.to.str();
}

TEST_F(EngineTest, IndexFormLooksUpTheInstalledTable) {
  JobId j = job(2, 3);
  TableSpec t;
  t.id = 1;
  t.bits = 3;
  t.sum = WireInt::kI16;
  const int32_t vals[8] = {-100, -7, -1, 0, 1, 2, 50, 1000};
  std::copy(vals, vals + 8, t.values);
  join_all(&j, 3, 4, 0);
  feed(1, make_table(j, 1, t, 100));
  ASSERT_EQ(sink.take().at(0).h.type, MsgType::kTableAck);
  std::vector<std::vector<uint8_t>> codes = {{0, 1, 7, 3, 5}, {0, 2, 7, 6, 5}, {1, 4, 7, 0, 5}};
  for (uint16_t w = 0; w < 3; ++w) feed(w, make_indices(j, w, 4, 0, 0, WireInt::kI16, 3, 1, codes[w]));
  auto r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 3u);
  for (int i = 0; i < 5; ++i) {
    int32_t want = 0;
    for (int w = 0; w < 3; ++w) want += vals[codes[w][i]];
    EXPECT_EQ(static_cast<int16_t>(load_lane(WireInt::kI16, r[0].payload.data(), i)), want) << i;
  }
  // An index packet for a table id never installed, or with another b, is refused.
  feed(0, make_indices(j, 0, 4, 1, 1, WireInt::kI16, 3, 2, {1}));
  feed(0, make_indices(j, 0, 4, 1, 1, WireInt::kI16, 4, 1, {1}));
  auto e = sink.take();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].h.aux, static_cast<uint32_t>(ErrorCode::kNoTable));
  EXPECT_EQ(drops(Drop::kNoTable), 2u);
  // A replayed older TABLE (another table under id 1) is ignored; the same nonce is re-acked.
  TableSpec other = t;
  other.values[0] = 5;
  feed(1, make_table(j, 1, other, 99));
  EXPECT_TRUE(sink.take().empty());
  EXPECT_EQ(drops(Drop::kReplay), 1u);
  feed(1, make_table(j, 1, t, 100));
  EXPECT_EQ(sink.take().at(0).h.type, MsgType::kTableAck);
}

TEST_F(EngineTest, MaxCombinesByMaximum) {
  JobId j = job(3, 2);
  join_all(&j, 2, 4, 0);
  feed(0, make_values(j, 0, 4, 0, 0, WireInt::kU32, {5, 0xFFFFFFFF, 0}, MsgType::kDataMax));
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kU32, {7, 3, 0}, MsgType::kDataMax));
  auto r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(load_lane(WireInt::kU32, r[0].payload.data(), 0), 7u);
  EXPECT_EQ(load_lane(WireInt::kU32, r[0].payload.data(), 1), 0xFFFFFFFFu);
}

TEST_F(EngineTest, DuplicatesAreIdempotentAndLostResultsAreResent) {
  JobId j = job(4, 2);
  join_all(&j, 2, 4, 0);
  const auto p0 = make_values(j, 0, 4, 0, 0, WireInt::kU8, {10, 20});
  feed(0, p0);
  feed(0, p0);
  feed(0, p0);
  EXPECT_EQ(stats.duplicates.get(), 2u);
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kU8, {1, 2}));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(load_lane(WireInt::kU8, r[0].payload.data(), 0), 11u);
  // Worker 1 lost its result: its retransmission gets the stored one, to it alone.
  const auto p1_again = as_resend(make_values(j, 1, 4, 0, 0, WireInt::kU8, {1, 2}), 1, j);
  feed(1, p1_again);
  r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.worker, 1);
  EXPECT_EQ(load_lane(WireInt::kU8, r[0].payload.data(), 1), 22u);
  EXPECT_EQ(stats.result_resends.get(), 1u);
  // A copy of an attempt already answered (a duplicate in the network, or a recording replayed
  // by anybody) draws nothing more; the next attempt is answered again.
  feed(1, p1_again);
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kU8, {1, 2}));
  EXPECT_TRUE(sink.take().empty());
  EXPECT_EQ(drops(Drop::kReplay), 2u);
  feed(1, as_resend(make_values(j, 1, 4, 0, 0, WireInt::kU8, {1, 2}), 2, j));
  EXPECT_EQ(sink.take().size(), 1u);
  EXPECT_EQ(stats.result_resends.get(), 2u);
}

TEST_F(EngineTest, ShadowSetIsReusedOnlyAfterEveryWorkerMovedOn) {
  JobId j = job(8, 2);
  join_all(&j, 2, 1, 0);  // one slot: seq 0 -> shadow 0, seq 1 -> shadow 1, seq 2 -> shadow 0 again
  for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 1, 0, 0, WireInt::kU8, {1}));
  ASSERT_EQ(of_type(sink.take(), MsgType::kResult).size(), 2u);
  feed(0, make_values(j, 0, 1, 1, 1, WireInt::kU8, {2}));  // worker 0 moves to seq 1
  // Worker 0 runs ahead to seq 2, but worker 1 has not sent seq 1: it may still need seq 0's
  // result, which shadow 0 keeps. Refused.
  feed(0, make_values(j, 0, 1, 2, 2, WireInt::kU8, {3}));
  EXPECT_EQ(drops(Drop::kSlotBusy), 1u);
  // Worker 1 lost the result of seq 0: still available (to its resend).
  feed(1, as_resend(make_values(j, 1, 1, 0, 0, WireInt::kU8, {1}), 1, j));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.seq, 0u);
  EXPECT_EQ(load_lane(WireInt::kU8, r[0].payload.data(), 0), 2u);
  feed(1, make_values(j, 1, 1, 1, 1, WireInt::kU8, {2}));
  ASSERT_EQ(of_type(sink.take(), MsgType::kResult).size(), 2u);
  feed(0, make_values(j, 0, 1, 2, 2, WireInt::kU8, {3}));  // now allowed
  EXPECT_EQ(drops(Drop::kSlotBusy), 1u);
  // A delayed duplicate of seq 0 is stale now.
  feed(1, make_values(j, 1, 1, 0, 0, WireInt::kU8, {1}));
  EXPECT_EQ(drops(Drop::kStale), 1u);
  feed(1, make_values(j, 1, 1, 2, 2, WireInt::kU8, {4}));
  r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(load_lane(WireInt::kU8, r[0].payload.data(), 0), 7u);
  // Slot and shadow must agree with seq; seq may not skip a use.
  Header h = data_header(MsgType::kDataValue, j, 0, 1, 3, 3, WireInt::kU8, 1, 256);
  h.shadow = 0;  // seq 3 belongs to shadow 1
  feed(0, make_packet(h, std::vector<uint8_t>(256), &j.dkey));
  feed(0, make_values(j, 0, 1, 7, 7, WireInt::kU8, {1}));
  EXPECT_EQ(drops(Drop::kBadSlot), 2u);
}

// A shadow set's next use starts from nothing: its first contribution overwrites the registers
// (no zeroing pass), lanes past a shorter packet's count are zero, for every packet form.
TEST_F(EngineTest, AReusedShadowSetStartsFromNothing) {
  JobId j = job(9, 2);
  TableSpec t;
  t.id = 0;
  t.bits = 4;
  t.sum = WireInt::kU8;
  for (int z = 0; z < 16; ++z) t.values[z] = 3 * z + 1;
  join_all(&j, 2, 1, 0, &t);  // one slot: seq 0 and 2 share shadow 0
  std::mt19937 rng(3);
  for (int form = 0; form < 3; ++form) {
    const uint64_t base = static_cast<uint64_t>(form) * 4;  // seqs base .. base + 3
    for (uint64_t k = 0; k < 4; ++k) {
      const uint64_t seq = base + k;
      // Full packets first, then a short one on the same shadow set as a full one.
      const int count = k < 2 ? 256 : 37;
      std::vector<std::vector<uint32_t>> v(2, std::vector<uint32_t>(static_cast<size_t>(count)));
      for (auto& w : v)
        for (auto& x : w) x = form == 2 ? rng() & 0xF : rng();
      for (uint16_t w = 0; w < 2; ++w) {
        if (form == 0) {
          feed(w, make_values(j, w, 1, seq, static_cast<uint32_t>(seq), WireInt::kU16, v[w]));
        } else if (form == 1) {
          feed(w, make_values(j, w, 1, seq, static_cast<uint32_t>(seq), WireInt::kU32, v[w], MsgType::kDataMax));
        } else {
          std::vector<uint8_t> codes(v[w].begin(), v[w].end());
          feed(w, make_indices(j, w, 1, seq, static_cast<uint32_t>(seq), WireInt::kU8, 4, 0, codes));
        }
      }
      const auto r = of_type(sink.take(), MsgType::kResult);
      ASSERT_EQ(r.size(), 2u) << "form " << form << " seq " << seq;
      const WireInt e = form == 0 ? WireInt::kU16 : form == 1 ? WireInt::kU32 : WireInt::kU8;
      for (int i = 0; i < r[0].h.lanes; ++i) {
        uint32_t want = 0;
        if (i < count) {
          const uint32_t a = v[0][i], b = v[1][i];
          want = form == 0 ? (a + b) & 0xFFFF : form == 1 ? std::max(a, b) : (t.values[a] + t.values[b]) & 0xFF;
        }
        ASSERT_EQ(load_lane(e, r[0].payload.data(), i), want) << "form " << form << " seq " << seq << " lane " << i;
      }
    }
  }
}

TEST_F(EngineTest, QuorumTimeoutGivesPartialResultAndTheViewGoesOn) {
  JobId j = job(9, 3);
  join_all(&j, 2, 8, 1000);
  // Op 0 is two packets; workers 0 and 1 send both.
  for (uint64_t seq = 0; seq < 2; ++seq)
    for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 8, seq, 0, WireInt::kU16, {uint32_t(10 + w), 1}));
  EXPECT_TRUE(sink.take().empty());
  now += 500;
  eng->tick(now, sink);
  EXPECT_TRUE(sink.take().empty()) << "quorum reached but the timeout has not passed";
  now += 600;
  eng->tick(now, sink);
  auto r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 4u);  // two packets x two counted workers
  for (const Sent& s : r) {
    EXPECT_EQ(s.h.contributors, 2);
    EXPECT_EQ(s.h.bitmap, 0b011u);
    EXPECT_EQ(s.h.flags, kFlagPartial);
    EXPECT_EQ(load_lane(WireInt::kU16, s.payload.data(), 0), 21u);
  }
  EXPECT_EQ(stats.partial_completions.get(), 2u);
  // The straggler arrives: it gets the partial sum, flagged as not counting it.
  feed(2, make_values(j, 2, 8, 0, 0, WireInt::kU16, {100, 1}));
  r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kResult);
  EXPECT_EQ(r[0].h.worker, 2);
  EXPECT_EQ(r[0].h.flags, kFlagPartial | kFlagNotCounted);
  EXPECT_EQ(r[0].h.bitmap, 0b011u);
  EXPECT_EQ(load_lane(WireInt::kU16, r[0].payload.data(), 0), 21u);
  EXPECT_EQ(stats.late_not_counted.get(), 1u);
  // The job's view is {0, 1} now: the next op completes as soon as they are counted, with no
  // second quorum timeout.
  for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 8, 2, 1, WireInt::kU16, {1}));
  r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].h.bitmap, 0b011u);
  // The straggler catches up: counted before the decision of op 2, it is back in the view.
  feed(2, make_values(j, 2, 8, 1, 0, WireInt::kU16, {100, 1}));
  feed(2, make_values(j, 2, 8, 2, 1, WireInt::kU16, {1}));
  sink.take();
  feed(2, make_values(j, 2, 8, 3, 2, WireInt::kU16, {1}));
  EXPECT_TRUE(sink.take().empty());
  for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 8, 3, 2, WireInt::kU16, {1}));
  r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].h.contributors, 3);
  // ... and the view waits for it again.
  for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 8, 4, 3, WireInt::kU16, {1}));
  EXPECT_TRUE(sink.take().empty());
}

TEST_F(EngineTest, FastWorkersDoNotWaitForAStragglerAndItRejoins) {
  // Quorum 2 of 3 and 2 slots: without the view, slot reuse would wait for worker 2 after 2S = 4
  // packets.
  JobId j = job(11, 3);
  join_all(&j, 2, 2, 1000);
  const uint64_t kOps = 40;
  for (uint64_t seq = 0; seq < kOps; ++seq) {
    for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 2, seq, static_cast<uint32_t>(seq), WireInt::kU8, {1}, MsgType::kDataValue));
    if (seq == 0) {
      now += 1100;
      eng->tick(now, sink);
    }
    auto r = of_type(sink.take(), MsgType::kResult);
    ASSERT_EQ(r.size(), 2u) << "seq " << seq;
    EXPECT_EQ(r[0].h.bitmap, 0b011u);
  }
  EXPECT_EQ(drops(Drop::kSlotBusy), 0u);
  // The straggler wakes up with its op 0: the slot was reused long ago. It is told so (with an
  // authenticated error), not left to time out.
  feed(2, make_values(j, 2, 2, 0, 0, WireInt::kU8, {5}));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kError);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kLeftBehind));
  EXPECT_TRUE(auth::verify(j.dkey, r[0].bytes.data(), r[0].len));
  EXPECT_EQ(stats.left_behind.get(), 1u);
  // It rejoins: it is registered at once and comes back at the start of the job's next call (a
  // MAX op, the prelude every call starts with); where that starts is known once a worker sent
  // its first packet.
  JoinParams rj = params(2, 2, 1000);
  rj.flags = kJoinRejoin;
  JoinAckBody a = join_one(&j, 2, rj);
  EXPECT_EQ(a.resume_op, kOps);
  EXPECT_EQ(a.resume_flags, 0u);
  auto first = make_values(j, 0, 2, kOps, static_cast<uint32_t>(kOps), WireInt::kU32, {1}, MsgType::kDataMax, 256);
  Header fh;
  parse(first.data(), first.size(), &fh, nullptr, nullptr);
  fh.flags = kFlagFirst;
  feed(0, make_packet(fh, std::vector<uint8_t>(first.begin() + kHeaderBytes, first.end()), &j.dkey));
  feed(1, make_values(j, 1, 2, kOps, static_cast<uint32_t>(kOps), WireInt::kU32, {1}, MsgType::kDataMax, 256));
  EXPECT_TRUE(sink.take().empty()) << "the call's prelude waits for the rejoining worker";
  a = join_one(&j, 2, rj);
  EXPECT_EQ(a.resume_op, kOps);
  EXPECT_EQ(a.resume_flags, kResumeKnown);
  EXPECT_EQ(a.resume_seq, kOps);
  feed(2, make_values(j, 2, 2, kOps, static_cast<uint32_t>(kOps), WireInt::kU32, {7}, MsgType::kDataMax, 256));
  r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].h.contributors, 3);
  EXPECT_EQ(load_lane(WireInt::kU32, r[0].payload.data(), 0), 7u);
  // Slots of seqs before its resume point do not wait for it (it never sends them): the next
  // packet, in a shadow set it never used, completes with everyone.
  for (uint16_t w = 0; w < 3; ++w)
    feed(w, make_values(j, w, 2, kOps + 1, static_cast<uint32_t>(kOps + 1), WireInt::kU8, {1}));
  r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(load_lane(WireInt::kU8, r[0].payload.data(), 0), 3u);
  EXPECT_EQ(drops(Drop::kSlotBusy), 0u);
}

TEST_F(EngineTest, AMemberThatDiesInsideAnOpDoesNotStallTheJob) {
  JobId j = job(12, 3);
  join_all(&j, 2, 8, 1000);
  // Op 0 has two packets; all three workers send the first: decided with everyone.
  for (uint16_t w = 0; w < 3; ++w) feed(w, make_values(j, w, 8, 0, 0, WireInt::kU8, {1}));
  ASSERT_EQ(of_type(sink.take(), MsgType::kResult).size(), 3u);
  // Worker 2 dies before its second packet.
  for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 8, 1, 0, WireInt::kU8, {1}));
  now += 500;
  eng->tick(now, sink);
  EXPECT_TRUE(sink.take().empty());
  now += cfg.dead_worker_us - 1000;  // 0.5 ms short of the dead-worker timeout
  eng->tick(now, sink);
  EXPECT_TRUE(sink.take().empty());
  now += 1000;
  eng->tick(now, sink);
  auto r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 2u) << "completed without the silent member";
  EXPECT_EQ(r[0].h.bitmap, 0b011u) << "its bitmap differs from the op's other result: the op is incomplete";
  EXPECT_EQ(stats.stuck_completions.get(), 1u);
  // The job goes on without worker 2.
  for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 8, 2, 1, WireInt::kU8, {1}));
  EXPECT_EQ(of_type(sink.take(), MsgType::kResult).size(), 2u);
}

// Op 0 of a 3-worker job (quorum 2, quorum timeout 1 ms) is two packets: all three sent the first
// (the op is decided with everyone), workers 0 and 1 the second; worker 2's second is to come.
// expect_complete_with_worker_2 sends it: the slot completes with everyone.
class EngineSilenceTest : public EngineTest {
 protected:
  void start(uint32_t label) {
    j_ = job(label, 3);
    join_all(&j_, 2, 8, 1000);
    for (uint16_t w = 0; w < 3; ++w) feed(w, make_values(j_, w, 8, 0, 0, WireInt::kU8, {1}));
    ASSERT_EQ(of_type(sink.take(), MsgType::kResult).size(), 3u);
    for (uint16_t w = 0; w < 2; ++w) feed(w, second(w));
  }
  std::vector<uint8_t> second(uint16_t w) { return make_values(j_, w, 8, 1, 0, WireInt::kU8, {1}); }
  void expect_complete_with_worker_2() {
    feed(2, second(2));
    auto r = of_type(sink.take(), MsgType::kResult);
    ASSERT_EQ(r.size(), 3u);
    EXPECT_EQ(r[0].h.bitmap, 0b111u);
    EXPECT_EQ(stats.stuck_completions.get(), 0u);
  }
  JobId j_;
};

// A member of a decided op that is silent for longer than the quorum timeout is not dead yet: a
// worker whose packet was lost at the tail of its window resends it only after its RTO (up to
// 200 ms by default), and a process may be descheduled for as long. Taking it for dead would fail
// the call on every rank (the op's results would carry different bitmaps).
TEST_F(EngineSilenceTest, AMemberSilentForLongerThanTheQuorumTimeoutIsNotTakenForDead) {
  start(30);
  for (int i = 0; i < 300; ++i) {  // 300 ms of ticks, 1 ms apart
    now += 1000;
    eng->tick(now, sink);
  }
  EXPECT_TRUE(sink.take().empty()) << "a member silent for 300 ms was taken for dead";
  expect_complete_with_worker_2();
}

// Silence is judged by the timer, after the server read its input, never while a packet is being
// handled: an aggregator that was itself descheduled finds every worker's newest packets still
// queued behind the one it handles, and each worker looks silent since before the stall.
TEST_F(EngineSilenceTest, AnAggregatorThatStalledDoesNotTakeQueuedWorkersForDead) {
  start(31);
  // The aggregator stalls for 5 s; meanwhile a copy of worker 0's packet and worker 2's packet
  // were queued, in that order.
  now += 5'000'000;
  feed(0, second(0));
  EXPECT_TRUE(of_type(sink.take(), MsgType::kResult).empty()) << "worker 2 was taken for dead while its packet waited";
  expect_complete_with_worker_2();
}

TEST_F(EngineTest, LateContributionAddedBeforeTheDecisionIsRetracted) {
  JobId j = job(10, 3);
  join_all(&j, 2, 8, 1000);
  // Op 0 is two packets. Slot 0 gets workers 0 and 1; slot 1 gets worker 2 (early: its first
  // packet is late) and worker 0.
  const auto w2_seq1 = make_values(j, 2, 8, 1, 0, WireInt::kU32, {1000, 1000});
  feed(0, make_values(j, 0, 8, 0, 0, WireInt::kU32, {1, 2}));
  feed(1, make_values(j, 1, 8, 0, 0, WireInt::kU32, {1, 2}));
  feed(2, w2_seq1);
  feed(0, make_values(j, 0, 8, 1, 0, WireInt::kU32, {1, 2}));
  EXPECT_TRUE(sink.take().empty());
  now += 2000;
  eng->tick(now, sink);
  // Slot 0 timed out with {0,1} and fixed the op's members; slot 1 holds worker 2, so it may not
  // complete with {0,2} (that would give the op two contributor sets).
  auto r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].h.seq, 0u);
  EXPECT_EQ(r[0].h.bitmap, 0b011u);
  feed(1, make_values(j, 1, 8, 1, 0, WireInt::kU32, {1, 2}));
  EXPECT_TRUE(sink.take().empty()) << "worker 2's contribution is still in slot 1";
  // Worker 2 retransmits (it has no result): its contribution is taken out again.
  feed(2, as_resend(w2_seq1, 1, j));
  r = sink.take();
  EXPECT_EQ(stats.retractions.get(), 1u);
  auto res = of_type(r, MsgType::kResult);
  auto acks = of_type(r, MsgType::kAck);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].h.flags, kFlagNotCounted);
  ASSERT_EQ(res.size(), 3u);  // slot 1 completes: to workers 0, 1 and (not counted) 2
  for (const Sent& s : res) {
    EXPECT_EQ(s.h.seq, 1u);
    EXPECT_EQ(s.h.bitmap, 0b011u);
    EXPECT_EQ(load_lane(WireInt::kU32, s.payload.data(), 0), 2u);
    EXPECT_EQ(load_lane(WireInt::kU32, s.payload.data(), 1), 4u);
  }
}

TEST_F(EngineTest, JobsAreIsolatedFromGarbageAndEachOther) {
  JobId a = job(20, 2), b = job(21, 2);
  join_all(&a, 2, 4, 0);
  join_all(&b, 2, 4, 0);
  feed(0, make_values(a, 0, 4, 0, 0, WireInt::kU8, {1, 1}));
  // Noise from everywhere.
  JobId wrong = a;
  wrong.with_seed(12345);
  feed(3, make_values(wrong, 1, 4, 0, 0, WireInt::kU8, {50, 50}));
  auto v = make_values(a, 1, 4, 0, 0, WireInt::kU8, {60, 60});
  auto ver = v;
  ver[4] = 9;
  feed(3, ver);
  feed(3, std::vector<uint8_t>(v.begin(), v.begin() + 40));
  feed(3, std::vector<uint8_t>(v.begin(), v.end() - 3));
  feed(3, std::vector<uint8_t>(300, 0x5A));
  feed(3, {});
  JobId ghost = job(99, 2);
  ghost.with_seed(1);
  feed(3, make_values(ghost, 0, 4, 0, 0, WireInt::kU8, {1}));
  JobId wrong_n = a;
  wrong_n.nworkers = 3;
  feed(3, make_values(wrong_n, 2, 4, 0, 0, WireInt::kU8, {1}));
  EXPECT_EQ(sink.out.size(), 1u);  // only the authentic wrong_n packet (a key holder) is answered
  sink.take();
  // Job b uses the same slot numbers at the same time.
  feed(0, make_values(b, 0, 4, 0, 0, WireInt::kU8, {5, 5}));
  feed(1, make_values(b, 1, 4, 0, 0, WireInt::kU8, {6, 6}));
  auto rb = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(rb[0].h.job, make_job_id(1, 21));
  EXPECT_EQ(load_lane(WireInt::kU8, rb[0].payload.data(), 0), 11u);
  feed(1, make_values(a, 1, 4, 0, 0, WireInt::kU8, {2, 2}));
  auto ra = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_EQ(load_lane(WireInt::kU8, ra[0].payload.data(), 0), 3u);
  EXPECT_EQ(drops(Drop::kBadTag), 1u);
  EXPECT_EQ(drops(Drop::kBadVersion), 1u);
  EXPECT_EQ(drops(Drop::kTruncated), 2u);  // 40 bytes and the empty datagram
  EXPECT_EQ(drops(Drop::kBadMagic), 1u);   // 300 bytes of garbage
  EXPECT_EQ(drops(Drop::kBadLength), 1u);
  EXPECT_EQ(drops(Drop::kUnknownJob), 1u);
  EXPECT_EQ(drops(Drop::kBadWorker), 1u);
}

TEST_F(EngineTest, SameLabelUnderAnotherKeyIsAnotherJob) {
  // Tenant 2 cannot squat tenant 1's job: the key id is part of the job id.
  JobId t1 = job(30, 2, 1), t2 = job(30, 2, 2);
  join_all(&t2, 2, 4, 0);
  join_all(&t1, 2, 4, 0);
  EXPECT_EQ(eng->job_count(), 2u);
  feed(0, make_values(t1, 0, 4, 0, 0, WireInt::kU8, {1}));
  feed(0, make_values(t2, 0, 4, 0, 0, WireInt::kU8, {100}));
  feed(1, make_values(t1, 1, 4, 0, 0, WireInt::kU8, {2}));
  auto r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(load_lane(WireInt::kU8, r[0].payload.data(), 0), 3u);
}

TEST_F(EngineTest, ShardsAreIndependentInstances) {
  make_engine(64, int64_t{1} << 30, 16, 2);
  JobId s0 = job(40, 2, 1, 0), s1 = job(40, 2, 1, 1);
  EXPECT_EQ(join_one(&s0, 0, params(2, 4, 0)).shards, 2);
  join_one(&s0, 1, params(2, 4, 0));
  join_all(&s1, 2, 4, 0);
  EXPECT_EQ(eng->job_count(), 2u);
  feed(0, make_values(s0, 0, 4, 0, 0, WireInt::kU8, {1}));
  feed(0, make_values(s1, 0, 4, 0, 0, WireInt::kU8, {10}));
  feed(1, make_values(s1, 1, 4, 0, 0, WireInt::kU8, {20}));
  auto r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].h.shard, 1);
  EXPECT_EQ(load_lane(WireInt::kU8, r[0].payload.data(), 0), 30u);
  // A shard the aggregator does not have.
  JobId s5 = job(40, 2, 1, 5);
  EXPECT_FALSE(feed(0, make_join(s5, 0, params(2, 4, 0))));
}

TEST_F(EngineTest, ResourceLimitsAndLeave) {
  make_engine(1, int64_t{1} << 30);
  JobId a = job(30, 2), b = job(31, 1);
  join_all(&a, 2, 4, 0);
  JoinParams p = params(1, 4, 0);
  feed(0, make_join(b, 0, p));
  auto ch = sink.take();
  p.cookie = ch.at(0).payload.data();
  feed(0, make_join(b, 0, p));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kNoResources));
  feed(0, make_leave(a, 0, 100));
  EXPECT_EQ(eng->job_count(), 1u);
  feed(1, make_leave(a, 1, 100));
  EXPECT_EQ(eng->job_count(), 0u);
  EXPECT_EQ(of_type(sink.take(), MsgType::kLeaveAck).size(), 2u);
  // A LEAVE for a freed job cannot be verified any more: silence (the worker's bounded wait
  // gives up; it was the last anyway).
  feed(1, make_leave(a, 1, 101));
  EXPECT_TRUE(sink.take().empty());
  join_all(&b, 1, 4, 0);
  EXPECT_EQ(eng->job_count(), 1u);
  // Memory: a job whose slots do not fit is refused.
  make_engine(8, 64 * 1024);
  JobId c = job(40, 1);
  JoinParams big = params(1, 64, 0);
  feed(0, make_join(c, 0, big));
  ch = sink.take();
  big.cookie = ch.at(0).payload.data();
  feed(0, make_join(c, 0, big));
  EXPECT_EQ(sink.take().at(0).h.aux, static_cast<uint32_t>(ErrorCode::kNoResources));
  EXPECT_EQ(eng->job_count(), 0u);
}

TEST_F(EngineTest, OneSourceCannotTakeEveryJob) {
  make_engine(64, int64_t{1} << 30, 2);
  for (uint32_t label = 1; label <= 3; ++label) {
    JobId j = job(label, 1);
    JoinParams p = params(1, 4, 0);
    feed(0, make_join(j, 0, p));
    auto ch = sink.take();
    p.cookie = ch.at(0).payload.data();
    feed(0, make_join(j, 0, p));
    auto r = sink.take();
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].h.type, label <= 2 ? MsgType::kJoinAck : MsgType::kError) << label;
  }
  EXPECT_EQ(eng->job_count(), 2u);
  // Another source still can.
  JobId k = job(10, 1);
  JoinParams p = params(1, 4, 0);
  const PeerAddr other = addr(5, 0x0A000009);
  feed_at(other, make_join(k, 0, p));
  auto ch = sink.take();
  p.cookie = ch.at(0).payload.data();
  feed_at(other, make_join(k, 0, p));
  EXPECT_EQ(sink.take().at(0).h.type, MsgType::kJoinAck);
}

TEST_F(EngineTest, StatsNeedTheOperatorKeyOrLoopback) {
  Header h;
  h.type = MsgType::kStats;
  h.job = make_job_id(0, 0);
  h.seq = 5;
  const std::vector<uint8_t> pad(kStatsRequestBytes, 0);
  EXPECT_FALSE(feed(0, make_packet(h, pad, nullptr)));
  auto t1 = auth::stats_key(test_key(1));  // a tenant key is not the operator key
  EXPECT_FALSE(feed(0, make_packet(h, pad, &t1)));
  EXPECT_TRUE(sink.take().empty());
  EXPECT_EQ(drops(Drop::kStatsDenied), 2u);
  // Unpadded: a reply larger than the request would amplify; refused by the parser.
  auto op = auth::stats_key(test_key(0));
  EXPECT_FALSE(feed(0, make_packet(h, {}, &op)));
  EXPECT_EQ(drops(Drop::kBadLength), 1u);
  const auto req = make_stats(5, &op);
  EXPECT_TRUE(feed(0, req));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kStatsReply);
  EXPECT_LE(r[0].len, req.size());
  EXPECT_TRUE(auth::verify(op, r[0].bytes.data(), r[0].len));
  // The same nonce again (a recording replayed, from anywhere) or an older one: nothing.
  EXPECT_FALSE(feed(1, req));
  EXPECT_FALSE(feed(0, make_stats(4, &op)));
  EXPECT_TRUE(sink.take().empty());
  EXPECT_EQ(drops(Drop::kReplay), 2u);
  EXPECT_TRUE(feed(0, make_stats(6, &op)));
  EXPECT_EQ(sink.take().size(), 1u);
  EXPECT_TRUE(feed_at(addr(0, 0x7F000001), make_stats(1, nullptr)));
  EXPECT_EQ(sink.take().size(), 1u);
}

TEST_F(EngineTest, IdleJobsExpire) {
  JobId j = job(50, 2);
  join_all(&j, 2, 4, 0);
  now += 5'000'000;
  eng->tick(now, sink);
  EXPECT_EQ(eng->job_count(), 1u);
  now += 11'000'000;
  eng->tick(now, sink);
  EXPECT_EQ(eng->job_count(), 0u);
  EXPECT_EQ(stats.jobs_expired.get(), 1u);
  EXPECT_EQ(eng->memory_bytes(), 0);
}

TEST_F(EngineTest, AFreedJobIdJoinedAgainWithFewerSlotsIsSafe) {
  // Regression (issue 07): version 1 kept a freed job's open slots in an engine-wide list; the
  // same id joined again with fewer slots made tick() read past the new job's shadows.
  JobId j = job(60, 2);
  join_all(&j, 1, 8, 100);
  for (uint64_t seq = 0; seq < 8; ++seq) feed(0, make_values(j, 0, 8, seq, static_cast<uint32_t>(seq), WireInt::kU8, {1}));
  feed(0, make_leave(j, 0, 100));
  feed(1, make_leave(j, 1, 100));
  EXPECT_EQ(eng->job_count(), 0u);
  sink.take();
  nonce_ = 1000;  // the workers' next lives: their nonces are newer than anything they sent before
  join_all(&j, 1, 1, 100);
  now += 1000;
  eng->tick(now, sink);
  feed(0, make_values(j, 0, 1, 0, 0, WireInt::kU8, {1}));
  now += 1000;
  eng->tick(now, sink);
  EXPECT_EQ(of_type(sink.take(), MsgType::kResult).size(), 1u);
}

TEST_F(EngineTest, WorkersDisagreeingOnAnOpAreRefused) {
  JobId j = job(61, 2);
  join_all(&j, 2, 4, 0);
  feed(0, make_values(j, 0, 4, 0, 0, WireInt::kU8, {1, 1}));
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kU8, {1, 1, 1}));     // other count
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kU16, {1, 1}));       // other type
  feed(1, make_values(j, 1, 4, 0, 5, WireInt::kU8, {1, 1}));        // other op
  auto r = sink.take();
  ASSERT_EQ(r.size(), 3u);
  for (const Sent& s : r) EXPECT_EQ(s.h.aux, static_cast<uint32_t>(ErrorCode::kConfigMismatch));
  EXPECT_EQ(drops(Drop::kMismatch), 3u);
}

// The control rule across a job's end: the floors of a freed job's workers outlive it while their
// cookies verify, so a replayed JOIN neither re-creates the job nor draws an answer; a refused JOIN
// replayed when resources are free again does not create the job either (a repeat of it gets the
// refusal again). When the table of such floors is full, the cookie secret rotates instead:
// every JOIN made before (replayed or in the middle of a handshake) needs a new CHALLENGE.
TEST_F(EngineTest, ReplayedJoinsOfFreedOrRefusedJobsCreateNothing) {
  cfg.max_join_floors = 4;
  make_engine(1, int64_t{1} << 30);
  JobId a = job(70, 2);
  join_all(&a, 2, 4, 0);
  // What a sniffer recorded of worker 0: its JOIN with the cookie (the second of its handshake).
  JoinParams p = params(2, 4, 0);
  feed(0, make_join(a, 0, p, 100));
  JoinParams withc = p;
  const std::vector<Sent> ch = sink.take();
  ASSERT_EQ(ch.size(), 1u);
  withc.cookie = ch[0].payload.data();
  const std::vector<uint8_t> rec = make_join(a, 0, withc, 101);
  feed(0, rec);
  ASSERT_EQ(of_type(sink.take(), MsgType::kJoinAck).size(), 1u);
  feed(0, rec);  // a repeat while the job lives: the same JOIN_ACK again
  ASSERT_EQ(of_type(sink.take(), MsgType::kJoinAck).size(), 1u);
  feed(0, make_leave(a, 0, 102));
  feed(1, make_leave(a, 1, 102));
  EXPECT_EQ(eng->job_count(), 0u);
  sink.take();
  const uint64_t created = stats.jobs_created.get(), replays = drops(Drop::kReplay);
  feed(0, rec);
  EXPECT_TRUE(sink.take().empty()) << "a replayed JOIN of a finished job drew an answer";
  EXPECT_EQ(stats.jobs_created.get(), created);
  EXPECT_EQ(drops(Drop::kReplay), replays + 1);

  // A JOIN refused for want of resources (--max-jobs 1), replayed once the job table has room.
  JobId b = job(71, 1), c = job(72, 1);
  join_one(&b, 0, params(1, 4, 0));
  feed(5, make_join(c, 0, params(1, 4, 0), 200));
  withc = params(1, 4, 0);
  const std::vector<Sent> ch2 = sink.take();
  ASSERT_EQ(ch2.size(), 1u);
  withc.cookie = ch2[0].payload.data();
  const std::vector<uint8_t> refused = make_join(c, 0, withc, 201);
  feed(5, refused);
  std::vector<Sent> r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kNoResources));
  feed(0, make_leave(b, 0, 1000));
  sink.take();
  EXPECT_EQ(eng->job_count(), 0u);
  feed(5, refused);  // a repeat: the refusal again, and no job
  r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kNoResources));
  EXPECT_EQ(eng->job_count(), 0u);

  // Four floors are held now (job a's two workers, b's and c's worker 0): the next one rotates the
  // cookie secret. A handshake in progress sees one more CHALLENGE; the recordings stay dead.
  JobId d = job(73, 1);
  feed(6, make_join(d, 0, params(1, 4, 0), 300));
  withc = params(1, 4, 0);
  const std::vector<Sent> ch3 = sink.take();
  ASSERT_EQ(ch3.size(), 1u);
  withc.cookie = ch3[0].payload.data();
  const std::vector<uint8_t> pending = make_join(d, 0, withc, 301);
  JobId e = job(74, 1);
  nonce_ = 400;
  join_one(&e, 0, params(1, 4, 0), 7);
  feed(7, make_leave(e, 0, 500));  // its floor is the fifth: the table is full
  sink.take();
  feed(6, pending);
  r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kChallenge) << "a cookie made before the rotation still verified";
  for (const auto* x : {&rec, &refused}) {
    feed(x == &rec ? 0 : 5, *x);
    r = sink.take();
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].h.type, MsgType::kChallenge);
  }
  EXPECT_EQ(eng->job_count(), 0u);
}

// Per-tenant limits: a tenant at its share is refused while another tenant still creates jobs.
TEST(Budget, TenantsCannotTakeEachOthersShare) {
  Budget b(4, 1000, 16, Budget::share(4, 2), Budget::share(1000, 2));
  EXPECT_TRUE(b.reserve(100, "a", 2));
  EXPECT_TRUE(b.reserve(100, "b", 2));
  EXPECT_FALSE(b.reserve(100, "c", 2)) << "tenant 2 is at its share of jobs";
  EXPECT_TRUE(b.reserve(450, "a", 1));
  EXPECT_FALSE(b.reserve(100, "a", 1)) << "tenant 1 would exceed its share of memory";
  EXPECT_TRUE(b.reserve(50, "a", 1));
  b.release(100, "a", 2);
  EXPECT_TRUE(b.reserve(300, "c", 2));
  EXPECT_EQ(b.jobs_left(), 0);
}

}  // namespace

// handle_batch is handle() on each datagram in order: the same replies (results signed together at
// the batch's end, so only their place in the output differs) and the same counters. The batch
// holds complete slots, a duplicate, a tampered payload and header, a packet of an unknown job,
// the job freed by its workers' LEAVEs and created again by a JOIN with a new seed, and then data
// under the old key (dropped: a tag computed before the batch under the old key must not count)
// and under the new one.
TEST(EngineBatch, HandleBatchIsHandleOnEachDatagram) {
  const auth::Key key = test_key(1);
  auto make = [&](Stats* st) {
    EngineConfig c;
    c.seed = 5;
    c.incarnation = 6;
    c.max_slots_per_job = 64;
    c.keys = std::make_shared<auth::KeyRing>(std::vector<auth::Key>{key});
    return std::make_unique<Engine>(c, st);
  };
  Stats sa, sb;
  auto A = make(&sa), B = make(&sb);
  Capture ca, cb;
  const uint64_t now = 1'000'000;
  JobId j = JobId::make(key, 9, 2);
  TableSpec t;
  t.id = 0;
  t.bits = 4;
  t.sum = WireInt::kU8;
  for (int z = 0; z < 16; ++z) t.values[z] = z * 17 - 40;
  // The handshakes, one datagram at a time on both engines (each has its own cookie secret).
  auto join = [&](Engine& e, Capture& c, uint16_t w, uint64_t nonce, const TableSpec* tab) {
    JoinParams p = params(2, 4, 0);
    p.table = tab;
    e.handle(make_join(j, w, p, nonce).data(), make_join(j, w, p, nonce).size(), addr(w), now, c);
    const std::vector<uint8_t> cookie = c.take().at(0).payload;
    p.cookie = cookie.data();
    const std::vector<uint8_t> d = make_join(j, w, p, nonce + 1);
    e.handle(d.data(), d.size(), addr(w), now, c);
    JoinAckBody ack;
    const auto r = c.take();
    EXPECT_EQ(parse_join_ack(r.at(0).payload.data(), r.at(0).payload.size(), &ack), ParseError::kOk);
    return ack.seed;
  };
  const uint64_t seed = join(*A, ca, 0, 10, &t);
  EXPECT_EQ(join(*B, cb, 0, 10, &t), seed);
  join(*A, ca, 1, 10, nullptr);
  join(*B, cb, 1, 10, nullptr);
  j.with_seed(seed);
  // The rejoin's cookie, fetched before the batch (a cookie-less JOIN draws a CHALLENGE).
  JoinParams rp = params(2, 4, 0);
  rp.table = &t;
  const std::vector<uint8_t> ask = make_join(j, 0, rp, 50);
  A->handle(ask.data(), ask.size(), addr(0), now, ca);
  B->handle(ask.data(), ask.size(), addr(0), now, cb);
  const std::vector<uint8_t> cookie_a = ca.take().at(0).payload, cookie_b = cb.take().at(0).payload;

  std::mt19937 rng(4);
  auto codes = [&] {
    std::vector<uint8_t> c(256);
    for (auto& x : c) x = static_cast<uint8_t>(rng() & 15);
    return c;
  };
  std::vector<std::vector<uint8_t>> batch;
  for (uint64_t seq = 0; seq < 6; ++seq)
    for (uint16_t w = 0; w < 2; ++w) batch.push_back(make_indices(j, w, 4, seq, 0, WireInt::kU8, 4, 0, codes()));
  batch.push_back(batch[3]);  // a duplicate (answered with the stored result)
  std::vector<uint8_t> bad = make_indices(j, 0, 4, 6, 0, WireInt::kU8, 4, 0, codes());
  bad[kHeaderBytes + 5] ^= 1;
  batch.push_back(bad);
  bad = make_indices(j, 1, 4, 6, 0, WireInt::kU8, 4, 0, codes());
  bad[40] ^= 1;
  batch.push_back(bad);
  JobId other = JobId::make(key, 10, 2);
  other.with_seed(seed);
  batch.push_back(make_indices(other, 0, 4, 0, 0, WireInt::kU8, 4, 0, codes()));
  batch.push_back(make_leave(j, 0, 60));
  batch.push_back(make_leave(j, 1, 60));
  const size_t rejoin_at = batch.size();
  batch.emplace_back();  // the JOIN with each engine's own cookie
  // Run A one datagram at a time up to the rejoin to learn the new seed, then build the rest.
  std::vector<std::vector<uint8_t>> tail;
  for (size_t i = 0; i < rejoin_at; ++i) A->handle(batch[i].data(), batch[i].size(), addr(i < 13 ? i % 2 : 0), now, ca);
  rp.cookie = cookie_a.data();
  const std::vector<uint8_t> rejoin_a = make_join(j, 0, rp, 61);
  A->handle(rejoin_a.data(), rejoin_a.size(), addr(0), now, ca);
  JoinAckBody ack;
  const auto acks = Capture::of(ca.out, MsgType::kJoinAck);
  ASSERT_EQ(acks.size(), 1u);
  ASSERT_EQ(parse_join_ack(acks[0].payload.data(), acks[0].payload.size(), &ack), ParseError::kOk);
  ASSERT_NE(ack.seed, seed);
  JobId renewed = j;
  renewed.with_seed(ack.seed);
  tail.push_back(make_indices(j, 0, 4, 0, 0, WireInt::kU8, 4, 0, codes()));  // the old key: dropped
  tail.push_back(make_indices(renewed, 0, 4, 0, 0, WireInt::kU8, 4, 0, codes()));
  tail.push_back(make_indices(renewed, 0, 4, 0, 0, WireInt::kU8, 4, 0, codes()));  // not the same packet twice: a mismatch or duplicate
  for (const auto& d : tail) A->handle(d.data(), d.size(), addr(0), now, ca);

  // B: the same datagrams as one batch (its own cookie in the JOIN).
  rp.cookie = cookie_b.data();
  batch[rejoin_at] = make_join(j, 0, rp, 61);
  for (const auto& d : tail) batch.push_back(d);
  std::vector<PeerAddr> from;
  for (size_t i = 0; i < batch.size(); ++i) from.push_back(addr(i < 13 ? static_cast<int>(i % 2) : 0));
  std::vector<Datagram> in;
  for (size_t i = 0; i < batch.size(); ++i) in.push_back(Datagram{batch[i].data(), batch[i].size(), &from[i]});
  std::vector<Handled> res(in.size());
  B->handle_batch(in.data(), in.size(), now, cb, res.data());

  EXPECT_EQ(stats_values(sa), stats_values(sb));
  EXPECT_EQ(sa.drops[static_cast<int>(Drop::kBadTag)].get(), 3u) << "two tampered, one under the old key";
  EXPECT_EQ(res[res.size() - 3], Handled::kDropped);
  EXPECT_EQ(res[res.size() - 2], Handled::kAuthentic);
  auto bytes = [](const std::vector<Sent>& v) {
    std::vector<std::vector<uint8_t>> b;
    for (const Sent& s : v) b.push_back(s.bytes);
    std::sort(b.begin(), b.end());
    return b;
  };
  ASSERT_GT(ca.out.size(), 12u);
  EXPECT_EQ(bytes(ca.out), bytes(cb.out));
  // Everything but the results in the same order (the results come at the batch's end).
  std::vector<Sent> na, nb;
  for (const Sent& s : ca.out)
    if (s.h.type != MsgType::kResult) na.push_back(s);
  for (const Sent& s : cb.out)
    if (s.h.type != MsgType::kResult) nb.push_back(s);
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i) EXPECT_EQ(na[i].bytes, nb[i].bytes) << i;

  // Sink::next_payload: in a batch the results leave as send_parts, and every result's recipients
  // get one payload, announced before its first send_parts (the DPDK server sums a payload's
  // checksum once per announcement; the batch's results share the engine's payload buffer).
  ASSERT_TRUE(ca.parts.empty()) << "one datagram at a time: whole datagrams";
  ASSERT_GE(cb.parts.size(), 12u);  // six slots, two recipients each
  EXPECT_GT(cb.parts.front().payload, 0u) << "announced before the first result";
  std::set<uint64_t> seen;
  for (size_t i = 0; i < cb.parts.size(); ++i) {
    const auto& p = cb.parts[i];
    if (i > 0 && cb.parts[i - 1].payload == p.payload) {
      EXPECT_EQ(p.tail, cb.parts[i - 1].tail) << "one announcement, one payload";
      EXPECT_EQ(p.at, cb.parts[i - 1].at);
    } else {
      EXPECT_TRUE(seen.insert(p.payload).second) << "a payload's sends are contiguous";
    }
  }
  EXPECT_EQ(seen.size(), cb.payloads) << "an announcement per result";
}
