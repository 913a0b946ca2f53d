// thc-aggregator: the software aggregator (parameter server / switch emulator) over UDP.
//
//   thc-aggregator --key-file KEYS [--create-key-file] --port 9471 --threads 2 [--bind 127.0.0.1]
//                  [--stats-interval 10] [--max-jobs 64] [--max-memory 1G] [--mtu 1500]
//                  [--max-lanes 8192] [--fault-drop 0.01 ...]
//
// SIGINT/SIGTERM stop it cleanly and print the final counters.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include "common/status.h"
#include "common/net.h"
#include "switch_offload/servers/engine_cli.h"
#include "switch_offload/servers/udp/udp_server.h"

namespace {
std::string line_prefix() { return thc::log_prefix("thc-aggregator"); }
}  // namespace

int main(int argc, char** argv) {
  using namespace thc::switch_offload;
  CLI::App app{"thc-aggregator: in-network-style integer aggregation over UDP (THC software PS)"};
  ServerOptions opt;
  EngineCli engine_cli;
  int port = 9471;
  bool no_loopback_stats = false, no_gso = false, no_gro = false;
  double stats_interval = 10;
  std::string port_file;
  add_engine_options(app, opt, engine_cli);
  app.add_option("--port", port, "UDP port (0: pick an ephemeral port, see --port-file)")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--threads", opt.threads, "aggregation threads (every job is sharded over all of them)")
      ->check(CLI::Range(1, 256));
  app.add_flag("--no-loopback-stats", no_loopback_stats, "STATS only with the operator key, also from loopback");
  app.add_flag("--no-gso", no_gso, "send replies one datagram per message (no UDP_SEGMENT)");
  app.add_flag("--no-gro", no_gro, "receive one datagram per message (no UDP_GRO)");
  app.add_option("--bind", opt.bind, "address to bind")->capture_default_str();
  app.add_option("--stats-interval", stats_interval, "seconds between statistics lines (0: only at exit)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--port-file", port_file, "write the bound port to this file once listening");
  app.add_option("--fault-drop", opt.fault.drop, "probability to drop a datagram (each direction)")->check(CLI::Range(0.0, 1.0));
  app.add_option("--fault-dup", opt.fault.dup, "probability to duplicate a datagram")->check(CLI::Range(0.0, 1.0));
  app.add_option("--fault-reorder", opt.fault.reorder, "probability to hold a datagram behind the next")->check(CLI::Range(0.0, 1.0));
  app.add_option("--fault-delay-us", opt.fault.delay_us, "maximum random delay of a datagram (us)");
  app.add_option("--fault-delay-prob", opt.fault.delay_prob, "probability to delay a datagram (default 1 with --fault-delay-us)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--fault-seed", opt.fault.seed, "fault injection seed")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  opt.port = static_cast<uint16_t>(port);
  if (!finish_engine_options("thc-aggregator", engine_cli, opt)) return 2;
  if (opt.fault.delay_us > 0 && opt.fault.delay_prob == 0) opt.fault.delay_prob = 1.0;
  opt.stats_from_loopback = !no_loopback_stats;
  opt.gso = !no_gso;
  opt.gro = !no_gro;

  // Signals are taken synchronously by this thread only (blocked before the workers start, so
  // they inherit the mask): no async-signal-safety concerns, and shutdown is an ordinary path.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  try {
    UdpServer server(opt);
    server.start();
    std::printf("%s listening on %s threads=%d steering=%s gso=%d gro=%d mtu=%d max_lanes=%d keys=%zu max_jobs=%d "
                "max_memory=%lld%s%s\n",
                line_prefix().c_str(), server.address().c_str(), opt.threads,
                server.steering() ? "bpf-job-shard" : "none", server.gso() ? 1 : 0, server.gro() ? 1 : 0, opt.mtu,
                opt.max_lanes, opt.keys->size(), opt.max_jobs,
                static_cast<long long>(opt.max_memory), opt.fault.active() ? " fault: " : "",
                opt.fault.active() ? opt.fault.describe().c_str() : "");
    std::fflush(stdout);
    if (!port_file.empty()) {
      // Write then rename, so a reader polling for the file never sees it half written.
      const std::string tmp = port_file + ".tmp";
      {
        std::ofstream f(tmp);
        f << server.port() << "\n";
      }
      if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
        std::perror("thc-aggregator: --port-file");
        return 1;
      }
    }
    for (;;) {
      timespec ts;
      const double iv = stats_interval > 0 ? stats_interval : 3600;
      ts.tv_sec = static_cast<time_t>(iv);
      ts.tv_nsec = static_cast<long>((iv - std::floor(iv)) * 1e9);
      const int sig = sigtimedwait(&sigs, nullptr, &ts);
      if (sig == SIGINT || sig == SIGTERM) {
        server.stop();
        std::printf("%s stopping on %s; final stats: %s\n", line_prefix().c_str(), sig == SIGINT ? "SIGINT" : "SIGTERM",
                    stats_line(server.stats()).c_str());
        // How much the offloads coalesced on this path (a veth or bridge may segment GSO buffers,
        // GRO needs the receiving device's NAPI).
        const thc::UdpBatchStats io = server.io_stats();
        std::printf("%s socket I/O: %llu datagrams in over %llu recvmmsg calls, %llu in %llu GRO buffers; %llu out "
                    "over %llu sendmmsg calls, %llu in %llu GSO buffers\n",
                    line_prefix().c_str(), static_cast<unsigned long long>(io.datagrams_received),
                    static_cast<unsigned long long>(io.recv_calls), static_cast<unsigned long long>(io.gro_datagrams),
                    static_cast<unsigned long long>(io.gro_buffers), static_cast<unsigned long long>(io.datagrams_sent),
                    static_cast<unsigned long long>(io.send_calls), static_cast<unsigned long long>(io.gso_datagrams),
                    static_cast<unsigned long long>(io.gso_buffers));
        std::fflush(stdout);
        return 0;
      }
      if (sig < 0 && errno != EAGAIN && errno != EINTR) {
        std::perror("thc-aggregator: sigtimedwait");
        return 1;
      }
      if (sig < 0 && errno == EAGAIN && stats_interval > 0) {
        std::printf("%s stats: jobs=%zu %s\n", line_prefix().c_str(), server.jobs(), stats_line(server.stats()).c_str());
        std::fflush(stdout);
      }
    }
  } catch (const thc::Error& e) {
    std::fprintf(stderr, "thc-aggregator: %s\n", e.what());
    return 1;
  }
}
