// The point-to-point schedules (transport/schedules) over the in-process link, against plain
// reference sums: every world size 1..8, every integer type, counts from 0 to several pieces per
// segment (small pieces force the pipelining paths), index form with every b, with and without a
// downstream codec, two operations in flight, a missing peer and ranks that disagree.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/codec/elem.h"
#include "common/status.h"
#include "transport/inproc/inproc.h"
#include "transport/schedules/schedules.h"

namespace {

using thc::Error;
using thc::Status;
using thc::transport::DownstreamCodec;
using thc::transport::IntType;
using thc::transport::LookupTable;
using thc::transport::Reducer;
using thc::transport::ScheduleOptions;

constexpr IntType kTypes[] = {IntType::kU8, IntType::kU16, IntType::kU32, IntType::kI8, IntType::kI16, IntType::kI32};

size_t width(IntType t) { return thc::codec::int_size(t); }

// Runs body(rank, reducer) on n threads over one in-process group; rethrows the first failure.
// wrap (optional) puts something around each rank's link (a recorder, a fault).
using WrapLink = std::function<std::unique_ptr<thc::transport::Link>(int, std::unique_ptr<thc::transport::Link>)>;
void run(int n, const ScheduleOptions& opt, long timeout_ms, const std::function<void(int, Reducer&)>& body,
         const WrapLink& wrap = nullptr) {
  auto g = thc::transport::make_inproc_group(n, timeout_ms);
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> err(n);
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        auto link = thc::transport::make_inproc_link(g, r);
        if (wrap) link = wrap(r, std::move(link));
        auto red = thc::transport::make_scheduled_reducer(std::move(link), opt);
        body(r, *red);
      } catch (...) {
        err[r] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

std::vector<uint8_t> random_ints(uint64_t count, IntType t, uint64_t seed) {
  std::vector<uint8_t> v(count * width(t));
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

uint64_t load(IntType t, const uint8_t* p, uint64_t i) {
  uint64_t v = 0;
  std::memcpy(&v, p + i * width(t), width(t));
  return v;
}

uint64_t wrap(IntType t, uint64_t v) {
  const size_t w = width(t);
  return w == 8 ? v : v & ((uint64_t{1} << (8 * w)) - 1);
}

class Schedules : public ::testing::TestWithParam<int> {};

TEST_P(Schedules, RingSumEqualsTheSumOfEveryRank) {
  const int n = GetParam();
  ScheduleOptions opt;
  for (uint64_t piece : {uint64_t{64}, uint64_t{1000}, uint64_t{256 * 1024}}) {
    opt.piece_bytes = piece;
    for (IntType t : kTypes)
      for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{7}, static_cast<uint64_t>(n + 1), uint64_t{1001},
                             uint64_t{20011}}) {
        SCOPED_TRACE("n=" + std::to_string(n) + " count=" + std::to_string(count) + " width=" +
                     std::to_string(width(t)) + " piece=" + std::to_string(piece));
        std::vector<std::vector<uint8_t>> in(n), out(n);
        for (int r = 0; r < n; ++r) in[r] = random_ints(count, t, 1000 * r + count);
        run(n, opt, 30000, [&](int r, Reducer& red) {
          out[r] = in[r];
          red.start_sum(out[r].data(), count, t)->wait();
        });
        for (uint64_t i = 0; i < count; ++i) {
          uint64_t want = 0;
          for (int r = 0; r < n; ++r) want += load(t, in[r].data(), i);
          for (int r = 0; r < n; ++r) ASSERT_EQ(load(t, out[r].data(), i), wrap(t, want)) << "rank " << r << " element " << i;
        }
      }
  }
}

// A downstream codec whose bytes depend on the global element offset, so a shard decoded with the
// wrong `first` shows: each sum is sent as (sum + first + i) in 4 bytes.
class OffsetCodec final : public DownstreamCodec {
 public:
  explicit OffsetCodec(IntType t) : t_(t) {}
  size_t encoded_bytes(uint64_t count) const override { return count * 4; }
  void encode(const void* sums, uint64_t first, uint64_t count, uint8_t* out) const override {
    for (uint64_t i = 0; i < count; ++i) {
      const uint32_t v = static_cast<uint32_t>(load(t_, static_cast<const uint8_t*>(sums), i) + first + i);
      std::memcpy(out + 4 * i, &v, 4);
    }
  }
  void decode(const uint8_t* in, uint64_t first, uint64_t count, void* sums) const override {
    for (uint64_t i = 0; i < count; ++i) {
      uint32_t v;
      std::memcpy(&v, in + 4 * i, 4);
      const uint64_t s = wrap(t_, v - first - i);
      std::memcpy(static_cast<uint8_t*>(sums) + i * width(t_), &s, width(t_));
    }
  }

 private:
  IntType t_;
};

TEST_P(Schedules, LookupSumEqualsTheSumOfTableValues) {
  const int n = GetParam();
  ScheduleOptions opt;
  for (uint64_t piece : {uint64_t{64}, uint64_t{256 * 1024}})
    for (int bits = 1; bits <= 8; ++bits)
      for (IntType t : {IntType::kU8, IntType::kI16, IntType::kI32})
        for (bool with_down : {false, true})
          for (uint64_t count : {uint64_t{1}, uint64_t{9}, static_cast<uint64_t>(8 * n + 3), uint64_t{5003}}) {
            opt.piece_bytes = piece;
            SCOPED_TRACE("n=" + std::to_string(n) + " b=" + std::to_string(bits) + " count=" + std::to_string(count) +
                         " width=" + std::to_string(width(t)) + (with_down ? " down" : "") + " piece=" +
                         std::to_string(piece));
            LookupTable table;
            table.bits = bits;
            std::mt19937 rng(static_cast<unsigned>(bits * 31 + count));
            for (int z = 0; z < (1 << bits); ++z) table.values.push_back(static_cast<int32_t>(rng() % 61) - 30);
            const uint64_t bytes = (count * bits + 7) / 8;
            std::vector<std::vector<uint8_t>> packed(n), packed2(n), sums(n);
            for (int r = 0; r < n; ++r) {
              packed[r] = random_ints(bytes + 1, IntType::kU8, 77 * r + bits);
              packed2[r] = random_ints(bytes + 1, IntType::kU8, 5077 * r + bits);
              sums[r].assign(count * width(t), 0xAB);
            }
            OffsetCodec down(t);
            // Into the caller's buffer, then (the reducer's buffers now reused, holding the first
            // operation's bytes) with the result kept by the request (lent_sums).
            std::vector<std::vector<uint8_t>> lent(n);
            run(n, opt, 30000, [&](int r, Reducer& red) {
              red.start_lookup_sum(packed[r].data(), count, table, sums[r].data(), t, with_down ? &down : nullptr)->wait();
              ASSERT_TRUE(red.lends_sums());
              auto req = red.start_lookup_sum(packed2[r].data(), count, table, nullptr, t, with_down ? &down : nullptr);
              req->wait();
              const auto* p = static_cast<const uint8_t*>(req->lent_sums());
              ASSERT_NE(p, nullptr);
              lent[r].assign(p, p + count * width(t));
              // The indices encoded into the transport's buffer and handed over, not copied.
              ASSERT_TRUE(red.adopts_input());
              std::vector<uint8_t> in = red.input_buffer(bytes);
              ASSERT_GE(in.size(), bytes);
              std::memcpy(in.data(), packed2[r].data(), bytes);
              auto req3 = red.start_lookup_sum_adopt(std::move(in), count, table, nullptr, t, with_down ? &down : nullptr);
              EXPECT_TRUE(in.empty()) << "the request takes the buffer over";
              req3->wait();
              const auto* p3 = static_cast<const uint8_t*>(req3->lent_sums());
              ASSERT_NE(p3, nullptr);
              EXPECT_EQ(std::vector<uint8_t>(p3, p3 + count * width(t)), lent[r]) << "adopted, rank " << r;
            });
            for (uint64_t i = 0; i < count; ++i) {
              int64_t want = 0, want2 = 0;
              for (int r = 0; r < n; ++r) {
                want += table.values[thc::elem::packed_get(packed[r].data(), i, bits)];
                want2 += table.values[thc::elem::packed_get(packed2[r].data(), i, bits)];
              }
              for (int r = 0; r < n; ++r) {
                ASSERT_EQ(load(t, sums[r].data(), i), wrap(t, static_cast<uint64_t>(want))) << "rank " << r << " element " << i;
                ASSERT_EQ(load(t, lent[r].data(), i), wrap(t, static_cast<uint64_t>(want2)))
                    << "lent, rank " << r << " element " << i;
              }
            }
          }
}

TEST_P(Schedules, TwoOperationsInFlightKeepApart) {
  const int n = GetParam();
  ScheduleOptions opt;
  opt.piece_bytes = 128;
  const uint64_t count = 3001;
  std::vector<std::vector<uint8_t>> a(n), b(n), ia(n), ib(n);
  for (int r = 0; r < n; ++r) {
    ia[r] = random_ints(count, IntType::kU16, r);
    ib[r] = random_ints(count, IntType::kU16, 100 + r);
  }
  run(n, opt, 30000, [&](int r, Reducer& red) {
    for (int round = 0; round < 3; ++round) {
      a[r] = ia[r];
      b[r] = ib[r];
      auto ra = red.start_sum(a[r].data(), count, IntType::kU16);
      auto rb = red.start_sum(b[r].data(), count, IntType::kU16);
      // Progress in an order that differs between ranks; completion is waited in start order.
      for (int i = 0; i < 10 * r; ++i) (i % 2 ? ra : rb)->test();
      ra->wait();
      rb->wait();
    }
  });
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t wa = 0, wb = 0;
    for (int r = 0; r < n; ++r) {
      wa += load(IntType::kU16, ia[r].data(), i);
      wb += load(IntType::kU16, ib[r].data(), i);
    }
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(load(IntType::kU16, a[r].data(), i), wrap(IntType::kU16, wa));
      ASSERT_EQ(load(IntType::kU16, b[r].data(), i), wrap(IntType::kU16, wb));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Schedules, ::testing::Values(1, 2, 3, 4, 5, 8));

// A rank that never starts the operation: the others fail within the timeout, naming it, and
// their communicator refuses what follows (the ranks are out of step).
// A link that records the size of every message it sends, by tag (the PS's phases).
class RecordingLink final : public thc::transport::Link {
 public:
  RecordingLink(std::unique_ptr<Link> in, std::vector<std::pair<uint32_t, size_t>>* sent)
      : in_(std::move(in)), sent_(sent) {}
  int rank() const override { return in_->rank(); }
  int size() const override { return in_->size(); }
  std::string name() const override { return in_->name(); }
  long timeout_ms() const override { return in_->timeout_ms(); }
  uint32_t tag_limit() const override { return in_->tag_limit(); }
  void max_u32(uint32_t* data, size_t n) override { in_->max_u32(data, n); }
  void isend(int peer, uint32_t tag, const void* buf, size_t bytes, Req* req) override {
    sent_->emplace_back(tag, bytes);
    in_->isend(peer, tag, buf, bytes, req);
  }
  void irecv(int peer, uint32_t tag, void* buf, size_t bytes, Req* req) override { in_->irecv(peer, tag, buf, bytes, req); }
  int test_some(Req* reqs, int n, int* done) override { return in_->test_some(reqs, n, done); }
  bool cancel(Req* req) override { return in_->cancel(req); }
  void idle(uint64_t us) override { in_->idle(us); }

 private:
  std::unique_ptr<Link> in_;
  std::vector<std::pair<uint32_t, size_t>>* sent_;
};

// Wraps each rank's link in a RecordingLink writing to sent[rank].
WrapLink record_into(std::vector<std::vector<std::pair<uint32_t, size_t>>>& sent) {
  return [&sent](int r, std::unique_ptr<thc::transport::Link> l) {
    return std::make_unique<RecordingLink>(std::move(l), &sent[r]);
  };
}

// A shard a little over piece_bytes goes as two halves, not a full piece and a sliver: each
// message costs a transport like Open MPI over TCP about the same whatever its size.
TEST(SchedulesPieces, AShardJustOverThePieceIsCutIntoEqualHalves) {
  const int n = 2;
  const uint64_t shard = 1008;  // elements per rank's shard (u8 sums: 1008 bytes)
  const uint64_t count = n * shard;
  ScheduleOptions opt;
  opt.piece_bytes = 1000;
  LookupTable table;
  table.bits = 4;
  for (int z = 0; z < 16; ++z) table.values.push_back(z);
  std::vector<std::vector<std::pair<uint32_t, size_t>>> sent(n);
  std::vector<std::vector<uint8_t>> sums(n, std::vector<uint8_t>(count));
  run(
      n, opt, 30000,
      [&](int r, Reducer& red) {
        std::vector<uint8_t> packed(count / 2, static_cast<uint8_t>(r == 0 ? 0x11 : 0x33));
        red.start_lookup_sum(packed.data(), count, table, sums[r].data(), IntType::kU8, nullptr)->wait();
      },
      record_into(sent));
  for (int r = 0; r < n; ++r) {
    // Rank 0's codes are all 1, rank 1's all 3: every sum is 4.
    for (uint64_t i = 0; i < count; ++i) ASSERT_EQ(sums[r][i], 4) << "rank " << r << " element " << i;
    std::map<uint32_t, std::vector<size_t>> by_tag;
    for (const auto& m : sent[r]) by_tag[m.first].push_back(m.second);
    ASSERT_EQ(by_tag.size(), 2u) << "codes and sums";
    for (const auto& [tag, sizes] : by_tag) {
      const auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
      EXPECT_LE(*hi, opt.piece_bytes) << "tag " << tag;
      EXPECT_EQ(*lo, *hi) << "tag " << tag << ": " << sizes.size() << " messages of unequal sizes";
    }
  }
}

// Open MPI over TCP sends a message above its eager limit as a rendezvous (a handshake and a
// sliver of a tail for one just over it): with eager_bytes, a message of up to twice that goes as
// equal parts at or under it, in every schedule, and the results stay the same; longer ones stay
// whole.
TEST(SchedulesPieces, MessagesJustOverTheEagerLimitGoAsPartsUnderIt) {
  const int n = 3;
  ScheduleOptions opt;
  opt.eager_bytes = 1000;
  LookupTable table;
  table.bits = 4;
  for (int z = 0; z < 16; ++z) table.values.push_back(z);
  // PS: shards of 1008 u8 sums (one piece each); ring: segments of 1500 and of 2500 bytes;
  // allgather: ranges of 1990 bytes.
  const uint64_t ps_count = n * 1008, ring_counts[] = {n * 1500, n * 2500}, ag_count = n * 1990;
  std::vector<std::vector<std::pair<uint32_t, size_t>>> sent(n);
  std::vector<std::vector<uint8_t>> sums(n), ring_in[2], ring_out[2], ag(n);
  for (int k = 0; k < 2; ++k)
    for (int r = 0; r < n; ++r) {
      ring_in[k].push_back(random_ints(ring_counts[k], IntType::kU8, 31 * r + k));
      ring_out[k].push_back(ring_in[k][r]);
    }
  const std::vector<uint64_t> ag_bounds = {0, 1990, 3980, ag_count};
  run(
      n, opt, 30000,
      [&](int r, Reducer& red) {
        std::vector<uint8_t> packed(ps_count / 2, static_cast<uint8_t>(0x11 * (r + 1)));
        sums[r].assign(ps_count, 0);
        red.start_lookup_sum(packed.data(), ps_count, table, sums[r].data(), IntType::kU8, nullptr)->wait();
        for (int k = 0; k < 2; ++k) red.start_sum(ring_out[k][r].data(), ring_counts[k], IntType::kU8)->wait();
        ag[r].assign(ag_count, 0);
        for (uint64_t i = ag_bounds[r]; i < ag_bounds[r + 1]; ++i) ag[r][i] = static_cast<uint8_t>(i * 7 + 1);
        red.start_allgather(ag[r].data(), ag_bounds)->wait();
      },
      record_into(sent));
  for (int r = 0; r < n; ++r) {
    // Codes 1, 2, 3 on ranks 0, 1, 2: every sum is 6.
    for (uint64_t i = 0; i < ps_count; ++i) ASSERT_EQ(sums[r][i], 6) << "rank " << r << " element " << i;
    for (int k = 0; k < 2; ++k)
      for (uint64_t i = 0; i < ring_counts[k]; ++i) {
        uint64_t want = 0;
        for (int q = 0; q < n; ++q) want += ring_in[k][q][i];
        ASSERT_EQ(ring_out[k][r][i], static_cast<uint8_t>(want)) << "ring " << k << " rank " << r << " element " << i;
      }
    for (uint64_t i = 0; i < ag_count; ++i) ASSERT_EQ(ag[r][i], static_cast<uint8_t>(i * 7 + 1)) << "rank " << r;
    size_t over = 0;
    for (const auto& m : sent[r]) {
      if (m.second == 2500) {
        ++over;  // the 2500-byte ring segments: more than twice the limit, whole
        continue;
      }
      EXPECT_LE(m.second, opt.eager_bytes) << "rank " << r << " tag " << m.first;
    }
    EXPECT_EQ(over, 2u * (n - 1)) << "rank " << r << ": each 2500-byte segment once per ring phase step";
  }
}

TEST(SchedulesFaults, AMissingPeerIsATimeoutNamingIt) {
  const int n = 3;
  std::vector<std::string> msg(n);
  std::vector<Status> st(n, Status::kSuccess);
  std::vector<Status> after(n, Status::kSuccess);
  std::atomic<int> finished{0};
  const auto t0 = std::chrono::steady_clock::now();
  run(n, ScheduleOptions{}, 300, [&](int r, Reducer& red) {
    if (r == 2) {
      while (finished.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::vector<uint8_t> v(1000, 1);
    try {
      red.start_sum(v.data(), v.size(), IntType::kU8)->wait();
    } catch (const Error& e) {
      st[r] = e.status();
      msg[r] = e.what();
    }
    try {
      red.start_sum(v.data(), v.size(), IntType::kU8)->wait();
    } catch (const Error& e) {
      after[r] = e.status();
    }
    finished++;
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 5.0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], Status::kTimeout) << msg[r];
    EXPECT_EQ(after[r], Status::kTransport) << "a broken communicator must refuse further operations";
  }
  // Rank 0 waits for rank 2 (its left neighbour in the ring); rank 1 for rank 0's forwarding.
  EXPECT_NE(msg[0].find("rank(s) 2"), std::string::npos) << msg[0];
  EXPECT_NE(msg[0].find("THC_TIMEOUT_MS"), std::string::npos) << msg[0];
}

// Ranks that start different operations get an error (inproc sees the size mismatch), or at
// worst a timeout: never a hang, never a result.
TEST(SchedulesFaults, RanksThatDisagreeOnTheCountFail) {
  const int n = 3;
  std::vector<Status> st(n, Status::kSuccess);
  run(n, ScheduleOptions{}, 500, [&](int r, Reducer& red) {
    std::vector<uint8_t> v(3000, 1);
    try {
      red.start_sum(v.data(), r == 1 ? 2999 : 3000, IntType::kU8)->wait();
    } catch (const Error& e) {
      st[r] = e.status();
    }
  });
  int failed = 0;
  for (int r = 0; r < n; ++r) {
    if (st[r] == Status::kSuccess) continue;
    ++failed;
    EXPECT_TRUE(st[r] == Status::kConfigMismatch || st[r] == Status::kTimeout) << thc::status_text(st[r]);
  }
  EXPECT_GE(failed, 2);
}

// The ring numbers its messages by (step, piece); the step was packed into 12 bits, so from 4098
// ranks on a step >= 4096 was taken for another one and every value-form call failed (timed out
// under MPI). 4100 in-process ranks driven by one thread through test() (as the engine drives a
// request between encoded blocks): with two elements only two segments carry data, so the run is
// cheap, yet those two travel every step of both phases. Tags carry only the operation number and
// the phase (never the step), so MPI_TAG_UB bounds the operations in flight, not the ranks.
TEST(SchedulesScale, RingOverMoreThan4096Ranks) {
  for (const int n : {4098, 4100}) {
    auto g = thc::transport::make_inproc_group(n, 60000);
    std::vector<std::unique_ptr<Reducer>> reds;
    reds.reserve(n);
    for (int r = 0; r < n; ++r)
      reds.push_back(thc::transport::make_scheduled_reducer(thc::transport::make_inproc_link(g, r), ScheduleOptions{}));
    const uint64_t count = 2;
    std::vector<std::vector<uint32_t>> v(n);
    std::vector<std::unique_ptr<thc::transport::Request>> req(n);
    for (int r = 0; r < n; ++r) {
      v[r] = {static_cast<uint32_t>(r), 1u};
      req[r] = reds[r]->start_sum(v[r].data(), count, IntType::kU32);
    }
    int left = n;
    for (int sweep = 0; sweep < 1000 && left > 0; ++sweep) {
      left = 0;
      for (int r = 0; r < n; ++r)
        if (!req[r]->test()) ++left;
    }
    ASSERT_EQ(left, 0) << "n=" << n << ": " << left << " ranks never completed";
    const uint32_t want0 = static_cast<uint32_t>(static_cast<uint64_t>(n) * (n - 1) / 2);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(v[r][0], want0) << "n=" << n << " rank " << r;
      ASSERT_EQ(v[r][1], static_cast<uint32_t>(n)) << "n=" << n << " rank " << r;
    }
  }
}

// THC_TIMEOUT_MS bounds how long a wait goes without progress (the message says "no progress
// within"), not a whole operation: a peer that is slow but keeps sending must not be given up
// on. Rank 1 drives its side only every 20 ms, a few messages at a time (the send window), so
// the operation takes seconds while rank 0 never waits 500 ms for a message.
TEST(SchedulesFaults, TimeoutBoundsInactivityNotTheWholeOperation) {
  ScheduleOptions opt;
  opt.piece_bytes = 64;  // 16 u32 per piece: 300 pieces per segment, >= 150 rounds on rank 1
  const uint64_t count = 2 * 300 * 16;
  const int n = 2;
  std::vector<std::vector<uint8_t>> v(n);
  for (int r = 0; r < n; ++r) v[r] = random_ints(count, IntType::kU32, 40 + r);
  const std::vector<std::vector<uint8_t>> in = v;
  int rounds = 0;
  run(n, opt, 500, [&](int r, Reducer& red) {
    auto req = red.start_sum(v[r].data(), count, IntType::kU32);
    if (r == 0) {
      req->wait();
      return;
    }
    while (!req->test() && rounds < 1000) {  // (bounded: rank 0 may have given up)
      ++rounds;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  // 20 ms per round: the operation outlasted the bound several times over (a fact of the setup,
  // counted, not timed)
  EXPECT_GE(rounds * 20, 4 * 500);
  EXPECT_LT(rounds, 1000) << "rank 1's side never completed";
  for (uint64_t i = 0; i < count; ++i)
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(load(IntType::kU32, v[r].data(), i),
                wrap(IntType::kU32, load(IntType::kU32, in[0].data(), i) + load(IntType::kU32, in[1].data(), i)));
}

// b = 4, every index worth 1: a lookup sum counts the ranks.
LookupTable ones4() {
  LookupTable t;
  t.bits = 4;
  t.values.assign(16, 1);
  return t;
}

// A peer that never takes part in an adopted lookup sum: a timeout naming it, and the indices'
// buffer (now the request's) outlives sends that may still read it (ASan would see otherwise).
TEST(SchedulesFaults, AMissingPeerDuringAnAdoptedLookupSumIsATimeout) {
  const int n = 3;
  const LookupTable table = ones4();
  std::vector<Status> st(n, Status::kSuccess);
  std::vector<std::string> msg(n);
  std::atomic<int> finished{0};
  run(n, ScheduleOptions{}, 300, [&](int r, Reducer& red) {
    if (r == 2) {
      while (finished.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    std::vector<uint8_t> in = red.input_buffer(200000);
    std::memset(in.data(), 0x35, 200000);
    try {
      red.start_lookup_sum_adopt(std::move(in), 400000, table, nullptr, IntType::kU8, nullptr)->wait();
    } catch (const Error& e) {
      st[r] = e.status();
      msg[r] = e.what();
    }
    finished++;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], Status::kTimeout) << msg[r];
    const size_t a = msg[r].find("rank(s) "), b = msg[r].find(" (a peer died");
    ASSERT_TRUE(a != std::string::npos && b != std::string::npos && a < b) << msg[r];
    const std::string named = msg[r].substr(a + 8, b - a - 8) + ",";  // e.g. "2, 1,"
    EXPECT_TRUE(named.rfind("2,", 0) == 0 || named.find(" 2,") != std::string::npos) << msg[r];
  }
}

// A buffer too small for the indices is refused, naming both sizes; the reducer stays usable.
TEST(SchedulesFaults, AnAdoptedBufferTooSmallIsRefused) {
  const LookupTable table = ones4();
  run(2, ScheduleOptions{}, 30000, [&](int, Reducer& red) {
    try {
      red.start_lookup_sum_adopt(std::vector<uint8_t>(49), 100, table, nullptr, IntType::kU8, nullptr);
      ADD_FAILURE() << "expected kInvalidArgument";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("49 bytes, 50 needed"), std::string::npos) << e.what();
    }
    std::vector<uint8_t> in = red.input_buffer(50);
    std::memset(in.data(), 0x11, 50);
    auto req = red.start_lookup_sum_adopt(std::move(in), 100, table, nullptr, IntType::kU8, nullptr);
    req->wait();
    const auto* p = static_cast<const uint8_t*>(req->lent_sums());
    for (int i = 0; i < 100; ++i) ASSERT_EQ(p[i], 2);
  });
}

TEST(SchedulesFaults, BadTableIsRefused) {
  run(1, ScheduleOptions{}, 1000, [&](int, Reducer& red) {
    LookupTable t;
    t.bits = 4;
    t.values.assign(15, 0);  // 2^4 needed
    uint8_t p[8] = {}, s[16] = {};
    EXPECT_THROW(red.start_lookup_sum(p, 16, t, s, IntType::kU8, nullptr), Error);
  });
}

}  // namespace

// lookup_add (the lookup-and-add every index-form backend runs) against the per-element
// definition: every integer type, every index width, even and odd first elements, lengths around
// the 64-bit word boundaries of the 4-bit fast path, table values that wrap (negative, > 255).
TEST(LookupAdd, MatchesPerElementDefinition) {
  std::mt19937 rng(20261204);
  for (IntType t : kTypes) {
    const size_t w = width(t);
    for (int bits = 1; bits <= 8; ++bits) {
      LookupTable tb;
      tb.bits = bits;
      for (int i = 0; i < (1 << bits); ++i) tb.values.push_back(static_cast<int32_t>(rng() % 70000) - 35000);
      for (uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{37}, uint64_t{64}}) {
        for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{63}, uint64_t{64}, uint64_t{65}, uint64_t{71}, uint64_t{1000}}) {
          std::vector<uint8_t> packed((first + n) * bits / 8 + 2);
          for (auto& b : packed) b = static_cast<uint8_t>(rng());
          std::vector<uint8_t> dst(n * w), want(n * w);
          for (auto& b : dst) b = static_cast<uint8_t>(rng());
          want = dst;
          for (uint64_t i = 0; i < n; ++i) {
            const int64_t add = tb.values[thc::elem::packed_get(packed.data(), first + i, bits)];
            uint64_t cur = 0;
            std::memcpy(&cur, want.data() + i * w, w);
            cur += static_cast<uint64_t>(add);
            std::memcpy(want.data() + i * w, &cur, w);  // little endian: the low w bytes
          }
          thc::transport::lookup_add(tb, packed.data(), first, n, t, dst.data());
          ASSERT_EQ(dst, want) << "type " << thc::codec::int_name(t) << " bits " << bits << " first " << first << " n " << n;
        }
      }
    }
  }
}

// THC_CHUNK_GROWTH: unset or empty 1, 1..64 taken, anything else an error naming the variable.
TEST(SchedulesOptions, ChunkGrowthFromTheEnvironment) {
  unsetenv("THC_CHUNK_GROWTH");
  EXPECT_EQ(thc::transport::default_chunk_growth(), 1u);
  EXPECT_EQ(ScheduleOptions{}.chunk_growth, 1u);
  setenv("THC_CHUNK_GROWTH", "4", 1);
  EXPECT_EQ(thc::transport::default_chunk_growth(), 4u);
  EXPECT_EQ(ScheduleOptions{}.chunk_growth, 4u);
  for (const char* bad : {"0", "65", "-2", "4x", "x", "99999999999999999999"}) {
    setenv("THC_CHUNK_GROWTH", bad, 1);
    try {
      (void)thc::transport::default_chunk_growth();
      ADD_FAILURE() << "THC_CHUNK_GROWTH=" << bad << " was taken";
    } catch (const thc::Error& e) {
      EXPECT_NE(std::string(e.what()).find("THC_CHUNK_GROWTH"), std::string::npos) << e.what();
    }
  }
  unsetenv("THC_CHUNK_GROWTH");
}
