// thc-aggregator-dpdk: the aggregator (thc-aggregator's Engine) on a DPDK port.
//
//   thc-aggregator-dpdk [EAL options] -- --ip A.B.C.D --key-file KEYS [--port 9471] [--port-id 0] [--workers 1]
//                       [--max-jobs 64] [--max-memory 1G] [--max-slots 4096] [--job-idle-timeout 600]
//                       [--seed S] [--stats-interval 10] [--port-file FILE]
// e.g. (no hugepages, a veth through af_packet):
//   thc-aggregator-dpdk --no-huge -m 512 --no-pci --file-prefix=thc1 -l 0-1
//                       --vdev=net_af_packet0,iface=veth0 -- --ip 10.77.0.1 --key-file keys --port 9471 --workers 1
//
// SIGINT/SIGTERM stop it cleanly: the lcores return, the final counters are printed, the port is
// stopped and closed and the EAL cleaned up.
#include <arpa/inet.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/net.h"
#include "switch_offload/servers/dpdk/dpdk_server.h"
#include "switch_offload/servers/engine_cli.h"

namespace {
std::string line_prefix() { return thc::log_prefix("thc-aggregator-dpdk"); }
}  // namespace

int main(int argc, char** argv) {
  using namespace thc::switch_offload;
  // EAL options before "--", ours after it. Ours are parsed first, so a bad option fails before
  // the EAL takes the machine's resources.
  int dash = -1;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--") == 0) {
      dash = i;
      break;
    }
  std::vector<char*> eal_args{argv[0]};
  std::vector<char*> app_args{argv[0]};
  for (int i = 1; i < (dash < 0 ? argc : dash); ++i) eal_args.push_back(argv[i]);
  if (dash >= 0)
    for (int i = dash + 1; i < argc; ++i) app_args.push_back(argv[i]);

  CLI::App app{"thc-aggregator-dpdk: the THC aggregator (thc-aggregator's engine) on a DPDK port", "thc-aggregator-dpdk"};
  app.footer("Usage: thc-aggregator-dpdk [EAL options] -- --ip A.B.C.D [options above]\n"
             "e.g.:  thc-aggregator-dpdk --no-huge -m 512 --no-pci --file-prefix=thc1 -l 0-1 "
             "--vdev=net_af_packet0,iface=veth0 -- --ip 10.77.0.1 --workers 1");
  DpdkServerOptions opt;
  EngineCli engine_cli;
  std::string ip;
  int port = 9471;
  int port_id = 0;
  double stats_interval = 10;
  std::string port_file;
  bool skip_udp_csum = false;
  bool no_tx_udp_csum = false;
  app.add_option("--ip", ip, "the aggregator's IPv4 address (answers ARP for it)")->required();
  app.add_option("--port", port, "UDP port")->capture_default_str()->check(CLI::Range(1, 65535));
  add_engine_options(app, opt, engine_cli);
  app.add_option("--port-id", port_id, "DPDK port id")->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--workers", opt.workers, "aggregation lcores besides the RX lcore (0: the main lcore does everything)")
      ->capture_default_str()->check(CLI::Range(0, 1024));
  app.add_option("--stats-interval", stats_interval, "seconds between statistics lines (0: only at exit)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--port-file", port_file, "write the UDP port to this file once the port is up (a readiness signal)");
  app.add_option("--idle-sleep-us", opt.idle_sleep_us, "sleep of an idle poll loop in microseconds (0: pure polling)")
      ->capture_default_str()->check(CLI::Range(0, 1000));
  app.add_option("--rx-desc", opt.rx_desc, "rx descriptors per queue")->capture_default_str()->check(CLI::Range(32, 32768));
  app.add_option("--tx-desc", opt.tx_desc, "tx descriptors per queue")->capture_default_str()->check(CLI::Range(32, 32768));
  app.add_option("--ring-size", opt.ring_size, "RX lcore -> worker ring entries (power of two)")->capture_default_str()
      ->check(CLI::Range(64, 1 << 20));
  app.add_flag("--skip-udp-checksum", skip_udp_csum,
               "accept frames whose UDP checksum is wrong (peers whose checksum offload leaves it unfilled, e.g. veth + af_packet)");
  app.add_flag("--no-tx-udp-checksum", no_tx_udp_csum, "send UDP checksum 0 (none) instead of computing it");
  try {
    app.parse(static_cast<int>(app_args.size()), app_args.data());
  } catch (const CLI::ParseError& e) {
    if (dash < 0 && e.get_exit_code() != 0)
      std::fprintf(stderr, "thc-aggregator-dpdk: our options go after the EAL options and a '--'\n");
    return app.exit(e);
  }
  in_addr a{};
  if (inet_pton(AF_INET, ip.c_str(), &a) != 1 || a.s_addr == 0) {
    std::fprintf(stderr, "thc-aggregator-dpdk: --ip '%s' is not an IPv4 address\n", ip.c_str());
    return 2;
  }
  opt.ip = ntohl(a.s_addr);
  opt.port = static_cast<uint16_t>(port);
  opt.port_id = static_cast<uint16_t>(port_id);
  if ((opt.ring_size & (opt.ring_size - 1)) != 0) {
    std::fprintf(stderr, "thc-aggregator-dpdk: --ring-size must be a power of two\n");
    return 2;
  }
  if (!finish_engine_options("thc-aggregator-dpdk", engine_cli, opt)) return 2;
  opt.verify_udp_checksum = !skip_udp_csum;
  opt.tx_udp_checksum = !no_tx_udp_csum;

  // SIGINT/SIGTERM are blocked before the EAL creates its threads (they inherit the mask) and
  // taken synchronously by the control thread below: no async-signal-safety concerns.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  int eal_argc = static_cast<int>(eal_args.size());
  eal_args.push_back(nullptr);
  if (rte_eal_init(eal_argc, eal_args.data()) < 0) {
    std::fprintf(stderr, "thc-aggregator-dpdk: rte_eal_init: %s\n", rte_strerror(rte_errno));
    return 1;
  }

  int rc = 0;
  try {
    DpdkServer server(opt);
    std::printf("%s listening on udp://%s:%d %s max_jobs=%d max_memory=%lld\n", line_prefix().c_str(), ip.c_str(), port,
                server.describe().c_str(), opt.max_jobs, static_cast<long long>(opt.max_memory));
    std::fflush(stdout);
    if (!port_file.empty()) {
      // Write then rename, so a reader polling for the file never sees it half written.
      const std::string tmp = port_file + ".tmp";
      {
        std::ofstream f(tmp);
        f << port << "\n";
      }
      if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
        std::perror("thc-aggregator-dpdk: --port-file");
        rc = 1;
      }
    }

    if (rc == 0) {
      // The control thread: signals and the periodic statistics line. It polls a 100 ms wait so it
      // also ends when run() returns for another reason.
      std::atomic<bool> done{false};
      std::atomic<int> got_signal{0};
      std::thread control([&] {
        auto next = std::chrono::steady_clock::now() + std::chrono::duration<double>(stats_interval);
        const timespec ts{0, 100'000'000};
        while (!done.load()) {
          const int sig = sigtimedwait(&sigs, nullptr, &ts);
          if (sig == SIGINT || sig == SIGTERM) {
            got_signal.store(sig);
            server.request_stop();
            return;
          }
          if (stats_interval > 0 && std::chrono::steady_clock::now() >= next) {
            next += std::chrono::duration<double>(stats_interval);
            std::printf("%s stats: jobs=%zu %s %s\n", line_prefix().c_str(), server.jobs(), stats_line(server.stats()).c_str(),
                        server.port_stats_line().c_str());
            std::fflush(stdout);
          }
        }
      });
      try {
        server.run();
      } catch (...) {
        done.store(true);
        control.join();
        throw;
      }
      done.store(true);
      control.join();
      const int sig = got_signal.load();
      std::printf("%s stopping on %s; final stats: %s %s\n", line_prefix().c_str(),
                  sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "error", stats_line(server.stats()).c_str(),
                  server.port_stats_line().c_str());
      std::fflush(stdout);
    }
  } catch (const thc::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // the messages name the program already
    rc = 1;
  }
  rte_eal_cleanup();
  return rc;
}
