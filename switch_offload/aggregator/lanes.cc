#include "switch_offload/aggregator/lanes.h"

#include <cstring>

#include "switch_offload/protocol/wire.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define THC_LANES_X86 1
#endif

namespace thc::switch_offload::lanes {

namespace {

template <typename T>
T load_reg(const uint8_t* r, int i) {
  T v;
  std::memcpy(&v, r + static_cast<size_t>(i) * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void store_reg(uint8_t* r, int i, T v) {
  std::memcpy(r + static_cast<size_t>(i) * sizeof(T), &v, sizeof(T));
}

template <typename T>
void lookup_scalar(uint8_t* regs, const uint8_t* pl, int count, int bits, const int32_t* table, bool subtract) {
  T t[256];
  const int n = 1 << bits;
  for (int z = 0; z < n; ++z) {
    const T v = static_cast<T>(static_cast<uint32_t>(table[z]));
    t[z] = subtract ? static_cast<T>(T(0) - v) : v;
  }
  const uint32_t mask = (1u << bits) - 1u;
  int i = 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  // Eight indices of b bits are exactly b bytes: one small load (LSB-first stream = a
  // little-endian word), eight shifts.
  for (; i + 8 <= count; i += 8) {
    uint64_t w = 0;
    std::memcpy(&w, pl + static_cast<size_t>(i / 8) * static_cast<size_t>(bits), static_cast<size_t>(bits));
    for (int k = 0; k < 8; ++k) {
      const uint32_t z = static_cast<uint32_t>(w >> (k * bits)) & mask;
      store_reg<T>(regs, i + k, static_cast<T>(load_reg<T>(regs, i + k) + t[z]));
    }
  }
#endif
  for (; i < count; ++i) {
    const uint32_t z = proto::get_index(pl, static_cast<uint64_t>(i), bits);
    store_reg<T>(regs, i, static_cast<T>(load_reg<T>(regs, i) + t[z]));
  }
}

#if THC_LANES_X86
// THC's common case: 4-bit indices summed into u8 registers. PSHUFB looks 16 table entries up for
// 16 indices at once: 32 lanes per 16 payload bytes.
__attribute__((target("ssse3"))) void lookup4_u8_ssse3(uint8_t* regs, const uint8_t* pl, int count,
                                                       const int32_t* table, bool subtract) {
  alignas(16) uint8_t t8[16];
  for (int z = 0; z < 16; ++z) {
    const uint8_t v = static_cast<uint8_t>(static_cast<uint32_t>(table[z]));
    t8[z] = subtract ? static_cast<uint8_t>(0u - v) : v;
  }
  const __m128i t = _mm_load_si128(reinterpret_cast<const __m128i*>(t8));
  const __m128i nib = _mm_set1_epi8(0x0F);
  int i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pl + i / 2));
    const __m128i lo = _mm_shuffle_epi8(t, _mm_and_si128(b, nib));
    const __m128i hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(b, 4), nib));
    __m128i* r = reinterpret_cast<__m128i*>(regs + i);
    _mm_storeu_si128(r, _mm_add_epi8(_mm_loadu_si128(r), _mm_unpacklo_epi8(lo, hi)));
    _mm_storeu_si128(r + 1, _mm_add_epi8(_mm_loadu_si128(r + 1), _mm_unpackhi_epi8(lo, hi)));
  }
  for (; i < count; ++i) {
    const uint32_t z = (pl[i / 2] >> ((i & 1) * 4)) & 0xF;
    regs[i] = static_cast<uint8_t>(regs[i] + t8[z]);
  }
}
bool have_ssse3() {
  static const bool yes = __builtin_cpu_supports("ssse3");
  return yes;
}
#endif

}  // namespace

void add_values(uint8_t* regs, int w, const uint8_t* pl, int count, bool subtract) {
  // Plain loops over contiguous bytes: the compiler vectorizes them (byte swaps included).
  if (w == 1) {
    if (subtract) {
      for (int i = 0; i < count; ++i) regs[i] = static_cast<uint8_t>(regs[i] - pl[i]);
    } else {
      for (int i = 0; i < count; ++i) regs[i] = static_cast<uint8_t>(regs[i] + pl[i]);
    }
  } else if (w == 2) {
    for (int i = 0; i < count; ++i) {
      const uint16_t v = static_cast<uint16_t>((pl[2 * i] << 8) | pl[2 * i + 1]);
      const uint16_t r = load_reg<uint16_t>(regs, i);
      store_reg<uint16_t>(regs, i, static_cast<uint16_t>(subtract ? r - v : r + v));
    }
  } else {
    for (int i = 0; i < count; ++i) {
      const uint32_t v = proto::load_be32(pl + 4 * i);
      const uint32_t r = load_reg<uint32_t>(regs, i);
      store_reg<uint32_t>(regs, i, subtract ? r - v : r + v);
    }
  }
}

void add_lookup(uint8_t* regs, int w, const uint8_t* pl, int count, int bits, const int32_t* table, bool subtract) {
#if THC_LANES_X86
  if (w == 1 && bits == 4 && have_ssse3()) return lookup4_u8_ssse3(regs, pl, count, table, subtract);
#endif
  if (w == 1) return lookup_scalar<uint8_t>(regs, pl, count, bits, table, subtract);
  if (w == 2) return lookup_scalar<uint16_t>(regs, pl, count, bits, table, subtract);
  lookup_scalar<uint32_t>(regs, pl, count, bits, table, subtract);
}

void max_u32(uint8_t* regs, const uint8_t* pl, int count) {
  for (int i = 0; i < count; ++i) {
    const uint32_t v = proto::load_be32(pl + 4 * i);
    const uint32_t r = load_reg<uint32_t>(regs, i);
    store_reg<uint32_t>(regs, i, v > r ? v : r);
  }
}

void store(const uint8_t* regs, int w, int count, uint8_t* out) {
  if (w == 1) {
    std::memcpy(out, regs, static_cast<size_t>(count));
  } else if (w == 2) {
    for (int i = 0; i < count; ++i) {
      const uint16_t v = load_reg<uint16_t>(regs, i);
      out[2 * i] = static_cast<uint8_t>(v >> 8);
      out[2 * i + 1] = static_cast<uint8_t>(v);
    }
  } else {
    for (int i = 0; i < count; ++i) proto::store_be32(out + 4 * i, load_reg<uint32_t>(regs, i));
  }
}

}  // namespace thc::switch_offload::lanes
