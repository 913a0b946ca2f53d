// Typed integer sums -> float lanes (static_cast semantics: exact below 2^24, round to nearest
// above): shared by the dequantising kernels (codec_simd.cc) and the THC decode's first FWHT pass
// (rht.cc).
//
// Private to collectives/codec; included by files that use hwy/foreach_target.h (per-target
// include guard, as Highway's own -inl.h headers).
#if defined(THC_CODEC_LOAD_FLOAT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef THC_CODEC_LOAD_FLOAT_INL_H_
#undef THC_CODEC_LOAD_FLOAT_INL_H_
#else
#define THC_CODEC_LOAD_FLOAT_INL_H_
#endif

#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace thc::codec::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
template <class DF, typename T>
HWY_INLINE hn::Vec<DF> LoadAsFloat(DF d, const T* HWY_RESTRICT p) {
  const hn::RebindToSigned<DF> di;
  if constexpr (sizeof(T) == 4 && std::is_signed<T>::value) {
    return hn::ConvertTo(d, hn::LoadU(di, reinterpret_cast<const int32_t*>(p)));
  } else if constexpr (sizeof(T) == 4) {
#if HWY_TARGET <= HWY_AVX3
    if constexpr (sizeof(hn::Vec<DF>{}.raw) == 64)
      return hn::Vec<DF>{_mm512_cvtepu32_ps(_mm512_loadu_si512(p))};  // correctly rounded, as static_cast
#endif
    // Two exact halves, one rounding in the add: the correctly rounded float of the u32.
    const auto v = hn::LoadU(di, reinterpret_cast<const int32_t*>(p));
    const auto hi = hn::ConvertTo(d, hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(hn::RebindToUnsigned<DF>(), v))));
    const auto lo = hn::ConvertTo(d, hn::And(v, hn::Set(di, 0xFFFF)));
    return hn::Add(hn::Mul(hi, hn::Set(d, 65536.0f)), lo);
  } else {
    const hn::Rebind<T, decltype(di)> dt;
    return hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(dt, p)));
  }
}
#endif

}  // namespace thc::codec::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
