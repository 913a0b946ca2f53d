// CUDA device memory for the CollNet half (collnet.cc). The plugin must load and serve host
// buffers where there is no CUDA at all, so everything CUDA is behind these three functions:
//
//   built without CUDA (THC_PLUGIN_CUDA undefined)   no device, ever: NCCL_PTR_HOST only
//   built with CUDA                                   the plugin carries the static CUDA runtime,
//                                                     which opens the driver (libcuda.so.1) on first
//                                                     use; no driver or no device: host only
//
// With a device, an allreduce on device buffers goes through the engine's device path (the CUDA
// codec on its own stream, only the codes staged through pinned host memory), compiled into the
// plugin beside its private copy of the engine (cuda/engine_device.cc, registered at load).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace thc::nccl_plugin::device {

// Whether device buffers are served: built with CUDA and at least one device answers. Asked once
// (the answer is kept); why says what is missing when the answer is no.
bool available(std::string* why = nullptr);

// Whether [p, p + bytes) is device memory of one allocation the codec kernels can read and
// write (cudaMemoryTypeDevice or managed). On no, why says what p is.
bool is_device_range(const void* p, size_t bytes, std::string* why);

// Writes count elements of elem_size (2 or 4) bytes, each the low bytes of pattern, into device
// memory at p (the NaN result of a call with a non-finite input). On failure, why says why.
bool fill_nan(void* p, size_t count, size_t elem_size, uint32_t pattern, std::string* why);

// Whether the CUDA runtime calls p device (or managed) memory; false without CUDA.
bool is_device(const void* p);

}  // namespace thc::nccl_plugin::device
