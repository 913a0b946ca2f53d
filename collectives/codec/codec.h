// The host codec: pure computation (no I/O, no MPI, no globals).
//
// Every scheme is a homomorphic codec (DESIGN.md §1):
//   prelude  per block one non-negative float statistic, combined by MAX across workers
//   encode   per element a b-bit index z, and its integer value T[z]
//   network  S = sum_i T[z_i] (integers), after at most a table lookup
//   decode   per element a float from S and the number of contributors
//
// Wire forms of the same codes: index form (packed b-bit indices, see elem.h for the bit order)
// and value form (T[z] as an integer of the codec's sum type, wide enough for n workers' sums).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/codec/elem.h"
#include "collectives/codec/philox.h"
#include "common/status.h"

namespace thc::codec {

enum class Scheme : int {
  kThc = 0,         // non-uniform THC: RHT, truncation at t_p, optimal table, SR
  kUniformThc = 1,  // THC with the identity table, g = 2^b - 1
  kCnat = 2,        // natural compression: powers of two under the block's max exponent
  kDnat = 3,        // natural dithering D_nat^{p,s}
};
const char* scheme_name(Scheme s);
bool parse_scheme(const std::string& name, Scheme* out);

// Integer type of values and sums on the wire.
enum class IntType : int { kU8, kU16, kU32, kI8, kI16, kI32 };
size_t int_size(IntType t);
bool int_signed(IntType t);
const char* int_name(IntType t);
// Largest magnitude a sum of this type may hold.
int64_t int_max(IntType t);

struct Params {
  Scheme scheme = Scheme::kThc;
  int bits = 4;             // THC: index bits b (1..8)
  int granularity = 30;     // THC: g >= 2^b - 1 (ignored for uniform THC: g = 2^b - 1)
  double p = 1.0 / 32;      // THC: truncation fraction, t_p = Phi^-1(1 - p/2)
  int block_log2 = 16;      // block size 2^block_log2, 10..20
  int nat_width = 16;       // Cnat/Dnat: sum width in bits (8, 16 or 32); sets the level window
  int nat_levels = 0;       // Cnat/Dnat: levels L (0 = as many as nat_width allows for n workers)
  int dnat_norm = 2;        // Dnat: 2 or 0 (= infinity)
  std::vector<int> table;   // THC: explicit table (empty = the solver's optimum for b, g, p)
};

// Per-block layout of a call's `count` elements on the wire. THC blocks are RHT blocks: the tail
// is zero-padded to the next power of two (at least 64); natural codes need no padding.
struct Layout {
  uint64_t count = 0;
  uint64_t block = 0;
  uint64_t nblocks = 0;
  uint64_t tail_elems = 0;  // real elements in the last block
  uint64_t tail_wire = 0;   // wire elements of the last block
  uint64_t wire_count = 0;  // total wire elements
  uint64_t elems(uint64_t blk) const { return blk + 1 == nblocks ? tail_elems : block; }
  uint64_t wire(uint64_t blk) const { return blk + 1 == nblocks ? tail_wire : block; }
};

// Randomness of one call: the shared stream (RHT signs) and this rank's stream (rounding).
struct CallRng {
  uint64_t seed = 0;
  uint32_t rank = 0;
  uint32_t round = 0;
  rng::Stream shared() const { return {seed, rng::kSharedStream, round}; }
  rng::Stream own() const { return {seed, rank + 1, round}; }
};

// Scratch memory of encode and decode: a block's codes, integer values and rotated floats. A
// caller that encodes or decodes block by block (the engine) keeps one and passes it to every
// call, so that no call allocates; calls without one allocate their own. It grows to the largest
// block it has served and is never zero-filled (every call writes what it reads). One per thread.
class Workspace {
 public:
  Workspace() = default;
  Workspace(Workspace&&) noexcept = default;
  Workspace& operator=(Workspace&&) noexcept = default;
  uint64_t block() const { return block_; }

 private:
  friend class Codec;
  struct Free {
    void operator()(unsigned char* p) const;
  };
  // Bytes ahead of the work buffer: room to place it (work_apart).
  static constexpr uint64_t kSlack = 4096;
  void reserve(uint64_t block);  // room for `block` elements of each kind
  float* work() const { return reinterpret_cast<float*>(mem_.get()); }
  // The work buffer placed half a 4 KiB page away from `other` (modulo 4 KiB). A kernel that
  // loads work[i] while storing other[i] a little earlier (THC decode's last pass) otherwise
  // risks loads that wait on stores whose addresses match in their low 12 bits (4K aliasing):
  // up to 35 % slower on the AVX-512 VM measured, depending only on where the caller's buffer lies.
  float* work_apart(const void* other) const;
  int32_t* val() const { return reinterpret_cast<int32_t*>(mem_.get() + kSlack + 4 * block_); }
  uint8_t* idx() const { return mem_.get() + kSlack + 8 * block_; }

  std::unique_ptr<unsigned char[], Free> mem_;
  uint64_t block_ = 0;
};

class Codec {
 public:
  // n: the number of workers whose values are summed (sizes the sum type). Throws thc::Error
  // (kInvalidArgument / kOverflow) with a message for bad or overflow-prone configurations.
  Codec(const Params& params, int n);

  const Params& params() const { return params_; }
  Scheme scheme() const { return params_.scheme; }
  int workers() const { return n_; }
  uint64_t block() const { return uint64_t{1} << params_.block_log2; }
  int index_bits() const { return bits_; }
  IntType sum_type() const { return sum_type_; }
  // index -> integer value (2^bits entries); what the aggregator looks up.
  const std::vector<int32_t>& table() const { return table_; }
  // THC: truncation threshold and grid; Nat: level count.
  double t_p() const { return t_p_; }
  int granularity() const { return g_; }
  int levels() const { return levels_; }
  bool rotates() const { return params_.scheme == Scheme::kThc || params_.scheme == Scheme::kUniformThc; }
  // A 64-bit digest of everything that must agree across workers (scheme, table, block, width).
  uint64_t digest() const { return digest_; }
  std::string describe() const;

  Layout layout(uint64_t count) const;
  size_t packed_bytes(uint64_t wire_elems) const { return (wire_elems * bits_ + 7) / 8; }

  // Prelude statistic of each block of x[0..count): L2 norm (THC, Dnat p=2) or max |x| (Cnat,
  // Dnat p=inf). Returns false if any element is NaN or infinite (stats are then meaningless).
  // add (optional): the statistics of x[i] + add[i] (each sum rounded to float), as if that sum
  // had been stored and passed as x (error feedback's x = g + e without staging it).
  bool prelude(const float* x, uint64_t count, float* stats, const float* add = nullptr) const;

  // Encode the blocks [first_block, first_block + nblocks) of a call. x points at the first
  // element of first_block, stats at the global (MAX-combined) statistic of first_block.
  // Outputs (each optional): packed indices (index form) and/or values of sum_type() (value
  // form), both starting at the first wire element of first_block; residual receives
  // x - (own dequantized contribution), the error-feedback update, for the real elements.
  // add (optional; error feedback's x = g + e): the blocks encoded are x[i] + add[i] (each sum
  // rounded to float, as kern::add_pair), and staged (then required; indexed like x, not
  // overlapping x or add) receives those sums, from which the residual is computed. residual
  // may be add itself (the update in place): each block's add is read before its residual is
  // written. The kernels sum as they read (THC on AVX-512 and AVX2 in its first RHT pass, Cnat and
  // Dnat in their rounding loop); THC on other targets stages the sum first.
  struct EncodeOut {
    uint8_t* packed = nullptr;
    void* values = nullptr;
    float* residual = nullptr;
    float* staged = nullptr;
  };
  // ws: scratch to reuse (nullptr: this call allocates its own).
  void encode(const Layout& lay, uint64_t first_block, uint64_t nblocks, const float* x,
              const float* stats, const CallRng& rng, const EncodeOut& out, Workspace* ws = nullptr,
              const float* add = nullptr) const;

  // Decode sums (of sum_type()) of `contributors` workers into out (real elements only).
  // mean = true gives the average, false the sum.
  void decode(const Layout& lay, uint64_t first_block, uint64_t nblocks, const void* sums,
              const float* stats, const CallRng& rng, int contributors, bool mean, float* out,
              Workspace* ws = nullptr) const;

  // Index form -> value form: values[i] = table[index_i] (what a parameter server does).
  void lookup(const uint8_t* packed, uint64_t wire_elems, void* values) const;

  // The per-block scale factors derived from a global statistic (exposed for the CUDA path).
  struct BlockScale {
    bool zero;     // block is all zeros on every worker: decodes to exact zeros
    int exp;       // power-of-two part e
    float enc;     // encode: r = (x * 2^-e) * enc   (THC: after the RHT)
    float dec;     // decode: x = (S-dependent value) * dec * 2^e
  };
  BlockScale block_scale(float stat, uint64_t wire_elems) const;
  const std::vector<elem::ThcCell>& cells() const { return cells_; }

 private:
  void encode_block(const float* x, const float* add, float* staged, uint64_t elems, uint64_t wire, uint64_t blk,
                    float stat,
                    const CallRng& rng, uint8_t* idx_scratch, uint8_t* packed, int32_t* val_scratch,
                    float* work) const;

  Params params_;
  int n_;
  int bits_ = 0;
  int g_ = 0;
  int levels_ = 0;
  double t_p_ = 0;
  IntType sum_type_ = IntType::kU8;
  std::vector<int32_t> table_;
  std::vector<elem::ThcCell> cells_;
  uint64_t digest_ = 0;
};

// Write a value of type t (from int64) and read one back; used by backends and tests.
void store_int(IntType t, void* base, uint64_t i, int64_t v);
int64_t load_int(IntType t, const void* base, uint64_t i);

// Pack / unpack b-bit codes (elem.h bit order).
void pack_bits(const uint8_t* codes, uint64_t n, int bits, uint8_t* out);
void unpack_bits(const uint8_t* packed, uint64_t n, int bits, uint8_t* codes);

}  // namespace thc::codec
