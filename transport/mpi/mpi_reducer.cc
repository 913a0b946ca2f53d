#include "transport/mpi/mpi_reducer.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

namespace thc::transport {

void mpi_fail(int rc, const char* call, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (PMPI_Error_string(rc, msg, &len) != MPI_SUCCESS) std::snprintf(msg, sizeof msg, "error %d", rc);
  fail(Status::kTransport, std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + msg);
}

namespace {

MPI_Datatype mpi_type(IntType t) {
  switch (t) {
    case IntType::kU8: return MPI_UINT8_T;
    case IntType::kU16: return MPI_UINT16_T;
    case IntType::kU32: return MPI_UINT32_T;
    case IntType::kI8: return MPI_INT8_T;
    case IntType::kI16: return MPI_INT16_T;
    case IntType::kI32: return MPI_INT32_T;
  }
  return MPI_DATATYPE_NULL;
}

// MPI counts are int: split element ranges into pieces of at most 2^30.
constexpr uint64_t kMaxPiece = uint64_t{1} << 30;

int to_int(uint64_t v, const char* what) {
  if (v > static_cast<uint64_t>(INT_MAX))
    fail(Status::kInvalidArgument, std::string("MPI backend: ") + what + " of " + std::to_string(v) +
                                       " bytes exceeds MPI's int counts; lower THC_CHUNK_BYTES");
  return static_cast<int>(v);
}

// MPI can neither cancel nor free a started collective: an operation given up on (timeout)
// may still complete later, when its missing peer joins, and then writes its buffers. The
// buffers this backend owns for such operations are parked here for the life of the process.
void keep_forever(std::vector<uint8_t>&& buf) {
  static std::mutex mu;
  static auto* parked = new std::vector<std::vector<uint8_t>>();  // never freed, on purpose
  if (buf.empty()) return;
  std::lock_guard<std::mutex> lk(mu);
  parked->push_back(std::move(buf));
}

using Clock = std::chrono::steady_clock;

// What all operations of one communicator share: the wait bound, and whether an operation has
// failed. After a failure the ranks no longer start the same collectives in the same order, so
// the communicator refuses further operations instead of pairing them with the wrong ones.
struct CommState {
  long timeout_ms = 0;  // <= 0: wait without bound, as MPI itself does
  bool broken = false;
  std::string why;
  uint64_t next_ps = 0;      // sequence number of the next PS request
  uint64_t next_gather = 0;  // the PS request whose allgather must be posted next

  void check_usable() const {
    if (broken)
      fail(Status::kTransport, "MPI backend: an earlier operation on this communicator failed (" + why +
                                   "); MPI cannot cancel its collectives, so the ranks are out of step: "
                                   "create a new communicator or end the job");
  }
  [[noreturn]] void fail_broken(Status s, const std::string& msg) {
    if (!broken) {
      broken = true;
      why = msg;
    }
    fail(s, msg);
  }
  Clock::time_point deadline() const {
    return timeout_ms > 0 ? Clock::now() + std::chrono::milliseconds(timeout_ms) : Clock::time_point::max();
  }
  // Progress req until it completes (true) or the deadline passes (throws kTimeout, leaving the
  // request to MPI). An MPI error throws kTransport. Both mark the communicator broken.
  void wait(MPI_Request* req, Clock::time_point until, const char* what) {
    while (true) {
      int flag = 0;
      const int rc = PMPI_Test(req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        if (PMPI_Error_string(rc, msg, &len) != MPI_SUCCESS) std::snprintf(msg, sizeof msg, "error %d", rc);
        fail_broken(Status::kTransport, std::string("MPI backend: ") + what + " failed: " + msg);
      }
      if (flag) return;
      if (Clock::now() >= until)
        fail_broken(Status::kTimeout, std::string("MPI backend: ") + what + ": a peer did not take part within " +
                                          std::to_string(timeout_ms) + " ms (THC_TIMEOUT_MS)");
    }
  }
  // For destructors: a last look (no waiting) at a request of a broken communicator.
  static bool done_now(MPI_Request* req) {
    int flag = 0;
    return *req == MPI_REQUEST_NULL || (PMPI_Test(req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag);
  }
};

#define THC_CHECK_MPI_STATE(st, call)                                                               \
  do {                                                                                             \
    const int thc_mpi_rc_ = (call);                                                                \
    if (thc_mpi_rc_ != MPI_SUCCESS) {                                                              \
      (st).broken = true;                                                                          \
      if ((st).why.empty()) (st).why = #call " failed";                                            \
      ::thc::transport::mpi_fail(thc_mpi_rc_, #call, __FILE__, __LINE__);                          \
    }                                                                                              \
  } while (0)

class MultiRequest final : public Request {
 public:
  explicit MultiRequest(std::shared_ptr<CommState> st) : st_(std::move(st)) {}
  std::vector<MPI_Request> reqs;
  bool test() override {
    int flag = 0;
    THC_CHECK_MPI_STATE(*st_, PMPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    return flag != 0;
  }
  void wait() override {
    const auto until = st_->deadline();
    for (MPI_Request& r : reqs) st_->wait(&r, until, "integer sum (MPI_Iallreduce)");
  }
  // Never leaves a collective half done on a healthy communicator (the peers would wait for
  // it), and never waits past THC_TIMEOUT_MS; on a broken one it gives up at once.
  ~MultiRequest() override {
    for (MPI_Request& r : reqs) {
      if (r == MPI_REQUEST_NULL) continue;
      if (st_->broken) {
        CommState::done_now(&r);
        continue;
      }
      try {
        st_->wait(&r, st_->deadline(), "integer sum (MPI_Iallreduce), abandoned");
      } catch (const Error&) {
      }
    }
  }

 private:
  std::shared_ptr<CommState> st_;
};

// Colocated parameter server, index form. Rank r owns shard r of the wire elements (shards are
// multiples of 8 elements, so every shard starts on a byte boundary of the packed stream):
//   1. Ialltoallv: each rank sends shard r of its packed indices to rank r;
//   2. rank r looks each contribution up in the table and sums into its shard's sums;
//   3. (optional) the shard's sums are re-compressed (DownstreamCodec);
//   4. Iallgatherv: every rank receives every shard's sums (or their re-compressed bytes).
// Step 4 is started from test()/wait(), i.e. at a moment that depends on progress, so it runs on
// its own communicator: MPI requires every rank to start collectives on a communicator in the
// same order, and the engine keeps at most one request advancing at a time, so each
// communicator sees its collectives in chunk order on every rank (CommState::next_gather
// checks it).
class PsRequest final : public Request {
 public:
  PsRequest(std::shared_ptr<CommState> st, MPI_Comm comm, MPI_Comm gather_comm, int rank, int n, const uint8_t* packed,
            uint64_t count, const LookupTable& table, void* sums, IntType type, const DownstreamCodec* down)
      : st_(std::move(st)), comm_(comm), gather_comm_(gather_comm), rank_(rank), n_(n), count_(count), table_(table),
        sums_(static_cast<uint8_t*>(sums)), type_(type), down_(down) {
    const int b = table.bits;
    const uint64_t groups = (count + 7) / 8;  // 8-element groups
    off_.resize(n + 1);
    for (int r = 0; r <= n; ++r) off_[r] = std::min(count, (groups * r / n) * 8);
    std::vector<int> scount(n), sdisp(n);
    rcount_.resize(n);
    rdisp_.resize(n);
    const uint64_t my = off_[rank + 1] - off_[rank];
    const uint64_t my_bytes = (my * b + 7) / 8;
    recv_.resize(my_bytes * n + 1);
    for (int r = 0; r < n; ++r) {
      const uint64_t e = off_[r + 1] - off_[r];
      scount[r] = to_int((e * b + 7) / 8, "PS shard");
      sdisp[r] = to_int(off_[r] * b / 8, "PS displacement");
      rcount_[r] = to_int(my_bytes, "PS shard");
      rdisp_[r] = to_int(my_bytes * r, "PS receive displacement");
    }
    THC_CHECK_MPI_STATE(*st_, PMPI_Ialltoallv(packed, scount.data(), sdisp.data(), MPI_BYTE, recv_.data(),
                                              rcount_.data(), rdisp_.data(), MPI_BYTE, comm_, &req_));
    seq_ = st_->next_ps++;
  }

  bool test() override {
    while (true) {
      if (stage_ == 2) return true;
      int flag = 0;
      THC_CHECK_MPI_STATE(*st_, PMPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
      if (!flag) return false;
      advance();
    }
  }
  void wait() override {
    const auto until = st_->deadline();
    while (stage_ < 2) {
      st_->wait(&req_, until, stage_ == 0 ? "parameter server (MPI_Ialltoallv)" : "parameter server (MPI_Iallgatherv)");
      advance();
    }
  }
  // A request dropped before completion (an error elsewhere in the call) still plays its part:
  // on a healthy communicator it finishes both collectives (the peers wait for them), within
  // THC_TIMEOUT_MS; on a broken one it gives up at once. Buffers MPI may still write are parked.
  ~PsRequest() override {
    if (stage_ < 2 && !st_->broken) {
      try {
        wait();
      } catch (const Error&) {
      }
    }
    if (stage_ < 2 && !CommState::done_now(&req_)) {
      keep_forever(std::move(recv_));
      keep_forever(std::move(enc_));
    }
  }

 private:
  void advance() {
    const size_t w = codec::int_size(type_);
    if (stage_ == 0) {
      if (seq_ != st_->next_gather)
        st_->fail_broken(Status::kInternal, "MPI backend: parameter-server requests completed out of order");
      const uint64_t first = off_[rank_], my = off_[rank_ + 1] - off_[rank_];
      uint8_t* mine = sums_ + first * w;
      std::memset(mine, 0, my * w);
      const uint64_t my_bytes = static_cast<uint64_t>(rcount_[0]);
      for (int r = 0; r < n_; ++r) lookup_add(table_, recv_.data() + my_bytes * r, 0, my, type_, mine);
      std::vector<int> counts(n_), displs(n_);
      void* buf;
      if (down_) {
        // Re-compressed shards are laid out back to back by their encoded sizes.
        uint64_t pos = 0;
        for (int r = 0; r < n_; ++r) {
          const uint64_t e = off_[r + 1] - off_[r];
          counts[r] = to_int(down_->encoded_bytes(e), "re-compressed shard");
          displs[r] = to_int(pos, "re-compressed displacement");
          pos += counts[r];
        }
        enc_.resize(pos + 1);
        down_->encode(mine, first, my, enc_.data() + displs[rank_]);
        buf = enc_.data();
        enc_counts_ = counts;
        enc_displs_ = displs;
      } else {
        for (int r = 0; r < n_; ++r) {
          counts[r] = to_int((off_[r + 1] - off_[r]) * w, "PS sums");
          displs[r] = to_int(off_[r] * w, "PS sums displacement");
        }
        buf = sums_;
      }
      THC_CHECK_MPI_STATE(*st_, PMPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), displs.data(),
                                                 MPI_BYTE, gather_comm_, &req_));
      st_->next_gather++;
      stage_ = 1;
    } else if (stage_ == 1) {
      if (down_) {
        for (int r = 0; r < n_; ++r)
          down_->decode(enc_.data() + enc_displs_[r], off_[r], off_[r + 1] - off_[r], sums_ + off_[r] * w);
      }
      stage_ = 2;
    }
  }

  std::shared_ptr<CommState> st_;
  MPI_Comm comm_, gather_comm_;
  int rank_, n_;
  uint64_t count_;
  LookupTable table_;
  uint8_t* sums_;
  IntType type_;
  const DownstreamCodec* down_;
  std::vector<uint64_t> off_;
  std::vector<int> rcount_, rdisp_;
  std::vector<uint8_t> recv_, enc_;
  std::vector<int> enc_counts_, enc_displs_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  uint64_t seq_ = 0;
  int stage_ = 0;
};

class MpiReducer final : public Reducer {
 public:
  MpiReducer(MPI_Comm comm, long timeout_ms) : st_(std::make_shared<CommState>()) {
    st_->timeout_ms = timeout_ms;
    int inter = 0;
    THC_CHECK_MPI(PMPI_Comm_test_inter(comm, &inter));
    if (inter) fail(Status::kUnsupported, "MPI backend: intercommunicators are not supported");
    // Nonblocking duplicates, so that a rank that never creates its communicator makes the
    // others fail within THC_TIMEOUT_MS instead of waiting forever.
    comm_ = idup(comm);
    THC_CHECK_MPI(PMPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    gather_comm_ = idup(comm);
    THC_CHECK_MPI(PMPI_Comm_set_errhandler(gather_comm_, MPI_ERRORS_RETURN));
    THC_CHECK_MPI(PMPI_Comm_rank(comm_, &rank_));
    THC_CHECK_MPI(PMPI_Comm_size(comm_, &size_));
  }
  ~MpiReducer() override {
    int finalized = 0;
    PMPI_Finalized(&finalized);
    // A broken communicator keeps its duplicates: freed, their context ids would be reused by
    // communicators created later, and the messages of the abandoned operations (sent, or still
    // to come from a late peer) would be matched there.
    if (!finalized && !st_->broken) {
      if (comm_ != MPI_COMM_NULL) PMPI_Comm_free(&comm_);
      if (gather_comm_ != MPI_COMM_NULL) PMPI_Comm_free(&gather_comm_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  bool applies_downstream() const override { return true; }

  void max_u32(uint32_t* data, size_t n) override {
    st_->check_usable();
    // MPI works on a buffer of its own: if a peer never comes, the operation is abandoned with
    // it (keep_forever), not with the caller's memory.
    std::vector<uint8_t> buf(n * 4 + 1);
    std::memcpy(buf.data(), data, n * 4);
    uint32_t* w = reinterpret_cast<uint32_t*>(buf.data());
    const auto until = st_->deadline();
    for (uint64_t off = 0; off < n; off += kMaxPiece) {
      const int c = static_cast<int>(std::min<uint64_t>(kMaxPiece, n - off));
      MPI_Request req = MPI_REQUEST_NULL;
      THC_CHECK_MPI_STATE(*st_, PMPI_Iallreduce(MPI_IN_PLACE, w + off, c, MPI_UINT32_T, MPI_MAX, comm_, &req));
      try {
        st_->wait(&req, until, "MAX of the prelude (MPI_Iallreduce)");
      } catch (const Error&) {
        keep_forever(std::move(buf));
        throw;
      }
    }
    std::memcpy(data, w, n * 4);
  }

  std::unique_ptr<Request> start_sum(void* data, uint64_t count, IntType type) override {
    st_->check_usable();
    auto r = std::make_unique<MultiRequest>(st_);
    const size_t w = codec::int_size(type);
    for (uint64_t off = 0; off < count; off += kMaxPiece) {
      const int c = static_cast<int>(std::min<uint64_t>(kMaxPiece, count - off));
      r->reqs.push_back(MPI_REQUEST_NULL);
      THC_CHECK_MPI_STATE(*st_, PMPI_Iallreduce(MPI_IN_PLACE, static_cast<uint8_t*>(data) + off * w, c,
                                                mpi_type(type), MPI_SUM, comm_, &r->reqs.back()));
    }
    return r;
  }

  std::unique_ptr<Request> start_lookup_sum(const uint8_t* packed, uint64_t count, const LookupTable& table,
                                            void* sums, IntType type, const DownstreamCodec* down) override {
    st_->check_usable();
    return std::make_unique<PsRequest>(st_, comm_, gather_comm_, rank_, size_, packed, count, table, sums, type, down);
  }

 private:
  MPI_Comm idup(MPI_Comm comm) {
    // The handle is written when the duplicate completes: on a timeout it must outlive us.
    std::vector<uint8_t> slot(sizeof(MPI_Comm));
    MPI_Comm* out = reinterpret_cast<MPI_Comm*>(slot.data());
    *out = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    THC_CHECK_MPI(PMPI_Comm_idup(comm, out, &req));
    try {
      st_->wait(&req, st_->deadline(), "creating the communicator (MPI_Comm_idup)");
    } catch (const Error&) {
      keep_forever(std::move(slot));
      throw;
    }
    return *out;
  }

  std::shared_ptr<CommState> st_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm gather_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Reducer> make_mpi_reducer(MPI_Comm comm, long timeout_ms) {
  return std::make_unique<MpiReducer>(comm, timeout_ms);
}

}  // namespace thc::transport
