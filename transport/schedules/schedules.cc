#include "transport/schedules/schedules.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "common/keep_forever.h"
#include "common/status.h"

namespace thc::transport {
namespace {

using Clock = std::chrono::steady_clock;

// What the operations of one reducer share.
struct Shared {
  std::unique_ptr<Link> link;
  ScheduleOptions opt;
  bool broken = false;
  std::string why;
  uint64_t next_op = 0;

  void check_usable() const {
    if (broken)
      fail(Status::kTransport, link->name() + " backend: an earlier operation on this communicator failed (" + why +
                                   "); the ranks are out of step: create a new communicator or end the job");
  }
  void mark_broken(const std::string& msg) {
    if (!broken) {
      broken = true;
      why = msg;
    }
  }
  // Buffers of finished operations, for the next ones. An operation's buffers live for one chunk
  // of a call; freed and allocated again at every chunk (sizes vary from chunk to chunk in calls on
  // several tensors), the allocator hands them back to the system and faults them in again,
  // zero-filled: several megabytes of page faults per call. Contents are unspecified.
  std::vector<std::vector<uint8_t>> spare;
  std::vector<uint8_t> take(size_t n) {
    size_t best = spare.size();
    for (size_t i = 0; i < spare.size(); ++i)
      if (spare[i].size() >= n && (best == spare.size() || spare[i].size() < spare[best].size())) best = i;
    if (best == spare.size() && !spare.empty()) best = 0;  // grow one rather than allocate anew
    std::vector<uint8_t> v;
    if (best < spare.size()) {
      v = std::move(spare[best]);
      spare.erase(spare.begin() + static_cast<std::ptrdiff_t>(best));
    }
    if (v.size() < n) v.resize(n);
    return v;
  }
  void give(std::vector<uint8_t>&& v) {
    if (!v.empty() && spare.size() < 16) spare.push_back(std::move(v));
  }
  // Two tags per operation (reduce-scatter, allgather); operations in flight at once are few, so
  // the operation number modulo the tag space keeps them apart.
  uint32_t tag(uint64_t op, int phase) const {
    const uint64_t ops = std::max<uint64_t>(2, link->tag_limit() / 2);
    return static_cast<uint32_t>((op % ops) * 2 + static_cast<uint64_t>(phase));
  }
};

// One element range of a shard or segment, and where its bytes live.
struct Piece {
  uint64_t first = 0, count = 0;
};

// Cuts [begin, end) into pieces of at most `pe` elements, as few as that allows and of equal
// size (multiples of `unit`, but for the last): a range just over the limit becomes two halves,
// not a full piece and a sliver (each message costs the transport about the same whatever its
// size: a write, a wake-up of the receiver).
std::vector<Piece> cut(uint64_t begin, uint64_t end, uint64_t pe, uint64_t unit = 1) {
  std::vector<Piece> v;
  if (end <= begin) return v;
  const uint64_t len = end - begin;
  const uint64_t np = (len + pe - 1) / pe;
  const uint64_t each = std::min(pe, ((len + np - 1) / np + unit - 1) / unit * unit);
  for (uint64_t f = begin; f < end; f += each) v.push_back(Piece{f, std::min(each, end - f)});
  return v;
}

// The machinery every schedule shares: posted requests with what to do when each completes, a
// queue of sends admitted through a window, waiting without spinning, abandoning on failure.
class Sched : public Request {
 public:
  explicit Sched(std::shared_ptr<Shared> sh, const char* what)
      : sh_(std::move(sh)), link_(sh_->link.get()), what_(what), op_(sh_->next_op++) {}

  bool test() override {
    if (done_) return true;
    progress();
    return done_;
  }

  // THC_TIMEOUT_MS bounds the time without progress (no message of this operation completing),
  // not the operation: a transfer that keeps moving is never cut short, a peer that stops is
  // given up on within the bound.
  void wait() override {
    if (done_) return;
    const long tmo = link_->timeout_ms();
    auto deadline = [tmo](Clock::time_point from) {
      return tmo > 0 ? from + std::chrono::milliseconds(tmo) : Clock::time_point::max();
    };
    Clock::time_point until = deadline(Clock::now());
    uint64_t nap = 0;
    while (!done_) {
      if (progress() > 0) {
        until = deadline(Clock::now());
        nap = 0;
        continue;
      }
      if (done_) break;
      const Clock::time_point now = Clock::now();
      if (now >= until) abandon(Status::kTimeout, timeout_message());
      nap = nap ? std::min<uint64_t>(2 * nap, 200) : 10;
      link_->idle(nap);
    }
  }

  ~Sched() override = default;

 protected:
  // Every schedule's destructor calls this first (the reactions are virtual, so it cannot run in
  // ~Sched): a request dropped unfinished (an error elsewhere in the call) still plays its part
  // on a healthy communicator, within THC_TIMEOUT_MS (the peers wait for its messages); then
  // whatever is left is cancelled.
  void shutdown() {
    if (!done_ && !sh_->broken) {
      try {
        wait();
      } catch (const Error&) {
      }
    }
    if (!done_) release();
    done_ = true;
  }

  enum class Act : uint8_t { kSend, kRecvA, kRecvB };
  static constexpr uint32_t kWhole = UINT32_MAX;  // a message sent in one part
  struct Posted {
    Act act;
    int peer;
    uint64_t index;  // the schedule's own numbering of the message
    uint32_t split;  // kWhole, or the message's entry in parts_left_
  };
  struct Send {
    int peer;
    uint32_t tag;
    const uint8_t* buf;
    size_t bytes;
    uint64_t index;
    uint32_t split;
  };

  // The schedule's reactions; each may queue sends (send()).
  virtual void on_recv(Act act, int peer, uint64_t index) = 0;
  virtual void on_send_done(uint64_t index) { (void)index; }
  // True once every piece of the result is in place (sends may still be in flight).
  virtual bool result_ready() const = 0;
  // Buffers the link may touch, parked if the link cannot let go of them.
  virtual void park() = 0;

  // A message of `bytes` goes as parts() messages (both ends cut it alike, so parts match in
  // order); the reaction comes once its last part completes.
  void post_recv(Act act, int peer, uint32_t tag, uint8_t* buf, size_t bytes, uint64_t index) {
    const uint32_t split = new_split(bytes);
    for_parts(bytes, [&](size_t off, size_t len) {
      reqs_.push_back(Link::kNullReq);
      posted_.push_back(Posted{act, peer, index, split});
      ++pending_;
      try {
        link_->irecv(peer, tag, buf + off, len, &reqs_.back());
      } catch (const Error& e) {
        abandon(e.status(), e.what());
      }
    });
  }
  // The parts of a message stay consecutive among the sends of its tag (what the receiver's
  // parts match by): each queue is FIFO, and every schedule sends a tag through one queue only
  // (urgent sends use a phase tag of their own).
  void send(int peer, uint32_t tag, const uint8_t* buf, size_t bytes, uint64_t index, bool urgent = false) {
    const uint32_t split = new_split(bytes);
    for_parts(bytes, [&](size_t off, size_t len) {
      (urgent ? urgent_ : queue_).push_back(Send{peer, tag, buf + off, len, index, split});
      ++sends_left_;
    });
  }
  // Posts queued sends up to the window; called after every reaction.
  void pump() {
    while (in_flight_ < sh_->opt.send_window && (!urgent_.empty() || !queue_.empty())) {
      std::deque<Send>& q = urgent_.empty() ? queue_ : urgent_;
      const Send s = q.front();
      q.pop_front();
      reqs_.push_back(Link::kNullReq);
      posted_.push_back(Posted{Act::kSend, s.peer, s.index, s.split});
      ++pending_;
      ++in_flight_;
      try {
        link_->isend(s.peer, s.tag, s.buf, s.bytes, &reqs_.back());
      } catch (const Error& e) {
        abandon(e.status(), e.what());
      }
    }
  }
  void check_done() {
    if (!done_ && sends_left_ == 0 && pending_ == 0 && result_ready()) done_ = true;
  }
  // For a schedule whose result needs no messages (one rank, nothing to send).
  void finish_now() {
    pump();
    check_done();
  }
  uint32_t tag(int phase) const { return sh_->tag(op_, phase); }
  std::vector<uint8_t> take(size_t n) { return sh_->take(n); }
  // Back to the spares, after shutdown() (buffers the link may still touch were parked: empty).
  void recycle(std::vector<uint8_t>& v) { sh_->give(std::move(v)); }
  Link& link() { return *link_; }
  const ScheduleOptions& opt() const { return sh_->opt; }
  [[noreturn]] void abandon(Status s, const std::string& msg) {
    sh_->mark_broken(msg);
    release();
    done_ = true;  // nothing more will happen to this request
    fail(s, msg);
  }

 private:
  // One round of progress: reactions to completed messages, then newly admitted sends.
  int progress() {
    if (reqs_.empty()) {
      pump();
      check_done();
      return 0;
    }
    done_idx_.resize(reqs_.size());
    int k = 0;
    try {
      k = link_->test_some(reqs_.data(), static_cast<int>(reqs_.size()), done_idx_.data());
    } catch (const Error& e) {
      abandon(e.status(), std::string(what_) + ": " + e.what());
    }
    for (int i = 0; i < k; ++i) {
      const Posted p = posted_[static_cast<size_t>(done_idx_[i])];
      --pending_;
      if (p.act == Act::kSend) {
        --in_flight_;
        --sends_left_;
      }
      if (p.split != kWhole && --parts_left_[p.split] > 0) continue;
      if (p.act == Act::kSend) {
        on_send_done(p.index);
      } else {
        on_recv(p.act, p.peer, p.index);
      }
    }
    if (k > 0) compact();
    pump();
    check_done();
    return k;
  }
  void compact() {
    size_t w = 0;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (reqs_[i] == Link::kNullReq) continue;
      reqs_[w] = reqs_[i];
      posted_[w] = posted_[i];
      ++w;
    }
    reqs_.resize(w);
    posted_.resize(w);
  }
  // Open MPI over TCP sends a message above its eager limit as a rendezvous: a first fragment,
  // an acknowledgement from the receiver, then the rest: a message just over the limit costs a
  // round trip and a write of a sliver more than two messages under it (at 1 MB chunks and 4
  // ranks a shard's 8-bit sums were exactly 64 KiB, over the default limit with Open MPI's
  // header; the engine now sizes such chunks to fit, engine::ps_chunk_blocks). So a message of up
  // to twice opt().eager_bytes goes as equal parts at or under it; longer ones stay whole (the
  // handshake is amortised, and parts would only add messages).
  uint32_t parts(size_t bytes) const {
    const uint64_t e = sh_->opt.eager_bytes;
    return e != 0 && bytes > e && bytes <= 2 * e ? 2 : 1;
  }
  template <class F>
  void for_parts(size_t bytes, F&& f) {
    const uint32_t k = parts(bytes);
    const size_t each = (bytes + k - 1) / k;
    for (uint32_t i = 0; i < k; ++i) f(i * each, std::min(each, bytes - i * each));
  }
  uint32_t new_split(size_t bytes) {
    const uint32_t k = parts(bytes);
    if (k == 1) return kWhole;
    parts_left_.push_back(k);
    return static_cast<uint32_t>(parts_left_.size() - 1);
  }
  std::string timeout_message() const {
    std::string peers;
    std::vector<int> seen;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (reqs_[i] == Link::kNullReq || posted_[i].act == Act::kSend) continue;
      if (std::find(seen.begin(), seen.end(), posted_[i].peer) != seen.end()) continue;
      seen.push_back(posted_[i].peer);
      peers += (peers.empty() ? "" : ", ") + std::to_string(posted_[i].peer);
    }
    return link_->name() + " backend: " + what_ + ": no progress within " + std::to_string(link_->timeout_ms()) +
           " ms (THC_TIMEOUT_MS); still waiting for data from rank(s) " + (peers.empty() ? "?" : peers) +
           " (a peer died, hangs, or skipped this call)";
  }
  void release() {
    bool touch = false;
    for (Link::Req& r : reqs_)
      if (r != Link::kNullReq && !link_->cancel(&r)) touch = true;
    reqs_.clear();
    posted_.clear();
    if (touch) park();
  }

  std::shared_ptr<Shared> sh_;
  Link* link_;
  const char* what_;
  uint64_t op_;
  std::vector<Link::Req> reqs_;
  std::vector<Posted> posted_;
  std::vector<int> done_idx_;
  std::deque<Send> queue_, urgent_;
  std::vector<uint32_t> parts_left_;  // per split message: parts not yet complete
  int in_flight_ = 0;
  int pending_ = 0;
  uint64_t sends_left_ = 0;

 protected:
  bool done_ = false;
};

// ---- index form: pairwise reduce-scatter of packed indices + lookup-sum + pairwise allgather.
// With `bounds` the shards are the caller's (a compressed reduce-scatter: shard q is rank q's
// part of the result), and without `gather` the allgather is left out: each rank ends with its
// own shard's sums only.
class PsSum final : public Sched {
 public:
  PsSum(std::shared_ptr<Shared> sh, const uint8_t* packed, uint64_t count, const LookupTable& table, void* sums,
        IntType type, const DownstreamCodec* down, const std::vector<uint64_t>* bounds = nullptr, bool gather = true,
        std::vector<uint8_t>* adopt = nullptr)
      : Sched(std::move(sh), gather ? "parameter server (reduce-scatter of indices, allgather of sums)"
                                    : "reduce-scatter of indices (lookup-sum on each shard's owner)"),
        n_(link().size()), r_(link().rank()), count_(count), table_(table), sums_(static_cast<uint8_t*>(sums)),
        type_(type), w_(codec::int_size(type)), down_(down), gather_(gather) {
    if (!sums_ && !gather_) fail(Status::kInternal, "lookup sum: a reduce-scatter needs the caller's sums buffer");
    const int b = table.bits;
    // Shards are multiples of 8 elements, so every shard and piece starts on a byte of the packed
    // stream.
    const uint64_t groups = (count + 7) / 8;
    off_.resize(static_cast<size_t>(n_) + 1);
    for (int q = 0; q <= n_; ++q) off_[q] = std::min(count, (groups * static_cast<uint64_t>(q) / n_) * 8);
    if (bounds) off_ = *bounds;
    const uint64_t pe = std::max<uint64_t>(8, opt().piece_bytes / w_ / 8 * 8);
    pieces_.resize(n_);
    enc_off_.resize(n_);
    uint64_t enc_total = 0;
    for (int q = 0; q < n_; ++q) {
      pieces_[q] = cut(off_[q], off_[q + 1], pe, 8);
      for (const Piece& p : pieces_[q]) {
        enc_off_[q].push_back(enc_total);
        enc_total += down_ ? down_->encoded_bytes(p.count) : p.count * w_;
      }
    }
    const uint64_t packed_bytes = (count * static_cast<uint64_t>(b) + 7) / 8;
    if (adopt) {
      // The caller encoded into a buffer of ours (Reducer::input_buffer): taken over, not copied.
      if (adopt->size() < packed_bytes)
        fail(Status::kInvalidArgument, "lookup sum: the indices' buffer holds " + std::to_string(adopt->size()) +
                                           " bytes, " + std::to_string(packed_bytes) + " needed");
      in_ = std::move(*adopt);
      adopt->clear();
    } else {
      in_ = take(packed_bytes + 1);
      if (packed_bytes) std::memcpy(in_.data(), packed, packed_bytes);
    }
    const std::vector<Piece>& mine = pieces_[r_];
    const uint64_t my_first = off_[r_], my_elems = off_[r_ + 1] - off_[r_];
    const uint64_t my_bytes = (my_elems * static_cast<uint64_t>(b) + 7) / 8;
    rin_ = take(static_cast<size_t>(n_ - 1) * my_bytes + 1);
    // Without re-compression the gathered sums are laid out as the result (pieces in element
    // order, w_ bytes each): the owner sums its pieces in place there, and a caller that lets the
    // request keep the result (sums == nullptr, lent_sums) reads it there, copied nowhere.
    if (down_) acc_ = take(my_elems * w_ + 1);
    gath_ = take(enc_total + 1);
    if (!sums_) {
      if (down_) res_ = take(count * w_ + 1);
      sums_ = down_ ? res_.data() : gath_.data();
      lent_ = sums_;
    }
    arrived_.assign(mine.size(), 0);
    // Receives first (they only name buffers), in the order each peer sends: piece by piece.
    for (int s = 1; s < n_; ++s) {
      const int from = (r_ - s + n_) % n_;
      for (size_t k = 0; k < mine.size(); ++k) {
        const uint64_t rel = mine[k].first - my_first;
        post_recv(Act::kRecvA, from, tag(0), rin_.data() + static_cast<size_t>(s - 1) * my_bytes + rel * b / 8,
                  (mine[k].count * b + 7) / 8, static_cast<uint32_t>(k));
      }
      if (!gather_) continue;
      for (size_t k = 0; k < pieces_[from].size(); ++k)
        post_recv(Act::kRecvB, from, tag(1), gath_.data() + enc_off_[from][k], piece_bytes(from, k),
                  static_cast<uint32_t>(k));
      gathered_need_ += pieces_[from].size();
    }
    // Sends of indices, piece by piece, to r+1, r+2, ...: at any moment every rank feeds one peer
    // and is fed by one.
    size_t most = 0;
    for (int q = 0; q < n_; ++q) most = std::max(most, pieces_[q].size());
    for (size_t k = 0; k < most; ++k)
      for (int s = 1; s < n_; ++s) {
        const int to = (r_ + s) % n_;
        if (k >= pieces_[to].size()) continue;
        const Piece& p = pieces_[to][k];
        send(to, tag(0), in_.data() + p.first * b / 8, (p.count * b + 7) / 8, 0);
      }
    if (n_ == 1) {
      for (size_t k = 0; k < mine.size(); ++k) reduce_piece(k);
    }
    finish_now();
  }

  ~PsSum() override {
    shutdown();
    for (auto* v : {&in_, &rin_, &acc_, &gath_, &res_}) recycle(*v);
  }
  const void* lent_sums() const override { return lent_; }

 private:
  size_t piece_bytes(int q, size_t k) const {
    const uint64_t c = pieces_[q][k].count;
    return down_ ? down_->encoded_bytes(c) : c * w_;
  }
  void on_recv(Act act, int peer, uint64_t index) override {
    (void)peer;
    if (act == Act::kRecvA) {
      if (++arrived_[index] == n_ - 1) {
        // Pieces complete in order (each peer sends them in order), but be safe about it.
        while (reduced_ < arrived_.size() && arrived_[reduced_] == n_ - 1) reduce_piece(reduced_);
      }
    } else {
      const Piece& p = pieces_[peer][index];
      const uint8_t* src = gath_.data() + enc_off_[peer][index];
      if (down_) {
        down_->decode(src, p.first, p.count, sums_ + p.first * w_);
      } else if (sums_ != gath_.data()) {
        std::memcpy(sums_ + p.first * w_, src, p.count * w_);
      }
      ++gathered_;
    }
  }
  void reduce_piece(size_t k) {
    const Piece& p = pieces_[r_][k];
    const uint64_t rel = p.first - off_[r_];
    const int b = table_.bits;
    uint8_t* out = gath_.data() + enc_off_[r_][k];
    uint8_t* acc = down_ ? acc_.data() + rel * w_ : out;
    std::memset(acc, 0, p.count * w_);
    lookup_add(table_, in_.data(), p.first, p.count, type_, acc);
    const uint64_t my_bytes = ((off_[r_ + 1] - off_[r_]) * static_cast<uint64_t>(b) + 7) / 8;
    for (int s = 1; s < n_; ++s)
      lookup_add(table_, rin_.data() + static_cast<size_t>(s - 1) * my_bytes, rel, p.count, type_, acc);
    if (down_) {
      // Every rank, the owner included, ends with the decoded re-compressed sums.
      down_->encode(acc, p.first, p.count, out);
      down_->decode(out, p.first, p.count, sums_ + p.first * w_);
    } else if (sums_ != gath_.data()) {
      std::memcpy(sums_ + p.first * w_, out, p.count * w_);
    }
    if (gather_)
      for (int s = 1; s < n_; ++s) send((r_ + s) % n_, tag(1), out, piece_bytes(r_, k), 1, /*urgent=*/true);
    ++reduced_;
  }
  bool result_ready() const override { return reduced_ == pieces_[r_].size() && gathered_ == gathered_need_; }
  void park() override {
    keep_forever(std::move(in_));
    keep_forever(std::move(rin_));
    keep_forever(std::move(gath_));
  }

  int n_, r_;
  uint64_t count_;
  LookupTable table_;
  uint8_t* sums_;
  IntType type_;
  size_t w_;
  const DownstreamCodec* down_;
  bool gather_;
  std::vector<uint64_t> off_;
  std::vector<std::vector<Piece>> pieces_;
  std::vector<std::vector<uint64_t>> enc_off_;
  std::vector<uint8_t> in_, rin_, acc_, gath_, res_;
  const uint8_t* lent_ = nullptr;  // the result, where the request keeps it (sums == nullptr)
  std::vector<int> arrived_;
  size_t reduced_ = 0;
  uint64_t gathered_ = 0, gathered_need_ = 0;
};

// ---- value form: pipelined ring (reduce-scatter with integer add, then allgather).
//
// Messages on one link and tag match in posting order, so this rank issues its sends to the right
// neighbour in the order the neighbour posted its receives: step by step, piece by piece within a
// step (a cursor per phase; a send waits for its predecessors). Receives may complete in any
// order; each is acted upon at once.
//
// Nothing is kept per step: segment boundaries are computed, and the flags and receive buffers
// are laid out by element position (each step handles a different segment), so a rank's state is
// O(pieces + n) small words. A message is numbered (step, piece) in 32 + 32 bits; the tags carry
// only the operation and the phase, so MPI_TAG_UB bounds the operations in flight, never the
// number of ranks.
//
// With `bounds` rank q's part of the result is the caller's range q (the ring ends with rank r
// holding segment r + 1, so segment q + 1 is range q), and without `gather` the allgather is left
// out: a reduce-scatter, each rank ending with its own range's sums.
class RingSum final : public Sched {
 public:
  RingSum(std::shared_ptr<Shared> sh, void* data, uint64_t count, IntType type,
          const std::vector<uint64_t>* bounds = nullptr, bool gather = true)
      : Sched(std::move(sh), gather ? "integer sum (ring reduce-scatter + allgather)" : "integer sum (ring reduce-scatter)"),
        n_(link().size()), r_(link().rank()), data_(static_cast<uint8_t*>(data)), count_(count), type_(type),
        w_(codec::int_size(type)), pe_(std::max<uint64_t>(1, opt().piece_bytes / w_)), gather_(gather) {
    if (bounds) bounds_ = *bounds;
    if (n_ == 1) {
      finish_now();
      return;
    }
    if (count / pe_ >= (uint64_t{1} << 32))
      fail(Status::kInvalidArgument, "integer sum: " + std::to_string(count) + " elements make more than 2^32 pieces");
    work_ = take(count * w_ + 1);
    if (count) std::memcpy(work_.data(), data_, count * w_);
    tmp_ = take(count * w_ + 1);
    if (gather_) out_ = take(count * w_ + 1);
    rs_ready_.assign(count / pe_ + static_cast<uint64_t>(n_) + 1, 0);
    ag_ready_.assign(rs_ready_.size(), 0);
    left_ = mod(r_ - 1);
    right_ = mod(r_ + 1);
    // Reduce-scatter: at step s this rank sends segment r-s (its partial sum so far) and receives
    // segment r-s-1, which it adds and forwards at step s+1. Receives land in a buffer of their own
    // (the running sums stay in work_), at the segment's place.
    for (int s = 0; s < n_ - 1; ++s) {
      const int j = mod(r_ - s - 1);
      for (uint64_t k = 0; k < pieces(j); ++k) {
        const Piece p = piece(j, k);
        post_recv(Act::kRecvA, left_, tag(0), tmp_.data() + p.first * w_, p.count * w_, msg(s, k));
      }
    }
    // Allgather: at step s this rank sends segment r+1-s (its own reduced one first) and receives
    // segment r-s into out_, which it forwards at step s+1.
    for (int s = 0; s < n_ - 1 && gather_; ++s) {
      const int j = mod(r_ - s);
      for (uint64_t k = 0; k < pieces(j); ++k) {
        const Piece p = piece(j, k);
        post_recv(Act::kRecvB, left_, tag(1), out_.data() + p.first * w_, p.count * w_, msg(s, k));
        ++ag_need_;
      }
    }
    own_need_ = pieces(mod(r_ + 1));
    advance();
    maybe_copy();
    finish_now();
  }

  ~RingSum() override {
    shutdown();
    for (auto* v : {&work_, &tmp_, &out_}) recycle(*v);
  }

 private:
  int mod(int v) const { return ((v % n_) + n_) % n_; }
  // Segment i is [count i / n, count (i + 1) / n), or with bounds the caller's range i - 1; cut
  // into pieces of pe_ elements.
  int pos(int i) const { return bounds_.empty() ? i : mod(i - 1); }  // the segment's place by position
  uint64_t seg_first(int i) const {
    if (!bounds_.empty()) return bounds_[static_cast<size_t>(pos(i))];
    return static_cast<uint64_t>(static_cast<unsigned __int128>(count_) * static_cast<unsigned>(i) / static_cast<unsigned>(n_));
  }
  uint64_t seg_end(int i) const {
    if (!bounds_.empty()) return bounds_[static_cast<size_t>(pos(i)) + 1];
    return seg_first(i + 1);
  }
  uint64_t pieces(int j) const { return (seg_end(j) - seg_first(j) + pe_ - 1) / pe_; }
  Piece piece(int j, uint64_t k) const {
    const uint64_t f = seg_first(j) + k * pe_;
    return Piece{f, std::min(pe_, seg_end(j) - f)};
  }
  // A flag per piece: piece k of segment j at seg_first(j) / pe + k + pos(j) (a segment's pieces
  // take consecutive slots, each segment's first beyond the last of the one before it in memory).
  size_t slot(int j, uint64_t k) const {
    return static_cast<size_t>(seg_first(j) / pe_ + k + static_cast<uint64_t>(pos(j)));
  }
  static uint64_t msg(int s, uint64_t k) { return static_cast<uint64_t>(s) << 32 | k; }
  void on_recv(Act act, int peer, uint64_t idx) override {
    (void)peer;
    const int s = static_cast<int>(idx >> 32);
    const uint64_t k = idx & 0xFFFFFFFFu;
    if (act == Act::kRecvA) {
      const int j = mod(r_ - s - 1);
      const Piece p = piece(j, k);
      add_ints(type_, work_.data() + p.first * w_, tmp_.data() + p.first * w_, p.count);
      if (s + 1 < n_ - 1) {
        rs_ready_[slot(j, k)] = 1;  // forwarded at step s + 1
      } else {
        // Segment r+1 is complete here: this rank's result for it, and the allgather's first send.
        if (gather_) {
          std::memcpy(out_.data() + p.first * w_, work_.data() + p.first * w_, p.count * w_);
          ag_ready_[slot(j, k)] = 1;
        } else {
          std::memcpy(data_ + p.first * w_, work_.data() + p.first * w_, p.count * w_);
        }
        ++own_done_;
      }
    } else {
      ++ag_got_;
      if (s + 1 < n_ - 1) ag_ready_[slot(mod(r_ - s), k)] = 1;
    }
    advance();
    maybe_copy();
  }
  void maybe_copy() {
    if (!gather_) {
      copied_ = own_done_ == own_need_;
      return;
    }
    if (own_done_ == own_need_ && ag_got_ == ag_need_ && !copied_) {
      // out_ holds every segment and no receive writes it any more (sends may still read it).
      if (count_) std::memcpy(data_, out_.data(), count_ * w_);
      copied_ = true;
    }
  }
  // Queues the sends whose turn has come, in the order the right neighbour receives them.
  void advance() {
    while (rs_s_ < n_ - 1) {
      const int j = mod(r_ - rs_s_);
      if (rs_k_ == pieces(j)) {
        ++rs_s_;
        rs_k_ = 0;
        continue;
      }
      if (rs_s_ != 0 && !rs_ready_[slot(j, rs_k_)]) break;
      const Piece p = piece(j, rs_k_);
      send(right_, tag(0), work_.data() + p.first * w_, p.count * w_, 0);
      ++rs_k_;
    }
    while (gather_ && ag_s_ < n_ - 1) {
      const int j = mod(r_ + 1 - ag_s_);
      if (ag_k_ == pieces(j)) {
        ++ag_s_;
        ag_k_ = 0;
        continue;
      }
      if (!ag_ready_[slot(j, ag_k_)]) break;
      const Piece p = piece(j, ag_k_);
      send(right_, tag(1), out_.data() + p.first * w_, p.count * w_, 0, /*urgent=*/true);
      ++ag_k_;
    }
  }
  bool result_ready() const override { return copied_ || n_ == 1; }
  void park() override {
    keep_forever(std::move(work_));
    keep_forever(std::move(tmp_));
    keep_forever(std::move(out_));
  }

  int n_, r_;
  uint8_t* data_;
  uint64_t count_;
  IntType type_;
  size_t w_;
  uint64_t pe_;
  bool gather_;
  std::vector<uint64_t> bounds_;  // the caller's ranges (empty: count / n each)
  int left_ = 0, right_ = 0;
  std::vector<char> rs_ready_, ag_ready_;
  int rs_s_ = 0, ag_s_ = 0;
  uint64_t rs_k_ = 0, ag_k_ = 0;
  std::vector<uint8_t> work_, tmp_, out_;
  uint64_t own_done_ = 0, own_need_ = 0;
  uint64_t ag_got_ = 0, ag_need_ = 0;
  bool copied_ = false;
};

// ---- allgather of bytes: every rank sends its range to every peer in pairwise order (step s:
// to r+s, from r-s), piece by piece; received pieces land in the request's buffer and are copied
// out as they arrive.
class PairGather final : public Sched {
 public:
  PairGather(std::shared_ptr<Shared> sh, uint8_t* buf, const std::vector<uint64_t>& bounds)
      : Sched(std::move(sh), "allgather (pairwise)"), n_(link().size()), r_(link().rank()), buf_(buf), off_(bounds) {
    if (n_ == 1) {
      finish_now();
      return;
    }
    const uint64_t pe = std::max<uint64_t>(64, opt().piece_bytes);
    pieces_.resize(n_);
    for (int q = 0; q < n_; ++q) pieces_[q] = cut(off_[q], off_[q + 1], pe);
    in_ = take(off_[r_ + 1] - off_[r_] + 1);
    std::memcpy(in_.data(), buf + off_[r_], off_[r_ + 1] - off_[r_]);
    gath_ = take(off_[n_] + 1);
    for (int s = 1; s < n_; ++s) {
      const int from = (r_ - s + n_) % n_;
      for (size_t k = 0; k < pieces_[from].size(); ++k) {
        const Piece& p = pieces_[from][k];
        post_recv(Act::kRecvA, from, tag(0), gath_.data() + p.first, p.count, static_cast<uint32_t>(k));
        ++need_;
      }
    }
    for (size_t k = 0; k < pieces_[r_].size(); ++k)
      for (int s = 1; s < n_; ++s) {
        const Piece& p = pieces_[r_][k];
        send((r_ + s) % n_, tag(0), in_.data() + (p.first - off_[r_]), p.count, 0);
      }
    finish_now();
  }
  ~PairGather() override {
    shutdown();
    for (auto* v : {&in_, &gath_}) recycle(*v);
  }

 private:
  void on_recv(Act act, int peer, uint64_t index) override {
    (void)act;
    const Piece& p = pieces_[peer][index];
    std::memcpy(buf_ + p.first, gath_.data() + p.first, p.count);
    ++got_;
  }
  bool result_ready() const override { return n_ == 1 || got_ == need_; }
  void park() override {
    keep_forever(std::move(in_));
    keep_forever(std::move(gath_));
  }

  int n_, r_;
  uint8_t* buf_;
  std::vector<uint64_t> off_;
  std::vector<std::vector<Piece>> pieces_;
  std::vector<uint8_t> in_, gath_;
  uint64_t need_ = 0, got_ = 0;
};

// Reduce-scatter and allgather bounds: size() + 1 offsets from 0 to count, non-decreasing,
// multiples of 8 (whole bytes of packed indices).
void check_bounds(const std::vector<uint64_t>& b, int n, uint64_t count, bool by8) {
  bool ok = b.size() == static_cast<size_t>(n) + 1 && b.front() == 0 && b.back() == count;
  for (size_t i = 0; ok && i + 1 < b.size(); ++i) ok = b[i] <= b[i + 1] && (!by8 || b[i] % 8 == 0);
  if (!ok)
    fail(Status::kInvalidArgument, "reduce-scatter/allgather: bounds must be " + std::to_string(n + 1) +
                                       " non-decreasing offsets from 0 to " + std::to_string(count) +
                                       (by8 ? ", multiples of 8" : ""));
}

// A lookup table the index form can apply: 2^bits values, bits in 1..8 (`what` names the operation).
void check_table(const LookupTable& t, const char* what) {
  if (t.bits < 1 || t.bits > 8 || t.values.size() < (size_t{1} << t.bits))
    fail(Status::kInvalidArgument, std::string(what) + ": the table needs 2^bits values, bits in 1..8");
}

class ScheduledReducer final : public Reducer {
 public:
  ScheduledReducer(std::unique_ptr<Link> link, const ScheduleOptions& opt) : sh_(std::make_shared<Shared>()) {
    if (!link) fail(Status::kInvalidArgument, "make_scheduled_reducer: no link");
    if (opt.piece_bytes < 64 || opt.send_window < 1)
      fail(Status::kInvalidArgument, "make_scheduled_reducer: piece_bytes >= 64 and send_window >= 1");
    sh_->link = std::move(link);
    sh_->opt = opt;
  }
  int rank() const override { return sh_->link->rank(); }
  int size() const override { return sh_->link->size(); }
  std::string name() const override { return sh_->link->name(); }
  bool applies_downstream() const override { return true; }
  bool lends_sums() const override { return true; }
  uint64_t chunk_growth() const override { return sh_->opt.chunk_growth; }
  uint64_t eager_bytes() const override { return sh_->opt.eager_bytes; }

  void max_u32(uint32_t* data, size_t n) override {
    sh_->check_usable();
    try {
      sh_->link->max_u32(data, n);
    } catch (const Error& e) {
      sh_->mark_broken(e.what());
      throw;
    }
  }
  std::unique_ptr<Request> start_sum(void* data, uint64_t count, IntType type) override {
    sh_->check_usable();
    return std::make_unique<RingSum>(sh_, data, count, type);
  }
  std::unique_ptr<Request> start_lookup_sum(const uint8_t* packed, uint64_t count, const LookupTable& table,
                                            void* sums, IntType type, const DownstreamCodec* down) override {
    sh_->check_usable();
    check_table(table, "lookup sum");
    return std::make_unique<PsSum>(sh_, packed, count, table, sums, type, down);
  }
  bool adopts_input() const override { return true; }
  std::vector<uint8_t> input_buffer(size_t bytes) override { return sh_->take(bytes); }
  std::unique_ptr<Request> start_lookup_sum_adopt(std::vector<uint8_t>&& packed, uint64_t count,
                                                  const LookupTable& table, void* sums, IntType type,
                                                  const DownstreamCodec* down) override {
    sh_->check_usable();
    check_table(table, "lookup sum");
    return std::make_unique<PsSum>(sh_, nullptr, count, table, sums, type, down, nullptr, true, &packed);
  }
  std::unique_ptr<Request> start_reduce_scatter_sum(void* data, uint64_t count, IntType type,
                                                    const std::vector<uint64_t>& bounds) override {
    sh_->check_usable();
    check_bounds(bounds, size(), count, false);
    return std::make_unique<RingSum>(sh_, data, count, type, &bounds, false);
  }
  std::unique_ptr<Request> start_lookup_reduce_scatter(const uint8_t* packed, uint64_t count, const LookupTable& table,
                                                       void* sums, IntType type,
                                                       const std::vector<uint64_t>& bounds) override {
    sh_->check_usable();
    check_table(table, "lookup reduce-scatter");
    check_bounds(bounds, size(), count, true);
    return std::make_unique<PsSum>(sh_, packed, count, table, sums, type, nullptr, &bounds, false);
  }
  std::unique_ptr<Request> start_allgather(uint8_t* buf, const std::vector<uint64_t>& bounds) override {
    sh_->check_usable();
    check_bounds(bounds, size(), bounds.empty() ? 0 : bounds.back(), false);
    return std::make_unique<PairGather>(sh_, buf, bounds);
  }

 private:
  std::shared_ptr<Shared> sh_;
};

}  // namespace

uint64_t default_chunk_growth() {
  const char* v = std::getenv("THC_CHUNK_GROWTH");
  if (!v || !*v) return 1;
  char* end = nullptr;
  errno = 0;
  const long g = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || g < 1 || g > 64)
    fail(Status::kInvalidArgument, std::string("THC_CHUNK_GROWTH=") + v + ": expected an integer from 1 to 64");
  return static_cast<uint64_t>(g);
}

std::unique_ptr<Reducer> make_scheduled_reducer(std::unique_ptr<Link> link, const ScheduleOptions& opt) {
  return std::make_unique<ScheduledReducer>(std::move(link), opt);
}

}  // namespace thc::transport
