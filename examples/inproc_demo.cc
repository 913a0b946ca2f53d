// Demo without MPI: 4 worker threads allreduce synthetic gradients with THC and Cnat through the
// in-process backend; prints NMSE and bytes on the wire per element against float32.
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "examples/synthetic.h"
#include "thc/thc.h"

int main(int argc, char** argv) {
  const int n = 4;
  const size_t count = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (size_t{1} << 22);
  std::vector<std::vector<float>> grads(n);
  std::vector<double> exact(count, 0.0);
  for (int r = 0; r < n; ++r) {
    grads[r] = thc::examples::synthetic_gradients(count, r);
    for (size_t i = 0; i < count; ++i) exact[i] += grads[r][i];
  }
  std::printf("thc %s in-process demo: %d workers, %zu elements\n", thc_version(), n, count);
  std::printf("%-8s %12s %12s %12s\n", "scheme", "up_B/elem", "down_B/elem", "nmse");
  std::printf("%-8s %12.3f %12.3f %12s\n", "float32", 4.0, 4.0, "0");
  for (thc_scheme_t s : {THC_SCHEME_THC, THC_SCHEME_UHC, THC_SCHEME_CNAT, THC_SCHEME_DNAT}) {
    thc_inproc_group_t g;
    thc_inproc_group_create(n, &g);
    std::vector<float> out(count);
    thc_stats_t st{};
    thc_status_t status = THC_SUCCESS;
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] {
        thc_comm_t comm;
        std::vector<float> o(count);
        thc_status_t x = thc_comm_create_inproc(g, r, nullptr, &comm);
        if (x == THC_SUCCESS) x = thc_allreduce_scheme(s, grads[r].data(), o.data(), count, THC_FLOAT32, THC_OP_SUM, comm, nullptr);
        if (r == 0) {
          status = x;
          out = o;
          if (x == THC_SUCCESS) thc_comm_stats(comm, &st);
        }
        if (x == THC_SUCCESS) thc_comm_destroy(comm);
      });
    }
    for (auto& t : ts) t.join();
    thc_inproc_group_destroy(g);
    if (status != THC_SUCCESS) {
      std::fprintf(stderr, "%s\n", thc_last_error());
      return 1;
    }
    double e = 0, ref = 0;
    for (size_t i = 0; i < count; ++i) {
      e += (out[i] - exact[i]) * (out[i] - exact[i]);
      ref += exact[i] * exact[i];
    }
    static const char* names[] = {"thc", "uhc", "cnat", "dnat"};
    std::printf("%-8s %12.3f %12.3f %12.3g\n", names[s], static_cast<double>(st.wire_bytes_up) / count,
                static_cast<double>(st.wire_bytes_down) / count, e / ref);
  }
  return 0;
}
