// thc-aggregator as a process: clean shutdown on signals, counters over the protocol, drops by
// reason for malformed traffic, several threads sharding jobs, and bad command lines.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <fstream>
#include <string>
#include <vector>

#include "switch_offload/protocol/builder.h"
#include "switch_offload/servers/engine_options.h"
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

// A hand-driven worker over a raw socket: the JOIN handshake, then whatever the test sends.
struct RawWorker {
  RawUdp sock;
  JobId j;
  uint16_t w;
  uint64_t nonce = 0;
  JoinAckBody join(uint16_t port, const JoinParams& p, Header* err = nullptr) {
    JoinParams q = p;
    std::vector<uint8_t> cookie;
    for (int round = 0; round < 2; ++round) {
      sock.send(port, make_join(j, w, q, ++nonce));
      for (;;) {
        auto r = sock.recv(2000);
        if (r.empty()) throw std::runtime_error("no reply to JOIN");
        Header h;
        const uint8_t* pl;
        size_t plen;
        if (parse(r.data(), r.size(), &h, &pl, &plen) != ParseError::kOk) continue;
        if (!thc::switch_offload::auth::verify(j.jkey, r.data(), r.size())) throw std::runtime_error("unverified reply");
        if (h.type == MsgType::kChallenge) {
          cookie.assign(pl, pl + plen);
          q.cookie = cookie.data();
          break;
        }
        if (h.type == MsgType::kError) {
          if (err) *err = h;
          return JoinAckBody{};
        }
        JoinAckBody a;
        if (h.type != MsgType::kJoinAck || parse_join_ack(pl, plen, &a) != ParseError::kOk)
          throw std::runtime_error("unexpected reply to JOIN");
        j.with_seed(a.seed);
        return a;
      }
    }
    throw std::runtime_error("JOIN with a cookie was challenged again");
  }
};

JobId test_job(uint32_t label, uint16_t n, uint16_t shard = 0) {
  return JobId::make(thc::test::test_key(1), label, n, shard);
}

JoinParams tofino(uint16_t k, uint16_t S) {
  JoinParams p;
  p.quorum = k;
  p.slots = S;
  p.max_lanes = kTofinoLanes;
  p.payload_budget = kTofinoPayloadBudget;
  return p;
}

TEST(AggregatorServer, MalformedAndUnauthenticatedTrafficIsCountedAndNeverAnswered) {
  AggregatorProcess agg;
  RawUdp s;
  JobId j = test_job(77, 2);
  j.with_seed(5);
  auto v = make_values(j, 0, 4, 0, 0, WireInt::kU8, {1});
  s.send(agg.port(), std::vector<uint8_t>(v.begin(), v.begin() + 20));  // truncated
  auto x = v;
  x[0] = 0;
  s.send(agg.port(), x);  // bad magic
  x = v;
  x[4] = 1;
  s.send(agg.port(), x);  // version 1
  x = v;
  x.push_back(1);
  s.send(agg.port(), x);  // bad length
  s.send(agg.port(), std::vector<uint8_t>(9500, 0xAB));  // oversized garbage
  s.send(agg.port(), v);  // a job that does not exist
  JobId stranger = JobId::make(thc::test::test_key(9), 77, 2);
  s.send(agg.port(), make_join(stranger, 0, tofino(2, 4)));  // a key the aggregator does not hold
  EXPECT_TRUE(drain(s).empty()) << "nothing unauthenticated is answered";
  const auto st = agg.stats();
  using thc::switch_offload::stats_get;
  EXPECT_EQ(stats_get(st, "drop_truncated"), 1u);
  EXPECT_EQ(stats_get(st, "drop_bad_magic"), 2u);
  EXPECT_EQ(stats_get(st, "drop_bad_version"), 1u);
  EXPECT_EQ(stats_get(st, "drop_bad_length"), 1u);
  EXPECT_EQ(stats_get(st, "drop_unknown_job"), 1u);
  EXPECT_EQ(stats_get(st, "drop_bad_tag"), 1u);
  EXPECT_EQ(stats_get(st, "drops_total"), 7u);
  EXPECT_EQ(agg.stop(), 0);
}

TEST(AggregatorServer, ThreadsShardEveryJobAndEachInstanceAggregates) {
  AggregatorProcess agg({}, 2);
  // One job, two workers, on both shards (threads); each instance sums on its own.
  RawWorker w[2][2];
  uint64_t seeds[2] = {0, 0};
  for (uint16_t shard = 0; shard < 2; ++shard)
    for (uint16_t r = 0; r < 2; ++r) {
      w[shard][r].j = test_job(10, 2, shard);
      w[shard][r].w = r;
      const JoinAckBody a = w[shard][r].join(agg.port(), tofino(2, 4));
      EXPECT_EQ(a.shards, 2);
      if (r == 0) seeds[shard] = a.seed;
      else EXPECT_EQ(a.seed, seeds[shard]) << "workers of one job instance share its seed";
    }
  for (uint16_t shard = 0; shard < 2; ++shard)
    for (uint16_t r = 0; r < 2; ++r)
      w[shard][r].sock.send(agg.port(), make_values(w[shard][r].j, r, 4, 0, 0, WireInt::kU16, {10u + shard, r + 1u}));
  for (uint16_t shard = 0; shard < 2; ++shard)
    for (uint16_t r = 0; r < 2; ++r) {
      auto p = w[shard][r].sock.recv(2000);
      Header h;
      const uint8_t* pl;
      size_t plen;
      ASSERT_EQ(parse(p.data(), p.size(), &h, &pl, &plen), ParseError::kOk);
      ASSERT_EQ(h.type, MsgType::kResult);
      EXPECT_TRUE(thc::switch_offload::auth::verify(w[shard][r].j.dkey, p.data(), p.size()));
      EXPECT_EQ(h.shard, shard);
      EXPECT_EQ(load_lane(WireInt::kU16, pl, 0), 2u * (10u + shard));
      EXPECT_EQ(load_lane(WireInt::kU16, pl, 1), 3u);
    }
  EXPECT_EQ(agg.stat("slots_completed"), 2u);
  EXPECT_EQ(agg.stat("jobs_created"), 2u);
  EXPECT_EQ(agg.stop(), 0);
}

TEST(AggregatorServer, MaxJobsIsEnforced) {
  AggregatorProcess agg({"--max-jobs", "1"});
  RawWorker a, b;
  a.j = test_job(1, 1);
  a.w = 0;
  b.j = test_job(2, 1);
  b.w = 0;
  EXPECT_EQ(a.join(agg.port(), tofino(1, 4)).slots, 4);
  Header err;
  b.join(agg.port(), tofino(1, 4), &err);
  EXPECT_EQ(err.type, MsgType::kError);
  EXPECT_EQ(err.aux, static_cast<uint32_t>(ErrorCode::kNoResources));
  EXPECT_EQ(agg.stat("drop_no_resources"), 1u);
}

TEST(AggregatorServer, RejectsBadCommandLinesAndKeyFiles) {
  const std::string bin = thc::test::env_or("THC_AGGREGATOR_BIN", THC_AGGREGATOR_BIN);
  thc::test::TestKeyFile keys;
  const std::string open_keys = thc::test::temp_path("open_keys");
  {
    std::string err;
    ASSERT_TRUE(thc::switch_offload::auth::write_key_file(open_keys, {thc::test::test_key(1)}, &err)) << err;
    ::chmod(open_keys.c_str(), 0644);
  }
  for (std::vector<std::string> args :
       {std::vector<std::string>{"--key-file", keys.path(), "--threads", "0"},
        {"--key-file", keys.path(), "--max-memory", "lots"},
        {"--key-file", keys.path(), "--bind", "no.such.host.invalid"},
        {"--key-file", keys.path(), "--fault-drop", "2"},
        {"--key-file", keys.path(), "--max-lanes", "100"},
        {"--key-file", keys.path(), "--max-memory-per-tenant", "lots"},
        {"--key-file", keys.path(), "--dead-worker-ms", "0"},
        {"--key-file", keys.path(), "--bogus"},
        {},                                   // no key file: every job must be authenticated
        {"--key-file", "/nonexistent/keys"},  // missing
        {"--key-file", open_keys}}) {         // readable by others
    std::vector<std::string> argv = {bin, "--port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = thc::test::temp_path("badcli");
    const pid_t pid = thc::test::spawn(argv, log);
    const int st = thc::test::wait_child(pid, 20);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << (args.empty() ? "(none)" : args.back()) << ": "
                                                        << thc::test::slurp(log);
    ::unlink(log.c_str());
  }
  ::unlink(open_keys.c_str());
}

// The options both software aggregators share: every bad value is named by its option (the
// DPDK server, created from code, used to take an MTU or lane count its command line refuses),
// and each shard's engine gets the packet geometry and its own seed stream.
TEST(EngineOptions, BadValuesAreNamedByTheirOption) {
  thc::switch_offload::EngineOptions ok;
  ok.keys = std::make_shared<thc::switch_offload::auth::KeyRing>(
      std::vector<thc::switch_offload::auth::Key>{thc::test::test_key(1)});
  EXPECT_EQ(ok.problem(), "");
  struct Case {
    const char* option;
    void (*spoil)(thc::switch_offload::EngineOptions&);
  };
  const Case cases[] = {
      {"--max-jobs", [](auto& o) { o.max_jobs = 0; }},
      {"--max-memory", [](auto& o) { o.max_memory = 0; }},
      {"--max-jobs-per-source", [](auto& o) { o.max_jobs_per_source = 0; }},
      {"--max-jobs-per-tenant", [](auto& o) { o.max_jobs_per_tenant = -1; }},
      {"--max-memory-per-tenant", [](auto& o) { o.max_memory_per_tenant = -1; }},
      {"--max-slots", [](auto& o) { o.max_slots = 0; }},
      {"--max-slots", [](auto& o) { o.max_slots = 40000; }},
      {"--job-idle-timeout", [](auto& o) { o.job_idle_timeout_us = 0; }},
      {"--dead-worker-ms", [](auto& o) { o.dead_worker_us = 0; }},
      {"--mtu", [](auto& o) { o.mtu = 100; }},
      {"--mtu", [](auto& o) { o.mtu = 9001; }},
      {"--max-lanes", [](auto& o) { o.max_lanes = 100; }},
      {"--max-lanes", [](auto& o) { o.max_lanes = 16384; }},
      {"--key-file", [](auto& o) { o.keys.reset(); }},
  };
  for (const Case& c : cases) {
    thc::switch_offload::EngineOptions o = ok;
    c.spoil(o);
    EXPECT_NE(o.problem().find(c.option), std::string::npos) << c.option << ": " << o.problem();
  }
}

TEST(EngineOptions, EachShardGetsThePacketGeometryAndItsOwnSeeds) {
  thc::switch_offload::EngineOptions o;
  o.mtu = 9000;
  o.max_lanes = 4096;
  o.max_slots = 128;
  o.seed = 7;
  const auto v4 = o.engine_config(20, 4, 0), v6 = o.engine_config(40, 4, 1);
  EXPECT_EQ(v4.payload_budget, 9000 - 20 - 8 - static_cast<int>(kHeaderBytes));
  EXPECT_EQ(v6.payload_budget, v4.payload_budget - 20);
  EXPECT_EQ(v4.max_lanes, 4096);
  EXPECT_EQ(v4.max_slots_per_job, 128u);
  EXPECT_EQ(v4.shards, 4);
  EXPECT_NE(v4.seed, v6.seed);
  EXPECT_NE(v4.seed, 0u);
  o.seed = 0;  // random seeds stay random on every shard
  EXPECT_EQ(o.engine_config(20, 4, 3).seed, 0u);
}

}  // namespace

namespace {

// CI once failed with "cannot create key file /tmp/thc_switch_test_26313_0_keys: File exists": an
// earlier test process with the same pid had been killed before its destructors ran, and the
// key file is (rightly) created with O_EXCL. A test's files must never meet files that another
// process left behind, whatever their names.
TEST(TestHarness, FilesLeftBehindByAnEarlierProcessWithThisPidDoNotStopATest) {
  std::vector<std::string> stale;
  for (int k = 0; k < 64; ++k)
    for (const char* stem : {"keys", "port", "log"}) {
      stale.push_back("/tmp/thc_switch_test_" + std::to_string(::getpid()) + "_" + std::to_string(k) + "_" + stem);
      std::ofstream(stale.back()) << "left behind\n";
    }
  std::string path;
  EXPECT_NO_THROW({
    thc::test::TestKeyFile keys;
    path = keys.path();
    std::vector<thc::switch_offload::auth::Key> back;
    std::string err;
    EXPECT_TRUE(thc::switch_offload::auth::load_key_file(keys.path(), &back, &err)) << err;
    EXPECT_EQ(back.size(), 3u);
  });
  for (const auto& s : stale) {
    EXPECT_EQ(thc::test::slurp(s), "left behind\n") << s << " must not be touched";
    ::unlink(s.c_str());
  }
  struct stat st {};
  EXPECT_NE(::stat(path.c_str(), &st), 0) << "the key file outlives its owner: " << path;
}

}  // namespace
