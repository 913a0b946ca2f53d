// thc_wl_expected WORLD COUNT OUTFILE: the exact result bytes every thc_udp_worker of a WORLD-rank
// job must write for COUNT (tests/transport/switch_client/workload.h, salt 7, the worker's), for
// scripts that cannot compute them. Prints "elements_per_rank N": the lanes one rank contributes
// (the sum of the plan's op counts), so an aggregator's `elements` counter can be checked exactly,
// and "max_elements_per_rank N": the lanes of its MAX ops, which every instance of a sharded job
// aggregates.
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "tests/transport/switch_client/workload.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s WORLD COUNT OUTFILE\n", argv[0]);
    return 2;
  }
  const int world = std::atoi(argv[1]);
  const uint64_t count = std::strtoull(argv[2], nullptr, 10);
  if (world < 1 || world > 64 || count == 0) {
    std::fprintf(stderr, "thc_wl_expected: WORLD must be 1..64 and COUNT > 0\n");
    return 2;
  }
  const auto bytes = thc::test::wl_expected(world, count, 7);
  std::ofstream f(argv[3], std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "thc_wl_expected: cannot write %s\n", argv[3]);
    return 1;
  }
  uint64_t elements = 0, max_elements = 0;
  for (const auto& op : thc::test::wl_plan(count)) {
    elements += op.count;
    if (op.kind == thc::test::WlOp::kMax) max_elements += op.count;
  }
  std::printf("elements_per_rank %llu\n", static_cast<unsigned long long>(elements));
  // MAX ops go to every instance of a sharded job (each takes all of it): per extra instance.
  std::printf("max_elements_per_rank %llu\n", static_cast<unsigned long long>(max_elements));
  return 0;
}
