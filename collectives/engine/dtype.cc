#include "collectives/engine/dtype.h"

#include "collectives/codec/codec_simd.h"

namespace thc::engine {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float";
    case DType::kF16: return "half";
    case DType::kBF16: return "bfloat16";
    case DType::kF64: return "double";
  }
  return "?";
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return elem::bits_float(sign | 0x7F800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    if (man == 0) return elem::bits_float(sign);
    // Denormal: value = man * 2^-24.
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return elem::bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t float_to_half(float f) {
  const uint32_t u = elem::float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow -> Inf
  if (a < 0x38800000u) {
    // Result is a half denormal (or zero): round a * 2^24 to nearest even integer.
    const float v = elem::bits_float(a) * 16777216.0f;
    float r = static_cast<float>(static_cast<int32_t>(v));
    const float frac = v - r;
    if (frac > 0.5f || (frac == 0.5f && (static_cast<int32_t>(r) & 1))) r += 1.0f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(r));
  }
  // Normal: rebias exponent, round mantissa to 10 bits (nearest even).
  uint32_t m = a - 0x38000000u;  // exponent - 112
  m += 0xFFFu + ((m >> 13) & 1u);
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(m >> 13));
}

void load_as_float(const void* in, DType t, uint64_t first, uint64_t n, const float* add, float* out) {
  if (n == 0) return;  // the buffers of an empty tensor may be NULL (memcpy's are never)
  switch (t) {
    case DType::kF32: {
      const float* p = static_cast<const float*>(in) + first;
      if (add) {
        codec::kern::add_pair(p, add, n, out);
      } else {
        std::memcpy(out, p, n * sizeof(float));
      }
      return;
    }
    case DType::kF16: {
      const uint16_t* p = static_cast<const uint16_t*>(in) + first;
      for (uint64_t i = 0; i < n; ++i) out[i] = half_to_float(p[i]) + (add ? add[i] : 0.f);
      return;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(in) + first;
      for (uint64_t i = 0; i < n; ++i) out[i] = bf16_to_float(p[i]) + (add ? add[i] : 0.f);
      return;
    }
    case DType::kF64: {
      const double* p = static_cast<const double*>(in) + first;
      // Values beyond float range become Inf and are rejected by the prelude, not truncated.
      for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]) + (add ? add[i] : 0.f);
      return;
    }
  }
}

void store_from_float(const float* in, uint64_t n, DType t, void* out, uint64_t first) {
  if (n == 0) return;
  switch (t) {
    case DType::kF32:
      std::memcpy(static_cast<float*>(out) + first, in, n * sizeof(float));
      return;
    case DType::kF16: {
      uint16_t* p = static_cast<uint16_t*>(out) + first;
      for (uint64_t i = 0; i < n; ++i) p[i] = float_to_half(in[i]);
      return;
    }
    case DType::kBF16: {
      uint16_t* p = static_cast<uint16_t*>(out) + first;
      for (uint64_t i = 0; i < n; ++i) p[i] = float_to_bf16(in[i]);
      return;
    }
    case DType::kF64: {
      double* p = static_cast<double*>(out) + first;
      for (uint64_t i = 0; i < n; ++i) p[i] = in[i];
      return;
    }
  }
}

}  // namespace thc::engine
