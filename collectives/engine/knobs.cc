#include "collectives/engine/knobs.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/status.h"

namespace thc::engine {

#define THC_KNOB(env, kind, field, def, choices, help) \
  Knob { env, KnobKind::kind, offsetof(thc_config_t, field), def, choices, help }
#define THC_KNOB_STR(env, field, def, help) \
  Knob { env, KnobKind::kString, offsetof(thc_config_t, field), def, nullptr, help, sizeof(thc_config_t::field) }

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = {
      THC_KNOB("THC_BITS", kInt, bits, "4", nullptr, "THC index bits b (1..8)"),
      THC_KNOB("THC_GRANULARITY", kInt, granularity, "30", nullptr, "THC grid granularity g >= 2^b-1"),
      THC_KNOB("THC_P", kDouble, p, "1/32", nullptr, "THC truncation fraction p; t_p = Phi^-1(1-p/2)"),
      THC_KNOB("THC_UNIFORM", kInt, uniform, "0", nullptr, "1: thc_allreduce uses uniform THC (identity table, g = 2^b-1)"),
      THC_KNOB("THC_BLOCK", kLong, block, "16384", nullptr, "RHT and prelude block size in elements (power of two, 1024..1048576)"),
      THC_KNOB("THC_NAT_SCHEME", kEnum, nat_scheme, "cnat", "cnat=2|dnat=3", "scheme of cnat_allreduce: natural compression or natural dithering"),
      THC_KNOB("THC_NAT_WIDTH", kInt, nat_width, "16", nullptr, "Cnat/Dnat integer sum width in bits (8, 16, 32); sets the level window"),
      THC_KNOB("THC_NAT_LEVELS", kInt, nat_levels, "0", nullptr, "Cnat/Dnat power-of-two levels (0 = as many as the width allows)"),
      THC_KNOB("THC_DNAT_NORM", kEnum, dnat_norm, "2", "2=2|inf=0", "natural dithering norm: 2 or inf"),
      THC_KNOB("THC_CHUNK_BYTES", kLong, chunk_bytes, "1048576", nullptr, "pipelining chunk, in float32 bytes (whole blocks)"),
      THC_KNOB("THC_ALGO", kEnum, algo, "auto", "auto=0|int=1|ps=2", "integer allreduce of values, colocated parameter server of indices, or auto"),
      THC_KNOB("THC_BIDIR", kInt, bidir, "0", nullptr, "1: the colocated PS re-compresses Cnat/Dnat shard sums with Cnat before the allgather"),
      THC_KNOB("THC_SEED", kU64, seed, "0", nullptr, "randomness seed (0: rank 0 draws one)"),
      THC_KNOB("THC_TIMEOUT_MS", kLong, timeout_ms, "120000", nullptr, "how long a wait goes without progress before failing (MPI, in-process: no message of its operation arriving or leaving; aggregator: no answer to a datagram); <= 0: no bound on MPI and in-process communicators"),
      THC_KNOB("THC_MIN_BYTES", kLong, min_bytes, "65536", nullptr, "PMPI interposer: compress allreduces of at least this many bytes"),
      THC_KNOB("THC_MPI_ALLREDUCE", kEnum, mpi_allreduce, "off", "off=-1|thc=0|uhc=1|cnat=2|dnat=3", "PMPI interposer: scheme for float SUM allreduces"),
      THC_KNOB("THC_EF", kInt, ef, "1", nullptr, "PMPI interposer: error feedback keyed by (buffer, count, communicator)"),
      THC_KNOB("THC_EF_MAX_BYTES", kLong, ef_max_bytes, "1073741824", nullptr, "PMPI interposer: bound on error-feedback memory (least recently used dropped)"),
      THC_KNOB("THC_DEBUG", kInt, debug, "0", nullptr, "1: print the algorithm choices (rank 0) and a one-line summary at finalize"),
      THC_KNOB("THC_FAULT_DROP", kDouble, fault_drop, "0", nullptr, "aggregator client: packet drop probability (fault injection)"),
      THC_KNOB("THC_FAULT_DUP", kDouble, fault_dup, "0", nullptr, "aggregator client: packet duplicate probability"),
      THC_KNOB("THC_FAULT_REORDER", kDouble, fault_reorder, "0", nullptr, "aggregator client: packet reorder probability"),
      THC_KNOB("THC_FAULT_DELAY_US", kLong, fault_delay_us, "0", nullptr, "aggregator client: maximum injected delay in microseconds"),
      THC_KNOB("THC_QUORUM", kInt, quorum, "0", nullptr, "aggregator: workers needed to complete a slot after the timeout (0 = all)"),
      THC_KNOB("THC_QUORUM_TIMEOUT_MS", kLong, quorum_timeout_ms, "100", nullptr, "aggregator: how long a slot waits for all workers before completing with the quorum (then the job goes on without the stragglers)"),
      THC_KNOB("THC_AGG_SLOTS", kInt, agg_slots, "1024", nullptr, "aggregator client: slots a job asks for (its window bound; the aggregator may clamp)"),
      THC_KNOB("THC_AGG_LANES", kInt, agg_lanes, "8192", nullptr, "aggregator client: lanes per packet at most (multiple of 64; 256 = Tofino profile); the path MTU bounds them too"),
      THC_KNOB("THC_AGG_SHARDS", kInt, agg_shards, "0", nullptr, "aggregator client: job instances per aggregator address (0: every thread the aggregator offers)"),
      THC_KNOB("THC_AGG_DELAY_MS", kDouble, agg_delay_ms, "5", nullptr, "aggregator client: queueing delay above the minimum RTT the congestion control tolerates before it slows down"),
      THC_KNOB_STR("THC_DPDK_EAL", dpdk_eal, "", "dpdk:// aggregator client: DPDK EAL arguments (e.g. --no-huge -m 512 --no-pci --file-prefix=w0 --vdev=net_af_packet0,iface=eth1)"),
      THC_KNOB_STR("THC_DPDK_LOCAL", dpdk_local, "", "dpdk:// aggregator client: this worker's IPv4 address[:UDP port] (no port: 40000 + rank); A.B.C.D+ = A.B.C.D + rank"),
      THC_KNOB("THC_DPDK_PORT_ID", kInt, dpdk_port_id, "0", nullptr, "dpdk:// aggregator client: DPDK port id"),
      THC_KNOB_STR("THC_COLLNET_AGGREGATOR", collnet_aggregator, "", "NCCL plugin (libnccl-net-thc.so): aggregator address(es) of CollNet allreduces, handed to the aggregator client unchanged (e.g. udp://10.0.0.1:9471); peers: no aggregator, the CollNet ranks reduce among themselves over UCX (thc's PS or ring, THC_ALGO); empty: no CollNet device"),
      THC_KNOB("THC_COLLNET_SCHEME", kEnum, collnet_scheme, "thc", "thc=0|uhc=1|cnat=2|dnat=3", "NCCL plugin: compression of CollNet allreduces (THC, uniform THC, Cnat, natural dithering)"),
      THC_KNOB("THC_THREADS", kInt, threads, "1", nullptr, "host codec threads per rank for prelude, encode and decode (1..256; 1 = the calling thread only, right when ranks share the cores)"),
      THC_KNOB("THC_HIER", kEnum, hier, "auto", "auto=-1|0=0|1=1", "MPI and UCX communicators: float reduce-scatter inside each host over shared memory, compressed allreduce across hosts (sharded over the host's ranks), allgather inside the host; auto = on with more than one host and more than one rank on some host, 1 = on with more than one host"),
      THC_KNOB_STR("THC_HIER_HOSTS", hier_hosts, "", "test aid: emulate hosts for THC_HIER on one machine: sizes of consecutive blocks of MPI_COMM_WORLD ranks, or of a UCX group's ranks (e.g. 2,2 or 3,1) instead of the real hosts (ranks that share a kernel and a PID namespace); empty: the real hosts"),
      THC_KNOB("THC_HIER_ARENA_BYTES", kLong, hier_arena_bytes, "268435456", nullptr, "THC_HIER: shared memory per host for the intra-host stage, at most (an anonymous memfd, not /dev/shm); calls larger than it fits stream through it in rounds"),
      THC_KNOB("THC_FUSION_BYTES", kLong, fusion_bytes, "67108864", nullptr, "nonblocking allreduces of one scheme and op started back to back are fused into one compressed stream of at most this many input bytes (Horovod's fusion threshold; 0: never fused); the interposer also compresses nonblocking allreduces below THC_MIN_BYTES when it is on"),
      THC_KNOB("THC_FUSION_CYCLE_MS", kDouble, fusion_cycle_ms, "1", nullptr, "how long the progress thread waits for more nonblocking allreduces to fuse with the first one in its queue (Horovod's cycle time); a wait on one of them ends it"),
      THC_KNOB("THC_MPI_ALLGATHER", kEnum, mpi_allgather, "off", "off=-1|thc=0|uhc=1|cnat=2|dnat=3", "PMPI interposer: LOSSY compressed MPI_Allgather of float/half/bf16 of at least THC_MIN_BYTES per rank (off: exact, as parameters usually need)"),
  };
  return table;
}

namespace {
template <typename T>
T& field(thc_config_t* cfg, size_t off) {
  return *reinterpret_cast<T*>(reinterpret_cast<char*>(cfg) + off);
}
template <typename T>
const T& field(const thc_config_t& cfg, size_t off) {
  return *reinterpret_cast<const T*>(reinterpret_cast<const char*>(&cfg) + off);
}
}  // namespace

bool set_knob(const Knob& k, const char* value, thc_config_t* cfg, std::string* err) {
  errno = 0;
  char* end = nullptr;
  const std::string v = value;
  auto bad = [&](const char* what) {
    *err = std::string(k.env) + "='" + v + "': " + what;
    return false;
  };
  switch (k.kind) {
    case KnobKind::kInt:
    case KnobKind::kLong: {
      const long long x = std::strtoll(value, &end, 0);
      if (v.empty() || *end != '\0' || errno) return bad("not an integer");
      if (k.kind == KnobKind::kInt) {
        if (x < -2147483647ll || x > 2147483647ll) return bad("out of range");
        field<int>(cfg, k.offset) = static_cast<int>(x);
      } else {
        field<long>(cfg, k.offset) = static_cast<long>(x);
      }
      return true;
    }
    case KnobKind::kU64: {
      const unsigned long long x = std::strtoull(value, &end, 0);
      if (v.empty() || *end != '\0' || errno) return bad("not an unsigned integer");
      field<uint64_t>(cfg, k.offset) = x;
      return true;
    }
    case KnobKind::kDouble: {
      // Accept "a/b" fractions (THC_P=1/32) as well as decimals.
      const size_t slash = v.find('/');
      double x;
      if (slash != std::string::npos) {
        char* e1 = nullptr;
        const double a = std::strtod(v.substr(0, slash).c_str(), &e1);
        const std::string den = v.substr(slash + 1);
        const double b = std::strtod(den.c_str(), &end);
        if (den.empty() || *end != '\0' || b == 0) return bad("not a number or fraction");
        x = a / b;
      } else {
        x = std::strtod(value, &end);
        if (v.empty() || *end != '\0' || errno) return bad("not a number");
      }
      field<double>(cfg, k.offset) = x;
      return true;
    }
    case KnobKind::kEnum: {
      std::stringstream ss(k.choices);
      std::string item;
      while (std::getline(ss, item, '|')) {
        const size_t eq = item.find('=');
        if (item.substr(0, eq) == v) {
          field<int>(cfg, k.offset) = std::atoi(item.c_str() + eq + 1);
          return true;
        }
      }
      return bad((std::string("expected one of ") + k.choices).c_str());
    }
    case KnobKind::kString: {
      if (v.size() + 1 > k.capacity) return bad(("longer than " + std::to_string(k.capacity - 1) + " bytes").c_str());
      char* dst = &field<char>(cfg, k.offset);
      std::memset(dst, 0, k.capacity);
      std::memcpy(dst, v.data(), v.size());
      return true;
    }
  }
  return false;
}

std::string knob_value(const Knob& k, const thc_config_t& cfg) {
  std::ostringstream o;
  switch (k.kind) {
    case KnobKind::kInt: o << field<int>(cfg, k.offset); break;
    case KnobKind::kLong: o << field<long>(cfg, k.offset); break;
    case KnobKind::kU64: o << field<uint64_t>(cfg, k.offset); break;
    case KnobKind::kDouble: o << field<double>(cfg, k.offset); break;
    case KnobKind::kString: {
      const char* p = &field<char>(cfg, k.offset);
      return std::string(p, strnlen(p, k.capacity));
    }
    case KnobKind::kEnum: {
      const int cur = field<int>(cfg, k.offset);
      std::stringstream ss(k.choices);
      std::string item;
      while (std::getline(ss, item, '|')) {
        const size_t eq = item.find('=');
        if (std::atoi(item.c_str() + eq + 1) == cur) return item.substr(0, eq);
      }
      o << cur;
    }
  }
  return o.str();
}

void config_from_env(thc_config_t* cfg) {
  std::memset(cfg, 0, sizeof(*cfg));
  std::string err;
  for (const Knob& k : knobs()) {
    if (!set_knob(k, k.def, cfg, &err)) fail(Status::kInternal, "bad default: " + err);
  }
  for (const Knob& k : knobs()) {
    if (const char* v = std::getenv(k.env)) {
      if (!set_knob(k, v, cfg, &err)) fail(Status::kInvalidArgument, err);
    }
  }
}

int log2_exact(long v) {
  int l = 0;
  while (l < 62 && (1L << l) < v) ++l;
  return (1L << l) == v ? l : -1;
}

codec::Params codec_params(const thc_config_t& cfg, codec::Scheme scheme) {
  codec::Params p;
  p.scheme = scheme;
  p.bits = cfg.bits;
  p.granularity = cfg.granularity;
  p.p = cfg.p;
  p.block_log2 = log2_exact(cfg.block);
  p.nat_width = cfg.nat_width;
  p.nat_levels = cfg.nat_levels;
  p.dnat_norm = cfg.dnat_norm;
  return p;
}

}  // namespace thc::engine
