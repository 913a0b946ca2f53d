#include "transport/inproc/inproc.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace thc::transport {

namespace {
enum class Kind { kMax, kSum, kLookup };
}

// One collective operation in flight: every rank deposits a copy of its contribution; every rank
// computes its own result from all deposits; the last rank to finish frees the slot.
struct OpSlot {
  Kind kind;
  uint64_t count = 0;
  IntType type = IntType::kU8;
  LookupTable table;
  std::vector<std::vector<uint8_t>> data;
  int arrived = 0;
  int done = 0;
};

class InprocGroup {
 public:
  InprocGroup(int size, long timeout_ms) : size_(size), timeout_ms_(timeout_ms) {}
  int size() const { return size_; }

  OpSlot* deposit(uint64_t seq, int rank, Kind kind, uint64_t count, IntType type, const LookupTable* table,
                  const void* bytes, size_t nbytes) {
    std::lock_guard<std::mutex> lk(mu_);
    OpSlot& s = ops_[seq];
    if (s.data.empty()) {
      s.data.resize(size_);
      s.kind = kind;
      s.count = count;
      s.type = type;
      if (table) s.table = *table;
    } else if (s.kind != kind || s.count != count || s.type != type) {
      mismatch_ = true;
    }
    s.data[rank].assign(static_cast<const uint8_t*>(bytes), static_cast<const uint8_t*>(bytes) + nbytes);
    s.arrived++;
    cv_.notify_all();
    return &s;
  }

  // Wait for all deposits, run fn on the complete slot, then release it.
  template <typename Fn>
  void complete(uint64_t seq, Fn fn) {
    std::unique_lock<std::mutex> lk(mu_);
    OpSlot& s = ops_.at(seq);
    if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms_), [&] { return s.arrived == size_ || mismatch_; }))
      fail(Status::kTimeout, "inproc: peers did not join collective #" + std::to_string(seq) + " within " +
                                 std::to_string(timeout_ms_) + " ms");
    if (mismatch_) fail(Status::kConfigMismatch, "inproc: ranks started different collectives");
    lk.unlock();
    fn(s);  // read-only on deposits; results go to the caller's buffers
    lk.lock();
    if (++s.done == size_) ops_.erase(seq);
  }

  bool ready(uint64_t seq) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = ops_.find(seq);
    return it != ops_.end() && it->second.arrived == size_;
  }

 private:
  int size_;
  long timeout_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, OpSlot> ops_;
  bool mismatch_ = false;
};

namespace {

class InprocRequest final : public Request {
 public:
  InprocRequest(InprocGroup* g, uint64_t seq, std::function<void(OpSlot&)> fn)
      : g_(g), seq_(seq), fn_(std::move(fn)) {}
  bool test() override { return done_ || g_->ready(seq_); }
  void wait() override {
    if (done_) return;
    g_->complete(seq_, fn_);
    done_ = true;
  }
  ~InprocRequest() override {
    // A request dropped without wait() (error path) must still release its slot share.
    if (!done_) {
      try {
        g_->complete(seq_, [](OpSlot&) {});
      } catch (...) {
      }
    }
  }

 private:
  InprocGroup* g_;
  uint64_t seq_;
  std::function<void(OpSlot&)> fn_;
  bool done_ = false;
};

class InprocReducer final : public Reducer {
 public:
  InprocReducer(std::shared_ptr<InprocGroup> g, int rank) : g_(std::move(g)), rank_(rank) {
    if (rank < 0 || rank >= g_->size())
      fail(Status::kInvalidArgument, "inproc: rank " + std::to_string(rank) + " outside group of " +
                                         std::to_string(g_->size()));
  }
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  std::string name() const override { return "inproc"; }
  bool applies_downstream() const override { return true; }

  void max_u32(uint32_t* data, size_t n) override {
    const uint64_t seq = seq_++;
    g_->deposit(seq, rank_, Kind::kMax, n, IntType::kU32, nullptr, data, n * 4);
    g_->complete(seq, [&](OpSlot& s) {
      for (int r = 0; r < g_->size(); ++r) {
        const uint32_t* v = reinterpret_cast<const uint32_t*>(s.data[r].data());
        for (size_t i = 0; i < n; ++i) data[i] = r == 0 ? v[i] : std::max(data[i], v[i]);
      }
    });
  }

  std::unique_ptr<Request> start_sum(void* data, uint64_t count, IntType type) override {
    const uint64_t seq = seq_++;
    const size_t nb = count * codec::int_size(type);
    g_->deposit(seq, rank_, Kind::kSum, count, type, nullptr, data, nb);
    const int n = g_->size();
    return std::make_unique<InprocRequest>(g_.get(), seq, [=](OpSlot& s) {
      std::memcpy(data, s.data[0].data(), nb);
      for (int r = 1; r < n; ++r) add_ints(type, data, s.data[r].data(), count);
    });
  }

  std::unique_ptr<Request> start_lookup_sum(const uint8_t* packed, uint64_t count, const LookupTable& table,
                                            void* sums, IntType type, const DownstreamCodec* down) override {
    const uint64_t seq = seq_++;
    const size_t nb = (count * table.bits + 7) / 8;
    g_->deposit(seq, rank_, Kind::kLookup, count, type, &table, packed, nb);
    const int n = g_->size();
    return std::make_unique<InprocRequest>(g_.get(), seq, [=](OpSlot& s) {
      std::memset(sums, 0, count * codec::int_size(type));
      for (int r = 0; r < n; ++r) lookup_add(s.table, s.data[r].data(), 0, count, type, sums);
      if (down) {
        // Emulate the downstream re-compression exactly as a PS would (rank 0 owns everything).
        std::vector<uint8_t> enc(down->encoded_bytes(count));
        down->encode(sums, 0, count, enc.data());
        down->decode(enc.data(), 0, count, sums);
      }
    });
  }

 private:
  std::shared_ptr<InprocGroup> g_;
  int rank_;
  uint64_t seq_ = 0;
};

}  // namespace

std::shared_ptr<InprocGroup> make_inproc_group(int size, long timeout_ms) {
  if (size < 1) fail(Status::kInvalidArgument, "inproc: group size must be >= 1");
  return std::make_shared<InprocGroup>(size, timeout_ms);
}

std::unique_ptr<Reducer> make_inproc_reducer(std::shared_ptr<InprocGroup> group, int rank) {
  return std::make_unique<InprocReducer>(std::move(group), rank);
}

}  // namespace thc::transport
