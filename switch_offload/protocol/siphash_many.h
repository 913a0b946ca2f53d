// SipHash-2-4 over many messages at once (siphash_many.cc): the function libsodium's
// crypto_shorthash_siphash24 computes, one message per SIMD lane. auth.h builds the protocol's
// batched tags on it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace thc::switch_offload::auth {

// out[i] = SipHash-2-4(key keys[i] (16 bytes), msgs[i][0..lens[i])), as the little-endian value
// of crypto_shorthash_siphash24's 8 output bytes.
void siphash24_many(const uint8_t* const* keys, const uint8_t* const* msgs, const size_t* lens, size_t n,
                    uint64_t* out);
// One message, without SIMD (the same function; for tests).
uint64_t siphash24_scalar(const uint8_t* key, const uint8_t* msg, size_t len);
// The Highway target siphash24_many runs on (e.g. "AVX3", "AVX2").
const char* siphash_target();

}  // namespace thc::switch_offload::auth
