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
// Message words come in by plain loads, N words of each of the group's N messages, transposed in
// registers (N x N 64-bit lanes: 2 to 3 shuffle stages) so that vector j holds word j of every
// message; the few words past the last whole chunk are gathered (offsets relative to the first
// message of the group), so messages may lie anywhere. A gather per word was slower on AMD Zen 4
// when the batch is not in cache (perf put 61 % of the function on the gather's result; 704-byte
// messages: 121 against 102-109 ns each out of cache, 98 against 93 in cache). Lanes run in
// lockstep over the full words every message of the group has; when the group's lengths are
// equal (the common case: one job's data packets) the last block and the finalization run in the
// vector too, otherwise each lane finishes alone from its state.
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

// r[i] = N words of message i in, c[j] = word j of every message out (lane i = message i), for
// vectors of N = 2, 4 or 8 64-bit lanes: interleave pairs of messages within 128-bit blocks,
// then (N = 8) pairs of blocks, then halves.
template <size_t N, class V>
HWY_INLINE void Transpose(const V* r, V* c) {
  const D d;
  if constexpr (N == 2) {
    c[0] = hn::InterleaveLower(d, r[0], r[1]);
    c[1] = hn::InterleaveUpper(d, r[0], r[1]);
  } else if constexpr (N == 4) {
    // t[2p]: words 0 | 2 of messages 2p, 2p+1; t[2p+1]: words 1 | 3.
    const V t0 = hn::InterleaveLower(d, r[0], r[1]), t1 = hn::InterleaveUpper(d, r[0], r[1]);
    const V t2 = hn::InterleaveLower(d, r[2], r[3]), t3 = hn::InterleaveUpper(d, r[2], r[3]);
    c[0] = hn::ConcatLowerLower(d, t2, t0);
    c[1] = hn::ConcatLowerLower(d, t3, t1);
    c[2] = hn::ConcatUpperUpper(d, t2, t0);
    c[3] = hn::ConcatUpperUpper(d, t3, t1);
  } else {
    // t[2p]: words 0 | 2 | 4 | 6 of messages 2p, 2p+1 (one 128-bit block each); t[2p+1]: 1 | 3 | 5 | 7.
    V t[8];
    for (size_t p = 0; p < 4; ++p) {
      t[2 * p] = hn::InterleaveLower(d, r[2 * p], r[2 * p + 1]);
      t[2 * p + 1] = hn::InterleaveUpper(d, r[2 * p], r[2 * p + 1]);
    }
    // u[4q + k]: word k of messages 4q..4q+3 in the low half, word k + 4 in the high half.
    V u[8];
    for (size_t q = 0; q < 2; ++q)
      for (size_t e = 0; e < 2; ++e) {
        const V a = t[4 * q + e], b = t[4 * q + 2 + e];
        u[4 * q + e] = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(b), a);
        u[4 * q + e + 2] = hn::OddEvenBlocks(b, hn::SwapAdjacentBlocks(a));
      }
    for (size_t k = 0; k < 4; ++k) {
      c[k] = hn::ConcatLowerLower(d, u[4 + k], u[k]);
      c[k + 4] = hn::ConcatUpperUpper(d, u[4 + k], u[k]);
    }
  }
}

// Messages [g, g + m) (2 <= m <= N) side by side. Lanes past m repeat message g (their results
// are not stored). (Interleaving two or more such groups to hide the rounds' latency measured no
// faster on Zen 4: the rounds are bound by vector throughput, one 512-bit op per cycle.)
// next / next_m: the following group's messages, whose first kLead bytes are prefetched while this
// group is hashed (the in-message prefetch below starts kLead bytes in).
constexpr size_t kLead = 512;
HWY_INLINE void SipHashGroup(const uint8_t* const* keys, const uint8_t* const* msgs, const size_t* lens, size_t g,
                             size_t m, uint64_t* out, const uint8_t* const* next, size_t next_m) {
  const D d;
  const hn::RebindToSigned<D> di;
  const size_t N = hn::Lanes(d);
  HWY_ALIGN uint64_t a0[kMaxLanes], a1[kMaxLanes], a2[kMaxLanes], a3[kMaxLanes], tail[kMaxLanes];
  HWY_ALIGN int64_t off[kMaxLanes];
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
  const uint64_t* b64 = reinterpret_cast<const uint64_t*>(base);  // a gather base: never dereferenced as such
  size_t w = 0;
#if !HWY_HAVE_SCALABLE
  constexpr size_t kN = hn::MaxLanes(D());
  if constexpr (kN == 2 || kN == 4 || kN == 8) {
    const uint8_t* src[kN];
    for (size_t i = 0; i < kN; ++i) src[i] = msgs[g + (i < m ? i : 0)];
    for (; w + kN <= words; w += kN) {
      // N streams train no hardware prefetcher: ask for each lane's line 512 bytes ahead, once
      // per line (the batch may have come from memory, not cache).
      if ((w & 7) == 0) {
        for (size_t i = 0; i < m; ++i) hwy::Prefetch(src[i] + 8 * w + kLead);
        // A received batch is in no cache of this core (DMA, another core): the next group's first
        // lines, one line of each of its messages per step.
        if (8 * w < kLead)
          for (size_t i = 0; i < next_m; ++i) hwy::Prefetch(next[i] + 8 * w);
      }
      hn::Vec<D> r[kN], c[kN];
      for (size_t i = 0; i < kN; ++i) r[i] = hn::LoadU(d, reinterpret_cast<const uint64_t*>(src[i] + 8 * w));
      Transpose<kN>(r, c);
      for (size_t j = 0; j < kN; ++j) {
        v3 = hn::Xor(v3, c[j]);
        Round(v0, v1, v2, v3);
        Round(v0, v1, v2, v3);
        v0 = hn::Xor(v0, c[j]);
      }
    }
    o = hn::Add(o, hn::Set(di, static_cast<int64_t>(8 * w)));
  }
#endif
  const auto eight = hn::Set(di, 8);
  for (; w < words; ++w) {
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

void SipHashManyImpl(const uint8_t* const* keys, const uint8_t* const* msgs, const size_t* lens, size_t n,
                     uint64_t* out) {
  const D d;
  const size_t N = hn::Lanes(d);
  if (N > kMaxLanes || N < 2) {
    for (size_t i = 0; i < n; ++i) out[i] = sip::complete(sip::init(keys[i]), msgs[i], lens[i], 0);
    return;
  }
  for (size_t g = 0; g < n; g += N) {
    const size_t m = n - g < N ? n - g : N;
    const size_t next_m = n - g - m < N ? n - g - m : N;
    if (m == 1) out[g] = sip::complete(sip::init(keys[g]), msgs[g], lens[g], 0);
    else SipHashGroup(keys, msgs, lens, g, m, out, msgs + g + m, next_m);
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
