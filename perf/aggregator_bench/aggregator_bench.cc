// aggregator_bench: throughput of the UDP aggregator on loopback. An in-process UdpServer with
// 1 or 2 threads, W workers (threads, one client each, sharded over every server thread) per
// job, J concurrent jobs, each worker running back-to-back allreduces of N elements, with 256
// lanes per packet (the Tofino profile) and with the lanes the path negotiates. Prints one row
// per configuration: aggregated elements per second (result elements of all jobs), lanes added
// per second at the aggregator (elements x workers) and per second of aggregator CPU time (per
// core), upstream and total datagrams per second, retransmissions, with the packet sizes.
//
//   aggregator_bench [--elements N] [--reps R] [--workers 4] [--threads 1,2] [--jobs 1,2]
//                    [--lanes 256,8192] [--mtu 1500]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <stdexcept>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <time.h>

#include <cstring>
#include <random>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/aggregator/lanes.h"
#include "switch_offload/protocol/auth.h"
#include "switch_offload/protocol/builder.h"
#include "switch_offload/protocol/wire.h"
#include "switch_offload/servers/udp/udp_server.h"
#include "transport/switch_client/udp/udp_client.h"
#include "perf/aggregator_bench/replay_stream.h"

namespace {

using thc::switch_offload::stats_get;
using thc::switch_offload::UdpServer;
using thc::transport::IntType;
using thc::transport::LookupTable;
namespace proto = thc::switch_offload::proto;

struct Encoding {
  const char* key;  // --encodings
  const char* name;
  bool index;
  int bits;
  IntType sum;
  proto::WireInt wire;
};

const Encoding kEncodings[] = {
    {"thc", "index b=4 -> u8 (THC)", true, 4, IntType::kU8, proto::WireInt::kU8},
    {"cnat", "index b=8 -> i16 (Cnat)", true, 8, IntType::kI16, proto::WireInt::kI16},
    {"cnat5", "index b=5 -> i16 (Cnat)", true, 5, IntType::kI16, proto::WireInt::kI16},
    {"u8", "value u8", false, 0, IntType::kU8, proto::WireInt::kU8},
    {"u32", "value u32", false, 0, IntType::kU32, proto::WireInt::kU32},
};

class Gate {
 public:
  explicit Gate(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lk(mu_);
    const int g = gen_;
    if (++c_ == n_) {
      c_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen_ != g; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, c_ = 0, gen_ = 0;
};

struct Row {
  double seconds = 0, cpu = 0, user = 0, kernel = 0;
  uint64_t up_pkts = 0, all_pkts = 0, lanes = 0, retrans = 0;
  int lanes_per_packet = 0;
  thc::UdpBatchStats io;  // the server's sockets, warm-up included
};

struct ServerIo {
  bool gso = true, gro = true;
};
ServerIo g_server_io;

Row run(const Encoding& enc, int threads, int jobs, int workers, uint64_t n, int reps, int lanes, int mtu) {
  namespace auth = thc::switch_offload::auth;
  const auth::Key key = auth::generate_key(1);
  thc::switch_offload::ServerOptions so;
  so.threads = threads;
  so.port = 0;
  so.seed = 1;
  so.mtu = mtu;
  so.keys = std::make_shared<auth::KeyRing>(std::vector<auth::Key>{key});
  so.gso = g_server_io.gso;
  so.gro = g_server_io.gro;
  UdpServer server(so);
  server.start();
  const int total = jobs * workers;
  Gate gate(total);
  std::vector<double> secs(total);
  std::vector<uint64_t> retrans(total);
  std::vector<int> lpp(total);
  double cpu0 = 0, user0 = 0, kernel0 = 0;
  std::vector<std::thread> ts;
  for (int t = 0; t < total; ++t) {
    ts.emplace_back([&, t] {
      thc::transport::UdpClientOptions o;
      o.address = "udp://127.0.0.1:" + std::to_string(server.port());
      o.job_label = static_cast<uint32_t>(100 + t / workers);
      o.key = key;
      o.rank = t % workers;
      o.world = workers;
      o.max_lanes = lanes;
      o.fault_from_env = false;
      auto redp = thc::transport::make_aggregator_reducer(o);
      thc::transport::Reducer& red = *redp;
      red.set_part_granule(16384);
      LookupTable table;
      table.bits = enc.bits;
      for (int z = 0; z < (1 << enc.bits); ++z) table.values.push_back(z % 31);
      std::vector<uint8_t> packed((n * enc.bits + 7) / 8, 0x5A);
      std::vector<uint8_t> buf(n * proto::wire_int_bytes(enc.wire), 1);
      auto one = [&] {
        if (enc.index) red.start_lookup_sum(packed.data(), n, table, buf.data(), enc.sum, nullptr)->wait();
        else red.start_sum(buf.data(), n, enc.sum)->wait();
      };
      one();  // warm-up: join, table install, first-touch of the slots
      thc::transport::Reducer::WireCounters w0, w1;
      red.wire_counters(&w0);
      gate.arrive_and_wait();
      if (t == 0) {
        cpu0 = server.cpu_seconds();
        server.cpu_split(&user0, &kernel0);
      }
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) one();
      secs[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      red.wire_counters(&w1);
      retrans[t] = w1.retransmissions - w0.retransmissions;
      lpp[t] = w1.packets > w0.packets ? static_cast<int>(reps * n / (w1.packets - w0.packets)) : 0;
      gate.arrive_and_wait();
    });
  }
  for (auto& t : ts) t.join();
  const auto st = server.stats();
  const double cpu1 = server.cpu_seconds();
  double user1 = 0, kernel1 = 0;
  server.cpu_split(&user1, &kernel1);
  server.stop();
  Row row;
  row.io = server.io_stats();
  row.cpu = cpu1 - cpu0;
  row.user = user1 - user0;
  row.kernel = kernel1 - kernel0;
  row.lanes_per_packet = lpp[0];
  for (double s : secs) row.seconds = std::max(row.seconds, s);
  for (uint64_t r : retrans) row.retrans += r;
  // Counters include the warm-up op; scale them to the timed reps.
  const double f = static_cast<double>(reps) / (reps + 1);
  row.up_pkts = static_cast<uint64_t>(stats_get(st, "rx_packets") * f);
  row.all_pkts = static_cast<uint64_t>((stats_get(st, "rx_packets") + stats_get(st, "tx_packets")) * f);
  row.lanes = static_cast<uint64_t>(stats_get(st, "elements") * f);
  return row;
}


// ---- Engine replay: the aggregator's user-space work per datagram, without sockets ----
//
// One job of W workers on a fresh Engine (fixed seed and incarnation, so the job's data key is the
// same for every fresh engine and one pre-signed stream serves every repetition): P packet
// sequence numbers per worker, THC b=4 -> u8 at the negotiated lanes, sent in seq order (every
// worker's p before anybody's p+1, as a window of in-flight packets does), handed to the engine in
// receive batches of kReplayBatch (what UdpServer takes per recvmmsg round). The same datagrams then
// go through the MAC alone (verify upstream; sign the results), the lookup-add alone, and the rest
// is bookkeeping (parse, slot state, result assembly).
constexpr size_t kReplayBatch = 256;
namespace sw = thc::switch_offload;

class NullSink final : public sw::Sink {
 public:
  void send(const thc::PeerAddr&, const uint8_t*, size_t len) override {
    ++packets;
    bytes += len;
  }
  uint64_t packets = 0, bytes = 0;
};
class KeepSink final : public sw::Sink {
 public:
  void send(const thc::PeerAddr&, const uint8_t* d, size_t len) override { out.emplace_back(d, d + len); }
  std::vector<std::vector<uint8_t>> out;
};

thc::PeerAddr loop_addr(int i) {
  thc::PeerAddr a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(static_cast<uint16_t>(40000 + i));
  in->sin_addr.s_addr = htonl(0x7F000001);
  a.len = sizeof(sockaddr_in);
  return a;
}

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Replay : thc::bench::ReplayStream {
  std::unique_ptr<sw::Engine> engine(sw::Stats* st) const {
    sw::EngineConfig c;
    c.seed = 7;
    c.incarnation = 11;
    c.max_slots_per_job = static_cast<uint32_t>(slots);
    c.payload_budget = budget;
    c.keys = std::make_shared<sw::auth::KeyRing>(std::vector<sw::auth::Key>{key});
    return std::make_unique<sw::Engine>(c, st);
  }
  // JOIN handshake of every worker on e; returns the job's data key.
  sw::auth::TagKey join(sw::Engine& e) const {
    return ReplayStream::join([&](int w, const std::vector<uint8_t>& req) {
      KeepSink k;
      e.handle(req.data(), req.size(), loop_addr(w), 1000, k);
      if (k.out.size() != 1) throw std::runtime_error("replay: no reply to a JOIN");
      return k.out[0];
    });
  }
};

Replay make_replay(int workers, uint64_t packets, int slots, int mtu) {
  Replay r;
  static_cast<thc::bench::ReplayStream&>(r) = thc::bench::make_stream(workers, packets, slots, mtu);
  sw::Stats st;
  auto e = r.engine(&st);
  r.id.dkey = r.join(*e);
  r.sign_data();
  return r;
}

struct ReplayRow {
  double total_ns = 0, mac_ns = 0, lookup_ns = 0;  // per upstream datagram, CPU time
  double wall_s = 0, cpu_s = 0;
};

// One engine's pass over the stream (a fresh engine: the stream's sequence numbers start at 0).
// Returns the CPU seconds of the handle() calls.
double replay_engine(const Replay& r) {
  sw::Stats st;
  auto e = r.engine(&st);
  r.join(*e);
  NullSink sink;
  std::vector<thc::PeerAddr> from;
  for (int w = 0; w < r.workers; ++w) from.push_back(loop_addr(w));
  const size_t n = r.off.size();
  std::vector<sw::Datagram> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = sw::Datagram{r.bytes.data() + r.off[i], r.len[i], &from[r.from[i]]};
  const double c0 = thread_cpu_s();
  for (size_t b = 0; b < n; b += kReplayBatch)
    e->handle_batch(in.data() + b, std::min(kReplayBatch, n - b), 2000, sink);
  const double c1 = thread_cpu_s();
  if (sw::stats_get(sw::stats_values(st), "elements") != n * static_cast<uint64_t>(r.lanes) ||
      sw::stats_get(sw::stats_values(st), "slots_completed") != r.packets)
    throw std::runtime_error("replay: the engine did not aggregate every datagram");
  return c1 - c0;
}

// The MAC alone, as the engine does it per receive batch: the upstream datagrams' tags side by
// side and compared; the results the batch completes signed together at its end (their payload
// hashes side by side, then every recipient's header tag).
double replay_mac(const Replay& r) {
  const size_t n = r.off.size(), W = static_cast<size_t>(r.workers), B = kReplayBatch;
  const size_t plen = static_cast<size_t>(r.lanes);
  std::vector<uint8_t> results(B * plen, 0x11), hdrs(B * proto::kHeaderBytes, 0x22);
  std::vector<const uint8_t*> rp(B), hp(B), ptr(B);
  std::vector<size_t> rl(B, plen);
  for (size_t i = 0; i < B; ++i) {
    rp[i] = results.data() + i * plen;
    hp[i] = hdrs.data() + i * proto::kHeaderBytes;
  }
  std::vector<const sw::auth::TagKey*> keys(B, &r.id.dkey);
  std::vector<uint64_t> tags(B), ph(B), phr(B);
  uint64_t ok = 0;
  const double c0 = thread_cpu_s();
  for (size_t b = 0; b < n; b += B) {
    const size_t m = std::min(B, n - b);
    for (size_t i = 0; i < m; ++i) ptr[i] = r.bytes.data() + r.off[b + i];
    sw::auth::compute_tags(keys.data(), ptr.data(), r.len.data() + b, m, tags.data());
    for (size_t i = 0; i < m; ++i) ok += tags[i] == sw::auth::tag_field(ptr[i]);
    const size_t nres = m / W;  // every worker's packet of a seq completes one slot
    sw::auth::payload_hashes(keys.data(), rp.data(), rl.data(), nres, ph.data());
    for (size_t k = 0; k < nres * W; ++k) phr[k] = ph[k / W];
    sw::auth::tags_from_hashes(keys.data(), hp.data(), phr.data(), nres * W, tags.data());
  }
  const double c1 = thread_cpu_s();
  if (ok != n) throw std::runtime_error("replay: a datagram did not verify");
  return c1 - c0;
}

// The lookup-add alone: each datagram's indices added into its slot's registers.
double replay_lookup(const Replay& r) {
  std::vector<uint8_t> regs(static_cast<size_t>(r.slots) * 2 * static_cast<size_t>(r.lanes));
  const size_t n = r.off.size();
  const double c0 = thread_cpu_s();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t seq = i / static_cast<size_t>(r.workers);
    uint8_t* reg = regs.data() + (seq % (2 * static_cast<uint64_t>(r.slots))) * static_cast<size_t>(r.lanes);
    sw::lanes::add_lookup(reg, 1, r.bytes.data() + r.off[i] + proto::kHeaderBytes, r.lanes, 4, r.table.values, false);
  }
  const double c1 = thread_cpu_s();
  volatile uint8_t sink = regs[regs.size() / 2];
  (void)sink;
  return c1 - c0;
}

ReplayRow run_replay(const Replay& r, int threads) {
  ReplayRow row;
  std::vector<double> tot(threads), mac(threads), look(threads);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      tot[t] = replay_engine(r);
      mac[t] = replay_mac(r);
      look[t] = replay_lookup(r);
    });
  for (auto& t : ts) t.join();
  row.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double dg = static_cast<double>(r.off.size()) * threads;
  for (int t = 0; t < threads; ++t) {
    row.total_ns += tot[t] / dg * 1e9;
    row.mac_ns += mac[t] / dg * 1e9;
    row.lookup_ns += look[t] / dg * 1e9;
    row.cpu_s += tot[t];
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aggregator_bench: thc-aggregator throughput per core (engine replay; UDP on loopback)"};
  uint64_t n = 1 << 20;
  int reps = 5, workers = 4, mtu = 1500, replay_reps = 5;
  uint64_t replay_packets = 2000;
  int replay_slots = 256;
  std::vector<int> threads = {1, 2}, jobs = {1}, lanes = {256, 8192}, replay_threads = {1, 2};
  std::vector<std::string> encodings = {"thc", "cnat", "cnat5", "u8", "u32"};
  bool no_udp = false, no_replay = false;
  app.add_option("--elements", n, "elements per allreduce")->capture_default_str();
  app.add_option("--reps", reps, "timed allreduces per worker")->capture_default_str();
  app.add_option("--workers", workers, "workers per job")->capture_default_str();
  app.add_option("--threads", threads, "aggregator thread counts to run")->delimiter(',');
  app.add_option("--jobs", jobs, "concurrent job counts to run")->delimiter(',');
  app.add_option("--lanes", lanes, "lanes per packet at most (256: Tofino profile; the MTU bounds the rest)")
      ->delimiter(',');
  app.add_option("--mtu", mtu, "the aggregator's path MTU (bounds the negotiated lanes)")->capture_default_str();
  app.add_option("--encodings", encodings, "encodings to run: thc (index b=4 -> u8), cnat (index b=8 -> i16), cnat5 (index b=5 -> i16: Cnat's codes with 16-bit sums for 2-128 workers), u8, u32")
      ->delimiter(',')
      ->check(CLI::IsMember({"thc", "cnat", "cnat5", "u8", "u32"}));
  app.add_option("--replay-packets", replay_packets, "engine replay: packets per worker")->capture_default_str();
  app.add_option("--replay-slots", replay_slots,
                 "engine replay: the job's window S (registers of 2S packets; the clients' default THC_AGG_SLOTS is "
                 "1024)")
      ->capture_default_str();
  app.add_option("--replay-reps", replay_reps, "engine replay: repetitions (median and range printed)")
      ->capture_default_str();
  app.add_option("--replay-threads", replay_threads, "engine replay: thread counts (one engine and job each)")
      ->delimiter(',');
  app.add_flag("--server-no-gro", [](int64_t) { g_server_io.gro = false; },
               "the server's sockets without UDP_GRO (one datagram per receive message)");
  app.add_flag("--server-no-gso", [](int64_t) { g_server_io.gso = false; },
               "the server's replies without UDP_SEGMENT (one datagram per send message)");
  app.add_flag("--no-udp", no_udp, "skip the loopback UDP table");
  app.add_flag("--no-replay", no_replay, "skip the engine replay table");
  CLI11_PARSE(app, argc, argv);

  if (!no_replay) {
    const Replay r = make_replay(workers, replay_packets, replay_slots, mtu);
    std::printf("# engine replay (no sockets): THC b=4 -> u8, %d lanes (mtu %d), %d workers, %llu packets per worker, "
                "window %d slots, batches of %zu, %d reps (median [min..max]); CPU time per upstream datagram\n",
                r.lanes, mtu, workers, static_cast<unsigned long long>(replay_packets), r.slots, kReplayBatch,
                replay_reps);
    std::printf("%4s %22s %8s %11s %12s %11s %14s %12s\n", "thr", "ns/dgm", "MAC_ns", "lookup_ns", "bookkeep_ns",
                "Mdgm/cpu-s", "Glanes/cpu-s", "Glanes/s");
    for (int t : replay_threads) {
      std::vector<ReplayRow> rows;
      for (int k = 0; k < replay_reps; ++k) rows.push_back(run_replay(r, t));
      auto med = [&](auto get) {
        std::vector<double> v;
        for (const auto& x : rows) v.push_back(get(x));
        std::sort(v.begin(), v.end());
        return std::vector<double>{v[v.size() / 2], v.front(), v.back()};
      };
      const auto tot = med([](const ReplayRow& x) { return x.total_ns; });
      const auto mac = med([](const ReplayRow& x) { return x.mac_ns; });
      const auto look = med([](const ReplayRow& x) { return x.lookup_ns; });
      const auto wall = med([&](const ReplayRow& x) {
        return static_cast<double>(r.off.size()) * t * r.lanes / (x.cpu_s / t) / 1e9;
      });
      char range[64];
      std::snprintf(range, sizeof range, "%.0f [%.0f..%.0f]", tot[0], tot[1], tot[2]);
      std::printf("%4d %22s %8.0f %11.0f %12.0f %11.2f %14.2f %12.2f\n", t, range, mac[0], look[0],
                  tot[0] - mac[0] - look[0], 1e3 / tot[0], r.lanes / tot[0], wall[0]);
      std::fflush(stdout);
    }
  }
  if (no_udp) return 0;

  std::printf("# aggregator_bench: loopback UDP, header %zu B, %llu elements/op, %d reps, mtu %d, %u cores "
              "(workers share them with the aggregator); per core = per aggregator CPU-second; ns per upstream "
              "datagram of aggregator CPU, kernel and user\n",
              proto::kHeaderBytes, static_cast<unsigned long long>(n), reps, mtu, std::thread::hardware_concurrency());
  std::printf("# server I/O (warm-up included): rx_dgm/call = datagrams per recvmmsg (empty polls included), "
              "rx_gro = share of datagrams that came in coalesced GRO buffers, tx_dgm/call = datagrams per "
              "sendmmsg, tx_gso = share sent in GSO buffers\n");
  std::printf("%-24s %6s %6s %6s %4s %4s %7s %10s %10s %14s %11s %11s %12s %7s %7s %7s %8s %11s %7s %11s %7s\n",
              "encoding", "lanes", "up_B", "down_B", "thr", "jobs", "workers", "Melem/s", "Mlanes/s", "Mlanes/cpu-s",
              "up_kdgm/s", "all_kdgm/s", "kdgm/cpu-s", "ns/dgm", "kern_ns", "user_ns", "retrans", "rx_dgm/call",
              "rx_gro", "tx_dgm/call", "tx_gso");
  for (const Encoding& e : kEncodings) {
    if (std::find(encodings.begin(), encodings.end(), e.key) == encodings.end()) continue;
    for (int l : lanes) {
      const proto::MsgType type = e.index ? proto::MsgType::kDataIndex : proto::MsgType::kDataValue;
      const int lpp = proto::lanes_for(type, e.wire, e.bits, l, mtu - 28 - static_cast<int>(proto::kHeaderBytes));
      const size_t up = proto::kHeaderBytes + proto::data_payload_bytes(type, e.wire, e.bits, lpp);
      const size_t down = proto::kHeaderBytes + proto::data_payload_bytes(proto::MsgType::kResult, e.wire, 0, lpp);
      for (int j : jobs) {
        for (int t : threads) {
          const Row r = run(e, t, j, workers, n, reps, l, mtu);
          const double elems = static_cast<double>(n) * reps * j;
          const double up_d = static_cast<double>(std::max<uint64_t>(r.up_pkts, 1));
          // The /proc split has clock-tick resolution; scale it to the precise CPU total.
          const double split = r.user + r.kernel > 0 ? r.cpu / (r.user + r.kernel) : 0;
          auto ratio = [](uint64_t a, uint64_t b) { return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
          std::printf("%-24s %6d %6zu %6zu %4d %4d %7d %10.2f %10.2f %14.2f %11.1f %11.1f %12.1f %7.0f %7.0f %7.0f %8llu "
                      "%11.2f %7.2f %11.2f %7.2f\n",
                      e.name, lpp, up, down, t, j, workers, elems / r.seconds / 1e6, r.lanes / r.seconds / 1e6,
                      r.cpu > 0 ? r.lanes / r.cpu / 1e6 : 0.0, r.up_pkts / r.seconds / 1e3, r.all_pkts / r.seconds / 1e3,
                      r.cpu > 0 ? up_d / r.cpu / 1e3 : 0.0, r.cpu / up_d * 1e9, r.kernel * split / up_d * 1e9,
                      r.user * split / up_d * 1e9, static_cast<unsigned long long>(r.retrans),
                      ratio(r.io.datagrams_received, r.io.recv_calls), ratio(r.io.gro_datagrams, r.io.datagrams_received),
                      ratio(r.io.datagrams_sent, r.io.send_calls), ratio(r.io.gso_datagrams, r.io.datagrams_sent));
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
