// Device buffers on the engine's path (the C API, the MPI-like API, the aggregator clients).
//
// libthc knows nothing of CUDA. libthc_cuda registers a DeviceBackend when it is loaded; the
// engine asks it whether a call's buffers are device memory and, if so, hands the call to a
// DeviceSession: prelude, encode and decode run as CUDA kernels, and only the compressed
// integers cross to host memory for the backend (MPI, a parameter server, a switch). A program
// that never loaded libthc_cuda but passes device memory (its CUDA driver answers for the
// pointer) gets libthc_cuda loaded on first use, from libthc's own directory, then its soname.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/engine/dtype.h"

namespace thc::engine {

class Engine;
struct CallPlan;
struct ErrorFeedback;

// The device side of one call on several tensors (groups, reduce-scatter, allgather: the engine's
// stream path, stream.cc). The engine keeps the call's plan, chunks and backend operations; for
// each tensor in device memory it asks this for the block statistics, a run's codes and the
// decode of a run's sums into the tensor's buffer, so only codes and sums cross PCIe, as on the
// single allreduce's device path. Per chunk: the encodes are enqueued into a device copy of the
// chunk's wire buffer and codes_to_host brings them to the chunk's host buffer with one copy and
// one wait; sums_to_device takes the chunk's sums to the device once, and the decodes enqueued
// after it read them there. Tensors (layout lay, statistics from global block g0) are addressed
// from their first element: x, res and out point at element 0, b0 is the tensor's block; woff is
// a run's first wire element in its chunk. Work is ordered on one CUDA stream; host memory passed
// in may be reused when a call returns; sync() waits for the device writes. Throws thc::Error.
class DeviceStream {
 public:
  virtual ~DeviceStream() = default;
  // The device residual of ef, `count` floats zeroed on first use.
  virtual float* residual(ErrorFeedback& ef, uint64_t count) = 0;
  // The statistics of every block of lay of x (+ res) into stats (host, lay.nblocks floats);
  // false if an element is not finite.
  virtual bool prelude(const codec::Codec& cod, const codec::Layout& lay, const void* x, DType t, const float* res,
                       float* stats) = 0;
  // The buffers of a call of nb blocks in chunks of up to max_wire wire elements and max_elems
  // elements (keep_x: room for the kept inputs of two slots), before its first exchange.
  virtual void reserve(uint64_t nb, uint64_t max_wire, uint64_t max_elems, bool keep_x) = 0;
  // The call's global statistics (host, nb floats), after the first exchange.
  virtual void set_stats(const float* stats, uint64_t nb) = 0;
  // Enqueues the codes of blocks [b0, b0 + nblk) of x (+ res, which receives the new residual):
  // packed indices or values of the sum type, at wire element woff (a multiple of 8) of the
  // chunk. keep_slot >= 0: x + res of the run is kept at element xoff of that slot's buffer (a
  // rank the aggregate may leave out restores it).
  virtual void encode(const codec::Codec& cod, const codec::Layout& lay, uint64_t g0, uint64_t b0, uint64_t nblk,
                      const void* x, DType t, float* res, const codec::CallRng& rng, bool packed, uint64_t woff,
                      int keep_slot, uint64_t xoff) = 0;
  // The codes of the runs encoded since the last call into out (the chunk's host buffer, at the
  // runs' own offsets; the bytes between them untouched), once they are written.
  virtual void codes_to_host(void* out) = 0;
  // The chunk's sums of wire elements [lo, lo + wire) (host memory at `sums`) to the device.
  virtual void sums_to_device(const codec::Codec& cod, const void* sums, uint64_t lo, uint64_t wire) = 0;
  // Enqueues the decode of `contributors` ranks' sums of a run (at wire element woff of the
  // chunk's sums on the device; or, with host_sums, those host sums, waited for) into out (type
  // ot). as_mean: their mean; scale != 1: that mean times scale (partial aggregation's SUM).
  virtual void decode(const codec::Codec& cod, const codec::Layout& lay, uint64_t g0, uint64_t b0, uint64_t nblk,
                      uint64_t woff, const void* host_sums, const codec::CallRng& rng, int contributors, bool as_mean,
                      float scale, void* out, DType ot) = 0;
  // res[0..m) = the kept x of slot at element xoff (left out of the aggregate).
  virtual void restore(int slot, uint64_t xoff, float* res, uint64_t m) = 0;
  // res[0..m) += x[0..m) (a contribution never encoded stays in the residual).
  virtual void add_into(const void* x, DType t, float* res, uint64_t m) = 0;
  // Device memory of `bytes` that lives as long as this object.
  virtual void* scratch(size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void sync() = 0;
};

class DeviceSession {
 public:
  virtual ~DeviceSession() = default;
  // The call on device buffers send (may equal recv) and recv. Blocking, like the host path:
  // returns once recv is written. Work the caller queued on other streams that writes send
  // must be complete (as for a CUDA-aware MPI); work on the legacy default stream is ordered.
  virtual void allreduce(Engine& engine, const CallPlan& plan, const void* send, void* recv,
                         ErrorFeedback* ef) = 0;
  // The device side of a call on several tensors whose device buffers are `ptrs` (all on one
  // device, else kInvalidArgument).
  virtual std::unique_ptr<DeviceStream> stream(const std::vector<const void*>& ptrs) = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // Whether p is device memory the host cannot dereference.
  virtual bool is_device(const void* p) const = 0;
  virtual std::unique_ptr<DeviceSession> open() = 0;
};

// Called by libthc_cuda at load (and by tests with an emulated device); nullptr unregisters.
void set_device_backend(DeviceBackend* backend);
// The registered backend, or null. With load = true and none registered, tries once to load
// libthc_cuda (which registers itself).
DeviceBackend* device_backend(bool load);
// Why loading libthc_cuda failed (the loader's message), empty if a backend is registered.
std::string device_backend_load_error();

// Whether the CUDA driver (if the process has loaded it) calls p device memory; false without
// a driver. Cheap: it never initialises CUDA.
bool driver_says_device(const void* p);
// The registered backend's answer, else the driver's.
bool is_device_buffer(const void* p);
// The backend that takes p if p is device memory, else nullptr (also for nullptr). A process
// whose CUDA driver calls p device memory gets libthc_cuda loaded (kUnsupported if it cannot be).
DeviceBackend* backend_for(const void* p);

}  // namespace thc::engine
