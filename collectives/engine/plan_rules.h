#pragma once
// The rules that shape a call, shared by the host engine (engine.cc, and through its CallPlan the
// device path of cuda/engine_device.cc) and the NCCL path (cuda/nccl_api.cc), so that the same
// configuration chunks, chooses and hashes alike wherever a call runs. Pure functions of numbers:
// no codec, transport or CUDA types.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace thc::engine {

// Hash step of the configuration digests (what every rank must agree on).
inline uint64_t digest_mix(uint64_t h, uint64_t v) { return h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2)); }

// Blocks per pipelined chunk: THC_CHUNK_BYTES of float32 input, at least one block.
inline uint64_t chunk_blocks_for(int64_t chunk_bytes, uint64_t block) {
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::max<int64_t>(chunk_bytes, 4)) / 4 / block);
}

// The chunk of a PS call (index form) over a transport that sends a message of up to `limit`
// bytes without a handshake (Reducer::eager_bytes; 0: no such limit): chunk_blocks, but when the
// largest message of a shard (shard_bytes(elements): its codes or its sums, whichever is longer)
// is just over the limit (by at most an eighth), the largest chunk of more than 7/8 of
// chunk_blocks whose every shard message fits. Open MPI over TCP sends one just over its eager
// limit as a rendezvous (a handshake and a sliver of a tail) or, cut by the schedule, as two
// messages; at 1 MB chunks of 16 Ki blocks and 4 ranks a shard's 8-bit sums are exactly 64 KiB,
// and 15 blocks make them one eager message each. Every rank derives the same chunk from the
// same arguments.
template <class ShardBytes>
inline uint64_t ps_chunk_blocks(uint64_t chunk_blocks, uint64_t block, int n, uint64_t limit, ShardBytes&& shard_bytes) {
  if (limit == 0 || n < 2 || chunk_blocks < 2) return chunk_blocks;
  // The schedule's shards: multiples of 8 wire elements, the largest ceil(groups / n) groups.
  auto largest = [&](uint64_t c) {
    const uint64_t groups = (c * block + 7) / 8;
    return static_cast<uint64_t>(shard_bytes((groups + static_cast<uint64_t>(n) - 1) / static_cast<uint64_t>(n) * 8));
  };
  const uint64_t top = largest(chunk_blocks);
  if (top <= limit || top > limit + limit / 8) return chunk_blocks;
  for (uint64_t c = chunk_blocks - 1; c >= 1 && c * 8 > chunk_blocks * 7; --c)
    if (largest(c) <= limit) return c;
  return chunk_blocks;
}

// The chunks of a call of nb blocks, in blocks, in order. growth <= 1: chunks of chunk_blocks
// (the last one shorter). growth > 1: the pipeline starts and ends with chunks of chunk_blocks,
// doubling from either end up to growth * chunk_blocks in between, so the transfers in the middle
// of a long call are larger (a backend that pays per message, Open MPI over TCP, pays less) while
// filling and draining the pipeline costs what a chunk of chunk_blocks costs. Middle chunks are
// of equal size. Every rank derives the same chunks from the same (nb, chunk_blocks, growth).
inline std::vector<uint64_t> chunk_runs(uint64_t nb, uint64_t chunk_blocks, uint64_t growth) {
  std::vector<uint64_t> out;
  const uint64_t c = std::max<uint64_t>(1, chunk_blocks);
  if (growth <= 1) {
    for (uint64_t b = 0; b < nb; b += c) out.push_back(std::min(c, nb - b));
    return out;
  }
  const uint64_t top = c * growth;
  std::vector<uint64_t> head;
  uint64_t left = nb, sz = c;
  // A pair of ramp chunks (one at each end) while blocks remain between them.
  while (sz < top && left > 2 * sz) {
    head.push_back(sz);
    left -= 2 * sz;
    sz = std::min(2 * sz, top);
  }
  out = head;
  if (left > 0) {
    const uint64_t parts = (left + sz - 1) / sz;
    const uint64_t each = (left + parts - 1) / parts;
    for (uint64_t r = left; r > 0; r -= std::min(each, r)) out.push_back(std::min(each, r));
  }
  out.insert(out.end(), head.rbegin(), head.rend());
  return out;
}

// THC_ALGO=auto on a bandwidth-bound link: per element and rank, a ring allreduce of the values
// moves 2(n-1)/n * sum_bits, the colocated PS (n-1)/n * (index_bits + down_bits) (down_bits = the
// sum width, or 8 with Cnat re-compression downstream). True when the PS moves fewer.
inline bool ps_moves_fewer_bits(int index_bits, int down_bits, int sum_bits) {
  return index_bits + down_bits < 2 * sum_bits;
}

}  // namespace thc::engine
