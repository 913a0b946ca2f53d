#include "transport/group_link.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "common/keep_forever.h"
#include "common/status.h"

namespace thc::transport {
namespace {

class ForwardLink final : public Link {
 public:
  explicit ForwardLink(std::shared_ptr<Link> p) : p_(std::move(p)) {}
  int rank() const override { return p_->rank(); }
  int size() const override { return p_->size(); }
  std::string name() const override { return p_->name(); }
  long timeout_ms() const override { return p_->timeout_ms(); }
  uint32_t tag_limit() const override { return p_->tag_limit() / 2; }
  void max_u32(uint32_t* data, size_t n) override { p_->max_u32(data, n); }
  void isend(int peer, uint32_t tag, const void* buf, size_t bytes, Req* req) override {
    p_->isend(peer, tag, buf, bytes, req);
  }
  void irecv(int peer, uint32_t tag, void* buf, size_t bytes, Req* req) override {
    p_->irecv(peer, tag, buf, bytes, req);
  }
  int test_some(Req* reqs, int n, int* done) override { return p_->test_some(reqs, n, done); }
  bool cancel(Req* req) override { return p_->cancel(req); }
  void idle(uint64_t us) override { p_->idle(us); }

 private:
  std::shared_ptr<Link> p_;
};

class GroupLink final : public Link {
 public:
  GroupLink(std::shared_ptr<Link> p, std::vector<int> members)
      : p_(std::move(p)), members_(std::move(members)), off_(p_->tag_limit() / 2) {
    for (size_t i = 0; i < members_.size(); ++i) {
      const int m = members_[i];
      if (m < 0 || m >= p_->size() || std::count(members_.begin(), members_.end(), m) != 1)
        fail(Status::kInternal, p_->name() + ": group member " + std::to_string(m) + " invalid or repeated");
      if (m == p_->rank()) rank_ = static_cast<int>(i);
    }
    if (rank_ < 0) fail(Status::kInternal, p_->name() + ": this rank is not a member of its group");
  }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::string name() const override { return p_->name() + " (a group of " + std::to_string(members_.size()) + " ranks)"; }
  long timeout_ms() const override { return p_->timeout_ms(); }
  // The top tag of the upper half is the MAX's.
  uint32_t tag_limit() const override { return p_->tag_limit() - off_ - 1; }
  void isend(int peer, uint32_t tag, const void* buf, size_t bytes, Req* req) override {
    p_->isend(at(peer), tag + off_, buf, bytes, req);
  }
  void irecv(int peer, uint32_t tag, void* buf, size_t bytes, Req* req) override {
    p_->irecv(at(peer), tag + off_, buf, bytes, req);
  }
  int test_some(Req* reqs, int n, int* done) override { return p_->test_some(reqs, n, done); }
  bool cancel(Req* req) override { return p_->cancel(req); }
  void idle(uint64_t us) override { p_->idle(us); }

  // Member 0 gathers every member's words, takes the MAX and sends it back. Buffers are the
  // operation's own: after a timeout the ones the link may still touch are kept for good.
  void max_u32(uint32_t* data, size_t n) override {
    const int k = size();
    if (k == 1 || n == 0) return;
    const uint32_t tag = p_->tag_limit() - 1;
    const size_t bytes = n * 4;
    if (rank_ == 0) {
      std::vector<std::vector<uint8_t>> in(static_cast<size_t>(k - 1), std::vector<uint8_t>(bytes));
      std::vector<Req> reqs(static_cast<size_t>(k - 1), kNullReq);
      for (int q = 1; q < k; ++q) p_->irecv(members_[static_cast<size_t>(q)], tag, in[static_cast<size_t>(q - 1)].data(), bytes, &reqs[static_cast<size_t>(q - 1)]);
      wait_all(reqs, "gathering the MAX", [&](size_t i) { keep_forever(std::move(in[i])); });
      for (const auto& v : in) {
        const uint32_t* w = reinterpret_cast<const uint32_t*>(v.data());
        for (size_t i = 0; i < n; ++i) data[i] = std::max(data[i], w[i]);
      }
      std::vector<uint8_t> out(bytes);
      std::memcpy(out.data(), data, bytes);
      std::fill(reqs.begin(), reqs.end(), kNullReq);
      for (int q = 1; q < k; ++q) p_->isend(members_[static_cast<size_t>(q)], tag, out.data(), bytes, &reqs[static_cast<size_t>(q - 1)]);
      wait_all(reqs, "sending the MAX", [&](size_t) {
        if (!out.empty()) keep_forever(std::move(out));
      });
      return;
    }
    std::vector<uint8_t> mine(bytes), back(bytes);
    std::memcpy(mine.data(), data, bytes);
    std::vector<Req> reqs(2, kNullReq);
    p_->isend(members_[0], tag, mine.data(), bytes, &reqs[0]);
    p_->irecv(members_[0], tag, back.data(), bytes, &reqs[1]);
    wait_all(reqs, "the MAX", [&](size_t i) { keep_forever(std::move(i == 0 ? mine : back)); });
    std::memcpy(data, back.data(), bytes);
  }

 private:
  int at(int peer) const {
    if (peer < 0 || peer >= size()) fail(Status::kInternal, name() + ": peer " + std::to_string(peer) + " out of range");
    return members_[static_cast<size_t>(peer)];
  }
  // Waits for every request within timeout_ms of no progress (<= 0: no bound); on a failure or a
  // timeout cancels the rest and parks (park(i)) the buffer of each that the link may still touch.
  template <typename Park>
  void wait_all(std::vector<Req>& reqs, const char* what, Park&& park) {
    using Clock = std::chrono::steady_clock;
    const long ms = p_->timeout_ms();
    auto last = Clock::now();
    std::vector<int> done(reqs.size());
    uint64_t nap = 0;
    auto give_up = [&](Status s, const std::string& msg) {
      for (size_t i = 0; i < reqs.size(); ++i)
        if (reqs[i] != kNullReq && !p_->cancel(&reqs[i])) park(i);
      fail(s, msg);
    };
    for (;;) {
      if (std::all_of(reqs.begin(), reqs.end(), [](Req r) { return r == kNullReq; })) return;
      int got = 0;
      try {
        got = p_->test_some(reqs.data(), static_cast<int>(reqs.size()), done.data());
      } catch (const Error& e) {
        give_up(e.status(), name() + ": " + what + ": " + e.what());
      }
      if (got > 0) {
        last = Clock::now();
        nap = 0;
        continue;
      }
      if (ms > 0 && Clock::now() - last > std::chrono::milliseconds(ms)) {
        // Member 0 waits on members 1.. (request i: member i + 1), the others on member 0.
        std::string missing;
        for (size_t i = 0; i < reqs.size() && (rank_ == 0 || missing.empty()); ++i)
          if (reqs[i] != kNullReq)
            missing += (missing.empty() ? "" : ", ") + std::to_string(rank_ == 0 ? members_[i + 1] : members_[0]);
        give_up(Status::kTimeout, name() + ": " + what + ": no progress within " + std::to_string(ms) +
                                      " ms (THC_TIMEOUT_MS) with rank(s) " + missing);
      }
      nap = nap ? std::min<uint64_t>(2 * nap, 200) : 10;
      p_->idle(nap);
    }
  }

  std::shared_ptr<Link> p_;
  std::vector<int> members_;
  uint32_t off_;
  int rank_ = -1;
};

}  // namespace

std::unique_ptr<Link> make_group_link(std::shared_ptr<Link> parent, std::vector<int> members) {
  return std::make_unique<GroupLink>(std::move(parent), std::move(members));
}
std::unique_ptr<Link> make_forward_link(std::shared_ptr<Link> parent) {
  return std::make_unique<ForwardLink>(std::move(parent));
}

}  // namespace thc::transport
