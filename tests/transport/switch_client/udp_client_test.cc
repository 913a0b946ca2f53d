// The UDP client against a real thc-aggregator process on 127.0.0.1: 4 workers as threads and
// as separate processes, lossless and with seeded loss/duplication/reordering/delay on either
// side; which mechanism recovers a particular loss; stragglers and partial aggregation; a dead
// worker; job isolation under noise.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "common/status.h"
#include "switch_offload/protocol/builder.h"
#include "tests/barrier.h"
#include "tests/switch_offload/aggregator_process.h"
#include "tests/transport/switch_client/workload.h"
#include "transport/switch_client/channel.h"
#include "transport/switch_client/udp/udp_client.h"

namespace {

using thc::Error;
using thc::Status;
using thc::test::AggregatorProcess;
using thc::transport::DatagramChannel;
using thc::transport::IntType;
using thc::transport::UdpClientOptions;
using thc::transport::UdpReducer;

using Barrier = thc_testing::Barrier;

constexpr uint64_t kCount = 2000;  // per op: 8 packets of 256 elements (the last one partial)
constexpr int kWorld = 4;

UdpClientOptions opts(const AggregatorProcess& agg, int rank, int world, uint32_t job) {
  UdpClientOptions o;
  o.address = agg.url();
  o.rank = rank;
  o.world = world;
  o.job_label = job;
  o.key = thc::test::test_key(1);
  o.slots = 32;
  o.max_lanes = 256;  // small packets: more of them, more slot reuse per test
  o.max_wait_ms = 60000;
  o.fault_from_env = false;  // thread tests set faults explicitly
  o.fault.seed = 1000 + static_cast<uint64_t>(rank);
  return o;
}

// Run fn(rank) on `world` threads; rethrows nothing, returns each thread's error text ("" = ok).
std::vector<std::string> run_threads(int world, const std::function<void(int)>& fn) {
  std::vector<std::string> err(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        err[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return err;
}

std::vector<std::vector<uint8_t>> run_workload_threads(const AggregatorProcess& agg, uint32_t job,
                                                       const thc::FaultOptions& fault,
                                                       std::vector<uint64_t>* seeds = nullptr) {
  std::vector<std::vector<uint8_t>> out(kWorld);
  std::vector<uint64_t> sd(kWorld);
  std::vector<int> full(kWorld, 0);
  const auto err = run_threads(kWorld, [&](int r) {
    UdpClientOptions o = opts(agg, r, kWorld, job);
    o.fault = fault;
    o.fault.seed = fault.seed * 131 + static_cast<uint64_t>(r);
    UdpReducer red(o);
    sd[r] = red.shared_seed();
    auto res = thc::test::wl_run(red, kCount, 7);
    out[r] = std::move(res.bytes);
    full[r] = res.all_full;
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(err[r], "") << "rank " << r;
    EXPECT_TRUE(full[r]) << "rank " << r << ": every request should count all workers";
  }
  if (seeds) *seeds = sd;
  return out;
}

TEST(UdpClient, ReducerInterface) {
  AggregatorProcess agg;
  UdpReducer red(opts(agg, 0, 1, 1));
  EXPECT_EQ(red.name(), "udp");
  EXPECT_EQ(red.rank(), 0);
  EXPECT_EQ(red.size(), 1);
  EXPECT_TRUE(red.prefers_index_form());
  EXPECT_TRUE(red.partial_results());
  EXPECT_EQ(red.slots(), 32);
  EXPECT_NE(red.shared_seed(), 0u);
  // count 0 completes at once and counts everybody.
  auto req = red.start_sum(nullptr, 0, IntType::kU8);
  EXPECT_TRUE(req->test());
  req->wait();
  EXPECT_EQ(req->contributors(), 1);
  EXPECT_TRUE(req->self_counted());
  uint32_t m[3] = {1, 5, 2};
  red.max_u32(m, 3);
  EXPECT_EQ(m[1], 5u);
  // Nonblocking: test() only polls; wait() finishes.
  std::vector<uint16_t> v(1000, 3);
  auto r2 = red.start_sum(v.data(), v.size(), IntType::kU16);
  while (!r2->test()) {
  }
  r2->wait();
  EXPECT_EQ(v[999], 3);
  EXPECT_THROW({ UdpReducer r(opts(agg, 1, 1, 2)); }, Error);  // rank outside world
  UdpClientOptions bad = opts(agg, 0, 1, 3);
  bad.address = "tcp://x:1";
  EXPECT_THROW({ UdpReducer r(bad); }, Error);
}

TEST(UdpClient, FourThreadsLosslessMatchExactSums) {
  AggregatorProcess agg;
  std::vector<uint64_t> seeds;
  const auto out = run_workload_threads(agg, 10, {}, &seeds);
  const auto want = thc::test::wl_expected(kWorld, kCount, 7);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(out[r], want) << "rank " << r;
    EXPECT_EQ(seeds[r], seeds[0]) << "shared seed differs";
  }
  // Nothing is dropped but the JOINs without a cookie (answered with the cookie challenge): one
  // per worker, more where a worker's JOIN timer fired before the challenge came back (a loaded
  // machine), each of them answered with a challenge too; never a data packet.
  EXPECT_EQ(agg.stat("drops_total"), agg.stat("drop_cookie"));
  EXPECT_GE(agg.stat("drop_cookie"), static_cast<uint64_t>(kWorld));
  EXPECT_EQ(agg.stat("partial_completions"), 0u);
}

struct FaultCase {
  const char* name;
  double drop, dup, reorder;
  uint32_t delay_us;
  bool server_side;
};

void PrintTo(const FaultCase& c, std::ostream* os) { *os << c.name; }

class UdpClientFaults : public ::testing::TestWithParam<FaultCase> {};

TEST_P(UdpClientFaults, FourThreadsBitIdenticalToLossless) {
  const FaultCase& c = GetParam();
  thc::FaultOptions f;
  f.drop = c.drop;
  f.dup = c.dup;
  f.reorder = c.reorder;
  f.delay_us = c.delay_us;
  f.delay_prob = c.delay_us ? 0.3 : 0;
  f.seed = 77;
  std::vector<std::string> extra;
  if (c.server_side) {
    extra = {"--fault-drop", std::to_string(c.drop), "--fault-dup", std::to_string(c.dup), "--fault-reorder",
             std::to_string(c.reorder), "--fault-delay-us", std::to_string(c.delay_us), "--fault-seed", "5"};
    if (c.delay_us) extra.insert(extra.end(), {"--fault-delay-prob", "0.3"});
  }
  AggregatorProcess agg(extra);
  const auto lossless = run_workload_threads(agg, 20, {});
  const auto faulty = run_workload_threads(agg, 21, c.server_side ? thc::FaultOptions{} : f);
  const auto want = thc::test::wl_expected(kWorld, kCount, 7);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(lossless[r], want) << "rank " << r;
    EXPECT_EQ(faulty[r], lossless[r]) << "rank " << r;
  }
  if (c.drop > 0) {
    EXPECT_GT(agg.stat("retransmissions"), 0u) << "faults were injected, so packets were retransmitted";
  }
  if (c.drop > 0 && c.server_side) {
    EXPECT_GT(agg.stat("drop_fault"), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Loss, UdpClientFaults,
    ::testing::Values(FaultCase{"loss0", 0, 0, 0, 0, false}, FaultCase{"loss1", 0.01, 0, 0, 0, false},
                      FaultCase{"loss10", 0.10, 0, 0, 0, false},
                      FaultCase{"dup_reorder", 0.02, 0.10, 0.10, 0, false},
                      FaultCase{"delay", 0.01, 0.05, 0.05, 3000, false},
                      FaultCase{"server_loss10_dup_reorder", 0.10, 0.05, 0.05, 0, true}),
    [](const ::testing::TestParamInfo<FaultCase>& i) { return std::string(i.param.name); });

// A UDP channel to the aggregator that drops the datagrams `drop` picks (up: sent by the
// worker; else received by it): the fault layer's random loss made exact, to see which mechanism
// recovers one particular loss.
class DropChannel final : public DatagramChannel {
 public:
  using Pick = std::function<bool(const thc::switch_offload::proto::Header&, bool up)>;
  DropChannel(const std::string& url, Pick drop) : in_(thc::transport::make_udp_channel(url)), drop_(std::move(drop)) {}
  void send(const uint8_t* p, size_t n) override {
    if (!picked(p, n, true)) in_->send(p, n);
  }
  void flush() override { in_->flush(); }
  size_t recv(uint8_t* buf, size_t cap) override {
    for (;;) {
      const size_t n = in_->recv(buf, cap);
      if (n == 0 || !picked(buf, n, false)) return n;
    }
  }
  void wait_us(uint64_t t) override { in_->wait_us(t); }
  int poll_fd() const override { return in_->poll_fd(); }
  bool pending() const override { return in_->pending(); }
  int payload_budget() const override { return in_->payload_budget(); }
  std::string kind() const override { return in_->kind(); }
  std::string peer() const override { return in_->peer(); }
  int dropped() const { return dropped_.load(); }

 private:
  bool picked(const uint8_t* p, size_t n, bool up) {
    thc::switch_offload::proto::Header h;
    const uint8_t* pl = nullptr;
    size_t plen = 0;
    if (thc::switch_offload::proto::parse(p, n, &h, &pl, &plen) != thc::switch_offload::proto::ParseError::kOk ||
        !drop_(h, up))
      return false;
    dropped_++;
    return true;
  }
  std::unique_ptr<DatagramChannel> in_;
  Pick drop_;
  std::atomic<int> dropped_{0};
};

// One long op (400 packets of 64 lanes) over `world` threads, each with its own DropChannel;
// retransmission timers of 5 s, so that a loss recovered by a timer shows as a timeout (and the
// test takes seconds). A window of 32 in 256 slots: the packets behind a hole keep going while it
// is repaired. Returns each rank's statistics.
std::vector<thc::transport::UdpClientStats> run_targeted(const AggregatorProcess& agg, uint32_t job, int world,
                                                         const std::function<DropChannel::Pick(int)>& pick,
                                                         std::vector<int>* dropped) {
  constexpr uint64_t n = 64 * 400;
  std::vector<thc::transport::UdpClientStats> st(world);
  dropped->assign(world, 0);
  const auto err = run_threads(world, [&](int r) {
    UdpClientOptions o = opts(agg, r, world, job);
    o.slots = 256;
    o.window_max = 32;
    o.max_lanes = 64;
    o.rto_initial_ms = o.rto_min_ms = o.rto_max_ms = 5000;
    auto ch = std::make_unique<DropChannel>(agg.url(), pick(r));
    DropChannel* chp = ch.get();
    UdpReducer red(o, std::move(ch));
    std::vector<uint8_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 7 + static_cast<uint64_t>(r)) % 50);
    red.start_sum(v.data(), n, IntType::kU8)->wait();
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t want = 0;
      for (int w = 0; w < world; ++w) want += static_cast<uint32_t>((i * 7 + static_cast<uint64_t>(w)) % 50);
      ASSERT_EQ(v[i], static_cast<uint8_t>(want)) << "rank " << r << " element " << i;
    }
    st[r] = red.stats();
    (*dropped)[r] = chp->dropped();
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(err[r], "") << "rank " << r;
  return st;
}

using thc::switch_offload::proto::Header;
using thc::switch_offload::proto::MsgType;
bool is_data(const Header& h) { return h.type == MsgType::kDataValue; }

TEST(UdpClientRecovery, LostRetransmissionIsFoundByLaterResultsNotByTheTimer) {
  // Rank 0 loses packet 100 and its first resend. Both are found by the results of packets sent
  // after them (the window keeps going past the hole), so no timer fires.
  AggregatorProcess agg;
  std::vector<int> dropped;
  const auto st = run_targeted(agg, 200, 2, [](int r) -> DropChannel::Pick {
    return [r](const Header& h, bool up) { return r == 0 && up && is_data(h) && h.seq == 100 && h.attempt < 2; };
  }, &dropped);
  EXPECT_EQ(dropped[0], 2);
  EXPECT_GE(st[0].fast_retransmits, 2u) << "the hole and the lost resend, found by later results";
  EXPECT_GE(st[1].fast_retransmits, 1u) << "rank 1 sees the hole too (it cannot tell whose copy is missing)";
  for (int r = 0; r < 2; ++r) EXPECT_EQ(st[r].timeouts, 0u) << "rank " << r;
}

TEST(UdpClientRecovery, LostResultIsFoundByLaterResultsAndAnsweredFromTheFinishedSlot) {
  // The slot of packet 100 completes, but its result to rank 0 is lost: the results of later
  // packets reveal it, the resend draws the stored result again.
  AggregatorProcess agg;
  std::vector<int> dropped;
  const auto st = run_targeted(agg, 201, 2, [](int r) -> DropChannel::Pick {
    auto first = std::make_shared<bool>(true);
    return [r, first](const Header& h, bool up) {
      if (r != 0 || up || h.type != MsgType::kResult || h.seq != 100 || !*first) return false;
      *first = false;
      return true;
    };
  }, &dropped);
  EXPECT_EQ(dropped[0], 1);
  EXPECT_EQ(st[0].timeouts, 0u);
  EXPECT_GE(st[0].fast_retransmits, 1u);
  EXPECT_EQ(st[1].retransmissions, 0u) << "rank 1 got every result";
  EXPECT_GE(agg.stat("result_resends"), 1u);
}

TEST(UdpClientRecovery, RandomLossIsNotTakenForCongestion) {
  // 2 % seeded loss each way at 4 workers: the holes are isolated, so the window is not cut.
  // 30 % each way at 2 workers is more than random loss (loss_tolerance 10 % per path crossing),
  // and cuts it.
  AggregatorProcess agg;
  struct Case {
    double drop;
    int world;
    uint64_t packets;
  };
  for (const Case c : {Case{0.02, kWorld, 2000}, Case{0.3, 2, 600}}) {
    std::vector<uint64_t> cuts(c.world), fast(c.world);
    const auto err = run_threads(c.world, [&](int r) {
      UdpClientOptions o = opts(agg, r, c.world, c.drop < 0.1 ? 210 : 211);
      o.slots = 256;
      o.max_lanes = 64;
      o.fault.drop = c.drop;
      o.fault.seed = 4242 + static_cast<uint64_t>(r);
      UdpReducer red(o);
      const uint64_t n = 64 * c.packets;
      std::vector<uint8_t> v(n, static_cast<uint8_t>(r + 1));
      red.start_sum(v.data(), n, IntType::kU8)->wait();
      const uint8_t want = static_cast<uint8_t>(c.world * (c.world + 1) / 2);
      for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], want) << "rank " << r << " element " << i;
      cuts[r] = red.stats().loss_cuts;
      fast[r] = red.stats().fast_retransmits;
    });
    for (int r = 0; r < c.world; ++r) {
      ASSERT_EQ(err[r], "") << "rank " << r;
      EXPECT_GT(fast[r], 0u) << "drop " << c.drop << " rank " << r;
      if (c.drop < 0.1) EXPECT_EQ(cuts[r], 0u) << "rank " << r << ": isolated losses cut the window";
      else EXPECT_GT(cuts[r], 0u) << "rank " << r << ": heavy loss must still cut the window";
    }
  }
}

TEST(UdpClientRecovery, AStallIsNotABlackout) {
  // Rank 1 starts its op 400 ms late: rank 0's packets go unanswered, its timer expires three
  // times in a row and it resets the window (persistent congestion). Then the packets it sent
  // before and never resent are answered: their first copies went through, it was a stall, and
  // the reset is undone.
  AggregatorProcess agg;
  constexpr uint64_t n = 256 * 20;  // 20 packets, all in flight at once
  std::vector<thc::transport::UdpClientStats> st(2);
  Barrier sync(2);
  const auto err = run_threads(2, [&](int r) {
    UdpClientOptions o = opts(agg, r, 2, 220);
    o.slots = 64;
    UdpReducer red(o);
    sync.arrive_and_wait();
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    std::vector<uint8_t> v(n, static_cast<uint8_t>(r + 1));
    red.start_sum(v.data(), n, IntType::kU8)->wait();
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], 3) << "rank " << r << " element " << i;
    st[r] = red.stats();
  });
  for (int r = 0; r < 2; ++r) ASSERT_EQ(err[r], "") << "rank " << r;
  EXPECT_GE(st[0].timeouts, 6u) << "three expiries of two probes";
  EXPECT_GE(st[0].collapses, 1u);
  EXPECT_GE(st[0].spurious, 1u) << "the reset is undone";
  EXPECT_GE(st[0].cwnd, 32.0) << "the window is back where it was";
}

// Separate processes via posix_spawn (fork+exec), faults from the THC_FAULT_* environment.
void run_processes(const AggregatorProcess& agg, uint32_t job, const std::vector<std::string>& env,
                   std::vector<std::vector<uint8_t>>* out) {
  const std::string bin = thc::test::env_or("THC_UDP_WORKER_BIN", THC_UDP_WORKER_BIN);
  std::vector<pid_t> pids;
  std::vector<std::string> files, logs;
  for (int r = 0; r < kWorld; ++r) {
    files.push_back(thc::test::temp_path("out" + std::to_string(r)));
    logs.push_back(thc::test::temp_path("log" + std::to_string(r)));
    std::vector<std::string> e = env;
    e.push_back("THC_FAULT_SEED=" + std::to_string(900 + r));
    e.push_back(agg.key_env());
    pids.push_back(thc::test::spawn({bin, agg.url(), std::to_string(r), std::to_string(kWorld), std::to_string(job),
                                     std::to_string(kCount), files[r]},
                                    logs[r], e));
  }
  out->assign(kWorld, {});
  for (int r = 0; r < kWorld; ++r) {
    const int st = thc::test::wait_child(pids[r], 240);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "rank " << r << " status " << st << ": " << thc::test::slurp(logs[r]);
    const std::string s = thc::test::slurp(files[r]);
    (*out)[r].assign(s.begin(), s.end());
    ::unlink(files[r].c_str());
    ::unlink(logs[r].c_str());
  }
}

TEST(UdpClient, FourProcessesLosslessAndLossyMatchExactSums) {
  AggregatorProcess agg;
  const auto want = thc::test::wl_expected(kWorld, kCount, 7);
  std::vector<std::vector<uint8_t>> lossless, lossy, noisy;
  run_processes(agg, 30, {}, &lossless);
  run_processes(agg, 31, {"THC_FAULT_DROP=0.01"}, &lossy);
  run_processes(agg, 32, {"THC_FAULT_DROP=0.1", "THC_FAULT_DUP=0.05", "THC_FAULT_REORDER=0.05"}, &noisy);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(lossless[r], want) << "rank " << r;
    EXPECT_EQ(lossy[r], lossless[r]) << "rank " << r;
    EXPECT_EQ(noisy[r], lossless[r]) << "rank " << r;
  }
  EXPECT_GT(agg.stat("duplicates") + agg.stat("result_resends") + agg.stat("retransmissions"), 0u);
}

TEST(UdpClient, StragglerYieldsPartialResultAndIsToldItWasNotCounted) {
  AggregatorProcess agg;
  constexpr uint64_t n = 1000;  // 4 packets: the partial decision must hold for all of them
  std::vector<std::vector<uint32_t>> got(kWorld);
  std::vector<int> contrib(kWorld), counted(kWorld), contrib2(kWorld);
  std::vector<uint64_t> not_counted(kWorld);
  Barrier sync(kWorld);
  const auto err = run_threads(kWorld, [&](int r) {
    UdpClientOptions o = opts(agg, r, kWorld, 40);
    o.quorum = 3;
    o.quorum_timeout_us = 200'000;
    UdpReducer red(o);
    sync.arrive_and_wait();
    if (r == 3) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::vector<uint32_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>((r + 1) * 1000 + i);
    auto req = red.start_sum(v.data(), n, IntType::kU32);
    req->wait();
    got[r] = v;
    contrib[r] = req->contributors();
    counted[r] = req->self_counted();
    not_counted[r] = red.stats().not_counted;
    // Afterwards everybody is on time again; whoever is counted, every rank gets the same sum
    // and contributor count.
    sync.arrive_and_wait();
    std::vector<uint32_t> w(10, 1);
    auto req2 = red.start_sum(w.data(), w.size(), IntType::kU32);
    req2->wait();
    contrib2[r] = req2->contributors();
    EXPECT_EQ(static_cast<int>(w[0]), req2->contributors());
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(err[r], "") << "rank " << r;
    EXPECT_EQ(contrib[r], 3) << "rank " << r;
    EXPECT_EQ(counted[r], r != 3) << "rank " << r;
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(got[r][i], (1000 + 2000 + 3000) + 3 * i) << "rank " << r << " i " << i;
  }
  EXPECT_GE(not_counted[3], 4u) << "the late worker is told, packet by packet";
  EXPECT_EQ(not_counted[0], 0u);
  EXPECT_GE(agg.stat("partial_completions"), 4u);
  EXPECT_GE(agg.stat("late_not_counted"), 4u);
}

TEST(UdpClient, DeadWorkerGivesTimeoutNotHang) {
  AggregatorProcess agg;
  std::vector<Status> st(3, Status::kSuccess);
  std::vector<std::string> msg(3);
  const auto t0 = std::chrono::steady_clock::now();
  run_threads(3, [&](int r) {
    UdpClientOptions o = opts(agg, r, kWorld, 50);  // world 4, quorum 4: rank 3 never comes
    o.max_wait_ms = 1500;
    UdpReducer red(o);
    std::vector<uint8_t> v(600, 1);
    try {
      auto req = red.start_sum(v.data(), v.size(), IntType::kU8);
      req->wait();
    } catch (const Error& e) {
      st[r] = e.status();
      msg[r] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(st[r], Status::kTimeout) << "rank " << r;
    EXPECT_NE(msg[r].find("timeout"), std::string::npos) << msg[r];
    EXPECT_NE(msg[r].find("may have died"), std::string::npos) << msg[r];
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
}

TEST(UdpClient, UnreachableAggregatorGivesTimeout) {
  UdpClientOptions o;
  o.key = thc::test::test_key(1);
  {
    AggregatorProcess agg;
    o.address = agg.url();
  }  // stopped: nothing listens on that port now
  o.max_wait_ms = 300;
  o.fault_from_env = false;
  try {
    UdpReducer red(o);
    FAIL() << "join should not succeed";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kTimeout);
    EXPECT_NE(std::string(e.what()).find("running at"), std::string::npos) << e.what();
  }
}

TEST(UdpClient, UnknownKeyAndMismatchedWorldAreRejected) {
  AggregatorProcess agg;
  UdpReducer owner(opts(agg, 0, 2, 60));
  // A key the aggregator does not hold: its JOIN is dropped unanswered (a stranger learns
  // nothing); the worker times out with a message that names the key.
  UdpClientOptions thief = opts(agg, 1, 2, 60);
  thief.key = thc::test::test_key(9);
  thief.max_wait_ms = 400;
  try {
    UdpReducer r(thief);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kTimeout);
    EXPECT_NE(std::string(e.what()).find("key id 9"), std::string::npos) << e.what();
  }
  UdpClientOptions other = opts(agg, 1, 3, 60);
  try {
    UdpReducer r(other);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::kConfigMismatch) << e.what();
  }
  EXPECT_GT(agg.stat("drop_bad_tag"), 0u);
  EXPECT_EQ(agg.stat("drop_config_mismatch"), 1u);
}

TEST(UdpClient, ShardsAndSeveralAggregatorsGiveExactSums) {
  // Two aggregators, the first with two threads: three job instances; every op is split over
  // them by the engine's granule.
  AggregatorProcess a({}, 2), b;
  std::vector<std::vector<uint8_t>> out(kWorld);
  std::vector<std::string> names(kWorld);
  const auto err = run_threads(kWorld, [&](int r) {
    UdpClientOptions o = opts(a, r, kWorld, 90);
    o.address = a.url() + "," + b.url();
    auto red = thc::transport::make_aggregator_reducer(o);
    names[r] = red->name();
    red->set_part_granule(512);
    auto res = thc::test::wl_run(*red, kCount, 7);
    out[r] = std::move(res.bytes);
  });
  const auto want = thc::test::wl_expected(kWorld, kCount, 7);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(err[r], "") << "rank " << r;
    EXPECT_EQ(names[r], "udp x3");
    EXPECT_EQ(out[r], want) << "rank " << r;
  }
  EXPECT_EQ(a.stat("jobs_created"), 2u);
  EXPECT_EQ(b.stat("jobs_created"), 1u);
  EXPECT_GT(b.stat("elements"), 0u) << "the second aggregator took its parts";
}

TEST(UdpClient, LanesFollowThePathAndTheAggregator) {
  AggregatorProcess agg;
  UdpClientOptions o = opts(agg, 0, 1, 95);
  o.max_lanes = 8192;  // loopback's MTU is 65536; the aggregator's --mtu 1500 bounds it
  UdpReducer red(o);
  std::vector<uint8_t> v(100000, 1);
  red.start_sum(v.data(), v.size(), IntType::kU8)->wait();
  EXPECT_EQ(v[99999], 1);
  EXPECT_EQ(red.stats().lanes, 1408);
  EXPECT_EQ(red.stats().data_packets, (100000 + 1407) / 1408);
}

TEST(UdpClient, EnvironmentFaultVariablesAreValidated) {
  AggregatorProcess agg;
  UdpClientOptions o = opts(agg, 0, 1, 70);
  o.fault_from_env = true;
  ::setenv("THC_FAULT_DROP", "1.5", 1);
  EXPECT_THROW({ UdpReducer r(o); }, Error);
  ::setenv("THC_FAULT_DROP", "0.05", 1);
  ::setenv("THC_FAULT_SEED", "3", 1);
  {
    UdpReducer r(o);
    std::vector<uint16_t> v(3000, 2);
    r.start_sum(v.data(), v.size(), IntType::kU16)->wait();
    EXPECT_EQ(v[2999], 2);
  }
  ::unsetenv("THC_FAULT_DROP");
  ::unsetenv("THC_FAULT_SEED");
}

TEST(UdpClient, RunningJobIsUndisturbedByNoise) {
  AggregatorProcess agg;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> noise{0};
  std::thread noisy([&] {
    using namespace thc::switch_offload::proto;
    thc::test::RawUdp s;
    // The running job's id, but not its data key (a stranger does not know the job's seed or
    // key): forged tags.
    JobId j = JobId::make(thc::test::test_key(1), 80, kWorld);
    j.with_seed(12345);
    for (uint64_t i = 0; !stop.load(); ++i) {
      auto v = make_values(j, static_cast<uint16_t>(i % kWorld), 32, i % 64, 0, WireInt::kU8,
                           std::vector<uint32_t>(256, 200));
      s.send(agg.port(), v);  // forged tag
      auto x = make_values(j, 0, 32, i % 64, 0, WireInt::kU8, {1});
      x[4] = 1;
      s.send(agg.port(), x);  // wrong version
      s.send(agg.port(), std::vector<uint8_t>(x.begin(), x.begin() + 50));  // truncated header
      auto y = make_values(j, 1, 32, i % 64, 0, WireInt::kU8, {1});
      s.send(agg.port(), std::vector<uint8_t>(y.begin(), y.end() - 1));     // truncated payload
      s.send(agg.port(), std::vector<uint8_t>(97, static_cast<uint8_t>(i)));  // garbage
      noise.fetch_add(5);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  // The noise is already flowing when the job starts, and keeps flowing while it runs.
  while (noise.load() < 100) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto out = run_workload_threads(agg, 80, {});
  stop = true;
  noisy.join();
  const auto want = thc::test::wl_expected(kWorld, kCount, 7);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(out[r], want) << "rank " << r;
  const auto st = agg.stats();
  using thc::switch_offload::stats_get;
  EXPECT_GT(stats_get(st, "drop_bad_tag") + stats_get(st, "drop_unknown_job"), 0u);
  EXPECT_GT(stats_get(st, "drop_bad_version"), 0u);
  EXPECT_GT(stats_get(st, "drop_truncated"), 0u);
  EXPECT_GT(stats_get(st, "drop_bad_length"), 0u);
  EXPECT_GT(stats_get(st, "drop_bad_magic"), 0u);
  // Every noise datagram is dropped and counted; the job's own traffic adds only the JOIN
  // handshake's cookie drops (one per worker).
  EXPECT_EQ(stats_get(st, "drops_total"), noise.load() + stats_get(st, "drop_cookie"));
}

}  // namespace
