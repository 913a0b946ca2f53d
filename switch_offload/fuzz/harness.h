// Fuzz entry points, kept free of libFuzzer so the normal (gcc) build can replay the regression
// corpus through exactly the code the fuzzers run.
//
// packet_one: any bytes -> proto::parse; a packet that parses must serialise back to the same
//   header bytes and its control body must round-trip too.
// engine_one: a framed sequence of datagrams -> one aggregator Engine (no sockets). Framing, per
//   record:
//     byte 0      peer (low 2 bits: one of 4 source addresses, peer 3 is loopback; bit 7: run
//                 tick() first; bit 6: authenticate the datagram as a cooperating worker would:
//                 a JOIN gets the cookie the engine last sent this peer for its job and worker
//                 and the join tag, anything else the data tag of its job instance once a
//                 JOIN_ACK told its seed; bit 5: shift time forward by a whole second first)
//     bytes 1..2  time advance before this datagram, in units of 100 us (big-endian)
//     bytes 3..4  datagram length L (big-endian); a short final record takes what is left
//     L bytes     the datagram
//   The engine holds two keys: the operator key (id 0) and tenant key 1 (kFuzzKey below).
//   Invariants (abort on violation): every datagram the engine emits parses and carries a tag
//   that verifies under its job's key (STATS replies to loopback excepted); a datagram the engine
//   did not authenticate draws no reply at all; everything is freed at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "switch_offload/protocol/auth.h"

namespace thc::switch_offload::fuzz {

int packet_one(const uint8_t* data, size_t size);
int engine_one(const uint8_t* data, size_t size);

// Append one engine-input record (corpus generation and tests).
void frame(std::vector<uint8_t>* out, int peer, uint16_t advance_100us, const std::vector<uint8_t>& dgram,
           bool tick_first = false, bool authenticate = true, bool jump_second = false);

// Engine configuration the engine fuzzer uses (small, so slot reuse is reachable).
constexpr uint32_t kFuzzMaxSlots = 8;
// The keys the fuzzed engine holds (fixed, so corpus files stay meaningful).
auth::Key fuzz_key(uint32_t id);

}  // namespace thc::switch_offload::fuzz
