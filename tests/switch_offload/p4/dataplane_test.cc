// The P4 data plane (switch_offload/p4/v1model) on a real BMv2 simple_switch, driven exactly as
// CONTRACT.md says thc-switchd drives it: entries installed with simple_switch_CLI, packets built
// and signed with the project's protocol code (wire.h / builder.h / auth.h) and sent from UDP
// sockets in worker network namespaces, every reply checked with proto::parse.
//
// Run by bmv2_testbed.sh, which builds the namespaces, starts simple_switch and passes the testbed
// in THC_P4_* variables; without them the program exits 77 (skipped).
//
// "Nothing else arrived" is checked without timing: a worker's replies leave the switch in the
// order its packets came in, so after the packet under test a worker sends one whose answer is
// known (a retransmission of a completed packet, answered with the stored result to it alone);
// the first datagram it receives must be that answer.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "switch_offload/protocol/auth.h"
#include "switch_offload/protocol/builder.h"
#include "switch_offload/protocol/wire.h"

namespace proto = thc::switch_offload::proto;
namespace auth = thc::switch_offload::auth;

namespace {

constexpr uint16_t kServicePort = 9471;
constexpr int kLanes = proto::kTofinoLanes;
// BMv2 handles a few thousand packets/s: generous. THC_P4_REPLY_TIMEOUT_MS shortens it to debug.
const int kReplyTimeoutMs = std::getenv("THC_P4_REPLY_TIMEOUT_MS") ? std::atoi(std::getenv("THC_P4_REPLY_TIMEOUT_MS")) : 20000;

// Drop reasons (switch_offload/p4/include/thc_constants.p4, CONTRACT.md).
enum Drop {
  kNotAdmitted = 0,
  kBadFormat = 1,
  kBadSlot = 2,
  kBadNworkers = 3,
  kBadShape = 4,
  kNoTable = 5,
  kUnsupported = 6,
  kStale = 7,
  kDuplicate = 8,
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  return out;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

struct Testbed {
  std::string ns_sw, ns_cpu, cli, thrift_port, switch_ip, router_mac, cpu_mac, stranger_ip;
  int cpu_port = 0;
  std::vector<std::string> ns_w, worker_ips, worker_macs;
  bool load() {
    ns_sw = env("THC_P4_NS_SW");
    ns_cpu = env("THC_P4_NS_CPU");
    cli = env("THC_P4_CLI");
    thrift_port = env("THC_P4_THRIFT_PORT");
    switch_ip = env("THC_P4_SWITCH_IP");
    router_mac = env("THC_P4_ROUTER_MAC");
    cpu_mac = env("THC_P4_CPU_MAC");
    stranger_ip = env("THC_P4_STRANGER_IP");
    cpu_port = std::atoi(env("THC_P4_CPU_PORT").c_str());
    ns_w = split(env("THC_P4_NS_W"), ',');
    worker_ips = split(env("THC_P4_WORKER_IPS"), ',');
    worker_macs = split(env("THC_P4_WORKER_MACS"), ',');
    return !ns_sw.empty() && !cli.empty() && !switch_ip.empty() && ns_w.size() >= 4 &&
           worker_ips.size() == ns_w.size() && worker_macs.size() == ns_w.size();
  }
};
Testbed tb;

// ---- network namespaces and sockets -------------------------------------------------------------

// Runs f with this thread in network namespace ns; a socket made there stays there.
template <class F>
auto in_netns(const std::string& ns, F f) {
  const int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  const int target = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (self < 0 || target < 0 || setns(target, CLONE_NEWNET) != 0) {
    ADD_FAILURE() << "cannot enter network namespace " << ns << ": " << std::strerror(errno);
    std::abort();
  }
  auto r = f();
  if (setns(self, CLONE_NEWNET) != 0) std::abort();
  close(self);
  close(target);
  return r;
}

sockaddr_in addr_of(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) std::abort();
  return a;
}

struct Datagram {
  std::vector<uint8_t> bytes;
  std::string src_ip;
  uint16_t src_port = 0;
};

class UdpSocket {
 public:
  UdpSocket(const std::string& ns, const std::string& ip, uint16_t port) : ip_(ip), port_(port) {
    fd_ = in_netns(ns, [&] {
      const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      if (fd < 0) return -1;
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      int buf = 4 << 20;
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
      const sockaddr_in a = addr_of(ip, port);
      if (bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
        close(fd);
        return -1;
      }
      return fd;
    });
    if (fd_ < 0) {
      ADD_FAILURE() << "socket " << ip << ":" << port << " in " << ns << ": " << std::strerror(errno);
      std::abort();
    }
  }
  ~UdpSocket() {
    if (fd_ >= 0) close(fd_);
  }
  UdpSocket(const UdpSocket&) = delete;
  UdpSocket& operator=(const UdpSocket&) = delete;

  void send(const std::vector<uint8_t>& p, const std::string& ip, uint16_t port) const {
    const sockaddr_in a = addr_of(ip, port);
    const ssize_t n = sendto(fd_, p.data(), p.size(), 0, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    ASSERT_EQ(n, static_cast<ssize_t>(p.size())) << std::strerror(errno);
  }
  std::optional<Datagram> recv(int timeout_ms) const {
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) <= 0) return std::nullopt;
    Datagram d;
    d.bytes.resize(65536);
    sockaddr_in a{};
    socklen_t al = sizeof a;
    const ssize_t n = recvfrom(fd_, d.bytes.data(), d.bytes.size(), 0, reinterpret_cast<sockaddr*>(&a), &al);
    if (n < 0) return std::nullopt;
    d.bytes.resize(static_cast<size_t>(n));
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
    d.src_ip = buf;
    d.src_port = ntohs(a.sin_port);
    return d;
  }
  // Whatever is queued right now (a test checks it is nothing).
  size_t pending() const {
    size_t k = 0;
    while (recv(0)) ++k;
    return k;
  }
  const std::string& ip() const { return ip_; }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  std::string ip_;
  uint16_t port_;
};

// ---- the switch's control interface: simple_switch_CLI, as thc-switchd's BMv2 backend ----------

std::string run_cli(const std::string& commands) {
  char path[] = "/tmp/thcp4cliXXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) std::abort();
  if (write(fd, commands.data(), commands.size()) != static_cast<ssize_t>(commands.size())) std::abort();
  close(fd);
  const std::string cmd =
      "ip netns exec " + tb.ns_sw + " " + tb.cli + " --thrift-port " + tb.thrift_port + " < " + path + " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) std::abort();
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  unlink(path);
  EXPECT_EQ(st, 0) << out;
  // The CLI reports a bad command on stdout and carries on.
  for (const char* bad : {"Error", "Invalid", "invalid", "Traceback", "not found"})
    EXPECT_EQ(out.find(bad), std::string::npos) << "simple_switch_CLI:\n" << commands << "\n--- output ---\n" << out;
  return out;
}

// The data plane's counters, read in one CLI call (each call costs the CLI's start-up): every drop
// reason, and packets received and RESULTs sent for the given job indices.
struct Counters {
  std::map<std::string, uint64_t> v;  // "c_drop[7]" -> packets
  uint64_t get(const std::string& key) const {
    const auto it = v.find(key);
    if (it == v.end()) {
      ADD_FAILURE() << "counter " << key << " not read";
      return ~0ull;
    }
    return it->second;
  }
  uint64_t drop(Drop r) const { return get("c_drop[" + std::to_string(r) + "]"); }
  uint64_t rx(int job_idx) const { return get("c_job_rx[" + std::to_string(job_idx) + "]"); }
  uint64_t results(int job_idx) const { return get("c_result[" + std::to_string(job_idx) + "]"); }
};

Counters read_counters(const std::vector<int>& jobs = {}) {
  std::ostringstream c;
  for (int r = 0; r < 16; ++r) c << "counter_read ThcIngress.c_drop " << r << "\n";
  for (int j : jobs) c << "counter_read ThcIngress.c_job_rx " << j << "\ncounter_read ThcIngress.c_result " << j << "\n";
  const std::string out = run_cli(c.str());
  Counters k;
  std::regex re(R"(ThcIngress\.([a-z_]+\[[0-9]+\])=\s*\([0-9]+ bytes, ([0-9]+) packets\))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    k.v[(*it)[1]] = std::stoull((*it)[2]);
  EXPECT_EQ(k.v.size(), 16 + 2 * jobs.size()) << out;
  return k;
}

// Packets from different switch ports may be taken in any order (one capture thread per port), so
// a test that needs one worker's packets handled before another's waits for the drop counter they
// move. Returns the last value read (the caller checks it).
uint64_t wait_drops(Drop reason, uint64_t at_least) {
  uint64_t v = read_counters().drop(reason);
  for (int i = 0; i < 100 && v < at_least; ++i) {
    usleep(100 * 1000);
    v = read_counters().drop(reason);
  }
  return v;
}

std::string mac_of_port_worker(int w) { return tb.worker_macs[static_cast<size_t>(w)]; }

// ---- workers and jobs ---------------------------------------------------------------------------

auth::Key fixed_key(uint32_t id, uint32_t seed) {
  auth::Key k;
  k.id = id;
  std::mt19937 rng(seed);
  for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  return k;
}

// A worker process of a job: a socket in host h's namespace, on the switch port 1 + h.
struct Worker {
  int host;
  std::unique_ptr<UdpSocket> sock;
};

struct TableInstall {
  int tid, bits;
  proto::WireInt sum;
  std::vector<int32_t> values;
};

// A job as thc-switchd installs it: admission per worker, multicast group + replicas, slot range.
class SwitchJob {
 public:
  SwitchJob(uint32_t label, int job_idx, int slot_base, int nslots, const std::vector<int>& hosts, uint16_t port_base)
      : job_idx_(job_idx), slot_base_(slot_base), nslots_(nslots) {
    id_ = proto::JobId::make(fixed_key(7, 1234), label, static_cast<uint16_t>(hosts.size()));
    id_.with_seed(0x5eed0000u + label);
    for (size_t w = 0; w < hosts.size(); ++w) {
      Worker wk;
      wk.host = hosts[w];
      wk.sock = std::make_unique<UdpSocket>(tb.ns_w[static_cast<size_t>(hosts[w])],
                                            tb.worker_ips[static_cast<size_t>(hosts[w])],
                                            static_cast<uint16_t>(port_base + w));
      workers_.push_back(std::move(wk));
    }
  }

  void install() {
    const int n = static_cast<int>(workers_.size());
    const uint64_t all = n == 64 ? ~0ull : ((1ull << n) - 1);
    const int mgid = job_idx_ + 1;
    std::ostringstream c;
    // Fresh slot-set state over the job's range (lanes need none: a new use overwrites them).
    for (int i = 2 * slot_base_; i < 2 * (slot_base_ + nslots_); ++i)
      for (const char* r : {"r_seq", "r_bitmap", "r_count"}) c << "register_write ThcIngress." << r << " " << i << " 0\n";
    c << "mc_mgrp_create " << mgid << "\n";
    for (int w = 0; w < n; ++w) c << "mc_node_create " << job_idx_ * 64 + w << " " << 1 + workers_[w].host << "\n";
    const std::string out = run_cli(c.str());
    std::vector<int> handles;
    std::regex re("node was created with handle ([0-9]+)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
      handles.push_back(std::stoi((*it)[1]));
    ASSERT_EQ(handles.size(), workers_.size()) << out;
    std::ostringstream d;
    for (int w = 0; w < n; ++w) {
      const Worker& wk = workers_[w];
      d << "mc_node_associate " << mgid << " " << handles[w] << "\n";
      d << "table_add ThcEgress.replica ThcEgress.to_worker " << job_idx_ * 64 + w << " => " << w << " "
        << wk.sock->ip() << " " << wk.sock->port() << " " << tb.router_mac << " " << mac_of_port_worker(wk.host)
        << "\n";
      // Admission last, as thc-switchd does before it sends the worker's JOIN_ACK.
      d << "table_add ThcIngress.admit ThcIngress.admit_worker " << id_.job << " " << w << " " << wk.sock->ip() << " "
        << wk.sock->port() << " => " << job_idx_ << " " << slot_base_ << " " << nslots_ << " " << n << " " << all
        << " " << mgid << "\n";
    }
    run_cli(d.str());
  }

  // T[z] into r_lut, then lut_meta (the entry that makes the table usable) last.
  void install_tables(const std::vector<TableInstall>& ts) {
    std::ostringstream c;
    for (const auto& t : ts) {
      write_lut(c, t);
      c << "table_add ThcIngress.lut_meta ThcIngress.lut_ok " << job_idx_ << " " << t.tid << " => " << t.bits << " "
        << static_cast<int>(t.sum) << "\n";
    }
    const std::string out = run_cli(c.str());
    std::regex re("Entry has been added with handle ([0-9]+)");
    size_t k = 0;
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it, ++k)
      if (k < ts.size()) lut_handles_[ts[k].tid] = std::stoi((*it)[1]);
    EXPECT_EQ(k, ts.size()) << out;
  }

  // A client re-installs an id it used before (TABLE): thc-switchd rewrites T and modifies the
  // lut_meta entry in place (CONTRACT.md).
  void reinstall_table(const TableInstall& t) {
    ASSERT_EQ(lut_handles_.count(t.tid), 1u);
    std::ostringstream c;
    write_lut(c, t);
    c << "table_modify ThcIngress.lut_meta ThcIngress.lut_ok " << lut_handles_[t.tid] << " => " << t.bits << " "
      << static_cast<int>(t.sum) << "\n";
    run_cli(c.str());
  }
  void remove_table(int tid) {
    ASSERT_EQ(lut_handles_.count(tid), 1u);
    run_cli("table_delete ThcIngress.lut_meta " + std::to_string(lut_handles_[tid]) + "\n");
    lut_handles_.erase(tid);
  }

  int n() const { return static_cast<int>(workers_.size()); }
  int nslots() const { return nslots_; }
  int job_idx() const { return job_idx_; }
  const proto::JobId& id() const { return id_; }
  const Worker& worker(int w) const { return workers_[static_cast<size_t>(w)]; }
  uint64_t all_mask() const { return n() == 64 ? ~0ull : ((1ull << n()) - 1); }

  void send(int w, const std::vector<uint8_t>& p, uint16_t port = kServicePort) const {
    worker(w).sock->send(p, tb.switch_ip, port);
  }

  std::vector<uint8_t> values(int w, uint64_t seq, uint32_t op, proto::WireInt enc, const std::vector<uint32_t>& v,
                              proto::MsgType type = proto::MsgType::kDataValue) const {
    return proto::make_values(id_, static_cast<uint16_t>(w), static_cast<uint32_t>(nslots_), seq, op, enc, v, type);
  }
  std::vector<uint8_t> indices(int w, uint64_t seq, uint32_t op, const TableInstall& t,
                               const std::vector<uint8_t>& codes) const {
    return proto::make_indices(id_, static_cast<uint16_t>(w), static_cast<uint32_t>(nslots_), seq, op, t.sum, t.bits,
                               static_cast<uint32_t>(t.tid), codes);
  }

 private:
  void write_lut(std::ostringstream& c, const TableInstall& t) const {
    for (size_t z = 0; z < t.values.size(); ++z)
      c << "register_write ThcIngress.r_lut " << job_idx_ * 1024 + t.tid * 256 + static_cast<int>(z) << " "
        << static_cast<uint32_t>(t.values[z]) << "\n";
  }

  proto::JobId id_;
  int job_idx_, slot_base_, nslots_;
  std::vector<Worker> workers_;
  std::map<int, int> lut_handles_;  // table id -> lut_meta entry handle
};

// What a RESULT for packet (seq, op) of job j must say, to worker w.
struct Expect {
  uint64_t seq;
  uint32_t op;
  proto::WireInt enc;
  uint16_t count;
  std::vector<uint32_t> sums;  // 256 lanes, low bits of the type
};

void check_result(const SwitchJob& j, int w, const Datagram& d, const Expect& e) {
  SCOPED_TRACE("worker " + std::to_string(w) + " seq " + std::to_string(e.seq));
  proto::Header h;
  const uint8_t* pl = nullptr;
  size_t pl_len = 0;
  ASSERT_EQ(proto::parse(d.bytes.data(), d.bytes.size(), &h, &pl, &pl_len), proto::ParseError::kOk);
  EXPECT_EQ(d.src_ip, tb.switch_ip);
  EXPECT_EQ(d.src_port, kServicePort);
  EXPECT_EQ(h.type, proto::MsgType::kResult);
  EXPECT_EQ(h.job, j.id().job);
  EXPECT_EQ(h.worker, w);
  EXPECT_EQ(h.nworkers, j.n());
  EXPECT_EQ(h.seq, e.seq);
  EXPECT_EQ(h.op, e.op);
  EXPECT_EQ(h.slot, e.seq % static_cast<uint64_t>(j.nslots()));
  EXPECT_EQ(h.shadow, (e.seq / static_cast<uint64_t>(j.nslots())) & 1);
  EXPECT_EQ(h.lanes, kLanes);
  EXPECT_EQ(h.enc, e.enc);
  EXPECT_EQ(h.count, e.count);
  EXPECT_EQ(h.contributors, j.n());
  EXPECT_EQ(h.bitmap, j.all_mask());
  EXPECT_EQ(h.flags, 0);
  EXPECT_EQ(h.shard, 0);
  EXPECT_EQ(h.tag, 0u);
  ASSERT_EQ(pl_len, proto::data_payload_bytes(proto::MsgType::kResult, e.enc, 0, kLanes));
  int wrong = 0;
  for (int i = 0; i < kLanes; ++i) {
    const uint32_t got = proto::load_lane(e.enc, pl, i);
    if (got != e.sums[static_cast<size_t>(i)] && ++wrong <= 4)
      ADD_FAILURE() << "lane " << i << ": got " << got << ", want " << e.sums[static_cast<size_t>(i)];
  }
  EXPECT_EQ(wrong, 0);
}

// The next datagram worker w receives must be the RESULT e.
void expect_result(const SwitchJob& j, int w, const Expect& e) {
  const auto d = j.worker(w).sock->recv(kReplyTimeoutMs);
  ASSERT_TRUE(d.has_value()) << "worker " << w << ": no RESULT for seq " << e.seq;
  check_result(j, w, *d, e);
}
void expect_result_all(const SwitchJob& j, const Expect& e) {
  for (int w = 0; w < j.n(); ++w) expect_result(j, w, e);
}

uint32_t truncate(proto::WireInt t, uint64_t v) {
  switch (proto::wire_int_bytes(t)) {
    case 1: return static_cast<uint32_t>(v & 0xff);
    case 2: return static_cast<uint32_t>(v & 0xffff);
    default: return static_cast<uint32_t>(v);
  }
}

// Random lane values of type t (full width, so sums wrap), fixed seed per call site.
std::vector<uint32_t> random_lanes(std::mt19937& rng, proto::WireInt t, int count) {
  std::vector<uint32_t> v(static_cast<size_t>(count));
  for (auto& x : v) x = truncate(t, rng());
  return v;
}

Expect sum_of(const std::vector<std::vector<uint32_t>>& contrib, proto::WireInt enc, uint64_t seq, uint32_t op) {
  Expect e{seq, op, enc, static_cast<uint16_t>(contrib[0].size()), std::vector<uint32_t>(kLanes, 0)};
  for (int i = 0; i < kLanes; ++i) {
    uint32_t s = 0;  // modulo 2^32, as the registers
    for (const auto& c : contrib) s += static_cast<size_t>(i) < c.size() ? c[static_cast<size_t>(i)] : 0;
    e.sums[static_cast<size_t>(i)] = truncate(enc, s);
  }
  return e;
}

// Barrier: worker w retransmits `last` (a packet of a completed set that still holds it, attempt
// `attempt`); the next datagram it receives must be the stored result, to it alone.
void barrier(const SwitchJob& j, int w, const std::vector<uint8_t>& last, uint16_t attempt, const Expect& e) {
  j.send(w, proto::as_resend(last, attempt, j.id()));
  expect_result(j, w, e);
}

// ---- fixture: the switch's static configuration, as thc-switchd installs it at start ------------

class P4DataPlane : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ostringstream c;
    c << "table_add ThcIngress.ipv4_fwd ThcIngress.forward " << tb.switch_ip << " => " << tb.cpu_port << " "
      << tb.router_mac << " " << tb.cpu_mac << "\n";
    for (size_t h = 0; h < tb.ns_w.size(); ++h)
      c << "table_add ThcIngress.ipv4_fwd ThcIngress.forward " << tb.worker_ips[h] << " => " << 1 + h << " "
        << tb.router_mac << " " << tb.worker_macs[h] << "\n";
    c << "table_add ThcIngress.ipv4_fwd ThcIngress.forward " << tb.stranger_ip << " => 1 " << tb.router_mac << " "
      << tb.worker_macs[0] << "\n";
    c << "table_add ThcIngress.thc_service ThcIngress.thc_here " << tb.switch_ip << " " << kServicePort << " =>\n";
    run_cli(c.str());
  }
};

const proto::WireInt kAllEncs[] = {proto::WireInt::kU8, proto::WireInt::kU16, proto::WireInt::kU32,
                                   proto::WireInt::kI8, proto::WireInt::kI16, proto::WireInt::kI32};

// Job index 0 (so worker 0's replica has rid 0), three workers on hosts 0..2, slots 0..7.
TEST_F(P4DataPlane, ValueSumsForEveryEncoding) {
  SwitchJob j(101, 0, 0, 8, {0, 1, 2}, 41000);
  j.install();
  std::mt19937 rng(11);
  uint64_t seq = 0;
  Expect last{};
  std::vector<std::vector<uint8_t>> last_pkt(3);
  const Counters k0 = read_counters({0});
  for (const auto enc : kAllEncs) {
    for (int count : {kLanes, 77}) {  // a full packet and the zero-padded last packet of an op
      SCOPED_TRACE(std::string(proto::wire_int_name(enc)) + " count " + std::to_string(count));
      std::vector<std::vector<uint32_t>> contrib;
      for (int w = 0; w < j.n(); ++w) contrib.push_back(random_lanes(rng, enc, count));
      if (count == kLanes) contrib[0][0] = contrib[1][0] = contrib[2][0] = truncate(enc, 0xffffffffu);  // wraps
      const uint32_t op = static_cast<uint32_t>(seq / 2);
      for (int w = 0; w < j.n(); ++w) {
        last_pkt[w] = j.values(w, seq, op, enc, contrib[static_cast<size_t>(w)]);
        j.send(w, last_pkt[w]);
      }
      last = sum_of(contrib, enc, seq, op);
      expect_result_all(j, last);
      ++seq;
    }
  }
  const Counters k1 = read_counters({0});
  EXPECT_EQ(k1.rx(0) - k0.rx(0), 3 * seq);
  EXPECT_EQ(k1.results(0) - k0.results(0), seq);
  // Nothing else was sent to anybody.
  for (int w = 0; w < j.n(); ++w) barrier(j, w, last_pkt[w], 1, last);
}


// Index form: each worker's b-bit codes are looked up in the job's table (r_lut, lut_meta) and the
// values added; b = 1, 2, 4, 8 with the 8- and 16-bit sum types (BMv2 takes no 32-bit sums in the
// index form: RefusedDatagramsHaveNoEffect), and the padded lanes of a short last packet add T[0].
TEST_F(P4DataPlane, IndexLookupForEveryWidth) {
  SwitchJob j(102, 1, 8, 8, {0, 1, 2, 3}, 41100);
  j.install();
  std::mt19937 rng(12);
  std::vector<TableInstall> tables;
  const int widths[] = {1, 2, 4, 8};
  const proto::WireInt sums[] = {proto::WireInt::kI16, proto::WireInt::kU16, proto::WireInt::kU8,
                                 proto::WireInt::kI8};
  for (int t = 0; t < 4; ++t) {
    TableInstall ti{t, widths[t], sums[t], {}};
    for (int z = 0; z < (1 << widths[t]); ++z) ti.values.push_back(static_cast<int32_t>(rng()));  // negatives too
    if (t == 2)  // a THC table (b = 4, g = 30): T[z] in 0..30, symmetric
      for (int z = 0; z < 16; ++z) ti.values[static_cast<size_t>(z)] = z < 8 ? 2 * z : 30 - 2 * (15 - z);
    tables.push_back(ti);
  }
  j.install_tables(tables);
  uint64_t seq = 0;
  std::vector<std::vector<uint8_t>> last(4);
  Expect e{};
  for (const auto& t : tables) {
    for (int count : {kLanes, 100}) {
      SCOPED_TRACE("b " + std::to_string(t.bits) + " count " + std::to_string(count));
      std::vector<std::vector<uint32_t>> contrib;  // T[z] per lane, 256 lanes (padding: z = 0)
      for (int w = 0; w < j.n(); ++w) {
        std::vector<uint8_t> codes(static_cast<size_t>(count));
        for (auto& c : codes) c = static_cast<uint8_t>(rng() & ((1u << t.bits) - 1));
        std::vector<uint32_t> v(kLanes, static_cast<uint32_t>(t.values[0]));
        for (int i = 0; i < count; ++i) v[static_cast<size_t>(i)] = static_cast<uint32_t>(t.values[codes[static_cast<size_t>(i)]]);
        contrib.push_back(v);
        last[static_cast<size_t>(w)] = j.indices(w, seq, static_cast<uint32_t>(seq), t, codes);
        j.send(w, last[static_cast<size_t>(w)]);
      }
      e = sum_of(contrib, t.sum, seq, static_cast<uint32_t>(seq));
      e.count = static_cast<uint16_t>(count);
      expect_result_all(j, e);
      ++seq;
    }
  }
  for (int w = 0; w < j.n(); ++w) barrier(j, w, last[static_cast<size_t>(w)], 1, e);
}

// The MAX prelude: lane-wise maximum of u32 values.
TEST_F(P4DataPlane, MaxPrelude) {
  SwitchJob j(103, 2, 16, 8, {1, 3}, 41200);
  j.install();
  std::mt19937 rng(13);
  Expect e{};
  std::vector<std::vector<uint8_t>> last(2);
  for (uint64_t seq = 0; seq < 3; ++seq) {
    const int count = seq == 2 ? 64 : kLanes;
    std::vector<std::vector<uint32_t>> v(2);
    for (auto& x : v) x = random_lanes(rng, proto::WireInt::kU32, count);
    v[0][0] = 0xffffffffu;  // unsigned: the largest u32 wins over anything
    v[1][1] = 0x80000000u;
    v[0][1] = 0x7fffffffu;
    e = Expect{seq, 0, proto::WireInt::kU32, static_cast<uint16_t>(count), std::vector<uint32_t>(kLanes, 0)};
    for (int i = 0; i < count; ++i) e.sums[static_cast<size_t>(i)] = std::max(v[0][static_cast<size_t>(i)], v[1][static_cast<size_t>(i)]);
    for (int w = 0; w < 2; ++w) {
      last[static_cast<size_t>(w)] = j.values(w, seq, 0, proto::WireInt::kU32, v[static_cast<size_t>(w)], proto::MsgType::kDataMax);
      j.send(w, last[static_cast<size_t>(w)]);
    }
    expect_result_all(j, e);
  }
  for (int w = 0; w < 2; ++w) barrier(j, w, last[static_cast<size_t>(w)], 1, e);
}

// A retransmission before completion is not added twice; one after completion is answered with
// the stored result, to its sender alone.
TEST_F(P4DataPlane, Retransmissions) {
  SwitchJob j(104, 3, 24, 8, {0, 1, 2}, 41300);
  j.install();
  std::mt19937 rng(14);
  const auto enc = proto::WireInt::kU16;
  std::vector<std::vector<uint32_t>> v(3);
  for (auto& x : v) x = random_lanes(rng, enc, kLanes);
  std::vector<std::vector<uint8_t>> p(3);
  for (int w = 0; w < 3; ++w) p[static_cast<size_t>(w)] = j.values(w, 5, 2, enc, v[static_cast<size_t>(w)]);
  const Counters k0 = read_counters({3});
  const uint64_t dup0 = k0.drop(kDuplicate);

  j.send(0, p[0]);
  j.send(0, proto::as_resend(p[0], 1, j.id()));  // the set is open: dropped, not added
  j.send(0, p[0]);                               // a plain duplicate of the first
  EXPECT_EQ(wait_drops(kDuplicate, dup0 + 2), dup0 + 2);
  j.send(1, p[1]);
  j.send(2, p[2]);
  const Expect e = sum_of(v, enc, 5, 2);
  expect_result_all(j, e);

  // Worker 1 lost its result: the stored one comes back to it alone.
  j.send(1, proto::as_resend(p[1], 1, j.id()));
  expect_result(j, 1, e);
  // Nobody else got a copy: their next datagrams are the answers to their own retransmissions.
  barrier(j, 0, p[0], 1, e);
  barrier(j, 2, p[2], 1, e);
  EXPECT_EQ(read_counters({3}).results(3) - k0.results(3), 4u);  // one group send + three answers
}

// A table id re-installed (another b, sum type and values) or removed after its sets completed:
// a retransmission to such a complete set still gets the stored result (CONTRACT.md, lut_meta: a
// client recycles a table id once its own ops completed, while another worker whose RESULT was
// lost may still retransmit). A packet that would add under the old table is refused and opens
// nothing; the new table adds as installed.
TEST_F(P4DataPlane, RetransmissionAfterTableReinstall) {
  const int S = 4;
  SwitchJob j(110, 8, 64, S, {0, 1, 2}, 42000);
  j.install();
  std::mt19937 rng(18);
  auto table = [&](int tid, int bits, proto::WireInt sum) {
    TableInstall t{tid, bits, sum, {}};
    for (int z = 0; z < (1 << bits); ++z) t.values.push_back(static_cast<int32_t>(rng()));
    return t;
  };
  const TableInstall t0 = table(0, 4, proto::WireInt::kU8), t1 = table(1, 2, proto::WireInt::kU16);
  j.install_tables({t0, t1});
  // Every worker sends seq with table t; the RESULT reaches them all. Returns it and the packets.
  auto run_op = [&](uint64_t seq, const TableInstall& t, std::vector<std::vector<uint8_t>>* pkts) {
    std::vector<std::vector<uint32_t>> contrib;
    pkts->assign(static_cast<size_t>(j.n()), {});
    for (int w = 0; w < j.n(); ++w) {
      std::vector<uint8_t> codes(kLanes);
      for (auto& c : codes) c = static_cast<uint8_t>(rng() & ((1u << t.bits) - 1));
      std::vector<uint32_t> v(kLanes);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint32_t>(t.values[codes[i]]);
      contrib.push_back(v);
      (*pkts)[static_cast<size_t>(w)] = j.indices(w, seq, static_cast<uint32_t>(seq), t, codes);
      j.send(w, (*pkts)[static_cast<size_t>(w)]);
    }
    const Expect e = sum_of(contrib, t.sum, seq, static_cast<uint32_t>(seq));
    expect_result_all(j, e);
    return e;
  };
  std::vector<std::vector<uint8_t>> p0, p1, p2s;
  const Expect e0 = run_op(0, t0, &p0);  // slot 0, shadow 0
  const Expect e1 = run_op(1, t1, &p1);  // slot 1, shadow 0
  const Counters k0 = read_counters({8});

  // Table id 0 now holds another table (b 8, i16); id 1 is gone.
  const TableInstall t0b = table(0, 8, proto::WireInt::kI16);
  j.reinstall_table(t0b);
  j.remove_table(1);

  // Workers 1 and 2 lost their RESULTs: the stored ones come back, whatever lut_meta says now.
  j.send(1, proto::as_resend(p0[1], 1, j.id()));
  j.send(2, proto::as_resend(p1[2], 1, j.id()));
  expect_result(j, 1, e0);
  expect_result(j, 2, e1);

  // Worker 0 with the old table for seq 2S (the set of seq 0): refused, the set not reopened ...
  j.send(0, j.indices(0, 2 * S, 2 * S, t0, std::vector<uint8_t>(kLanes, 1)));
  EXPECT_EQ(wait_drops(kNoTable, k0.drop(kNoTable) + 1), k0.drop(kNoTable) + 1);
  // ... it still answers for seq 0.
  j.send(1, proto::as_resend(p0[1], 2, j.id()));
  expect_result(j, 1, e0);

  // The new table adds as installed, in the same set.
  const Expect e2s = run_op(2 * S, t0b, &p2s);
  const Counters k1 = read_counters({8});
  EXPECT_EQ(k1.drop(kNoTable) - k0.drop(kNoTable), 1u);
  EXPECT_EQ(k1.rx(8) - k0.rx(8), 3u + 3u);          // three answers, three contributions
  EXPECT_EQ(k1.results(8) - k0.results(8), 3u + 1u);  // three answers, one group send
  for (int w = 0; w < j.n(); ++w) barrier(j, w, p2s[static_cast<size_t>(w)], 1, e2s);
}

// Two shadow sets per slot: seq and seq + S use different sets, seq + 2S reuses the first (its
// result is its own sum, not added to the old one), and the old seq is then stale. Also across
// the wrap of the low 32 bits of seq (the registers hold them + 1).
TEST_F(P4DataPlane, ShadowSetsReuseAndStale) {
  const int S = 4;
  SwitchJob j(105, 4, 32, S, {2, 3}, 41400);
  j.install();
  std::mt19937 rng(15);
  const auto enc = proto::WireInt::kI32;
  auto contrib = [&] {
    std::vector<std::vector<uint32_t>> v(2);
    for (auto& x : v) x = random_lanes(rng, enc, kLanes);
    return v;
  };
  for (const uint64_t base : {uint64_t{1}, (uint64_t{1} << 32) - 7}) {
    SCOPED_TRACE("first seq " + std::to_string(base));
    const uint64_t s0 = base, s1 = base + S, s2 = base + 2 * S;
    const auto a = contrib(), b = contrib(), c = contrib();
    auto set_of = [&](uint64_t seq) { return 2 * (32 + static_cast<int>(seq % S)) + static_cast<int>((seq / S) & 1); };
    if (base > S) {
      // A job does not jump 2^32 packets ahead: make both sets of the slot look as if they had
      // held s0 - 2S and s1 - 2S (completed), the state a job reaches after 2^32 - 7 packets.
      std::ostringstream cmd;
      for (const uint64_t s : {s0, s1})
        cmd << "register_write ThcIngress.r_seq " << set_of(s) << " " << static_cast<uint32_t>(s - 2 * S + 1) << "\n"
            << "register_write ThcIngress.r_bitmap " << set_of(s) << " 3\n"
            << "register_write ThcIngress.r_count " << set_of(s) << " 2\n";
      run_cli(cmd.str());
    }
    std::vector<uint8_t> a1 = j.values(1, s0, 0, enc, a[1]);
    // seq s0: complete.
    j.send(0, j.values(0, s0, 0, enc, a[0]));
    j.send(1, a1);
    const Expect ea = sum_of(a, enc, s0, 0);
    expect_result_all(j, ea);
    // seq s0 + S (the other shadow set of the same slot): worker 0 only, so far.
    j.send(0, j.values(0, s1, 0, enc, b[0]));
    // The first set still answers for s0.
    j.send(1, proto::as_resend(a1, 1, j.id()));
    expect_result(j, 1, ea);
    j.send(1, j.values(1, s1, 0, enc, b[1]));
    expect_result_all(j, sum_of(b, enc, s1, 0));
    // seq s0 + 2S reopens the first set: its result is c alone.
    std::vector<uint8_t> c0 = j.values(0, s2, 1, enc, c[0]);
    j.send(0, c0);
    j.send(1, j.values(1, s2, 1, enc, c[1]));
    const Expect ec = sum_of(c, enc, s2, 1);
    expect_result_all(j, ec);
    // s0 again (a delayed copy): stale, dropped without an answer.
    const uint64_t stale0 = read_counters().drop(kStale);
    j.send(1, proto::as_resend(a1, 2, j.id()));
    EXPECT_EQ(wait_drops(kStale, stale0 + 1), stale0 + 1);
    barrier(j, 1, j.values(1, s2, 1, enc, c[1]), 1, ec);
    barrier(j, 0, c0, 1, ec);
    // The register holds the low 32 bits of s2, plus one.
    const std::string out = run_cli("register_read ThcIngress.r_seq " + std::to_string(set_of(s2)) + "\n");
    EXPECT_NE(out.find("= " + std::to_string(static_cast<uint32_t>(s2) + 1)), std::string::npos) << out;
  }
}

// Datagrams the job must not take: from an address or port not admitted, with the wrong
// nworkers, a slot beyond the job's range, another shard or lane count, a broken wire rule, an
// index width the data plane does not parse, or a table not installed. None changes the result;
// each is counted under its reason.
TEST_F(P4DataPlane, RefusedDatagramsHaveNoEffect) {
  SwitchJob j(106, 5, 40, 8, {2, 3}, 41500);
  j.install();
  std::mt19937 rng(16);
  const auto enc = proto::WireInt::kU32;
  std::vector<std::vector<uint32_t>> v(2);
  for (auto& x : v) x = random_lanes(rng, enc, kLanes);
  const std::vector<uint32_t> junk(kLanes, 0x01010101u);
  const Counters k0 = read_counters({5});

  j.send(0, j.values(0, 3, 0, enc, v[0]));
  // A stranger: worker 1's packet from another address (host 0's second address), and from
  // worker 1's address but another port.
  UdpSocket other_ip(tb.ns_w[0], tb.stranger_ip, j.worker(1).sock->port());
  UdpSocket other_port(tb.ns_w[3], tb.worker_ips[3], 41599);
  other_ip.send(j.values(1, 3, 0, enc, junk), tb.switch_ip, kServicePort);
  other_port.send(j.values(1, 3, 0, enc, junk), tb.switch_ip, kServicePort);
  // Worker 1 itself, with packets the data plane refuses.
  proto::JobId wrong_n = j.id();
  wrong_n.nworkers = 3;
  j.send(1, proto::make_values(wrong_n, 1, 8, 3, 0, enc, junk));
  j.send(1, proto::make_values(j.id(), 1, 16, 11, 0, enc, junk));  // slot 11 >= 8
  proto::JobId shard1 = j.id();
  shard1.shard = 1;
  j.send(1, proto::make_values(shard1, 1, 8, 3, 0, enc, junk));
  j.send(1, proto::make_values(j.id(), 1, 8, 3, 0, enc, std::vector<uint32_t>(64, 1), proto::MsgType::kDataValue,
                               64));  // 64 lanes
  std::vector<uint8_t> bad = j.values(1, 3, 0, enc, junk);
  bad.pop_back();  // one byte short
  j.send(1, bad);
  bad = j.values(1, 3, 0, enc, junk);
  proto::store_be16(bad.data() + 6, proto::kFlagRetransmit);  // RETRANSMIT with attempt 0
  j.send(1, bad);
  bad = j.values(1, 3, 0, enc, junk);
  bad[48] = 1;  // bitmap set upstream
  j.send(1, bad);
  TableInstall b3{0, 3, proto::WireInt::kU8, {}};
  j.send(1, j.indices(1, 3, 0, b3, std::vector<uint8_t>(kLanes, 1)));  // b = 3: not parsed
  TableInstall b4{0, 4, proto::WireInt::kU8, {}};
  j.send(1, j.indices(1, 3, 0, b4, std::vector<uint8_t>(kLanes, 1)));  // no table installed
  // A table with a 32-bit sum type, as a control plane that ignored CONTRACT.md would install it:
  // simple_switch could not grow 128 bytes of indices into 1024 bytes of sums, so the packet is
  // refused before anything else.
  TableInstall u32{1, 4, proto::WireInt::kU32, std::vector<int32_t>(16, 1)};
  j.install_tables({u32});
  j.send(1, j.indices(1, 3, 0, u32, std::vector<uint8_t>(kLanes, 1)));
  // Then worker 1's real contribution (after the stranger on another port was handled): the result
  // is exactly v0 + v1.
  EXPECT_EQ(wait_drops(kNotAdmitted, k0.drop(kNotAdmitted) + 2), k0.drop(kNotAdmitted) + 2);
  std::vector<uint8_t> p1 = j.values(1, 3, 0, enc, v[1]);
  j.send(1, p1);
  const Expect e = sum_of(v, enc, 3, 0);
  expect_result_all(j, e);

  std::map<int, uint64_t> want = {{kNotAdmitted, 2}, {kBadFormat, 3}, {kBadSlot, 1}, {kBadNworkers, 1},
                                  {kBadShape, 2},    {kNoTable, 1},   {kUnsupported, 2}, {kStale, 0},
                                  {kDuplicate, 0}};
  const Counters k1 = read_counters({5});
  for (const auto& [r, n] : want) EXPECT_EQ(k1.drop(static_cast<Drop>(r)) - k0.drop(static_cast<Drop>(r)), n) << "drop reason " << r;
  EXPECT_EQ(k1.rx(5) - k0.rx(5), 2u);
  barrier(j, 1, p1, 1, e);
  EXPECT_EQ(other_ip.pending() + other_port.pending(), 0u);
}

// Two jobs at once on the same slot numbers (other slot ranges, other multicast groups), their
// packets interleaved; a worker of one job cannot contribute to the other.
TEST_F(P4DataPlane, TwoJobsDoNotDisturbEachOther) {
  SwitchJob x(107, 6, 48, 8, {0, 1, 2}, 41600);
  SwitchJob y(108, 7, 56, 8, {1, 3}, 41700);
  x.install();
  y.install();
  std::mt19937 rng(17);
  const Counters k0 = read_counters({6, 7});
  Expect ex{}, ey{};
  std::vector<std::vector<uint8_t>> lx(3), ly(2);
  for (uint64_t seq = 0; seq < 6; ++seq) {
    std::vector<std::vector<uint32_t>> vx(3), vy(2);
    for (auto& v : vx) v = random_lanes(rng, proto::WireInt::kU8, kLanes);
    for (auto& v : vy) v = random_lanes(rng, proto::WireInt::kU16, kLanes);
    for (int w = 0; w < 3; ++w) {
      lx[static_cast<size_t>(w)] = x.values(w, seq, 0, proto::WireInt::kU8, vx[static_cast<size_t>(w)]);
      x.send(w, lx[static_cast<size_t>(w)]);
      if (w < 2) {
        ly[static_cast<size_t>(w)] = y.values(w, seq, 0, proto::WireInt::kU16, vy[static_cast<size_t>(w)]);
        y.send(w, ly[static_cast<size_t>(w)]);
      }
    }
    // Job y's worker 0 claims to be job x's worker 1: not admitted (x's entry has another address).
    y.send(0, x.values(1, seq, 0, proto::WireInt::kU8, vx[1]));
    ex = sum_of(vx, proto::WireInt::kU8, seq, 0);
    ey = sum_of(vy, proto::WireInt::kU16, seq, 0);
    expect_result_all(x, ex);
    expect_result_all(y, ey);
  }
  EXPECT_EQ(wait_drops(kNotAdmitted, k0.drop(kNotAdmitted) + 6), k0.drop(kNotAdmitted) + 6);
  const Counters k1 = read_counters({6, 7});
  EXPECT_EQ(k1.rx(6) - k0.rx(6), 18u);
  EXPECT_EQ(k1.rx(7) - k0.rx(7), 12u);
  EXPECT_EQ(k1.results(6) - k0.results(6), 6u);
  EXPECT_EQ(k1.results(7) - k0.results(7), 6u);
  for (int w = 0; w < 3; ++w) barrier(x, w, lx[static_cast<size_t>(w)], 1, ex);
  for (int w = 0; w < 2; ++w) barrier(y, w, ly[static_cast<size_t>(w)], 1, ey);
}

// Everything to the service that is not a data packet (JOIN, TABLE, LEAVE, STATS, a RESULT, a
// wrong magic) and data packets to another port go to the CPU port byte for byte, where
// thc-switchd's socket holds the switch IP; its answers reach the workers.
TEST_F(P4DataPlane, ControlPathGoesToTheCpuPortUnchanged) {
  UdpSocket cpu(tb.ns_cpu, tb.switch_ip, kServicePort);
  UdpSocket cpu_other(tb.ns_cpu, tb.switch_ip, kServicePort + 1);
  UdpSocket worker(tb.ns_w[2], tb.worker_ips[2], 41800);
  const proto::JobId id = [] {
    proto::JobId j = proto::JobId::make(fixed_key(7, 1234), 109, 2);
    j.with_seed(99);
    return j;
  }();
  proto::TableSpec t;
  t.id = 1;
  t.bits = 4;
  t.sum = proto::WireInt::kU8;
  for (int z = 0; z < 16; ++z) t.values[z] = 2 * z;
  proto::JoinParams jp;
  jp.table = &t;
  std::vector<std::vector<uint8_t>> msgs = {
      proto::make_join(id, 0, jp), proto::make_table(id, 0, t), proto::make_leave(id, 0),
      proto::make_stats(12345, nullptr)};
  std::vector<uint8_t> res = proto::make_values(id, 0, 8, 0, 0, proto::WireInt::kU8, std::vector<uint32_t>(10, 1));
  res[5] = static_cast<uint8_t>(proto::MsgType::kResult);
  msgs.push_back(res);
  std::vector<uint8_t> magic = proto::make_values(id, 0, 8, 0, 0, proto::WireInt::kU8, std::vector<uint32_t>(10, 1));
  magic[0] ^= 0xff;
  msgs.push_back(magic);
  for (const auto& m : msgs) {
    worker.send(m, tb.switch_ip, kServicePort);
    const auto d = cpu.recv(kReplyTimeoutMs);
    ASSERT_TRUE(d.has_value()) << "message of type " << int(m[5]) << " did not reach the CPU port";
    EXPECT_EQ(d->bytes, m);
    EXPECT_EQ(d->src_ip, worker.ip());
    EXPECT_EQ(d->src_port, worker.port());
  }
  // A data packet for another port of the switch IP is not the service's.
  const std::vector<uint8_t> data = proto::make_values(id, 0, 8, 0, 0, proto::WireInt::kU8, std::vector<uint32_t>(10, 1));
  worker.send(data, tb.switch_ip, kServicePort + 1);
  const auto d = cpu_other.recv(kReplyTimeoutMs);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->bytes, data);
  // thc-switchd's replies (here: the JOIN's bytes back) reach the worker through ipv4_fwd.
  cpu.send(msgs[0], worker.ip(), worker.port());
  const auto back = worker.recv(kReplyTimeoutMs);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->bytes, msgs[0]);
  EXPECT_EQ(back->src_ip, tb.switch_ip);
  EXPECT_EQ(back->src_port, kServicePort);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!tb.load()) {
    std::printf("SKIP: no BMv2 testbed in the environment (run through tests/switch_offload/p4/bmv2_testbed.sh)\n");
    return 77;
  }
  auth::ensure_init();
  return RUN_ALL_TESTS();
}
