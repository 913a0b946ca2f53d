#include "switch_offload/servers/udp/udp_server.h"

#include <linux/filter.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/status.h"
#include "common/net.h"
#include "common/sys_check.h"

#ifndef SO_ATTACH_REUSEPORT_CBPF
#define SO_ATTACH_REUSEPORT_CBPF 51
#endif

namespace thc::switch_offload {

namespace {
constexpr int kBatch = 64;

// Replies collected while handling a batch, sent together with sendmmsg.
class BatchSink final : public Sink {
 public:
  struct Out {
    PeerAddr to;
    std::vector<uint8_t> bytes;
  };
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override {
    if (used_ == outs_.size()) outs_.emplace_back();
    Out& o = outs_[used_++];
    o.to = to;
    o.bytes.assign(data, data + len);
  }
  size_t size() const { return used_; }
  Out& at(size_t i) { return outs_[i]; }
  void clear() { used_ = 0; }

 private:
  std::vector<Out> outs_;  // reused across batches: no allocation in steady state
  size_t used_ = 0;
};
}  // namespace

struct UdpServer::Shard {
  int index = 0;
  int fd = -1;
  Stats stats;
  std::unique_ptr<Engine> engine;
  FaultInjector rx_fault, tx_fault;
  std::thread thread;
};

bool parse_bytes(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || end == s.c_str() || v < 0) return false;
  int64_t mul = 1;
  const std::string suf(end);
  if (suf.empty() || suf == "B") mul = 1;
  else if (suf == "K" || suf == "KiB" || suf == "k") mul = int64_t{1} << 10;
  else if (suf == "M" || suf == "MiB") mul = int64_t{1} << 20;
  else if (suf == "G" || suf == "GiB") mul = int64_t{1} << 30;
  else return false;
  if (v > (int64_t{1} << 62) / mul) return false;
  *out = v * mul;
  return true;
}

UdpServer::UdpServer(const ServerOptions& opt) : opt_(opt) {
  if (opt_.threads < 1 || opt_.threads > 256) fail(Status::kInvalidArgument, "thc-aggregator: --threads must be 1..256");
  if (opt_.max_slots < 1 || opt_.max_slots > static_cast<uint32_t>(proto::kMaxSlots))
    fail(Status::kInvalidArgument, "thc-aggregator: --max-slots must be 1..32768");
  PeerAddr bind_addr;
  std::string err;
  if (!resolve_udp(opt_.bind, opt_.port ? opt_.port : 1, &bind_addr, &err))
    fail(Status::kInvalidArgument, "thc-aggregator: --bind: " + err);
  budget_ = std::make_shared<Budget>(opt_.max_jobs, opt_.max_memory);
  for (int t = 0; t < opt_.threads; ++t) {
    auto s = std::make_unique<Shard>();
    s->index = t;
    s->fd = open_udp_socket(bind_addr, opt_.socket_buffer);
    const int one = 1;
    THC_CHECK_SYS(::setsockopt(s->fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one));
    PeerAddr a = bind_addr;
    // The first socket may take an ephemeral port; the others join its reuseport group.
    const uint16_t p = t == 0 ? opt_.port : port_;
    if (a.ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&a.ss)->sin_port = htons(p);
    else reinterpret_cast<sockaddr_in6*>(&a.ss)->sin6_port = htons(p);
    THC_CHECK_SYS(::bind(s->fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len));
    if (t == 0) {
      PeerAddr got;
      got.len = sizeof got.ss;
      THC_CHECK_SYS(::getsockname(s->fd, reinterpret_cast<sockaddr*>(&got.ss), &got.len));
      port_ = got.ss.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&got.ss)->sin_port)
                                          : ntohs(reinterpret_cast<sockaddr_in6*>(&got.ss)->sin6_port);
    }
    s->rx_fault = FaultInjector(opt_.fault, 2 * t + 1);
    s->tx_fault = FaultInjector(opt_.fault, 2 * t + 2);
    shards_.push_back(std::move(s));
  }
  if (opt_.threads > 1) {
    // A = job id (a 4-byte absolute load is big-endian, i.e. the wire value); A %= N; return A.
    sock_filter code[] = {
        {BPF_LD | BPF_W | BPF_ABS, 0, 0, 8},
        {BPF_ALU | BPF_MOD | BPF_K, 0, 0, static_cast<uint32_t>(opt_.threads)},
        {BPF_RET | BPF_A, 0, 0, 0},
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
    const sys::SysResult r = THC_SYS(::setsockopt(shards_[0]->fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog));
    if (!r.ok()) {
      for (auto& s : shards_) ::close(s->fd);
      r.fail(Status::kTransport);
    }
    steering_ = true;
  }
  for (auto& s : shards_) {
    EngineConfig ec;
    ec.max_slots_per_job = opt_.max_slots;
    ec.job_idle_timeout_us = opt_.job_idle_timeout_us;
    // Distinct seed streams per shard; a job always lands on the same shard.
    ec.seed = opt_.seed ? opt_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(s->index) : 0;
    ec.budget = budget_;
    ec.stats_snapshot = [this] { return stats(); };
    s->engine = std::make_unique<Engine>(ec, &s->stats);
  }
}

UdpServer::~UdpServer() {
  stop();
  for (auto& s : shards_)
    if (s->fd >= 0) ::close(s->fd);
}

std::string UdpServer::address() const {
  const bool v6 = opt_.bind.find(':') != std::string::npos;
  return "udp://" + (v6 ? "[" + opt_.bind + "]" : opt_.bind) + ":" + std::to_string(port_);
}

void UdpServer::start() {
  if (started_) return;
  started_ = true;
  for (auto& s : shards_) {
    Shard* sp = s.get();
    s->thread = std::thread([this, sp] { run(sp); });
  }
}

void UdpServer::stop() {
  stop_.store(true);
  for (auto& s : shards_)
    if (s->thread.joinable()) s->thread.join();
}

std::vector<uint64_t> UdpServer::stats() const {
  std::vector<uint64_t> acc;
  for (const auto& s : shards_) stats_accumulate(&acc, stats_values(s->stats));
  return acc;
}

size_t UdpServer::jobs() const {
  const std::vector<uint64_t> v = stats();
  return static_cast<size_t>(stats_get(v, "jobs_created") - stats_get(v, "jobs_freed"));
}

void UdpServer::run(Shard* s) {
  std::vector<std::vector<uint8_t>> rbufs(kBatch, std::vector<uint8_t>(proto::kMaxPacketBytes + 1));
  std::vector<PeerAddr> raddr(kBatch);
  std::vector<mmsghdr> rmsg(kBatch);
  std::vector<iovec> riov(kBatch);
  std::vector<mmsghdr> smsg(kBatch);
  std::vector<iovec> siov(kBatch);
  std::vector<FaultInjector::Datagram> faulted;
  BatchSink sink;
  Engine& eng = *s->engine;
  uint64_t next_tick = mono_us();

  auto handle = [&](const uint8_t* p, size_t n, const PeerAddr& from, uint64_t now) {
    if (s->rx_fault.active()) {
      faulted.clear();
      s->rx_fault.offer(p, n, from, now, &faulted);
      if (s->rx_fault.dropped() > 0) {
        // Keep drop_fault in step with the injector's own count.
        const uint64_t have = s->stats.drops[static_cast<int>(Drop::kFault)].get();
        const uint64_t want = s->rx_fault.dropped() + s->tx_fault.dropped();
        if (want > have) s->stats.drops[static_cast<int>(Drop::kFault)].add(want - have);
      }
      for (auto& d : faulted) eng.handle(d.bytes.data(), d.bytes.size(), d.peer, now, sink);
    } else {
      eng.handle(p, n, from, now, sink);
    }
  };

  auto flush = [&](uint64_t now) {
    std::vector<FaultInjector::Datagram> out;
    std::vector<FaultInjector::Datagram>* list = nullptr;
    if (s->tx_fault.active()) {
      for (size_t i = 0; i < sink.size(); ++i) s->tx_fault.offer(sink.at(i).bytes.data(), sink.at(i).bytes.size(), sink.at(i).to, now, &out);
      s->tx_fault.poll(now, &out);
      const uint64_t have = s->stats.drops[static_cast<int>(Drop::kFault)].get();
      const uint64_t want = s->rx_fault.dropped() + s->tx_fault.dropped();
      if (want > have) s->stats.drops[static_cast<int>(Drop::kFault)].add(want - have);
      list = &out;
    }
    const size_t total = list ? list->size() : sink.size();
    for (size_t base = 0; base < total; base += kBatch) {
      const size_t m = std::min<size_t>(kBatch, total - base);
      for (size_t i = 0; i < m; ++i) {
        const PeerAddr* to;
        std::vector<uint8_t>* b;
        if (list) {
          to = &(*list)[base + i].peer;
          b = &(*list)[base + i].bytes;
        } else {
          to = &sink.at(base + i).to;
          b = &sink.at(base + i).bytes;
        }
        siov[i] = iovec{b->data(), b->size()};
        std::memset(&smsg[i], 0, sizeof smsg[i]);
        smsg[i].msg_hdr.msg_name = const_cast<sockaddr_storage*>(&to->ss);
        smsg[i].msg_hdr.msg_namelen = to->len;
        smsg[i].msg_hdr.msg_iov = &siov[i];
        smsg[i].msg_hdr.msg_iovlen = 1;
      }
      size_t sent = 0;
      while (sent < m) {
        const sys::SysResult r = THC_SYS(::sendmmsg(s->fd, smsg.data() + sent, static_cast<unsigned>(m - sent), MSG_DONTWAIT));
        if (!r.ok()) {
          // Full socket buffer or an unreachable peer: UDP semantics, the datagram is lost and
          // the sender's retransmission recovers it.
          s->stats.tx_errors.add();
          ++sent;
          continue;
        }
        sent += static_cast<size_t>(r.rc);
      }
    }
    sink.clear();
  };

  while (!stop_.load(std::memory_order_relaxed)) {
    uint64_t now = mono_us();
    uint64_t wake = std::min(next_tick, std::min(s->rx_fault.next_due(), s->tx_fault.next_due()));
    const int timeout_ms = wake <= now ? 0 : static_cast<int>(std::min<uint64_t>((wake - now + 999) / 1000, 100));
    pollfd pfd{s->fd, POLLIN, 0};
    (void)THC_SYS(::poll(&pfd, 1, timeout_ms));
    for (int round = 0; round < 16; ++round) {
      for (int i = 0; i < kBatch; ++i) {
        riov[i] = iovec{rbufs[i].data(), rbufs[i].size()};
        std::memset(&rmsg[i], 0, sizeof rmsg[i]);
        rmsg[i].msg_hdr.msg_name = &raddr[i].ss;
        rmsg[i].msg_hdr.msg_namelen = sizeof raddr[i].ss;
        rmsg[i].msg_hdr.msg_iov = &riov[i];
        rmsg[i].msg_hdr.msg_iovlen = 1;
      }
      const sys::SysResult r = THC_SYS(::recvmmsg(s->fd, rmsg.data(), kBatch, MSG_DONTWAIT, nullptr));
      if (!r.ok()) break;  // EAGAIN: drained (other errors: nothing a UDP server can do but go on)
      now = mono_us();
      for (int i = 0; i < static_cast<int>(r.rc); ++i) {
        raddr[i].len = rmsg[i].msg_hdr.msg_namelen;
        // A datagram longer than any valid packet is truncated by the kernel into our buffer,
        // which is one byte larger than the maximum, so the parser still sees it as oversized.
        handle(rbufs[i].data(), rmsg[i].msg_len, raddr[i], now);
      }
      flush(now);
      if (r.rc < kBatch) break;
    }
    now = mono_us();
    if (s->rx_fault.active()) {
      faulted.clear();
      s->rx_fault.poll(now, &faulted);
      for (auto& d : faulted) eng.handle(d.bytes.data(), d.bytes.size(), d.peer, now, sink);
    }
    if (now >= next_tick) {
      eng.tick(now, sink);
      next_tick = now + eng.tick_interval_us();
    }
    flush(now);
  }
}

}  // namespace thc::switch_offload
