// A table of 32 16-bit values looked up by byte codes below 32, 16 codes at a time in 128-bit
// vectors: the table as four 16-byte tables (low and high bytes of entries 0..15 and 16..31), each
// code looked up in the two of its half by byte shuffles, the bytes interleaved back into 16-bit
// values in element order. Cnat's lookup-add of indices of up to 5 bits into 16-bit sums, shared
// by the codec's reduction (collectives/codec/codec_simd.cc) and the aggregator's lanes
// (switch_offload/aggregator/lanes.cc).
//
// Included by files that use hwy/foreach_target.h (per-target include guard, as Highway's own
// -inl.h headers).
#if defined(THC_COMMON_LOOKUP32_U16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef THC_COMMON_LOOKUP32_U16_INL_H_
#undef THC_COMMON_LOOKUP32_U16_INL_H_
#else
#define THC_COMMON_LOOKUP32_U16_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace thc::simd::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
class Lookup32U16 {
 public:
  using D8 = hn::Full128<uint8_t>;
  using D16 = hn::Full128<uint16_t>;

  explicit Lookup32U16(const uint16_t* table) {
    HWY_ALIGN uint8_t bytes[4][16];  // [low 0..15, low 16..31, high 0..15, high 16..31]
    for (int k = 0; k < 32; ++k) {
      bytes[k / 16][k % 16] = static_cast<uint8_t>(table[k]);
      bytes[2 + k / 16][k % 16] = static_cast<uint8_t>(table[k] >> 8);
    }
    const D8 d8;
    lo0_ = hn::Load(d8, bytes[0]);
    lo1_ = hn::Load(d8, bytes[1]);
    hi0_ = hn::Load(d8, bytes[2]);
    hi1_ = hn::Load(d8, bytes[3]);
  }

  // The values of the 16 codes at c: codes 0..7 in *a, 8..15 in *b.
  HWY_INLINE void Get(const uint8_t* HWY_RESTRICT c, hn::Vec<D16>* a, hn::Vec<D16>* b) const {
    const D8 d8;
    const D16 d16;
    const hn::Full128<int8_t> di8;
    const auto v = hn::LoadU(d8, c);
    const auto k = hn::And(v, hn::Set(d8, 0x0F));  // (an index above 15 is not defined on every target)
    const auto upper = hn::RebindMask(d8, hn::Gt(hn::BitCast(di8, v), hn::Set(di8, 15)));
    const auto lo = hn::IfThenElse(upper, hn::TableLookupBytes(lo1_, k), hn::TableLookupBytes(lo0_, k));
    const auto hi = hn::IfThenElse(upper, hn::TableLookupBytes(hi1_, k), hn::TableLookupBytes(hi0_, k));
    *a = hn::BitCast(d16, hn::InterleaveLower(d8, lo, hi));
    *b = hn::BitCast(d16, hn::InterleaveUpper(d8, lo, hi));
  }

 private:
  hn::Vec<D8> lo0_, lo1_, hi0_, hi1_;
};
#endif

}  // namespace thc::simd::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
