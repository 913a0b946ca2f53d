// libFuzzer target: the packet parser and serialisers (see harness.h).
#include <cstddef>
#include <cstdint>

#include "switch_offload/fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return thc::switch_offload::fuzz::packet_one(data, size);
}
