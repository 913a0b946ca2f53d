// MPI backend: a Link (transport/link.h) over PMPI point-to-point calls on a duplicated
// communicator; the integer allreduce schedules run over it (transport/schedules). MPI's own
// collectives carry only the small MAX of the prelude.
#include "transport/mpi/mpi_reducer.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>
#include <vector>

#include "common/keep_forever.h"
#include "transport/mpi/mpi_wait.h"
#include "transport/schedules/schedules.h"

namespace thc::transport {

void mpi_fail(int rc, const char* call, const char* file, int line) {
  fail(Status::kTransport, std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + mpi_error_text(rc));
}

namespace {

using Clock = MpiClock;

// Link::Req <-> MPI_Request (a pointer in Open MPI, an int in MPICH; never the null word for a
// live request).
static_assert(sizeof(MPI_Request) <= sizeof(Link::Req), "MPI_Request must fit a Link::Req");
Link::Req to_req(MPI_Request r) {
  if (r == MPI_REQUEST_NULL) return Link::kNullReq;
  Link::Req v = 0;
  std::memcpy(&v, &r, sizeof r);
  return v;
}
MPI_Request from_req(Link::Req v) {
  if (v == Link::kNullReq) return MPI_REQUEST_NULL;
  MPI_Request r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

class MpiLink final : public Link {
 public:
  MpiLink(MPI_Comm comm, long timeout_ms) : timeout_ms_(timeout_ms) {
    int inter = 0;
    THC_CHECK_MPI(PMPI_Comm_test_inter(comm, &inter));
    if (inter) fail(Status::kUnsupported, "MPI backend: intercommunicators are not supported");
    comm_ = idup(comm);
    THC_CHECK_MPI(PMPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    THC_CHECK_MPI(PMPI_Comm_rank(comm_, &rank_));
    THC_CHECK_MPI(PMPI_Comm_size(comm_, &size_));
    tag_limit_ = tag_ub(comm_) + 1u;
  }
  // A group of ranks of a shared duplicate (make_mpi_group_reducer).
  MpiLink(std::shared_ptr<MpiSharedComm> shared, std::vector<int> members, long timeout_ms)
      : timeout_ms_(timeout_ms), shared_(std::move(shared)), members_(std::move(members)) {
    comm_ = shared_->comm;
    int me = -1, n = 0;
    THC_CHECK_MPI(PMPI_Comm_rank(comm_, &me));
    THC_CHECK_MPI(PMPI_Comm_size(comm_, &n));
    rank_ = -1;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (members_[i] < 0 || members_[i] >= n)
        fail(Status::kInternal, "MPI backend: group member " + std::to_string(members_[i]) + " outside the communicator");
      if (members_[i] == me) rank_ = static_cast<int>(i);
    }
    if (rank_ < 0) fail(Status::kInternal, "MPI backend: this rank is not a member of its group");
    size_ = static_cast<int>(members_.size());
    // The top tag is the MAX's; the schedules use the ones below it.
    max_tag_ = static_cast<int>(tag_ub(comm_));
    tag_limit_ = tag_ub(comm_);
  }
  ~MpiLink() override {
    if (shared_) {
      if (abandoned_) shared_->abandoned = true;
      return;  // the duplicate is the holders' (MpiSharedComm)
    }
    int finalized = 0;
    PMPI_Finalized(&finalized);
    // After an abandoned operation the duplicate is kept: freed, its context id would be reused
    // by a communicator created later, and the messages of the abandoned operation (sent, or
    // still to come from a late peer) would be matched there.
    if (!finalized && !abandoned_ && comm_ != MPI_COMM_NULL) PMPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  long timeout_ms() const override { return timeout_ms_; }
  uint32_t tag_limit() const override { return tag_limit_; }

  void max_u32(uint32_t* data, size_t n) override {
    if (!members_.empty()) return group_max(data, n);
    // MPI works on a buffer of its own: if a peer never comes, the operation is abandoned with
    // it, not with the caller's memory.
    std::vector<uint8_t> buf(n * 4 + 1);
    std::memcpy(buf.data(), data, n * 4);
    uint32_t* w = reinterpret_cast<uint32_t*>(buf.data());
    constexpr uint64_t kMaxPiece = uint64_t{1} << 30;  // MPI counts are int
    for (uint64_t off = 0; off < n; off += kMaxPiece) {
      const int c = static_cast<int>(std::min<uint64_t>(kMaxPiece, n - off));
      MPI_Request req = MPI_REQUEST_NULL;
      const int rc = PMPI_Iallreduce(MPI_IN_PLACE, w + off, c, MPI_UINT32_T, MPI_MAX, comm_, &req);
      if (rc != MPI_SUCCESS) fail(Status::kTransport, "MPI backend: MPI_Iallreduce (MAX) failed: " + mpi_error_text(rc));
      if (!wait_until(&req, deadline())) {
        abandon();
        keep_forever(std::move(buf));
        fail(Status::kTimeout, "MPI backend: MAX of the prelude (MPI_Iallreduce): a peer did not take part within " +
                                   std::to_string(timeout_ms_) + " ms (THC_TIMEOUT_MS)");
      }
    }
    std::memcpy(data, w, n * 4);
  }

  void isend(int peer, uint32_t tag, const void* buf, size_t bytes, Req* req) override {
    MPI_Request r = MPI_REQUEST_NULL;
    const int rc = PMPI_Isend(buf, count_of(bytes), MPI_BYTE, at(peer), static_cast<int>(tag), comm_, &r);
    if (rc != MPI_SUCCESS)
      fail(Status::kTransport, "MPI backend: MPI_Isend to rank " + std::to_string(peer) + " failed: " + mpi_error_text(rc));
    *req = to_req(r);
  }
  void irecv(int peer, uint32_t tag, void* buf, size_t bytes, Req* req) override {
    MPI_Request r = MPI_REQUEST_NULL;
    const int rc = PMPI_Irecv(buf, count_of(bytes), MPI_BYTE, at(peer), static_cast<int>(tag), comm_, &r);
    if (rc != MPI_SUCCESS)
      fail(Status::kTransport, "MPI backend: MPI_Irecv from rank " + std::to_string(peer) + " failed: " + mpi_error_text(rc));
    *req = to_req(r);
  }
  int test_some(Req* reqs, int n, int* done) override {
    mreq_.clear();
    map_.clear();
    for (int i = 0; i < n; ++i) {
      if (reqs[i] == kNullReq) continue;
      mreq_.push_back(from_req(reqs[i]));
      map_.push_back(i);
    }
    if (mreq_.empty()) return 0;
    idx_.resize(mreq_.size());
    int outcount = 0;
    const int rc = PMPI_Testsome(static_cast<int>(mreq_.size()), mreq_.data(), &outcount, idx_.data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) fail(Status::kTransport, "MPI_Testsome failed: " + mpi_error_text(rc));
    if (outcount == MPI_UNDEFINED) return 0;
    for (int j = 0; j < outcount; ++j) {
      const int i = map_[static_cast<size_t>(idx_[j])];
      reqs[i] = kNullReq;
      done[j] = i;
    }
    return outcount;
  }
  bool cancel(Req* req) override {
    abandon();
    MPI_Request r = from_req(*req);
    if (r == MPI_REQUEST_NULL) return true;
    PMPI_Cancel(&r);
    // A receive not yet matched is cancelled at once; a send or a receive in progress may not be.
    const auto until = Clock::now() + std::chrono::milliseconds(20);
    while (Clock::now() < until) {
      int flag = 0;
      if (PMPI_Test(&r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) {
        *req = kNullReq;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    PMPI_Request_free(&r);  // the operation goes on without us: its buffer must stay
    *req = kNullReq;
    return false;
  }
  void idle(uint64_t us) override { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

 private:
  static int count_of(size_t bytes) {
    if (bytes > static_cast<size_t>(INT_MAX))
      fail(Status::kInvalidArgument, "MPI backend: a message of " + std::to_string(bytes) + " bytes exceeds MPI's int counts");
    return static_cast<int>(bytes);
  }
  // MPI_TAG_UB (at least 32767, as MPI guarantees).
  static uint32_t tag_ub(MPI_Comm c) {
    void* ub = nullptr;
    int flag = 0;
    THC_CHECK_MPI(PMPI_Comm_get_attr(c, MPI_TAG_UB, &ub, &flag));
    return static_cast<uint32_t>(flag && ub ? std::max(*static_cast<int*>(ub), 32767) : 32767);
  }
  int at(int peer) const { return members_.empty() ? peer : members_[static_cast<size_t>(peer)]; }
  void abandon() {
    abandoned_ = true;
    if (shared_) shared_->abandoned = true;
  }
  Clock::time_point deadline() const { return mpi_deadline(timeout_ms_); }
  // Polls req until it completes (true) or the deadline passes (false); an MPI error throws.
  bool wait_until(MPI_Request* req, Clock::time_point until) {
    int rc = MPI_SUCCESS;
    switch (mpi_wait_until(req, until, &rc)) {
      case MpiWait::kDone: return true;
      case MpiWait::kTimeout: return false;
      case MpiWait::kError: break;
    }
    abandon();
    fail(Status::kTransport, "MPI backend: " + mpi_error_text(rc));
  }
  // Each request within THC_TIMEOUT_MS of the previous completion (a bound on inactivity). On a
  // failure the buffers stay parked (MPI may still read or write them) and the link is abandoned.
  void wait_all(std::vector<MPI_Request>& reqs, std::vector<std::vector<uint8_t>*> bufs, const std::string& what) {
    for (MPI_Request& r : reqs) {
      bool ok = false;
      try {
        ok = wait_until(&r, deadline());
      } catch (const Error&) {
        for (auto* b : bufs) keep_forever(std::move(*b));
        throw;
      }
      if (ok) continue;
      abandon();
      for (auto* b : bufs) keep_forever(std::move(*b));
      fail(Status::kTimeout, "MPI backend: " + what + ": a peer did not take part within " + std::to_string(timeout_ms_) +
                                 " ms (THC_TIMEOUT_MS)");
    }
  }
  // The MAX of a group: every member's words to members[0], the result back to each.
  void group_max(uint32_t* data, size_t n) {
    if (size_ == 1 || n == 0) return;
    if (n > static_cast<size_t>(INT_MAX)) fail(Status::kInvalidArgument, "MPI backend: MAX of more than INT_MAX words");
    const int c = static_cast<int>(n);
    const size_t bytes = n * 4;
    std::vector<MPI_Request> reqs;
    // A failure to post leaves the operations posted before it live: their buffers stay parked.
    auto post = [&](int rc, const char* call, std::vector<std::vector<uint8_t>*> bufs) {
      if (rc == MPI_SUCCESS) return;
      abandon();
      for (auto* b : bufs) keep_forever(std::move(*b));
      fail(Status::kTransport, std::string("MPI backend: ") + call + " (MAX of a group) failed: " + mpi_error_text(rc));
    };
    if (rank_ == 0) {
      std::vector<uint8_t> in(static_cast<size_t>(size_ - 1) * bytes);
      reqs.resize(static_cast<size_t>(size_ - 1), MPI_REQUEST_NULL);
      for (int m = 1; m < size_; ++m)
        post(PMPI_Irecv(in.data() + static_cast<size_t>(m - 1) * bytes, c, MPI_UINT32_T, at(m), max_tag_, comm_,
                        &reqs[static_cast<size_t>(m - 1)]),
             "MPI_Irecv", {&in});
      wait_all(reqs, {&in}, "MAX of a group (gather)");
      for (int m = 1; m < size_; ++m) {
        const uint8_t* p = in.data() + static_cast<size_t>(m - 1) * bytes;
        for (size_t i = 0; i < n; ++i) {
          uint32_t v;
          std::memcpy(&v, p + i * 4, 4);
          data[i] = std::max(data[i], v);
        }
      }
      std::vector<uint8_t> out(bytes);
      std::memcpy(out.data(), data, bytes);
      for (int m = 1; m < size_; ++m)
        post(PMPI_Isend(out.data(), c, MPI_UINT32_T, at(m), max_tag_, comm_, &reqs[static_cast<size_t>(m - 1)]),
             "MPI_Isend", {&out});
      wait_all(reqs, {&out}, "MAX of a group (result)");
      return;
    }
    std::vector<uint8_t> out(bytes), in(bytes);
    std::memcpy(out.data(), data, bytes);
    reqs.resize(2, MPI_REQUEST_NULL);
    post(PMPI_Isend(out.data(), c, MPI_UINT32_T, at(0), max_tag_, comm_, &reqs[0]), "MPI_Isend", {&out, &in});
    post(PMPI_Irecv(in.data(), c, MPI_UINT32_T, at(0), max_tag_, comm_, &reqs[1]), "MPI_Irecv", {&out, &in});
    wait_all(reqs, {&out, &in}, "MAX of a group");
    std::memcpy(data, in.data(), bytes);
  }
  // A nonblocking duplicate, so that a rank that never creates its communicator makes the
  // others fail within THC_TIMEOUT_MS instead of waiting forever.
  MPI_Comm idup(MPI_Comm comm) { return mpi_idup_bounded(comm, timeout_ms_, "MPI backend"); }

  long timeout_ms_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::shared_ptr<MpiSharedComm> shared_;  // group links: the duplicate they share
  std::vector<int> members_;               // group links: the communicator's rank of each link rank
  int max_tag_ = 0;
  int rank_ = 0, size_ = 1;
  uint32_t tag_limit_ = 32768;
  bool abandoned_ = false;
  std::vector<MPI_Request> mreq_;
  std::vector<int> map_, idx_;
};

}  // namespace

std::unique_ptr<Link> make_mpi_link(MPI_Comm comm, long timeout_ms) {
  return std::make_unique<MpiLink>(comm, timeout_ms);
}

namespace {

// Open MPI's TCP transport sends a message eagerly up to btl_tcp_eager_limit (64 KiB by default)
// less ob1's header, and anything longer as a rendezvous (ScheduleOptions::eager_bytes,
// Reducer::eager_bytes). A constant, not the cvar: every rank must cut alike, and a rank's MCA
// settings are its own; 256 bytes cover the header.
ScheduleOptions mpi_schedule_options() {
  ScheduleOptions opt;
  opt.eager_bytes = 65536 - 256;
  return opt;
}

}  // namespace

std::unique_ptr<Reducer> make_mpi_reducer(MPI_Comm comm, long timeout_ms) {
  return make_scheduled_reducer(make_mpi_link(comm, timeout_ms), mpi_schedule_options());
}

MpiSharedComm::~MpiSharedComm() {
  int finalized = 0;
  PMPI_Finalized(&finalized);
  if (!finalized && !abandoned && comm != MPI_COMM_NULL) PMPI_Comm_free(&comm);
}

std::unique_ptr<Reducer> make_mpi_group_reducer(std::shared_ptr<MpiSharedComm> shared, std::vector<int> members,
                                                long timeout_ms) {
  if (!shared || members.empty()) fail(Status::kInternal, "make_mpi_group_reducer: no communicator or no members");
  return make_scheduled_reducer(std::make_unique<MpiLink>(std::move(shared), std::move(members), timeout_ms),
                                mpi_schedule_options());
}

}  // namespace thc::transport
