// What the two software aggregators (thc-aggregator over UDP, thc-aggregator-dpdk) configure
// alike: admission limits, the engine's timers, job seeds, the packet geometry and the keys.
// Each server's options extend EngineOptions; engine_config() is the one translation to the
// engine's EngineConfig, and engine_cli.h the one command-line surface for these fields.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "switch_offload/aggregator/engine.h"
#include "switch_offload/protocol/auth.h"

namespace thc::switch_offload {

struct EngineOptions {
  int max_jobs = 64;
  int64_t max_memory = int64_t{1} << 30;  // bytes of slot state over all jobs
  int max_jobs_per_source = 16;           // jobs one source address may hold at once
  int max_jobs_per_tenant = 0;            // jobs one tenant key may hold (0: max_jobs / tenant keys)
  int64_t max_memory_per_tenant = 0;      // slot memory one tenant key may hold (0: max_memory / tenants)
  uint32_t max_slots = 4096;              // per job
  uint64_t job_idle_timeout_us = 600'000'000;
  uint64_t dead_worker_us = 1'000'000;    // EngineConfig::dead_worker_us
  uint64_t seed = 0;                      // 0: random job seeds (a random per-process value is mixed
                                          // into every seed anyway: none repeats after a restart)
  int mtu = 1500;                         // the path MTU to the workers: payload budget per packet
  int max_lanes = 8192;                   // lanes per packet offered at most (256: Tofino profile)
  std::shared_ptr<const auth::KeyRing> keys;  // tenant keys (and the operator key, id 0)

  // What is wrong with these options, named by the command-line option ("" when nothing is):
  // both servers refuse to start with it, whether they were given a command line or not.
  std::string problem() const {
    if (max_jobs < 1) return "--max-jobs must be at least 1";
    if (max_memory < 1) return "--max-memory must be positive";
    if (max_jobs_per_source < 1) return "--max-jobs-per-source must be at least 1";
    if (max_jobs_per_tenant < 0) return "--max-jobs-per-tenant must not be negative";
    if (max_memory_per_tenant < 0) return "--max-memory-per-tenant must not be negative";
    if (max_slots < 1 || max_slots > static_cast<uint32_t>(proto::kMaxSlots)) return "--max-slots must be 1..32768";
    if (job_idle_timeout_us == 0) return "--job-idle-timeout must be positive";
    if (dead_worker_us == 0) return "--dead-worker-ms must be positive";
    if (mtu < 576 || mtu > 9000) return "--mtu must be 576..9000";
    if (max_lanes < proto::kLaneQuantum || max_lanes > proto::kMaxLanes || max_lanes % proto::kLaneQuantum)
      return "--max-lanes must be a multiple of 64 in 64..8192";
    if (!keys || keys->empty()) return "no keys (--key-file): every job must be authenticated";
    return "";
  }

  // The admission budget these limits give, shared by all of a server's engine shards (keys set:
  // call after problem() found nothing).
  std::shared_ptr<Budget> budget() const {
    return make_server_budget(max_jobs, max_memory, max_jobs_per_source, max_jobs_per_tenant, max_memory_per_tenant,
                              *keys);
  }

  // The configuration of engine shard `shard` of `shards` (budget, STATS and the data-plane
  // hooks are the server's to set). `ip_header_bytes`: 20 for IPv4, 40 for IPv6.
  EngineConfig engine_config(int ip_header_bytes, uint16_t shards, uint64_t shard) const {
    EngineConfig ec;
    ec.max_slots_per_job = max_slots;
    ec.max_lanes = max_lanes;
    ec.payload_budget = mtu - ip_header_bytes - 8 - static_cast<int>(proto::kHeaderBytes);
    ec.keys = keys;
    ec.shards = shards;
    ec.job_idle_timeout_us = job_idle_timeout_us;
    ec.dead_worker_us = dead_worker_us;
    // Each shard its own seed sequence (jobs live on one shard; no two shards hand out one seed).
    ec.seed = seed ? seed * 0x9E3779B97F4A7C15ull + shard : 0;
    return ec;
  }
};

}  // namespace thc::switch_offload
