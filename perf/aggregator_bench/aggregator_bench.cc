// aggregator_bench: throughput of the UDP aggregator on loopback. An in-process UdpServer with
// 1 or 2 threads, W workers (threads, one UdpReducer each) per job, J concurrent jobs, each
// worker running back-to-back allreduces of N elements. Prints one row per configuration:
// aggregated elements per second (result elements of all jobs), lanes added per second at the
// aggregator (elements x workers), upstream and total packets per second, with the packet sizes
// and encoding.
//
//   aggregator_bench [--elements N] [--reps R] [--workers 4] [--threads 1,2] [--jobs 1,2] [--window 64]
#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
  double seconds = 0;
  uint64_t up_pkts = 0, all_pkts = 0, lanes = 0, retrans = 0;
};

Row run(const Encoding& enc, int threads, int jobs, int workers, uint64_t n, int reps, int window) {
  thc::switch_offload::ServerOptions so;
  so.threads = threads;
  so.port = 0;
  so.seed = 1;
  UdpServer server(so);
  server.start();
  const int total = jobs * workers;
  Gate gate(total);
  std::vector<double> secs(total);
  std::vector<uint64_t> retrans(total);
  std::vector<std::thread> ts;
  for (int t = 0; t < total; ++t) {
    ts.emplace_back([&, t] {
      thc::transport::UdpClientOptions o;
      o.address = "udp://127.0.0.1:" + std::to_string(server.port());
      o.job_id = static_cast<uint32_t>(100 + t / workers);  // consecutive ids: one per thread shard
      o.rank = t % workers;
      o.world = workers;
      o.window = window;
      o.fault_from_env = false;
      thc::transport::UdpReducer red(o);
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
      gate.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) one();
      secs[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      retrans[t] = red.stats().retransmissions;
      gate.arrive_and_wait();
    });
  }
  for (auto& t : ts) t.join();
  const auto st = server.stats();
  server.stop();
  Row row;
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
  int reps = 5, workers = 4, window = 64;
  std::vector<int> threads = {1, 2}, jobs = {1};
  app.add_option("--elements", n, "elements per allreduce")->capture_default_str();
  app.add_option("--reps", reps, "timed allreduces per worker")->capture_default_str();
  app.add_option("--workers", workers, "workers per job")->capture_default_str();
  app.add_option("--threads", threads, "aggregator thread counts to run")->delimiter(',');
  app.add_option("--jobs", jobs, "concurrent job counts to run")->delimiter(',');
  app.add_option("--window", window, "packets in flight per worker")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::printf("# aggregator_bench: loopback UDP, %u lanes/packet, header %zu B, %llu elements/op, %d reps, "
              "window %d, %u cores\n",
              proto::kLanes, proto::kHeaderBytes, static_cast<unsigned long long>(n), reps, window,
              std::thread::hardware_concurrency());
  std::printf("%-24s %8s %8s %4s %4s %7s %12s %12s %12s %12s %8s\n", "encoding", "up_B", "down_B", "thr", "jobs",
              "workers", "Melem/s", "Mlanes/s", "up_kpkt/s", "all_kpkt/s", "retrans");
  for (const Encoding& e : kEncodings) {
    const size_t up = proto::kHeaderBytes + (e.index ? proto::data_payload_bytes(proto::MsgType::kDataIndex, e.wire, e.bits)
                                                     : proto::data_payload_bytes(proto::MsgType::kDataValue, e.wire, 0));
    const size_t down = proto::kHeaderBytes + proto::data_payload_bytes(proto::MsgType::kResult, e.wire, 0);
    for (int j : jobs) {
      for (int t : threads) {
        const Row r = run(e, t, j, workers, n, reps, window);
        const double elems = static_cast<double>(n) * reps * j;
        std::printf("%-24s %8zu %8zu %4d %4d %7d %12.2f %12.2f %12.1f %12.1f %8llu\n", e.name, up, down, t, j, workers,
                    elems / r.seconds / 1e6, r.lanes / r.seconds / 1e6, r.up_pkts / r.seconds / 1e3,
                    r.all_pkts / r.seconds / 1e3, static_cast<unsigned long long>(r.retrans));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
