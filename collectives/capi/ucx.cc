// thc_comm_create_ucx: a communicator whose integer reductions run over UCX between the ranks
// (transport/ucx/ucx_reducer.h), bootstrapped from a TCP rendezvous address: no MPI, no aggregator.
#include <string>

#include "collectives/capi/capi.h"
#include "collectives/engine/knobs.h"
#include "thc/config.h"
#if THC_HAVE_UCX
#include "transport/ucx/ucx_reducer.h"
#endif

extern "C" thc_status_t thc_comm_create_ucx(const char* rendezvous, int rank, int size, const thc_config_t* cfg,
                                            thc_comm_t* comm) {
  std::unique_ptr<thc::transport::Reducer> r;
  thc_config_t c;
  const thc_status_t st = thc::capi::guard("thc_comm_create_ucx", [&] {
    if (!comm) thc::fail(thc::Status::kInvalidArgument, "comm is NULL");
    if (!rendezvous) thc::fail(thc::Status::kInvalidArgument, "rendezvous is NULL");
    if (cfg) {
      c = *cfg;
    } else {
      thc::engine::config_from_env(&c);
    }
#if THC_HAVE_UCX
    thc::transport::UcxGroupOptions o;
    o.rendezvous = rendezvous;
    o.rank = rank;
    o.size = size;
    o.timeout_ms = c.timeout_ms;
    r = thc::transport::make_ucx_reducer(o);
#else
    (void)rank;
    (void)size;
    thc::fail(thc::Status::kUnsupported, "this libthc was built without UCX (THC_WITH_UCX=OFF or UCX not found)");
#endif
  });
  if (st != THC_SUCCESS) return st;
  return thc::capi::create_comm(std::move(r), &c, comm);
}
