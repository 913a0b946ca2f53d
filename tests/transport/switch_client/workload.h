// A deterministic mix of Reducer operations (MAX prelude, value sums of every integer type,
// lookup sums with several tables, pipelined requests, table-id recycling) whose exact result
// is computed locally. Thread tests, process tests (thc_udp_worker) and the fault tests all run
// this one plan, so "bit-identical to the lossless run and to the exact sum" is one comparison.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "transport/reducer.h"

namespace thc::test {

using transport::IntType;
using transport::LookupTable;
using transport::Reducer;
using transport::Request;

inline uint64_t wl_mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline size_t wl_size(IntType t) {
  switch (t) {
    case IntType::kU8: case IntType::kI8: return 1;
    case IntType::kU16: case IntType::kI16: return 2;
    default: return 4;
  }
}

struct WlOp {
  enum Kind { kMax, kSum, kLookup } kind;
  IntType type;
  uint64_t count;
  int bits;      // lookup
  int table;     // lookup: table number (values from wl_table)
  bool pipeline; // started together with the next op, both waited afterwards
};

inline std::vector<WlOp> wl_plan(uint64_t n) {
  return {
      {WlOp::kMax, IntType::kU32, 700, 0, 0, false},
      {WlOp::kSum, IntType::kU8, n, 0, 0, false},
      {WlOp::kSum, IntType::kI16, n + 1, 0, 0, false},
      {WlOp::kSum, IntType::kU32, n, 0, 0, true},
      {WlOp::kSum, IntType::kI32, n / 2 + 3, 0, 0, false},
      {WlOp::kLookup, IntType::kU8, n, 4, 0, true},
      {WlOp::kLookup, IntType::kI32, n + 5, 3, 1, false},
      {WlOp::kLookup, IntType::kU8, 0, 4, 0, false},
      // Five distinct b=2 tables: more than the job's 4 table ids, so ids are recycled.
      {WlOp::kLookup, IntType::kU16, 300, 2, 2, false},
      {WlOp::kLookup, IntType::kU16, 300, 2, 3, false},
      {WlOp::kLookup, IntType::kU16, 300, 2, 4, true},
      {WlOp::kLookup, IntType::kU16, 300, 2, 5, false},
      {WlOp::kLookup, IntType::kU16, 300, 2, 6, false},
      {WlOp::kLookup, IntType::kU16, 600, 4, 0, false},
      {WlOp::kLookup, IntType::kI16, 1000, 8, 7, false},
      // 32-bit sums of 4-bit indices: a switch job sends them in the value form (CONTRACT.md).
      {WlOp::kLookup, IntType::kU32, 500, 4, 0, false},
      {WlOp::kSum, IntType::kU8, 1, 0, 0, false},
  };
}

inline LookupTable wl_table(int id, int bits) {
  LookupTable t;
  t.bits = bits;
  const int n = 1 << bits;
  static const int32_t thc16[16] = {0, 4, 7, 9, 11, 13, 14, 15, 15, 16, 17, 19, 21, 23, 26, 30};
  for (int z = 0; z < n; ++z) {
    int32_t v;
    if (id == 0 && bits == 4) v = thc16[z];
    else if (id == 1) v = -1000 + 777 * z;                  // signed, Cnat-like spread
    else if (id == 7) v = (z - 128) * 3;                    // 256 entries, signed
    else v = (z * (id + 1)) % 11;                           // small distinct b=2 tables
    t.values.push_back(v);
  }
  return t;
}

inline uint32_t wl_value(int rank, size_t op, uint64_t i, uint64_t salt) {
  return static_cast<uint32_t>(wl_mix(static_cast<uint64_t>(rank) + 1, op * 1000003 + salt, i));
}

// Input bytes of one op for one rank: values (sum/max) in host order, or packed indices.
inline std::vector<uint8_t> wl_input(const WlOp& op, size_t k, int rank, uint64_t salt) {
  if (op.kind == WlOp::kLookup) {
    std::vector<uint8_t> p((op.count * op.bits + 7) / 8 + 1, 0);
    for (uint64_t i = 0; i < op.count; ++i) {
      const uint32_t z = wl_value(rank, k, i, salt) & ((1u << op.bits) - 1);
      const uint64_t bit = i * op.bits;
      p[bit / 8] |= static_cast<uint8_t>(z << (bit % 8));
      if (bit % 8 + op.bits > 8) p[bit / 8 + 1] |= static_cast<uint8_t>(z >> (8 - bit % 8));
    }
    return p;
  }
  const size_t w = wl_size(op.type);
  std::vector<uint8_t> v(op.count * w);
  for (uint64_t i = 0; i < op.count; ++i) {
    const uint32_t x = wl_value(rank, k, i, salt);
    std::memcpy(v.data() + i * w, &x, w);  // little-endian host: low bytes
  }
  return v;
}

inline std::vector<uint8_t> wl_expected(int world, uint64_t n, uint64_t salt) {
  std::vector<uint8_t> out;
  const auto plan = wl_plan(n);
  for (size_t k = 0; k < plan.size(); ++k) {
    const WlOp& op = plan[k];
    const size_t w = op.kind == WlOp::kMax ? 4 : wl_size(op.type);
    std::vector<uint32_t> acc(op.count, 0);
    const LookupTable t = op.kind == WlOp::kLookup ? wl_table(op.table, op.bits) : LookupTable{};
    for (int r = 0; r < world; ++r) {
      const auto in = wl_input(op, k, r, salt);
      for (uint64_t i = 0; i < op.count; ++i) {
        if (op.kind == WlOp::kLookup) {
          const uint64_t bit = i * op.bits;
          uint32_t z = in[bit / 8] | (static_cast<uint32_t>(in[bit / 8 + 1]) << 8);
          z = (z >> (bit % 8)) & ((1u << op.bits) - 1);
          acc[i] += static_cast<uint32_t>(t.values[z]);
        } else {
          uint32_t x = 0;
          std::memcpy(&x, in.data() + i * w, w);
          acc[i] = op.kind == WlOp::kMax ? (r == 0 ? x : std::max(acc[i], x)) : acc[i] + x;
        }
      }
    }
    for (uint64_t i = 0; i < op.count; ++i) {
      uint8_t b[4];
      std::memcpy(b, &acc[i], 4);
      out.insert(out.end(), b, b + w);
    }
  }
  return out;
}

struct WlResult {
  std::vector<uint8_t> bytes;
  bool all_full = true;  // every request reported world contributors and self_counted
};

// Run the plan on red (as rank red.rank()); returns every result byte in plan order.
inline WlResult wl_run(Reducer& red, uint64_t n, uint64_t salt) {
  WlResult res;
  const auto plan = wl_plan(n);
  std::vector<std::vector<uint8_t>> inputs(plan.size()), outputs(plan.size());
  std::vector<LookupTable> tables(plan.size());
  std::vector<std::unique_ptr<Request>> pending;
  std::vector<size_t> pending_k;
  auto finish = [&] {
    for (size_t i = 0; i < pending.size(); ++i) {
      pending[i]->wait();
      if (pending[i]->contributors() != red.size() || !pending[i]->self_counted()) res.all_full = false;
    }
    pending.clear();
    pending_k.clear();
  };
  for (size_t k = 0; k < plan.size(); ++k) {
    const WlOp& op = plan[k];
    inputs[k] = wl_input(op, k, red.rank(), salt);
    switch (op.kind) {
      case WlOp::kMax: {
        std::vector<uint32_t> v(op.count);
        std::memcpy(v.data(), inputs[k].data(), op.count * 4);
        red.max_u32(v.data(), v.size());
        outputs[k].resize(op.count * 4);
        std::memcpy(outputs[k].data(), v.data(), op.count * 4);
        break;
      }
      case WlOp::kSum:
        outputs[k] = inputs[k];  // in place
        pending.push_back(red.start_sum(outputs[k].data(), op.count, op.type));
        break;
      case WlOp::kLookup:
        tables[k] = wl_table(op.table, op.bits);
        outputs[k].assign(op.count * wl_size(op.type), 0xCC);
        pending.push_back(red.start_lookup_sum(inputs[k].data(), op.count, tables[k], outputs[k].data(), op.type, nullptr));
        break;
    }
    if (!op.pipeline) finish();
  }
  finish();
  for (auto& o : outputs) res.bytes.insert(res.bytes.end(), o.begin(), o.end());
  return res;
}

}  // namespace thc::test
