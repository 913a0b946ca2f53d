/* Uses the installed C API end to end: a one-worker in-process THC allreduce. */
#include <math.h>
#include <stdio.h>
#include <thc/thc.h>

int main(void) {
  enum { N = 4096 };
  static float x[N], y[N];
  for (int i = 0; i < N; ++i) x[i] = sinf((float)i);
  thc_inproc_group_t g;
  thc_comm_t c;
  thc_config_t cfg;
  if (thc_config_init(&cfg) || thc_inproc_group_create(1, &g) || thc_comm_create_inproc(g, 0, &cfg, &c)) {
    fprintf(stderr, "setup failed: %s\n", thc_last_error());
    return 1;
  }
  if (thc_allreduce(x, y, N, THC_FLOAT32, THC_OP_SUM, c, NULL) != THC_SUCCESS) {
    fprintf(stderr, "thc_allreduce: %s\n", thc_last_error());
    return 1;
  }
  double num = 0, den = 0;
  for (int i = 0; i < N; ++i) {
    num += (double)(y[i] - x[i]) * (y[i] - x[i]);
    den += (double)x[i] * x[i];
  }
  thc_comm_destroy(c);
  thc_inproc_group_destroy(g);
  printf("thc %s nmse %.4f\n", thc_version(), num / den);
  return num / den < 0.1 ? 0 : 1;
}
