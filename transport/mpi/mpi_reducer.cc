#include "transport/mpi/mpi_reducer.h"

#include <algorithm>
#include <climits>
#include <cstring>
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

class MultiRequest final : public Request {
 public:
  std::vector<MPI_Request> reqs;
  bool test() override {
    int flag = 0;
    THC_CHECK_MPI(PMPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE));
    return flag != 0;
  }
  void wait() override {
    THC_CHECK_MPI(PMPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
  }
  ~MultiRequest() override {
    for (MPI_Request& r : reqs)
      if (r != MPI_REQUEST_NULL) PMPI_Wait(&r, MPI_STATUS_IGNORE);
  }
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
// communicator sees its collectives in chunk order on every rank.
class PsRequest final : public Request {
 public:
  PsRequest(MPI_Comm comm, MPI_Comm gather_comm, int rank, int n, const uint8_t* packed, uint64_t count, const LookupTable& table,
            void* sums, IntType type, const DownstreamCodec* down)
      : comm_(comm), gather_comm_(gather_comm), rank_(rank), n_(n), count_(count), table_(table), sums_(static_cast<uint8_t*>(sums)),
        type_(type), down_(down) {
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
    THC_CHECK_MPI(PMPI_Ialltoallv(packed, scount.data(), sdisp.data(), MPI_BYTE, recv_.data(), rcount_.data(),
                                  rdisp_.data(), MPI_BYTE, comm_, &req_));
  }

  bool test() override {
    while (true) {
      if (stage_ == 2) return true;
      int flag = 0;
      THC_CHECK_MPI(PMPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
      if (!flag) return false;
      advance();
    }
  }
  void wait() override {
    while (stage_ < 2) {
      THC_CHECK_MPI(PMPI_Wait(&req_, MPI_STATUS_IGNORE));
      advance();
    }
  }
  ~PsRequest() override {
    if (req_ != MPI_REQUEST_NULL) PMPI_Wait(&req_, MPI_STATUS_IGNORE);
  }

 private:
  void advance() {
    const size_t w = codec::int_size(type_);
    if (stage_ == 0) {
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
      THC_CHECK_MPI(PMPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts.data(), displs.data(), MPI_BYTE,
                                     gather_comm_, &req_));
      stage_ = 1;
    } else if (stage_ == 1) {
      if (down_) {
        for (int r = 0; r < n_; ++r)
          down_->decode(enc_.data() + enc_displs_[r], off_[r], off_[r + 1] - off_[r], sums_ + off_[r] * w);
      }
      stage_ = 2;
    }
  }

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
  int stage_ = 0;
};

class MpiReducer final : public Reducer {
 public:
  explicit MpiReducer(MPI_Comm comm) {
    int inter = 0;
    THC_CHECK_MPI(PMPI_Comm_test_inter(comm, &inter));
    if (inter) fail(Status::kUnsupported, "MPI backend: intercommunicators are not supported");
    THC_CHECK_MPI(PMPI_Comm_dup(comm, &comm_));
    THC_CHECK_MPI(PMPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    THC_CHECK_MPI(PMPI_Comm_dup(comm, &gather_comm_));
    THC_CHECK_MPI(PMPI_Comm_set_errhandler(gather_comm_, MPI_ERRORS_RETURN));
    THC_CHECK_MPI(PMPI_Comm_rank(comm_, &rank_));
    THC_CHECK_MPI(PMPI_Comm_size(comm_, &size_));
  }
  ~MpiReducer() override {
    int finalized = 0;
    PMPI_Finalized(&finalized);
    if (!finalized) {
      PMPI_Comm_free(&comm_);
      PMPI_Comm_free(&gather_comm_);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }
  bool applies_downstream() const override { return true; }

  void max_u32(uint32_t* data, size_t n) override {
    for (uint64_t off = 0; off < n; off += kMaxPiece) {
      const int c = static_cast<int>(std::min<uint64_t>(kMaxPiece, n - off));
      THC_CHECK_MPI(PMPI_Allreduce(MPI_IN_PLACE, data + off, c, MPI_UINT32_T, MPI_MAX, comm_));
    }
  }

  std::unique_ptr<Request> start_sum(void* data, uint64_t count, IntType type) override {
    auto r = std::make_unique<MultiRequest>();
    const size_t w = codec::int_size(type);
    for (uint64_t off = 0; off < count; off += kMaxPiece) {
      const int c = static_cast<int>(std::min<uint64_t>(kMaxPiece, count - off));
      r->reqs.push_back(MPI_REQUEST_NULL);
      THC_CHECK_MPI(PMPI_Iallreduce(MPI_IN_PLACE, static_cast<uint8_t*>(data) + off * w, c, mpi_type(type), MPI_SUM,
                                    comm_, &r->reqs.back()));
    }
    return r;
  }

  std::unique_ptr<Request> start_lookup_sum(const uint8_t* packed, uint64_t count, const LookupTable& table,
                                            void* sums, IntType type, const DownstreamCodec* down) override {
    return std::make_unique<PsRequest>(comm_, gather_comm_, rank_, size_, packed, count, table, sums, type, down);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm gather_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Reducer> make_mpi_reducer(MPI_Comm comm) { return std::make_unique<MpiReducer>(comm); }

}  // namespace thc::transport
