// The codec's hot loops, private to collectives/codec. Each kernel has a Highway SIMD version
// (dynamic dispatch: the best target this CPU supports) and a *_scalar reference, which is the
// plain per-element code built on elem.h. Both give bit-identical results for the same inputs and
// seeds (tests/collectives/codec/simd_test.cc checks every compiled target against the scalar
// reference); the EMU128/SCALAR fallback targets simply call the reference.
//
// Floating-point contract: every kernel performs exactly the per-element operations of elem.h,
// in the same order, with no fused multiply-add (the library is built with -std=c++17, under
// which GCC does not contract a*b+c; do not build this file with -ffp-contract=fast).
#pragma once

#include <cstdint>

#include "collectives/codec/codec.h"
#include "collectives/codec/philox.h"

namespace thc::codec::kern {

// THC rounding tables, per grid cell k = 0..g-1 (structure-of-arrays view of Codec::cells()).
struct ThcTables {
  const int32_t* lo_val;
  const int32_t* hi_val;
  const float* inv_span;
  const int32_t* idx_pair;  // lo_idx | hi_idx << 8
  const elem::ThcCell* cells;
  int g;
  float t, g_over_2t, gf;
};

// work[i] = D scale2(x[i], e) for i < elems, D (+0) for elems <= i < wire: the THC prescale with
// the RHT's random signs (shared stream, block blk) folded in.
void prescale_signs(const float* x, uint64_t elems, uint64_t wire, int e, const rng::Stream& shared,
                    uint64_t blk, float* work);
void prescale_signs_scalar(const float* x, uint64_t elems, uint64_t wire, int e, const rng::Stream& shared,
                           uint64_t blk, float* work);

// out[i] = scale2(D work[i], e) for i < m (sub == nullptr), or sub[i] - scale2(D work[i], e):
// the end of THC decode (or of the residual), signs of the RHT of length `wire`.
void signs_postscale(const float* work, uint64_t m, int e, const rng::Stream& shared, uint64_t blk,
                     const float* sub, float* out);
void signs_postscale_scalar(const float* work, uint64_t m, int e, const rng::Stream& shared, uint64_t blk,
                            const float* sub, float* out);

// The RHT of THC encode, fused: work = H (prescale_signs of x) over `wire` elements, i.e.
// prescale_signs followed by fwht (rht.cc; the prescale runs inside the first FWHT pass).
void rotate_forward(const float* x, uint64_t elems, uint64_t wire, int e, const rng::Stream& shared,
                    uint64_t blk, float* work);
void rotate_forward_scalar(const float* x, uint64_t elems, uint64_t wire, int e, const rng::Stream& shared,
                           uint64_t blk, float* work);

// The inverse RHT of THC decode, fused: fwht(work, wire) then signs_postscale(work, m, ...) into
// out (rht.cc; the signs and postscale run inside the last FWHT pass). work is clobbered.
void rotate_inverse(float* work, uint64_t wire, uint64_t m, int e, const rng::Stream& shared, uint64_t blk,
                    const float* sub, float* out);
void rotate_inverse_scalar(float* work, uint64_t wire, uint64_t m, int e, const rng::Stream& shared,
                           uint64_t blk, const float* sub, float* out);

// THC encode of one block, fused: rotate_forward(x, elems, wire, e, shared, blk, work) then
// thc_quantize(work, wire, enc, tb, own, blk, idx, val, prefetch); with packed4 the codes (b = 4)
// go there packed (elem.h's bit order, wire / 2 bytes) and idx, which must then be given, is only
// scratch. idx and val may be null. work is clobbered. With add (error feedback) the block
// encoded is x + add, computed as add_pair and also written to staged (elems floats; staged may
// not overlap x or add); prefetch_add is add's prefetch, as prefetch is x's (either may be null).
void thc_encode_block(const float* x, const float* add, float* staged, uint64_t elems, uint64_t wire, int e,
                      const rng::Stream& shared, uint64_t blk, float enc, const ThcTables& tb, const rng::Stream& own,
                      float* work, uint8_t* idx, uint8_t* packed4, int32_t* val, const float* prefetch,
                      const float* prefetch_add);
void thc_encode_block_scalar(const float* x, const float* add, float* staged, uint64_t elems, uint64_t wire, int e,
                             const rng::Stream& shared, uint64_t blk, float enc, const ThcTables& tb,
                             const rng::Stream& own, float* work, uint8_t* idx, uint8_t* packed4, int32_t* val);

// THC decode of one block, fused: thc_dequant(t, sums, off, wire, half, step, f, work) then
// rotate_inverse(work, wire, m, e, ...) into out (the dequantisation runs inside the first FWHT
// pass). stream: the caller will not read out soon (a call larger than the last-level cache):
// whole 64-byte lines of out may be written with non-temporal stores. work is clobbered.
void thc_decode_block(IntType t, const void* sums, uint64_t off, uint64_t wire, uint64_t m, float half, float step,
                      float f, int e, const rng::Stream& shared, uint64_t blk, const float* sub, float* out, float* work,
                      bool stream);
void thc_decode_block_scalar(IntType t, const void* sums, uint64_t off, uint64_t wire, uint64_t m, float half,
                             float step, float f, int e, const rng::Stream& shared, uint64_t blk, const float* sub,
                             float* out, float* work);

// THC stochastic rounding of n rotated values: y = work[i] * enc, v = thc_grid(y),
// thc_round(v, u_i) with u_i the own-stream rounding uniform of element i of block blk
// (philox.h: rng::round_unit of the 16 bits rng::round_bits of group i / 8).
// Writes indices and/or values (either may be null). prefetch (may be null, need not be valid
// memory): n floats the caller reads next, fetched into the caches while the rounding computes.
void thc_quantize(const float* work, uint64_t n, float enc, const ThcTables& tb, const rng::Stream& own,
                  uint64_t blk, uint8_t* idx, int32_t* val, const float* prefetch = nullptr);
void thc_quantize_scalar(const float* work, uint64_t n, float enc, const ThcTables& tb, const rng::Stream& own,
                         uint64_t blk, uint8_t* idx, int32_t* val);

// Natural rounding of n elements: r = scale2(|x|, e) * enc, nat_round(r, x < 0, u_i, levels, bits).
// packed (may be null): the codes also go there as pack_bits(codes, n, bits) would write them;
// idx must then be given and is scratch (not all of it is written). With add (error feedback)
// the elements rounded are x + add, summed as add_pair does as they are read and written to
// staged (n floats, overlapping neither x nor add).
void nat_quantize(const float* x, uint64_t n, int e, float enc, int levels, int bits, const rng::Stream& own,
                  uint64_t blk, uint8_t* idx, int32_t* val, uint8_t* packed = nullptr, const float* add = nullptr,
                  float* staged = nullptr);
void nat_quantize_scalar(const float* x, uint64_t n, int e, float enc, int levels, int bits,
                         const rng::Stream& own, uint64_t blk, uint8_t* idx, int32_t* val);

// work[i] = thc_decode_sum(float(s_i), half, step) * f, s_i element off + i of typed sums.
void thc_dequant(IntType t, const void* sums, uint64_t off, uint64_t n, float half, float step, float f,
                 float* work);
void thc_dequant_scalar(IntType t, const void* sums, uint64_t off, uint64_t n, float half, float step, float f,
                        float* work);

// out[i] = scale2(float(s_i) * f, e), or sub[i] - that when sub != nullptr. stream: out written
// with non-temporal stores (a result larger than the caches; ends with a store fence), the same
// values.
void nat_dequant(IntType t, const void* sums, uint64_t off, uint64_t n, float f, int e, const float* sub,
                 float* out, bool stream = false);
void nat_dequant_scalar(IntType t, const void* sums, uint64_t off, uint64_t n, float f, int e, const float* sub,
                        float* out);

// d[i] += table[index i] (8-bit wrap) for n 4-bit indices packed two per byte, low nibble first
// (the lookup-and-add of the index form for 4-bit codes and 8-bit sums; table holds 16 entries).
void lookup_add4_u8(const uint8_t* table, const uint8_t* packed, uint64_t n, uint8_t* d);
void lookup_add4_u8_scalar(const uint8_t* table, const uint8_t* packed, uint64_t n, uint8_t* d);
// d[i] += table[codes[i]] (16-bit wrap) for n byte codes below 32, table of 32 entries (the
// lookup-and-add of unpacked codes of up to 5 bits into 16-bit sums: Cnat's default).
void lookup_add32_u16(const uint16_t* table, const uint8_t* codes, uint64_t n, uint16_t* d);
void lookup_add32_u16_scalar(const uint16_t* table, const uint8_t* codes, uint64_t n, uint16_t* d);
// Typed store of int32 values (static_cast to the type: two's-complement truncation).
void store_values(IntType t, void* base, uint64_t off, const int32_t* v, uint64_t n);
void store_values_scalar(IntType t, void* base, uint64_t off, const int32_t* v, uint64_t n);

// Prelude statistics of one block. Sum of squares in double, in a fixed order that any vector
// width reproduces: 16 partial sums (element i into partial i mod 16, in increasing i), then
// combined pairwise: p[j] += p[j + 8], p[j] += p[j + 4], p[j] += p[j + 2], p[0] + p[1].
double sum_squares(const float* x, uint64_t n);
double sum_squares_scalar(const float* x, uint64_t n);
// max |x[i]| ignoring NaN; *bad is set when some element is NaN or infinite.
float max_abs(const float* x, uint64_t n, bool* bad);
float max_abs_scalar(const float* x, uint64_t n, bool* bad);
// The same of x[i] + add[i] (each sum rounded to float first), without storing the sums: the
// prelude of a call with error feedback (x = g + e).
double sum_squares_sum(const float* x, const float* add, uint64_t n);
double sum_squares_sum_scalar(const float* x, const float* add, uint64_t n);
float max_abs_sum(const float* x, const float* add, uint64_t n, bool* bad);
float max_abs_sum_scalar(const float* x, const float* add, uint64_t n, bool* bad);

// out[i] = a[i] + b[i] and x[i] *= s (float32, each element rounded once, as the scalar loops;
// out may be a or b, no partial overlap): error feedback's x = g + e, the hierarchical
// communicator's host sums (out == a) and means.
void add_pair(const float* a, const float* b, uint64_t n, float* out);
void add_pair_scalar(const float* a, const float* b, uint64_t n, float* out);
void scale_by(float* x, uint64_t n, float s);
void scale_by_scalar(float* x, uint64_t n, float s);

// pack_bits / unpack_bits (codes must be < 2^bits).
void pack_bits_simd(const uint8_t* codes, uint64_t n, int bits, uint8_t* out);
void pack_bits_scalar(const uint8_t* codes, uint64_t n, int bits, uint8_t* out);
void unpack_bits_simd(const uint8_t* packed, uint64_t n, int bits, uint8_t* codes);
void unpack_bits_scalar(const uint8_t* packed, uint64_t n, int bits, uint8_t* codes);

// The scalar reference of apply_signs (rht.cc) for tests.
void apply_signs_scalar(float* x, uint64_t n, const rng::Stream& shared, uint64_t block);

// Name of the target the codec kernels dispatch to.
const char* kernel_target();

// How THC's rounding on AVX2 looks its cell table up when g <= 31: kGather (two gathers per 8
// elements, ThcWordTables) or kRegisters (the table in eight ymm registers: vpermd/vpermps and
// blends). kAuto, the default: registers on AMD CPUs, where a ymm gather is about 40 micro-ops on
// Zen 2 / Zen 3, gathers on the others. Bit-identical either way; the choice is for speed and the
// setter for tests and benchmarks (it applies to encodes that start after it).
enum class TableLookup : int { kAuto = 0, kGather = 1, kRegisters = 2 };
void set_avx2_table_lookup(TableLookup mode);
bool avx2_table_in_registers();  // what kAuto or the last set mode means on this CPU

}  // namespace thc::codec::kern
