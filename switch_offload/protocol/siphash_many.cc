// SipHash-2-4 of many independent messages at once: one message per 64-bit lane of a SIMD vector
// (AVX-512: 8, AVX2: 4, SSE4/NEON: 2), Highway with dynamic dispatch as the codec's kernels.
//
// Why not a library: libsodium's crypto_shorthash_siphash24 (what auth.cc uses for single
// datagrams), libhighwayhash's SipHash and OpenSSL's are all one message at a time, and SipHash
// over one message is a serial chain of ARX rounds (about 0.5 ns per byte here, ~85 % of the
// aggregator's user time before this file). A receive batch holds dozens of datagrams, each under
// its own key: hashing them side by side is the same function on independent data, so every lane
// computes exactly crypto_shorthash_siphash24 (tests/switch_offload/siphash_many_test.cc checks
// it against libsodium for every length class and mixed batches).
//
// Message words are gathered (one gather per 8-byte word, offsets relative to the first message
// of the group), so messages may lie anywhere. Lanes run in lockstep over the full words every
// message of the group has; when the group's lengths are equal (the common case: one job's data
// packets) the last block and the finalization run in the vector too, otherwise each lane
// finishes alone from its state.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "switch_offload/protocol/siphash_many.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "switch_offload/protocol/siphash_many.h"

#ifndef THC_SIPHASH_SCALAR_ONCE
#define THC_SIPHASH_SCALAR_ONCE
namespace thc::switch_offload::auth::sip {

// The scalar SipHash-2-4 state machine, for the lanes that finish alone and the fallback targets.
struct State {
  uint64_t v0, v1, v2, v3;
};
inline uint64_t load_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}
inline uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }
inline void round(State& s) {
  s.v0 += s.v1;
  s.v1 = rotl(s.v1, 13);
  s.v1 ^= s.v0;
  s.v0 = rotl(s.v0, 32);
  s.v2 += s.v3;
  s.v3 = rotl(s.v3, 16);
  s.v3 ^= s.v2;
  s.v0 += s.v3;
  s.v3 = rotl(s.v3, 21);
  s.v3 ^= s.v0;
  s.v2 += s.v1;
  s.v1 = rotl(s.v1, 17);
  s.v1 ^= s.v2;
  s.v2 = rotl(s.v2, 32);
}
inline State init(const uint8_t* key) {
  const uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
  return State{0x736f6d6570736575ull ^ k0, 0x646f72616e646f6dull ^ k1, 0x6c7967656e657261ull ^ k0,
               0x7465646279746573ull ^ k1};
}
inline void word(State& s, uint64_t m) {
  s.v3 ^= m;
  round(s);
  round(s);
  s.v0 ^= m;
}
// The last block: the len % 8 bytes left, and the length's low byte on top.
inline uint64_t last_block(const uint8_t* msg, size_t len) {
  const size_t full = len & ~size_t{7};
  uint64_t b = static_cast<uint64_t>(len) << 56;
  for (size_t i = 0; i < (len & 7); ++i) b |= static_cast<uint64_t>(msg[full + i]) << (8 * i);
  return b;
}
inline uint64_t finish(State& s) {
  s.v2 ^= 0xFF;
  round(s);
  round(s);
  round(s);
  round(s);
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}
// Continue a message from full word `from` on.
inline uint64_t complete(State s, const uint8_t* msg, size_t len, size_t from) {
  const size_t words = len / 8;
  for (size_t w = from; w < words; ++w) word(s, load_le64(msg + 8 * w));
  word(s, last_block(msg, len));
  return finish(s);
}

}  // namespace thc::switch_offload::auth::sip
#endif

HWY_BEFORE_NAMESPACE();
namespace thc::switch_offload::auth::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The gathers load message words in host order: the vector path needs a little-endian host.
#if HWY_TARGET == HWY_SCALAR || HWY_TARGET == HWY_EMU128 || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
void SipHashManyImpl(const uint8_t* const* keys, const uint8_t* const* msgs, const size_t* lens, size_t n,
                     uint64_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = sip::complete(sip::init(keys[i]), msgs[i], lens[i], 0);
}
#else
using D = hn::ScalableTag<uint64_t>;
constexpr size_t kMaxLanes = 16;

template <class V>
HWY_INLINE V Rot32(V v) {
  // Swapping the two halves of every 64-bit lane: one shuffle instead of two shifts and an OR.
  const D d;
  const hn::Repartition<uint32_t, D> d32;
  return hn::BitCast(d, hn::Shuffle2301(hn::BitCast(d32, v)));
}
template <class V>
HWY_INLINE void Round(V& v0, V& v1, V& v2, V& v3) {
  v0 = hn::Add(v0, v1);
  v1 = hn::Xor(hn::RotateRight<64 - 13>(v1), v0);
  v0 = Rot32(v0);
  v2 = hn::Add(v2, v3);
  v3 = hn::Xor(hn::RotateRight<64 - 16>(v3), v2);
  v0 = hn::Add(v0, v3);
  v3 = hn::Xor(hn::RotateRight<64 - 21>(v3), v0);
  v2 = hn::Add(v2, v1);
  v1 = hn::Xor(hn::RotateRight<64 - 17>(v1), v2);
  v2 = Rot32(v2);
}

void SipHashManyImpl(const uint8_t* const* keys, const uint8_t* const* msgs, const size_t* lens, size_t n,
                     uint64_t* out) {
  const D d;
  const hn::RebindToSigned<D> di;
  const size_t N = hn::Lanes(d);
  if (N > kMaxLanes || N < 2) {
    for (size_t i = 0; i < n; ++i) out[i] = sip::complete(sip::init(keys[i]), msgs[i], lens[i], 0);
    return;
  }
  HWY_ALIGN uint64_t a0[kMaxLanes], a1[kMaxLanes], a2[kMaxLanes], a3[kMaxLanes], tail[kMaxLanes];
  HWY_ALIGN int64_t off[kMaxLanes];
  for (size_t g = 0; g < n; g += N) {
    const size_t m = n - g < N ? n - g : N;
    if (m == 1) {
      out[g] = sip::complete(sip::init(keys[g]), msgs[g], lens[g], 0);
      continue;
    }
    // Lanes past the batch's end repeat its first message (their results are not stored).
    const uint8_t* base = msgs[g];
    size_t words = lens[g] / 8;
    bool same = true;
    for (size_t i = 0; i < N; ++i) {
      const size_t k = g + (i < m ? i : 0);
      const sip::State s = sip::init(keys[k]);
      a0[i] = s.v0;
      a1[i] = s.v1;
      a2[i] = s.v2;
      a3[i] = s.v3;
      off[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(msgs[k]) - reinterpret_cast<uintptr_t>(base));
      if (lens[k] / 8 < words) words = lens[k] / 8;
      same = same && lens[k] == lens[g];
    }
    auto v0 = hn::Load(d, a0), v1 = hn::Load(d, a1), v2 = hn::Load(d, a2), v3 = hn::Load(d, a3);
    auto o = hn::Load(di, off);
    const auto eight = hn::Set(di, 8);
    const uint64_t* b64 = reinterpret_cast<const uint64_t*>(base);  // a gather base: never dereferenced as such
    for (size_t w = 0; w < words; ++w) {
      // Gathers from N streams at once train no hardware prefetcher: ask for each lane's line
      // 512 bytes ahead, once per line (the batch may have come from memory, not cache).
      if ((w & 7) == 0)
        for (size_t i = 0; i < m; ++i) hwy::Prefetch(msgs[g + i] + 8 * w + 512);
      const auto x = hn::GatherOffset(d, b64, o);
      o = hn::Add(o, eight);
      v3 = hn::Xor(v3, x);
      Round(v0, v1, v2, v3);
      Round(v0, v1, v2, v3);
      v0 = hn::Xor(v0, x);
    }
    if (same) {
      for (size_t i = 0; i < N; ++i) {
        const size_t k = g + (i < m ? i : 0);
        tail[i] = sip::last_block(msgs[k], lens[k]);
      }
      const auto x = hn::Load(d, tail);
      v3 = hn::Xor(v3, x);
      Round(v0, v1, v2, v3);
      Round(v0, v1, v2, v3);
      v0 = hn::Xor(v0, x);
      v2 = hn::Xor(v2, hn::Set(d, 0xFF));
      for (int r = 0; r < 4; ++r) Round(v0, v1, v2, v3);
      hn::Store(hn::Xor(hn::Xor(v0, v1), hn::Xor(v2, v3)), d, tail);
      for (size_t i = 0; i < m; ++i) out[g + i] = tail[i];
    } else {
      hn::Store(v0, d, a0);
      hn::Store(v1, d, a1);
      hn::Store(v2, d, a2);
      hn::Store(v3, d, a3);
      for (size_t i = 0; i < m; ++i)
        out[g + i] = sip::complete(sip::State{a0[i], a1[i], a2[i], a3[i]}, msgs[g + i], lens[g + i], words);
    }
  }
}
#endif

const char* SipTargetImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace thc::switch_offload::auth::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace thc::switch_offload::auth {

HWY_EXPORT(SipHashManyImpl);
HWY_EXPORT(SipTargetImpl);

void siphash24_many(const uint8_t* const* keys, const uint8_t* const* msgs, const size_t* lens, size_t n,
                    uint64_t* out) {
  HWY_DYNAMIC_DISPATCH(SipHashManyImpl)(keys, msgs, lens, n, out);
}

uint64_t siphash24_scalar(const uint8_t* key, const uint8_t* msg, size_t len) {
  return sip::complete(sip::init(key), msg, len, 0);
}

const char* siphash_target() { return HWY_DYNAMIC_DISPATCH(SipTargetImpl)(); }

}  // namespace thc::switch_offload::auth
#endif  // HWY_ONCE
