#include "switch_offload/servers/dpdk/dpdk_server.h"
#include "switch_offload/servers/dpdk/burst.h"
#include "switch_offload/protocol/wire.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_pause.h>
#include <rte_prefetch.h>
#include <rte_ring.h>
#include <rte_spinlock.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "common/status.h"
#include "common/net.h"

namespace thc::switch_offload {

namespace {
constexpr unsigned kBurst = 32;
constexpr uint16_t kPrefetchAhead = 4;  // frames whose first line is fetched ahead of the one classified
constexpr unsigned kTxRetries = 64;          // tx_burst attempts before the rest of a batch is dropped
constexpr unsigned kIdleSpins = 256;         // empty polls before an idle loop starts sleeping
constexpr size_t kMaxMacs = size_t{1} << 16; // per worker; beyond it the table is cleared and relearned

std::string errstr(int rc) { return rte_strerror(rc < 0 ? -rc : rc); }

std::string mac_str(const frames::Mac& m) {
  char b[18];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

std::string ip_str(uint32_t ip) {
  in_addr a{htonl(ip)};
  char b[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a, b, sizeof b);
  return b;
}

// The steering key: low word of the job id + shard (header bytes 12..15 and 30..31), exactly the
// UDP server's BPF program, so every job instance lives on one lane.
uint32_t job_of(const uint8_t* payload, size_t len) {
  if (len < 32) return 0;
  const uint32_t lo = static_cast<uint32_t>(payload[12]) << 24 | static_cast<uint32_t>(payload[13]) << 16 |
                      static_cast<uint32_t>(payload[14]) << 8 | payload[15];
  const uint32_t shard = static_cast<uint32_t>(payload[30]) << 8 | payload[31];
  return lo + shard;
}
}  // namespace

struct DpdkServer::TxQueue {
  uint16_t id = 0;
  bool shared = false;  // used by more than one lcore: transmit under the lock
  rte_spinlock_t lock = RTE_SPINLOCK_INITIALIZER;
};

// L2/L3 counters of the RX lcore (single writer).
struct DpdkServer::RxCounters {
  Counter frames, udp_frames, arp_requests, arp_replies, multi_segment, ring_full;
  Counter arp_tx_full;  // ARP replies not sent: tx queue full or no mbuf
  Counter drops[static_cast<int>(frames::FrameDrop::kCount)];
};

// A worker's reply path: frames built straight into mbufs, sent in bursts on the lane's queue.
class DpdkServer::TxSink final : public Sink {
 public:
  TxSink(DpdkServer* srv, Lane* lane) : srv_(srv), lane_(lane) {}
  void send(const PeerAddr& to, const uint8_t* data, size_t len) override {
    frame(to, data, len, nullptr, 0);
  }
  // A result to each recipient: the header and the shared payload go straight into the frame (no
  // joined copy), and the payload's part of the UDP checksum is summed once per result.
  void send_parts(const PeerAddr& to, const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen) override {
    frame(to, head, hlen, tail, tlen);
  }
  void next_payload() override { tail_summed_ = false; }
  void flush();

 private:
  void frame(const PeerAddr& to, const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen);

  DpdkServer* srv_;
  Lane* lane_;
  rte_mbuf* pending_[kBurst];
  unsigned n_ = 0;
  bool tail_summed_ = false;  // tail_sum_ holds the sum of the current result's payload (at tail_, tail_len_)
  const uint8_t* tail_ = nullptr;
  size_t tail_len_ = 0;
  uint64_t tail_sum_ = 0;
};

struct DpdkServer::Lane {
  int index = 0;
  unsigned lcore = 0;
  rte_ring* ring = nullptr;  // RX lcore -> this lane (null in single-core mode)
  TxQueue* txq = nullptr;
  DpdkServer* srv = nullptr;
  Stats stats;
  std::unique_ptr<Engine> engine;
  PeerMacs macs{kMaxMacs};  // peer IPv4 -> the MAC its frames came from (burst.h)
  BurstScratch scratch;
  std::unique_ptr<TxSink> sink;
  Counter tx_frames, tx_full, tx_no_mac, tx_nombuf, tx_too_big;
};

void DpdkServer::TxSink::frame(const PeerAddr& to, const uint8_t* head, size_t hlen, const uint8_t* tail, size_t tlen) {
  Lane& l = *lane_;
  if (to.ss.ss_family != AF_INET) {  // cannot happen: every peer comes from an IPv4 frame
    l.tx_no_mac.add();
    return;
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&to.ss);
  const uint32_t ip = ntohl(a->sin_addr.s_addr);
  const frames::Mac* mac = l.macs.find(ip);
  if (mac == nullptr) {  // table was reset since the peer's last frame: its retransmission relearns it
    l.tx_no_mac.add();
    return;
  }
  rte_mbuf* m = rte_pktmbuf_alloc(srv_->pool_);
  if (m == nullptr) {
    l.tx_nombuf.add();
    return;
  }
  uint8_t* p = rte_pktmbuf_mtod(m, uint8_t*);
  const bool csum = srv_->opt_.tx_udp_checksum;
  if (csum && tlen > 0 && (!tail_summed_ || tail != tail_ || tlen != tail_len_)) {
    tail_sum_ = frames::payload_sum(tail, tlen);
    tail_ = tail;
    tail_len_ = tlen;
    tail_summed_ = true;
  }
  const size_t n = frames::build_udp_frame_parts(srv_->local_, *mac, ip, ntohs(a->sin_port), head, hlen, tail, tlen,
                                                 csum && tlen > 0 ? &tail_sum_ : nullptr, p, rte_pktmbuf_tailroom(m), csum);
  if (n == 0) {
    rte_pktmbuf_free(m);
    l.tx_too_big.add();
    return;
  }
  m->data_len = static_cast<uint16_t>(n);
  m->pkt_len = static_cast<uint32_t>(n);
  pending_[n_++] = m;
  if (n_ == kBurst) flush();
}

void DpdkServer::TxSink::flush() {
  if (n_ == 0) return;
  srv_->transmit(*lane_->txq, pending_, n_, &lane_->tx_frames, &lane_->tx_full);
  n_ = 0;
}

DpdkServer::DpdkServer(const DpdkServerOptions& opt) : opt_(opt), rx_(std::make_unique<RxCounters>()) {
  if (opt_.ip == 0) fail(Status::kInvalidArgument, "thc-aggregator-dpdk: --ip is required");
  if (opt_.port == 0) fail(Status::kInvalidArgument, "thc-aggregator-dpdk: --port must be 1..65535");
  if (opt_.workers < 0 || opt_.workers > RTE_MAX_LCORE)
    fail(Status::kInvalidArgument, "thc-aggregator-dpdk: --workers must be 0.." + std::to_string(RTE_MAX_LCORE));
  if (opt_.ring_size < 64 || (opt_.ring_size & (opt_.ring_size - 1)) != 0)
    fail(Status::kInvalidArgument, "thc-aggregator-dpdk: ring size must be a power of two >= 64");
  if (rte_lcore_id() != rte_get_main_lcore())
    fail(Status::kInternal, "thc-aggregator-dpdk: the server must be created on the main lcore");
  const unsigned have = rte_lcore_count();
  if (have < static_cast<unsigned>(opt_.workers) + 1)
    fail(Status::kInvalidArgument, "thc-aggregator-dpdk: --workers " + std::to_string(opt_.workers) + " needs " +
                                       std::to_string(opt_.workers + 1) + " lcores (the main lcore receives), EAL gave " +
                                       std::to_string(have) + " (use e.g. -l 0-" + std::to_string(opt_.workers) + ")");
  local_.ip = opt_.ip;
  local_.port = opt_.port;
  local_.verify_udp_checksum = opt_.verify_udp_checksum;
  if (const std::string p = opt_.problem(); !p.empty()) fail(Status::kInvalidArgument, "thc-aggregator-dpdk: " + p);
  budget_ = opt_.budget();
  const uint64_t started_ns = wall_clock_ns();

  const int nlanes = std::max(opt_.workers, 1);
  unsigned lcore = rte_get_main_lcore();
  for (int i = 0; i < nlanes; ++i) {
    auto l = std::make_unique<Lane>();
    l->index = i;
    l->srv = this;
    if (opt_.workers > 0) lcore = rte_get_next_lcore(lcore, 1, 0);
    l->lcore = lcore;
    EngineConfig ec = opt_.engine_config(20, static_cast<uint16_t>(nlanes), static_cast<uint64_t>(i));
    ec.stats_nonce_floor = started_ns;
    ec.budget = budget_;
    ec.stats_from_loopback = false;  // a DPDK port has no loopback peers
    ec.stats_snapshot = [this] { return stats(); };
    l->engine = std::make_unique<Engine>(ec, &l->stats);
    l->sink = std::make_unique<TxSink>(this, l.get());
    lanes_.push_back(std::move(l));
  }
  try {
    setup_port();
  } catch (...) {
    release();  // the destructor does not run for a throwing constructor
    throw;
  }
}

void DpdkServer::setup_port() {
  const uint16_t pid = opt_.port_id;
  if (!rte_eth_dev_is_valid_port(pid))
    fail(Status::kInvalidArgument, "thc-aggregator-dpdk: no DPDK port " + std::to_string(pid) + " (" +
                                       std::to_string(rte_eth_dev_count_avail()) +
                                       " available; give EAL a --vdev or a NIC bound to a DPDK driver)");
  rte_eth_dev_info info{};
  int rc = rte_eth_dev_info_get(pid, &info);
  if (rc != 0) fail(Status::kTransport, "thc-aggregator-dpdk: rte_eth_dev_info_get: " + errstr(rc));
  driver_ = info.driver_name ? info.driver_name : "?";

  // Transmitting lcores: the main lcore (ARP replies; in single-core mode everything) and each
  // worker. Fewer tx queues than that: lcores share queues under a lock.
  const unsigned want_tx = static_cast<unsigned>(opt_.workers) + 1;
  nb_txq_ = static_cast<uint16_t>(std::max<unsigned>(1, std::min<unsigned>(want_tx, info.max_tx_queues)));
  // af_packet's queue pairs are sockets in one PACKET_FANOUT group: the kernel spreads received
  // frames over all of them, so every one must be polled. Everywhere else: one rx queue.
  nb_rxq_ = driver_ == "net_af_packet" ? std::max<uint16_t>(1, info.max_rx_queues) : 1;
  if (nb_rxq_ > info.max_rx_queues && info.max_rx_queues > 0) nb_rxq_ = info.max_rx_queues;

  // Jumbo frames (--mtu above 1500, what 100-400 Gbit/s clusters run): the port must take them in
  // (rx MTU) and every mbuf must hold a whole frame (rx is single-segment, replies are built in
  // one mbuf); with 2 KB mbufs no result of an 8192-lane job could leave.
  rte_eth_conf conf{};
  if (opt_.mtu > RTE_ETHER_MTU) {
    const uint32_t frame = static_cast<uint32_t>(opt_.mtu) + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;
    if (info.max_mtu < static_cast<uint16_t>(opt_.mtu) || info.max_rx_pktlen < frame)
      fail(Status::kInvalidArgument,
           "thc-aggregator-dpdk: --mtu " + std::to_string(opt_.mtu) + ": port " + std::to_string(pid) + " (" + driver_ +
               ") takes frames of " + std::to_string(info.max_rx_pktlen) + " bytes (MTU " +
               std::to_string(std::min<uint32_t>(info.max_mtu, info.max_rx_pktlen - RTE_ETHER_HDR_LEN - RTE_ETHER_CRC_LEN)) +
               ") at most; use --mtu 1500 or a port that takes jumbo frames");
    conf.rxmode.mtu = static_cast<uint32_t>(opt_.mtu);
  }
  rc = rte_eth_dev_configure(pid, nb_rxq_, nb_txq_, &conf);
  if (rc != 0) fail(Status::kTransport, "thc-aggregator-dpdk: rte_eth_dev_configure: " + errstr(rc));
  port_configured_ = true;
  uint16_t nrxd = opt_.rx_desc, ntxd = opt_.tx_desc;
  rc = rte_eth_dev_adjust_nb_rx_tx_desc(pid, &nrxd, &ntxd);
  if (rc != 0) fail(Status::kTransport, "thc-aggregator-dpdk: rte_eth_dev_adjust_nb_rx_tx_desc: " + errstr(rc));

  int socket = rte_eth_dev_socket_id(pid);
  if (socket < 0) socket = static_cast<int>(rte_socket_id());
  // Every mbuf that can be held at once: rx and tx descriptors, the rings, the bursts in flight
  // and the per-lcore caches, plus slack.
  const unsigned cache = 256;
  const unsigned lcores = static_cast<unsigned>(opt_.workers) + 1;
  const unsigned nb_mbufs = nb_rxq_ * nrxd + nb_txq_ * ntxd + static_cast<unsigned>(opt_.workers) * opt_.ring_size +
                            lcores * (3 * kBurst + cache) + 2048;
  const std::string pool_name = "thc_mbufs_p" + std::to_string(pid);
  const unsigned frame_room = (static_cast<unsigned>(opt_.mtu) + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN + 63) / 64 * 64;
  const uint16_t buf_size =
      static_cast<uint16_t>(RTE_PKTMBUF_HEADROOM + std::max<unsigned>(RTE_MBUF_DEFAULT_DATAROOM, frame_room));
  pool_ = rte_pktmbuf_pool_create(pool_name.c_str(), nb_mbufs, cache, 0, buf_size, socket);
  if (pool_ == nullptr)
    fail(Status::kOutOfMemory, "thc-aggregator-dpdk: rte_pktmbuf_pool_create(" + std::to_string(nb_mbufs) +
                                   " mbufs): " + errstr(rte_errno) + " (give EAL more memory, e.g. -m 512)");

  for (uint16_t q = 0; q < nb_rxq_; ++q) {
    rc = rte_eth_rx_queue_setup(pid, q, nrxd, static_cast<unsigned>(socket), nullptr, pool_);
    if (rc != 0) fail(Status::kTransport, "thc-aggregator-dpdk: rte_eth_rx_queue_setup: " + errstr(rc));
  }
  for (uint16_t q = 0; q < nb_txq_; ++q) {
    rc = rte_eth_tx_queue_setup(pid, q, ntxd, static_cast<unsigned>(socket), nullptr);
    if (rc != 0) fail(Status::kTransport, "thc-aggregator-dpdk: rte_eth_tx_queue_setup: " + errstr(rc));
    auto t = std::make_unique<TxQueue>();
    t->id = q;
    txqs_.push_back(std::move(t));
  }
  // Queue 0: the main lcore; lane i: queue (1 + i) % nb_txq (in single-core mode lane 0 is the
  // main lcore itself and shares its queue without a lock).
  std::vector<int> users(nb_txq_, 0);
  users[0] = 1;
  for (auto& l : lanes_) {
    const uint16_t q = opt_.workers == 0 ? 0 : static_cast<uint16_t>((1 + l->index) % nb_txq_);
    l->txq = txqs_[q].get();
    if (opt_.workers > 0) ++users[q];
  }
  for (uint16_t q = 0; q < nb_txq_; ++q) txqs_[q]->shared = users[q] > 1;

  for (auto& l : lanes_) {
    if (opt_.workers == 0) break;
    const std::string name = "thc_rx_to_w" + std::to_string(l->index);
    l->ring = rte_ring_create(name.c_str(), opt_.ring_size, socket, RING_F_SP_ENQ | RING_F_SC_DEQ);
    if (l->ring == nullptr) fail(Status::kOutOfMemory, "thc-aggregator-dpdk: rte_ring_create: " + errstr(rte_errno));
  }

  rte_ether_addr mac{};
  rc = rte_eth_macaddr_get(pid, &mac);
  if (rc != 0) fail(Status::kTransport, "thc-aggregator-dpdk: rte_eth_macaddr_get: " + errstr(rc));
  std::memcpy(local_.mac.data(), mac.addr_bytes, 6);

  rc = rte_eth_dev_start(pid);
  if (rc != 0) fail(Status::kTransport, "thc-aggregator-dpdk: rte_eth_dev_start: " + errstr(rc));
  port_started_ = true;
  // Give the link up to 3 s; a port whose link stays down still runs (it may come up later).
  for (int i = 0; i < 300; ++i) {
    rte_eth_link link{};
    if (rte_eth_link_get_nowait(pid, &link) == 0 && link.link_status == RTE_ETH_LINK_UP) break;
    rte_delay_us_sleep(10000);
  }
}

DpdkServer::~DpdkServer() { release(); }

void DpdkServer::release() {
  if (port_started_) {
    rte_eth_dev_stop(opt_.port_id);
    port_started_ = false;
  }
  if (port_configured_) {
    rte_eth_dev_close(opt_.port_id);  // also frees the queues' mbufs
    port_configured_ = false;
  }
  for (auto& l : lanes_) {
    if (l->ring == nullptr) continue;
    void* m = nullptr;
    while (rte_ring_dequeue(l->ring, &m) == 0) rte_pktmbuf_free(static_cast<rte_mbuf*>(m));
    rte_ring_free(l->ring);
    l->ring = nullptr;
  }
  if (pool_ != nullptr) {
    rte_mempool_free(pool_);
    pool_ = nullptr;
  }
}

std::vector<uint64_t> DpdkServer::stats() const {
  std::vector<uint64_t> acc;
  for (const auto& l : lanes_) stats_accumulate(&acc, stats_values(l->stats));
  return acc;
}

size_t DpdkServer::jobs() const {
  const std::vector<uint64_t> v = stats();
  return static_cast<size_t>(stats_get(v, "jobs_created") - stats_get(v, "jobs_freed"));
}

std::vector<std::pair<std::string, uint64_t>> DpdkServer::port_counters() const {
  std::vector<std::pair<std::string, uint64_t>> c;
  rte_eth_stats es{};
  if (port_started_) rte_eth_stats_get(opt_.port_id, &es);
  c.emplace_back("port_rx_packets", es.ipackets);
  c.emplace_back("port_tx_packets", es.opackets);
  c.emplace_back("port_rx_bytes", es.ibytes);
  c.emplace_back("port_tx_bytes", es.obytes);
  c.emplace_back("port_imissed", es.imissed);
  c.emplace_back("port_ierrors", es.ierrors);
  c.emplace_back("port_oerrors", es.oerrors);
  c.emplace_back("port_rx_nombuf", es.rx_nombuf);
  const RxCounters& r = *rx_;
  c.emplace_back("rx_frames", r.frames.get());
  c.emplace_back("udp_frames", r.udp_frames.get());
  c.emplace_back("arp_requests", r.arp_requests.get());
  c.emplace_back("arp_replies", r.arp_replies.get());
  uint64_t total = 0;
  for (const Counter& d : r.drops) total += d.get();
  total += r.multi_segment.get();
  c.emplace_back("frame_drops_total", total);
  for (int i = 0; i < static_cast<int>(frames::FrameDrop::kCount); ++i)
    c.emplace_back(std::string("frame_drop_") + frames::frame_drop_name(static_cast<frames::FrameDrop>(i)), r.drops[i].get());
  c.emplace_back("frame_drop_multi_segment", r.multi_segment.get());
  c.emplace_back("ring_full", r.ring_full.get());
  uint64_t tx = 0, full = r.arp_tx_full.get(), no_mac = 0, nombuf = 0, too_big = 0, resets = 0;
  for (const auto& l : lanes_) {
    tx += l->tx_frames.get();
    full += l->tx_full.get();
    no_mac += l->tx_no_mac.get();
    nombuf += l->tx_nombuf.get();
    too_big += l->tx_too_big.get();
    resets += l->macs.resets();
  }
  c.emplace_back("tx_frames", tx);
  c.emplace_back("tx_full", full);
  c.emplace_back("tx_no_mac", no_mac);
  c.emplace_back("tx_nombuf", nombuf);
  c.emplace_back("tx_too_big", too_big);
  c.emplace_back("mac_table_resets", resets);
  return c;
}

std::string DpdkServer::port_stats_line() const {
  std::string out;
  for (const auto& [name, v] : port_counters()) {
    if (v == 0 && name.compare(0, 11, "frame_drop_") == 0) continue;
    if (!out.empty()) out += ' ';
    out += name + "=" + std::to_string(v);
  }
  return out;
}

std::string DpdkServer::describe() const {
  std::string s = "port " + std::to_string(opt_.port_id) + " (" + driver_ + ") mac " + mac_str(local_.mac) + " ip " +
                  ip_str(local_.ip) + " udp " + std::to_string(local_.port) + " rxq " + std::to_string(nb_rxq_) + " txq " +
                  std::to_string(nb_txq_);
  bool shared = false;
  for (const auto& q : txqs_) shared = shared || q->shared;
  if (shared) s += " (shared under a lock)";
  if (opt_.workers == 0) {
    s += " single-core on lcore " + std::to_string(rte_get_main_lcore());
  } else {
    s += " rx lcore " + std::to_string(rte_get_main_lcore()) + " worker lcores";
    for (const auto& l : lanes_) s += " " + std::to_string(l->lcore);
  }
  return s;
}

void DpdkServer::transmit(TxQueue& q, rte_mbuf** pkts, unsigned n, Counter* sent, Counter* dropped) {
  unsigned done = 0;
  if (q.shared) rte_spinlock_lock(&q.lock);
  for (unsigned t = 0; done < n && t < kTxRetries; ++t) {
    done += rte_eth_tx_burst(opt_.port_id, q.id, pkts + done, static_cast<uint16_t>(n - done));
    if (done < n) rte_pause();
  }
  if (q.shared) rte_spinlock_unlock(&q.lock);
  sent->add(done);
  if (done < n) {
    // The queue stayed full: UDP semantics, the sender's retransmission recovers.
    dropped->add(n - done);
    rte_pktmbuf_free_bulk(pkts + done, n - done);
  }
}

void DpdkServer::idle(unsigned* idle_polls) const {
  if (opt_.idle_sleep_us == 0) {
    rte_pause();
    return;
  }
  if (++*idle_polls < kIdleSpins) {
    rte_pause();
    return;
  }
  rte_delay_us_sleep(opt_.idle_sleep_us);
}

void DpdkServer::process(Lane& l, rte_mbuf** pkts, unsigned n, uint64_t now) {
  RxDatagram in[kBurst];
  for (unsigned i = 0; i < n; ++i) {
    const frames::Classified c =
        frames::accepted_udp(rte_pktmbuf_mtod(pkts[i], const uint8_t*), rte_pktmbuf_data_len(pkts[i]));
    in[i] = RxDatagram{c.payload, c.payload_len, c.peer_ip, c.peer_port, c.peer_mac};
  }
  // The burst's data packets through Engine::handle_batch, under the learning rules (burst.h).
  handle_burst(*l.engine, l.macs, in, n, now, *l.sink, true, l.scratch);
  rte_pktmbuf_free_bulk(pkts, n);
}

int DpdkServer::lane_main(void* arg) {
  auto* l = static_cast<Lane*>(arg);
  l->srv->lane_loop(*l);
  return 0;
}

void DpdkServer::lane_loop(Lane& l) {
  rte_mbuf* pkts[kBurst];
  unsigned idle_polls = 0;
  uint64_t next_tick = mono_us();
  while (!stop_.load(std::memory_order_relaxed)) {
    const unsigned n = rte_ring_dequeue_burst(l.ring, reinterpret_cast<void**>(pkts), kBurst, nullptr);
    const uint64_t now = mono_us();
    if (n > 0) {
      process(l, pkts, n, now);
      idle_polls = 0;
    }
    if (now >= next_tick) {
      l.engine->tick(now, *l.sink);
      next_tick = now + l.engine->tick_interval_us();
    }
    l.sink->flush();
    if (n == 0) idle(&idle_polls);
  }
}

void DpdkServer::rx_loop() {
  rte_mbuf* pkts[kBurst];
  rte_mbuf* arp_out[kBurst];
  const bool inline_lane = opt_.workers == 0;
  const size_t nl = lanes_.size();
  std::vector<rte_mbuf*> staged(nl * kBurst);
  std::vector<unsigned> nstaged(nl, 0);
  RxCounters& r = *rx_;
  TxQueue& main_txq = *txqs_[0];
  unsigned idle_polls = 0;
  uint64_t next_tick = mono_us();
  while (!stop_.load(std::memory_order_relaxed)) {
    unsigned got = 0;
    for (uint16_t q = 0; q < nb_rxq_; ++q) {
      const uint16_t n = rte_eth_rx_burst(opt_.port_id, q, pkts, kBurst);
      if (n == 0) continue;
      got += n;
      r.frames.add(n);
      unsigned na = 0;
      // The burst's mbuf headers, then each frame's first line a few frames ahead (l3fwd's
      // pattern): a received frame is in no cache of this core yet (DMA, or another lcore).
      for (uint16_t i = 0; i < n; ++i) rte_prefetch0(pkts[i]);
      for (uint16_t i = 0; i < n && i < kPrefetchAhead; ++i) rte_prefetch0(rte_pktmbuf_mtod(pkts[i], const void*));
      for (uint16_t i = 0; i < n; ++i) {
        rte_mbuf* m = pkts[i];
        if (i + kPrefetchAhead < n) rte_prefetch0(rte_pktmbuf_mtod(pkts[i + kPrefetchAhead], const void*));
        if (m->nb_segs != 1) {  // our pool's buffers hold any frame up to the MTU; a chain is not ours
          r.multi_segment.add();
          rte_pktmbuf_free(m);
          continue;
        }
        const uint8_t* f = rte_pktmbuf_mtod(m, const uint8_t*);
        const frames::Classified c = frames::classify(f, rte_pktmbuf_data_len(m), local_);
        switch (c.kind) {
          case frames::FrameKind::kDrop:
            r.drops[static_cast<int>(c.drop)].add();
            rte_pktmbuf_free(m);
            break;
          case frames::FrameKind::kArpRequest: {
            r.arp_requests.add();
            rte_pktmbuf_free(m);  // c holds copies of what the reply needs
            // A fresh mbuf rather than the request's: a received buffer may be shared with the
            // driver (external buffers) and carries rx offload flags. ARP is rare.
            rte_mbuf* reply = rte_pktmbuf_alloc(pool_);
            if (reply == nullptr) {
              r.arp_tx_full.add();
              break;
            }
            const size_t len = frames::build_arp_reply(local_, c.peer_mac, c.peer_ip, rte_pktmbuf_mtod(reply, uint8_t*),
                                                       rte_pktmbuf_tailroom(reply));
            if (len == 0) {  // a pool whose buffers cannot hold 60 bytes: nothing to send
              rte_pktmbuf_free(reply);
              r.arp_tx_full.add();
              break;
            }
            reply->data_len = static_cast<uint16_t>(len);
            reply->pkt_len = static_cast<uint32_t>(len);
            arp_out[na++] = reply;
            break;
          }
          case frames::FrameKind::kUdp: {
            r.udp_frames.add();
            const size_t lane = nl == 1 ? 0 : job_of(c.payload, c.payload_len) % nl;
            staged[lane * kBurst + nstaged[lane]++] = m;
            break;
          }
        }
      }
      if (na > 0) transmit(main_txq, arp_out, na, &r.arp_replies, &r.arp_tx_full);
      const uint64_t now = mono_us();
      for (size_t l = 0; l < nl; ++l) {
        const unsigned k = nstaged[l];
        if (k == 0) continue;
        nstaged[l] = 0;
        rte_mbuf** b = &staged[l * kBurst];
        if (inline_lane) {
          process(*lanes_[l], b, k, now);
          continue;
        }
        const unsigned enq = rte_ring_enqueue_burst(lanes_[l]->ring, reinterpret_cast<void* const*>(b), k, nullptr);
        if (enq < k) {  // the worker is behind: drop like a full NIC queue, the sender retransmits
          r.ring_full.add(k - enq);
          rte_pktmbuf_free_bulk(b + enq, k - enq);
        }
      }
    }
    if (inline_lane) {
      Lane& l = *lanes_[0];
      const uint64_t now = mono_us();
      if (now >= next_tick) {
        l.engine->tick(now, *l.sink);
        next_tick = now + l.engine->tick_interval_us();
      }
      l.sink->flush();
    }
    if (got == 0) idle(&idle_polls);
    else idle_polls = 0;
  }
}

void DpdkServer::run() {
  if (ran_) fail(Status::kInternal, "thc-aggregator-dpdk: run() called twice");
  ran_ = true;
  if (rte_lcore_id() != rte_get_main_lcore()) fail(Status::kInternal, "thc-aggregator-dpdk: run() must be called on the main lcore");
  std::vector<unsigned> launched;
  if (opt_.workers > 0) {
    for (auto& l : lanes_) {
      const int rc = rte_eal_remote_launch(&DpdkServer::lane_main, l.get(), l->lcore);
      if (rc != 0) {
        request_stop();
        for (unsigned lc : launched) rte_eal_wait_lcore(lc);
        fail(Status::kInternal, "thc-aggregator-dpdk: rte_eal_remote_launch on lcore " + std::to_string(l->lcore) + ": " +
                                    errstr(rc));
      }
      launched.push_back(l->lcore);
    }
  }
  rx_loop();
  for (unsigned lc : launched) rte_eal_wait_lcore(lc);
}

}  // namespace thc::switch_offload
