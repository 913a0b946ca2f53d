#include "collectives/codec/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <sstream>

#include "collectives/codec/codec_simd.h"
#include "collectives/codec/rht.h"
#include "collectives/codec/table_solver.h"

namespace thc::codec {
namespace {

int bits_for(int v) {  // smallest b with 2^b > v
  int b = 0;
  while ((1 << b) <= v) ++b;
  return b;
}

uint64_t fnv(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xFF;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t next_pow2(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

template <typename T>
void store_vals(void* base, uint64_t off, const int32_t* v, uint64_t n) {
  T* p = static_cast<T*>(base) + off;
  for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<T>(v[i]);
}

void store_any(IntType t, void* base, uint64_t off, const int32_t* v, uint64_t n) {
  switch (t) {
    case IntType::kU8: return store_vals<uint8_t>(base, off, v, n);
    case IntType::kU16: return store_vals<uint16_t>(base, off, v, n);
    case IntType::kU32: return store_vals<uint32_t>(base, off, v, n);
    case IntType::kI8: return store_vals<int8_t>(base, off, v, n);
    case IntType::kI16: return store_vals<int16_t>(base, off, v, n);
    case IntType::kI32: return store_vals<int32_t>(base, off, v, n);
  }
}

// Decode results of calls at least this large are written with non-temporal stores: larger than
// a core's share of the last-level cache on the machines measured, they are evicted before the
// caller reads them, so reading each line in before overwriting it (what a normal store does)
// only costs memory bandwidth. (sysconf's cache sizes are not trustworthy in VMs: 320 MiB of L3
// on the 32 MiB one measured.)
constexpr uint64_t kStreamBytes = uint64_t{16} << 20;

}  // namespace

const char* scheme_name(Scheme s) {
  switch (s) {
    case Scheme::kThc: return "thc";
    case Scheme::kUniformThc: return "uhc";
    case Scheme::kCnat: return "cnat";
    case Scheme::kDnat: return "dnat";
  }
  return "?";
}

bool parse_scheme(const std::string& name, Scheme* out) {
  for (Scheme s : {Scheme::kThc, Scheme::kUniformThc, Scheme::kCnat, Scheme::kDnat}) {
    if (name == scheme_name(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}

size_t int_size(IntType t) {
  switch (t) {
    case IntType::kU8: case IntType::kI8: return 1;
    case IntType::kU16: case IntType::kI16: return 2;
    case IntType::kU32: case IntType::kI32: return 4;
  }
  return 0;
}
bool int_signed(IntType t) { return t == IntType::kI8 || t == IntType::kI16 || t == IntType::kI32; }
const char* int_name(IntType t) {
  switch (t) {
    case IntType::kU8: return "u8";
    case IntType::kU16: return "u16";
    case IntType::kU32: return "u32";
    case IntType::kI8: return "i8";
    case IntType::kI16: return "i16";
    case IntType::kI32: return "i32";
  }
  return "?";
}
int64_t int_max(IntType t) {
  switch (t) {
    case IntType::kU8: return 255;
    case IntType::kU16: return 65535;
    case IntType::kU32: return 4294967295ll;
    case IntType::kI8: return 127;
    case IntType::kI16: return 32767;
    case IntType::kI32: return 2147483647ll;
  }
  return 0;
}

void store_int(IntType t, void* base, uint64_t i, int64_t v) {
  const int32_t v32 = static_cast<int32_t>(static_cast<uint32_t>(v));
  store_any(t, base, i, &v32, 1);
}

int64_t load_int(IntType t, const void* base, uint64_t i) {
  switch (t) {
    case IntType::kU8: return static_cast<const uint8_t*>(base)[i];
    case IntType::kU16: return static_cast<const uint16_t*>(base)[i];
    case IntType::kU32: return static_cast<const uint32_t*>(base)[i];
    case IntType::kI8: return static_cast<const int8_t*>(base)[i];
    case IntType::kI16: return static_cast<const int16_t*>(base)[i];
    case IntType::kI32: return static_cast<const int32_t*>(base)[i];
  }
  return 0;
}

// Sums are exact integers; float holds them exactly up to 2^24, beyond that the rounding is far
// below the quantisation noise (kern::*_dequant convert with static_cast semantics).

void pack_bits(const uint8_t* codes, uint64_t n, int bits, uint8_t* out) { kern::pack_bits_simd(codes, n, bits, out); }

void unpack_bits(const uint8_t* packed, uint64_t n, int bits, uint8_t* codes) {
  kern::unpack_bits_simd(packed, n, bits, codes);
}

Codec::Codec(const Params& params, int n) : params_(params), n_(n) {
  if (n < 1) fail(Status::kInvalidArgument, "codec: number of workers must be >= 1, got " + std::to_string(n));
  if (params.block_log2 < 10 || params.block_log2 > 20)
    fail(Status::kInvalidArgument, "codec: block size 2^" + std::to_string(params.block_log2) +
                                       " outside 2^10..2^20");
  const bool thc = rotates();
  if (thc) {
    const int b = params.bits;
    if (b < 1 || b > 8) fail(Status::kInvalidArgument, "thc: bits must be in 1..8, got " + std::to_string(b));
    bits_ = b;
    const int K = 1 << b;
    if (params.scheme == Scheme::kUniformThc) {
      g_ = K - 1;
      table_.resize(K);
      for (int i = 0; i < K; ++i) table_[i] = i;
    } else {
      g_ = params.granularity;
      if (g_ < K - 1)
        fail(Status::kInvalidArgument, "thc: granularity g=" + std::to_string(g_) + " must be >= 2^b-1=" +
                                           std::to_string(K - 1));
      std::vector<int> t = params.table;
      if (t.empty()) t = solve_optimal_table(b, g_, params.p).table;
      if (static_cast<int>(t.size()) != K)
        fail(Status::kInvalidArgument, "thc: table must have 2^b=" + std::to_string(K) + " entries");
      if (t.front() != 0 || t.back() != g_)
        fail(Status::kInvalidArgument, "thc: table must start at 0 and end at g");
      for (int i = 1; i < K; ++i)
        if (t[i] < t[i - 1]) fail(Status::kInvalidArgument, "thc: table must be non-decreasing");
      table_.assign(t.begin(), t.end());
    }
    if (!(params.p > 0 && params.p < 1))
      fail(Status::kInvalidArgument, "thc: truncation fraction p must be in (0,1)");
    t_p_ = truncation_threshold(params.p);
    const uint64_t maxsum = static_cast<uint64_t>(n) * static_cast<uint64_t>(g_);
    if (maxsum <= 255) sum_type_ = IntType::kU8;
    else if (maxsum <= 65535) sum_type_ = IntType::kU16;
    else if (maxsum <= 4294967295ull) sum_type_ = IntType::kU32;
    else
      fail(Status::kOverflow, "thc: n*g = " + std::to_string(maxsum) +
                                  " does not fit 32-bit sums; lower the granularity or the worker count");
    cells_.resize(g_);
    for (int k = 0; k < g_; ++k) {
      int lo = 0, hi = K - 1;
      for (int z = 0; z < K; ++z)
        if (table_[z] <= k) lo = z;
      while (lo > 0 && table_[lo - 1] == table_[lo]) --lo;  // first index carrying the value
      for (int z = K - 1; z >= 0; --z)
        if (table_[z] >= k + 1) hi = z;
      elem::ThcCell c{};
      c.lo_val = table_[lo];
      c.hi_val = table_[hi];
      c.inv_span = 1.0f / static_cast<float>(c.hi_val - c.lo_val);
      c.lo_idx = static_cast<uint8_t>(lo);
      c.hi_idx = static_cast<uint8_t>(hi);
      cells_[k] = c;
    }
  } else {
    if (params.scheme == Scheme::kDnat && params.dnat_norm != 2 && params.dnat_norm != 0)
      fail(Status::kInvalidArgument, "dnat: norm must be 2 or 0 (infinity)");
    switch (params.nat_width) {
      case 8: sum_type_ = IntType::kI8; break;
      case 16: sum_type_ = IntType::kI16; break;
      case 32: sum_type_ = IntType::kI32; break;
      default: fail(Status::kInvalidArgument, "natural codes: sum width must be 8, 16 or 32 bits");
    }
    const int64_t cap = int_max(sum_type_) / n;  // each worker's |value| <= 2^(L-1) <= cap
    if (cap < 1)
      fail(Status::kOverflow, "natural codes: " + std::to_string(n) + " workers overflow " +
                                  std::to_string(params.nat_width) + "-bit sums; use a wider nat_width");
    int max_levels = 1;
    while (max_levels < 127 && (int64_t{1} << max_levels) <= cap) ++max_levels;
    levels_ = params.nat_levels == 0 ? max_levels : params.nat_levels;
    if (levels_ < 1 || levels_ > 127)
      fail(Status::kInvalidArgument, "natural codes: levels must be in 1..127");
    if (levels_ > max_levels)
      fail(Status::kOverflow, "natural codes: " + std::to_string(levels_) + " levels with " + std::to_string(n) +
                                  " workers overflow " + std::to_string(params.nat_width) +
                                  "-bit sums (at most " + std::to_string(max_levels) + ")");
    bits_ = 1 + bits_for(levels_);
    const int K = 1 << bits_;
    table_.assign(K, 0);
    for (int code = 0; code < K; ++code) {
      const int level = code & ((1 << (bits_ - 1)) - 1);
      const bool neg = code >> (bits_ - 1);
      if (level >= 1 && level <= levels_) table_[code] = (neg ? -1 : 1) * (int32_t{1} << (level - 1));
    }
  }
  uint64_t h = 1469598103934665603ull;
  h = fnv(h, static_cast<uint64_t>(params.scheme));
  h = fnv(h, static_cast<uint64_t>(params.block_log2));
  h = fnv(h, static_cast<uint64_t>(bits_));
  h = fnv(h, static_cast<uint64_t>(g_));
  h = fnv(h, static_cast<uint64_t>(levels_));
  h = fnv(h, static_cast<uint64_t>(params.dnat_norm));
  h = fnv(h, static_cast<uint64_t>(sum_type_));
  uint64_t tb;
  std::memcpy(&tb, &t_p_, 8);
  h = fnv(h, tb);
  for (int32_t v : table_) h = fnv(h, static_cast<uint32_t>(v));
  digest_ = h;
}

std::string Codec::describe() const {
  std::ostringstream o;
  o << scheme_name(params_.scheme) << " block=2^" << params_.block_log2 << " bits=" << bits_;
  if (rotates()) {
    o << " g=" << g_ << " p=" << params_.p << " t_p=" << t_p_ << " table=[";
    for (size_t i = 0; i < table_.size(); ++i) o << (i ? "," : "") << table_[i];
    o << "]";
  } else {
    o << " levels=" << levels_;
    if (params_.scheme == Scheme::kDnat) o << " norm=" << (params_.dnat_norm == 0 ? "inf" : "2");
  }
  o << " sums=" << int_name(sum_type_) << " n=" << n_;
  return o.str();
}

Layout Codec::layout(uint64_t count) const {
  Layout l;
  l.count = count;
  l.block = block();
  l.nblocks = (count + l.block - 1) / l.block;
  if (l.nblocks == 0) return l;
  l.tail_elems = count - (l.nblocks - 1) * l.block;
  l.tail_wire = rotates() ? std::min(l.block, std::max<uint64_t>(64, next_pow2(l.tail_elems))) : l.tail_elems;
  l.wire_count = (l.nblocks - 1) * l.block + l.tail_wire;
  return l;
}

bool Codec::prelude(const float* x, uint64_t count, float* stats, const float* add) const {
  const Layout l = layout(count);
  const bool l2 = rotates() || (params_.scheme == Scheme::kDnat && params_.dnat_norm == 2);
  bool finite = true;
  for (uint64_t b = 0; b < l.nblocks; ++b) {
    const float* p = x + b * l.block;
    const float* q = add ? add + b * l.block : nullptr;
    const uint64_t m = l.elems(b);
    if (l2) {
      // RMS over the block's wire size: MAX-combinable like the norm, and never overflows float.
      // The sum of squares has a fixed summation order (kern::sum_squares), whatever the SIMD width.
      const double s = q ? kern::sum_squares_sum(p, q, m) : kern::sum_squares(p, m);
      if (!std::isfinite(s)) finite = false;
      stats[b] = static_cast<float>(std::sqrt(s / static_cast<double>(l.wire(b))));
    } else {
      bool bad = false;
      stats[b] = q ? kern::max_abs_sum(p, q, m, &bad) : kern::max_abs(p, m, &bad);
      if (bad) finite = false;
    }
  }
  return finite;
}

Codec::BlockScale Codec::block_scale(float stat, uint64_t wire_elems) const {
  BlockScale s{};
  if (!(stat > 0)) {
    s.zero = true;
    return s;
  }
  int e;
  const float m = std::frexp(stat, &e);  // stat = m * 2^e, m in [0.5, 1)
  if (rotates() || (params_.scheme == Scheme::kDnat && params_.dnat_norm == 2)) {
    // stat is the RMS over the block's wire size W: norm = stat * sqrt(W).
    const double sw = std::sqrt(static_cast<double>(wire_elems));
    s.exp = e;
    if (rotates()) {
      s.enc = static_cast<float>(1.0 / (m * sw));  // (H D x * 2^-e) / (m sqrt W) ~ N(0,1)
      s.dec = static_cast<float>(m / sw);          // x = D H y * maxnorm / W = D H y * (m / sqrt W) * 2^e
    } else {
      // unit = norm * 2^(1-s): r = |x| / unit = |x| 2^-e / (m sqrt W) * 2^(s-1)
      s.exp = e + 1 - levels_;
      s.enc = static_cast<float>(1.0 / (m * sw));
      s.dec = static_cast<float>(m * sw);
    }
  } else if (params_.scheme == Scheme::kCnat) {
    const int E = (m == 0.5f) ? e - 1 : e;  // smallest E with stat <= 2^E
    s.exp = E - levels_ + 1;                 // value 2^(j-1) stands for 2^(exp + j - 1)
    s.enc = 1.0f;
    s.dec = 1.0f;
  } else {  // Dnat, infinity norm: unit = stat * 2^(1-s)
    s.exp = e + 1 - levels_;
    s.enc = 1.0f / m;
    s.dec = m;
  }
  return s;
}

// idx or val may be null (that form is not needed). packed (may be null): the block's codes go
// there packed (pack_bits), idx is then scratch; THC with b = 4 and Cnat pack them as they round.
void Codec::encode_block(const float* x, const float* add, float* staged, uint64_t elems, uint64_t wire,
                         uint64_t blk, float stat, const CallRng& rng, uint8_t* idx, uint8_t* packed, int32_t* val,
                         float* work) const {
  const BlockScale bs = block_scale(stat, wire);
  const rng::Stream own = rng.own();
  if (add && bs.zero) {  // (no encode reads the block)
    kern::add_pair(x, add, elems, staged);
    x = staged;
    add = nullptr;
  }
  if (bs.zero) {
    // Every worker's block is zero; decode ignores the sums. Send the code of value 0.
    if (idx) std::memset(idx, 0, wire);
    if (packed) std::memset(packed, 0, (wire * static_cast<uint64_t>(bits_) + 7) / 8);
    if (val) std::memset(val, 0, wire * sizeof(int32_t));
    return;
  }
  if (rotates()) {
    kern::ThcTables tb;
    tb.cells = cells_.data();
    tb.g = g_;
    tb.t = static_cast<float>(t_p_);
    tb.gf = static_cast<float>(g_);
    tb.g_over_2t = static_cast<float>(g_ / (2.0 * t_p_));
    // work = H D (x 2^-e), zero-padded to the wire size (prescale_signs, then fwht), then the
    // rounding. Meanwhile the input of the block after next (contiguous in this call; past its
    // end the prefetch fetches nothing useful but does no harm) moves into the caches: the RHT's
    // first pass, which reads it, otherwise waits for memory while the rest of the encode leaves
    // it idle. Two blocks ahead: with prefetcht1 about 4 % faster on 64 MB than one or four; with
    // prefetcht0 (PrefetchAhead) one, two and three blocks ahead measured alike.
    kern::thc_encode_block(x, add, staged, elems, wire, -bs.exp, rng.shared(), blk, bs.enc, tb, own, work, idx,
                           bits_ == 4 ? packed : nullptr, val, x + 2 * block(), add ? add + 2 * block() : nullptr);
    if (packed && bits_ != 4) pack_bits(idx, wire, bits_, packed);
  } else {
    kern::nat_quantize(x, elems, -bs.exp, bs.enc, levels_, bits_, own, blk, idx, val, packed, add, staged);
  }
}

void Workspace::Free::operator()(unsigned char* p) const { ::operator delete[](p, std::align_val_t{64}); }

void Workspace::reserve(uint64_t block) {
  if (block <= block_) return;
  // 64-byte aligned: the kernels' full-vector loads and stores then never split a cache line.
  mem_.reset(static_cast<unsigned char*>(::operator new[](kSlack + 9 * block, std::align_val_t{64})));
  block_ = block;
}

float* Workspace::work_apart(const void* other) const {
  const uintptr_t base = reinterpret_cast<uintptr_t>(mem_.get());
  const uintptr_t off = (reinterpret_cast<uintptr_t>(other) + 2048 - base) % kSlack / 64 * 64;
  return reinterpret_cast<float*>(mem_.get() + off);
}

void Codec::encode(const Layout& lay, uint64_t first_block, uint64_t nblocks, const float* x,
                   const float* stats, const CallRng& rng, const EncodeOut& out, Workspace* ws,
                   const float* add) const {
  if (add && !out.staged) fail(Status::kInvalidArgument, "Codec::encode: an add input needs a staged output");
  const uint64_t B = lay.block;
  Workspace own_ws;
  if (!ws) ws = &own_ws;
  ws->reserve(B);
  uint8_t* const idx = out.packed ? ws->idx() : nullptr;
  int32_t* const val = out.values || out.residual ? ws->val() : nullptr;
  // The residual's decode stores it while loading work (Workspace::work_apart).
  float* const work = out.residual ? ws->work_apart(out.residual) : ws->work();
  uint64_t wire_off = 0;
  for (uint64_t k = 0; k < nblocks; ++k) {
    const uint64_t blk = first_block + k;
    const uint64_t m = lay.elems(blk), w = lay.wire(blk);
    const float* const ab = add ? add + k * B : nullptr;
    float* const sb = add ? out.staged + k * B : nullptr;
    const float* const xb = add ? sb : x + k * B;  // what was encoded, once encode_block returns
    uint8_t* const packed = out.packed ? out.packed + wire_off * bits_ / 8 : nullptr;
    encode_block(x + k * B, ab, sb, m, w, blk, stats[k], rng, idx, packed, val, work);
    if (out.values) kern::store_values(sum_type_, out.values, wire_off, val, w);
    if (out.residual) {
      float* res = out.residual + k * B;
      const BlockScale bs = block_scale(stats[k], w);
      if (bs.zero) {
        std::memcpy(res, xb, m * sizeof(float));
      } else if (rotates()) {
        // Own contribution in the input domain: D H (q * m/sqrt W) / sqrt W * 2^e, q the
        // dequantised rotated value. Computed exactly like decode with one contributor.
        const float step = static_cast<float>(2.0 * t_p_ / g_);
        const float half = 0.5f * static_cast<float>(g_);
        kern::thc_decode_block(IntType::kI32, val, 0, w, m, half, step, bs.dec, bs.exp, rng.shared(), blk, xb, res,
                               work, false);
      } else {
        kern::nat_dequant(IntType::kI32, val, 0, m, bs.dec, bs.exp, xb, res);
      }
    }
    wire_off += w;
  }
}

void Codec::decode(const Layout& lay, uint64_t first_block, uint64_t nblocks, const void* sums,
                   const float* stats, const CallRng& rng, int contributors, bool mean,
                   float* out, Workspace* ws) const {
  const uint64_t B = lay.block;
  Workspace own_ws;
  if (!ws) ws = &own_ws;
  if (rotates()) ws->reserve(B);
  float* const work = rotates() ? ws->work_apart(out) : nullptr;
  uint64_t wire_off = 0;
  const float cnt = static_cast<float>(contributors);
  const float inv_cnt = mean ? 1.0f / cnt : 1.0f;
  // A call's result larger than the last-level cache is not read back soon after each block:
  // the decode writes it past the caches instead of reading every line in before writing it.
  const bool stream = lay.count * sizeof(float) >= kStreamBytes;
  for (uint64_t k = 0; k < nblocks; ++k) {
    const uint64_t blk = first_block + k;
    const uint64_t m = lay.elems(blk), w = lay.wire(blk);
    float* ob = out + k * B;
    const BlockScale bs = block_scale(stats[k], w);
    if (bs.zero || contributors <= 0) {
      std::fill(ob, ob + m, 0.0f);
      wire_off += w;
      continue;
    }
    if (rotates()) {
      const float step = static_cast<float>(2.0 * t_p_ / g_);
      const float half = 0.5f * static_cast<float>(g_) * cnt;
      const float f = bs.dec * inv_cnt;
      kern::thc_decode_block(sum_type_, sums, wire_off, w, m, half, step, f, bs.exp, rng.shared(), blk, nullptr, ob,
                             work, stream);
    } else {
      kern::nat_dequant(sum_type_, sums, wire_off, m, bs.dec * inv_cnt, bs.exp, nullptr, ob, stream);
    }
    wire_off += w;
  }
}

void Codec::lookup(const uint8_t* packed, uint64_t wire_elems, void* values) const {
  std::vector<int32_t> v(wire_elems);
  for (uint64_t i = 0; i < wire_elems; ++i) v[i] = table_[elem::packed_get(packed, i, bits_)];
  store_any(sum_type_, values, 0, v.data(), wire_elems);
}

}  // namespace thc::codec
