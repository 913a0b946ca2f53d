// The aggregator's lane arithmetic (aggregator/lanes.h) against a plain model: every register
// width, every index width, counts that are and are not multiples of the vector widths,
// subtraction, wrap-around (sums wrap in the register, never saturate), registers past the count
// untouched, and the big-endian result layout; the Highway kernel (4-bit indices into u8) on every
// target this machine runs (hwy::SetSupportedTargetsForTest).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "switch_offload/aggregator/lanes.h"
#include "switch_offload/protocol/wire.h"
#include "tests/hwy_targets.h"

namespace {

// Every Highway target this CPU runs (tests/hwy_targets.h).
template <class F>
void for_each_target(F f) {
  thc::test::for_each_hwy_target(f, nullptr);
}

using namespace thc::switch_offload;

uint32_t reg(const std::vector<uint8_t>& r, int w, int i) {
  uint32_t v = 0;
  std::memcpy(&v, r.data() + static_cast<size_t>(i) * w, static_cast<size_t>(w));  // little-endian hosts
  return v;
}

TEST(AggregatorLanes, LookupMatchesTheModelForEveryWidth) {
  for_each_target([] {
  std::mt19937 rng(11);
  for (int w : {1, 2, 4})
    for (int bits = 1; bits <= 8; ++bits)
      for (int count : {1, 7, 8, 31, 32, 33, 64, 100, 127, 128, 129, 255, 256, 257, 1407, 1408, 2816}) {
        std::vector<int32_t> table(256);
        for (auto& t : table) t = static_cast<int32_t>(rng()) >> (rng() % 24);
        std::vector<uint8_t> codes(static_cast<size_t>(count));
        for (auto& c : codes) c = static_cast<uint8_t>(rng() & ((1u << bits) - 1));
        // Exactly the payload's bytes (a datagram ends there): under ASan a read past them fails.
        std::vector<uint8_t> pl((static_cast<size_t>(count) * bits + 7) / 8, 0);
        for (int i = 0; i < count; ++i)
          for (int k = 0; k < bits; ++k)
            if ((codes[i] >> k) & 1) pl[(i * bits + k) / 8] |= static_cast<uint8_t>(1u << ((i * bits + k) % 8));
        std::vector<uint8_t> regs(static_cast<size_t>(count) * w + 16, 0xAB);
        std::vector<uint32_t> model(static_cast<size_t>(count));
        for (int i = 0; i < count; ++i) {
          const uint32_t start = rng();
          std::memcpy(regs.data() + static_cast<size_t>(i) * w, &start, static_cast<size_t>(w));
          model[i] = start;
        }
        const uint32_t mask = w == 4 ? ~0u : (1u << (8 * w)) - 1;
        lanes::add_lookup(regs.data(), w, pl.data(), count, bits, table.data(), false);
        for (int i = 0; i < count; ++i) model[i] += static_cast<uint32_t>(table[codes[i]]);
        for (int i = 0; i < count; ++i)
          ASSERT_EQ(reg(regs, w, i), model[i] & mask) << "w=" << w << " b=" << bits << " count=" << count << " i=" << i;
        // Subtraction is the exact inverse.
        lanes::add_lookup(regs.data(), w, pl.data(), count, bits, table.data(), true);
        for (int i = 0; i < count; ++i) model[i] -= static_cast<uint32_t>(table[codes[i]]);
        for (int i = 0; i < count; ++i) ASSERT_EQ(reg(regs, w, i), model[i] & mask);
        for (size_t k = static_cast<size_t>(count) * w; k < regs.size(); ++k)
          ASSERT_EQ(regs[k], 0xAB) << "a register past the count was written: w=" << w << " b=" << bits << " count=" << count;
      }
  });
}

// The first contribution written (set_*) equals it added onto zeros, whatever the registers held
// before; registers past the count untouched.
TEST(AggregatorLanes, SetIsAddOntoZeros) {
  for_each_target([] {
  std::mt19937 rng(13);
  for (int w : {1, 2, 4})
    for (int bits = 0; bits <= 8; ++bits)  // 0: set_values
      for (int count : {1, 7, 31, 32, 33, 64, 127, 128, 129, 257, 1407, 1408, 2816}) {
        std::vector<int32_t> table(256);
        for (auto& t : table) t = static_cast<int32_t>(rng()) >> (rng() % 24);
        const size_t plen = bits ? (static_cast<size_t>(count) * bits + 7) / 8 : static_cast<size_t>(count) * w;
        std::vector<uint8_t> pl(plen);
        for (auto& b : pl) b = static_cast<uint8_t>(rng());
        std::vector<uint8_t> want(static_cast<size_t>(count) * w + 16, 0), got(want.size());
        for (auto& b : got) b = static_cast<uint8_t>(rng());  // stale bytes of an earlier use
        std::fill(want.begin() + static_cast<long>(count) * w, want.end(), 0);
        std::copy(got.begin() + static_cast<long>(count) * w, got.end(), want.begin() + static_cast<long>(count) * w);
        if (bits) {
          lanes::add_lookup(want.data(), w, pl.data(), count, bits, table.data(), false);
          lanes::set_lookup(got.data(), w, pl.data(), count, bits, table.data());
        } else {
          lanes::add_values(want.data(), w, pl.data(), count, false);
          lanes::set_values(got.data(), w, pl.data(), count);
        }
        ASSERT_EQ(got, want) << "w=" << w << " b=" << bits << " count=" << count;
      }
  });
}

TEST(AggregatorLanes, ValuesMaxAndStore) {
  std::mt19937 rng(5);
  for (int w : {1, 2, 4})
    for (int count : {1, 15, 16, 17, 320, 1408}) {
      std::vector<uint8_t> pl(static_cast<size_t>(count) * w), regs(static_cast<size_t>(count) * 4, 0);
      std::vector<uint32_t> vals(static_cast<size_t>(count));
      for (int i = 0; i < count; ++i) {
        vals[i] = rng();
        for (int b = 0; b < w; ++b) pl[i * w + b] = static_cast<uint8_t>(vals[i] >> (8 * (w - 1 - b)));
      }
      lanes::add_values(regs.data(), w, pl.data(), count, false);
      lanes::add_values(regs.data(), w, pl.data(), count, false);
      const uint32_t mask = w == 4 ? ~0u : (1u << (8 * w)) - 1;
      std::vector<uint8_t> out(static_cast<size_t>(count) * w);
      lanes::store(regs.data(), w, count, out.data());
      for (int i = 0; i < count; ++i) {
        ASSERT_EQ(reg(regs, w, i), (2 * vals[i]) & mask);
        uint32_t be = 0;
        for (int b = 0; b < w; ++b) be = (be << 8) | out[i * w + b];
        ASSERT_EQ(be, (2 * vals[i]) & mask) << "store writes big-endian lanes";
      }
      lanes::add_values(regs.data(), w, pl.data(), count, true);
      for (int i = 0; i < count; ++i) ASSERT_EQ(reg(regs, w, i), vals[i] & mask);
    }
  std::vector<uint8_t> regs(12, 0), pl(12);
  const uint32_t a[3] = {5, 0xFFFFFFFF, 7}, b[3] = {9, 3, 7};
  for (int i = 0; i < 3; ++i) proto::store_be32(pl.data() + 4 * i, a[i]);
  lanes::max_u32(regs.data(), pl.data(), 3);
  for (int i = 0; i < 3; ++i) proto::store_be32(pl.data() + 4 * i, b[i]);
  lanes::max_u32(regs.data(), pl.data(), 3);
  EXPECT_EQ(reg(regs, 4, 0), 9u);
  EXPECT_EQ(reg(regs, 4, 1), 0xFFFFFFFFu);
  EXPECT_EQ(reg(regs, 4, 2), 7u);
}

}  // namespace
