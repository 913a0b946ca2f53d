// Fast Walsh-Hadamard transform, scalar reference and a Highway SIMD version.
//
// Shape of the SIMD version (cache and register aware):
//  * stages with h = 1 and 2 run inside 128-bit vectors with lane shuffles;
//  * stages with 4 <= h < 2^12 run on L1-sized tiles (2^13 floats), so a tile stays in cache
//    while all its small stages run;
//  * the remaining large stages are fused two at a time (radix 4), halving passes over memory.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "collectives/codec/rht.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#include <cmath>
#include <cstring>

#include "collectives/codec/rht.h"

HWY_BEFORE_NAMESPACE();
namespace thc::codec::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

#if HWY_TARGET == HWY_SCALAR
void FwhtImpl(float* x, uint64_t n) { fwht_scalar(x, n); }
#else
constexpr uint64_t kTile = uint64_t{1} << 13;

// One radix-2 stage of stride h over x[0..n), vectors of tag d (h a multiple of Lanes(d)).
template <class D>
HWY_INLINE void Stage(D d, float* HWY_RESTRICT x, uint64_t n, uint64_t h) {
  const size_t L = hn::Lanes(d);
  for (uint64_t i = 0; i < n; i += 2 * h) {
    for (uint64_t j = i; j < i + h; j += L) {
      const auto a = hn::LoadU(d, x + j);
      const auto b = hn::LoadU(d, x + j + h);
      hn::StoreU(hn::Add(a, b), d, x + j);
      hn::StoreU(hn::Sub(a, b), d, x + j + h);
    }
  }
}

// Two fused stages (h and 2h) over x[0..n): each element is read and written once.
template <class D>
HWY_INLINE void Stage4(D d, float* HWY_RESTRICT x, uint64_t n, uint64_t h) {
  const size_t L = hn::Lanes(d);
  for (uint64_t i = 0; i < n; i += 4 * h) {
    for (uint64_t j = i; j < i + h; j += L) {
      const auto a = hn::LoadU(d, x + j);
      const auto b = hn::LoadU(d, x + j + h);
      const auto c = hn::LoadU(d, x + j + 2 * h);
      const auto e = hn::LoadU(d, x + j + 3 * h);
      const auto s0 = hn::Add(a, b), d0 = hn::Sub(a, b);
      const auto s1 = hn::Add(c, e), d1 = hn::Sub(c, e);
      hn::StoreU(hn::Add(s0, s1), d, x + j);
      hn::StoreU(hn::Add(d0, d1), d, x + j + h);
      hn::StoreU(hn::Sub(s0, s1), d, x + j + 2 * h);
      hn::StoreU(hn::Sub(d0, d1), d, x + j + 3 * h);
    }
  }
}

// Stages h = 1 and 2 inside each group of 4 lanes.
HWY_INLINE void SmallStages(float* HWY_RESTRICT x, uint64_t n) {
  const hn::Full128<float> d4;
  alignas(16) static constexpr float kSign1[4] = {1.f, -1.f, 1.f, -1.f};
  alignas(16) static constexpr float kSign2[4] = {1.f, 1.f, -1.f, -1.f};
  const auto sign1 = hn::Load(d4, kSign1);
  const auto sign2 = hn::Load(d4, kSign2);
  for (uint64_t i = 0; i < n; i += 4) {
    auto v = hn::LoadU(d4, x + i);
    // [a,b,c,d] * [1,-1,1,-1] + [b,a,d,c] = [a+b, a-b, c+d, c-d]
    v = hn::MulAdd(v, sign1, hn::Shuffle2301(v));
    v = hn::MulAdd(v, sign2, hn::Shuffle1032(v));
    hn::StoreU(v, d4, x + i);
  }
}

void TileStages(float* HWY_RESTRICT x, uint64_t n) {
  const hn::ScalableTag<float> d;
  const hn::Full128<float> d4;
  const uint64_t L = hn::Lanes(d);
  SmallStages(x, n);
  for (uint64_t h = 4; h < n; h *= 2) {
    if (h < L) {
      Stage(d4, x, n, h);
    } else {
      Stage(d, x, n, h);
    }
  }
}

void FwhtImpl(float* HWY_RESTRICT x, uint64_t n) {
  if (n < 4) {
    fwht_scalar(x, n);
    return;
  }
  const hn::ScalableTag<float> d;
  const uint64_t tile = n < kTile ? n : kTile;
  for (uint64_t t = 0; t < n; t += tile) TileStages(x + t, tile);
  uint64_t h = tile;
  for (; 4 * h <= n; h *= 4) Stage4(d, x, n, h);
  if (h < n) Stage(d, x, n, h);
}
#endif

}  // namespace thc::codec::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace thc::codec {

HWY_EXPORT(FwhtImpl);
HWY_EXPORT(TargetNameImpl);

void fwht(float* x, uint64_t n) { HWY_DYNAMIC_DISPATCH(FwhtImpl)(x, n); }

void fwht_scalar(float* x, uint64_t n) {
  for (uint64_t h = 1; h < n; h *= 2) {
    for (uint64_t i = 0; i < n; i += 2 * h) {
      for (uint64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

void apply_signs(float* x, uint64_t n, const rng::Stream& shared, uint64_t block) {
  const auto key = rng::make_key(shared);
  for (uint64_t g = 0; g * 128 < n; ++g) {
    const auto r = rng::draw4(key, shared, rng::kPurposeSigns, block, static_cast<uint32_t>(g));
    const uint64_t base = g * 128;
    const uint64_t m = n - base < 128 ? n - base : 128;
    for (uint64_t j = 0; j < m; ++j) {
      const uint32_t bit = (r.v[j >> 5] >> (j & 31)) & 1u;
      uint32_t u;
      std::memcpy(&u, &x[base + j], 4);
      u ^= bit << 31;
      std::memcpy(&x[base + j], &u, 4);
    }
  }
}

void rht_forward(float* x, uint64_t n, const rng::Stream& shared, uint64_t block) {
  apply_signs(x, n, shared, block);
  fwht(x, n);
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (uint64_t i = 0; i < n; ++i) x[i] *= s;
}

void rht_inverse(float* x, uint64_t n, const rng::Stream& shared, uint64_t block) {
  fwht(x, n);
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (uint64_t i = 0; i < n; ++i) x[i] *= s;
  apply_signs(x, n, shared, block);
}

const char* simd_target() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace thc::codec
#endif
