// The CUDA emulator's scheduler and the subset of the CUDA runtime API the kernels and the
// tests use (see cuda_emu.h).
#include <atomic>
#include "tests/cuda/emu/cuda_emu.h"

#include <boost/context/fiber.hpp>
#include <boost/context/preallocated.hpp>
#include <boost/context/stack_context.hpp>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace thc_emu {

thread_local dim3 g_block_idx;
thread_local dim3 g_block_dim;
thread_local dim3 g_grid_dim;

namespace {

namespace ctx = boost::context;

constexpr size_t kStack = 256 * 1024;

// The fibers' stacks live as long as the OS thread and are reused by every block: the fiber
// gets them preallocated and its allocator frees nothing.
struct KeepStack {
  ctx::stack_context allocate() { std::abort(); }  // never called: stacks come preallocated
  void deallocate(ctx::stack_context&) noexcept {}
};

// Boost.Context switches in user space (a few registers); glibc's swapcontext made a
// sigprocmask system call and saved the FP environment on every switch, which was most of the
// emulator's time (one __syncthreads is a switch per thread of the block).
struct Fiber {
  ctx::fiber self;   // this thread's fiber while it is suspended (empty while it runs or when done)
  ctx::fiber sched;  // the scheduler's continuation while this thread runs
  dim3 tid;
  unsigned linear = 0;
  bool done = false;
  std::unique_ptr<char[]> stack;
};

struct Barrier {
  unsigned arrived = 0;
  uint64_t gen = 0;
};

struct Block {
  std::vector<Fiber> fibers;
  int cur = -1;
  unsigned live = 0;
  std::vector<unsigned> warp_live;
  Barrier block_bar;
  std::vector<Barrier> warp_bar;
  std::vector<uint64_t> warp_buf;  // [warp][lane]
  uint64_t events = 0;
  const std::function<void()>* body = nullptr;
  std::vector<unsigned char> smem;
};

thread_local Block g;

Fiber& me() { return g.fibers[static_cast<size_t>(g.cur)]; }

void yield() {
  Fiber& f = me();
  f.sched = std::move(f.sched).resume();
}

// Arrive at b, which opens when `count` threads have arrived; wait until it opens.
void arrive_and_wait(Barrier& b, const unsigned& count) {
  const uint64_t gen = b.gen;
  ++g.events;
  if (++b.arrived >= count) {
    b.arrived = 0;
    ++b.gen;
    return;
  }
  while (b.gen == gen) yield();
}

// A thread exited: barriers waiting for it may now be complete.
void release_if_complete(Barrier& b, unsigned count) {
  if (b.arrived > 0 && b.arrived >= count) {
    b.arrived = 0;
    ++b.gen;
  }
}

ctx::fiber entry(ctx::fiber&& sched) {
  me().sched = std::move(sched);
  (*g.body)();
  Fiber& f = me();
  f.done = true;
  ++g.events;
  --g.live;
  const unsigned w = f.linear / 32;
  --g.warp_live[w];
  release_if_complete(g.block_bar, g.live);
  release_if_complete(g.warp_bar[w], g.warp_live[w]);
  return std::move(f.sched);
}

}  // namespace

const dim3& thread_idx() { return me().tid; }

void syncthreads() { arrive_and_wait(g.block_bar, g.live); }

uint64_t warp_exchange(uint64_t v, unsigned lane_xor) {
  const unsigned t = me().linear;
  const unsigned w = t / 32, lane = t % 32;
  g.warp_buf[w * 32 + lane] = v;
  arrive_and_wait(g.warp_bar[w], g.warp_live[w]);
  const uint64_t r = g.warp_buf[w * 32 + ((lane ^ lane_xor) & 31u)];
  arrive_and_wait(g.warp_bar[w], g.warp_live[w]);
  return r;
}

void* dynamic_smem_raw() { return g.smem.data(); }

std::atomic<uint64_t> g_grids_run{0};
uint64_t grids_run() { return g_grids_run.load(std::memory_order_relaxed); }

thread_local bool t_fail_allocations = false;
void fail_allocations(bool on) { t_fail_allocations = on; }

void run_grid(dim3 grid, dim3 block, size_t smem, const std::function<void()>& body) {
  g_grids_run.fetch_add(1, std::memory_order_relaxed);
  const unsigned nt = block.x * block.y * block.z;
  if (nt == 0 || nt > 1024) {
    std::fprintf(stderr, "cuda_emu: bad block size %u\n", nt);
    std::abort();
  }
  g_grid_dim = grid;
  g_block_dim = block;
  g.body = &body;
  g.smem.assign(smem + 16, 0);
  if (g.fibers.size() < nt) g.fibers.resize(nt);
  const unsigned nwarps = (nt + 31) / 32;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        g_block_idx = dim3(bx, by, bz);
        // Shared memory starts with garbage on a GPU; poison it so a read before write shows.
        std::memset(g.smem.data(), 0xA5, g.smem.size());
        g.live = nt;
        g.warp_live.assign(nwarps, 0);
        g.warp_bar.assign(nwarps, Barrier{});
        g.warp_buf.assign(nwarps * 32, 0);
        g.block_bar = Barrier{};
        for (unsigned t = 0; t < nt; ++t) {
          Fiber& f = g.fibers[t];
          if (!f.stack) f.stack.reset(new char[kStack]);
          f.linear = t;
          f.tid = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
          f.done = false;
          ++g.warp_live[t / 32];
          ctx::stack_context sc;
          sc.size = kStack;
          sc.sp = f.stack.get() + kStack;  // stacks grow down: the top
          f.self = ctx::fiber(std::allocator_arg, ctx::preallocated(sc.sp, sc.size, sc), KeepStack(), entry);
        }
        while (g.live > 0) {
          const uint64_t before = g.events;
          for (unsigned t = 0; t < nt; ++t) {
            if (g.fibers[t].done) continue;
            g.cur = static_cast<int>(t);
            Fiber& f = g.fibers[t];
            f.self = std::move(f.self).resume();
          }
          g.cur = -1;
          if (g.live > 0 && g.events == before) {
            std::fprintf(stderr, "cuda_emu: deadlock in block (%u,%u,%u): %u threads wait at a barrier that cannot open\n",
                         bx, by, bz, g.live);
            std::abort();
          }
        }
      }
}

}  // namespace thc_emu

// ---- the runtime API subset ------------------------------------------------------------------
extern "C" {

// "Device" allocations are remembered so that cudaPointerGetAttributes can tell device memory
// from host memory (the engine's device path asks).
static std::mutex g_alloc_mu;
static std::map<uintptr_t, size_t>& device_allocs() {
  static auto* m = new std::map<uintptr_t, size_t>();
  return *m;
}

cudaError_t cudaMalloc(void** p, size_t n) {
  if (thc_emu::t_fail_allocations) return cudaErrorMemoryAllocation;
  const size_t bytes = (n + 255) / 256 * 256 + 256;
  *p = std::aligned_alloc(256, bytes);
  if (!*p) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  device_allocs()[reinterpret_cast<uintptr_t>(*p)] = bytes;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p) {
    std::lock_guard<std::mutex> lk(g_alloc_mu);
    device_allocs().erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t n) {
  if (thc_emu::t_fail_allocations) return cudaErrorMemoryAllocation;
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256 + 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof *a);
  a->type = cudaMemoryTypeUnregistered;
  const auto u = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(g_alloc_mu);
  const auto& m = device_allocs();
  auto it = m.upper_bound(u);
  if (it != m.begin()) {
    --it;
    if (u < it->first + it->second) {
      a->type = cudaMemoryTypeDevice;
      a->device = 0;
      a->devicePointer = const_cast<void*>(p);
    }
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  if (n) std::memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t) {
  return cudaMemcpy(d, s, n, k);
}
cudaError_t cudaMemset(void* d, int v, size_t n) {
  if (n) std::memset(d, v, n);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) { return cudaMemset(d, v, n); }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  switch (a) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = 232448; break;  // sm_90
    case cudaDevAttrMultiProcessorCount: *v = 4; break;
    default: *v = 0; break;
  }
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x5));
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* st) {
  *st = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(0x7));
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "cuda_emu (CPU emulator)");
  p->multiProcessorCount = 4;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 1.0f;  // no clock: the emulator's timings mean nothing
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "cuda_emu error"; }

}  // extern "C"
