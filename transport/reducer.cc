#include "transport/reducer.h"

#include <algorithm>
#include <cstring>

#include "collectives/codec/codec_simd.h"
#include "collectives/codec/elem.h"

namespace thc::transport {
namespace {
template <typename T>
void add_t(void* dst, const void* src, uint64_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  // Unsigned wrap is well defined; the codec sized the type so that no sum overflows.
  for (uint64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + s[i]);
}
// 4-bit indices into 16-bit sums, four elements per step: one lookup per packed byte in a
// 256-entry table of both lanes' values, added as lanes of a 64-bit word (SWAR: the top bit of each
// lane is added apart so that no carry crosses into the next lane; the wrap within a lane is the
// same as the element-wise unsigned addition). Returns how many elements it did (a multiple of 4).
uint64_t lookup4_u16_swar(const int32_t* v, const uint8_t* p, uint64_t n, uint16_t* d) {
  constexpr uint64_t kH = 0x8000800080008000ull;
  uint64_t pair[256];
  for (int b = 0; b < 256; ++b)
    pair[b] = (static_cast<uint64_t>(static_cast<uint16_t>(v[b & 15]))) |
              (static_cast<uint64_t>(static_cast<uint16_t>(v[b >> 4])) << 16);
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const uint64_t add = pair[p[i / 2]] | (pair[p[i / 2 + 1]] << 32);
    uint64_t cur;
    std::memcpy(&cur, d + i, 8);
    cur = ((cur & ~kH) + (add & ~kH)) ^ ((cur ^ add) & kH);
    std::memcpy(d + i, &cur, 8);
  }
  return i;
}

template <typename T>
void lookup_t(const LookupTable& t, const uint8_t* packed, uint64_t first, uint64_t n, void* dst) {
  T* d = static_cast<T*>(dst);
  const int32_t* v = t.values.data();
  if (t.bits == 8) {
    for (uint64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + v[packed[first + i]]);
  } else if (t.bits == 4 && (first & 1) == 0) {
    const uint8_t* p = packed + first / 2;
    uint64_t i = 0;
    // 8-bit sums: all through a byte shuffle (codec_simd); 16-bit: the bulk in SWAR lanes; the
    // rest (and 32-bit sums) one byte of two nibbles at a time.
    if constexpr (sizeof(T) == 1) {
      uint8_t tbl[16];
      for (int k = 0; k < 16; ++k) tbl[k] = static_cast<uint8_t>(v[k]);
      codec::kern::lookup_add4_u8(tbl, p, n, reinterpret_cast<uint8_t*>(d));
      i = n;
    } else if constexpr (sizeof(T) == 2) {
      i = lookup4_u16_swar(v, p, n, reinterpret_cast<uint16_t*>(d));
    }
    for (; i + 1 < n; i += 2) {
      const uint8_t byte = p[i / 2];
      d[i] = static_cast<T>(d[i] + v[byte & 0xF]);
      d[i + 1] = static_cast<T>(d[i + 1] + v[byte >> 4]);
    }
    if (i < n) d[i] = static_cast<T>(d[i] + v[p[i / 2] & 0xF]);
  } else {
    // Other widths (Cnat's 5 bits): the head up to a byte boundary (every 8th element starts one)
    // element by element, then runs of codes unpacked by the SIMD unpacker and looked up by byte.
    uint64_t i = 0;
    for (; i < n && ((first + i) & 7) != 0; ++i)
      d[i] = static_cast<T>(d[i] + v[elem::packed_get(packed, first + i, t.bits)]);
    // 16-bit sums of codes below 32 (Cnat's default): the SIMD lookup of codec_simd.
    constexpr uint64_t kRun = 4096;
    uint8_t codes[kRun];
    uint16_t tbl16[32] = {};
    const bool simd16 = sizeof(T) == 2 && t.bits <= 5;
    if (simd16)
      for (int k = 0; k < (1 << t.bits); ++k) tbl16[k] = static_cast<uint16_t>(v[k]);
    while (i + 8 <= n) {
      const uint64_t m = std::min<uint64_t>(kRun, (n - i) & ~uint64_t{7});
      codec::kern::unpack_bits_simd(packed + (first + i) / 8 * static_cast<uint64_t>(t.bits), m, t.bits, codes);
      if (simd16) {
        codec::kern::lookup_add32_u16(tbl16, codes, m, reinterpret_cast<uint16_t*>(d + i));
      } else {
        for (uint64_t k = 0; k < m; ++k) d[i + k] = static_cast<T>(d[i + k] + v[codes[k]]);
      }
      i += m;
    }
    for (; i < n; ++i) d[i] = static_cast<T>(d[i] + v[elem::packed_get(packed, first + i, t.bits)]);
  }
}
}  // namespace

void add_ints(IntType t, void* dst, const void* src, uint64_t count) {
  switch (t) {
    case IntType::kU8: case IntType::kI8: return add_t<uint8_t>(dst, src, count);
    case IntType::kU16: case IntType::kI16: return add_t<uint16_t>(dst, src, count);
    case IntType::kU32: case IntType::kI32: return add_t<uint32_t>(dst, src, count);
  }
}

void lookup_add(const LookupTable& table, const uint8_t* packed, uint64_t first, uint64_t count,
                IntType t, void* dst) {
  // Two's complement: adding signed table values into unsigned storage of the same width gives
  // the same bits as signed addition.
  switch (t) {
    case IntType::kU8: case IntType::kI8: return lookup_t<uint8_t>(table, packed, first, count, dst);
    case IntType::kU16: case IntType::kI16: return lookup_t<uint16_t>(table, packed, first, count, dst);
    case IntType::kU32: case IntType::kI32: return lookup_t<uint32_t>(table, packed, first, count, dst);
  }
}

}  // namespace thc::transport
