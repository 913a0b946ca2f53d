#include "switch_offload/protocol/auth.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "common/status.h"
#include "switch_offload/protocol/siphash_many.h"
#include "switch_offload/protocol/wire.h"

namespace thc::switch_offload::auth {

static_assert(crypto_shorthash_siphash24_KEYBYTES == 16, "SipHash-2-4 key size");
static_assert(crypto_shorthash_siphash24_BYTES == 8, "SipHash-2-4 output size");

void ensure_init() {
  static std::once_flag once;
  static int rc = 0;
  std::call_once(once, [] { rc = sodium_init(); });
  if (rc < 0) fail(Status::kInternal, "libsodium could not be initialised (sodium_init failed)");
}

namespace {

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void blake(uint8_t out[32], const uint8_t* key, size_t key_len, const std::string& label, const uint8_t* extra,
           size_t extra_len) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, key, key_len, 32);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(label.data()), label.size());
  if (extra_len) crypto_generichash_update(&st, extra, extra_len);
  crypto_generichash_final(&st, out, 32);
}

TagKey split(const uint8_t k[32]) {
  TagKey t;
  std::memcpy(t.hdr, k, 16);
  std::memcpy(t.pl, k + 16, 16);
  return t;
}

uint64_t sip(const uint8_t key[16], const uint8_t* data, size_t len) {
  uint8_t out[8];
  crypto_shorthash_siphash24(out, data, len, key);
  uint64_t v;
  std::memcpy(&v, out, 8);
  return v;
}

}  // namespace

bool parse_key(const std::string& text, Key* out, std::string* err) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0) {
    *err = "a key is written ID:HEX (a decimal id, a colon, 64 hex digits)";
    return false;
  }
  uint64_t id = 0;
  for (size_t i = 0; i < colon; ++i) {
    if (text[i] < '0' || text[i] > '9' || id > 0xFFFFFFFFull) {
      *err = "key id '" + text.substr(0, colon) + "' is not a 32-bit decimal number";
      return false;
    }
    id = id * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  if (id > 0xFFFFFFFFull) {
    *err = "key id '" + text.substr(0, colon) + "' is not a 32-bit decimal number";
    return false;
  }
  const std::string hex = text.substr(colon + 1);
  if (hex.size() != 2 * kKeyBytes) {
    *err = "key " + std::to_string(id) + ": want 64 hex digits (32 bytes), got " + std::to_string(hex.size()) +
           " characters";
    return false;
  }
  Key k;
  k.id = static_cast<uint32_t>(id);
  for (size_t i = 0; i < kKeyBytes; ++i) {
    const int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      *err = "key " + std::to_string(id) + ": not a hex digit in '" + hex.substr(2 * i, 2) + "'";
      return false;
    }
    k.bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  *out = k;
  return true;
}

std::string format_key(const Key& k) {
  static const char* digits = "0123456789abcdef";
  std::string s = std::to_string(k.id) + ":";
  for (uint8_t b : k.bytes) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

Key generate_key(uint32_t id) {
  ensure_init();
  Key k;
  k.id = id;
  randombytes_buf(k.bytes, sizeof k.bytes);
  return k;
}

bool load_key_file(const std::string& path, std::vector<Key>* out, std::string* err) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    *err = "key file " + path + ": " + std::strerror(errno);
    return false;
  }
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    *err = "key file " + path + " is accessible by group or others (mode " +
           std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
           std::to_string(st.st_mode & 7) + "); chmod 600 it: it holds secrets";
    return false;
  }
  std::ifstream in(path);
  if (!in) {
    *err = "key file " + path + ": cannot open";
    return false;
  }
  std::vector<Key> keys;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const size_t e = line.find_last_not_of(" \t\r");
    Key k;
    std::string why;
    if (!parse_key(line.substr(b, e - b + 1), &k, &why)) {
      *err = "key file " + path + " line " + std::to_string(lineno) + ": " + why;
      return false;
    }
    for (const Key& o : keys)
      if (o.id == k.id) {
        *err = "key file " + path + " line " + std::to_string(lineno) + ": key id " + std::to_string(k.id) +
               " appears twice";
        return false;
      }
    keys.push_back(k);
  }
  if (keys.empty()) {
    *err = "key file " + path + " holds no key";
    return false;
  }
  *out = std::move(keys);
  return true;
}

bool write_key_file(const std::string& path, const std::vector<Key>& keys, std::string* err) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    *err = "cannot create key file " + path + ": " + std::strerror(errno);
    return false;
  }
  std::string text = "# thc aggregator keys: ID:HEX per line (id 0 = operator key for STATS)\n";
  for (const Key& k : keys) text += format_key(k) + "\n";
  const ssize_t n = ::write(fd, text.data(), text.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    *err = "short write to key file " + path;
    return false;
  }
  return true;
}

KeyRing::KeyRing(const std::vector<Key>& keys) {
  for (const Key& k : keys) keys_[k.id] = k;
}

const Key* KeyRing::find(uint32_t id) const {
  auto it = keys_.find(id);
  return it == keys_.end() ? nullptr : &it->second;
}

TagKey join_key(const Key& tenant, uint64_t job) {
  ensure_init();
  uint8_t jb[8], kj[32], out[32];
  proto::store_be64(jb, job);
  blake(kj, tenant.bytes, kKeyBytes, "thc2 job", jb, 8);
  blake(out, kj, 32, "thc2 join", nullptr, 0);
  return split(out);
}

TagKey data_key(const Key& tenant, uint64_t job, uint64_t seed) {
  ensure_init();
  uint8_t jb[8], sb[8], kj[32], out[32];
  proto::store_be64(jb, job);
  proto::store_be64(sb, seed);
  blake(kj, tenant.bytes, kKeyBytes, "thc2 job", jb, 8);
  blake(out, kj, 32, "thc2 data", sb, 8);
  return split(out);
}

TagKey stats_key(const Key& op) {
  ensure_init();
  uint8_t out[32];
  blake(out, op.bytes, kKeyBytes, "thc2 stats", nullptr, 0);
  return split(out);
}

uint64_t payload_hash(const TagKey& k, const uint8_t* payload, size_t len) { return sip(k.pl, payload, len); }

uint64_t tag_from_hash(const TagKey& k, const uint8_t* header, uint64_t ph) {
  uint8_t buf[proto::kTagOffset + 8];
  std::memcpy(buf, header, proto::kTagOffset);
  std::memcpy(buf + proto::kTagOffset, &ph, 8);
  return sip(k.hdr, buf, sizeof buf);
}

uint64_t compute_tag(const TagKey& k, const uint8_t* p, size_t len) {
  return tag_from_hash(k, p, payload_hash(k, p + proto::kHeaderBytes, len - proto::kHeaderBytes));
}

void sign(const TagKey& k, uint8_t* p, size_t len) { proto::store_be64(p + proto::kTagOffset, compute_tag(k, p, len)); }

bool verify(const TagKey& k, const uint8_t* p, size_t len) {
  if (len < proto::kHeaderBytes) return false;
  uint8_t want[8];
  proto::store_be64(want, compute_tag(k, p, len));
  return sodium_memcmp(want, p + proto::kTagOffset, 8) == 0;
}

uint64_t tag_field(const uint8_t* p) { return proto::load_be64(p + proto::kTagOffset); }

namespace {
// Per-thread scratch of the batched tags, grown once: no allocation per batch.
struct TagScratch {
  std::vector<const uint8_t*> keys, msgs;
  std::vector<size_t> lens;
  std::vector<uint64_t> hashes;
  std::vector<uint8_t> blocks;  // header bytes 0..55 || payload hash, per datagram
  void reserve(size_t n) {
    if (keys.size() < n) {
      keys.resize(n);
      msgs.resize(n);
      lens.resize(n);
      hashes.resize(n);
      blocks.resize(n * (proto::kTagOffset + 8));
    }
  }
};
thread_local TagScratch scratch;
constexpr size_t kBlock = proto::kTagOffset + 8;
}  // namespace

void compute_tags(const TagKey* const* keys, const uint8_t* const* packets, const size_t* lens, size_t n,
                  uint64_t* tags) {
  TagScratch& s = scratch;
  s.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    s.keys[i] = keys[i]->pl;
    s.msgs[i] = packets[i] + proto::kHeaderBytes;
    s.lens[i] = lens[i] - proto::kHeaderBytes;
  }
  siphash24_many(s.keys.data(), s.msgs.data(), s.lens.data(), n, s.hashes.data());
  for (size_t i = 0; i < n; ++i) {
    uint8_t* b = s.blocks.data() + i * kBlock;
    std::memcpy(b, packets[i], proto::kTagOffset);
    std::memcpy(b + proto::kTagOffset, &s.hashes[i], 8);
    s.keys[i] = keys[i]->hdr;
    s.msgs[i] = b;
    s.lens[i] = kBlock;
  }
  siphash24_many(s.keys.data(), s.msgs.data(), s.lens.data(), n, tags);
}

void tags_from_hash(const TagKey& k, const uint8_t* const* headers, size_t n, uint64_t ph, uint64_t* tags) {
  TagScratch& s = scratch;
  s.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* b = s.blocks.data() + i * kBlock;
    std::memcpy(b, headers[i], proto::kTagOffset);
    std::memcpy(b + proto::kTagOffset, &ph, 8);
    s.keys[i] = k.hdr;
    s.msgs[i] = b;
    s.lens[i] = kBlock;
  }
  siphash24_many(s.keys.data(), s.msgs.data(), s.lens.data(), n, tags);
}

void payload_hashes(const TagKey* const* keys, const uint8_t* const* payloads, const size_t* lens, size_t n,
                    uint64_t* hashes) {
  TagScratch& s = scratch;
  s.reserve(n);
  for (size_t i = 0; i < n; ++i) s.keys[i] = keys[i]->pl;
  siphash24_many(s.keys.data(), payloads, lens, n, hashes);
}

void tags_from_hashes(const TagKey* const* keys, const uint8_t* const* headers, const uint64_t* hashes, size_t n,
                      uint64_t* tags) {
  TagScratch& s = scratch;
  s.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* b = s.blocks.data() + i * kBlock;
    std::memcpy(b, headers[i], proto::kTagOffset);
    std::memcpy(b + proto::kTagOffset, &hashes[i], 8);
    s.keys[i] = keys[i]->hdr;
    s.msgs[i] = b;
    s.lens[i] = kBlock;
  }
  siphash24_many(s.keys.data(), s.msgs.data(), s.lens.data(), n, tags);
}

CookieJar::CookieJar(uint64_t bucket_us) : bucket_us_(bucket_us ? bucket_us : 1) { rotate(); }

void CookieJar::rotate() {
  ensure_init();
  randombytes_buf(secret_, sizeof secret_);
}

uint64_t CookieJar::mac(const void* addr, size_t addr_len, uint64_t job, uint16_t worker, uint64_t bucket) const {
  uint8_t buf[160];
  const size_t n = addr_len < 128 ? addr_len : 128;
  std::memcpy(buf, addr, n);
  proto::store_be64(buf + n, job);
  proto::store_be16(buf + n + 8, worker);
  proto::store_be64(buf + n + 10, bucket);
  return sip(secret_, buf, n + 18);
}

void CookieJar::make(const void* addr, size_t addr_len, uint64_t job, uint16_t worker, uint64_t now_us,
                     uint8_t out[16]) const {
  const uint64_t bucket = now_us / bucket_us_;
  proto::store_be64(out, bucket);
  proto::store_be64(out + 8, mac(addr, addr_len, job, worker, bucket));
}

bool CookieJar::check(const void* addr, size_t addr_len, uint64_t job, uint16_t worker, uint64_t now_us,
                      const uint8_t cookie[16]) const {
  const uint64_t bucket = proto::load_be64(cookie);
  const uint64_t cur = now_us / bucket_us_;
  if (bucket != cur && bucket + 1 != cur) return false;
  uint8_t want[8];
  proto::store_be64(want, mac(addr, addr_len, job, worker, bucket));
  return sodium_memcmp(want, cookie + 8, 8) == 0;
}

}  // namespace thc::switch_offload::auth
