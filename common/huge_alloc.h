// An allocator for the library's own large host buffers (error-feedback residuals): allocations
// of 2 MiB and more are 2 MiB-aligned and advised for transparent huge pages (MADV_HUGEPAGE)
// before anything touches them, so that the codec's streams over them take no 4 KiB page walks
// (the effect README's "Huge pages for host tensors" measures for the caller's tensors, which the
// library leaves as they are mapped). Where THP is off ("never") the advice does nothing; smaller
// allocations are plain operator new. Usable as std::vector<T, HugeAlloc<T>>.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace thc {

constexpr size_t kHugePage = size_t{2} << 20;

template <typename T>
struct HugeAlloc {
  using value_type = T;
  HugeAlloc() noexcept = default;
  template <typename U>
  HugeAlloc(const HugeAlloc<U>&) noexcept {}  // NOLINT(google-explicit-constructor): rebinding
  static bool huge(size_t n) { return n >= kHugePage / sizeof(T); }
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    if (!huge(n)) return static_cast<T*>(::operator new(n * sizeof(T)));
    const size_t bytes = (n * sizeof(T) + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, bytes);
    if (!p) throw std::bad_alloc();
    (void)madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KiB
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (!huge(n)) {
      ::operator delete(p);
    } else {
      std::free(p);
    }
  }
};
template <typename T, typename U>
bool operator==(const HugeAlloc<T>&, const HugeAlloc<U>&) noexcept {
  return true;
}
template <typename T, typename U>
bool operator!=(const HugeAlloc<T>&, const HugeAlloc<U>&) noexcept {
  return false;
}

}  // namespace thc
