// A small CUDA emulator for tests: compiles the kernels in cuda/ with the host compiler and runs
// them on the CPU, so the kernel logic (indexing, shuffles, shared-memory rounds, multi-pass
// geometry, parity with the host codec) is tested on machines without a GPU.
//
// Model: a launch runs its thread blocks one after another; the threads of a block are
// cooperative fibers (Boost.Context) on the calling OS thread. __syncthreads and warp shuffles are
// barriers that switch fibers; a barrier nobody can pass aborts with a message (deadlock).
// __shared__ variables become function-local thread_local statics (one block runs at a time per
// OS thread), dynamic shared memory is a per-launch buffer filled with garbage. All emulator
// state is per OS thread, so several host threads (the ranks of a multi-rank test) can run
// kernels at once. "Device" memory is host memory: cudaMalloc is aligned_alloc, copies are
// memcpy, every stream is synchronous. No timing, no graphs.
//
// What it cannot show: races between threads that a real GPU runs concurrently (a fiber runs
// until its next barrier), performance, and the device's own arithmetic (the host's IEEE float
// and double operations stand in for it, which is exact for the operations the kernels use
// when FMA contraction is off on both sides).
//
// The emulator's wrappers (emu/*_emu.cc) include this first, then the .cu file.
#pragma once

#define THC_CUDA_EMULATION 1

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <functional>

// Kernel qualifiers mean nothing on the host.
#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __forceinline__
#define __forceinline__ inline
#undef __shared__
#define __shared__ static thread_local
#define __launch_bounds__(...)

namespace thc_emu {

extern thread_local dim3 g_block_idx;
extern thread_local dim3 g_block_dim;
extern thread_local dim3 g_grid_dim;
const dim3& thread_idx();
void syncthreads();
uint64_t warp_exchange(uint64_t v, unsigned lane_xor);
void* dynamic_smem_raw();
void run_grid(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);
// Grids run so far, all threads together: lets a test tell that a call went through the device
// path (emulated device memory is host memory, so the host path would give the same bits).
uint64_t grids_run();
// Fault injection: while on, cudaMalloc and cudaMallocHost on the calling OS thread fail with
// cudaErrorMemoryAllocation (a device out of memory, as the engine's device path meets it).
void fail_allocations(bool on);

template <class T>
T* dynamic_smem() {
  return static_cast<T*>(dynamic_smem_raw());
}

template <class K>
struct Launcher {
  K kernel;
  dim3 grid, block;
  size_t smem;
  template <class... A>
  void operator()(const A&... args) const {
    run_grid(grid, block, smem, [&] { kernel(args...); });
  }
};

template <class K>
Launcher<K> launch(K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t) {
  return Launcher<K>{kernel, grid, block, smem};
}

}  // namespace thc_emu

#define threadIdx (::thc_emu::thread_idx())
#define blockIdx (::thc_emu::g_block_idx)
#define blockDim (::thc_emu::g_block_dim)
#define gridDim (::thc_emu::g_grid_dim)

inline void __syncthreads() { thc_emu::syncthreads(); }

inline float __shfl_xor_sync(unsigned, float v, int m) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u = static_cast<uint32_t>(thc_emu::warp_exchange(u, static_cast<unsigned>(m)));
  std::memcpy(&v, &u, 4);
  return v;
}
inline double __shfl_xor_sync(unsigned, double v, int m) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  u = thc_emu::warp_exchange(u, static_cast<unsigned>(m));
  std::memcpy(&v, &u, 8);
  return v;
}
inline unsigned __shfl_xor_sync(unsigned, unsigned v, int m) {
  return static_cast<unsigned>(thc_emu::warp_exchange(v, static_cast<unsigned>(m)));
}

inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline unsigned atomicOr(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = old | v;
  return old;
}
