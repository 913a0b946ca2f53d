// The lane arithmetic; THC's common case (4-bit indices into u8 sums) and Cnat's (indices of up
// to 5 bits into 16-bit sums) are Highway kernels with dynamic dispatch, as the codec's
// (collectives/codec/codec_simd.cc), the rest plain loops.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "switch_offload/aggregator/lanes.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cstring>

#include "common/lookup32_u16-inl.h"
#include "common/simd_cap.h"  // THC_SIMD
#include "switch_offload/aggregator/lanes.h"
#include "switch_offload/protocol/wire.h"

HWY_BEFORE_NAMESPACE();
namespace thc::switch_offload::lanes::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// regs[i] += t8[index i] for the packed 4-bit indices (LSB first: element 2k is the low nibble of
// byte k), i < count. A byte shuffle looks 16 table entries up per 128-bit block (the table is in
// every block). Interleaving the low and high nibbles puts indices in element order only within
// a block, so the packed bytes are first spread so that block b holds bytes 8b..8b+7 and
// N/2+8b..N/2+8b+7 (one 64-bit lane permute): the two interleaves then give elements 0..N-1 and
// N..2N-1 in order.
// kSet: regs[i] = t8[index i] (the first contribution: the registers are not read).
template <bool kSet>
HWY_INLINE void Lookup4U8(uint8_t* HWY_RESTRICT regs, const uint8_t* HWY_RESTRICT pl, int count,
                          const uint8_t* HWY_RESTRICT t8) {
  const hn::ScalableTag<uint8_t> d8;
  const size_t N = hn::Lanes(d8);
  int i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::Repartition<uint64_t, decltype(d8)> d64;
  const hn::Repartition<uint16_t, decltype(d8)> d16;
  const size_t M = hn::Lanes(d64);
  HWY_ALIGN uint64_t spread[HWY_MAX_BYTES / 8];
  for (size_t k = 0; k < M; ++k) spread[k] = (k & 1) ? M / 2 + k / 2 : k / 2;
  const auto perm = hn::SetTableIndices(d64, spread);
  const auto tbl = hn::LoadDup128(d8, t8);
  const auto low = hn::Set(d8, 0x0F);
  for (; i + static_cast<int>(2 * N) <= count; i += static_cast<int>(2 * N)) {
    const auto p = hn::BitCast(d8, hn::TableLookupLanes(hn::BitCast(d64, hn::LoadU(d8, pl + i / 2)), perm));
    const auto lo = hn::And(p, low);
    const auto hi = hn::And(hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(d16, p))), low);
    const auto a = hn::TableLookupBytes(tbl, hn::InterleaveLower(d8, lo, hi));
    const auto b = hn::TableLookupBytes(tbl, hn::InterleaveUpper(d8, lo, hi));
    if constexpr (kSet) {
      hn::StoreU(a, d8, regs + i);
      hn::StoreU(b, d8, regs + i + N);
    } else {
      hn::StoreU(hn::Add(hn::LoadU(d8, regs + i), a), d8, regs + i);
      hn::StoreU(hn::Add(hn::LoadU(d8, regs + i + N), b), d8, regs + i + N);
    }
  }
#else
  (void)N;
#endif
  for (; i < count; ++i) {
    const uint32_t z = (pl[i / 2] >> ((i & 1) * 4)) & 0xF;
    regs[i] = kSet ? t8[z] : static_cast<uint8_t>(regs[i] + t8[z]);
  }
}
// regs[i] (u16, host order) += t16[index i] (kSet: =) for packed b-bit indices, b <= 5 (Cnat's
// codes into 16-bit sums), i < count; t16 holds 32 entries. 16 indices per step: unpacked to bytes
// (8 indices are b bytes: one pdep each on x86, shifts elsewhere; whole 8-byte loads while they
// stay inside the payload's count * b / 8 bytes, exact-size copies at its end), then looked up as
// in the codec's reduction (common/lookup32_u16-inl.h). Returns the indices done (a multiple of
// 16); the caller's scalar loop takes the rest.
template <bool kSet>
HWY_INLINE int LookupU16(uint8_t* HWY_RESTRICT regs, const uint8_t* HWY_RESTRICT pl, int count, int bits,
                         const uint16_t* HWY_RESTRICT t16) {
  int i = 0;
#if HWY_TARGET != HWY_SCALAR
  const simd::HWY_NAMESPACE::Lookup32U16 lut(t16);
  const hn::Full128<uint16_t> d16;
  const size_t b = static_cast<size_t>(bits);
  const size_t plen = (static_cast<size_t>(count) * b + 7) / 8;
  const uint64_t mask = 0x0101010101010101ull * ((1u << bits) - 1u);
  auto unpack8 = [&](size_t off, uint8_t* out) {
    uint64_t w = 0;
    if (off + 8 <= plen) {
      std::memcpy(&w, pl + off, 8);
    } else {
      std::memcpy(&w, pl + off, b);
    }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    const uint64_t u = _pdep_u64(w, mask);
#else
    uint64_t u = 0;
    for (int k = 0; k < 8; ++k) u |= ((w >> (k * bits)) & ((1u << bits) - 1u)) << (8 * k);
    (void)mask;
#endif
    std::memcpy(out, &u, 8);
  };
  HWY_ALIGN uint8_t idx[16];
  for (; i + 16 <= count; i += 16) {
    unpack8(static_cast<size_t>(i) / 8 * b, idx);
    unpack8(static_cast<size_t>(i) / 8 * b + b, idx + 8);
    hn::Vec<decltype(d16)> a, z;
    lut.Get(idx, &a, &z);
    auto* r = reinterpret_cast<uint16_t*>(regs + 2 * static_cast<size_t>(i));
    if constexpr (!kSet) {
      a = hn::Add(hn::LoadU(d16, r), a);
      z = hn::Add(hn::LoadU(d16, r + 8), z);
    }
    hn::StoreU(a, d16, r);
    hn::StoreU(z, d16, r + 8);
  }
#else
  (void)regs;
  (void)pl;
  (void)count;
  (void)bits;
  (void)t16;
#endif
  return i;
}

void Lookup4U8Impl(uint8_t* HWY_RESTRICT regs, const uint8_t* HWY_RESTRICT pl, int count,
                   const uint8_t* HWY_RESTRICT t8) {
  Lookup4U8<false>(regs, pl, count, t8);
}
int LookupU16Impl(uint8_t* HWY_RESTRICT regs, const uint8_t* HWY_RESTRICT pl, int count, int bits,
                  const uint16_t* HWY_RESTRICT t16) {
  return LookupU16<false>(regs, pl, count, bits, t16);
}
int LookupU16SetImpl(uint8_t* HWY_RESTRICT regs, const uint8_t* HWY_RESTRICT pl, int count, int bits,
                     const uint16_t* HWY_RESTRICT t16) {
  return LookupU16<true>(regs, pl, count, bits, t16);
}
void Lookup4U8SetImpl(uint8_t* HWY_RESTRICT regs, const uint8_t* HWY_RESTRICT pl, int count,
                      const uint8_t* HWY_RESTRICT t8) {
  Lookup4U8<true>(regs, pl, count, t8);
}

}  // namespace thc::switch_offload::lanes::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace thc::switch_offload::lanes {

HWY_EXPORT(Lookup4U8Impl);
HWY_EXPORT(Lookup4U8SetImpl);
HWY_EXPORT(LookupU16Impl);
HWY_EXPORT(LookupU16SetImpl);

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

template <typename T, bool kSet = false>
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
      store_reg<T>(regs, i + k, kSet ? t[z] : static_cast<T>(load_reg<T>(regs, i + k) + t[z]));
    }
  }
#endif
  for (; i < count; ++i) {
    const uint32_t z = proto::get_index(pl, static_cast<uint64_t>(i), bits);
    store_reg<T>(regs, i, kSet ? t[z] : static_cast<T>(load_reg<T>(regs, i) + t[z]));
  }
}

// The SIMD lookup reads the LSB-first index stream as little-endian words.
constexpr bool kLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

// 16-bit registers: indices of up to 5 bits through the SIMD kernel (the table's first 2^bits
// entries, negated for subtract), the rest (and wider indices) by lookup_scalar.
template <bool kSet>
void lookup_u16(uint8_t* regs, const uint8_t* pl, int count, int bits, const int32_t* table, bool subtract) {
  int done = 0;
  if (kLittleEndian && bits <= 5) {
    uint16_t t16[32] = {};
    for (int z = 0; z < (1 << bits); ++z) {
      const uint16_t v = static_cast<uint16_t>(static_cast<uint32_t>(table[z]));
      t16[z] = subtract ? static_cast<uint16_t>(0u - v) : v;
    }
    done = kSet ? HWY_DYNAMIC_DISPATCH(LookupU16SetImpl)(regs, pl, count, bits, t16)
                : HWY_DYNAMIC_DISPATCH(LookupU16Impl)(regs, pl, count, bits, t16);
  }
  lookup_scalar<uint16_t, kSet>(regs + 2 * static_cast<size_t>(done), pl + static_cast<size_t>(done / 8 * bits),
                                count - done, bits, table, subtract);
}

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
  if (w == 1 && bits == 4) {
    // Subtraction adds the negated entries (mod 256).
    alignas(16) uint8_t t8[16];
    for (int z = 0; z < 16; ++z) {
      const uint8_t v = static_cast<uint8_t>(static_cast<uint32_t>(table[z]));
      t8[z] = subtract ? static_cast<uint8_t>(0u - v) : v;
    }
    return HWY_DYNAMIC_DISPATCH(Lookup4U8Impl)(regs, pl, count, t8);
  }
  if (w == 1) return lookup_scalar<uint8_t>(regs, pl, count, bits, table, subtract);
  if (w == 2) return lookup_u16<false>(regs, pl, count, bits, table, subtract);
  lookup_scalar<uint32_t>(regs, pl, count, bits, table, subtract);
}

void set_values(uint8_t* regs, int w, const uint8_t* pl, int count) {
  if (w == 1) {
    std::memcpy(regs, pl, static_cast<size_t>(count));
  } else if (w == 2) {
    for (int i = 0; i < count; ++i) store_reg<uint16_t>(regs, i, static_cast<uint16_t>((pl[2 * i] << 8) | pl[2 * i + 1]));
  } else {
    for (int i = 0; i < count; ++i) store_reg<uint32_t>(regs, i, proto::load_be32(pl + 4 * i));
  }
}

void set_lookup(uint8_t* regs, int w, const uint8_t* pl, int count, int bits, const int32_t* table) {
  if (w == 1 && bits == 4) {
    alignas(16) uint8_t t8[16];
    for (int z = 0; z < 16; ++z) t8[z] = static_cast<uint8_t>(static_cast<uint32_t>(table[z]));
    return HWY_DYNAMIC_DISPATCH(Lookup4U8SetImpl)(regs, pl, count, t8);
  }
  if (w == 1) return lookup_scalar<uint8_t, true>(regs, pl, count, bits, table, false);
  if (w == 2) return lookup_u16<true>(regs, pl, count, bits, table, false);
  lookup_scalar<uint32_t, true>(regs, pl, count, bits, table, false);
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
#endif  // HWY_ONCE
