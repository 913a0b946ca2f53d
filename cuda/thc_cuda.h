// The CUDA codec: device kernels with the host codec's exact contract (collectives/codec/codec.h),
// behind CUB-style host entries.
//
// Conventions (CUB's):
//  * every host entry returns cudaError_t and enqueues on the given stream; nothing synchronises;
//  * entries that need scratch memory take (d_temp_storage, temp_storage_bytes): a first call
//    with d_temp_storage == nullptr only writes the size needed (which may be 0) and launches
//    nothing; the second call does the work (cudaErrorInvalidValue if temp_storage_bytes is less
//    than asked, cudaErrorMisalignedAddress unless d_temp_storage is 16-byte aligned);
//  * device pointers only; buffers follow the host codec's layout (codec::Layout): inputs start
//    at the first element of first_block, wire outputs at its first wire element.
//
// Parity: given the same inputs, statistics and seeds, encode produces the same codes as
// Codec::encode and decode the same floats as Codec::decode. The kernels run the FWHT butterflies
// in the host's stage order (h = 1, 2, 4, ...), build with -fmad=false, and derive the scales with
// the shared block_scale.h, so in practice results are bit-identical; the prelude's double sum of
// squares is summed in a different order and can differ in the last bit of the float RMS.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "collectives/codec/block_scale.h"
#include "collectives/codec/codec.h"
#include "collectives/codec/elem.h"

namespace thc::cuda {

enum class InType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
size_t in_size(InType t);

// Memory layout of value-form data (codes' values before the network, sums after it).
//  kNative  an array of the codec's sum type, exactly Codec::encode's `values`.
//  kPairs   for 16-bit sum types: element pairs (2p, 2p+1) as one 32-bit word
//           w = v[2p] + 65536 * v[2p+1] computed modulo 2^32 (ceil(n/2) words). NCCL has no
//           16-bit integer type; a uint32 SUM of such words is exact because the sum is linear
//           and the codec guarantees every lane's total fits 16 bits (|S| <= 32767 signed,
//           S <= 65535 unsigned), so the low lane can be read back without knowing the carries:
//           unsigned lo = w & 0xFFFF, hi = w >> 16; signed lo = int16(w), hi = int32(w - lo) >> 16.
//           For 8- and 32-bit sum types kPairs is the same as kNative.
enum class ValueLayout : int { kNative = 0, kPairs = 1 };
// Bytes of `wire_elems` values in a layout.
size_t value_bytes(codec::IntType t, ValueLayout l, uint64_t wire_elems);

// A codec's constants in device memory (the table and THC's rounding cells) plus the scalars the
// kernels need, flattened from a host codec::Codec. Owns its device memory (current device).
class DeviceCodec {
 public:
  DeviceCodec() = default;
  ~DeviceCodec();
  DeviceCodec(const DeviceCodec&) = delete;
  DeviceCodec& operator=(const DeviceCodec&) = delete;

  // Copies the tables to the current device (synchronous; not for the hot path).
  cudaError_t init(const codec::Codec& c);
  bool ready() const { return d_table_ != nullptr; }

  struct Desc {
    elem::ScaleKind kind;
    bool rotates;
    int block_log2;
    int bits;       // index bits
    int g;          // THC granularity
    int levels;     // natural codes' levels
    float t;        // THC: t_p
    float g2t;      // THC: g / (2 t_p)
    float gf;       // THC: g
    float step;     // THC: 2 t_p / g
    float half_g;   // THC: g / 2
    codec::IntType sum_type;
    const int32_t* table;         // device, 2^bits entries
    const elem::ThcCell* cells;   // device, g entries (THC)
  };
  const Desc& desc() const { return desc_; }

 private:
  Desc desc_{};
  int32_t* d_table_ = nullptr;
  elem::ThcCell* d_cells_ = nullptr;
};

// Randomness of one call. round_ptr (device, nullable) overrides round: the NCCL path keeps the
// call counter on the device so a captured CUDA graph draws fresh randomness on every replay.
struct Rng {
  uint64_t seed = 0;
  uint32_t rank = 0;
  uint32_t round = 0;
  const uint32_t* round_ptr = nullptr;
};

// Launch tuning (tests force the multi-pass RHT on small blocks with it).
struct LaunchOpts {
  // Largest RHT block (log2 elements) done in one pass in shared memory; 0 = as large as the
  // device's opt-in shared memory allows (at most 2^15). Larger blocks take the multi-pass path.
  int max_smem_log2 = 0;
  // Tile (log2 elements) of the multi-pass path's contiguous passes; 0 = 13.
  int multipass_tile_log2 = 0;
  // THC kernel variant bits, for timing them against each other (thc_gpu_bench --variants): 1 =
  // the RHT sign words drawn once per tile into shared memory, 2 = the encode loads its next chunk
  // ahead of the current one's arithmetic, 4 = at most 512 threads per CTA (128 registers each).
  // Float32 inputs only; every variant gives the same bits; 0 is the default until a device
  // session has measured the others (thc_kernels.cu, kVar*).
  int kernel_variant = 0;
};

// The 5-word call check that travels with the prelude statistics through the MAX allreduce:
// [0] non-finite flag (0 or 1), [1..2] digest lo/hi, [3..4] their complements. After the MAX it
// is consistent iff every rank sent the same digest. Kernels given a check skip the
// error-feedback update (encode) or write NaN (decode) when it reports a problem.
constexpr int kCheckWords = 5;
// Bits of the sticky status word decode ORs in on a failed check.
constexpr uint32_t kStatusNonFinite = 1u;
constexpr uint32_t kStatusMismatch = 2u;

// Prelude: per-block statistic of x (+ ef) for all blocks of lay (= Codec::layout(count)), as
// Codec::prelude. d_stats receives lay.nblocks floats. d_check (nullable) receives the
// kCheckWords words for `digest`: the non-finite flag and the digest words.
cudaError_t prelude(void* d_temp_storage, size_t* temp_storage_bytes, const DeviceCodec& c,
                    const codec::Layout& lay, const void* x, InType xt, const float* ef,
                    float* d_stats, uint32_t* d_check, uint64_t digest, cudaStream_t stream);

struct EncodeOut {
  uint8_t* packed = nullptr;                   // index form (elem.h bit order)
  void* values = nullptr;                      // value form, in `layout`
  ValueLayout layout = ValueLayout::kNative;
  float* residual = nullptr;                   // error feedback: x - own dequantised contribution
};

// Codec::encode for blocks [first_block, first_block + nblocks) of lay. x (type xt) and ef
// (nullable: x + ef is encoded) point at the first element of first_block; residual may alias
// ef. d_stats: the global statistics of those blocks. d_check: nullable.
cudaError_t encode(void* d_temp_storage, size_t* temp_storage_bytes, const DeviceCodec& c,
                   const codec::Layout& lay, uint64_t first_block, uint64_t nblocks, const void* x,
                   InType xt, const float* ef, const float* d_stats, const Rng& rng,
                   const EncodeOut& out, const uint32_t* d_check, cudaStream_t stream,
                   const LaunchOpts& opts = LaunchOpts());

// Codec::decode: sums (in `layout`, starting at the first wire element of first_block) of
// `contributors` workers into out (type ot, real elements only). d_check and d_status nullable.
cudaError_t decode(void* d_temp_storage, size_t* temp_storage_bytes, const DeviceCodec& c,
                   const codec::Layout& lay, uint64_t first_block, uint64_t nblocks,
                   const void* sums, ValueLayout layout, const float* d_stats, const Rng& rng,
                   int contributors, bool mean, void* out, InType ot, const uint32_t* d_check,
                   uint32_t* d_status, cudaStream_t stream, const LaunchOpts& opts = LaunchOpts());

// Colocated parameter server, the aggregator's step: `nranks` packed index shards of
// shard_elems elements (a multiple of 8), shard r at packed + r * shard_stride bytes; sums
// receives shard_elems values of the sum type (kNative): sums[i] = sum_r table[index_r(i)].
// With nranks = 1 this is Codec::lookup.
cudaError_t lookup_sum(const DeviceCodec& c, const uint8_t* packed, int nranks,
                       size_t shard_stride, uint64_t shard_elems, void* sums, cudaStream_t stream);

// out[i] = (ot) (factor * in[i]), i < n (partial aggregation: a mean scaled to a sum).
cudaError_t scale_store(const float* in, uint64_t n, float factor, void* out, InType ot, cudaStream_t stream);
// out[i] = (float) x[i] + add[i], i < n (add nullable: plain conversion).
cudaError_t add_input(const void* x, InType xt, const float* add, uint64_t n, float* out, cudaStream_t stream);

// One-time per-device kernel setup (shared-memory limits of the fused RHT kernels). Launches do
// it on first use; call it before capturing launches in a CUDA graph. Not a stream operation.
cudaError_t prepare_device();

// *counter += 1 on the stream (the call counter of the NCCL path).
cudaError_t increment(uint32_t* counter, cudaStream_t stream);

}  // namespace thc::cuda

namespace thc::engine {
class DeviceBackend;
}
namespace thc::cuda {
// The device path of the engine (collectives/engine/device.h); libthc_cuda registers it when
// loaded. Tests with the CPU emulator register it themselves.
engine::DeviceBackend* engine_backend();
}  // namespace thc::cuda
