// thc-info: the build's features and every THC_* knob with its default, current value and help.
#include <cstdio>

#include "collectives/codec/rht.h"
#include "thc/thc.h"

int main() {
  std::printf("thc %s\n", thc_version());
  std::printf("features: mpi=%d cuda=%d nccl=%d dpdk=%d ucx=%d simd=%s\n", THC_HAVE_MPI, THC_HAVE_CUDA,
              THC_HAVE_NCCL, THC_HAVE_DPDK, THC_HAVE_UCX, thc::codec::simd_target());
  std::printf("\nknobs (environment variables):\n");
  thc_print_knobs();
  return 0;
}
