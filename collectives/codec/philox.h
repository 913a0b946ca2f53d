// The one definition of how thc draws random numbers. Host codec and CUDA kernels both include
// this header, so the same (seed, rank, round, block, element) gives the same bits everywhere.
//
// Generator: Philox4x32-10 (Random123), counter-based: every draw is a pure function of
// (key, counter), so any element's randomness can be computed independently and in any order.
// One call returns 4 words of 32 bits.
//
// Key (2 x 32 bit):
//   k0 = low 32 bits of the communicator seed
//   k1 = high 32 bits of the seed XOR stream,
//        stream = kSharedStream (0)   for randomness all ranks must agree on (RHT signs),
//        stream = rank + 1            for per-rank randomness (stochastic rounding).
// Counter (4 x 32 bit):
//   c0 = group index inside the block: the 8-element group (stochastic rounding, kRoundGroup)
//        or the 128-element group (RHT signs)
//   c1 = low 32 bits of the global block index (block = offset / block_size over the whole call)
//   c2 = round: the communicator's collective-call sequence number (so every call uses fresh
//        randomness and error feedback sees independent noise across rounds)
//   c3 = purpose << 24 | bits 32..55 of the block index
// Purposes: kPurposeSigns (RHT diagonal), kPurposeRound (stochastic rounding of the codes),
// kPurposeRecompress (bidirectional Cnat re-compression of shard sums), kPurposeBaseline
// (perf/thc_nmse baselines).
//
// Bits per use:
//   RHT signs            element 128 g + j of a block: bit j & 31 of word j >> 5 of group g.
//   stochastic rounding  element 8 g + k of a block: 16 bits, bits 16 (k & 1) .. 16 (k & 1) + 15
//                        of word k >> 1 of group g (round_bits), i.e. the call's 128 bits read as
//                        eight little-endian u16 in element order. The 16 bits j become the
//                        uniform u = (2 j + 1) / 2^17 (round_unit): the midpoints of 2^16 equal
//                        cells of [0, 1), exact in float. Rounding goes up iff u < p (p the
//                        probability of going up), so P(up) = p rounded to a multiple of 2^-16
//                        (halves down): exact for p = 0 and p = 1, |P(up) - p| <= 2^-17 in
//                        between, and the error changes sign with p's position in its 2^-16 cell
//                        rather than always pointing up (see round_unit).
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

// The four words of one Philox call: counter (group, block, round, purpose), key of s.
THC_HD r123::Philox4x32::ctr_type draw4(const r123::Philox4x32::key_type& key, const Stream& s,
                                        uint32_t purpose, uint64_t block, uint32_t group) {
  r123::Philox4x32 g;
  return g(make_ctr(s, purpose, block, group), key);
}

// Uniform in [0, 1) with 24 bits of resolution; exact in float (perf/thc_nmse baselines).
THC_HD float to_unit(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

// Stochastic rounding: elements per Philox call, and the 16 bits of element k (0..7) of a group.
constexpr uint32_t kRoundGroup = 8;
THC_HD uint32_t round_bits(const r123::Philox4x32::ctr_type& r, uint32_t k) {
  return (r.v[k >> 1] >> (16 * (k & 1))) & 0xFFFFu;
}
// The rounding uniform of 16 draw bits j: (2 j + 1) / 2^17. Why midpoints and 16 bits: 16 bits
// halve the Philox work of 32-bit draws, which bound the encoders; with u on the left ends
// j / 2^16, P(up) would be p rounded *up* to 2^-16 for every element, a bias of one sign that
// the aggregate's sum over workers and the inverse RHT (which folds a constant offset of the
// rotated block into its first element) would accumulate. On the midpoints the rounding error of
// P(up) is at most 2^-17 and of either sign. Its effect on an element's expected value is at
// most 2^-17 of one grid step (THC) or of one power-of-two gap (Cnat); squared, 2^-34 step^2
// against the rounding variance p (1 - p) step^2 (and p itself when p < 2^-17, where P(up) = 0).
THC_HD float round_unit(uint32_t j) { return static_cast<float>(2 * j + 1) * (1.0f / 131072.0f); }

}  // namespace thc::rng
