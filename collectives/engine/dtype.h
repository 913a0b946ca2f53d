// Input element types and their conversion to and from the float32 the codec computes in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "collectives/codec/elem.h"

namespace thc::engine {

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
  }
  return 0;
}
const char* dtype_name(DType t);

// IEEE binary16 <-> float, round to nearest even, with denormals, Inf and NaN.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
inline float bf16_to_float(uint16_t h) { return elem::bits_float(static_cast<uint32_t>(h) << 16); }
inline uint16_t float_to_bf16(float f) {
  uint32_t u = elem::float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// out[i] = (float) in[first + i] (+ add[i] when add != nullptr)
void load_as_float(const void* in, DType t, uint64_t first, uint64_t n, const float* add, float* out);
// out[first + i] = (T) in[i]
void store_from_float(const float* in, uint64_t n, DType t, void* out, uint64_t first);

}  // namespace thc::engine
