// The pipeline's chunking (plan_rules.h chunk_runs): what every rank derives alike from the call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "collectives/engine/plan_rules.h"

namespace {

using thc::engine::chunk_runs;
using thc::engine::ps_chunk_blocks;

// A PS shard's message just over the transport's eager limit: at 1 MB chunks (16 blocks of
// 16 Ki) and 4 ranks, 8-bit sums are 64 KiB, over Open MPI's TCP limit less its header.
TEST(PsChunkBlocks, AShardMessageJustOverTheEagerLimitShrinksTheChunkUntilItFits) {
  auto one_byte = [](uint64_t e) { return e; };
  EXPECT_EQ(ps_chunk_blocks(16, 16384, 4, 65536 - 256, one_byte), 15u);
  // Under the limit, no limit, or far over it (a rendezvous amortised): the configured chunk.
  EXPECT_EQ(ps_chunk_blocks(16, 16384, 4, 65536, one_byte), 16u);
  EXPECT_EQ(ps_chunk_blocks(16, 16384, 4, 0, one_byte), 16u);
  EXPECT_EQ(ps_chunk_blocks(16, 16384, 2, 65536 - 256, one_byte), 16u);
  EXPECT_EQ(ps_chunk_blocks(16, 16384, 8, 65536 - 256, one_byte), 16u);
  EXPECT_EQ(ps_chunk_blocks(16, 16384, 1, 100, one_byte), 16u);
  // Two bytes an element (16-bit sums): 128 KiB, far over.
  EXPECT_EQ(ps_chunk_blocks(16, 16384, 4, 65536 - 256, [](uint64_t e) { return 2 * e; }), 16u);
  // Never below 7/8 of the chunk: 8 blocks of 1000 elements at 2 ranks, a limit of 3700 (4000 wanted).
  EXPECT_EQ(ps_chunk_blocks(8, 1000, 2, 3700, one_byte), 8u);
  EXPECT_EQ(ps_chunk_blocks(8, 1000, 2, 3600, one_byte), 8u);
  EXPECT_EQ(ps_chunk_blocks(8, 1000, 2, 3999, one_byte), 8u);  // 7 blocks would be 7/8: not more than it
  for (int n = 2; n <= 9; ++n)
    for (uint64_t c = 1; c <= 40; ++c)
      for (uint64_t limit : {uint64_t{1000}, uint64_t{4096}, uint64_t{65280}}) {
        const uint64_t block = 1024;
        const uint64_t got = ps_chunk_blocks(c, block, n, limit, one_byte);
        ASSERT_LE(got, c);
        ASSERT_GE(got * 8, c * 7 + (got == c ? 0 : 1)) << "n=" << n << " c=" << c;
        if (got != c) {
          const uint64_t groups = (got * block + 7) / 8;
          ASSERT_LE((groups + n - 1) / n * 8, limit) << "n=" << n << " c=" << c;
        }
      }
}

TEST(ChunkRuns, WithoutGrowthChunksAreTheConfiguredSize) {
  EXPECT_EQ(chunk_runs(0, 16, 1), (std::vector<uint64_t>{}));
  EXPECT_EQ(chunk_runs(40, 16, 1), (std::vector<uint64_t>{16, 16, 8}));
  EXPECT_EQ(chunk_runs(48, 16, 0), (std::vector<uint64_t>{16, 16, 16}));
  EXPECT_EQ(chunk_runs(5, 0, 1), (std::vector<uint64_t>{1, 1, 1, 1, 1}));
}

TEST(ChunkRuns, GrowthRampsUpAndDownAroundLargerChunks) {
  // 64 MB of float32 in blocks of 16 Ki at 1 MB chunks: 16, 32, 15 chunks of at most 64, 32, 16.
  const std::vector<uint64_t> v = chunk_runs(1024, 16, 4);
  ASSERT_GE(v.size(), 5u);
  EXPECT_EQ(v.front(), 16u);
  EXPECT_EQ(v[1], 32u);
  EXPECT_EQ(v[v.size() - 2], 32u);
  EXPECT_EQ(v.back(), 16u);
  EXPECT_EQ(v.size(), 19u);
  EXPECT_EQ(chunk_runs(16, 16, 4), (std::vector<uint64_t>{16}));
  EXPECT_EQ(chunk_runs(48, 16, 4), (std::vector<uint64_t>{16, 16, 16}));
  EXPECT_EQ(chunk_runs(64, 16, 4), (std::vector<uint64_t>{16, 32, 16}));
}

TEST(ChunkRuns, EveryBlockOnceAndNoChunkAboveTheCap) {
  for (uint64_t c : {uint64_t{1}, uint64_t{3}, uint64_t{16}})
    for (uint64_t g : {uint64_t{1}, uint64_t{2}, uint64_t{4}, uint64_t{7}})
      for (uint64_t nb = 0; nb < 300; ++nb) {
        SCOPED_TRACE("nb=" + std::to_string(nb) + " c=" + std::to_string(c) + " g=" + std::to_string(g));
        const std::vector<uint64_t> v = chunk_runs(nb, c, g);
        ASSERT_EQ(std::accumulate(v.begin(), v.end(), uint64_t{0}), nb);
        for (uint64_t x : v) {
          ASSERT_GE(x, 1u);
          ASSERT_LE(x, c * std::max<uint64_t>(g, 1));
        }
        // The ends of the pipeline never exceed the configured chunk.
        if (!v.empty()) {
          EXPECT_LE(v.front(), c);
          EXPECT_LE(v.back(), c);
        }
        // No more chunks than without growth.
        EXPECT_LE(v.size(), chunk_runs(nb, c, 1).size());
      }
}

}  // namespace
