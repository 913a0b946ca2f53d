// The pipeline's chunking (plan_rules.h chunk_runs): what every rank derives alike from the call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "collectives/engine/plan_rules.h"

namespace {

using thc::engine::chunk_runs;

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
