#include "switch_offload/switchd/switchd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "common/net.h"
#include "common/status.h"
#include "common/sys_check.h"

namespace thc::switch_offload::switchd {

using proto::ErrorCode;

namespace {

void log(const std::string& line) {
  std::fprintf(stderr, "%s %s\n", log_prefix("thc-switchd").c_str(), line.c_str());
  std::fflush(stderr);
}

std::string job_str(uint64_t id) {
  return std::to_string(proto::job_key_id(id)) + ":" + std::to_string(static_cast<uint32_t>(id));
}

constexpr const char* kDpReasons[] = {"not_admitted", "bad_format", "bad_slot", "bad_nworkers", "bad_shape", "no_table",
                                      "b_not_parsed", "stale",      "duplicate", "no_route",   "not_ipv4",  "no_replica"};
constexpr size_t kDpReasonCount = sizeof kDpReasons / sizeof kDpReasons[0];

class SocketSink final : public Sink {
 public:
  explicit SocketSink(int fd) : fd_(fd) {}
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override {
    // UDP semantics: a reply lost here (full buffer) is recovered by the worker's retransmission.
    (void)::sendto(fd_, data, len, 0, reinterpret_cast<const sockaddr*>(&to.ss), to.len);
  }

 private:
  int fd_;
};

}  // namespace

class Switchd::Hooks final : public DataPlaneHooks {
 public:
  explicit Hooks(Switchd* d) : d_(d) {}
  ErrorCode job_created(const DataPlaneJob& j) override { return d_->on_job_created(j); }
  ErrorCode worker_joined(const DataPlaneJob& j, uint16_t w, const PeerAddr& at) override {
    return d_->on_worker_joined(j, w, at);
  }
  ErrorCode table_installed(const DataPlaneJob& j, const proto::TableSpec& t) override { return d_->on_table(j, t); }
  void job_freed(const DataPlaneJob& j) override { d_->on_job_freed(j); }

 private:
  Switchd* d_;
};

Switchd::Switchd(const SwitchdOptions& opt, std::unique_ptr<DataPlane> dp)
    : opt_(opt), dp_(std::move(dp)), hooks_(std::make_unique<Hooks>(this)) {
  if (!opt_.keys || opt_.keys->empty())
    fail(Status::kInvalidArgument, "thc-switchd: no keys (--key-file): every job must be authenticated");
  if (names().size() > static_cast<size_t>(proto::kMaxStatsCounters))
    fail(Status::kInternal, "thc-switchd: " + std::to_string(names().size()) + " counters do not fit a STATS reply (" +
                                std::to_string(proto::kMaxStatsCounters) + ")");
  if (!route_for(opt_.ip))
    fail(Status::kInvalidArgument, "thc-switchd: no route for the switch's own address " + ip_str(opt_.ip) +
                                       ": add --route " + ip_str(opt_.ip) +
                                       ",CPU_PORT,MAC (the CPU port and the MAC of thc-switchd's interface)");
  if (opt_.max_slots < 1 || opt_.max_slots > dp_->slot_capacity())
    fail(Status::kInvalidArgument, "thc-switchd: --max-slots must be 1.." + std::to_string(dp_->slot_capacity()) +
                                       " (the data plane's slot registers)");
  buf_.resize(proto::kMaxPacketBytes + 64);
  PeerAddr a;
  std::string err;
  if (!resolve_udp(ip_str(opt_.ip), opt_.port ? opt_.port : 1, &a, &err)) fail(Status::kInvalidArgument, err);
  reinterpret_cast<sockaddr_in*>(&a.ss)->sin_port = htons(opt_.port);
  fd_ = open_udp_socket(a, 4 << 20);
  const sys::SysResult b = THC_SYS(::bind(fd_, reinterpret_cast<const sockaddr*>(&a.ss), a.len));
  if (!b.ok()) {
    ::close(fd_);
    fail(Status::kTransport, "thc-switchd: cannot bind " + ip_str(opt_.ip) + ":" + std::to_string(opt_.port) + ": " +
                                 std::strerror(errno) + " (the switch's IP must be on this host's interface behind "
                                 "the switch's CPU port)");
  }
  PeerAddr got;
  got.len = sizeof got.ss;
  THC_CHECK_SYS(::getsockname(fd_, reinterpret_cast<sockaddr*>(&got.ss), &got.len));
  port_ = ntohs(reinterpret_cast<sockaddr_in*>(&got.ss)->sin_port);

  try {
    if (opt_.clear) dp_->clear();
    for (const Route& r : opt_.routes) dp_->add_route(r, opt_.switch_mac);
    dp_->add_service(opt_.ip, port_);
  } catch (...) {
    ::close(fd_);
    throw;
  }
  index_used_.assign(static_cast<size_t>(dp_->max_jobs()), false);

  EngineConfig ec;
  ec.max_slots_per_job = opt_.max_slots;
  ec.job_idle_timeout_us = opt_.job_idle_timeout_us;
  ec.seed = opt_.seed;
  ec.keys = opt_.keys;
  ec.stats_from_loopback = opt_.stats_from_loopback;
  ec.budget = std::make_shared<Budget>(std::min(opt_.max_jobs, dp_->max_jobs()), int64_t{1} << 40,
                                       opt_.max_jobs_per_source);
  ec.stats_snapshot = [this] { return stats(); };
  ec.data_plane = hooks_.get();
  engine_ = std::make_unique<Engine>(ec, &stats_);
}

Switchd::~Switchd() {
  engine_.reset();  // frees nothing in the data plane: that is done here, where failures are logged
  for (auto& kv : jobs_) {
    try {
      dp_->remove_job(kv.second.dp);
    } catch (const Error& e) {
      log(std::string("at exit: ") + e.what());
    }
  }
  if (fd_ >= 0) ::close(fd_);
}

std::string Switchd::describe() const {
  return "udp://" + ip_str(opt_.ip) + ":" + std::to_string(port_) + " data plane: " + dp_->describe() +
         " routes=" + std::to_string(opt_.routes.size()) + " max_jobs=" + std::to_string(opt_.max_jobs) +
         " max_slots=" + std::to_string(opt_.max_slots);
}

const Route* Switchd::route_for(uint32_t ip) const {
  for (const Route& r : opt_.routes)
    if (r.ip == ip) return &r;
  return nullptr;
}

ErrorCode Switchd::on_job_created(const DataPlaneJob& j) {
  int index = -1;
  for (size_t i = 0; i < index_used_.size() && index < 0; ++i)
    if (!index_used_[i]) index = static_cast<int>(i);
  // First fit over the slot registers shared by all jobs.
  uint32_t base = 0;
  bool fits = false;
  for (auto it = slot_ranges_.begin();; ++it) {
    const uint32_t end = it == slot_ranges_.end() ? dp_->slot_capacity() : it->first;
    if (end >= base && end - base >= j.slots) {
      fits = true;
      break;
    }
    if (it == slot_ranges_.end()) break;
    base = it->first + it->second;
  }
  if (index < 0 || !fits) {
    log("job " + job_str(j.id) + ": refused (no resources): " +
        (index < 0 ? "all " + std::to_string(index_used_.size()) + " job indices of the data plane in use"
                   : "no free range of " + std::to_string(j.slots) + " slots in the data plane's " +
                         std::to_string(dp_->slot_capacity()) + " (lower --max-slots, or THC_AGG_SLOTS)"));
    return ErrorCode::kNoResources;
  }
  JobEntry e;
  e.dp.id = j.id;
  e.dp.index = index;
  e.dp.n = j.n;
  e.dp.slot_base = base;
  e.dp.nslots = j.slots;
  e.dp.all_mask = j.n >= 64 ? ~uint64_t{0} : (uint64_t{1} << j.n) - 1;
  e.dp.mgid = static_cast<uint16_t>(index + 1);
  try {
    dp_->reset_slots(base, j.slots);
    dp_->install_job(e.dp);
    e.rx_seen = dp_->job_rx(index);
  } catch (const Error& err) {
    log("job " + job_str(j.id) + ": refused: the data plane failed: " + err.what());
    try {
      dp_->remove_job(e.dp);
    } catch (const Error&) {
      // Already reported; what is left is overwritten when the index is used again.
    }
    return ErrorCode::kNoResources;
  }
  index_used_[static_cast<size_t>(index)] = true;
  slot_ranges_[base] = j.slots;
  jobs_[j.id] = e;
  log("job " + job_str(j.id) + ": created: n=" + std::to_string(j.n) + " slots [" + std::to_string(base) + ", " +
      std::to_string(base + j.slots) + ") index " + std::to_string(index) + " mgid " + std::to_string(e.dp.mgid));
  return ErrorCode::kNone;
}

ErrorCode Switchd::on_worker_joined(const DataPlaneJob& j, uint16_t w, const PeerAddr& at) {
  auto it = jobs_.find(j.id);
  if (it == jobs_.end()) return ErrorCode::kUnknownJob;  // cannot happen: created first
  if (at.ss.ss_family != AF_INET) {
    log("job " + job_str(j.id) + ": worker " + std::to_string(w) + " at " + at.str() +
        " refused: the data plane routes IPv4 only");
    return ErrorCode::kNotSupported;
  }
  const auto* in = reinterpret_cast<const sockaddr_in*>(&at.ss);
  DpWorker dw;
  dw.worker = w;
  dw.ip = ntohl(in->sin_addr.s_addr);
  dw.udp_port = ntohs(in->sin_port);
  const Route* r = route_for(dw.ip);
  if (!r) {
    log("job " + job_str(j.id) + ": worker " + std::to_string(w) + " at " + at.str() +
        " refused: no route for " + ip_str(dw.ip) + " (add --route " + ip_str(dw.ip) + ",PORT,MAC)");
    return ErrorCode::kNotSupported;
  }
  dw.route = *r;
  try {
    dp_->admit_worker(it->second.dp, dw, opt_.switch_mac);
  } catch (const Error& e) {
    log("job " + job_str(j.id) + ": worker " + std::to_string(w) + " refused: the data plane failed: " + e.what());
    return ErrorCode::kNoResources;
  }
  log("job " + job_str(j.id) + ": worker " + std::to_string(w) + " admitted at " + at.str() + " (switch port " +
      std::to_string(r->port) + ", " + mac_str(r->mac) + ")");
  return ErrorCode::kNone;
}

ErrorCode Switchd::on_table(const DataPlaneJob& j, const proto::TableSpec& t) {
  auto it = jobs_.find(j.id);
  if (it == jobs_.end()) return ErrorCode::kUnknownJob;
  if ((t.bits != 1 && t.bits != 2 && t.bits != 4 && t.bits != 8) || proto::wire_int_bytes(t.sum) > 2) {
    // The data plane takes byte-aligned index widths and 8/16-bit sums (CONTRACT.md); clients use
    // the value form for the others.
    log("job " + job_str(j.id) + ": table " + std::to_string(t.id) + " with b=" + std::to_string(t.bits) + ", " +
        proto::wire_int_name(t.sum) + " sums refused: the data plane takes index widths 1, 2, 4, 8 with 8- or 16-bit sums");
    return ErrorCode::kNotSupported;
  }
  try {
    dp_->write_table(it->second.dp, t.id, t.bits, t.sum, t.values);
  } catch (const Error& e) {
    log("job " + job_str(j.id) + ": table " + std::to_string(t.id) + ": the data plane failed: " + e.what());
    return ErrorCode::kNoResources;
  }
  return ErrorCode::kNone;
}

void Switchd::on_job_freed(const DataPlaneJob& j) {
  auto it = jobs_.find(j.id);
  if (it == jobs_.end()) return;
  const DpJob d = it->second.dp;
  try {
    dp_->remove_job(d);
  } catch (const Error& e) {
    log("job " + job_str(j.id) + ": removing it from the data plane failed: " + e.what());
  }
  index_used_[static_cast<size_t>(d.index)] = false;
  slot_ranges_.erase(d.slot_base);
  jobs_.erase(it);
  log("job " + job_str(j.id) + ": freed (index " + std::to_string(d.index) + ")");
}

void Switchd::poll_counters(uint64_t now) {
  for (auto& kv : jobs_) {
    try {
      const uint64_t rx = dp_->job_rx(kv.second.dp.index);
      if (rx != kv.second.rx_seen) {
        kv.second.rx_seen = rx;
        engine_->touch(kv.first, 0, now);
      }
    } catch (const Error& e) {
      log(std::string("reading the data plane's counters failed: ") + e.what());
      return;
    }
  }
}

void Switchd::run_once(int max_wait_ms) {
  SocketSink sink(fd_);
  uint64_t now = mono_us();
  const uint64_t due = std::min(next_tick_, next_poll_);
  const int wait = due <= now ? 0 : static_cast<int>(std::min<uint64_t>((due - now + 999) / 1000, max_wait_ms));
  pollfd p{fd_, POLLIN, 0};
  (void)THC_SYS(::poll(&p, 1, wait));
  for (int i = 0; i < 256; ++i) {
    PeerAddr from;
    from.len = sizeof from.ss;
    const ssize_t n = ::recvfrom(fd_, buf_.data(), buf_.size(), 0, reinterpret_cast<sockaddr*>(&from.ss), &from.len);
    if (n < 0) break;
    engine_->handle(buf_.data(), static_cast<size_t>(n), from, mono_us(), sink);
  }
  now = mono_us();
  if (now >= next_poll_) {
    poll_counters(now);
    next_poll_ = now + opt_.poll_us;
  }
  if (now >= next_tick_) {
    engine_->tick(now, sink);
    next_tick_ = now + engine_->tick_interval_us();
  }
}

void Switchd::run(const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) run_once(100);
}

std::vector<std::string> Switchd::names() {
  std::vector<std::string> n = stats_names();
  static_assert(sizeof kDpReasons / sizeof kDpReasons[0] == 12, "CONTRACT.md numbers 12 drop reasons");
  for (const char* s : {"dp_aggregated", "dp_results", "dp_drops_total"}) n.emplace_back(s);
  // The data plane's drop reasons (CONTRACT.md, include/thc_constants.p4), by counter index
  // (drops_total counts every index; a STATS reply holds at most 64 counters).
  for (const char* r : kDpReasons) n.push_back(std::string("dp_drop_") + r);
  return n;
}

std::vector<uint64_t> Switchd::stats() {
  std::vector<uint64_t> v = stats_values(stats_);
  const size_t base = v.size();
  v.resize(names().size(), 0);
  try {
    const DpCounters c = dp_->counters();
    for (uint64_t x : c.job_rx) v[base] += x;
    for (uint64_t x : c.result) v[base + 1] += x;
    for (size_t i = 0; i < c.drop.size(); ++i) {
      v[base + 2] += c.drop[i];
      if (i < kDpReasonCount) v[base + 3 + i] = c.drop[i];
    }
  } catch (const Error& e) {
    log(std::string("reading the data plane's counters failed (STATS shows them as 0): ") + e.what());
  }
  return v;
}

}  // namespace thc::switch_offload::switchd
