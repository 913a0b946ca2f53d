/* thc_comm_create_ucx across processes (the way a launcher such as torchrun starts them: a
 * rendezvous address, a rank, a size), driven by ucx_comm_procs.sh.
 *
 *   ucx_comm_procs RENDEZVOUS RANK SIZE ok    20 allreduces (THC and Cnat, 1M floats); prints a
 *                                             checksum of every result, which must agree
 *   ucx_comm_procs RENDEZVOUS RANK SIZE die   after one allreduce the last rank exits without a
 *                                             word (a crash); the others' next call must fail
 *                                             (THC_ERR_TRANSPORT or THC_ERR_TIMEOUT), exit 0 then
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "thc/thc.h"

static uint64_t checksum(const float* v, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    uint32_t b;
    memcpy(&b, &v[i], 4);
    h = (h ^ b) * 1099511628211ull;
  }
  return h;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s RENDEZVOUS RANK SIZE ok|die\n", argv[0]);
    return 2;
  }
  const int rank = atoi(argv[2]), size = atoi(argv[3]);
  const int die = strcmp(argv[4], "die") == 0;
  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) return 2;
  thc_comm_t comm;
  if (thc_comm_create_ucx(argv[1], rank, size, &cfg, &comm) != THC_SUCCESS) {
    fprintf(stderr, "rank %d: thc_comm_create_ucx: %s\n", rank, thc_last_error());
    return 1;
  }
  const size_t n = (size_t)1 << 20;
  float* x = malloc(n * sizeof *x);
  float* y = malloc(n * sizeof *y);
  uint32_t s = 12345u + (uint32_t)rank;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((int32_t)(s >> 8) - (1 << 23)) / (float)(1 << 23);
  }
  const int calls = die ? 2 : 20;
  for (int k = 0; k < calls; ++k) {
    if (die && k == 1 && rank == size - 1) {
      fprintf(stderr, "rank %d: exiting without a word\n", rank);
      _exit(0);
    }
    const thc_status_t st = (k % 2 == 0) ? thc_allreduce(x, y, n, THC_FLOAT32, THC_OP_SUM, comm, NULL)
                                         : cnat_allreduce(x, y, n, THC_FLOAT32, THC_OP_AVG, comm, NULL);
    if (st != THC_SUCCESS) {
      fprintf(stderr, "rank %d: call %d: %s: %s\n", rank, k, thc_status_string(st), thc_last_error());
      const int expected = die && k == 1 && (st == THC_ERR_TRANSPORT || st == THC_ERR_TIMEOUT);
      if (expected) printf("rank %d failed as expected\n", rank);
      thc_comm_destroy(comm);  /* a communicator whose peer died is still freed cleanly */
      free(x);
      free(y);
      return expected ? 0 : 1;
    }
    if (!die) printf("call %d checksum %016llx\n", k, (unsigned long long)checksum(y, n));
  }
  thc_comm_destroy(comm);
  free(x);
  free(y);
  if (die) {
    fprintf(stderr, "rank %d: the call after the peer died succeeded\n", rank);
    return 1;
  }
  return 0;
}
