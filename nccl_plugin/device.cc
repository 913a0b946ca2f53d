#include "nccl_plugin/device.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#if defined(THC_PLUGIN_CUDA)
#include <cuda_runtime.h>

#include "collectives/engine/device.h"
#include "cuda/thc_cuda.h"
#endif

namespace thc::nccl_plugin::device {

#if defined(THC_PLUGIN_CUDA)

namespace {

std::once_flag g_once;
bool g_available = false;
std::string g_why;

void probe() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    g_why = std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
    return;
  }
  if (n <= 0) {
    g_why = "no CUDA device";
    return;
  }
  g_available = true;
  // The engine (the plugin's own copy) runs device buffers through this backend: registered here
  // rather than left to engine_device.cc's load-time registrar, which a static link may drop.
  engine::set_device_backend(cuda::engine_backend());
}

// Device-accessible memory the kernels may read and write: device or managed allocations.
bool attributes(const void* p, cudaPointerAttributes* a) {
  if (!p) return false;
  *a = cudaPointerAttributes{};
  if (cudaPointerGetAttributes(a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a->type == cudaMemoryTypeDevice || a->type == cudaMemoryTypeManaged;
}

}  // namespace

bool available(std::string* why) {
  std::call_once(g_once, probe);
  if (!g_available && why) *why = g_why;
  return g_available;
}

bool is_device(const void* p) {
  if (!available()) return false;
  cudaPointerAttributes a;
  return attributes(p, &a);
}

bool is_device_range(const void* p, size_t bytes, std::string* why) {
  std::string no;
  if (!available(&no)) {
    if (why) *why = no;
    return false;
  }
  cudaPointerAttributes first, last;
  if (!attributes(p, &first)) {
    if (why) *why = "not CUDA device memory (host or unknown to the CUDA runtime)";
    return false;
  }
  if (bytes > 0) {
    const void* end = static_cast<const char*>(p) + (bytes - 1);
    if (!attributes(end, &last) || last.device != first.device) {
      if (why) *why = "the last byte is not device memory of the same device (size larger than the allocation?)";
      return false;
    }
  }
  return true;
}

bool fill_nan(void* p, size_t count, size_t elem_size, uint32_t pattern, std::string* why) {
  // A host pattern copied in pieces: one rare call per non-finite input, not worth a kernel.
  constexpr size_t kPiece = size_t{1} << 20;
  std::vector<unsigned char> host(std::min(count * elem_size, kPiece));
  for (size_t i = 0; i + elem_size <= host.size(); i += elem_size) std::memcpy(host.data() + i, &pattern, elem_size);
  char* dst = static_cast<char*>(p);
  for (size_t done = 0, total = count * elem_size; done < total;) {
    const size_t n = std::min(host.size(), total - done);
    const cudaError_t e = cudaMemcpy(dst + done, host.data(), n, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (why) *why = std::string("cudaMemcpy: ") + cudaGetErrorString(e);
      return false;
    }
    done += n;
  }
  return true;
}

#else  // built without CUDA

bool available(std::string* why) {
  if (why) *why = "this libnccl-net-thc.so was built without CUDA (THC_WITH_CUDA off or no CUDA toolkit)";
  return false;
}

bool is_device(const void*) { return false; }

bool fill_nan(void*, size_t, size_t, uint32_t, std::string* why) { return available(why); }

bool is_device_range(const void*, size_t, std::string* why) { return available(why); }

#endif

}  // namespace thc::nccl_plugin::device
