// Helpers of the GPU tests. The same test sources build twice: against the CUDA runtime (they
// skip when no device answers) and against the CPU emulator (tests/cuda/emu, always runs).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace thc::cuda::test {

inline bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

inline bool emulated() {
#if defined(THC_CUDA_EMULATION)
  return true;
#else
  return false;
#endif
}

#define THC_REQUIRE_DEVICE()                                                 \
  do {                                                                       \
    if (!::thc::cuda::test::have_device()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

#define ASSERT_CUDA(expr)                                                                  \
  do {                                                                                     \
    const cudaError_t e_ = (expr);                                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);                 \
  } while (0)

// A device buffer of n elements of T, freed on scope exit.
template <class T>
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t n) { alloc(n); }
  explicit DevBuf(const std::vector<T>& v) {
    alloc(v.size());
    upload(v);
  }
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void alloc(size_t n) {
    if (p_) cudaFree(p_);
    n_ = n;
    p_ = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&p_), (n ? n : 1) * sizeof(T)) != cudaSuccess) p_ = nullptr;
    if (p_) cudaMemset(p_, 0, (n ? n : 1) * sizeof(T));
  }
  void upload(const std::vector<T>& v) { cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    cudaDeviceSynchronize();
    if (n_) cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> gaussian(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// Dyadic inputs k/64, |k| <= 128: exact in f16 and bf16, and every sum of squares is exact in
// double in any order, so host and device preludes agree bit for bit.
inline std::vector<float> dyadic(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(-128, 128);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(gen)) / 64.0f;
  return v;
}

inline uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Distance in units in the last place between two finite floats of the same sign (large if not).
inline uint32_t ulp_diff(float a, float b) {
  if (a == b) return 0;
  if (!std::isfinite(a) || !std::isfinite(b) || std::signbit(a) != std::signbit(b)) return 0xFFFFFFFFu;
  const uint32_t x = fbits(a) & 0x7FFFFFFFu, y = fbits(b) & 0x7FFFFFFFu;
  return x > y ? x - y : y - x;
}

}  // namespace thc::cuda::test
