// The aggregator's per-lane arithmetic, as pure functions over registers and payloads: what a
// switch pipeline's ALUs do per packet. Registers are as wide as the slot's sum type (1, 2 or 4
// bytes; the prelude MAX uses 4): sums wrap in the register, which equals wrapping in the sum type
// (the protocol's rule), and a u8-summed THC slot moves a quarter of the bytes a u32 register
// file would. Tested against a scalar model in tests/switch_offload/lanes_test.cc.
#pragma once

#include <cstddef>
#include <cstdint>

namespace thc::switch_offload::lanes {

// regs[i] += (or -=) the big-endian value lane i of payload, for i < count; width w = 1, 2, 4.
void add_values(uint8_t* regs, int w, const uint8_t* payload, int count, bool subtract);
// regs[i] += (or -=) table[index_i] (truncated to the register width) for the packed b-bit
// indices of payload (LSB first, protocol/README.md), i < count.
void add_lookup(uint8_t* regs, int w, const uint8_t* payload, int count, int bits, const int32_t* table,
                bool subtract);
// The first contribution to registers that hold nothing yet: regs[i] = value i (add_values onto
// zeros), regs[i] = table[index i] (add_lookup onto zeros), without reading the registers (a
// slot's registers are mostly out of cache when it opens: writing them once saves zeroing them
// and reading them back).
void set_values(uint8_t* regs, int w, const uint8_t* payload, int count);
void set_lookup(uint8_t* regs, int w, const uint8_t* payload, int count, int bits, const int32_t* table);
// regs[i] = max(regs[i], u32 big-endian lane i) (w = 4).
void max_u32(uint8_t* regs, const uint8_t* payload, int count);
// Write lanes [0, count) of the registers as big-endian w-byte values into out.
void store(const uint8_t* regs, int w, int count, uint8_t* out);

}  // namespace thc::switch_offload::lanes
