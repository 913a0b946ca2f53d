// thc_comm_create_ucx: a communicator whose integer reductions run over UCX between the ranks
// (transport/ucx/ucx_reducer.h), bootstrapped from a TCP rendezvous address: no MPI, no aggregator.
// With several ranks on some host it runs hierarchically (THC_HIER, collectives/capi/hier.h): the
// arena's MAX exchanges go over the group's link, the slice groups' compressed stages over links
// of their ranks (transport/group_link.h).
#include <memory>
#include <string>
#include <vector>

#include "collectives/capi/capi.h"
#include "collectives/capi/hier.h"
#include "collectives/engine/knobs.h"
#include "thc/config.h"
#if THC_HAVE_UCX
#include "transport/group_link.h"
#include "transport/schedules/schedules.h"
#include "transport/ucx/ucx_reducer.h"
#endif

#if THC_HAVE_UCX
namespace thc::capi {
namespace {

class UcxHierNet final : public HierNet {
 public:
  explicit UcxHierNet(std::shared_ptr<transport::Link> link) : link_(std::move(link)) {}
  int rank() const override { return link_->rank(); }
  int size() const override { return link_->size(); }
  void max_u32(uint32_t* data, size_t n, const char* what) override {
    try {
      link_->max_u32(data, n);
    } catch (const Error& e) {
      fail(e.status(), std::string("hierarchical allreduce: ") + what + " (UCX): " + e.what());
    }
  }
  std::unique_ptr<transport::Reducer> group_reducer(const std::vector<int>& members, long) override {
    return transport::make_scheduled_reducer(transport::make_group_link(link_, members));
  }
  std::unique_ptr<transport::Reducer> flat_reducer(long) override {
    return transport::make_scheduled_reducer(transport::make_forward_link(link_));
  }

 private:
  std::shared_ptr<transport::Link> link_;
};

}  // namespace
}  // namespace thc::capi
#endif

extern "C" thc_status_t thc_comm_create_ucx(const char* rendezvous, int rank, int size, const thc_config_t* cfg,
                                            thc_comm_t* comm) {
  std::unique_ptr<thc::transport::Reducer> r;
  std::unique_ptr<thc::capi::Composite> hier;
  bool fusing = true;  // whether some rank fuses nonblocking calls (agreed in make_hier)
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
    std::shared_ptr<thc::transport::Link> link = thc::transport::make_ucx_link(o);
    // Several ranks per host: a float reduction inside each host around a compressed stage
    // across hosts; otherwise one engine over all ranks. The group is THC_HIER_HOSTS's world.
    thc::capi::HierWorld world;
    world.rank = rank;
    world.size = size;
    world.name = "the UCX group";
    hier = thc::capi::make_hier(std::make_unique<thc::capi::UcxHierNet>(link), c, world, &fusing);
    if (!hier) r = thc::transport::make_scheduled_reducer(thc::transport::make_forward_link(link));
#else
    (void)rank;
    (void)size;
    thc::fail(thc::Status::kUnsupported, "this libthc was built without UCX (THC_WITH_UCX=OFF or UCX not found)");
#endif
  });
  if (st != THC_SUCCESS) return st;
  const thc_status_t made =
      hier ? thc::capi::create_composite(std::move(hier), comm) : thc::capi::create_comm(std::move(r), &c, comm);
  if (made == THC_SUCCESS) (*comm)->fusion_off = !fusing;
  return made;
}
