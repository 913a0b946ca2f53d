// DeviceCodec, the scheme dispatch of encode/decode, the parameter server's lookup-and-sum
// kernel and small helpers.
#include <algorithm>
#include <atomic>
#include <vector>

#include "cuda/common.cuh"
#include "cuda/launch.cuh"

namespace thc::cuda {
namespace detail {

cudaError_t thc_encode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                       uint64_t first_block, uint64_t nblocks, const void* x, InType xt, const float* ef,
                       const float* d_stats, const Rng& rng, const EncodeOut& out, const uint32_t* d_check,
                       cudaStream_t stream, const LaunchOpts& opts);
cudaError_t thc_decode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                       uint64_t first_block, uint64_t nblocks, const void* sums, ValueLayout layout,
                       const float* d_stats, const Rng& rng, int contributors, bool mean, void* out, InType ot,
                       const uint32_t* d_check, uint32_t* d_status, cudaStream_t stream, const LaunchOpts& opts);
cudaError_t nat_encode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                       uint64_t first_block, uint64_t nblocks, const void* x, InType xt, const float* ef,
                       const float* d_stats, const Rng& rng, const EncodeOut& out, const uint32_t* d_check,
                       cudaStream_t stream);
cudaError_t nat_decode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                       uint64_t first_block, uint64_t nblocks, const void* sums, ValueLayout layout,
                       const float* d_stats, const Rng& rng, int contributors, bool mean, void* out, InType ot,
                       const uint32_t* d_check, uint32_t* d_status, cudaStream_t stream);

cudaError_t thc_prepare_device();

namespace {

constexpr int kMaxDevices = 64;
std::atomic<int> g_smem_optin[kMaxDevices];
std::atomic<int> g_sms[kMaxDevices];

int cached_attr(std::atomic<int>* cache, cudaDeviceAttr attr, int fallback) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return fallback;
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v > 0) return v;
  if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v <= 0) return fallback;
  cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

constexpr unsigned kLookupThreads = 256;

template <class T>
__global__ void __launch_bounds__(kLookupThreads)
    lookup_sum_kernel(const uint8_t* __restrict__ packed, int nranks, size_t stride, uint64_t chunks, int bits,
                      const int32_t* __restrict__ table, void* sums) {
  __shared__ int32_t t[256];
  const int K = 1 << bits;
  for (int i = threadIdx.x; i < K; i += blockDim.x) t[i] = table[i];
  __syncthreads();
  for (uint64_t c = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    int32_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int r = 0; r < nranks; ++r) {
      uint32_t codes[8];
      load_packed8(packed + r * stride + c * bits, bits, codes);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += t[codes[k]];
    }
    store_native8<T>(sums, 8 * c, 8, acc);
  }
}

__global__ void increment_kernel(uint32_t* counter) { *counter += 1; }

constexpr unsigned kElemThreads = 256;

template <class T>
__global__ void __launch_bounds__(kElemThreads)
    scale_store_kernel(const float* __restrict__ in, uint64_t n, float factor, T* __restrict__ out) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x)
    out[i] = from_float<T>(factor * in[i]);
}

template <class T>
__global__ void __launch_bounds__(kElemThreads)
    add_input_kernel(const T* __restrict__ x, const float* __restrict__ add, uint64_t n, float* __restrict__ out) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n; i += uint64_t{gridDim.x} * blockDim.x)
    out[i] = add ? to_float(x[i]) + add[i] : to_float(x[i]);
}

unsigned elem_grid(uint64_t n) {
  const uint64_t want = (n + kElemThreads - 1) / kElemThreads;
  return static_cast<unsigned>(std::max<uint64_t>(1, std::min<uint64_t>(want, 8ull * device_sms())));
}

}  // namespace

int device_smem_optin() { return cached_attr(g_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024); }
int device_sms() { return cached_attr(g_sms, cudaDevAttrMultiProcessorCount, 1); }

}  // namespace detail

size_t in_size(InType t) { return t == InType::kF32 ? 4 : 2; }

size_t value_bytes(codec::IntType t, ValueLayout l, uint64_t wire_elems) {
  const size_t w = codec::int_size(t);
  if (w == 2 && l == ValueLayout::kPairs) return (wire_elems + 1) / 2 * 4;
  return wire_elems * w;
}

DeviceCodec::~DeviceCodec() {
  if (d_table_) cudaFree(d_table_);
  if (d_cells_) cudaFree(d_cells_);
}

cudaError_t DeviceCodec::init(const codec::Codec& c) {
  if (d_table_) return cudaErrorInvalidValue;  // one codec per object
  Desc d{};
  d.rotates = c.rotates();
  d.kind = elem::scale_kind(c.rotates(), c.scheme() == codec::Scheme::kDnat, c.params().dnat_norm);
  d.block_log2 = c.params().block_log2;
  d.bits = c.index_bits();
  d.g = c.granularity();
  d.levels = c.levels();
  // The same float constants Codec::encode / decode compute.
  d.t = static_cast<float>(c.t_p());
  d.gf = static_cast<float>(c.granularity());
  d.g2t = d.rotates ? static_cast<float>(c.granularity() / (2.0 * c.t_p())) : 0.0f;
  d.step = d.rotates ? static_cast<float>(2.0 * c.t_p() / c.granularity()) : 0.0f;
  d.half_g = 0.5f * static_cast<float>(c.granularity());
  d.sum_type = c.sum_type();
  const std::vector<int32_t>& tab = c.table();
  THC_CUDA_TRY(cudaMalloc(&d_table_, tab.size() * sizeof(int32_t)));
  THC_CUDA_TRY(cudaMemcpy(d_table_, tab.data(), tab.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  d.table = d_table_;
  if (d.rotates && !c.cells().empty()) {
    const size_t bytes = c.cells().size() * sizeof(elem::ThcCell);
    THC_CUDA_TRY(cudaMalloc(&d_cells_, bytes));
    THC_CUDA_TRY(cudaMemcpy(d_cells_, c.cells().data(), bytes, cudaMemcpyHostToDevice));
  }
  // cudaMemcpy from pageable memory may return before its DMA lands; kernels on non-blocking
  // streams are not ordered after the default stream, so wait for the copies here.
  THC_CUDA_TRY(cudaStreamSynchronize(0));
  d.cells = d_cells_;
  desc_ = d;
  return cudaSuccess;
}

cudaError_t encode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                   uint64_t first_block, uint64_t nblocks, const void* x, InType xt, const float* ef,
                   const float* d_stats, const Rng& rng, const EncodeOut& out, const uint32_t* d_check,
                   cudaStream_t stream, const LaunchOpts& opts) {
  if (!c.ready()) return cudaErrorInvalidValue;
  if (c.desc().rotates)
    return detail::thc_encode(d_temp, temp_bytes, c, lay, first_block, nblocks, x, xt, ef, d_stats, rng, out,
                              d_check, stream, opts);
  return detail::nat_encode(d_temp, temp_bytes, c, lay, first_block, nblocks, x, xt, ef, d_stats, rng, out, d_check,
                            stream);
}

cudaError_t decode(void* d_temp, size_t* temp_bytes, const DeviceCodec& c, const codec::Layout& lay,
                   uint64_t first_block, uint64_t nblocks, const void* sums, ValueLayout layout,
                   const float* d_stats, const Rng& rng, int contributors, bool mean, void* out, InType ot,
                   const uint32_t* d_check, uint32_t* d_status, cudaStream_t stream, const LaunchOpts& opts) {
  if (!c.ready()) return cudaErrorInvalidValue;
  if (c.desc().rotates)
    return detail::thc_decode(d_temp, temp_bytes, c, lay, first_block, nblocks, sums, layout, d_stats, rng,
                              contributors, mean, out, ot, d_check, d_status, stream, opts);
  return detail::nat_decode(d_temp, temp_bytes, c, lay, first_block, nblocks, sums, layout, d_stats, rng,
                            contributors, mean, out, ot, d_check, d_status, stream);
}

cudaError_t lookup_sum(const DeviceCodec& c, const uint8_t* packed, int nranks, size_t shard_stride,
                       uint64_t shard_elems, void* sums, cudaStream_t stream) {
  if (!c.ready() || shard_elems % 8 != 0 || nranks < 1) return cudaErrorInvalidValue;
  const uint64_t chunks = shard_elems / 8;
  if (chunks == 0) return cudaSuccess;
  const uint64_t want = (chunks + detail::kLookupThreads - 1) / detail::kLookupThreads;
  const unsigned grid = static_cast<unsigned>(std::min<uint64_t>(want, 8ull * detail::device_sms()));
  const auto& d = c.desc();
  switch (d.sum_type) {
#define THC_CASE(E, T)                                                                                     \
  case E:                                                                                                  \
    THC_LAUNCH(detail::lookup_sum_kernel<T>, grid, detail::kLookupThreads, 0, stream)(                     \
        packed, nranks, shard_stride, chunks, d.bits, d.table, sums);                                      \
    break;
    THC_CUDA_FOR_EACH_SUMTYPE(THC_CASE)
#undef THC_CASE
  }
  return cudaGetLastError();
}

cudaError_t scale_store(const float* in, uint64_t n, float factor, void* out, InType ot, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = detail::elem_grid(n);
  switch (ot) {
#define THC_CASE(E, T)                                                                                     \
  case E:                                                                                                  \
    THC_LAUNCH(detail::scale_store_kernel<T>, grid, detail::kElemThreads, 0, stream)(                      \
        in, n, factor, static_cast<T*>(out));                                                              \
    break;
    THC_CUDA_FOR_EACH_INTYPE(THC_CASE)
#undef THC_CASE
  }
  return cudaGetLastError();
}

cudaError_t add_input(const void* x, InType xt, const float* add, uint64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned grid = detail::elem_grid(n);
  switch (xt) {
#define THC_CASE(E, T)                                                                                     \
  case E:                                                                                                  \
    THC_LAUNCH(detail::add_input_kernel<T>, grid, detail::kElemThreads, 0, stream)(                        \
        static_cast<const T*>(x), add, n, out);                                                            \
    break;
    THC_CUDA_FOR_EACH_INTYPE(THC_CASE)
#undef THC_CASE
  }
  return cudaGetLastError();
}

cudaError_t prepare_device() { return detail::thc_prepare_device(); }

cudaError_t increment(uint32_t* counter, cudaStream_t stream) {
  THC_LAUNCH(detail::increment_kernel, 1, 1, 0, stream)(counter);
  return cudaGetLastError();
}

}  // namespace thc::cuda
