// thc-aggregator: the software aggregator (parameter server / switch emulator) over UDP.
//
//   thc-aggregator --key-file KEYS [--create-key-file] --port 9471 --threads 2 [--bind 127.0.0.1]
//                  [--stats-interval 10] [--max-jobs 64] [--max-memory 1G] [--mtu 1500]
//                  [--max-lanes 8192] [--fault-drop 0.01 ...]
//
// SIGINT/SIGTERM stop it cleanly and print the final counters.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include "common/status.h"
#include "common/net.h"
#include "switch_offload/protocol/auth.h"
#include "switch_offload/servers/udp/udp_server.h"

namespace {
std::string line_prefix() { return thc::log_prefix("thc-aggregator"); }
}  // namespace

int main(int argc, char** argv) {
  using namespace thc::switch_offload;
  CLI::App app{"thc-aggregator: in-network-style integer aggregation over UDP (THC software PS)"};
  ServerOptions opt;
  int port = 9471;
  std::string key_file;
  bool create_key_file = false;
  bool no_loopback_stats = false, no_gso = false, no_gro = false;
  double stats_interval = 10;
  std::string max_memory = "1G";
  double idle_s = 600;
  double dead_worker_ms = 1000;
  std::string port_file;
  app.add_option("--key-file", key_file,
                 "keys that authenticate jobs, one ID:HEX per line (id 0: the operator key for STATS); mode 0600")
      ->required();
  app.add_flag("--create-key-file", create_key_file,
               "create --key-file with a fresh operator key (id 0) and tenant key (id 1) if it does not exist");
  app.add_option("--port", port, "UDP port (0: pick an ephemeral port, see --port-file)")->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--threads", opt.threads, "aggregation threads (every job is sharded over all of them)")
      ->check(CLI::Range(1, 256));
  app.add_option("--mtu", opt.mtu, "path MTU to the workers: bounds the lanes per packet")->capture_default_str()
      ->check(CLI::Range(576, 9000));
  app.add_option("--max-lanes", opt.max_lanes, "lanes per packet offered at most (multiple of 64; 256 = Tofino profile)")
      ->capture_default_str()->check(CLI::Range(64, 8192));
  app.add_option("--max-jobs-per-source", opt.max_jobs_per_source, "jobs one source address may hold")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  std::string max_memory_per_tenant;
  app.add_option("--max-jobs-per-tenant", opt.max_jobs_per_tenant,
                 "jobs one tenant key may hold (0: an equal share of --max-jobs per tenant key)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--max-memory-per-tenant", max_memory_per_tenant,
                 "slot memory one tenant key may hold (K/M/G; default: an equal share of --max-memory per tenant key)");
  app.add_flag("--no-loopback-stats", no_loopback_stats, "STATS only with the operator key, also from loopback");
  app.add_flag("--no-gso", no_gso, "send replies one datagram per message (no UDP_SEGMENT)");
  app.add_flag("--no-gro", no_gro, "receive one datagram per message (no UDP_GRO)");
  app.add_option("--bind", opt.bind, "address to bind")->capture_default_str();
  app.add_option("--stats-interval", stats_interval, "seconds between statistics lines (0: only at exit)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--max-jobs", opt.max_jobs, "concurrent jobs")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-memory", max_memory, "slot memory over all jobs (K/M/G suffixes)")->capture_default_str();
  app.add_option("--max-slots", opt.max_slots, "slots per job (a job's window)")->capture_default_str()->check(CLI::Range(1, 32768));
  app.add_option("--job-idle-timeout", idle_s, "seconds after which a silent job is freed")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dead-worker-ms", dead_worker_ms,
                 "a member of a started quorum operation that sends nothing for this long (and at least the job's quorum "
                 "timeout) is taken for dead: the operation completes without it and fails on every rank")
      ->capture_default_str()->check(CLI::Range(1.0, 3.6e6));
  app.add_option("--seed", opt.seed,
                 "seed for job seeds (0: random); a random per-process value is mixed in either way, so no job seed "
                 "repeats after a restart")->capture_default_str();
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
  if (!parse_bytes(max_memory, &opt.max_memory)) {
    std::fprintf(stderr, "thc-aggregator: --max-memory '%s' is not a size (e.g. 512M)\n", max_memory.c_str());
    return 2;
  }
  if (!max_memory_per_tenant.empty() && !parse_bytes(max_memory_per_tenant, &opt.max_memory_per_tenant)) {
    std::fprintf(stderr, "thc-aggregator: --max-memory-per-tenant '%s' is not a size (e.g. 512M)\n",
                 max_memory_per_tenant.c_str());
    return 2;
  }
  if (opt.fault.delay_us > 0 && opt.fault.delay_prob == 0) opt.fault.delay_prob = 1.0;
  opt.stats_from_loopback = !no_loopback_stats;
  opt.gso = !no_gso;
  opt.gro = !no_gro;
  {
    std::string err;
    std::vector<auth::Key> keys;
    if (create_key_file && ::access(key_file.c_str(), F_OK) != 0) {
      if (!auth::write_key_file(key_file, {auth::generate_key(auth::kOperatorKeyId), auth::generate_key(1)}, &err)) {
        std::fprintf(stderr, "thc-aggregator: %s\n", err.c_str());
        return 2;
      }
      std::fprintf(stderr, "thc-aggregator: created key file %s (operator key id 0, tenant key id 1); give workers "
                           "the tenant key: THC_AGGREGATOR_KEY_FILE=%s\n", key_file.c_str(), key_file.c_str());
    }
    if (!auth::load_key_file(key_file, &keys, &err)) {
      std::fprintf(stderr, "thc-aggregator: %s\n", err.c_str());
      return 2;
    }
    opt.keys = std::make_shared<auth::KeyRing>(keys);
  }
  opt.job_idle_timeout_us = static_cast<uint64_t>(idle_s * 1e6);
  opt.dead_worker_us = static_cast<uint64_t>(dead_worker_ms * 1e3);

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
