// Test hooks of the NCCL-like API (not part of the public interface).
#pragma once

#include <cstddef>

namespace thc::cuda {

// Smallest chunk the NCCL path uses, in float32 bytes (default 64 MiB; THC_CHUNK_BYTES below it
// is raised to it). Tests lower it to exercise the chunk loop on small tensors. Not thread-safe
// against concurrent calls.
void set_min_chunk_bytes(size_t bytes);
size_t min_chunk_bytes();

}  // namespace thc::cuda
