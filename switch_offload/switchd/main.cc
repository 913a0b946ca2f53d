// thc-switchd: the control plane of a THC aggregation switch (see switchd.h and README.md
// "Running on a switch").
//
//   thc-switchd --key-file KEYS --ip SWITCH_IP --route SWITCH_IP,CPU_PORT,MAC --route W_IP,PORT,MAC ...
//               [--routes FILE] [--dataplane bmv2 --thrift 127.0.0.1:9090] [--port 9471] ...
//
// SIGINT/SIGTERM remove its jobs from the data plane, print the final counters and exit 0.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>

#include "common/net.h"
#include "common/status.h"
#include "switch_offload/protocol/auth.h"
#include "switch_offload/switchd/bmv2_dataplane.h"
#include "switch_offload/switchd/switchd.h"
#if defined(THC_WITH_TOFINO_BFRT)
#include "switch_offload/switchd/bfrt_dataplane.h"
#endif

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

std::string switchd_stats_line(const std::vector<uint64_t>& v) {
  const auto names = thc::switch_offload::switchd::Switchd::names();
  std::string s;
  for (size_t i = 0; i < v.size() && i < names.size(); ++i) {
    // Drop reasons and data-plane drop reasons that never happened are left out.
    if (v[i] == 0 && (names[i].rfind("drop_", 0) == 0 || names[i].rfind("dp_drop_", 0) == 0)) continue;
    s += (s.empty() ? "" : " ") + names[i] + "=" + std::to_string(v[i]);
  }
  return s;
}

bool split_host_port(const std::string& s, std::string* host, int* port) {
  const size_t c = s.rfind(':');
  if (c == std::string::npos || c == 0) return false;
  *host = s.substr(0, c);
  char* end = nullptr;
  const long p = std::strtol(s.c_str() + c + 1, &end, 10);
  if (*end || p < 1 || p > 65535) return false;
  *port = static_cast<int>(p);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace thc::switch_offload;
  using namespace thc::switch_offload::switchd;
  CLI::App app{"thc-switchd: control plane of a THC aggregation switch (JOIN/TABLE/LEAVE/STATS on the switch's "
               "behalf; the data plane aggregates)"};
  SwitchdOptions opt;
  std::string key_file, ip, switch_mac, routes_file, dataplane = "bmv2", thrift = "127.0.0.1:9090", port_file;
  std::string bfrt = "127.0.0.1:50052", p4_name = "thc";
  int bfrt_device = 0;
  std::vector<std::string> route_specs;
  bool create_key_file = false, no_loopback_stats = false, no_clear = false;
  int port = 9471;
  double idle_s = 600, stats_interval = 10, poll_s = 1;
  app.add_option("--key-file", key_file,
                 "keys that authenticate jobs, one ID:HEX per line (id 0: the operator key for STATS); mode 0600")
      ->required();
  app.add_flag("--create-key-file", create_key_file,
               "create --key-file with a fresh operator key (id 0) and tenant key (id 1) if it does not exist");
  app.add_option("--ip", ip, "the switch's IPv4 address: workers use udp://IP:PORT; thc-switchd binds it (its "
                             "interface behind the switch's CPU port holds it)")
      ->required();
  app.add_option("--port", port, "UDP port of the service (0: ephemeral, see --port-file)")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--route", route_specs,
                 "IP,PORT,MAC: packets to IP leave switch port PORT to MAC (repeatable; one for --ip itself, to the "
                 "CPU port, and one per worker host)");
  app.add_option("--routes", routes_file, "file of routes, one IP,PORT,MAC per line ('#' comments)");
  app.add_option("--switch-mac", switch_mac, "source MAC of the frames the switch sends (default 02:54:48:43:00:01)");
  app.add_option("--dataplane", dataplane, "bmv2 (simple_switch's Thrift API) or tofino (BfRt gRPC, when built "
                                           "with THC_WITH_TOFINO_BFRT)")
      ->capture_default_str();
  app.add_option("--thrift", thrift, "bmv2: simple_switch's Thrift server HOST:PORT")->capture_default_str();
  app.add_option("--bfrt", bfrt, "tofino: bf_switchd's BfRt gRPC server HOST:PORT")->capture_default_str();
  app.add_option("--bfrt-device", bfrt_device, "tofino: device id")->capture_default_str();
  app.add_option("--p4-name", p4_name, "tofino: the P4 program's name in bf_switchd")->capture_default_str();
  app.add_option("--max-jobs", opt.max_jobs, "concurrent jobs (at most the data plane's 64 job indices)")
      ->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--max-jobs-per-source", opt.max_jobs_per_source, "jobs one source address may hold")
      ->capture_default_str()->check(CLI::Range(1, 64));
  app.add_option("--max-slots", opt.max_slots, "slots per job (all jobs share the data plane's slot registers)")
      ->capture_default_str()->check(CLI::Range(1, 32768));
  app.add_option("--job-idle-timeout", idle_s, "seconds after which a job without control or data-plane traffic is "
                                               "freed")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--poll-interval", poll_s, "seconds between reads of the data plane's per-job packet counters")
      ->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", opt.seed, "seed for job seeds (0: random)")->capture_default_str();
  app.add_option("--stats-interval", stats_interval, "seconds between statistics lines (0: only at exit)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_flag("--no-loopback-stats", no_loopback_stats, "STATS only with the operator key, also from loopback");
  app.add_flag("--no-clear", no_clear, "keep what the data plane holds at start (default: remove every entry, "
                                       "multicast group and node first)");
  app.add_option("--port-file", port_file, "write the bound port to this file once serving");
  CLI11_PARSE(app, argc, argv);

  if (!parse_ip(ip, &opt.ip)) {
    std::fprintf(stderr, "thc-switchd: --ip '%s' is not an IPv4 address\n", ip.c_str());
    return 2;
  }
  if (!switch_mac.empty() && !parse_mac(switch_mac, &opt.switch_mac)) {
    std::fprintf(stderr, "thc-switchd: --switch-mac '%s' is not a MAC address\n", switch_mac.c_str());
    return 2;
  }
  std::string err;
  for (const std::string& s : route_specs) {
    Route r;
    if (!parse_route(s, &r, &err)) {
      std::fprintf(stderr, "thc-switchd: --%s\n", err.c_str());
      return 2;
    }
    opt.routes.push_back(r);
  }
  if (!routes_file.empty() && !load_routes(routes_file, &opt.routes, &err)) {
    std::fprintf(stderr, "thc-switchd: --routes: %s\n", err.c_str());
    return 2;
  }
  {
    std::vector<auth::Key> keys;
    if (create_key_file && ::access(key_file.c_str(), F_OK) != 0) {
      if (!auth::write_key_file(key_file, {auth::generate_key(auth::kOperatorKeyId), auth::generate_key(1)}, &err)) {
        std::fprintf(stderr, "thc-switchd: %s\n", err.c_str());
        return 2;
      }
      std::fprintf(stderr, "thc-switchd: created key file %s (operator key id 0, tenant key id 1)\n", key_file.c_str());
    }
    if (!auth::load_key_file(key_file, &keys, &err)) {
      std::fprintf(stderr, "thc-switchd: %s\n", err.c_str());
      return 2;
    }
    opt.keys = std::make_shared<auth::KeyRing>(keys);
  }
  opt.port = static_cast<uint16_t>(port);
  opt.job_idle_timeout_us = static_cast<uint64_t>(idle_s * 1e6);
  opt.poll_us = static_cast<uint64_t>(poll_s * 1e6);
  opt.stats_from_loopback = !no_loopback_stats;
  opt.clear = !no_clear;

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  try {
    std::unique_ptr<DataPlane> dp;
    std::string host;
    int tport = 0;
    if (dataplane == "bmv2") {
      if (!split_host_port(thrift, &host, &tport)) {
        std::fprintf(stderr, "thc-switchd: --thrift '%s' is not HOST:PORT\n", thrift.c_str());
        return 2;
      }
      dp = std::make_unique<Bmv2DataPlane>(host, tport);
    } else if (dataplane == "tofino") {
#if defined(THC_WITH_TOFINO_BFRT)
      dp = std::make_unique<BfrtDataPlane>(bfrt, bfrt_device, p4_name);
#else
      (void)bfrt_device;
      std::fprintf(stderr, "thc-switchd: --dataplane tofino needs a build with -DTHC_WITH_TOFINO_BFRT=ON (BfRt gRPC; "
                           "untested, see README)\n");
      return 2;
#endif
    } else {
      std::fprintf(stderr, "thc-switchd: --dataplane '%s': bmv2 or tofino\n", dataplane.c_str());
      return 2;
    }
    Switchd d(opt, std::move(dp));
    std::printf("%s listening on %s keys=%zu\n", thc::log_prefix("thc-switchd").c_str(), d.describe().c_str(),
                opt.keys->size());
    std::fflush(stdout);
    if (!port_file.empty()) {
      const std::string tmp = port_file + ".tmp";
      {
        std::ofstream f(tmp);
        f << d.port() << "\n";
      }
      if (std::rename(tmp.c_str(), port_file.c_str()) != 0) {
        std::perror("thc-switchd: --port-file");
        return 1;
      }
    }
    uint64_t next_line = thc::mono_us() + static_cast<uint64_t>(stats_interval * 1e6);
    while (!g_stop.load()) {
      d.run_once(100);
      if (stats_interval > 0 && thc::mono_us() >= next_line) {
        std::printf("%s stats: jobs=%zu %s\n", thc::log_prefix("thc-switchd").c_str(), d.jobs(),
                    switchd_stats_line(d.stats()).c_str());
        std::fflush(stdout);
        next_line = thc::mono_us() + static_cast<uint64_t>(stats_interval * 1e6);
      }
    }
    std::printf("%s stopping; final stats: %s\n", thc::log_prefix("thc-switchd").c_str(), switchd_stats_line(d.stats()).c_str());
    std::fflush(stdout);
    return 0;
  } catch (const thc::Error& e) {
    std::fprintf(stderr, "thc-switchd: %s\n", e.what());
    return 1;
  }
}
