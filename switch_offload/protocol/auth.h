// Authentication of the aggregation protocol (protocol/README.md "Security"). Every datagram
// carries a 64-bit tag in its last header field:
//
//   tag = SipHash-2-4(k_hdr, header bytes 0..55 || SipHash-2-4(k_pl, payload))
//
// (the payload is hashed under its own key first, so one RESULT payload serves every worker with
// one long hash and a short one per header). Keys come from libsodium's BLAKE2b, keyed:
//
//   k_job  = BLAKE2b-256(key = tenant key, "thc2 job" || job id)           (job id includes key id)
//   join   = BLAKE2b-256(key = k_job, "thc2 join")          -> k_hdr || k_pl for JOIN, CHALLENGE,
//                                                               JOIN_ACK and errors answering them
//   data   = BLAKE2b-256(key = k_job, "thc2 data" || seed)  -> everything after JOIN_ACK; the seed
//                                                               is fresh per job incarnation, so
//                                                               nothing of an earlier one replays
//   stats  = BLAKE2b-256(key = operator key (id 0), "thc2 stats")
//
// A tenant key is 32 random bytes with a 32-bit id, written "ID:HEX" (64 hex digits); the
// aggregator holds a key file of such lines, workers hold their tenant's key. Keys never travel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace thc::switch_offload::auth {

constexpr size_t kKeyBytes = 32;
constexpr uint32_t kOperatorKeyId = 0;  // the key that may ask for STATS (and create no jobs)

struct Key {
  uint32_t id = 0;
  uint8_t bytes[kKeyBytes] = {};
};

// "ID:HEX" (decimal id, 64 hex digits). False with *err on anything else.
bool parse_key(const std::string& text, Key* out, std::string* err);
std::string format_key(const Key& k);
// Random key from the OS (libsodium randombytes).
Key generate_key(uint32_t id);
// Lines "ID:HEX"; '#' starts a comment; blank lines ignored. Duplicate ids are an error. The file
// must not be readable by group or others (a key file is a secret).
bool load_key_file(const std::string& path, std::vector<Key>* out, std::string* err);
// Write a fresh key file (mode 0600) holding the given keys; false with *err if it exists.
bool write_key_file(const std::string& path, const std::vector<Key>& keys, std::string* err);

// The keys an aggregator accepts, by id.
class KeyRing {
 public:
  KeyRing() = default;
  explicit KeyRing(const std::vector<Key>& keys);
  const Key* find(uint32_t id) const;
  bool empty() const { return keys_.empty(); }
  size_t size() const { return keys_.size(); }

 private:
  std::unordered_map<uint32_t, Key> keys_;
};

// A tag key pair (header key, payload key).
struct TagKey {
  uint8_t hdr[16] = {};
  uint8_t pl[16] = {};
};

TagKey join_key(const Key& tenant, uint64_t job);
TagKey data_key(const Key& tenant, uint64_t job, uint64_t seed);
TagKey stats_key(const Key& operator_key);

// SipHash of a payload under k.pl (the inner hash).
uint64_t payload_hash(const TagKey& k, const uint8_t* payload, size_t len);
// The tag of a datagram whose payload hash is known (header: the first 56 bytes).
uint64_t tag_from_hash(const TagKey& k, const uint8_t* header, uint64_t payload_hash);
// Tag of a whole datagram (len >= header bytes).
uint64_t compute_tag(const TagKey& k, const uint8_t* packet, size_t len);
// Write the tag into the datagram's tag field.
void sign(const TagKey& k, uint8_t* packet, size_t len);
// Whether the datagram's tag field is its tag under k.
bool verify(const TagKey& k, const uint8_t* packet, size_t len);
// The tag field of a datagram (len >= header bytes), to compare with a computed tag.
uint64_t tag_field(const uint8_t* packet);

// Batched forms (siphash_many.h: several datagrams per SIMD vector), the same values as the
// functions above. tags[i] = compute_tag(*keys[i], packets[i], lens[i]) (lens[i] >= header bytes).
void compute_tags(const TagKey* const* keys, const uint8_t* const* packets, const size_t* lens, size_t n,
                  uint64_t* tags);
// tags[i] = tag_from_hash(k, headers[i], payload_hash): one payload, several headers (a RESULT to
// every recipient).
void tags_from_hash(const TagKey& k, const uint8_t* const* headers, size_t n, uint64_t payload_hash, uint64_t* tags);
// payload_hash(*keys[i], payloads[i], lens[i]) for every i.
void payload_hashes(const TagKey* const* keys, const uint8_t* const* payloads, const size_t* lens, size_t n,
                    uint64_t* hashes);
// tag_from_hash(*keys[i], headers[i], hashes[i]) for every i.
void tags_from_hashes(const TagKey* const* keys, const uint8_t* const* headers, const uint64_t* hashes, size_t n,
                      uint64_t* tags);

// Address cookies (a stateless return-routability check, as DTLS's HelloVerifyRequest): a JOIN
// only changes state when it carries a cookie the aggregator computed for its source address,
// job and worker within the last two time buckets.
class CookieJar {
 public:
  explicit CookieJar(uint64_t bucket_us = 30'000'000);
  void make(const void* addr, size_t addr_len, uint64_t job, uint16_t worker, uint64_t now_us, uint8_t out[16]) const;
  bool check(const void* addr, size_t addr_len, uint64_t job, uint16_t worker, uint64_t now_us,
             const uint8_t cookie[16]) const;
  // A new secret: no cookie made before verifies any more (so no JOIN carrying one can be replayed,
  // whatever the aggregator forgot about it).
  void rotate();
  // The time until which a cookie made at or before now_us can verify.
  uint64_t valid_until(uint64_t now_us) const { return (now_us / bucket_us_ + 2) * bucket_us_; }

 private:
  uint64_t mac(const void* addr, size_t addr_len, uint64_t job, uint16_t worker, uint64_t bucket) const;
  uint8_t secret_[16] = {};
  uint64_t bucket_us_;
};

// Initialises libsodium once (thread-safe); throws thc::Error if it cannot.
void ensure_init();

}  // namespace thc::switch_offload::auth
