#include "collectives/engine/device.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <string>

#include "collectives/engine/device_pointer.h"
#include "common/status.h"

namespace thc::engine {
namespace {

std::atomic<DeviceBackend*> g_backend{nullptr};
std::once_flag g_load_once;
std::string g_load_error;  // written once under g_load_once

// libthc_cuda next to this library first (build trees, installs outside the loader's path),
// then by soname through the loader's search path.
void try_load() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&try_load), &info) && info.dli_fname) {
    std::string dir = info.dli_fname;
    const size_t slash = dir.rfind('/');
    dir = slash == std::string::npos ? std::string(".") : dir.substr(0, slash);
    for (const char* name : {"/libthc_cuda.so.0", "/libthc_cuda.so"})
      if (dlopen((dir + name).c_str(), RTLD_NOW | RTLD_GLOBAL)) return;
  }
  if (dlopen("libthc_cuda.so.0", RTLD_NOW | RTLD_GLOBAL)) return;
  const char* e = dlerror();
  g_load_error = e ? e : "libthc_cuda.so.0 not found";
}

}  // namespace

void set_device_backend(DeviceBackend* backend) { g_backend.store(backend, std::memory_order_release); }

DeviceBackend* device_backend(bool load) {
  DeviceBackend* b = g_backend.load(std::memory_order_acquire);
  if (b || !load) return b;
  std::call_once(g_load_once, try_load);
  return g_backend.load(std::memory_order_acquire);
}

std::string device_backend_load_error() {
  if (g_backend.load(std::memory_order_acquire)) return {};
  DeviceBackend* b = device_backend(true);  // (completes a load in progress)
  return b ? std::string() : g_load_error;
}

bool driver_says_device(const void* p) { return thc_cuda_is_device_pointer(p) != 0; }

bool is_device_buffer(const void* p) {
  if (DeviceBackend* b = device_backend(false)) return b->is_device(p);
  return driver_says_device(p);
}

DeviceBackend* backend_for(const void* p) {
  if (!p) return nullptr;
  DeviceBackend* b = device_backend(false);
  if (!b) {
    if (!driver_says_device(p)) return nullptr;
    b = device_backend(true);
    if (!b)
      fail(Status::kUnsupported,
           "device buffers need libthc_cuda (the CUDA build of thc), which could not be loaded: " +
               device_backend_load_error());
  }
  return b->is_device(p) ? b : nullptr;
}

}  // namespace thc::engine
