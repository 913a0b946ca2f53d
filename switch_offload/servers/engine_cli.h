// The command-line options of EngineOptions, shared by thc-aggregator and thc-aggregator-dpdk
// (one text per option, one parser of sizes and timers, one loader of the key file).
//
//   EngineCli cli;
//   add_engine_options(app, opt, cli);     // before parsing
//   CLI11_PARSE(app, argc, argv);
//   if (!finish_engine_options("thc-aggregator", cli, opt)) return 2;   // after: messages printed
#pragma once

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "switch_offload/protocol/auth.h"
#include "switch_offload/servers/engine_options.h"

namespace thc::switch_offload {

// The options given as text or in other units than EngineOptions keeps.
struct EngineCli {
  std::string key_file;
  bool create_key_file = false;
  std::string max_memory = "1G";
  std::string max_memory_per_tenant;
  double idle_s = 600;
  double dead_worker_ms = 1000;
};

// Parses "123", "64K", "16M", "1G" (binary units). Returns false if malformed.
inline bool parse_bytes(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || end == s.c_str() || v < 0) return false;
  int64_t mul = 1;
  const std::string suf(end);
  if (suf.empty() || suf == "B") mul = 1;
  else if (suf == "K" || suf == "KiB" || suf == "k") mul = int64_t{1} << 10;
  else if (suf == "M" || suf == "MiB") mul = int64_t{1} << 20;
  else if (suf == "G" || suf == "GiB") mul = int64_t{1} << 30;
  else return false;
  if (v > (int64_t{1} << 62) / mul) return false;
  *out = v * mul;
  return true;
}

inline void add_engine_options(CLI::App& app, EngineOptions& opt, EngineCli& cli) {
  app.add_option("--key-file", cli.key_file,
                 "keys that authenticate jobs, one ID:HEX per line (id 0: the operator key for STATS); mode 0600")
      ->required();
  app.add_flag("--create-key-file", cli.create_key_file,
               "create --key-file with a fresh operator key (id 0) and tenant key (id 1) if it does not exist");
  app.add_option("--mtu", opt.mtu, "path MTU to the workers: bounds the lanes per packet")->capture_default_str()
      ->check(CLI::Range(576, 9000));
  app.add_option("--max-lanes", opt.max_lanes, "lanes per packet offered at most (multiple of 64; 256 = Tofino profile)")
      ->capture_default_str()->check(CLI::Range(64, 8192));
  app.add_option("--max-jobs", opt.max_jobs, "concurrent jobs")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-memory", cli.max_memory, "slot memory over all jobs (K/M/G suffixes)")->capture_default_str();
  app.add_option("--max-jobs-per-source", opt.max_jobs_per_source, "jobs one source address may hold")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-jobs-per-tenant", opt.max_jobs_per_tenant,
                 "jobs one tenant key may hold (0: an equal share of --max-jobs per tenant key)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--max-memory-per-tenant", cli.max_memory_per_tenant,
                 "slot memory one tenant key may hold (K/M/G; default: an equal share of --max-memory per tenant key)");
  app.add_option("--max-slots", opt.max_slots, "slots per job (a job's window)")->capture_default_str()
      ->check(CLI::Range(1, 32768));
  app.add_option("--job-idle-timeout", cli.idle_s, "seconds after which a silent job is freed")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dead-worker-ms", cli.dead_worker_ms,
                 "a member of a started quorum operation that sends nothing for this long (and at least the job's quorum "
                 "timeout) is taken for dead: the operation completes without it and fails on every rank")
      ->capture_default_str()->check(CLI::Range(1.0, 3.6e6));
  app.add_option("--seed", opt.seed,
                 "seed for job seeds (0: random); a random per-process value is mixed in either way, so no job seed "
                 "repeats after a restart")->capture_default_str();
}

// After parsing: sizes and timers into opt, the key file created (if asked and absent) and
// loaded. false after printing "prog: what is wrong" to stderr.
inline bool finish_engine_options(const char* prog, const EngineCli& cli, EngineOptions& opt) {
  if (!parse_bytes(cli.max_memory, &opt.max_memory)) {
    std::fprintf(stderr, "%s: --max-memory '%s' is not a size (e.g. 512M)\n", prog, cli.max_memory.c_str());
    return false;
  }
  if (!cli.max_memory_per_tenant.empty() && !parse_bytes(cli.max_memory_per_tenant, &opt.max_memory_per_tenant)) {
    std::fprintf(stderr, "%s: --max-memory-per-tenant '%s' is not a size (e.g. 512M)\n", prog,
                 cli.max_memory_per_tenant.c_str());
    return false;
  }
  opt.job_idle_timeout_us = static_cast<uint64_t>(cli.idle_s * 1e6);
  opt.dead_worker_us = static_cast<uint64_t>(cli.dead_worker_ms * 1e3);
  std::string err;
  if (cli.create_key_file && ::access(cli.key_file.c_str(), F_OK) != 0) {
    if (!auth::write_key_file(cli.key_file, {auth::generate_key(auth::kOperatorKeyId), auth::generate_key(1)}, &err)) {
      std::fprintf(stderr, "%s: %s\n", prog, err.c_str());
      return false;
    }
    std::fprintf(stderr, "%s: created key file %s (operator key id 0, tenant key id 1); give workers the tenant key: "
                         "THC_AGGREGATOR_KEY_FILE=%s\n", prog, cli.key_file.c_str(), cli.key_file.c_str());
  }
  std::vector<auth::Key> keys;
  if (!auth::load_key_file(cli.key_file, &keys, &err)) {
    std::fprintf(stderr, "%s: %s\n", prog, err.c_str());
    return false;
  }
  opt.keys = std::make_shared<auth::KeyRing>(keys);
  const std::string p = opt.problem();
  if (!p.empty()) {
    std::fprintf(stderr, "%s: %s\n", prog, p.c_str());
    return false;
  }
  return true;
}

}  // namespace thc::switch_offload
