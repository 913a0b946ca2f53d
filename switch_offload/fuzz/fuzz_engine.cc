// libFuzzer target: the aggregator state machine fed framed datagrams, no sockets (harness.h).
#include <cstddef>
#include <cstdint>

#include "switch_offload/fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return thc::switch_offload::fuzz::engine_one(data, size);
}
