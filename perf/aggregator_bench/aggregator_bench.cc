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
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "switch_offload/protocol/auth.h"
#include "switch_offload/protocol/wire.h"
#include "switch_offload/servers/udp/udp_server.h"
#include "transport/switch_client/udp/udp_client.h"

namespace {

using thc::switch_offload::stats_get;
using thc::switch_offload::UdpServer;
using thc::transport::IntType;
using thc::transport::LookupTable;
namespace proto = thc::switch_offload::proto;

struct Encoding {
  const char* name;
  bool index;
  int bits;
  IntType sum;
  proto::WireInt wire;
};

const Encoding kEncodings[] = {
    {"index b=4 -> u8 (THC)", true, 4, IntType::kU8, proto::WireInt::kU8},
    {"index b=8 -> i16 (Cnat)", true, 8, IntType::kI16, proto::WireInt::kI16},
    {"value u8", false, 0, IntType::kU8, proto::WireInt::kU8},
    {"value u32", false, 0, IntType::kU32, proto::WireInt::kU32},
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
  double seconds = 0, cpu = 0;
  uint64_t up_pkts = 0, all_pkts = 0, lanes = 0, retrans = 0;
  int lanes_per_packet = 0;
};

Row run(const Encoding& enc, int threads, int jobs, int workers, uint64_t n, int reps, int lanes, int mtu) {
  namespace auth = thc::switch_offload::auth;
  const auth::Key key = auth::generate_key(1);
  thc::switch_offload::ServerOptions so;
  so.threads = threads;
  so.port = 0;
  so.seed = 1;
  so.mtu = mtu;
  so.keys = std::make_shared<auth::KeyRing>(std::vector<auth::Key>{key});
  UdpServer server(so);
  server.start();
  const int total = jobs * workers;
  Gate gate(total);
  std::vector<double> secs(total);
  std::vector<uint64_t> retrans(total);
  std::vector<int> lpp(total);
  double cpu0 = 0;
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
      if (t == 0) cpu0 = server.cpu_seconds();
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
  server.stop();
  Row row;
  row.cpu = cpu1 - cpu0;
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"aggregator_bench: thc-aggregator (UDP, loopback) throughput"};
  uint64_t n = 1 << 20;
  int reps = 5, workers = 4, mtu = 1500;
  std::vector<int> threads = {1, 2}, jobs = {1}, lanes = {256, 8192};
  app.add_option("--elements", n, "elements per allreduce")->capture_default_str();
  app.add_option("--reps", reps, "timed allreduces per worker")->capture_default_str();
  app.add_option("--workers", workers, "workers per job")->capture_default_str();
  app.add_option("--threads", threads, "aggregator thread counts to run")->delimiter(',');
  app.add_option("--jobs", jobs, "concurrent job counts to run")->delimiter(',');
  app.add_option("--lanes", lanes, "lanes per packet at most (256: Tofino profile; the MTU bounds the rest)")
      ->delimiter(',');
  app.add_option("--mtu", mtu, "the aggregator's path MTU (bounds the negotiated lanes)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::printf("# aggregator_bench: loopback UDP, header %zu B, %llu elements/op, %d reps, mtu %d, %u cores "
              "(workers share them with the aggregator)\n",
              proto::kHeaderBytes, static_cast<unsigned long long>(n), reps, mtu, std::thread::hardware_concurrency());
  std::printf("%-24s %6s %6s %6s %4s %4s %7s %10s %10s %14s %11s %11s %8s\n", "encoding", "lanes", "up_B", "down_B",
              "thr", "jobs", "workers", "Melem/s", "Mlanes/s", "Mlanes/cpu-s", "up_kdgm/s", "all_kdgm/s", "retrans");
  for (const Encoding& e : kEncodings) {
    for (int l : lanes) {
      const proto::MsgType type = e.index ? proto::MsgType::kDataIndex : proto::MsgType::kDataValue;
      const int lpp = proto::lanes_for(type, e.wire, e.bits, l, mtu - 28 - static_cast<int>(proto::kHeaderBytes));
      const size_t up = proto::kHeaderBytes + proto::data_payload_bytes(type, e.wire, e.bits, lpp);
      const size_t down = proto::kHeaderBytes + proto::data_payload_bytes(proto::MsgType::kResult, e.wire, 0, lpp);
      for (int j : jobs) {
        for (int t : threads) {
          const Row r = run(e, t, j, workers, n, reps, l, mtu);
          const double elems = static_cast<double>(n) * reps * j;
          std::printf("%-24s %6d %6zu %6zu %4d %4d %7d %10.2f %10.2f %14.2f %11.1f %11.1f %8llu\n", e.name, lpp, up, down,
                      t, j, workers, elems / r.seconds / 1e6, r.lanes / r.seconds / 1e6,
                      r.cpu > 0 ? r.lanes / r.cpu / 1e6 : 0.0, r.up_pkts / r.seconds / 1e3, r.all_pkts / r.seconds / 1e3,
                      static_cast<unsigned long long>(r.retrans));
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
