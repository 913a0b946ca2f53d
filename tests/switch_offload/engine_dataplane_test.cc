// The Engine's control-only mode for a switch data plane (EngineConfig::data_plane, what
// thc-switchd runs): the same authenticated JOIN / CHALLENGE / TABLE / LEAVE rules as the software
// aggregator, with hooks that install the job in the data plane; no slot state, data packets
// refused, one shard and the Tofino profile, quorum jobs refused with ERROR not-supported, the
// JOIN_ACK flag kAckDataPlane, and the idle timeout driven by the data plane's traffic (touch).
#include <gtest/gtest.h>

#include <netinet/in.h>

#include <memory>
#include <string>
#include <vector>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/protocol/builder.h"

namespace {

using namespace thc::switch_offload;
using thc::PeerAddr;
using namespace thc::switch_offload::proto;

PeerAddr addr(int i) {
  PeerAddr a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(static_cast<uint16_t>(50000 + i));
  in->sin_addr.s_addr = htonl(0x0A000001);
  a.len = sizeof(sockaddr_in);
  return a;
}

auth::Key test_key(uint32_t id) {
  auth::Key k;
  k.id = id;
  for (size_t i = 0; i < auth::kKeyBytes; ++i) k.bytes[i] = static_cast<uint8_t>(0x21 + i * 3 + id);
  return k;
}

struct Sent {
  PeerAddr to;
  Header h;
  std::vector<uint8_t> payload, bytes;
};

class Capture final : public Sink {
 public:
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override {
    Sent s;
    s.to = to;
    s.bytes.assign(data, data + len);
    const uint8_t* pl;
    size_t plen;
    ASSERT_EQ(parse(data, len, &s.h, &pl, &plen), ParseError::kOk);
    s.payload.assign(pl, pl + plen);
    out.push_back(s);
  }
  std::vector<Sent> take() {
    std::vector<Sent> r;
    r.swap(out);
    return r;
  }
  std::vector<Sent> out;
};

// Records every hook call as a line; answers with the codes a test sets.
class Hooks final : public DataPlaneHooks {
 public:
  explicit Hooks(const Capture* sink) : sink_(sink) {}
  ErrorCode job_created(const DataPlaneJob& j) override {
    log.push_back("created n=" + std::to_string(j.n) + " S=" + std::to_string(j.slots) + " lanes=" +
                  std::to_string(j.lanes) + " budget=" + std::to_string(j.payload_budget) + " shard=" +
                  std::to_string(j.shard));
    return on_create;
  }
  ErrorCode worker_joined(const DataPlaneJob& j, uint16_t w, const PeerAddr& at) override {
    log.push_back("worker " + std::to_string(w) + " at " + at.str());
    // Called before the JOIN_ACK goes out: nothing sent yet answers this JOIN.
    for (const Sent& s : sink_->out)
      if (s.h.type == MsgType::kJoinAck && s.h.worker == w) acked_before_admit = true;
    (void)j;
    return on_worker;
  }
  ErrorCode table_installed(const DataPlaneJob&, const TableSpec& t) override {
    log.push_back("table " + std::to_string(t.id) + " b=" + std::to_string(t.bits) + " v1=" +
                  std::to_string(t.values[1]));
    return on_table;
  }
  void job_freed(const DataPlaneJob& j) override { log.push_back("freed n=" + std::to_string(j.n)); }

  std::vector<std::string> take() {
    std::vector<std::string> r;
    r.swap(log);
    return r;
  }
  std::vector<std::string> log;
  ErrorCode on_create = ErrorCode::kNone, on_worker = ErrorCode::kNone, on_table = ErrorCode::kNone;
  bool acked_before_admit = false;

 private:
  const Capture* sink_;
};

class DataPlaneEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg.seed = 7;
    cfg.max_slots_per_job = 4096;
    cfg.max_lanes = 8192;  // the data-plane mode overrides these with the Tofino profile
    cfg.payload_budget = kMaxPayloadBudget;
    cfg.shards = 4;
    cfg.job_idle_timeout_us = 10'000'000;
    cfg.keys = std::make_shared<auth::KeyRing>(std::vector<auth::Key>{test_key(0), test_key(1)});
    cfg.data_plane = &hooks;
    eng = std::make_unique<Engine>(cfg, &stats);
  }
  JoinParams params(uint16_t k, uint16_t S = 512) {
    JoinParams p;
    p.quorum = k;
    p.slots = S;
    p.max_lanes = 8192;  // what a client on a 1500-byte path offers
    p.payload_budget = kPayloadBudget1500;
    return p;
  }
  // JOIN, CHALLENGE, JOIN with the cookie: what the second JOIN drew.
  std::vector<Sent> handshake(JobId* j, uint16_t w, JoinParams p) {
    const PeerAddr a = addr(w);
    auto first = make_join(*j, w, p, ++nonce);
    eng->handle(first.data(), first.size(), a, now, sink);
    auto r = sink.take();
    EXPECT_EQ(r.size(), 1u);
    if (r.empty() || r[0].h.type != MsgType::kChallenge) return r;
    p.cookie = r[0].payload.data();
    auto second = make_join(*j, w, p, ++nonce);
    eng->handle(second.data(), second.size(), a, now, sink);
    return sink.take();
  }
  JoinAckBody join_ok(JobId* j, uint16_t w, const JoinParams& p) {
    auto r = handshake(j, w, p);
    JoinAckBody a;
    EXPECT_EQ(r.size(), 1u);
    if (r.size() != 1) return a;
    EXPECT_EQ(r[0].h.type, MsgType::kJoinAck);
    EXPECT_EQ(parse_join_ack(r[0].payload.data(), r[0].payload.size(), &a), ParseError::kOk);
    j->with_seed(a.seed);
    return a;
  }
  uint64_t drops(Drop d) const { return stats.drops[static_cast<int>(d)].get(); }

  Capture sink;
  Hooks hooks{&sink};
  EngineConfig cfg;
  Stats stats;
  std::unique_ptr<Engine> eng;
  uint64_t now = 1'000'000;
  uint64_t nonce = 0;
};

TEST_F(DataPlaneEngine, JoinInstallsTheJobBeforeTheAck) {
  JobId j = JobId::make(test_key(1), 5, 2);
  TableSpec t;
  t.id = 1;
  t.bits = 4;
  t.sum = WireInt::kU8;
  t.values[1] = 9;
  JoinParams p = params(2);
  p.table = &t;
  const JoinAckBody a0 = join_ok(&j, 0, p);
  // One shard and the Tofino profile whatever the worker and the config offered, the flag set.
  EXPECT_EQ(a0.shards, 1);
  EXPECT_EQ(a0.max_lanes, kTofinoLanes);
  EXPECT_EQ(a0.payload_budget, kTofinoPayloadBudget);
  EXPECT_EQ(a0.slots, 512);
  EXPECT_EQ(a0.resume_flags, kResumeKnown | kAckDataPlane);
  EXPECT_EQ(hooks.take(), (std::vector<std::string>{"created n=2 S=512 lanes=256 budget=1024 shard=0",
                                                   "worker 0 at " + addr(0).str(), "table 1 b=4 v1=9"}));
  const JoinAckBody a1 = join_ok(&j, 1, params(2));
  EXPECT_EQ(a1.seed, a0.seed);
  EXPECT_EQ(hooks.take(), std::vector<std::string>{"worker 1 at " + addr(1).str()});
  EXPECT_FALSE(hooks.acked_before_admit);
  // No slot registers: the job's footprint is its control state only.
  EXPECT_LT(eng->memory_bytes(), 64 * 1024);

  // A TABLE is handed to the data plane once; its retransmission is acknowledged again only.
  t.id = 2;
  t.values[1] = -3;
  const auto tbl = make_table(j, 1, t, ++nonce);
  for (int i = 0; i < 2; ++i) {
    eng->handle(tbl.data(), tbl.size(), addr(1), now, sink);
    auto r = sink.take();
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].h.type, MsgType::kTableAck);
  }
  EXPECT_EQ(hooks.take(), std::vector<std::string>{"table 2 b=4 v1=-3"});

  // Data packets are the data plane's: refused here, never answered.
  const auto d = make_values(j, 0, 512, 0, 0, WireInt::kU8, {1, 2, 3});
  EXPECT_EQ(eng->handle(d.data(), d.size(), addr(0), now, sink), Handled::kDropped);
  EXPECT_TRUE(sink.take().empty());
  EXPECT_EQ(drops(Drop::kDataPlane), 1u);

  // Every worker leaves: the job goes, from the data plane too.
  for (uint16_t w = 0; w < 2; ++w) {
    const auto l = make_leave(j, w, ++nonce);
    eng->handle(l.data(), l.size(), addr(w), now, sink);
  }
  EXPECT_EQ(hooks.take(), std::vector<std::string>{"freed n=2"});
  EXPECT_EQ(eng->job_count(), 0u);
}

TEST_F(DataPlaneEngine, RejoinFromANewAddressIsAdmittedAgain) {
  JobId j = JobId::make(test_key(1), 6, 2);
  join_ok(&j, 0, params(2));
  hooks.take();
  // The same worker's JOIN again (its JOIN_ACK was lost, or it restarted on another port): the
  // data plane is told, so it can move the worker's admission.
  JoinParams p = params(2);
  const PeerAddr moved = addr(40);
  auto first = make_join(j, 0, p, ++nonce);
  eng->handle(first.data(), first.size(), moved, now, sink);
  auto r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].h.type, MsgType::kChallenge);
  p.cookie = r[0].payload.data();
  auto second = make_join(j, 0, p, ++nonce);
  eng->handle(second.data(), second.size(), moved, now, sink);
  r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kJoinAck);
  EXPECT_EQ(r[0].to.str(), moved.str());
  EXPECT_EQ(hooks.take(), std::vector<std::string>{"worker 0 at " + moved.str()});
}

TEST_F(DataPlaneEngine, QuorumJobsAreRefusedWithNotSupported) {
  JobId j = JobId::make(test_key(1), 7, 4);
  auto r = handshake(&j, 0, params(3));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kError);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kNotSupported));
  EXPECT_TRUE(auth::verify(j.jkey, r[0].bytes.data(), r[0].bytes.size()));
  EXPECT_EQ(eng->job_count(), 0u);
  EXPECT_TRUE(hooks.take().empty()) << "nothing reaches the data plane";
  EXPECT_EQ(drops(Drop::kNotSupported), 1u);

  // So is a worker whose path cannot carry the Tofino profile (fewer than 256 lanes).
  JoinParams small = params(4);
  small.max_lanes = 128;
  r = handshake(&j, 0, small);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kNotSupported));
  EXPECT_EQ(eng->job_count(), 0u);
}

TEST_F(DataPlaneEngine, DataPlaneRefusalsBecomeErrors) {
  // No room in the data plane (its job indices or slot registers): no resources, no job.
  hooks.on_create = ErrorCode::kNoResources;
  JobId j = JobId::make(test_key(1), 8, 2);
  auto r = handshake(&j, 0, params(2));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kNoResources));
  EXPECT_EQ(eng->job_count(), 0u);
  EXPECT_EQ(hooks.take().size(), 1u);

  // A worker the switch cannot reach (no route): the JOIN is refused, and the job its JOIN
  // created goes again (from the data plane too).
  hooks.on_create = ErrorCode::kNone;
  hooks.on_worker = ErrorCode::kNotSupported;
  r = handshake(&j, 0, params(2));
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kNotSupported));
  EXPECT_EQ(eng->job_count(), 0u);
  auto log = hooks.take();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[2], "freed n=2");

  // A table the data plane does not take: the TABLE gets the error, the job stays.
  hooks.on_worker = ErrorCode::kNone;
  join_ok(&j, 0, params(2));
  hooks.take();
  hooks.on_table = ErrorCode::kNotSupported;
  TableSpec t;
  t.id = 0;
  t.bits = 5;
  t.sum = WireInt::kU16;
  const auto tbl = make_table(j, 0, t, ++nonce);
  eng->handle(tbl.data(), tbl.size(), addr(0), now, sink);
  r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kError);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kNotSupported));
  EXPECT_TRUE(auth::verify(j.dkey, r[0].bytes.data(), r[0].bytes.size()));
  EXPECT_EQ(eng->job_count(), 1u);
}

TEST_F(DataPlaneEngine, TrafficInTheDataPlaneKeepsAJobAlive) {
  JobId a = JobId::make(test_key(1), 9, 1), b = JobId::make(test_key(1), 10, 1);
  join_ok(&a, 0, params(1));
  join_ok(&b, 0, params(1));
  hooks.take();
  // Job a's data plane counter moves every 4 s; job b is silent.
  for (int s = 0; s < 16; ++s) {
    now += 1'000'000;
    if (s % 4 == 0) {
      EXPECT_TRUE(eng->touch(a.job, 0, now));
    }
    eng->tick(now, sink);
  }
  EXPECT_EQ(eng->job_count(), 1u);
  EXPECT_EQ(stats.jobs_expired.get(), 1u);
  EXPECT_EQ(hooks.take(), std::vector<std::string>{"freed n=1"});
  EXPECT_FALSE(eng->touch(b.job, 0, now));
  EXPECT_TRUE(eng->touch(a.job, 0, now));
}

}  // namespace
