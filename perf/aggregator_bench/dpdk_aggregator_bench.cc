// dpdk_aggregator_bench: what thc-aggregator-dpdk's server costs per core, without a NIC's or
// af_packet's copies. The server (DpdkServer, single-core mode: its one lcore receives,
// classifies, checks, aggregates and transmits) runs on a port made of two rte_rings (the net_ring
// PMD: frames enqueued on one ring arrive as received frames, transmitted frames land on the
// other), which is what a NIC's PMD hands it minus the DMA. A feeder thread on another CPU plays W
// workers: each repetition joins a new job through the port (JOIN, CHALLENGE, JOIN, JOIN_ACK as
// Ethernet/IPv4/UDP frames), signs P data packets per worker (THC b=4 -> u8 at the lanes the MTU
// allows, the stream of aggregator_bench's engine replay) and builds their frames; then, timed, it
// copies each frame into an mbuf just before the server needs it (512 frames queued: the data
// arrives from the other core's cache, as a NIC's DMA leaves it in the last-level cache) and
// drains the replies. The server's ring never runs dry until the end, so the time until the last
// reply is the server's: per upstream datagram, per second, per lane. Every result is compared
// with the sum of the workers' table values.
//
//   dpdk_aggregator_bench [--workers 4] [--packets 4000] [--slots 256] [--mtu 1500] [--reps 5]
//                         [--skip-udp-checksum] [--no-tx-udp-checksum]
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "perf/aggregator_bench/replay_stream.h"
#include "switch_offload/aggregator/stats.h"
#include "switch_offload/servers/dpdk/dpdk_server.h"
#include "switch_offload/servers/dpdk/frames.h"

namespace {

namespace sw = thc::switch_offload;
namespace frames = thc::switch_offload::frames;
namespace proto = thc::switch_offload::proto;
using thc::bench::ReplayStream;

constexpr uint32_t kServerIp = 0x0A630001;  // 10.99.0.1
constexpr uint32_t kWorkerIp = 0x0A630100;  // 10.99.1.w+1
constexpr uint16_t kServerPort = 9471;
constexpr unsigned kBurst = 32;
constexpr unsigned kAhead = 512;  // frames the feeder keeps queued for the server

using FromRings = int (*)(const char*, rte_ring* const[], unsigned, rte_ring* const[], unsigned, unsigned);

// rte_eth_from_rings from the net_ring PMD that EAL loaded as a plugin (linking the library as
// well would register the driver twice).
FromRings from_rings() {
  void* h = dlopen("librte_net_ring.so.23", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) h = dlopen("librte_net_ring.so", RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) throw std::runtime_error("the net_ring PMD is not loaded (EAL's driver directory?)");
  auto* f = reinterpret_cast<FromRings>(dlsym(h, "rte_eth_from_rings"));
  if (f == nullptr) throw std::runtime_error("no rte_eth_from_rings in the net_ring PMD");
  return f;
}

frames::Local worker_local(int w) {
  frames::Local l;
  l.mac = {0x02, 0x00, 0x00, 0x63, 0x01, static_cast<uint8_t>(w)};
  l.ip = kWorkerIp + 1 + static_cast<uint32_t>(w);
  l.port = static_cast<uint16_t>(40000 + w);
  return l;
}

double cpu_s(clockid_t c) {
  timespec ts{};
  clock_gettime(c, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Rep {
  double wall_s = 0, server_cpu_s = 0;
  double mono0 = 0, mono1 = 0;  // the timed window, CLOCK_MONOTONIC seconds (perf record -k CLOCK_MONOTONIC)
  uint64_t datagrams = 0, replies = 0, lanes = 0, bad_results = 0;
  uint64_t starved = 0;  // times the feeder found the server's ring empty with frames still to send
};

struct Feeder {
  rte_ring* rx;  // we enqueue, the server receives
  rte_ring* tx;  // the server transmits, we dequeue
  rte_mempool* pool;
  frames::Local server;
  bool udp_checksum;
  uint16_t frame_room;

  rte_mbuf* frame(int w, const std::vector<uint8_t>& payload) const {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    if (m == nullptr) throw std::runtime_error("feeder: mbuf pool empty");
    const size_t n = frames::build_udp_frame(worker_local(w), server.mac, server.ip, server.port, payload.data(),
                                             payload.size(), rte_pktmbuf_mtod(m, uint8_t*), frame_room, udp_checksum);
    if (n == 0) throw std::runtime_error("feeder: a frame does not fit an mbuf");
    m->data_len = static_cast<uint16_t>(n);
    m->pkt_len = static_cast<uint32_t>(n);
    return m;
  }

  // The payload of the next reply to worker w (any other reply is an error here).
  std::vector<uint8_t> reply(int w) const {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    void* p = nullptr;
    while (rte_ring_dequeue(tx, &p) != 0) {
      if (std::chrono::steady_clock::now() > end) throw std::runtime_error("feeder: no reply from the server");
      std::this_thread::yield();
    }
    auto* m = static_cast<rte_mbuf*>(p);
    const frames::Classified c = frames::classify(rte_pktmbuf_mtod(m, const uint8_t*), rte_pktmbuf_data_len(m), worker_local(w));
    std::vector<uint8_t> out;
    if (c.kind == frames::FrameKind::kUdp) out.assign(c.payload, c.payload + c.payload_len);
    rte_pktmbuf_free(m);
    if (out.empty()) throw std::runtime_error("feeder: a reply that is not UDP to worker " + std::to_string(w));
    return out;
  }

  Rep run(ReplayStream& s, clockid_t server_clock) const {
    s.id.dkey = s.join([&](int w, const std::vector<uint8_t>& req) {
      rte_mbuf* m = frame(w, req);
      if (rte_ring_enqueue(rx, m) != 0) throw std::runtime_error("feeder: rx ring full");
      return reply(w);
    });
    s.sign_data();
    // Every data frame built beforehand (checksums and all); the timed loop only copies each into
    // an mbuf just before the server needs it, keeping kAhead frames queued, so the server finds
    // them where a NIC's DMA leaves them (the last-level cache), not in DRAM.
    const size_t n = s.off.size();
    std::vector<uint8_t> built(n * frame_room);
    std::vector<uint16_t> built_len(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t len = frames::build_udp_frame(worker_local(s.from[i]), server.mac, server.ip, server.port,
                                                 s.bytes.data() + s.off[i], s.len[i], built.data() + i * frame_room,
                                                 frame_room, udp_checksum);
      if (len == 0) throw std::runtime_error("feeder: a frame does not fit an mbuf");
      built_len[i] = static_cast<uint16_t>(len);
    }
    std::vector<std::vector<uint8_t>> results(s.packets);  // worker 0's copy of every result
    Rep r;
    r.datagrams = n;
    r.lanes = static_cast<uint64_t>(s.lanes);
    const uint64_t want = n;  // every result goes to each of the W workers
    r.mono0 = cpu_s(CLOCK_MONOTONIC);
    const double c0 = cpu_s(server_clock);
    const auto t0 = std::chrono::steady_clock::now();
    size_t sent = 0;
    rte_mbuf* got[kBurst];
    rte_mbuf* put[kBurst];
    const auto deadline = t0 + std::chrono::seconds(60);
    while (r.replies < want) {
      const unsigned queued = sent < n ? rte_ring_count(rx) : kAhead;
      if (queued == 0 && sent > 0) ++r.starved;
      if (queued < kAhead) {
        const unsigned k = static_cast<unsigned>(std::min<size_t>(kBurst, n - sent));
        if (rte_pktmbuf_alloc_bulk(pool, put, k) != 0) throw std::runtime_error("feeder: mbuf pool empty");
        for (unsigned i = 0; i < k; ++i) {
          const uint16_t len = built_len[sent + i];
          std::memcpy(rte_pktmbuf_mtod(put[i], uint8_t*), built.data() + (sent + i) * frame_room, len);
          put[i]->data_len = len;
          put[i]->pkt_len = len;
        }
        if (rte_ring_enqueue_bulk(rx, reinterpret_cast<void* const*>(put), k, nullptr) != k)
          throw std::runtime_error("feeder: rx ring full");
        sent += k;
      }
      const unsigned k = rte_ring_dequeue_burst(tx, reinterpret_cast<void**>(got), kBurst, nullptr);
      for (unsigned i = 0; i < k; ++i) {
        const uint8_t* f = rte_pktmbuf_mtod(got[i], const uint8_t*);
        const uint32_t dst_ip = static_cast<uint32_t>(f[30]) << 24 | static_cast<uint32_t>(f[31]) << 16 |
                                static_cast<uint32_t>(f[32]) << 8 | f[33];
        if (dst_ip != kWorkerIp + 1) continue;  // worker 0's copy is checked below
        const frames::Classified c = frames::classify(f, rte_pktmbuf_data_len(got[i]), worker_local(0));
        proto::Header h;
        const uint8_t* pl;
        size_t plen;
        if (c.kind != frames::FrameKind::kUdp ||
            proto::parse(c.payload, c.payload_len, &h, &pl, &plen) != proto::ParseError::kOk ||
            h.type != proto::MsgType::kResult || h.seq >= s.packets) {
          ++r.bad_results;
          continue;
        }
        results[h.seq].assign(pl, pl + std::min<size_t>(plen, static_cast<size_t>(s.lanes)));
      }
      rte_pktmbuf_free_bulk(got, k);
      r.replies += k;
      if (k == 0 && std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("feeder: " + std::to_string(r.replies) + " of " + std::to_string(want) +
                                 " replies after 60 s");
    }
    r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.server_cpu_s = cpu_s(server_clock) - c0;
    r.mono1 = cpu_s(CLOCK_MONOTONIC);
    for (uint64_t q = 0; q < s.packets; ++q)
      if (results[q] != s.expected_sum(q)) ++r.bad_results;
    return r;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dpdk_aggregator_bench: thc-aggregator-dpdk's server per core, on a port of two rte_rings"};
  int workers = 4, slots = 256, mtu = 1500, reps = 5;
  uint64_t packets = 4000;
  bool skip_csum = false, no_tx_csum = false;
  app.add_option("--workers", workers, "workers of the job")->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--packets", packets, "packets per worker and repetition")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--slots", slots, "the job's window S")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--mtu", mtu, "path MTU (bounds the lanes per packet)")->capture_default_str()->check(CLI::Range(576, 9000));
  app.add_option("--reps", reps, "repetitions, each a new job (median and range printed)")->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_flag("--skip-udp-checksum", skip_csum, "the server does not verify UDP checksums (a NIC's rx offload would)");
  app.add_flag("--no-tx-udp-checksum", no_tx_csum, "the server sends UDP checksum 0 (a NIC's tx offload would fill it)");
  CLI11_PARSE(app, argc, argv);

  // EAL pins this thread (the server's lcore) to one CPU and a thread started later would inherit
  // that: the feeder takes the CPUs we were given, less the server's where there are others.
  cpu_set_t given;
  CPU_ZERO(&given);
  sched_getaffinity(0, sizeof given, &given);
  const uint64_t frames_per_rep = packets * static_cast<uint64_t>(workers);
  unsigned ring = 1024;  // rx: kAhead frames at most; tx: the replies the feeder has not drained yet
  while (ring < frames_per_rep + 64) ring *= 2;
  const uint16_t room = static_cast<uint16_t>((mtu + 14 + 63) / 64 * 64);
  const std::string prefix = "--file-prefix=thcdab" + std::to_string(getpid());
  const uint64_t pool_mb = 8192ull * (room + RTE_PKTMBUF_HEADROOM + 256) / (1 << 20);
  const std::string mem = std::to_string(std::max<uint64_t>(512, 2 * pool_mb + 256));
  int server_cpu = 0;
  while (server_cpu < CPU_SETSIZE && !CPU_ISSET(server_cpu, &given)) ++server_cpu;
  cpu_set_t feeder_cpus = given;
  if (CPU_COUNT(&given) > 1) CPU_CLR(server_cpu, &feeder_cpus);
  const std::string lcores = "--lcores=0@" + std::to_string(server_cpu);
  std::vector<std::string> eal = {argv[0], "--no-huge", "-m", mem, "--no-pci", prefix, lcores, "--log-level=*:warning"};
  std::vector<char*> eargv;
  for (auto& a : eal) eargv.push_back(a.data());
  eargv.push_back(nullptr);
  if (rte_eal_init(static_cast<int>(eal.size()), eargv.data()) < 0) {
    std::fprintf(stderr, "dpdk_aggregator_bench: rte_eal_init: %s\n", rte_strerror(rte_errno));
    return 1;
  }
  int rc = 0;
  try {
    rte_ring* rx = rte_ring_create("thcb_rx", ring, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
    rte_ring* tx = rte_ring_create("thcb_tx", ring, SOCKET_ID_ANY, RING_F_SP_ENQ | RING_F_SC_DEQ);
    if (rx == nullptr || tx == nullptr) throw std::runtime_error(std::string("rte_ring_create: ") + rte_strerror(rte_errno));
    const int port = from_rings()("thcb_port", &rx, 1, &tx, 1, rte_socket_id());
    if (port < 0) throw std::runtime_error(std::string("rte_eth_from_rings: ") + rte_strerror(rte_errno));
    rte_mempool* pool = rte_pktmbuf_pool_create("thcb_feed", 8192, 0, 0,
                                                static_cast<uint16_t>(room + RTE_PKTMBUF_HEADROOM), SOCKET_ID_ANY);
    if (pool == nullptr) throw std::runtime_error(std::string("rte_pktmbuf_pool_create: ") + rte_strerror(rte_errno));

    ReplayStream proto_stream = thc::bench::make_stream(workers, packets, slots, mtu);
    sw::DpdkServerOptions o;
    o.ip = kServerIp;
    o.port = kServerPort;
    o.port_id = static_cast<uint16_t>(port);
    o.workers = 0;
    o.idle_sleep_us = 50;  // the server's default: it sleeps between repetitions, never while its ring holds frames
    o.mtu = mtu;
    o.max_slots = static_cast<uint32_t>(std::max(slots, 1));
    o.seed = 1;
    o.verify_udp_checksum = !skip_csum;
    o.tx_udp_checksum = !no_tx_csum;
    o.keys = std::make_shared<sw::auth::KeyRing>(std::vector<sw::auth::Key>{proto_stream.key});
    sw::DpdkServer srv(o);
    std::printf("# dpdk_aggregator_bench: %s\n", srv.describe().c_str());
    std::printf("# THC b=4 -> u8, %d lanes (mtu %d), %d workers, %llu packets per worker, window %d, %d reps, "
                "UDP checksum %s rx / %s tx\n",
                proto_stream.lanes, mtu, workers, static_cast<unsigned long long>(packets), slots, reps,
                skip_csum ? "skipped" : "verified", no_tx_csum ? "0" : "computed");

    clockid_t server_clock;
    pthread_getcpuclockid(pthread_self(), &server_clock);  // run() below runs on this thread
    Feeder f{rx, tx, pool, srv.local(), true, room};
    std::vector<Rep> out;
    std::string error;
    std::thread feeder([&] {
      pthread_setaffinity_np(pthread_self(), sizeof feeder_cpus, &feeder_cpus);
      try {
        for (int k = 0; k < reps; ++k) {
          ReplayStream s = thc::bench::make_stream(workers, packets, slots, mtu, 100 + static_cast<uint32_t>(k));
          out.push_back(f.run(s, server_clock));
        }
      } catch (const std::exception& e) {
        error = e.what();
      }
      srv.request_stop();
    });
    srv.run();
    feeder.join();
    if (!error.empty()) throw std::runtime_error(error);

    std::printf("%4s %10s %10s %12s %12s %14s %9s %8s %8s\n", "rep", "wall_ms", "srv_cpu", "ns/dgm", "Mdgm/s",
                "Glanes/s/core", "replies", "bad", "starved");
    std::vector<double> ns, mdg, gl;
    uint64_t bad = 0;
    for (size_t k = 0; k < out.size(); ++k) {
      const Rep& r = out[k];
      const double per = r.wall_s / static_cast<double>(r.datagrams);
      ns.push_back(per * 1e9);
      mdg.push_back(1e-6 / per);
      gl.push_back(static_cast<double>(r.datagrams * r.lanes) / r.wall_s / 1e9);
      bad += r.bad_results;
      std::printf("%4zu %10.2f %9.0f%% %12.0f %12.2f %14.2f %9llu %8llu %8llu\n", k, r.wall_s * 1e3,
                  100.0 * r.server_cpu_s / r.wall_s, ns.back(), mdg.back(), gl.back(),
                  static_cast<unsigned long long>(r.replies), static_cast<unsigned long long>(r.bad_results),
                  static_cast<unsigned long long>(r.starved));
    }
    std::printf("# timed windows (CLOCK_MONOTONIC s, for perf report --time):");
    for (const Rep& r : out) std::printf(" %.6f,%.6f", r.mono0, r.mono1);
    std::printf("\n");
    std::printf("median: %.0f ns per upstream datagram, %.2f M datagrams/s, %.2f G lanes/s on one lcore "
                "(range %.2f-%.2f)\n",
                median(ns), median(mdg), median(gl), *std::min_element(gl.begin(), gl.end()),
                *std::max_element(gl.begin(), gl.end()));
    const std::vector<uint64_t> st = srv.stats();
    const uint64_t done = sw::stats_get(st, "slots_completed");
    std::printf("server: %s\nport: %s\n", sw::stats_line(st).c_str(), srv.port_stats_line().c_str());
    if (bad != 0 || done != packets * static_cast<uint64_t>(reps)) {
      std::fprintf(stderr, "dpdk_aggregator_bench: %llu wrong results, %llu of %llu slots completed\n",
                   static_cast<unsigned long long>(bad), static_cast<unsigned long long>(done),
                   static_cast<unsigned long long>(packets * static_cast<uint64_t>(reps)));
      rc = 3;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dpdk_aggregator_bench: %s\n", e.what());
    rc = 1;
  }
  rte_eal_cleanup();
  return rc;
}
