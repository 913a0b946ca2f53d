// libthc_mpi.so: a PMPI interposer. An unmodified MPI program run with
//   LD_PRELOAD=libthc_mpi.so THC_MPI_ALLREDUCE=thc|uhc|cnat|dnat
// gets compressed MPI_Allreduce for float (and THC_MPI_FLOAT16/BFLOAT16) MPI_SUM calls of at
// least THC_MIN_BYTES on intracommunicators; everything else goes to PMPI_Allreduce unchanged.
//
// Every rank must see the same THC_* environment: the compress/pass-through decision is made
// locally from (count, datatype, op, environment), and ranks that decide differently would call
// different collectives.
//
// Error feedback (THC_EF=1): a residual per (buffer, count, communicator) — the way training loops
// reuse gradient buffers — bounded by THC_EF_MAX_BYTES, least recently used evicted first.
#include <mpi.h>

#include <cstdio>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "thc/thc_mpi.h"

namespace {

struct Settings {
  bool loaded = false;
  thc_config_t cfg{};
  bool ok = false;
};

Settings& settings() {
  static Settings s;
  if (!s.loaded) {
    s.loaded = true;
    s.ok = thc_config_init(&s.cfg) == THC_SUCCESS;
    if (!s.ok) std::fprintf(stderr, "libthc_mpi: %s; compression disabled\n", thc_last_error());
  }
  return s;
}

using EfKey = std::tuple<const void*, size_t, MPI_Comm>;
struct EfEntry {
  thc_state_t state;
  size_t bytes;
  std::list<EfKey>::iterator lru;
};

struct Counters {
  uint64_t calls = 0, compressed = 0, float_bytes = 0, wire_bytes = 0, ef_evictions = 0;
};

std::mutex g_mu;
std::set<MPI_Comm> g_comms;  // communicators thc ran on (for the finalize summary)
std::map<EfKey, EfEntry> g_ef;
std::list<EfKey> g_lru;  // front = most recent
size_t g_ef_bytes = 0;
Counters g_cnt;

thc_state_t ef_state(const void* buf, size_t count, MPI_Comm comm, long max_bytes) {
  const EfKey key{buf, count, comm};
  auto it = g_ef.find(key);
  if (it != g_ef.end()) {
    g_lru.splice(g_lru.begin(), g_lru, it->second.lru);
    return it->second.state;
  }
  const size_t bytes = count * sizeof(float);
  if (bytes > static_cast<size_t>(max_bytes)) return nullptr;  // larger than the whole budget: no EF
  while (g_ef_bytes + bytes > static_cast<size_t>(max_bytes) && !g_lru.empty()) {
    auto victim = g_ef.find(g_lru.back());
    g_ef_bytes -= victim->second.bytes;
    thc_state_destroy(victim->second.state);
    g_ef.erase(victim);
    g_lru.pop_back();
    g_cnt.ef_evictions++;
  }
  thc_state_t st;
  if (thc_state_create(&st) != THC_SUCCESS) return nullptr;
  g_lru.push_front(key);
  g_ef[key] = EfEntry{st, bytes, g_lru.begin()};
  g_ef_bytes += bytes;
  return st;
}

bool eligible(MPI_Datatype dt, MPI_Op op, int count, MPI_Comm comm, const thc_config_t& cfg) {
  if (cfg.mpi_allreduce < 0 || op != MPI_SUM || count <= 0) return false;
  int elem = 0;
  if (dt == MPI_FLOAT) elem = 4;
  else if (dt == THC_MPI_FLOAT16() || dt == THC_MPI_BFLOAT16()) elem = 2;
  else return false;
  if (static_cast<long>(count) * elem < cfg.min_bytes) return false;
  int inter = 0;
  PMPI_Comm_test_inter(comm, &inter);
  return !inter;
}

}  // namespace

extern "C" {

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  Settings& s = settings();
  if (!s.ok || !eligible(datatype, op, count, comm, s.cfg))
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
  std::lock_guard<std::mutex> lk(g_mu);
  g_cnt.calls++;
  thc_state_t ef = s.cfg.ef ? ef_state(recvbuf, static_cast<size_t>(count), comm, s.cfg.ef_max_bytes) : nullptr;
  const int rc = THC_Allreduce_x(static_cast<thc_scheme_t>(s.cfg.mpi_allreduce), sendbuf, recvbuf,
                                 static_cast<size_t>(count), datatype, op, comm, ef);
  if (rc != MPI_SUCCESS) {
    std::fprintf(stderr, "libthc_mpi: compressed MPI_Allreduce failed: %s\n", thc_last_error());
    return rc;
  }
  int elem = datatype == MPI_FLOAT ? 4 : 2;
  g_comms.insert(comm);
  g_cnt.compressed++;
  g_cnt.float_bytes += static_cast<uint64_t>(count) * elem;
  return rc;
}

int MPI_Finalize(void) {
  Settings& s = settings();
  if (s.ok && s.cfg.debug) {
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // Wire bytes come from the communicator statistics of MPI_COMM_WORLD's thc state, if any.
    std::lock_guard<std::mutex> lk(g_mu);
    int n = 1;
    PMPI_Comm_size(MPI_COMM_WORLD, &n);
    uint64_t wire = 0;
    for (MPI_Comm c : g_comms) {
      thc_stats_t st;
      if (THC_Comm_stats(c, &st) == THC_SUCCESS) wire += st.wire_bytes_up + st.wire_bytes_down;
    }
    // What a ring allreduce of the same input moves per rank: 2 (n-1)/n of the bytes.
    const double ring = n > 1 ? 2.0 * (n - 1) / n * static_cast<double>(g_cnt.float_bytes) : 0.0;
    std::fprintf(stderr,
                 "libthc_mpi[%d]: %llu compressed allreduces (%llu eligible), %.1f MB input, "
                 "%.1f MB on the wire vs %.1f MB uncompressed ring (%.1f MB saved), "
                 "error-feedback tensors %zu (%.1f MB, %llu evicted)\n",
                 rank, static_cast<unsigned long long>(g_cnt.compressed), static_cast<unsigned long long>(g_cnt.calls),
                 g_cnt.float_bytes / 1e6, wire / 1e6, ring / 1e6, (ring - static_cast<double>(wire)) / 1e6,
                 g_ef.size(), g_ef_bytes / 1e6, static_cast<unsigned long long>(g_cnt.ef_evictions));
  }
  {
    std::lock_guard<std::mutex> lk(g_mu);
    for (auto& kv : g_ef) thc_state_destroy(kv.second.state);
    g_ef.clear();
    g_lru.clear();
    g_ef_bytes = 0;
  }
  return PMPI_Finalize();
}

}  // extern "C"
