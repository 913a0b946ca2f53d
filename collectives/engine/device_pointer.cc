// thc_cuda_is_device_pointer through the driver API, loaded at run time (see device_pointer.h).
#include "collectives/engine/device_pointer.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <atomic>

namespace {

// Driver API constants (cuda.h), spelled out so this file needs no CUDA headers.
constexpr int kCuSuccess = 0;
constexpr int kAttrMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttrIsManaged = 8;   // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr unsigned kMemDevice = 2;  // CU_MEMORYTYPE_DEVICE

using PointerGetAttribute = int (*)(void* data, int attribute, unsigned long long ptr);

PointerGetAttribute load() {
  // RTLD_NOLOAD: only a driver the process already loaded. A process without it has no device
  // pointers, and loading it here would cost start-up time for every MPI program.
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) return nullptr;
  return reinterpret_cast<PointerGetAttribute>(dlsym(h, "cuPointerGetAttribute"));
}

// The dynamic linker's count of objects loaded so far (dl_phdr_info::dlpi_adds): it changes
// whenever a library may have been loaded. Reading it takes the loader's lock, no search.
int count_loads(dl_phdr_info* info, size_t, void* out) {
  *static_cast<unsigned long long*>(out) = info->dlpi_adds;
  return 1;  // every object carries the process-wide counter: the first will do
}
unsigned long long loads() {
  unsigned long long n = 0;
  dl_iterate_phdr(count_loads, &n);
  return n;
}

}  // namespace

extern "C" int thc_cuda_is_device_pointer(const void* ptr) {
  if (!ptr) return 0;
  // Not cached while absent: the driver may be loaded after the first call (CUDA initialised
  // after MPI_Init). But a failed RTLD_NOLOAD lookup searches the loader's cache (page faults and
  // some microseconds each: a call on 200 tensors asks 400 times), so it is tried again only once
  // the dynamic linker has loaded something since the last failure.
  static std::atomic<PointerGetAttribute> cached{nullptr};
  static std::atomic<unsigned long long> absent_at{~0ull};
  PointerGetAttribute fn = cached.load(std::memory_order_acquire);
  if (!fn) {
    const unsigned long long now = loads();
    if (now == absent_at.load(std::memory_order_acquire)) return 0;
    fn = load();
    if (!fn) {
      absent_at.store(now, std::memory_order_release);
      return 0;
    }
    cached.store(fn, std::memory_order_release);
  }
  const auto p = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ptr));
  unsigned type = 0;
  if (fn(&type, kAttrMemoryType, p) != kCuSuccess) return 0;  // not known to CUDA: host memory
  if (type != kMemDevice) return 0;
  unsigned managed = 0;
  if (fn(&managed, kAttrIsManaged, p) == kCuSuccess && managed) return 0;
  return 1;
}
