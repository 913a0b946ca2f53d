#include "transport/inproc/inproc.h"

#include "transport/schedules/schedules.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <condition_variable>
#include <cstring>
#include <deque>
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
    auto all_in = [&] { return s.arrived == size_ || mismatch_; };
    // THC_TIMEOUT_MS <= 0: no bound, as for the schedules and MPI (not "do not wait").
    if (timeout_ms_ <= 0) {
      cv_.wait(lk, all_in);
    } else if (!cv_.wait_for(lk, std::chrono::milliseconds(timeout_ms_), all_in)) {
      fail(Status::kTimeout, "inproc: peers did not join collective #" + std::to_string(seq) + " within " +
                                 std::to_string(timeout_ms_) + " ms (THC_TIMEOUT_MS)");
    }
    if (mismatch_) fail(Status::kConfigMismatch, "inproc: ranks started different collectives");
    lk.unlock();
    fn(s);  // read-only on deposits; results go to the caller's buffers
    lk.lock();
    if (++s.done == size_) ops_.erase(seq);
  }

  long timeout_ms() const { return timeout_ms_; }

  // Point-to-point: a message is copied into the (src, dst, tag) mailbox when sent; receives
  // take mailbox heads in posting order (MPI's non-overtaking rule).
  void post(int src, int dst, uint32_t tag, const void* buf, size_t bytes) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      const uint8_t* b = static_cast<const uint8_t*>(buf);
      boxes_[Box{src, dst, tag}].emplace_back(b, b + bytes);
    }
    cv_.notify_all();
  }
  // Takes the head of the (src, dst, tag) mailbox into buf if there is one (false if none);
  // a size different from the receive's is a schedule mismatch between the ranks.
  bool take(int src, int dst, uint32_t tag, void* buf, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = boxes_.find(Box{src, dst, tag});
    if (it == boxes_.end() || it->second.empty()) return false;
    std::vector<uint8_t>& m = it->second.front();
    if (m.size() != bytes)
      fail(Status::kConfigMismatch, "inproc: rank " + std::to_string(dst) + " expected " + std::to_string(bytes) +
                                        " bytes from rank " + std::to_string(src) + ", got " + std::to_string(m.size()) +
                                        " on tag " + std::to_string(tag) + " (the ranks started different operations)");
    if (bytes) std::memcpy(buf, m.data(), bytes);
    it->second.pop_front();
    return true;
  }
  void idle(uint64_t us) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, std::chrono::microseconds(us));
  }

 private:
  struct Box {
    int src, dst;
    uint32_t tag;
    bool operator<(const Box& o) const {
      return src != o.src ? src < o.src : dst != o.dst ? dst < o.dst : tag < o.tag;
    }
  };
  std::map<Box, std::deque<std::vector<uint8_t>>> boxes_;

  int size_;
  long timeout_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, OpSlot> ops_;
  bool mismatch_ = false;
};

namespace {

class InprocLink final : public Link {
 public:
  InprocLink(std::shared_ptr<InprocGroup> g, int rank) : g_(std::move(g)), rank_(rank) {
    if (rank < 0 || rank >= g_->size())
      fail(Status::kInvalidArgument, "inproc: rank " + std::to_string(rank) + " outside group of " +
                                         std::to_string(g_->size()));
  }
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  std::string name() const override { return "inproc"; }
  long timeout_ms() const override { return g_->timeout_ms(); }
  uint32_t tag_limit() const override { return 32768; }

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

  void isend(int peer, uint32_t tag, const void* buf, size_t bytes, Req* req) override {
    check_peer(peer);
    g_->post(rank_, peer, tag, buf, bytes);
    *req = add(Pending{true, peer, tag, nullptr, bytes});  // complete: the bytes were copied
  }
  void irecv(int peer, uint32_t tag, void* buf, size_t bytes, Req* req) override {
    check_peer(peer);
    *req = add(Pending{false, peer, tag, buf, bytes});
  }
  int test_some(Req* reqs, int n, int* done) override {
    int k = 0;
    // Receives match messages in posting order: once one finds its mailbox empty, later ones
    // for the same (peer, tag) wait too, even if a message arrives meanwhile.
    blocked_.clear();
    for (int i = 0; i < n; ++i) {
      if (reqs[i] == kNullReq) continue;
      auto it = pending_.find(reqs[i]);
      if (it == pending_.end()) fail(Status::kInternal, "inproc: unknown request");
      Pending& p = it->second;
      if (!p.send) {
        const std::pair<int, uint32_t> key{p.peer, p.tag};
        if (std::find(blocked_.begin(), blocked_.end(), key) != blocked_.end()) continue;
        if (!g_->take(p.peer, rank_, p.tag, p.buf, p.bytes)) {
          blocked_.push_back(key);
          continue;
        }
      }
      pending_.erase(it);
      reqs[i] = kNullReq;
      done[k++] = i;
    }
    return k;
  }
  bool cancel(Req* req) override {
    pending_.erase(*req);  // nothing is in flight: sends were copied, receives copy when tested
    *req = kNullReq;
    return true;
  }
  void idle(uint64_t us) override { g_->idle(us); }

 private:
  struct Pending {
    bool send;
    int peer;
    uint32_t tag;
    void* buf;
    size_t bytes;
  };
  void check_peer(int peer) const {
    if (peer < 0 || peer >= g_->size() || peer == rank_)
      fail(Status::kInternal, "inproc: bad peer " + std::to_string(peer) + " for rank " + std::to_string(rank_));
  }
  Req add(const Pending& p) {
    const Req id = next_++;
    pending_.emplace(id, p);
    return id;
  }

  std::shared_ptr<InprocGroup> g_;
  int rank_;
  uint64_t seq_ = 0;
  Req next_ = 1;
  std::map<Req, Pending> pending_;
  std::vector<std::pair<int, uint32_t>> blocked_;
};

}  // namespace

std::shared_ptr<InprocGroup> make_inproc_group(int size, long timeout_ms) {
  if (size < 1) fail(Status::kInvalidArgument, "inproc: group size must be >= 1");
  return std::make_shared<InprocGroup>(size, timeout_ms);
}

std::unique_ptr<Link> make_inproc_link(std::shared_ptr<InprocGroup> group, int rank) {
  return std::make_unique<InprocLink>(std::move(group), rank);
}

std::unique_ptr<Reducer> make_inproc_reducer(std::shared_ptr<InprocGroup> group, int rank) {
  return make_scheduled_reducer(make_inproc_link(std::move(group), rank));
}

}  // namespace thc::transport
