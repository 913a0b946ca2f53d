#include "switch_offload/servers/udp/udp_server.h"

#include <linux/filter.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/status.h"
#include "common/net.h"
#include "common/sys_check.h"
#include "common/udp_batch.h"

#ifndef SO_ATTACH_REUSEPORT_CBPF
#define SO_ATTACH_REUSEPORT_CBPF 51
#endif

namespace thc::switch_offload {

namespace {
constexpr size_t kBatch = 256;  // datagrams per receive round

// Replies go straight into the socket's batch (grouped per destination and sent as GSO buffers
// at flush), unless server-side fault injection is on.
class BatchSink final : public Sink {
 public:
  explicit BatchSink(UdpBatch* io) : io_(io) {}
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override { io_->queue(to, data, len); }
  // The payload stays in the engine until the flush that follows every engine call (run()).
  void send_parts(const PeerAddr& to, const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen) override {
    io_->queue_parts(to, head, hlen, tail, tlen);
  }

 private:
  UdpBatch* io_;
};
class FaultSink final : public Sink {
 public:
  FaultSink(UdpBatch* io, FaultInjector* f) : io_(io), f_(f) {}
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override {
    out_.clear();
    f_->offer(data, len, to, mono_us(), &out_);
    for (auto& d : out_) io_->queue(d.peer, d.bytes.data(), d.bytes.size());
  }

 private:
  UdpBatch* io_;
  FaultInjector* f_;
  std::vector<FaultInjector::Datagram> out_;
};
}  // namespace

struct UdpServer::Shard {
  int index = 0;
  int fd = -1;
  std::unique_ptr<UdpBatch> io;
  Stats stats;
  std::unique_ptr<Engine> engine;
  FaultInjector rx_fault, tx_fault;
  std::thread thread;
  std::atomic<int> tid{0};  // the thread's kernel id (cpu_split)
};

UdpServer::UdpServer(const ServerOptions& opt) : opt_(opt) {
  if (opt_.threads < 1 || opt_.threads > 256) fail(Status::kInvalidArgument, "thc-aggregator: --threads must be 1..256");
  PeerAddr bind_addr;
  std::string err;
  if (!resolve_udp(opt_.bind, opt_.port ? opt_.port : 1, &bind_addr, &err))
    fail(Status::kInvalidArgument, "thc-aggregator: --bind: " + err);
  if (const std::string p = opt_.problem(); !p.empty()) fail(Status::kInvalidArgument, "thc-aggregator: " + p);
  budget_ = opt_.budget();
  const uint64_t started_ns = wall_clock_ns();
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
    // A = shard (header bytes 30..31); X = A; A = low word of the job id (bytes 12..15; absolute
    // loads are big-endian, i.e. the wire values); A = (A + X) % N; return A.
    sock_filter code[] = {
        {BPF_LD | BPF_H | BPF_ABS, 0, 0, 30},
        {BPF_MISC | BPF_TAX, 0, 0, 0},
        {BPF_LD | BPF_W | BPF_ABS, 0, 0, 12},
        {BPF_ALU | BPF_ADD | BPF_X, 0, 0, 0},
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
    s->io = std::make_unique<UdpBatch>(s->fd, false, opt_.gso && !opt_.fault.active(), opt_.gro);
    EngineConfig ec = opt_.engine_config(bind_addr.ss.ss_family == AF_INET6 ? 40 : 20,
                                         static_cast<uint16_t>(opt_.threads), static_cast<uint64_t>(s->index));
    ec.stats_from_loopback = opt_.stats_from_loopback;
    ec.stats_nonce_floor = started_ns;
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

bool UdpServer::gso() const { return shards_[0]->io->gso(); }
bool UdpServer::gro() const { return shards_[0]->io->gro(); }

UdpBatchStats UdpServer::io_stats() const {
  UdpBatchStats t;
  for (const auto& s : shards_) {
    const UdpBatchStats& x = s->io->stats();
    t.datagrams_sent += x.datagrams_sent;
    t.send_calls += x.send_calls;
    t.gso_buffers += x.gso_buffers;
    t.send_errors += x.send_errors;
    t.datagrams_received += x.datagrams_received;
    t.recv_calls += x.recv_calls;
    t.gro_buffers += x.gro_buffers;
    t.gro_datagrams += x.gro_datagrams;
    t.truncated += x.truncated;
    t.gso_datagrams += x.gso_datagrams;
  }
  return t;
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

double UdpServer::cpu_seconds() const {
  double t = 0;
  for (const auto& s : shards_) {
    if (!s->thread.joinable()) continue;
    clockid_t cid;
    timespec ts{};
    if (pthread_getcpuclockid(const_cast<std::thread&>(s->thread).native_handle(), &cid) == 0 &&
        clock_gettime(cid, &ts) == 0)
      t += static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  return t;
}

void UdpServer::cpu_split(double* user, double* kernel) const {
  *user = *kernel = 0;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  for (const auto& s : shards_) {
    const int tid = s->tid.load();
    if (!tid) continue;
    FILE* f = std::fopen(("/proc/self/task/" + std::to_string(tid) + "/stat").c_str(), "r");
    if (!f) continue;
    char buf[1024];
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    const char* p = std::strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    if (p && std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2) {
      *user += static_cast<double>(ut) / tick;
      *kernel += static_cast<double>(st) / tick;
    }
  }
}

size_t UdpServer::jobs() const {
  const std::vector<uint64_t> v = stats();
  return static_cast<size_t>(stats_get(v, "jobs_created") - stats_get(v, "jobs_freed"));
}

void UdpServer::run(Shard* s) {
  // Named, so that top -H and perf tell the aggregation threads from the process's others.
  const std::string name = "thc-agg-" + std::to_string(s->index);
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  s->tid.store(static_cast<int>(::gettid()));
  UdpBatch& io = *s->io;
  std::vector<UdpBatch::Datagram> in;
  std::vector<Datagram> batch;
  batch.reserve(kBatch);
  std::vector<FaultInjector::Datagram> faulted;
  BatchSink plain(&io);
  FaultSink faulty(&io, &s->tx_fault);
  Sink& sink = s->tx_fault.active() ? static_cast<Sink&>(faulty) : static_cast<Sink&>(plain);
  Engine& eng = *s->engine;
  uint64_t next_tick = mono_us();
  uint64_t tx_errors_seen = 0, truncated_seen = 0;

  auto sync_fault_drops = [&] {
    const uint64_t have = s->stats.drops[static_cast<int>(Drop::kFault)].get();
    const uint64_t want = s->rx_fault.dropped() + s->tx_fault.dropped();
    if (want > have) s->stats.drops[static_cast<int>(Drop::kFault)].add(want - have);
  };
  auto flush = [&](uint64_t now) {
    if (s->tx_fault.active()) {
      faulted.clear();
      s->tx_fault.poll(now, &faulted);
      for (auto& d : faulted) io.queue(d.peer, d.bytes.data(), d.bytes.size());
      sync_fault_drops();
    }
    io.flush();
    // Full socket buffer or an unreachable peer: UDP semantics, the datagram is lost and the
    // sender's retransmission recovers it.
    if (io.stats().send_errors > tx_errors_seen) {
      s->stats.tx_errors.add(io.stats().send_errors - tx_errors_seen);
      tx_errors_seen = io.stats().send_errors;
    }
    // Datagrams larger than a receive buffer (none of ours is): counted, not lost silently.
    if (io.stats().truncated > truncated_seen) {
      s->stats.drops[static_cast<int>(Drop::kBadLength)].add(io.stats().truncated - truncated_seen);
      truncated_seen = io.stats().truncated;
    }
  };

  while (!stop_.load(std::memory_order_relaxed)) {
    uint64_t now = mono_us();
    const uint64_t wake = std::min(next_tick, std::min(s->rx_fault.next_due(), s->tx_fault.next_due()));
    const int timeout_ms = wake <= now ? 0 : static_cast<int>(std::min<uint64_t>((wake - now + 999) / 1000, 100));
    pollfd pfd{s->fd, POLLIN, 0};
    (void)THC_SYS(::poll(&pfd, 1, timeout_ms));
    for (int round = 0; round < 16; ++round) {
      if (io.recv_batch(&in, kBatch) == 0) break;
      now = mono_us();
      if (s->rx_fault.active()) {
        for (const UdpBatch::Datagram& d : in) {
          faulted.clear();
          s->rx_fault.offer(d.data, d.len, *d.from, now, &faulted);
          sync_fault_drops();
          for (auto& f : faulted) eng.handle(f.bytes.data(), f.bytes.size(), f.peer, now, sink);
        }
      } else {
        // Straight from the receive buffers: the engine tags the batch's data packets side by side.
        batch.clear();
        for (const UdpBatch::Datagram& d : in) batch.push_back(Datagram{d.data, d.len, d.from});
        eng.handle_batch(batch.data(), batch.size(), now, sink);
      }
      flush(now);
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
