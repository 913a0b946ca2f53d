// The hierarchical communicator's transport on MPI (collectives/capi/hier.h): the MAX of its
// exchanges is MPI_Iallreduce on a duplicate of the user's communicator, the host layout an
// MPI_Iallgather, the arena's handle goes from local rank 0 to the others point to point, and
// each slice group's reducer is the MPI backend on a second duplicate restricted to the group.
// Nothing here blocks in MPI: creation included, every MPI operation is nonblocking and waited
// on within THC_TIMEOUT_MS (MPI has no nonblocking split, so no communicator is split either).
#include "mpi_wrappers/hier.h"

#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "collectives/capi/hier.h"
#include "common/keep_forever.h"
#include "transport/mpi/mpi_reducer.h"
#include "transport/mpi/mpi_wait.h"

namespace thc::mpi {
namespace {

constexpr int kArenaTag = 1;  // local rank 0 -> the others: the arena's handle

class MpiHierNet final : public capi::HierNet {
 public:
  MpiHierNet(MPI_Comm ctl, long timeout_ms) : ctl_(ctl), timeout_ms_(timeout_ms) {
    THC_CHECK_MPI(PMPI_Comm_rank(ctl_, &rank_));
    THC_CHECK_MPI(PMPI_Comm_size(ctl_, &size_));
  }
  ~MpiHierNet() override {
    int finalized = 0;
    PMPI_Finalized(&finalized);
    // A broken communicator keeps its duplicates (context ids of abandoned operations must not
    // be reused), as the MPI backend does.
    if (broken_ && dup_) dup_->abandoned = true;
    if (!finalized && !broken_ && ctl_ != MPI_COMM_NULL) PMPI_Comm_free(&ctl_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void broken() override { broken_ = true; }

  void max_u32(uint32_t* data, size_t n, const char* what) override {
    const std::string w = std::string(what) + " (MPI_Iallreduce)";
    std::vector<uint8_t> buf(n * 4);
    std::memcpy(buf.data(), data, n * 4);
    MPI_Request req = MPI_REQUEST_NULL;
    check(PMPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_UINT32_T, MPI_MAX, ctl_, &req), w, {&buf});
    wait(&req, w, {&buf});
    std::memcpy(data, buf.data(), n * 4);
  }
  std::vector<uint64_t> allgather_u64(uint64_t mine, const char* what) override {
    const std::string w = std::string(what) + " (MPI_Iallgather)";
    std::vector<uint8_t> m(8), keys(8 * static_cast<size_t>(size_));
    std::memcpy(m.data(), &mine, 8);
    MPI_Request req = MPI_REQUEST_NULL;
    check(PMPI_Iallgather(m.data(), 2, MPI_UINT32_T, keys.data(), 2, MPI_UINT32_T, ctl_, &req), w, {&m, &keys});
    wait(&req, w, {&m, &keys});
    std::vector<uint64_t> out(static_cast<size_t>(size_));
    std::memcpy(out.data(), keys.data(), keys.size());
    return out;
  }
  void share_from_first(const std::vector<int>& local, int, int, void* data, size_t n, const char* what) override {
    const std::string w = std::string(what) + " (MPI_Isend/MPI_Irecv)";
    // Buffers MPI may still read or write after a timeout stay parked, never freed.
    std::vector<uint8_t> buf(n);
    if (local[0] == rank_) {
      std::memcpy(buf.data(), data, n);
      std::vector<MPI_Request> reqs(local.size() - 1, MPI_REQUEST_NULL);
      for (size_t p = 1; p < local.size(); ++p)
        check(PMPI_Isend(buf.data(), static_cast<int>(n), MPI_BYTE, local[p], kArenaTag, dup_->comm, &reqs[p - 1]), w,
              {&buf});
      for (MPI_Request& r : reqs) wait(&r, w, {&buf});
      return;
    }
    MPI_Request r = MPI_REQUEST_NULL;
    check(PMPI_Irecv(buf.data(), static_cast<int>(n), MPI_BYTE, local[0], kArenaTag, dup_->comm, &r), w, {&buf});
    wait(&r, w, {&buf});
    std::memcpy(data, buf.data(), n);
  }
  // The point-to-point channel of the slice groups and the hosts' arena handles.
  void prepare_groups() override {
    dup_ = std::make_shared<transport::MpiSharedComm>(
        transport::mpi_idup_bounded(ctl_, timeout_ms_, "hierarchical allreduce"));
    THC_CHECK_MPI(PMPI_Comm_set_errhandler(dup_->comm, MPI_ERRORS_RETURN));
  }
  std::unique_ptr<transport::Reducer> group_reducer(const std::vector<int>& members, long timeout_ms) override {
    return transport::make_mpi_group_reducer(dup_, members, timeout_ms);
  }
  std::unique_ptr<transport::Reducer> flat_reducer(long timeout_ms) override {
    return transport::make_mpi_reducer(ctl_, timeout_ms);
  }

 private:
  void check(int rc, const std::string& what, std::initializer_list<std::vector<uint8_t>*> park) {
    if (rc == MPI_SUCCESS) return;
    for (auto* b : park) keep_forever(std::move(*b));
    fail(Status::kTransport, "hierarchical allreduce: " + what + " failed: " + transport::mpi_error_text(rc));
  }
  // Waits for req. On a timeout or an error the buffers in `park` (what MPI may still read or
  // write for the abandoned operation) are kept for the life of the process.
  void wait(MPI_Request* req, const std::string& what, std::initializer_list<std::vector<uint8_t>*> park) {
    int rc = MPI_SUCCESS;
    switch (transport::mpi_wait_until(req, transport::mpi_deadline(timeout_ms_), &rc)) {
      case transport::MpiWait::kDone: return;
      case transport::MpiWait::kError: check(rc, what, park); return;
      case transport::MpiWait::kTimeout: break;
    }
    for (auto* b : park) keep_forever(std::move(*b));
    fail(Status::kTimeout, "hierarchical allreduce: " + what + ": a peer did not take part within " +
                               std::to_string(timeout_ms_) + " ms (THC_TIMEOUT_MS)");
  }

  MPI_Comm ctl_;
  long timeout_ms_;
  int rank_ = 0, size_ = 1;
  bool broken_ = false;
  std::shared_ptr<transport::MpiSharedComm> dup_;
};

}  // namespace

std::unique_ptr<capi::Composite> make_hier(MPI_Comm comm, const thc_config_t& cfg, bool* fusing) {
  int inter = 0;
  THC_CHECK_MPI(PMPI_Comm_test_inter(comm, &inter));
  if (inter) return nullptr;  // the flat backend says what is unsupported
  if (cfg.hier < -1 || cfg.hier > 1)
    fail(Status::kInvalidArgument, "THC_HIER=" + std::to_string(cfg.hier) + ": expected -1 (auto), 0 or 1");
  // Bounded like every wait of thc: a rank that never creates its communicator makes the
  // others fail within THC_TIMEOUT_MS, and one that comes after they gave up fails too (every
  // step is nonblocking: a blocking MPI_Comm_split after the others left would wait forever).
  MPI_Comm ctl = transport::mpi_idup_bounded(comm, cfg.timeout_ms, "hierarchical allreduce");
  if (const int rc = PMPI_Comm_set_errhandler(ctl, MPI_ERRORS_RETURN); rc != MPI_SUCCESS) {
    PMPI_Comm_free(&ctl);
    THC_CHECK_MPI(rc);
  }
  auto net = std::make_unique<MpiHierNet>(ctl, cfg.timeout_ms);  // (frees ctl unless broken)
  capi::HierWorld world;
  THC_CHECK_MPI(PMPI_Comm_size(MPI_COMM_WORLD, &world.size));
  THC_CHECK_MPI(PMPI_Comm_rank(MPI_COMM_WORLD, &world.rank));
  world.name = "MPI_COMM_WORLD";
  return capi::make_hier(std::move(net), cfg, world, fusing);
}

}  // namespace thc::mpi
