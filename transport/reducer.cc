#include "transport/reducer.h"

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
template <typename T>
void lookup_t(const LookupTable& t, const uint8_t* packed, uint64_t first, uint64_t n, void* dst) {
  T* d = static_cast<T*>(dst);
  const int32_t* v = t.values.data();
  if (t.bits == 8) {
    for (uint64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + v[packed[first + i]]);
  } else if (t.bits == 4 && (first & 1) == 0) {
    const uint8_t* p = packed + first / 2;
    uint64_t i = 0;
    for (; i + 1 < n; i += 2) {
      const uint8_t byte = p[i / 2];
      d[i] = static_cast<T>(d[i] + v[byte & 0xF]);
      d[i + 1] = static_cast<T>(d[i + 1] + v[byte >> 4]);
    }
    if (i < n) d[i] = static_cast<T>(d[i] + v[p[i / 2] & 0xF]);
  } else {
    for (uint64_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] + v[elem::packed_get(packed, first + i, t.bits)]);
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
