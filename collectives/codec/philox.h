// The one definition of how thc draws random numbers. Host codec and CUDA kernels both include
// this header, so the same (seed, rank, round, block, element) gives the same bits everywhere.
//
// Generator: Philox4x32-10 (Random123), counter-based: every draw is a pure function of
// (key, counter), so any element's randomness can be computed independently and in any order.
//
// Key (2 x 32 bit):
//   k0 = low 32 bits of the communicator seed
//   k1 = high 32 bits of the seed XOR stream,
//        stream = kSharedStream (0)   for randomness all ranks must agree on (RHT signs),
//        stream = rank + 1            for per-rank randomness (stochastic rounding).
// Counter (4 x 32 bit):
//   c0 = index of the 4-element group (stochastic rounding) or of the 128-element group (RHT
//        signs) inside the block
//   c1 = low 32 bits of the global block index (block = offset / block_size over the whole call)
//   c2 = round: the communicator's collective-call sequence number (so every call uses fresh
//        randomness and error feedback sees independent noise across rounds)
//   c3 = purpose << 24 | bits 32..55 of the block index
// Purposes: kPurposeSigns (RHT diagonal), kPurposeRound (stochastic rounding of the codes),
// kPurposeRecompress (bidirectional Cnat re-compression of shard sums), kPurposeBaseline
// (perf/thc_nmse baselines).
#pragma once

#include <Random123/philox.h>

#include <cstdint>

#include "collectives/codec/hd.h"

namespace thc::rng {

constexpr uint32_t kSharedStream = 0;
constexpr uint32_t kPurposeSigns = 1;
constexpr uint32_t kPurposeRound = 2;
constexpr uint32_t kPurposeRecompress = 3;
constexpr uint32_t kPurposeBaseline = 4;

struct Stream {
  uint64_t seed;
  uint32_t stream;  // kSharedStream or rank + 1
  uint32_t round;
};

THC_HD r123::Philox4x32::key_type make_key(const Stream& s) {
  r123::Philox4x32::key_type k = {{static_cast<uint32_t>(s.seed),
                                   static_cast<uint32_t>(s.seed >> 32) ^ s.stream}};
  return k;
}

THC_HD r123::Philox4x32::ctr_type make_ctr(const Stream& s, uint32_t purpose, uint64_t block,
                                           uint32_t group) {
  r123::Philox4x32::ctr_type c = {{group, static_cast<uint32_t>(block), s.round,
                                   (purpose << 24) | (static_cast<uint32_t>(block >> 32) & 0xFFFFFFu)}};
  return c;
}

// Four 32-bit draws for elements 4*group .. 4*group+3 of `block`.
THC_HD r123::Philox4x32::ctr_type draw4(const r123::Philox4x32::key_type& key, const Stream& s,
                                        uint32_t purpose, uint64_t block, uint32_t group) {
  r123::Philox4x32 g;
  return g(make_ctr(s, purpose, block, group), key);
}

// Uniform in [0, 1) with 24 bits of resolution; exact in float. Stochastic rounding "goes up"
// iff u < frac, so P(up) = ceil(frac * 2^24) / 2^24: bias at most 2^-24 of one grid step.
THC_HD float to_unit(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

}  // namespace thc::rng
