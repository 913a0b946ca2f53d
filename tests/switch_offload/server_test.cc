// thc-aggregator as a process: clean shutdown on signals, counters over the protocol, drops by
// reason for malformed traffic, several threads sharding jobs, and bad command lines.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <string>
#include <vector>

#include "switch_offload/protocol/builder.h"
#include "tests/switch_offload/aggregator_process.h"

namespace {

using namespace thc::switch_offload::proto;
using thc::test::AggregatorProcess;
using thc::test::RawUdp;

std::vector<Header> drain(RawUdp& s, int ms = 200) {
  std::vector<Header> out;
  for (;;) {
    auto r = s.recv(ms);
    if (r.empty()) return out;
    Header h;
    if (parse(r.data(), r.size(), &h, nullptr, nullptr) == ParseError::kOk) out.push_back(h);
  }
}

TEST(AggregatorServer, StopsCleanlyOnSigtermAndSigint) {
  for (int sig : {SIGTERM, SIGINT}) {
    AggregatorProcess agg;
    EXPECT_GE(agg.stat("rx_packets"), 1u);  // the STATS request itself
    const int st = agg.stop(sig);
    ASSERT_TRUE(WIFEXITED(st)) << "status " << st;
    EXPECT_EQ(WEXITSTATUS(st), 0);
    const std::string out = agg.output();
    EXPECT_NE(out.find("listening on udp://127.0.0.1:"), std::string::npos) << out;
    EXPECT_NE(out.find("final stats"), std::string::npos) << out;
    EXPECT_NE(out.find(sig == SIGTERM ? "SIGTERM" : "SIGINT"), std::string::npos) << out;
  }
}

TEST(AggregatorServer, CountsMalformedTrafficByReason) {
  AggregatorProcess agg;
  RawUdp s;
  const JobId j{77, 5, 2};
  auto v = make_values(j, 0, 4, 0, 0, WireInt::kU8, {1});
  s.send(agg.port(), std::vector<uint8_t>(v.begin(), v.begin() + 20));  // truncated
  auto x = v;
  x[0] = 0;
  s.send(agg.port(), x);  // bad magic
  x = v;
  x[4] = 7;
  s.send(agg.port(), x);  // bad version: answered with an error
  x = v;
  x.push_back(1);
  s.send(agg.port(), x);  // bad length
  s.send(agg.port(), std::vector<uint8_t>(3000, 0xAB));  // oversized garbage
  s.send(agg.port(), v);  // unknown job: answered with an error
  const auto replies = drain(s);
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0].aux, static_cast<uint32_t>(ErrorCode::kBadVersion));
  EXPECT_EQ(replies[1].aux, static_cast<uint32_t>(ErrorCode::kUnknownJob));
  const auto st = agg.stats();
  using thc::switch_offload::stats_get;
  EXPECT_EQ(stats_get(st, "drop_truncated"), 1u);
  EXPECT_EQ(stats_get(st, "drop_bad_magic"), 2u);
  EXPECT_EQ(stats_get(st, "drop_bad_version"), 1u);
  EXPECT_EQ(stats_get(st, "drop_bad_length"), 1u);
  EXPECT_EQ(stats_get(st, "drop_unknown_job"), 1u);
  EXPECT_EQ(stats_get(st, "drops_total"), 6u);
  EXPECT_EQ(agg.stop(), 0);
}

TEST(AggregatorServer, ThreadsShardJobsAndEachJobAggregates) {
  AggregatorProcess agg({}, 2);
  // Jobs 10 and 11 land on different threads (job % 2); both run to completion concurrently.
  RawUdp w[4];
  for (uint32_t job : {10u, 11u}) {
    const JobId j{job, job * 3, 2};
    for (uint16_t r = 0; r < 2; ++r) w[(job - 10) * 2 + r].send(agg.port(), make_join(j, r, 2, 4, 0));
  }
  uint64_t seeds[2] = {0, 0};
  for (int i = 0; i < 4; ++i) {
    auto r = w[i].recv(2000);
    Header h;
    const uint8_t* pl;
    size_t plen;
    ASSERT_EQ(parse(r.data(), r.size(), &h, &pl, &plen), ParseError::kOk);
    ASSERT_EQ(h.type, MsgType::kJoinAck);
    JoinAckBody a;
    ASSERT_EQ(parse_join_ack(pl, plen, &a), ParseError::kOk);
    if (i % 2 == 0) seeds[i / 2] = a.seed;
    else EXPECT_EQ(a.seed, seeds[i / 2]) << "workers of one job must share its seed";
  }
  for (uint32_t job : {10u, 11u}) {
    const JobId j{job, job * 3, 2};
    for (uint16_t r = 0; r < 2; ++r)
      w[(job - 10) * 2 + r].send(agg.port(), make_values(j, r, 4, 0, 0, WireInt::kU16, {job, r + 1u}));
  }
  for (int i = 0; i < 4; ++i) {
    auto r = w[i].recv(2000);
    Header h;
    const uint8_t* pl;
    size_t plen;
    ASSERT_EQ(parse(r.data(), r.size(), &h, &pl, &plen), ParseError::kOk);
    ASSERT_EQ(h.type, MsgType::kResult);
    EXPECT_EQ(load_lane(WireInt::kU16, pl, 0), 2u * h.job);
    EXPECT_EQ(load_lane(WireInt::kU16, pl, 1), 3u);
  }
  EXPECT_EQ(agg.stat("slots_completed"), 2u);
  EXPECT_EQ(agg.stat("jobs_created"), 2u);
  EXPECT_EQ(agg.stop(), 0);
}

TEST(AggregatorServer, MaxJobsIsEnforced) {
  AggregatorProcess agg({"--max-jobs", "1"});
  RawUdp s;
  s.send(agg.port(), make_join(JobId{1, 1, 1}, 0, 1, 4, 0));
  s.send(agg.port(), make_join(JobId{2, 1, 1}, 0, 1, 4, 0));
  const auto r = drain(s);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].type, MsgType::kJoinAck);
  EXPECT_EQ(r[1].type, MsgType::kError);
  EXPECT_EQ(r[1].aux, static_cast<uint32_t>(ErrorCode::kNoResources));
  EXPECT_EQ(agg.stat("drop_no_resources"), 1u);
}

TEST(AggregatorServer, RejectsBadCommandLines) {
  const std::string bin = thc::test::env_or("THC_AGGREGATOR_BIN", THC_AGGREGATOR_BIN);
  for (std::vector<std::string> args : {std::vector<std::string>{"--threads", "0"}, {"--max-memory", "lots"},
                                        {"--bind", "no.such.host.invalid"}, {"--fault-drop", "2"}, {"--bogus"}}) {
    std::vector<std::string> argv = {bin, "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = thc::test::temp_path("badcli");
    const pid_t pid = thc::test::spawn(argv, log);
    const int st = thc::test::wait_child(pid, 20);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << args[0] << ": " << thc::test::slurp(log);
    ::unlink(log.c_str());
  }
}

}  // namespace
