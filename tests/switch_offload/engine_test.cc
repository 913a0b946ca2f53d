// The aggregator state machine without sockets, on a fake clock: slot lifecycle, idempotence,
// shadow-set reuse, partial aggregation, retraction, job isolation and resource limits.
#include <gtest/gtest.h>

#include <netinet/in.h>

#include <memory>
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
  in->sin_addr.s_addr = htonl(0x7F000001);
  a.len = sizeof(sockaddr_in);
  return a;
}

struct Sent {
  PeerAddr to;
  Header h;
  std::vector<uint8_t> payload;
};

class Capture final : public Sink {
 public:
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override {
    Sent s;
    s.to = to;
    const uint8_t* pl;
    size_t plen;
    ASSERT_EQ(parse(data, len, &s.h, &pl, &plen), ParseError::kOk) << "engine emitted a malformed packet";
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

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override { make_engine(64, int64_t{1} << 30); }
  void make_engine(int jobs, int64_t bytes) {
    cfg.seed = 99;
    cfg.max_slots_per_job = 64;
    cfg.budget = std::make_shared<Budget>(jobs, bytes);
    cfg.job_idle_timeout_us = 10'000'000;
    eng = std::make_unique<Engine>(cfg, &stats);
  }
  void feed(int from, const std::vector<uint8_t>& p) { eng->handle(p.data(), p.size(), addr(from), now, sink); }
  // Join n workers of job j (quorum k, S slots, quorum timeout qt) and return the seeds they got.
  std::vector<uint64_t> join_all(const JobId& j, uint16_t k, uint16_t S, uint32_t qt, const TableSpec* t = nullptr) {
    std::vector<uint64_t> seeds;
    for (uint16_t w = 0; w < j.nworkers; ++w) {
      feed(w, make_join(j, w, k, S, qt, w == 0 ? t : nullptr));
      auto r = sink.take();
      EXPECT_EQ(r.size(), 1u);
      if (r.empty()) continue;
      EXPECT_EQ(r[0].h.type, MsgType::kJoinAck);
      JoinAckBody a;
      EXPECT_EQ(parse_join_ack(r[0].payload.data(), r[0].payload.size(), &a), ParseError::kOk);
      seeds.push_back(a.seed);
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
};

TEST_F(EngineTest, JoinGivesEveryWorkerTheSameSeed) {
  const JobId j{5, 42, 3};
  auto seeds = join_all(j, 3, 8, 0);
  ASSERT_EQ(seeds.size(), 3u);
  EXPECT_EQ(seeds[0], seeds[1]);
  EXPECT_EQ(seeds[1], seeds[2]);
  EXPECT_NE(seeds[0], 0u);
  // Re-joining is idempotent and keeps the seed.
  EXPECT_EQ(join_all(j, 3, 8, 0)[0], seeds[0]);
  // A different job gets a different seed.
  EXPECT_NE(join_all(JobId{6, 42, 3}, 3, 8, 0)[0], seeds[0]);
  EXPECT_EQ(stats.jobs_created.get(), 2u);
}

TEST_F(EngineTest, JoinRejectsMismatchAndWrongToken) {
  const JobId j{5, 42, 3};
  join_all(j, 3, 8, 0);
  feed(0, make_join(j, 0, 2, 8, 0));  // other quorum
  auto r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.type, MsgType::kError);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kConfigMismatch));
  JobId bad = j;
  bad.token = 43;
  feed(1, make_join(bad, 1, 3, 8, 0));
  r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kBadToken));
  EXPECT_EQ(drops(Drop::kConfigMismatch), 1u);
  EXPECT_EQ(drops(Drop::kBadToken), 1u);
}

TEST_F(EngineTest, ValueSumCompletesAndResultGoesToEveryWorker) {
  const JobId j{1, 7, 2};
  join_all(j, 2, 4, 0);
  feed(0, make_values(j, 0, 4, 0, 0, WireInt::kI16, {1, 0xFFFF, 100}));
  EXPECT_TRUE(sink.take().empty()) << "no result before every worker arrived";
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kI16, {2, 0xFFFE, 0x7FFF}));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 2u);
  for (const Sent& s : r) {
    EXPECT_EQ(s.h.type, MsgType::kResult);
    EXPECT_EQ(s.h.contributors, 2);
    EXPECT_EQ(s.h.bitmap, 0b11u);
    EXPECT_EQ(s.h.flags, 0);
    EXPECT_EQ(s.h.count, 3);
    EXPECT_EQ(load_lane(WireInt::kI16, s.payload.data(), 0), 3u);
    EXPECT_EQ(load_lane(WireInt::kI16, s.payload.data(), 1), 0xFFFDu);  // -1 + -2
    EXPECT_EQ(load_lane(WireInt::kI16, s.payload.data(), 2), 0x8063u);  // wraps like int16
    EXPECT_EQ(load_lane(WireInt::kI16, s.payload.data(), 3), 0u);
  }
  EXPECT_TRUE((r[0].h.worker == 0 && r[0].to == addr(0)) || (r[0].h.worker == 1 && r[0].to == addr(1)));
  EXPECT_EQ(stats.elements.get(), 6u);
  EXPECT_EQ(stats.slots_completed.get(), 1u);
}

TEST_F(EngineTest, IndexFormLooksUpTheInstalledTable) {
  const JobId j{2, 9, 3};
  TableSpec t;
  t.id = 1;
  t.bits = 3;
  t.sum = WireInt::kI16;
  const int32_t vals[8] = {-100, -7, -1, 0, 1, 2, 50, 1000};
  std::copy(vals, vals + 8, t.values);
  join_all(j, 3, 4, 0);
  feed(1, make_table(j, 1, t));
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
}

TEST_F(EngineTest, MaxCombinesByMaximum) {
  const JobId j{3, 1, 2};
  join_all(j, 2, 4, 0);
  feed(0, make_values(j, 0, 4, 0, 0, WireInt::kU32, {5, 0xFFFFFFFF, 0}, MsgType::kDataMax));
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kU32, {7, 3, 0}, MsgType::kDataMax));
  auto r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(load_lane(WireInt::kU32, r[0].payload.data(), 0), 7u);
  EXPECT_EQ(load_lane(WireInt::kU32, r[0].payload.data(), 1), 0xFFFFFFFFu);
}

TEST_F(EngineTest, DuplicatesAreIdempotentAndLostResultsAreResent) {
  const JobId j{4, 1, 2};
  join_all(j, 2, 4, 0);
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
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kU8, {1, 2}));
  r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.worker, 1);
  EXPECT_EQ(load_lane(WireInt::kU8, r[0].payload.data(), 1), 22u);
  EXPECT_EQ(stats.result_resends.get(), 1u);
}

TEST_F(EngineTest, ShadowSetIsReusedOnlyAfterEveryWorkerMovedOn) {
  const JobId j{8, 1, 2};
  join_all(j, 2, 1, 0);  // one slot: seq 0 -> shadow 0, seq 1 -> shadow 1, seq 2 -> shadow 0 again
  for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 1, 0, 0, WireInt::kU8, {1}));
  ASSERT_EQ(of_type(sink.take(), MsgType::kResult).size(), 2u);
  feed(0, make_values(j, 0, 1, 1, 1, WireInt::kU8, {2}));  // worker 0 moves to seq 1
  // Worker 0 runs ahead to seq 2, but worker 1 has not sent seq 1: it may still need seq 0's
  // result, which shadow 0 keeps. Refused.
  feed(0, make_values(j, 0, 1, 2, 2, WireInt::kU8, {3}));
  EXPECT_EQ(drops(Drop::kSlotBusy), 1u);
  // Worker 1 lost the result of seq 0: still available.
  feed(1, make_values(j, 1, 1, 0, 0, WireInt::kU8, {1}));
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
  auto bad = make_values(j, 0, 1, 3, 3, WireInt::kU8, {1});
  bad[16] = 0;  // shadow bit cleared, but seq 3 belongs to shadow 1
  feed(0, bad);
  feed(0, make_values(j, 0, 1, 7, 7, WireInt::kU8, {1}));
  EXPECT_EQ(drops(Drop::kBadSlot), 2u);
}

TEST_F(EngineTest, QuorumTimeoutGivesPartialResultAndTellsTheLateWorker) {
  const JobId j{9, 3, 3};
  join_all(j, 2, 8, 1000);
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
  // The next op waits for everybody again (the decision is per op).
  for (uint16_t w = 0; w < 2; ++w) feed(w, make_values(j, w, 8, 2, 1, WireInt::kU16, {1}));
  feed(2, make_values(j, 2, 8, 1, 0, WireInt::kU16, {100, 1}));
  sink.take();
  feed(2, make_values(j, 2, 8, 2, 1, WireInt::kU16, {1}));
  r = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].h.contributors, 3);
}

TEST_F(EngineTest, LateContributionAddedBeforeTheDecisionIsRetracted) {
  const JobId j{10, 3, 3};
  join_all(j, 2, 8, 1000);
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
  feed(2, w2_seq1);
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
  const JobId a{20, 111, 2}, b{21, 222, 2};
  join_all(a, 2, 4, 0);
  join_all(b, 2, 4, 0);
  feed(0, make_values(a, 0, 4, 0, 0, WireInt::kU8, {1, 1}));
  // Noise from everywhere.
  JobId wrong = a;
  wrong.token = 112;
  feed(3, make_values(wrong, 1, 4, 0, 0, WireInt::kU8, {50, 50}));
  auto v = make_values(a, 1, 4, 0, 0, WireInt::kU8, {60, 60});
  auto ver = v;
  ver[4] = 9;
  feed(3, ver);
  feed(3, std::vector<uint8_t>(v.begin(), v.begin() + 40));
  feed(3, std::vector<uint8_t>(v.begin(), v.end() - 3));
  feed(3, std::vector<uint8_t>(300, 0x5A));
  feed(3, {});
  JobId ghost{99, 1, 2};
  feed(3, make_values(ghost, 0, 4, 0, 0, WireInt::kU8, {1}));
  JobId wrong_n = a;
  wrong_n.nworkers = 3;
  feed(3, make_values(wrong_n, 2, 4, 0, 0, WireInt::kU8, {1}));
  // Job b uses the same slot numbers at the same time.
  feed(0, make_values(b, 0, 4, 0, 0, WireInt::kU8, {5, 5}));
  feed(1, make_values(b, 1, 4, 0, 0, WireInt::kU8, {6, 6}));
  auto rb = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(rb.size(), 2u);
  EXPECT_EQ(rb[0].h.job, 21u);
  EXPECT_EQ(load_lane(WireInt::kU8, rb[0].payload.data(), 0), 11u);
  feed(1, make_values(a, 1, 4, 0, 0, WireInt::kU8, {2, 2}));
  auto ra = of_type(sink.take(), MsgType::kResult);
  ASSERT_EQ(ra.size(), 2u);
  EXPECT_EQ(load_lane(WireInt::kU8, ra[0].payload.data(), 0), 3u);
  EXPECT_EQ(drops(Drop::kBadToken), 1u);
  EXPECT_EQ(drops(Drop::kBadVersion), 1u);
  EXPECT_EQ(drops(Drop::kTruncated), 2u);  // 40 bytes and the empty datagram
  EXPECT_EQ(drops(Drop::kBadMagic), 1u);   // 300 bytes of garbage
  EXPECT_EQ(drops(Drop::kBadLength), 1u);
  EXPECT_EQ(drops(Drop::kUnknownJob), 1u);
  EXPECT_EQ(drops(Drop::kBadWorker), 1u);
}

TEST_F(EngineTest, ResourceLimitsAndLeave) {
  make_engine(1, int64_t{1} << 30);
  const JobId a{30, 1, 2}, b{31, 1, 1};
  join_all(a, 2, 4, 0);
  feed(0, make_join(b, 0, 1, 4, 0));
  auto r = sink.take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].h.aux, static_cast<uint32_t>(ErrorCode::kNoResources));
  feed(0, make_leave(a, 0));
  EXPECT_EQ(eng->job_count(), 1u);
  feed(1, make_leave(a, 1));
  EXPECT_EQ(eng->job_count(), 0u);
  EXPECT_EQ(of_type(sink.take(), MsgType::kLeaveAck).size(), 2u);
  feed(1, make_leave(a, 1));  // retransmitted LEAVE for a freed job is still acknowledged
  EXPECT_EQ(of_type(sink.take(), MsgType::kLeaveAck).size(), 1u);
  join_all(b, 1, 4, 0);
  EXPECT_EQ(eng->job_count(), 1u);
  // Memory: a job whose slots do not fit is refused.
  make_engine(8, 64 * 1024);
  feed(0, make_join(JobId{40, 1, 1}, 0, 1, 64, 0));
  EXPECT_EQ(sink.take().at(0).h.aux, static_cast<uint32_t>(ErrorCode::kNoResources));
  EXPECT_EQ(eng->job_count(), 0u);
}

TEST_F(EngineTest, IdleJobsExpire) {
  join_all(JobId{50, 1, 2}, 2, 4, 0);
  now += 5'000'000;
  eng->tick(now, sink);
  EXPECT_EQ(eng->job_count(), 1u);
  now += 11'000'000;
  eng->tick(now, sink);
  EXPECT_EQ(eng->job_count(), 0u);
  EXPECT_EQ(stats.jobs_expired.get(), 1u);
  EXPECT_EQ(eng->memory_bytes(), 0);
}

TEST_F(EngineTest, WorkersDisagreeingOnAnOpAreRefused) {
  const JobId j{60, 1, 2};
  join_all(j, 2, 4, 0);
  feed(0, make_values(j, 0, 4, 0, 0, WireInt::kU8, {1, 1}));
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kU8, {1, 1, 1}));     // other count
  feed(1, make_values(j, 1, 4, 0, 0, WireInt::kU16, {1, 1}));       // other type
  feed(1, make_values(j, 1, 4, 0, 5, WireInt::kU8, {1, 1}));        // other op
  auto r = sink.take();
  ASSERT_EQ(r.size(), 3u);
  for (const Sent& s : r) EXPECT_EQ(s.h.aux, static_cast<uint32_t>(ErrorCode::kConfigMismatch));
  EXPECT_EQ(drops(Drop::kMismatch), 3u);
}

}  // namespace
