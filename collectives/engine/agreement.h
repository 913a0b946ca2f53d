#pragma once
// The agreement words of a collective's first exchange, shared by the engine's prelude and the
// hierarchical communicator: each field travels as (v, ~v) in 2 + 2 u32 words, so under an
// element-wise MAX the pair stays complementary only if every rank has the same v.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace thc::engine {

inline void put_field(uint32_t* w, uint64_t v) {
  w[0] = static_cast<uint32_t>(v);
  w[1] = static_cast<uint32_t>(v >> 32);
  w[2] = ~w[0];
  w[3] = ~w[1];
}
inline bool field_agrees(const uint32_t* w) { return w[0] == ~w[2] && w[1] == ~w[3]; }

// Which ranks raised a flag, in two words that the MAX combines exactly: the lowest rank (as ~r)
// and the highest (as r + 1); zeros: none. (A bitmap does not survive a MAX: only its highest
// bit would.)
inline void put_rank(uint32_t* w, int rank) {
  w[0] = ~static_cast<uint32_t>(rank);
  w[1] = static_cast<uint32_t>(rank) + 1;
}
inline bool any_rank(const uint32_t* w) { return w[1] != 0; }

// Names the ranks that raised a flag, from their put_rank words after the exchange (`span`):
// "rank 3 (why)" for one. For several, every rank takes part in one more exchange of a word per
// rank (`exchange`; null where the backend cannot carry one, then the lowest and the highest are
// named), `mine` being this rank's word (0: not one of them), and each named rank is described
// by its word (`describe`: "" or " (why)"). `single` is the word of the only rank when there is
// one (the MAX of the words). Every rank calls this alike: whether the second exchange happens
// depends only on the combined words.
inline std::string name_ranks(const uint32_t* span, int n, int rank, uint32_t mine, uint32_t single,
                              const std::function<void(uint32_t*, size_t)>& exchange,
                              const std::function<std::string(uint32_t)>& describe) {
  if (!any_rank(span)) return "no rank";
  const int lo = static_cast<int>(~span[0]), hi = static_cast<int>(span[1] - 1);
  if (lo == hi) return "rank " + std::to_string(lo) + describe(single);
  const std::string range =
      "ranks " + std::to_string(lo) + " to " + std::to_string(hi) + " (the lowest and highest of them)";
  if (!exchange || n <= 0 || rank < 0 || rank >= n) return range;
  std::vector<uint32_t> each(static_cast<size_t>(n), 0);
  each[static_cast<size_t>(rank)] = mine;
  try {
    exchange(each.data(), each.size());
  } catch (const Error&) {
    return range;
  }
  constexpr int kShown = 16;
  std::string out;
  int named = 0;
  for (int r = 0; r < n; ++r) {
    if (each[static_cast<size_t>(r)] == 0) continue;
    if (named < kShown) out += std::string(named ? ", " : "") + "rank " + std::to_string(r) + describe(each[static_cast<size_t>(r)]);
    ++named;
  }
  if (named > kShown) out += ", ... (" + std::to_string(named) + " ranks)";
  return named ? out : range;
}

// " (why)" for a status word.
inline std::string status_word(uint32_t s) { return " (" + std::string(status_text(static_cast<Status>(s))) + ")"; }

}  // namespace thc::engine
