// The CUDA emulator itself (tests/cuda/emu): block barriers, warp shuffles, threads that exit
// before a barrier, shared memory per block, several OS threads running grids at once, and the
// deadlock report. The kernel tests rely on these semantics; this pins them.
#include "tests/cuda/emu/cuda_emu.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace {

// Sum of blockDim.x values per block by a shared-memory tree (one __syncthreads per level).
__global__ void block_sum(const unsigned* in, unsigned* out) {
  __shared__ unsigned s[1024];
  const unsigned t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) s[t] += s[t + half];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// Butterfly sum inside each warp: every lane ends with its warp's sum.
__global__ void warp_sum(const unsigned* in, unsigned* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned v = in[i];
  for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  out[i] = v;
}

// Odd threads return at once; the even ones still pass two barriers (a barrier counts the
// threads still running, as the kernels assume when a tail block has idle threads).
__global__ void early_exit(unsigned* out) {
  const unsigned t = threadIdx.x;
  if (t % 2) return;
  __shared__ unsigned s[1024];
  s[t] = t;
  __syncthreads();
  out[t] = s[(t + 2) % blockDim.x];
  __syncthreads();
}

// Lane 0 waits at the block barrier while its warp's other lanes wait at a shuffle that needs it.
__global__ void deadlock() {
  if (threadIdx.x == 0) {
    __syncthreads();
  } else if (threadIdx.x < 32) {
    (void)__shfl_xor_sync(0xffffffffu, 1u, 1);
  }
}

std::vector<unsigned> iota_values(size_t n) {
  std::vector<unsigned> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned>(i * 7 + 3);
  return v;
}

TEST(CudaEmu, BlockBarriersOrderSharedMemoryRounds) {
  for (unsigned threads : {32u, 256u, 1024u}) {
    const unsigned blocks = 5;
    const auto in = iota_values(size_t{blocks} * threads);
    std::vector<unsigned> out(blocks, 0);
    thc_emu::launch(block_sum, dim3(blocks), dim3(threads), 0, nullptr)(in.data(), out.data());
    for (unsigned b = 0; b < blocks; ++b) {
      unsigned want = 0;
      for (unsigned t = 0; t < threads; ++t) want += in[b * threads + t];
      EXPECT_EQ(out[b], want) << "block " << b << " of " << threads << " threads";
    }
  }
}

TEST(CudaEmu, WarpShufflesExchangeWithinTheWarp) {
  const unsigned threads = 128, blocks = 3;
  const auto in = iota_values(size_t{blocks} * threads);
  std::vector<unsigned> out(in.size(), 0);
  thc_emu::launch(warp_sum, dim3(blocks), dim3(threads), 0, nullptr)(in.data(), out.data());
  for (size_t w = 0; w < in.size() / 32; ++w) {
    unsigned want = 0;
    for (size_t l = 0; l < 32; ++l) want += in[w * 32 + l];
    for (size_t l = 0; l < 32; ++l) ASSERT_EQ(out[w * 32 + l], want) << "warp " << w << " lane " << l;
  }
}

TEST(CudaEmu, ThreadsThatExitDoNotHoldBarriers) {
  const unsigned threads = 64;
  std::vector<unsigned> out(threads, ~0u);
  thc_emu::launch(early_exit, dim3(1), dim3(threads), 0, nullptr)(out.data());
  for (unsigned t = 0; t < threads; ++t) EXPECT_EQ(out[t], t % 2 ? ~0u : (t + 2) % threads) << t;
}

TEST(CudaEmu, OsThreadsRunGridsAtOnce) {
  const unsigned threads = 256, blocks = 4;
  const auto in = iota_values(size_t{blocks} * threads);
  std::vector<std::vector<unsigned>> outs(4, std::vector<unsigned>(blocks, 0));
  std::vector<std::thread> ts;
  for (auto& o : outs)
    ts.emplace_back([&] {
      for (int rep = 0; rep < 3; ++rep)
        thc_emu::launch(block_sum, dim3(blocks), dim3(threads), 0, nullptr)(in.data(), o.data());
    });
  for (auto& t : ts) t.join();
  for (const auto& o : outs) EXPECT_EQ(o, outs[0]);
  unsigned want = 0;
  for (unsigned t = 0; t < threads; ++t) want += in[t];
  EXPECT_EQ(outs[0][0], want);
}

TEST(CudaEmuDeathTest, ABarrierNobodyCanPassIsReported) {
  EXPECT_DEATH(thc_emu::launch(deadlock, dim3(1), dim3(64), 0, nullptr)(), "deadlock in block");
}

}  // namespace
