// Fuzz entry points, kept free of libFuzzer so the normal (gcc) build can replay the regression
// corpus through exactly the code the fuzzers run.
//
// packet_one: any bytes -> proto::parse; a packet that parses must serialise back to the same
//   header bytes and its control body must round-trip too.
// engine_one: a framed sequence of datagrams -> one aggregator Engine (no sockets). Every
//   datagram the engine emits must itself parse. Framing, per record:
//     byte 0      peer (low 2 bits: one of 4 source addresses; bit 7: run tick() first)
//     bytes 1..2  time advance before this datagram, in units of 100 us (big-endian)
//     bytes 3..4  datagram length L (big-endian); a short final record takes what is left
//     L bytes     the datagram
// Both abort() on a violated invariant, which libFuzzer and the replay test report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace thc::switch_offload::fuzz {

int packet_one(const uint8_t* data, size_t size);
int engine_one(const uint8_t* data, size_t size);

// Append one engine-input record (corpus generation and tests).
void frame(std::vector<uint8_t>* out, int peer, uint16_t advance_100us, const std::vector<uint8_t>& dgram,
           bool tick_first = false);

// Engine configuration the engine fuzzer uses (small, so slot reuse is reachable).
constexpr uint32_t kFuzzMaxSlots = 8;

}  // namespace thc::switch_offload::fuzz
