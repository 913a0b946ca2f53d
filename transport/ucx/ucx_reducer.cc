#include "transport/ucx/ucx_reducer.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/keep_forever.h"
#include "common/net.h"
#include "common/status.h"
#include "common/sys_check.h"
#include "transport/schedules/schedules.h"
#include "transport/ucx/ucx_p2p.h"

namespace thc::transport {
namespace {

using Clock = std::chrono::steady_clock;

// Link tags are below 2^30; the link's own messages use tags above (never a schedule's).
constexpr uint32_t kTagLimit = 1u << 30;
constexpr uint32_t kTagRank = kTagLimit + 1;  // the first message on a new connection
constexpr uint32_t kTagMax = kTagLimit + 2;   // max_u32

// ---- rendezvous wire format (host byte order: every rank runs the same build) -------------------
constexpr uint32_t kRvMagic = 0x74686352;  // "thcR"
constexpr uint16_t kRvVersion = 1;
enum RvStatus : uint16_t {
  kRvOk = 0,
  kRvSizeMismatch = 1,
  kRvBadRank = 2,
  kRvDuplicateRank = 3,
  kRvTimeout = 4,  // to the ranks that came: rank 0 gave up waiting for the others
  kRvAborted = 5,  // to the ranks that came: rank 0 refused another one (a mismatch)
};

struct RvHello {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  int32_t rank;
  int32_t size;
  ucx::Address addr;
};
struct RvReply {
  uint32_t magic;
  uint16_t version;
  uint16_t status;
  int32_t size;  // rank 0's group size
  int32_t reserved;
};  // followed by `size` Addresses when status is kRvOk
struct RankMsg {
  uint32_t magic;
  int32_t rank;
  int32_t size;
  uint32_t reserved;
};

long remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return std::max<long>(0, left);
}
// THC_TIMEOUT_MS from now (<= 0: no bound).
Clock::duration bound_of(long timeout_ms) { return std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : 1L << 40); }
Clock::time_point deadline_in(long timeout_ms) { return Clock::now() + bound_of(timeout_ms); }

void check_rank(int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size)
    fail(Status::kInvalidArgument, "UCX backend: rank " + std::to_string(rank) + " of a group of " +
                                       std::to_string(size) + " (need 0 <= rank < size)");
}
// "1, 4, 7": the ranks in [0, size) for which pick(rank) holds.
template <class Pick>
std::string rank_list(int size, Pick pick) {
  std::string out;
  for (int q = 0; q < size; ++q)
    if (pick(q)) out += (out.empty() ? "" : ", ") + std::to_string(q);
  return out;
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Waits for events on one fd until the deadline; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const long ms = remaining_ms(deadline);
    const sys::SysResult r = THC_SYS(::poll(&p, 1, static_cast<int>(std::min<long>(ms, 1000))));
    if (!r.ok()) r.fail();
    if (r.rc > 0) return true;
    if (ms == 0) return false;
  }
}

void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const sys::SysResult r = THC_SYS(::send(fd, p, n, MSG_NOSIGNAL));
    if (r.ok()) {
      p += r.rc;
      n -= static_cast<size_t>(r.rc);
      continue;
    }
    if (!r.would_block()) fail(Status::kTransport, what + ": " + std::strerror(r.err));
    if (!wait_fd(fd, POLLOUT, deadline)) fail(Status::kTimeout, what + ": timed out");
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const sys::SysResult r = THC_SYS(::recv(fd, p, n, 0));
    if (r.ok() && r.rc > 0) {
      p += r.rc;
      n -= static_cast<size_t>(r.rc);
      continue;
    }
    if (r.ok()) fail(Status::kTransport, what + ": the peer closed the connection");
    if (!r.would_block()) fail(Status::kTransport, what + ": " + std::strerror(r.err));
    if (!wait_fd(fd, POLLIN, deadline)) fail(Status::kTimeout, what + ": timed out");
  }
}

PeerAddr parse_rendezvous(const std::string& rv) {
  std::string s = rv;
  const std::string tcp = "tcp://";
  if (s.compare(0, tcp.size(), tcp) == 0) s = s.substr(tcp.size());
  std::string host, err;
  uint16_t port = 0;
  if (s.find("://") != std::string::npos || !parse_udp_url(s, &host, &port, &err))
    fail(Status::kInvalidArgument, "UCX rendezvous '" + rv + "': expected HOST:PORT or tcp://HOST:PORT (port 1..65535)");
  PeerAddr a;
  if (!resolve_udp(host, port, &a, &err)) fail(Status::kInvalidArgument, "UCX rendezvous '" + rv + "': " + err);
  return a;
}

Fd tcp_socket(const PeerAddr& a) {
  const sys::SysResult r =
      THC_SYS(::socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!r.ok()) r.fail();
  Fd fd(static_cast<int>(r.rc));
  const int one = 1;
  (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

const char* rv_status_text(uint16_t st) {
  switch (st) {
    case kRvSizeMismatch: return "the group sizes differ";
    case kRvBadRank: return "its rank is out of range";
    case kRvDuplicateRank: return "another process already took its rank";
    case kRvTimeout: return "rank 0 gave up waiting for the ranks that did not come (its error names them)";
    case kRvAborted: return "rank 0 refused another rank (its error says why)";
    default: return "unknown status";
  }
}

// Rank 0: collects every rank's address, answers each with all of them.
std::vector<ucx::Address> rendezvous_root(const UcxGroupOptions& opt, const PeerAddr& at, const ucx::Address& mine,
                                         Clock::time_point deadline) {
  const std::string where = "UCX rendezvous at " + opt.rendezvous;
  Fd lfd = tcp_socket(at);
  const int one = 1;
  (void)::setsockopt(lfd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  {
    const sys::SysResult r = THC_SYS(::bind(lfd.get(), reinterpret_cast<const sockaddr*>(&at.ss), at.len));
    if (!r.ok()) fail(Status::kTransport, where + ": rank 0 cannot listen there: " + std::strerror(r.err));
    THC_CHECK_SYS(::listen(lfd.get(), 128));
  }
  std::vector<ucx::Address> addrs(static_cast<size_t>(opt.size));
  addrs[0] = mine;
  std::vector<Fd> ranks(static_cast<size_t>(opt.size));
  struct Pending {
    Fd fd;
    RvHello h{};
    size_t got = 0;
  };
  std::vector<Pending> pending;
  int joined = 1;
  auto refuse = [&](Pending& p, uint16_t st, const std::string& why) {
    RvReply rep{kRvMagic, kRvVersion, st, opt.size, 0};
    try {
      send_all(p.fd.get(), &rep, sizeof rep, std::min(deadline, Clock::now() + std::chrono::seconds(1)), where);
    } catch (const Error&) {
      // it learns from the closed connection instead
    }
    fail(Status::kConfigMismatch, where + ": " + why);
  };
  try {
    while (joined < opt.size) {
      if (Clock::now() >= deadline)
        fail(Status::kTimeout, where + ": rank(s) " +
                                   rank_list(opt.size, [&](int q) { return q > 0 && ranks[static_cast<size_t>(q)].get() < 0; }) +
                                   " did not come within " + std::to_string(opt.timeout_ms) + " ms (THC_TIMEOUT_MS)");
      std::vector<pollfd> pf;
      pf.push_back({lfd.get(), POLLIN, 0});
      for (auto& p : pending) pf.push_back({p.fd.get(), POLLIN, 0});
      const sys::SysResult pr =
          THC_SYS(::poll(pf.data(), pf.size(), static_cast<int>(std::min<long>(remaining_ms(deadline), 200))));
      if (!pr.ok()) pr.fail();
      if (pf[0].revents & POLLIN) {
        const sys::SysResult ar = THC_SYS(::accept4(lfd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (ar.ok()) pending.push_back(Pending{Fd(static_cast<int>(ar.rc))});
      }
      for (size_t i = 0; i < pending.size();) {
        Pending& p = pending[i];
        bool drop = false;
        const sys::SysResult r =
            THC_SYS(::recv(p.fd.get(), reinterpret_cast<char*>(&p.h) + p.got, sizeof p.h - p.got, 0));
        if (r.ok() && r.rc > 0) {
          p.got += static_cast<size_t>(r.rc);
        } else if (r.ok() || !r.would_block()) {
          drop = true;  // closed or failed before its hello: not a rank of this protocol
        }
        if (!drop && p.got == sizeof p.h) {
          if (p.h.magic != kRvMagic || p.h.version != kRvVersion) {
            drop = true;  // not ours
          } else if (p.h.size != opt.size) {
            refuse(p, kRvSizeMismatch, "rank " + std::to_string(p.h.rank) + " says the group has " +
                                           std::to_string(p.h.size) + " ranks, rank 0 " + std::to_string(opt.size));
          } else if (p.h.rank <= 0 || p.h.rank >= opt.size) {
            refuse(p, kRvBadRank, "a process claims rank " + std::to_string(p.h.rank) + " of a group of " +
                                      std::to_string(opt.size));
          } else if (ranks[static_cast<size_t>(p.h.rank)].get() >= 0) {
            refuse(p, kRvDuplicateRank, "two processes claim rank " + std::to_string(p.h.rank));
          } else {
            addrs[static_cast<size_t>(p.h.rank)] = p.h.addr;
            ranks[static_cast<size_t>(p.h.rank)] = std::move(p.fd);
            ++joined;
            drop = true;  // (moved out of pending)
          }
        }
        if (drop) {
          pending.erase(pending.begin() + static_cast<long>(i));
        } else {
          ++i;
        }
      }
    }
  } catch (const Error& e) {
    // Tell the ranks that came, so that they fail with the same kind of error at once.
    const RvReply bye{kRvMagic, kRvVersion, static_cast<uint16_t>(e.status() == Status::kTimeout ? kRvTimeout : kRvAborted),
                      opt.size, 0};
    for (Fd& f : ranks) {
      if (f.get() < 0) continue;
      try {
        send_all(f.get(), &bye, sizeof bye, Clock::now() + std::chrono::seconds(1), where);
      } catch (const Error&) {
      }
    }
    throw;
  }
  RvReply rep{kRvMagic, kRvVersion, kRvOk, opt.size, 0};
  for (int q = 1; q < opt.size; ++q) {
    const int fd = ranks[static_cast<size_t>(q)].get();
    const std::string what = where + ": answering rank " + std::to_string(q);
    send_all(fd, &rep, sizeof rep, deadline, what);
    send_all(fd, addrs.data(), addrs.size() * sizeof(ucx::Address), deadline, what);
  }
  return addrs;
}

// Every other rank: registers with rank 0 (retrying until it listens), receives the table.
std::vector<ucx::Address> rendezvous_member(const UcxGroupOptions& opt, const PeerAddr& at, const ucx::Address& mine,
                                           Clock::time_point deadline) {
  const std::string where = "UCX rendezvous at " + opt.rendezvous + " (rank " + std::to_string(opt.rank) + ")";
  Fd fd;
  std::string last = "no attempt";
  for (;;) {
    if (Clock::now() >= deadline)
      fail(Status::kTimeout, where + ": rank 0 did not answer within " + std::to_string(opt.timeout_ms) +
                                 " ms (THC_TIMEOUT_MS); last attempt: " + last);
    fd = tcp_socket(at);
    const sys::SysResult r = THC_SYS(::connect(fd.get(), reinterpret_cast<const sockaddr*>(&at.ss), at.len));
    int err = r.ok() ? 0 : r.err;
    if (err == EINPROGRESS) {
      if (wait_fd(fd.get(), POLLOUT, std::min(deadline, Clock::now() + std::chrono::seconds(2)))) {
        socklen_t len = sizeof err;
        if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      } else {
        err = ETIMEDOUT;
      }
    }
    if (err == 0) break;
    last = std::strerror(err);
    fd.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<long>(50, remaining_ms(deadline))));
  }
  RvHello h{kRvMagic, kRvVersion, 0, opt.rank, opt.size, mine};
  send_all(fd.get(), &h, sizeof h, deadline, where);
  RvReply rep{};
  try {
    recv_all(fd.get(), &rep, sizeof rep, deadline, where);
  } catch (const Error& e) {
    if (e.status() == Status::kTimeout)
      fail(Status::kTimeout, where + ": not every rank came within " + std::to_string(opt.timeout_ms) +
                                 " ms (THC_TIMEOUT_MS); rank 0 names them");
    fail(e.status(), std::string(e.what()) + " (rank 0 gave up: its own error says why)");
  }
  if (rep.magic != kRvMagic || rep.version != kRvVersion)
    fail(Status::kTransport, where + ": the answer is not a thc UCX rendezvous (another service on that port?)");
  if (rep.status == kRvTimeout)
    fail(Status::kTimeout, where + ": " + rv_status_text(rep.status) + " within " + std::to_string(opt.timeout_ms) +
                               " ms (THC_TIMEOUT_MS)");
  if (rep.status == kRvAborted) fail(Status::kConfigMismatch, where + ": " + rv_status_text(rep.status));
  if (rep.status != kRvOk)
    fail(Status::kConfigMismatch, where + ": rank 0 refused this rank: " + rv_status_text(rep.status) +
                                      " (this rank: rank " + std::to_string(opt.rank) + " of " +
                                      std::to_string(opt.size) + "; rank 0: a group of " + std::to_string(rep.size) + ")");
  std::vector<ucx::Address> addrs(static_cast<size_t>(opt.size));
  recv_all(fd.get(), addrs.data(), addrs.size() * sizeof(ucx::Address), deadline, where);
  return addrs;
}

// One UCX context per device per process (thread-safe; every listener and endpoint shares it).
std::shared_ptr<ucx::Context> shared_context() {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<ucx::Context>> cache;
  const ucx::Discovery d = ucx::discover_devices();
  if (d.devices.empty()) fail(Status::kTransport, "UCX backend: no network device (" + d.note + ")");
  const ucx::Device& dev = d.devices[0];
  std::lock_guard<std::mutex> lk(mu);
  std::shared_ptr<ucx::Context> c = cache[dev.name].lock();
  if (!c) {
    // Eager sends for every message (UCX_RNDV_THRESH in the environment wins): the schedules'
    // messages are pieces of compressed codes of at most ~256 KB, and a rendezvous costs each one
    // a handshake whose every step waits for the other side's next poll (a rank that found
    // nothing to do sleeps up to 200 us: ranks share cores). 4 ranks on a 2-core machine, 64 MB
    // THC PS calls over UCX's TCP transport: 118-119 ms per call with UCX's automatic threshold,
    // 81-96 ms with eager sends (README "UCX backend", with the command).
    c = std::make_shared<ucx::Context>(dev, std::vector<std::pair<std::string, std::string>>{{"RNDV_THRESH", "inf"}});
    cache[dev.name] = c;
  }
  return c;
}

class UcxLink final : public Link {
 public:
  UcxLink(int rank, int size, long timeout_ms, std::shared_ptr<ucx::Context> ctx,
          std::vector<std::unique_ptr<ucx::Endpoint>> eps)
      : rank_(rank), size_(size), timeout_ms_(timeout_ms), ctx_(std::move(ctx)), eps_(std::move(eps)),
        deferred_(static_cast<size_t>(size)) {}
  ~UcxLink() override {
    for (auto& q : deferred_)
      for (Op* op : q) delete op;
    for (auto& ep : eps_) ucx::close_in_background(std::move(ep));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "ucx(" + ctx_->device().name + ")"; }
  long timeout_ms() const override { return timeout_ms_; }
  uint32_t tag_limit() const override { return kTagLimit; }

  void isend(int peer, uint32_t tag, const void* buf, size_t bytes, Req* req) override {
    *req = start(new Op{peer, false, tag, const_cast<void*>(buf), bytes});
  }
  void irecv(int peer, uint32_t tag, void* buf, size_t bytes, Req* req) override {
    *req = start(new Op{peer, true, tag, buf, bytes});
  }

  int test_some(Req* reqs, int n, int* done) override {
    for (int p = 0; p < size_; ++p) flush(p);
    int k = 0;
    for (int i = 0; i < n; ++i) {
      if (reqs[i] == kNullReq) continue;
      Op* op = reinterpret_cast<Op*>(reqs[i]);
      if (!op->r) continue;  // still waiting for room on its endpoint
      if (!complete(op)) continue;
      delete op;
      reqs[i] = kNullReq;
      done[k++] = i;
    }
    return k;
  }

  bool cancel(Req* req) override {
    if (*req == kNullReq) return true;
    Op* op = reinterpret_cast<Op*>(*req);
    if (!op->r) {
      auto& q = deferred_[static_cast<size_t>(op->peer)];
      q.erase(std::remove(q.begin(), q.end(), op), q.end());
      delete op;
      *req = kNullReq;
      return true;
    }
    // Posted to UCX: its buffer may still be touched until the endpoint closes.
    delete op;
    *req = kNullReq;
    return false;
  }

  void idle(uint64_t us) override { std::this_thread::sleep_for(std::chrono::microseconds(us)); }

  // Gather to rank 0, MAX there, back to everyone: 2 (n - 1) small messages.
  void max_u32(uint32_t* data, size_t n) override {
    if (size_ == 1 || n == 0) return;
    const size_t bytes = n * sizeof(uint32_t);
    // The messages' buffers, parked for good if an operation is given up on while UCX may still
    // write them (data itself is the caller's: its result receive is the one that could).
    std::vector<uint32_t> buf(rank_ == 0 ? n * static_cast<size_t>(size_) : 2 * n);
    std::vector<Req> reqs;
    try {
      if (rank_ == 0) {
        for (int p = 1; p < size_; ++p)
          reqs.push_back(start(new Op{p, true, kTagMax, buf.data() + static_cast<size_t>(p) * n, bytes}));
        wait_all(reqs, "max_u32 (gather)");
        for (int p = 1; p < size_; ++p)
          for (size_t i = 0; i < n; ++i) data[i] = std::max(data[i], buf[static_cast<size_t>(p) * n + i]);
        std::copy(data, data + n, buf.begin());
        reqs.clear();
        for (int p = 1; p < size_; ++p) reqs.push_back(start(new Op{p, false, kTagMax, buf.data(), bytes}));
        wait_all(reqs, "max_u32 (result)");
      } else {
        std::copy(data, data + n, buf.begin());
        reqs.push_back(start(new Op{0, false, kTagMax, buf.data(), bytes}));
        reqs.push_back(start(new Op{0, true, kTagMax, buf.data() + n, bytes}));
        wait_all(reqs, "max_u32");
        std::copy(buf.begin() + static_cast<long>(n), buf.end(), data);
      }
    } catch (...) {
      bool touch = false;
      for (Req& r : reqs)
        if (r != kNullReq && !cancel(&r)) touch = true;
      if (touch) keep_forever(std::move(buf));
      throw;
    }
  }

 private:
  struct Op {
    int peer;
    bool recv;
    uint32_t tag;
    void* buf;
    size_t bytes;
    ucx::Request* r = nullptr;
  };

  ucx::Endpoint& ep(int peer) {
    if (peer < 0 || peer >= size_ || peer == rank_ || !eps_[static_cast<size_t>(peer)])
      fail(Status::kInternal, "UCX link: no endpoint for rank " + std::to_string(peer));
    return *eps_[static_cast<size_t>(peer)];
  }

  // Posts now or queues behind what already waits for room on the endpoint (posting order is
  // the matching order, so nothing overtakes a queued operation).
  Req start(Op* op) {
    try {
      ep(op->peer);
      auto& q = deferred_[static_cast<size_t>(op->peer)];
      if (q.empty()) post(op);
      if (!op->r) q.push_back(op);
    } catch (...) {
      delete op;
      throw;
    }
    return reinterpret_cast<Req>(op);
  }
  void post(Op* op) {
    try {
      ucx::Endpoint& e = ep(op->peer);
      if (op->recv) {
        void* b = op->buf;
        const size_t sz = op->bytes;
        const uint32_t t = op->tag;
        op->r = e.recv(1, &b, &sz, &t);
      } else {
        op->r = e.send(op->buf, op->bytes, op->tag);
      }
    } catch (const Error& e) {
      fail(e.status(), "UCX link to rank " + std::to_string(op->peer) + ": " + e.what());
    }
  }
  void flush(int peer) {
    auto& q = deferred_[static_cast<size_t>(peer)];
    while (!q.empty()) {
      post(q.front());
      if (!q.front()->r) return;
      q.pop_front();
    }
  }
  bool complete(Op* op) {
    size_t got = 0;
    bool done = false;
    try {
      done = ep(op->peer).test(op->r, &got);
    } catch (const Error& e) {
      op->r = nullptr;  // released by the endpoint
      fail(e.status(), "UCX link to rank " + std::to_string(op->peer) + ": " + e.what());
    }
    if (done && op->recv && got != op->bytes)
      fail(Status::kTransport, "UCX link: rank " + std::to_string(op->peer) + " sent " + std::to_string(got) +
                                   " bytes where " + std::to_string(op->bytes) + " were expected (tag " +
                                   std::to_string(op->tag) + "): the ranks are out of step");
    return done;
  }
  void wait_all(std::vector<Req>& reqs, const char* what) {
    std::vector<int> done(reqs.size());
    const Clock::duration bound = bound_of(timeout_ms_);
    auto until = Clock::now() + bound;
    uint64_t nap = 0;
    for (;;) {
      if (std::all_of(reqs.begin(), reqs.end(), [](Req r) { return r == kNullReq; })) return;
      if (test_some(reqs.data(), static_cast<int>(reqs.size()), done.data()) > 0) {
        until = Clock::now() + bound;
        nap = 0;
        continue;
      }
      if (Clock::now() >= until) {
        const std::string who = rank_list(size_, [&](int q) {
          return std::any_of(reqs.begin(), reqs.end(), [&](Req r) { return r != kNullReq && reinterpret_cast<Op*>(r)->peer == q; });
        });
        fail(Status::kTimeout, std::string("UCX link: ") + what + ": no answer from rank(s) " + who + " within " +
                                   std::to_string(timeout_ms_) + " ms (THC_TIMEOUT_MS)");
      }
      nap = nap ? std::min<uint64_t>(2 * nap, 200) : 10;
      idle(nap);
    }
  }

  int rank_, size_;
  long timeout_ms_;
  std::shared_ptr<ucx::Context> ctx_;
  std::vector<std::unique_ptr<ucx::Endpoint>> eps_;
  std::vector<std::deque<Op*>> deferred_;
};

ucx::Limits peer_limits(long timeout_ms) {
  ucx::Limits lim;
  lim.max_requests = 1024;
  if (timeout_ms > 0) lim.timeout_ms = timeout_ms;
  return lim;
}

class PeerListener final : public UcxPeerListener {
 public:
  PeerListener(std::shared_ptr<ucx::Context> ctx, const ucx::Limits& lim)
      : ctx_(std::move(ctx)), lim_(lim), l_(ctx_, lim) {}
  const ucx::Address& address() const override { return l_.address(); }
  std::shared_ptr<ucx::Context> ctx_;
  ucx::Limits lim_;
  ucx::Listener l_;
};

// ucx_connect_peers with the deadline of the whole setup; timeout_ms: THC_TIMEOUT_MS (messages, and
// the link's progress bound).
std::unique_ptr<Link> connect_peers_until(PeerListener& pl, const std::vector<ucx::Address>& addrs, int rank,
                                          Clock::time_point deadline, long timeout_ms) {
  const int size = static_cast<int>(addrs.size());
  check_rank(rank, size);
  std::shared_ptr<ucx::Context> ctx = pl.ctx_;
  const ucx::Limits lim = pl.lim_;
  ucx::Listener& listener = pl.l_;
  std::vector<std::unique_ptr<ucx::Endpoint>> eps(static_cast<size_t>(size));
  if (size == 1) return std::make_unique<UcxLink>(0, 1, timeout_ms, ctx, std::move(eps));
  // Rank i connects to every rank below it and accepts every rank above it; a new connection's
  // first message names its rank.
  struct Out {
    std::unique_ptr<ucx::Connector> conn;
    std::unique_ptr<ucx::Endpoint> ep;
    ucx::Request* hello = nullptr;
    RankMsg msg{};
  };
  struct In {
    std::unique_ptr<ucx::Endpoint> ep;
    ucx::Request* r = nullptr;
    RankMsg msg{};
  };
  std::vector<Out> outs(static_cast<size_t>(rank));
  for (int q = 0; q < rank; ++q) {
    outs[static_cast<size_t>(q)].conn = std::make_unique<ucx::Connector>(ctx, addrs[static_cast<size_t>(q)], lim);
    outs[static_cast<size_t>(q)].msg = RankMsg{kRvMagic, rank, size, 0};
  }
  std::vector<std::unique_ptr<In>> ins;  // (UCX writes into msg: stable addresses)
  int up = 0;  // peers with an endpoint in eps (outs count once their hello is sent)
  const int want = size - 1;
  const std::string where = "UCX backend (rank " + std::to_string(rank) + ")";
  while (up < want) {
    if (Clock::now() >= deadline)
      fail(Status::kTimeout, where + ": no UCX connection with rank(s) " +
                                 rank_list(size, [&](int q) { return q != rank && !eps[static_cast<size_t>(q)]; }) +
                                 " within " + std::to_string(timeout_ms) + " ms (THC_TIMEOUT_MS)");
    bool moved = false;
    for (int q = 0; q < rank; ++q) {
      Out& o = outs[static_cast<size_t>(q)];
      try {
        if (o.conn) {
          o.ep = o.conn->poll();
          if (o.ep) {
            o.conn.reset();
            o.hello = o.ep->send(&o.msg, sizeof o.msg, kTagRank);
            if (!o.hello) fail(Status::kInternal, "no request slot for the rank message");
            moved = true;
          }
        } else if (o.hello) {
          size_t got = 0;
          if (o.ep->test(o.hello, &got)) {
            o.hello = nullptr;
            eps[static_cast<size_t>(q)] = std::move(o.ep);
            ++up;
            moved = true;
          }
        }
      } catch (const Error& e) {
        fail(e.status(), where + ": connecting to rank " + std::to_string(q) + ": " + e.what());
      }
    }
    if (std::unique_ptr<ucx::Endpoint> a = listener.poll_accept()) {
      auto in = std::make_unique<In>();
      in->ep = std::move(a);
      void* b = &in->msg;
      const size_t sz = sizeof in->msg;
      const uint32_t t = kTagRank;
      in->r = in->ep->recv(1, &b, &sz, &t);
      if (!in->r) fail(Status::kInternal, where + ": no request slot for the rank message");
      ins.push_back(std::move(in));
      moved = true;
    }
    for (size_t i = 0; i < ins.size();) {
      In& in = *ins[i];
      bool drop = false, done = false;
      size_t got = 0;
      try {
        done = in.ep->test(in.r, &got);
      } catch (const Error&) {
        drop = true;  // a connection that failed before naming its rank
      }
      if (done) {
        const int q = in.msg.rank;
        if (got != sizeof in.msg || in.msg.magic != kRvMagic || in.msg.size != size || q <= rank ||
            q >= size || eps[static_cast<size_t>(q)]) {
          drop = true;
        } else {
          eps[static_cast<size_t>(q)] = std::move(in.ep);
          ++up;
        }
        moved = true;
      }
      if (drop || done) {
        if (in.ep) ucx::close_in_background(std::move(in.ep));
        ins.erase(ins.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
    if (!moved) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return std::make_unique<UcxLink>(rank, size, timeout_ms, ctx, std::move(eps));
}

}  // namespace

std::unique_ptr<UcxPeerListener> ucx_listen(long timeout_ms) {
  return std::make_unique<PeerListener>(shared_context(), peer_limits(timeout_ms));
}

std::unique_ptr<Link> ucx_connect_peers(UcxPeerListener& listener, const std::vector<ucx::Address>& addrs, int rank,
                                        long timeout_ms) {
  return connect_peers_until(static_cast<PeerListener&>(listener), addrs, rank, deadline_in(timeout_ms), timeout_ms);
}

std::unique_ptr<Link> make_ucx_link(const UcxGroupOptions& opt) {
  check_rank(opt.rank, opt.size);
  const PeerAddr at = parse_rendezvous(opt.rendezvous);
  const auto deadline = deadline_in(opt.timeout_ms);
  auto listener = ucx_listen(opt.timeout_ms);
  auto& pl = static_cast<PeerListener&>(*listener);
  if (opt.size == 1) return connect_peers_until(pl, {listener->address()}, 0, deadline, opt.timeout_ms);
  const std::vector<ucx::Address> addrs = opt.rank == 0 ? rendezvous_root(opt, at, listener->address(), deadline)
                                                        : rendezvous_member(opt, at, listener->address(), deadline);
  return connect_peers_until(pl, addrs, opt.rank, deadline, opt.timeout_ms);
}

std::unique_ptr<Reducer> make_ucx_reducer(const UcxGroupOptions& opt) {
  return make_scheduled_reducer(make_ucx_link(opt));
}

}  // namespace thc::transport
