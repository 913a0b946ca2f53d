// The engine: one compressed allreduce = prelude exchange, then a pipeline of chunks (whole
// blocks) where encoding chunk k+1 overlaps the aggregation of chunk k, then decode.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/engine/device.h"
#include "collectives/engine/dtype.h"
#include "common/huge_alloc.h"
#include "collectives/engine/host_codec.h"
#include "thc/thc.h"
#include "transport/reducer.h"

namespace thc::engine {

// Error-feedback state of one tensor (THC Algorithm 3): x = grad + e; e <- x - own contribution.
// Bound on first use to a count and to host or device memory: the residual lives beside the
// buffers (a device residual belongs to the device session that allocated it). A host residual
// shorter than the count (a hierarchical communicator's state holds only its rank's slice) is
// zero-padded to the count when a flat call takes it.
// Out of place (host buffers only; the hierarchical communicator's slices, which must be able to
// undo a call that fails on another slice without a copy of the residual): a call reads
// `residual` and writes the updated residual to `next` (grown to the count; what the call does
// not cover is left as it was), leaving `residual` as it was; the caller swaps them once the
// call has succeeded everywhere.
struct ErrorFeedback {
  using Buffer = std::vector<float, HugeAlloc<float>>;  // on huge pages from 2 MiB (huge_alloc.h)
  Buffer residual;
  uint64_t count = 0;
  std::shared_ptr<float> device;  // device residual of `count` floats (device buffers)
  int device_id = -1;
  bool out_of_place = false;
  Buffer next;
  uint64_t next_differs = 0;  // (kept by the caller that swaps) next equals residual past this
  // Where a call on `count` elements writes the updated residual.
  float* target(uint64_t n) {
    if (!out_of_place) return residual.data();
    if (next.size() < n) next.resize(n, 0.0f);
    return next.data();
  }
  void reset() {
    residual.clear();
    next.clear();
    next_differs = 0;
    device.reset();
    device_id = -1;
    count = 0;
  }
};

enum class Algo { kInt, kPs };

// One tensor of a call on several (a group; the shards of reduce-scatter and allgather).
struct Tensor {
  const void* send = nullptr;  // nullptr or THC_IN_PLACE: in place (recv)
  void* recv = nullptr;
  uint64_t count = 0;
  DType dtype = DType::kF32;
  ErrorFeedback* ef = nullptr;
};

// What one call needs beyond its buffers, shared by the host and device paths.
struct CallPlan {
  codec::Scheme scheme = codec::Scheme::kThc;
  const codec::Codec* cod = nullptr;
  codec::Layout lay;
  uint64_t count = 0;
  DType dtype = DType::kF32;
  bool mean = false;
  Algo algo = Algo::kInt;
  codec::CallRng rng;
  transport::LookupTable table;                        // index form
  std::unique_ptr<transport::DownstreamCodec> down;    // index form + THC_BIDIR (nat schemes)
  uint64_t digest = 0;                                  // hash of everything that must agree
  uint64_t chunk_blocks = 1;                            // pipelining unit
  bool round_by_max = false;  // ranks agree on the newest call round (aggregator jobs with stragglers)
  // Calls on several tensors (stream.cc): which collective and the tensors' counts in order (0 for
  // a call on one tensor), agreed in the first exchange like the count.
  uint64_t tensors_digest = 0;
};

// A block range of a chunk whose sums share one contributor set (a backend that splits an
// operation over several aggregators reports one per part; most report one per chunk).
struct BlockPart {
  uint64_t b0 = 0, nblk = 0;
  int contributors = 0;
  bool self_counted = true;
};
// The parts of a finished request over the chunk's blocks [b0, b0 + nblk) of B wire elements.
std::vector<BlockPart> block_parts(const transport::Request& req, uint64_t b0, uint64_t nblk, uint64_t B, int n);

struct EngineStats {
  uint64_t calls = 0;
  uint64_t elements = 0;
  uint64_t wire_bytes_up = 0;    // codes this rank sent; on an aggregator: datagram bytes with headers
  uint64_t wire_bytes_down = 0;  // sums this rank received; likewise
  uint64_t float_bytes = 0;
  uint64_t packets = 0;          // aggregator clients: data packets (first transmissions)
  uint64_t retransmissions = 0;
  bool measured_wire = false;    // wire bytes are counted datagrams, not a model
  Algo last_algo = Algo::kInt;
  uint64_t groups = 0;           // calls on several tensors as one stream (stream.cc)
  uint64_t grouped_tensors = 0;
};

// Inside a catch block: the status of the exception in flight (an Error's own, kOutOfMemory for
// std::bad_alloc, else kInternal).
Status status_of_current_exception();

class Engine {
 public:
  // Collective: agrees on the shared seed with all ranks of the reducer.
  Engine(std::unique_ptr<transport::Reducer> reducer, const thc_config_t& cfg);

  int rank() const { return reducer_->rank(); }
  int size() const { return reducer_->size(); }
  transport::Reducer& reducer() { return *reducer_; }
  const thc_config_t& config() const { return cfg_; }
  uint64_t seed() const { return seed_; }

  // send may equal recv (in place). mean selects AVG over SUM. ef may be null.
  void allreduce(codec::Scheme scheme, const void* send, void* recv, uint64_t count, DType dtype,
                 bool mean, ErrorFeedback* ef);

  // Several tensors as one stream (stream.cc): one first exchange, one pipeline of chunks over
  // every tensor's blocks; tensor i (of those with count > 0) runs as call round r + i, so its
  // result is what allreduce would return for it as the i-th of that many calls. Host buffers.
  void allreduce_group(codec::Scheme scheme, const Tensor* ts, size_t n, bool mean);
  // Compressed reduce-scatter: send holds counts[0..size()) elements (shard q = the counts[q]
  // after sum(counts[0..q))); this rank's shard of the decoded sum goes to recv. Each shard is a
  // tensor of the stream (as in allreduce_group); rank q's result is bit-identical to its shard's
  // in allreduce_group. send == nullptr / THC_IN_PLACE: input in recv, shard written at its front.
  // ef: residual of the whole input.
  void reduce_scatter(codec::Scheme scheme, const void* send, void* recv, const uint64_t* counts, DType dtype,
                      bool mean, ErrorFeedback* ef);
  // Lossy allgather: rank q's counts[q] elements (send) encoded once by rank q (index form),
  // decoded by every rank into recv at offset sum(counts[0..q)). ef: this rank's shard's residual.
  // send == nullptr / THC_IN_PLACE: own shard read from its place in recv.
  void allgather(codec::Scheme scheme, const void* send, void* recv, const uint64_t* counts, DType dtype,
                 ErrorFeedback* ef);
  // The same two collectives on parts of one float32 buffer `buf` of `count` elements, each part
  // a tensor of the stream with an owner rank (any order; the wire groups them by owner). Both
  // work in place. reduce_scatter_parts: part i is reduced over the ranks and decoded into its
  // place in buf by its owner alone (the other ranks' buf keeps its input there); ef, if any,
  // holds the residual of the whole buffer. allgather_parts: part i is encoded by its owner from
  // its place in buf and decoded into that place by every rank; ef, if any, holds the residual of
  // the parts this rank owns, one after another in their order. Parts must not overlap. The
  // hierarchical communicator's compressed stage (mpi_wrappers/hier.cc).
  struct Part {
    uint64_t off = 0, count = 0;
    int owner = 0;
  };
  void reduce_scatter_parts(codec::Scheme scheme, float* buf, uint64_t count, const Part* parts, size_t n, bool mean,
                            ErrorFeedback* ef);
  void allgather_parts(codec::Scheme scheme, float* buf, uint64_t count, const Part* parts, size_t n,
                       ErrorFeedback* ef);

  // The parts of allreduce the device path shares (device.h).
  // A call's plan; advances the call counter that freshens the randomness.
  CallPlan plan(codec::Scheme scheme, uint64_t count, DType dtype, bool mean);
  // What every rank's plan must agree on (checked by exchange_prelude, each named on mismatch).
  struct PreludeField {
    const char* what;
    uint64_t value;
  };
  static constexpr size_t kPreludeFields = 8;
  static std::array<PreludeField, kPreludeFields> prelude_fields(const CallPlan& plan);
  // pre: plan.lay.nblocks statistics (float bits) followed by kPreludeCheck words (room the
  // device prelude fills; ignored here). First a fixed-size MAX whatever the count: failures of
  // other ranks, the agreement fields, the non-finite flags and the first statistics; only when
  // every rank agrees, the remaining statistics. Throws the status of a rank that failed before
  // exchanging (abort_prelude), kConfigMismatch, kNonFinite. After it, pre[0..nblocks) holds the
  // global statistics.
  static constexpr int kPreludeCheck = 5;
  // Returns the call round every rank uses (see engine.cc: on aggregator jobs the newest).
  uint32_t exchange_prelude(const CallPlan& plan, uint32_t* pre, bool finite);
  // Instead of exchange_prelude on a rank whose call failed before it: takes part in the first,
  // fixed-size exchange so that every rank fails the call with `why` instead of waiting.
  void abort_prelude(Status why);
  // A call (with elements) that failed before it reached the engine, on a free communicator (an
  // argument the C API refused, blocking or not): counts it as `calls` calls (a group or the
  // shards of reduce-scatter/allgather count one per non-empty tensor) and takes part in its
  // first exchange, so that every rank fails it with `why` and the calls stay paired.
  void fail_call(Status why, uint32_t calls = 1);
  // Statistics of a finished call that moved wire_total elements.
  void account(const CallPlan& plan, uint64_t wire_total);

  const codec::Codec& codec_for(codec::Scheme scheme);
  codec::Params params_for(codec::Scheme scheme) const;
  Algo choose_algo(const codec::Codec& c) const;
  const EngineStats& stats() const { return stats_; }

 private:
  std::unique_ptr<transport::Reducer> reducer_;
  thc_config_t cfg_;
  uint64_t seed_ = 0;
  uint32_t round_ = 0;
  // First exchanges this engine has entered (exchange_prelude, abort_prelude): tells a call that
  // failed whether it failed before its first exchange, where the peers still wait for it.
  uint64_t preludes_entered_ = 0;
  std::map<int, std::unique_ptr<codec::Codec>> codecs_;
  mutable bool said_algo_[8] = {};  // THC_DEBUG: the auto choice said once per scheme
  EngineStats stats_;
  transport::Reducer::WireCounters wire_seen_;  // the reducer's counters at the last call
  std::unique_ptr<DeviceSession> device_;  // opened on the first call with device buffers
  std::unique_ptr<HostCodec> host_;        // the host path's codec scratch and THC_THREADS workers

  void allreduce_host(const CallPlan& plan, const void* send, void* recv, ErrorFeedback* ef);
  // allreduce_host's packed codes and sums of its two chunks in flight, kept across calls (one
  // call at a time per communicator): at most 2 * THC_CHUNK_BYTES * chunk growth (the reducer's,
  // chunk_runs) * (sum width / 4 + bits / 32).
  std::vector<uint8_t> stage_[4];
  // The exchange that names every rank a failure concerns (agreement.h name_ranks), or null.
  std::function<void(uint32_t*, size_t)> naming_exchange();
  // stream.cc: the pipeline of allreduce_group, reduce_scatter and allgather.
  struct Stream;
  void run_stream(Stream& st);
  // reduce_scatter_parts and allgather_parts (kind: stream.cc's Kind)
  void run_parts(int kind, codec::Scheme scheme, float* buf, uint64_t count, const Part* parts, size_t n, bool mean,
                 ErrorFeedback* ef);
};

}  // namespace thc::engine
