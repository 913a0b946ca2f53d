// The batched SipHash-2-4 (protocol/siphash_many.h) and the batched tags built on it (auth.h)
// against libsodium's crypto_shorthash_siphash24 and the one-datagram functions: every length
// class (0..7 bytes past a word, short and long), batches of every size around the vector width,
// equal and mixed lengths and keys, messages at any alignment and in any order in memory; on every
// Highway target this machine runs (hwy::SetSupportedTargetsForTest; EMU128 = the scalar code).
#include <gtest/gtest.h>
#include <sodium.h>

#include <cstring>
#include <random>
#include <vector>

#include "switch_offload/protocol/auth.h"
#include "switch_offload/protocol/siphash_many.h"
#include "switch_offload/protocol/wire.h"
#include "tests/hwy_targets.h"

namespace {

// Every Highway target this CPU runs (tests/hwy_targets.h).
template <class F>
void for_each_target(F f) {
  thc::test::for_each_hwy_target(f, thc::switch_offload::auth::siphash_target);
}

using namespace thc::switch_offload;

uint64_t sodium_sip(const uint8_t* key, const uint8_t* m, size_t len) {
  uint8_t out[8];
  crypto_shorthash_siphash24(out, m, len, key);
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | out[i];
  return v;
}

TEST(SipHashMany, ScalarMatchesLibsodiumForEveryLength) {
  auth::ensure_init();
  std::mt19937 rng(3);
  std::vector<uint8_t> buf(2100);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  uint8_t key[16];
  for (size_t len = 0; len <= 2050; len += (len < 80 ? 1 : 37)) {
    for (auto& k : key) k = static_cast<uint8_t>(rng());
    EXPECT_EQ(auth::siphash24_scalar(key, buf.data() + 3, len), sodium_sip(key, buf.data() + 3, len)) << len;
  }
}

TEST(SipHashMany, BatchesMatchLibsodium) {
  auth::ensure_init();
  for_each_target([] {
  std::mt19937 rng(5);
  std::vector<uint8_t> arena(64 * 1600 + 64);
  for (auto& b : arena) b = static_cast<uint8_t>(rng());
  for (int mode = 0; mode < 4; ++mode) {
    for (size_t n = 1; n <= 37; ++n) {
      std::vector<std::vector<uint8_t>> keys(n, std::vector<uint8_t>(16));
      std::vector<const uint8_t*> kp(n), mp(n);
      std::vector<size_t> lens(n);
      for (size_t i = 0; i < n; ++i) {
        for (auto& b : keys[i]) b = static_cast<uint8_t>(rng());
        if (mode == 3 && i > 0) keys[i] = keys[0];  // one job's key for all
        kp[i] = keys[i].data();
        // mode 0: equal lengths (one job's packets); 1: mixed lengths; 2: equal lengths except
        // the last; 3: equal lengths, one key. Any alignment, any order in memory.
        const size_t base_len = 704 + (n % 9);
        lens[i] = mode == 1 ? rng() % 1500 : (mode == 2 && i + 1 == n ? base_len - 13 : base_len);
        const size_t slot = (n - 1 - i) * 1600 + (rng() % 7);  // later messages lie lower
        mp[i] = arena.data() + slot;
      }
      std::vector<uint64_t> out(n);
      auth::siphash24_many(kp.data(), mp.data(), lens.data(), n, out.data());
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(out[i], sodium_sip(kp[i], mp[i], lens[i])) << "mode " << mode << " n " << n << " i " << i;
    }
  }
  // Short messages: nothing but the last block (len < 8), exactly one word, and every count of
  // words left after the last whole transposed chunk (0..7 on AVX-512, 0..3 on AVX2).
  for (size_t len = 0; len <= 140; ++len) {
    const size_t n = 11;
    std::vector<const uint8_t*> kp(n, arena.data() + 100), mp(n);
    std::vector<size_t> lens(n, len);
    for (size_t i = 0; i < n; ++i) mp[i] = arena.data() + 200 + 17 * i;
    std::vector<uint64_t> out(n);
    auth::siphash24_many(kp.data(), mp.data(), lens.data(), n, out.data());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], sodium_sip(kp[i], mp[i], len)) << len << " " << i;
  }
  });
}

TEST(SipHashMany, BatchedTagsAreTheProtocolTags) {
  auth::ensure_init();
  std::mt19937 rng(8);
  auth::Key a, b;
  a.id = 1;
  b.id = 2;
  for (auto& x : a.bytes) x = static_cast<uint8_t>(rng());
  for (auto& x : b.bytes) x = static_cast<uint8_t>(rng());
  const auth::TagKey ka = auth::data_key(a, 5, 6), kb = auth::data_key(b, 7, 8);
  const size_t n = 29;
  std::vector<std::vector<uint8_t>> pk(n);
  std::vector<const auth::TagKey*> keys(n);
  std::vector<const uint8_t*> ptr(n);
  std::vector<size_t> lens(n);
  for (size_t i = 0; i < n; ++i) {
    pk[i].resize(proto::kHeaderBytes + (i % 5 == 4 ? rng() % 1400 : 704));
    for (auto& x : pk[i]) x = static_cast<uint8_t>(rng());
    keys[i] = i % 3 == 2 ? &kb : &ka;
    auth::sign(*keys[i], pk[i].data(), pk[i].size());
    if (i == 6) pk[i][proto::kHeaderBytes + 100] ^= 1;  // a tampered payload
    if (i == 9) pk[i][3] ^= 0x80;                        // a tampered header
    ptr[i] = pk[i].data();
    lens[i] = pk[i].size();
  }
  std::vector<uint64_t> tags(n);
  auth::compute_tags(keys.data(), ptr.data(), lens.data(), n, tags.data());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(tags[i], auth::compute_tag(*keys[i], ptr[i], lens[i])) << i;
    EXPECT_EQ(tags[i] == auth::tag_field(ptr[i]), auth::verify(*keys[i], ptr[i], lens[i])) << i;
    EXPECT_EQ(auth::verify(*keys[i], ptr[i], lens[i]), i != 6 && i != 9) << i;
  }
  // One payload hash, several headers (a RESULT to every worker).
  const uint64_t ph = auth::payload_hash(ka, pk[0].data() + proto::kHeaderBytes, 704);
  std::vector<uint64_t> t2(n);
  auth::tags_from_hash(ka, ptr.data(), n, ph, t2.data());
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(t2[i], auth::tag_from_hash(ka, ptr[i], ph)) << i;
}

}  // namespace
