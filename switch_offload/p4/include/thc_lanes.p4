// Lane lists for unrolling per-lane code with the C preprocessor (p4c runs cpp on every P4 file).
// P4 has no loops outside the parser; a Tofino pipeline has none at all. THC_LANES_256(M) expands
// M(0) M(1) ... M(255) with decimal lane numbers, so generated names (r_lane_17, v17) are the names
// the control plane sees. A macro argument is pasted to the decimal prefix (1##7 -> 17).
#ifndef THC_LANES_P4
#define THC_LANES_P4

#define THC_D10(M, t) M(t##0) M(t##1) M(t##2) M(t##3) M(t##4) M(t##5) M(t##6) M(t##7) M(t##8) M(t##9)

#define THC_LANES_32(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) \
  THC_D10(M, 1) THC_D10(M, 2) M(30) M(31)

#define THC_LANES_64(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) \
  THC_D10(M, 1) THC_D10(M, 2) THC_D10(M, 3) THC_D10(M, 4) THC_D10(M, 5) M(60) M(61) M(62) M(63)

#define THC_LANES_256(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) \
  THC_D10(M, 1) THC_D10(M, 2) THC_D10(M, 3) THC_D10(M, 4) THC_D10(M, 5) THC_D10(M, 6) THC_D10(M, 7) \
  THC_D10(M, 8) THC_D10(M, 9) THC_D10(M, 10) THC_D10(M, 11) THC_D10(M, 12) THC_D10(M, 13) THC_D10(M, 14) \
  THC_D10(M, 15) THC_D10(M, 16) THC_D10(M, 17) THC_D10(M, 18) THC_D10(M, 19) THC_D10(M, 20) THC_D10(M, 21) \
  THC_D10(M, 22) THC_D10(M, 23) THC_D10(M, 24) M(250) M(251) M(252) M(253) M(254) M(255)

// Packed b-bit indices, LSB first (protocol/README.md "Index bit order"): index k occupies stream
// bits [k*b, k*b+b), and stream bit j is bit j%8 of byte j/8. In a P4 field of P bits holding the
// bytes in wire order, byte i is bits [P-8-8i, P-1-8i] (P4 numbers bits from the LSB of the field,
// the last byte on the wire), so index k is the slice [THC_IDX_LO + b - 1 : THC_IDX_LO]. For
// b in {1, 2, 4, 8} an index never straddles a byte. Bounds are integer constant expressions that
// p4c folds.
#define THC_IDX_LO(P, B, k) ((P) - 8 - 8 * (((k) * (B)) / 8) + (((k) * (B)) % 8))
#define THC_IDX(f, P, B, k) f[THC_IDX_LO(P, B, k) + (B) - 1 : THC_IDX_LO(P, B, k)]

#endif
