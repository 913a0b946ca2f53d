#include "transport/switch_client/dpdk/dpdk_channel.h"

#include <arpa/inet.h>
#include <sched.h>
#include <time.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>
#include <vector>

#include "common/status.h"
#include "common/net.h"
#include "switch_offload/protocol/wire.h"
#include "switch_offload/servers/dpdk/frames.h"

namespace thc::transport {

namespace proto = switch_offload::proto;
namespace {

namespace frames = switch_offload::frames;
using thc::mono_us;

constexpr uint16_t kBurst = 32;

std::string errstr(int rc) { return rte_strerror(rc < 0 ? -rc : rc); }

std::string ip_str(uint32_t ip) {
  in_addr a{htonl(ip)};
  char b[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a, b, sizeof b);
  return b;
}

std::string mac_str(const frames::Mac& m) {
  char b[24];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

// "A.B.C.D[:PORT]" (port optional when allow_no_port).
bool parse_ip_port(const std::string& s, bool allow_no_port, uint32_t* ip, int* port) {
  const size_t colon = s.find(':');
  const std::string host = s.substr(0, colon);
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) != 1) return false;
  *ip = ntohl(a.s_addr);
  *port = -1;
  if (colon == std::string::npos) return allow_no_port;
  const std::string p = s.substr(colon + 1);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  *port = std::stoi(p);
  return *port <= 65535;
}

void sleep_us(long us) {
  timespec ts{0, us * 1000};
  nanosleep(&ts, nullptr);
}

// The process's EAL and port, set up by the first channel.
struct Process {
  std::mutex mu;
  bool eal_ready = false;
  std::string eal_error;            // a failed rte_eal_init cannot be retried
  std::vector<std::string> argv_s;  // kept alive: EAL may keep pointers into argv
  std::vector<char*> argv;
  int port = -1;
  rte_mempool* pool = nullptr;
  frames::Mac mac{};
  bool channel_open = false;
};
Process& proc() {
  static Process* p = new Process();  // never destroyed: EAL outlives static destructors
  return *p;
}

bool has_arg(const std::vector<std::string>& a, std::initializer_list<const char*> names) {
  for (const std::string& s : a)
    for (const char* n : names) {
      const size_t l = std::strlen(n);
      if (s.compare(0, l, n) == 0 && (s.size() == l || s[l] == '=' || (l == 2 && n[0] == '-' && n[1] != '-'))) return true;
    }
  return false;
}

// "--lcores=0@(a,b,...)": EAL's main lcore on the CPUs this thread may already run on, so that
// initialising DPDK does not pin an MPI rank to core 0.
std::string lcores_of_this_thread() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "--lcores=0";
  std::ostringstream o;
  o << "--lcores=0@(";
  bool first = true;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) {
      o << (first ? "" : ",") << c;
      first = false;
    }
  o << ")";
  return first ? "--lcores=0" : o.str();
}

void init_eal(Process& p, const std::string& eal_args) {
  if (p.eal_ready) return;
  if (!p.eal_error.empty()) fail(Status::kTransport, p.eal_error);
  std::vector<std::string> a{"thc"};
  std::istringstream in(eal_args);
  for (std::string w; in >> w;) a.push_back(w);
  // Several worker processes on one machine must not share EAL runtime files: without a
  // --file-prefix of the user's, keep no shared configuration (--in-memory, or --no-shconf where
  // --no-huge forbids --in-memory) under a prefix of ours.
  if (!has_arg(a, {"--file-prefix", "--in-memory", "--no-shconf"})) {
    a.push_back(has_arg(a, {"--no-huge"}) ? "--no-shconf" : "--in-memory");
    a.push_back("--file-prefix=thc-client");
  }
  if (!has_arg(a, {"-l", "-c", "--lcores"})) a.push_back(lcores_of_this_thread());
  if (!has_arg(a, {"--log-level"})) a.push_back("--log-level=warning");
  if (!has_arg(a, {"--telemetry", "--no-telemetry"})) a.push_back("--no-telemetry");  // a library, not a daemon
  p.argv_s = a;
  p.argv.clear();
  for (std::string& s : p.argv_s) p.argv.push_back(s.data());
  p.argv.push_back(nullptr);
  const int rc = rte_eal_init(static_cast<int>(p.argv_s.size()), p.argv.data());
  if (rc < 0) {
    std::string joined;
    for (size_t i = 1; i < p.argv_s.size(); ++i) joined += (i > 1 ? " " : "") + p.argv_s[i];
    p.eal_error = "dpdk client: rte_eal_init(" + joined + "): " + errstr(rte_errno) +
                  " (set THC_DPDK_EAL, e.g. \"--no-huge -m 512 --no-pci --vdev=net_af_packet0,iface=eth1\")";
    fail(Status::kTransport, p.eal_error);
  }
  p.eal_ready = true;
}

void setup_port(Process& p, int pid) {
  if (p.port == pid) return;
  if (p.port >= 0)
    fail(Status::kInvalidArgument, "dpdk client: the process already uses DPDK port " + std::to_string(p.port) +
                                       " (THC_DPDK_PORT_ID cannot change within a process)");
  if (pid < 0 || pid >= RTE_MAX_ETHPORTS || !rte_eth_dev_is_valid_port(static_cast<uint16_t>(pid)))
    fail(Status::kInvalidArgument, "dpdk client: no DPDK port " + std::to_string(pid) + " (" +
                                       std::to_string(rte_eth_dev_count_avail()) +
                                       " available; give THC_DPDK_EAL a --vdev or a device)");
  const uint16_t port = static_cast<uint16_t>(pid);
  rte_eth_conf conf{};
  int rc = rte_eth_dev_configure(port, 1, 1, &conf);
  if (rc != 0) fail(Status::kTransport, "dpdk client: rte_eth_dev_configure: " + errstr(rc));
  uint16_t nrxd = 1024, ntxd = 1024;
  rc = rte_eth_dev_adjust_nb_rx_tx_desc(port, &nrxd, &ntxd);
  if (rc != 0) fail(Status::kTransport, "dpdk client: rte_eth_dev_adjust_nb_rx_tx_desc: " + errstr(rc));
  int socket = rte_eth_dev_socket_id(port);
  if (socket < 0) socket = static_cast<int>(rte_socket_id());
  const unsigned nb_mbufs = std::max<unsigned>(2047, 2u * (nrxd + ntxd) + 4u * kBurst);
  p.pool = rte_pktmbuf_pool_create("thc_client_pool", nb_mbufs, 64, 0, RTE_MBUF_DEFAULT_BUF_SIZE, socket);
  if (!p.pool)
    fail(Status::kOutOfMemory, "dpdk client: rte_pktmbuf_pool_create: " + errstr(rte_errno) +
                                   " (give the EAL more memory, e.g. -m 512)");
  rc = rte_eth_rx_queue_setup(port, 0, nrxd, static_cast<unsigned>(socket), nullptr, p.pool);
  if (rc != 0) fail(Status::kTransport, "dpdk client: rte_eth_rx_queue_setup: " + errstr(rc));
  rc = rte_eth_tx_queue_setup(port, 0, ntxd, static_cast<unsigned>(socket), nullptr);
  if (rc != 0) fail(Status::kTransport, "dpdk client: rte_eth_tx_queue_setup: " + errstr(rc));
  rte_ether_addr mac{};
  rc = rte_eth_macaddr_get(port, &mac);
  if (rc != 0) fail(Status::kTransport, "dpdk client: rte_eth_macaddr_get: " + errstr(rc));
  std::memcpy(p.mac.data(), mac.addr_bytes, 6);
  rc = rte_eth_dev_start(port);
  if (rc != 0) fail(Status::kTransport, "dpdk client: rte_eth_dev_start: " + errstr(rc));
  for (int i = 0; i < 200; ++i) {  // up to 2 s for the link
    rte_eth_link link{};
    if (rte_eth_link_get_nowait(port, &link) == 0 && link.link_status == RTE_ETH_LINK_UP) break;
    sleep_us(10000);
  }
  p.port = pid;
}

class DpdkChannel final : public DatagramChannel {
 public:
  DpdkChannel(const std::string& address, const DpdkChannelOptions& opt) {
    const std::string pre = "dpdk://";
    int port = -1;
    if (address.compare(0, pre.size(), pre) != 0 || !parse_ip_port(address.substr(pre.size()), false, &agg_ip_, &port) ||
        port <= 0)
      fail(Status::kInvalidArgument, "dpdk client: aggregator address '" + address + "' is not dpdk://IPv4:PORT");
    agg_port_ = static_cast<uint16_t>(port);
    uint32_t ip = 0;
    int lport = -1;
    // "A.B.C.D+" (one setting for every rank of an mpirun): A.B.C.D + rank.
    std::string local = opt.local;
    const bool plus_rank = !local.empty() && local.back() == '+';
    if (plus_rank) local.pop_back();
    if (local.empty() || !parse_ip_port(local, true, &ip, &lport))
      fail(Status::kInvalidArgument, "dpdk client: THC_DPDK_LOCAL='" + opt.local +
                                         "' must be this worker's IPv4 address[:UDP port] on the DPDK port, or "
                                         "A.B.C.D+ for A.B.C.D + rank");
    if (plus_rank) ip += static_cast<uint32_t>(opt.rank);
    if (lport <= 0) lport = 40000 + opt.rank;
    if (lport > 65535) fail(Status::kInvalidArgument, "dpdk client: local UDP port " + std::to_string(lport) + " > 65535");

    Process& p = proc();
    std::lock_guard<std::mutex> lk(p.mu);
    if (p.channel_open) fail(Status::kInvalidArgument, "dpdk client: one DPDK channel per process at a time");
    init_eal(p, opt.eal_args);
    setup_port(p, opt.port_id);
    port_ = static_cast<uint16_t>(p.port);
    pool_ = p.pool;
    local_.mac = p.mac;
    local_.ip = ip;
    local_.port = static_cast<uint16_t>(lport);
    local_.verify_udp_checksum = true;
    p.channel_open = true;
    try {
      resolve(opt.resolve_ms);
    } catch (...) {
      p.channel_open = false;
      drain();
      throw;
    }
  }

  ~DpdkChannel() override {
    drain();
    Process& p = proc();
    std::lock_guard<std::mutex> lk(p.mu);
    p.channel_open = false;
  }

  void send(const uint8_t* data, size_t n) override {
    rte_mbuf* m = rte_pktmbuf_alloc(pool_);
    if (!m) {
      note("mbuf pool empty");
      return;
    }
    uint8_t* f = rte_pktmbuf_mtod(m, uint8_t*);
    const size_t len = frames::build_udp_frame(local_, agg_mac_, agg_ip_, agg_port_, data, n, f, rte_pktmbuf_tailroom(m));
    if (len == 0) {
      rte_pktmbuf_free(m);
      note("datagram of " + std::to_string(n) + " bytes does not fit an mbuf");
      return;
    }
    m->data_len = static_cast<uint16_t>(len);
    m->pkt_len = static_cast<uint32_t>(len);
    // Batched: the client sends a window's worth back to back, then receives; one burst (one
    // system call on af_packet) instead of one per datagram.
    tx_[tx_n_++] = m;
    if (tx_n_ == kBurst) flush();
  }

  size_t recv(uint8_t* buf, size_t cap) override {
    flush();
    for (;;) {
      rte_mbuf* m = next();
      if (!m) return 0;
      const size_t n = take(m, buf, cap);
      rte_pktmbuf_free(m);
      if (n > 0) return n;
    }
  }

  bool pending() const override { return rx_i_ < rx_n_; }
  int payload_budget() const override {
    uint16_t mtu = 0;
    if (rte_eth_dev_get_mtu(port_, &mtu) != 0 || mtu < 576) mtu = 1500;
    return static_cast<int>(mtu) - 20 - 8 - static_cast<int>(proto::kHeaderBytes);
  }
  void wait_us(uint64_t timeout_us) override {
    flush();
    const uint64_t deadline = mono_us() + timeout_us;
    for (;;) {
      if (rx_i_ < rx_n_) return;
      rx_i_ = 0;
      rx_n_ = rte_eth_rx_burst(port_, 0, rx_, kBurst);
      if (rx_n_ > 0 || mono_us() >= deadline) return;
      sleep_us(20);
    }
  }

  std::string kind() const override { return "dpdk"; }
  std::string peer() const override {
    return "dpdk://" + ip_str(agg_ip_) + ":" + std::to_string(agg_port_) + " (" + mac_str(agg_mac_) + ") from " +
           ip_str(local_.ip) + ":" + std::to_string(local_.port) + " on port " + std::to_string(port_);
  }
  std::string last_error() const override {
    std::string e = err_;
    if (drops_ > 0) {
      e += std::string(e.empty() ? "" : "; ") + std::to_string(drops_) + " frames dropped, the last as " + last_drop_;
      if (last_drop_ == "bad_udp_checksum") e += " (UDP checksum offload on the sender's link? try ethtool -K IF tx off)";
    }
    return e;
  }

 private:
  void note(const std::string& e) { err_ = e; }

 public:
  void flush() override {
    uint16_t done = 0;
    for (int t = 0; done < tx_n_ && t < 4; ++t) done += rte_eth_tx_burst(port_, 0, tx_ + done, tx_n_ - done);
    if (done < tx_n_) {
      rte_pktmbuf_free_bulk(tx_ + done, tx_n_ - done);
      note("tx queue full");  // lost; retransmission recovers them
    }
    tx_n_ = 0;
  }

 private:
  rte_mbuf* next() {
    if (rx_i_ >= rx_n_) {
      rx_i_ = 0;
      rx_n_ = rte_eth_rx_burst(port_, 0, rx_, kBurst);
      if (rx_n_ == 0) return nullptr;
    }
    return rx_[rx_i_++];
  }

  void drain() {
    flush();
    while (rx_i_ < rx_n_) rte_pktmbuf_free(rx_[rx_i_++]);
    rx_i_ = rx_n_ = 0;
  }

  void answer_arp(const frames::Classified& c) {
    rte_mbuf* r = rte_pktmbuf_alloc(pool_);
    if (!r) return;
    const size_t len = frames::build_arp_reply(local_, c.peer_mac, c.peer_ip, rte_pktmbuf_mtod(r, uint8_t*),
                                               rte_pktmbuf_tailroom(r));
    r->data_len = static_cast<uint16_t>(len);
    r->pkt_len = static_cast<uint32_t>(len);
    if (len == 0 || rte_eth_tx_burst(port_, 0, &r, 1) != 1) rte_pktmbuf_free(r);
  }

  // One received frame: an ARP request for us is answered; a datagram from the aggregator is
  // copied out (its length returned); anything else is counted and dropped (0).
  size_t take(rte_mbuf* m, uint8_t* buf, size_t cap) {
    if (m->nb_segs != 1) {
      drop("multi_segment");
      return 0;
    }
    const uint8_t* f = rte_pktmbuf_mtod(m, const uint8_t*);
    const frames::Classified c = frames::classify(f, m->data_len, local_);
    if (c.kind == frames::FrameKind::kArpRequest) {
      answer_arp(c);
      return 0;
    }
    if (c.kind != frames::FrameKind::kUdp) {
      // ARP replies and other hosts' chatter are normal on a shared link; only count them.
      drop(frames::frame_drop_name(c.drop));
      return 0;
    }
    if (c.peer_ip != agg_ip_ || c.peer_port != agg_port_) {
      drop("not_from_aggregator");
      return 0;
    }
    if (c.payload_len == 0 || c.payload_len > cap) {
      drop("payload_size");
      return 0;
    }
    std::memcpy(buf, c.payload, c.payload_len);
    return c.payload_len;
  }

  void drop(const char* why) {
    ++drops_;
    last_drop_ = why;
  }

  void resolve(double resolve_ms) {
    uint8_t req[frames::kArpReplyBytes];
    const size_t len = frames::build_arp_request(local_, agg_ip_, req, sizeof req);
    const uint64_t start = mono_us();
    uint64_t next_req = start;
    int sent = 0;
    for (;;) {
      const uint64_t now = mono_us();
      if (now >= next_req) {
        if (static_cast<double>(now - start) > resolve_ms * 1000.0)
          fail(Status::kTimeout, "dpdk client: no ARP reply for " + ip_str(agg_ip_) + " after " + std::to_string(sent) +
                                     " requests from " + ip_str(local_.ip) + " (" + mac_str(local_.mac) +
                                     ") on DPDK port " + std::to_string(port_) +
                                     ": is the aggregator up at that address, on this link?");
        rte_mbuf* m = rte_pktmbuf_alloc(pool_);
        if (m) {
          std::memcpy(rte_pktmbuf_mtod(m, uint8_t*), req, len);
          m->data_len = static_cast<uint16_t>(len);
          m->pkt_len = static_cast<uint32_t>(len);
          if (rte_eth_tx_burst(port_, 0, &m, 1) != 1) rte_pktmbuf_free(m);
        }
        ++sent;
        next_req = now + 200'000;
      }
      while (rte_mbuf* m = next()) {
        bool got = false;
        if (m->nb_segs == 1) {
          const uint8_t* f = rte_pktmbuf_mtod(m, const uint8_t*);
          got = frames::arp_reply_from(f, m->data_len, local_, agg_ip_, &agg_mac_);
          if (!got) {
            const frames::Classified c = frames::classify(f, m->data_len, local_);
            if (c.kind == frames::FrameKind::kArpRequest) answer_arp(c);
          }
        }
        rte_pktmbuf_free(m);
        if (got) return;
      }
      sleep_us(100);
    }
  }

  uint16_t port_ = 0;
  rte_mempool* pool_ = nullptr;
  frames::Local local_;
  uint32_t agg_ip_ = 0;
  uint16_t agg_port_ = 0;
  frames::Mac agg_mac_{};
  rte_mbuf* rx_[kBurst] = {};
  uint16_t rx_n_ = 0, rx_i_ = 0;
  rte_mbuf* tx_[kBurst] = {};
  uint16_t tx_n_ = 0;
  std::string err_;
  uint64_t drops_ = 0;
  std::string last_drop_;
};

}  // namespace

std::unique_ptr<DatagramChannel> make_dpdk_channel(const std::string& address, const DpdkChannelOptions& opt) {
  return std::make_unique<DpdkChannel>(address, opt);
}

}  // namespace thc::transport
