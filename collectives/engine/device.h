// Device buffers on the engine's path (the C API, the MPI-like API, the aggregator clients).
//
// libthc knows nothing of CUDA. libthc_cuda registers a DeviceBackend when it is loaded; the
// engine asks it whether a call's buffers are device memory and, if so, hands the call to a
// DeviceSession: prelude, encode and decode run as CUDA kernels, and only the compressed
// integers cross to host memory for the backend (MPI, a parameter server, a switch). A program
// that never loaded libthc_cuda but passes device memory (its CUDA driver answers for the
// pointer) gets libthc_cuda loaded on first use, from libthc's own directory, then its soname.
#pragma once

#include <memory>
#include <string>

namespace thc::engine {

class Engine;
struct CallPlan;
struct ErrorFeedback;

// One engine's device-side state (device codecs, workspace, pinned staging, streams).
class DeviceSession {
 public:
  virtual ~DeviceSession() = default;
  // The call on device buffers send (may equal recv) and recv. Blocking, like the host path:
  // returns once recv is written. Work the caller queued on other streams that writes send
  // must be complete (as for a CUDA-aware MPI); work on the legacy default stream is ordered.
  virtual void allreduce(Engine& engine, const CallPlan& plan, const void* send, void* recv,
                         ErrorFeedback* ef) = 0;
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

}  // namespace thc::engine
