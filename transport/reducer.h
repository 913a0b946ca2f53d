// The integer-aggregation interface (DESIGN.md §2 "reduction"). A backend knows integers and
// bytes, never floats or schemes; the only scheme knowledge it is handed is a lookup table.
//
// Ordering contract (as for MPI collectives): every rank starts the same operations in the same
// order; an operation's buffers must stay valid until wait() returns. Operations may be started
// before earlier ones are waited on (that is how the engine pipelines), and are waited on in the
// order they were started.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"

namespace thc::transport {

using codec::IntType;

// Completion handle of a nonblocking operation.
class Request {
 public:
  virtual ~Request() = default;
  // Drive progress; true once complete. Cheap: the engine calls it between encoded blocks.
  virtual bool test() = 0;
  // Block until complete. Throws thc::Error (kTransport, kTimeout) on failure.
  virtual void wait() = 0;
  // Ranks whose contributions the result holds (partial aggregation; default: everyone).
  virtual int contributors() const { return -1; }
  // Whether this rank's own contribution is in the result. A worker left out of a partial
  // aggregate keeps its whole contribution in its error-feedback residual.
  virtual bool self_counted() const { return true; }
  // A backend that splits an operation over several aggregators reports each part's
  // contributors (parts are contiguous, in order, and start at multiples of the granule the
  // engine set). Empty: one part, described by contributors() and self_counted().
  struct Part {
    uint64_t first = 0, count = 0;
    int contributors = -1;
    bool self_counted = true;
  };
  virtual std::vector<Part> parts() const { return {}; }
  // The result of a start_lookup_sum given no sums buffer (Reducer::lends_sums): in the buffer
  // the transport gathered it in, valid from completion until this request is destroyed. Null
  // for every other operation.
  virtual const void* lent_sums() const { return nullptr; }
};

// A table the aggregator applies to each index before summing: values[z], z < 2^bits.
struct LookupTable {
  int bits = 0;
  std::vector<int32_t> values;
};

// Optional integer->bytes->integer transform a backend applies to the summed shard before
// sending it back down (bidirectional compression). The backend treats the bytes as opaque.
class DownstreamCodec {
 public:
  virtual ~DownstreamCodec() = default;
  // Encoded size of `count` sums.
  virtual size_t encoded_bytes(uint64_t count) const = 0;
  // Encode sums [first, first+count) of the call (first is a global wire-element offset).
  virtual void encode(const void* sums, uint64_t first, uint64_t count, uint8_t* out) const = 0;
  // Decode them back into sums of the call's sum type.
  virtual void decode(const uint8_t* in, uint64_t first, uint64_t count, void* sums) const = 0;
};

class Reducer {
 public:
  virtual ~Reducer() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // Element-wise MAX of u32 over all ranks, in place, blocking (prelude, seed agreement).
  virtual void max_u32(uint32_t* data, size_t n) = 0;

  // Value form: element-wise integer SUM over all ranks, in place.
  virtual std::unique_ptr<Request> start_sum(void* data, uint64_t count, IntType type) = 0;

  // Index form: every rank contributes `count` packed b-bit indices; the result is, for every
  // element, sum over ranks of table[index] as `type` in sums (count elements).
  // `down` (nullable) compresses the downstream half where the backend supports it.
  virtual std::unique_ptr<Request> start_lookup_sum(const uint8_t* packed, uint64_t count,
                                                    const LookupTable& table, void* sums,
                                                    IntType type, const DownstreamCodec* down) = 0;

  // Reduce-scatter (the first half of the operations above): rank q needs only elements
  // [bounds[q], bounds[q+1]) of the result (bounds: size() + 1 non-decreasing offsets from 0 to
  // count, multiples of 8), the rest of the result buffer is left unspecified. The default runs
  // the whole operation (every rank gets everything: more bytes, same result).
  // (Defined here, inline like every virtual of this class: no key function, so libraries that
  // implement a Reducer without linking reducer.cc, the switch clients', stay self-contained.)
  virtual std::unique_ptr<Request> start_reduce_scatter_sum(void* data, uint64_t count, IntType type,
                                                            const std::vector<uint64_t>& bounds) {
    (void)bounds;
    return start_sum(data, count, type);
  }
  virtual std::unique_ptr<Request> start_lookup_reduce_scatter(const uint8_t* packed, uint64_t count,
                                                               const LookupTable& table, void* sums, IntType type,
                                                               const std::vector<uint64_t>& bounds) {
    (void)bounds;
    return start_lookup_sum(packed, count, table, sums, type, nullptr);
  }
  // Allgather of bytes: buf holds this rank's bytes at [bounds[r], bounds[r+1]) and zeros
  // elsewhere; on completion it holds every rank's. The default is an 8-bit integer sum (exact:
  // one rank's byte and zeros at every position), so a backend that only adds integers (an
  // aggregator) gathers too, at n times the bytes.
  virtual std::unique_ptr<Request> start_allgather(uint8_t* buf, const std::vector<uint64_t>& bounds) {
    return start_sum(buf, bounds.empty() ? 0 : bounds.back(), IntType::kU8);
  }

  // Index form with the indices in a buffer the request takes over: a transport that owns every
  // buffer its sends read (a send it cannot cancel after a peer fails must never read memory the
  // caller reuses) copies the caller's indices in start_lookup_sum; here the caller encodes
  // straight into input_buffer(bytes) (at least `bytes`, contents unspecified, from the
  // transport's recycled buffers) and hands it over: packed is left empty, nothing is copied.
  // Only where adopts_input().
  virtual bool adopts_input() const { return false; }
  virtual std::vector<uint8_t> input_buffer(size_t bytes) { return std::vector<uint8_t>(bytes); }
  virtual std::unique_ptr<Request> start_lookup_sum_adopt(std::vector<uint8_t>&& packed, uint64_t count,
                                                          const LookupTable& table, void* sums, IntType type,
                                                          const DownstreamCodec* down) {
    (void)packed, (void)count, (void)table, (void)sums, (void)type, (void)down;
    fail(Status::kInternal, name() + " backend: start_lookup_sum_adopt without adopts_input()");
  }

  // Whether start_lookup_sum takes sums == nullptr and then keeps the result in a buffer of its
  // own (Request::lent_sums): a result that the transport received in its own buffers (it must
  // own every buffer a peer may still write after a failure) is then not copied again.
  virtual bool lends_sums() const { return false; }
  // How many times THC_CHUNK_BYTES the engine may make the chunks in the middle of a long
  // allreduce (engine::chunk_runs; its first and last chunks keep THC_CHUNK_BYTES). 1: never.
  virtual uint64_t chunk_growth() const { return 1; }
  // Messages of up to this many bytes cost the transport no handshake (Open MPI over TCP: its
  // eager limit); the engine sizes PS chunks by it (engine::ps_chunk_blocks). 0: no such limit.
  // The same on every rank.
  virtual uint64_t eager_bytes() const { return 0; }
  // Whether start_lookup_sum is this backend's native path (parameter server, switch) or only an
  // emulation; the engine's "auto" algorithm choice asks this.
  virtual bool prefers_index_form() const { return false; }
  // Whether a partial result (fewer contributors than size()) can happen.
  virtual bool partial_results() const { return false; }
  // Whether start_lookup_sum applies a DownstreamCodec it is given (otherwise the sums come back
  // at full width and the engine does not ask for one).
  virtual bool applies_downstream() const { return false; }
  // Operations may be split into parts at multiples of this many elements (the engine's block:
  // each part then decodes on its own). Default: no splitting.
  virtual void set_part_granule(uint64_t elements) { (void)elements; }
  // What this rank put on and took off the wire, protocol headers included, where the backend
  // counts it (the aggregator clients); false otherwise.
  struct WireCounters {
    uint64_t bytes_sent = 0, bytes_received = 0;
    uint64_t packets = 0;          // first transmissions of data packets
    uint64_t retransmissions = 0;
  };
  virtual bool wire_counters(WireCounters* out) const {
    (void)out;
    return false;
  }
  // A one-line summary of the backend's transport statistics ("" if none).
  virtual std::string wire_stats() const { return {}; }
};

// Add src into dst element-wise (helper for software backends).
void add_ints(IntType t, void* dst, const void* src, uint64_t count);
// dst[i] = sum of table[index_i] over the packed indices, accumulated into dst (type t).
void lookup_add(const LookupTable& table, const uint8_t* packed, uint64_t first, uint64_t count,
                IntType t, void* dst);

}  // namespace thc::transport
