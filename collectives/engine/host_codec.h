// The host codec as the engine drives it: codec scratch that lives across blocks, chunks and calls
// (no allocation per block), and the blocks of a chunk spread over THC_THREADS threads.
//
// Threads: the calling thread is worker 0 and the only one that runs `progress` (the engine's
// transport polling), so a backend that is not thread-safe (MPI without MPI_THREAD_MULTIPLE)
// is only ever entered from the caller. The other threads only run codec kernels on blocks of
// their own. Blocks are handed out one at a time (an atomic counter), so a thread that is
// descheduled (ranks oversubscribing cores) delays the chunk by at most one block.
// With one thread nothing is spawned and every call runs inline.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "collectives/codec/codec.h"

namespace thc::engine {

class WorkerPool;

class HostCodec {
 public:
  explicit HostCodec(int threads);
  ~HostCodec();
  HostCodec(const HostCodec&) = delete;
  HostCodec& operator=(const HostCodec&) = delete;

  int threads() const { return threads_; }

  // encode() runs progress once per this many elements the caller encodes (see host_codec.cc).
  static constexpr uint64_t kProgressElems = uint64_t{1} << 16;

  // Codec::prelude of the whole blocks starting at x (x at a block boundary of the call; count
  // reaches the end of the call or a block boundary).
  bool prelude(const codec::Codec& c, const float* x, uint64_t count, float* stats, const float* add = nullptr);

  // Codec::encode of blocks [first, first + n): out's pointers (and add) at the first block, as
  // for Codec::encode. The calling thread runs progress() (if set) after each kProgressElems
  // elements it encodes (counted in whole blocks).
  void encode(const codec::Codec& c, const codec::Layout& lay, uint64_t first, uint64_t n, const float* x,
              const float* stats, const codec::CallRng& rng, const codec::Codec::EncodeOut& out,
              const std::function<void()>& progress = nullptr, const float* add = nullptr);

  // Codec::decode of blocks [first, first + n).
  void decode(const codec::Codec& c, const codec::Layout& lay, uint64_t first, uint64_t n, const void* sums,
              const float* stats, const codec::CallRng& rng, int contributors, bool mean, float* out);

 private:
  int threads_;
  std::vector<codec::Workspace> ws_;  // one per worker
  std::unique_ptr<WorkerPool> pool_;  // null with one thread
};

}  // namespace thc::engine
