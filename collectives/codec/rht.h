// Randomized Hadamard transform on power-of-two blocks.
//   forward  y = H D x / sqrt(n)      inverse  x = D H y / sqrt(n)
// H is the (unnormalised, ±1) Walsh-Hadamard matrix in natural order and D the diagonal of
// random signs drawn from the *shared* Philox stream (philox.h: purpose kPurposeSigns, counter
// group = element / 128), so every rank rotates with the same D.
#pragma once

#include <cstdint>

#include "collectives/codec/philox.h"

namespace thc::codec {

// x <- H x, unnormalised, n a power of two (>= 1). SIMD (Highway dynamic dispatch).
void fwht(float* x, uint64_t n);
// Scalar reference of fwht.
void fwht_scalar(float* x, uint64_t n);
// x <- D x (flip the sign of element j when its sign bit is set) for block `block`.
void apply_signs(float* x, uint64_t n, const rng::Stream& shared, uint64_t block);
// Orthonormal transforms (tests and tools; the codec folds the 1/sqrt(n) into its scales).
void rht_forward(float* x, uint64_t n, const rng::Stream& shared, uint64_t block);
void rht_inverse(float* x, uint64_t n, const rng::Stream& shared, uint64_t block);
// Name of the SIMD target fwht dispatches to on this CPU (e.g. "AVX2").
const char* simd_target();

}  // namespace thc::codec
