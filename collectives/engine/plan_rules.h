#pragma once
// The rules that shape a call, shared by the host engine (engine.cc, and through its CallPlan the
// device path of cuda/engine_device.cc) and the NCCL path (cuda/nccl_api.cc), so that the same
// configuration chunks, chooses and hashes alike wherever a call runs. Pure functions of numbers:
// no codec, transport or CUDA types.
#include <algorithm>
#include <cstdint>

namespace thc::engine {

// Hash step of the configuration digests (what every rank must agree on).
inline uint64_t digest_mix(uint64_t h, uint64_t v) { return h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2)); }

// Blocks per pipelined chunk: THC_CHUNK_BYTES of float32 input, at least one block.
inline uint64_t chunk_blocks_for(int64_t chunk_bytes, uint64_t block) {
  return std::max<uint64_t>(1, static_cast<uint64_t>(std::max<int64_t>(chunk_bytes, 4)) / 4 / block);
}

// THC_ALGO=auto on a bandwidth-bound link: per element and rank, a ring allreduce of the values
// moves 2(n-1)/n * sum_bits, the colocated PS (n-1)/n * (index_bits + down_bits) (down_bits = the
// sum width, or 8 with Cnat re-compression downstream). True when the PS moves fewer.
inline bool ps_moves_fewer_bits(int index_bits, int down_bits, int sum_bits) {
  return index_bits + down_bits < 2 * sum_bits;
}

}  // namespace thc::engine
