#pragma once
// The agreement words of a collective's first exchange, shared by the engine's prelude and the
// hierarchical communicator: each field travels as (v, ~v) in 2 + 2 u32 words, so under an
// element-wise MAX the pair stays complementary only if every rank has the same v.
#include <cstdint>
#include <cstdio>
#include <string>

namespace thc::engine {

inline void put_field(uint32_t* w, uint64_t v) {
  w[0] = static_cast<uint32_t>(v);
  w[1] = static_cast<uint32_t>(v >> 32);
  w[2] = ~w[0];
  w[3] = ~w[1];
}
inline bool field_agrees(const uint32_t* w) { return w[0] == ~w[2] && w[1] == ~w[3]; }

// A bitmap of ranks (mod 32) for messages.
inline std::string rank_bitmap(uint32_t bits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", bits);
  return buf;
}

}  // namespace thc::engine
