// The engine's host codec: what it encodes, and how often it lets the transport progress.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/engine/host_codec.h"

namespace {

using thc::codec::CallRng;
using thc::codec::Codec;
using thc::codec::Layout;
using thc::codec::Params;
using thc::engine::HostCodec;

// THC at its defaults (b = 4, g = 30, p = 1/32) with blocks of 2^block_log2.
Params thc4(int block_log2) {
  Params p;
  p.block_log2 = block_log2;
  return p;
}

struct Encoded {
  std::vector<uint8_t> packed;
  int progress_calls = 0;
};

// Encodes `blocks` whole blocks of random values in packed form through HostCodec.
Encoded encode(const Codec& c, HostCodec& hc, uint64_t blocks, bool with_progress = true) {
  const uint64_t count = blocks * c.block();
  std::vector<float> x(count);
  std::mt19937 gen(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (auto& v : x) v = d(gen);
  const Layout l = c.layout(count);
  std::vector<float> stats(l.nblocks);
  EXPECT_TRUE(hc.prelude(c, x.data(), count, stats.data()));
  Encoded e;
  e.packed.assign(count * static_cast<uint64_t>(c.index_bits()) / 8, 0);
  Codec::EncodeOut out;
  out.packed = e.packed.data();
  std::function<void()> progress;
  if (with_progress) progress = [&e] { ++e.progress_calls; };
  hc.encode(c, l, 0, l.nblocks, x.data(), stats.data(), CallRng{3, 0, 1}, out, progress);
  return e;
}

// Each progress call is a poll of every socket of the transport (MPI_Testsome -> opal_progress
// -> poll(2)) and whatever the schedules do on it: once per 2^14-element block it was ~3300
// polls per 64 MB call and rank on the TCP testbed. Now once per HostCodec::kProgressElems
// elements the caller encodes, whatever the block size.
TEST(HostCodecProgress, OncePerProgressSpanOfElementsNotPerBlock) {
  static_assert(HostCodec::kProgressElems == uint64_t{1} << 16, "the spans below assume 2^16");
  HostCodec one(1);
  {
    const Codec c(thc4(14), 4);
    EXPECT_EQ(encode(c, one, 32).progress_calls, 8);  // 2^19 elements
    EXPECT_EQ(encode(c, one, 3).progress_calls, 0);   // under one span: the caller's wait progresses
    EXPECT_EQ(encode(c, one, 5).progress_calls, 1);
  }
  {
    const Codec c(thc4(10), 4);
    EXPECT_EQ(encode(c, one, 200).progress_calls, 3);  // 204800 elements
  }
  {
    const Codec c(thc4(16), 4);
    EXPECT_EQ(encode(c, one, 3).progress_calls, 3);  // a block per span
  }
}

// With helper threads only the caller progresses, and at most once per span it encoded itself.
TEST(HostCodecProgress, ThreadsProgressOnlyFromTheCallerAndNoMoreOften) {
  HostCodec two(2);
  const Codec c(thc4(14), 4);
  const Encoded e = encode(c, two, 64);
  EXPECT_LE(e.progress_calls, 16);
}

// The gate changes when the transport is polled, never what is encoded.
TEST(HostCodecProgress, CodesDoNotDependOnProgressOrThreads) {
  const Codec c(thc4(14), 4);
  HostCodec one(1), two(2);
  const auto a = encode(c, one, 9, true).packed;
  EXPECT_EQ(a, encode(c, one, 9, false).packed);
  EXPECT_EQ(a, encode(c, two, 9, true).packed);
}

}  // namespace
