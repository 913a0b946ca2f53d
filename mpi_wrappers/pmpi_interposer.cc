// libthc_mpi.so: a PMPI interposer. An unmodified MPI program run with
//   LD_PRELOAD=libthc_mpi.so THC_MPI_ALLREDUCE=thc|uhc|cnat|dnat
// gets compressed MPI_Allreduce for float (and THC_MPI_FLOAT16/BFLOAT16) MPI_SUM calls of at
// least THC_MIN_BYTES on intracommunicators; everything else goes to PMPI_Allreduce unchanged.
//
// Every rank must see the same THC_* environment: the compress/pass-through decision is made
// locally from (count, datatype, op, environment), and ranks that decide differently would call
// different collectives.
//
// It behaves like MPI_Allreduce where the program can tell:
// * errors go through the communicator's error handler (MPI_ERRORS_ARE_FATAL by default), with
//   error codes of a "thc" error class whose strings say what failed;
// * NaN or Inf in some rank's input: every rank sees it in the prelude, before anything is
//   reduced, and the call is redone exactly by PMPI_Allreduce, so NaN and Inf propagate element
//   by element as MPI's own sum would (loss scaling depends on seeing them);
// * no lock is held across a collective, so threads (MPI_THREAD_MULTIPLE) may run collectives
//   on different communicators concurrently, as with MPI.
//
// Nonblocking allreduces (MPI_Iallreduce) of the same types and op are compressed too, completed by
// MPI_Wait / MPI_Test / MPI_Waitall / ... (MPI generalized requests, thc_mpi.h), with the same
// threshold, error feedback (keyed the same way) and NaN/Inf redo (exact, in start order, on a
// private duplicate of the communicator). With fusion on (THC_FUSION_BYTES > 0) they are compressed
// below THC_MIN_BYTES as well: small ones started back to back are fused into one compressed stream,
// Horovod's way. They progress on a thread of thc's only under MPI_THREAD_MULTIPLE; below it each
// runs to completion inside MPI_Iallreduce. A failure is reported by the call that completes the
// request (Open MPI: through MPI_COMM_WORLD's error handler, as for any generalized request).
// MPI_Reduce_scatter_block and MPI_Reduce_scatter of float/half/bf16 sums of at least THC_MIN_BYTES
// (the whole input) are compressed with THC_MPI_ALLREDUCE's scheme (thc_reduce_scatter); MPI_Allgather
// of those types only when THC_MPI_ALLGATHER names a scheme (lossy; off by default).
//
// Error feedback (THC_EF=1): a residual per (buffer, count) of each communicator — the way
// training loops reuse gradient buffers — bounded by THC_EF_MAX_BYTES over all communicators,
// least recently used evicted first. The residuals live in an attribute of the communicator and
// are dropped when it is freed.
#include <mpi.h>

#include <cstdio>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collectives/capi/capi.h"
#include "mpi_wrappers/thc_mpi_internal.h"
#include "thc/thc_mpi.h"

namespace {

struct Settings {
  thc_config_t cfg{};
  bool ok = false;
};

const Settings& settings() {
  static const Settings s = [] {
    Settings v;
    v.ok = thc_config_init(&v.cfg) == THC_SUCCESS;
    if (!v.ok) std::fprintf(stderr, "libthc_mpi: %s; compression disabled\n", thc_last_error());
    return v;
  }();
  return s;
}

struct CommRec;
struct EfEntry {
  thc_state_t state = nullptr;
  size_t bytes = 0;
  int busy = 0;  // calls using it right now: never evicted while > 0
  std::list<std::pair<CommRec*, std::pair<const void*, size_t>>>::iterator lru;
};
// What the interposer keeps per communicator, in an attribute (deleted with the communicator).
struct CommRec {
  std::map<std::pair<const void*, size_t>, EfEntry> ef;
  uint64_t wire_seen = 0;  // the communicator's thc wire bytes already counted
};

struct Counters {
  uint64_t calls = 0, compressed = 0, nonfinite = 0, float_bytes = 0, wire_bytes = 0, ef_evictions = 0;
};

// Guards everything below; held only for bookkeeping, never across a collective.
std::mutex g_mu;
std::set<CommRec*> g_recs;  // live records (for MPI_Finalize)
std::list<std::pair<CommRec*, std::pair<const void*, size_t>>> g_lru;  // front = most recent
size_t g_ef_bytes = 0;
Counters g_cnt;
int g_keyval = MPI_KEYVAL_INVALID;
int g_err_codes[THC_ERR_INTERNAL + 1];  // MPI error code per thc status (0 = not yet created)
int g_err_class = -1;

void drop_entry_locked(CommRec* rec, std::map<std::pair<const void*, size_t>, EfEntry>::iterator it) {
  g_ef_bytes -= it->second.bytes;
  thc_state_destroy(it->second.state);
  g_lru.erase(it->second.lru);
  rec->ef.erase(it);
}

int delete_rec(MPI_Comm comm, int, void* attr, void*) {
  thc::mpi::quiesce(comm);  // nonblocking calls in flight release their residuals when they end
  auto* rec = static_cast<CommRec*>(attr);
  std::lock_guard<std::mutex> lk(g_mu);
  while (!rec->ef.empty()) drop_entry_locked(rec, rec->ef.begin());
  g_recs.erase(rec);
  delete rec;
  return MPI_SUCCESS;
}

CommRec* rec_for(MPI_Comm comm) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_keyval == MPI_KEYVAL_INVALID) PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_rec, &g_keyval, nullptr);
  }
  void* attr = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, g_keyval, &attr, &found);
  if (found) return static_cast<CommRec*>(attr);
  auto* rec = new CommRec;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_recs.insert(rec);
  }
  PMPI_Comm_set_attr(comm, g_keyval, rec);
  return rec;
}

// Drops the least recently used states that no call is using until `extra` more bytes fit.
void evict_locked(size_t extra, long max_bytes) {
  for (auto v = g_lru.end(); g_ef_bytes + extra > static_cast<size_t>(max_bytes) && v != g_lru.begin();) {
    --v;
    CommRec* vr = v->first;
    auto ve = vr->ef.find(v->second);
    if (ve->second.busy > 0) continue;  // another thread's call is using it
    v = std::next(v);
    drop_entry_locked(vr, ve);
    g_cnt.ef_evictions++;
  }
}

// The residual of (buf, count) on rec's communicator, marked busy; nullptr when it cannot fit.
thc_state_t ef_acquire(CommRec* rec, const void* buf, size_t count, long max_bytes) {
  std::lock_guard<std::mutex> lk(g_mu);
  const auto key = std::make_pair(buf, count);
  auto it = rec->ef.find(key);
  if (it != rec->ef.end()) {
    g_lru.splice(g_lru.begin(), g_lru, it->second.lru);
    it->second.busy++;
    return it->second.state;
  }
  const size_t bytes = count * sizeof(float);
  if (bytes > static_cast<size_t>(max_bytes)) return nullptr;  // larger than the whole budget: no EF
  evict_locked(bytes, max_bytes);
  thc_state_t st;
  if (thc_state_create(&st) != THC_SUCCESS) return nullptr;
  g_lru.emplace_front(rec, key);
  EfEntry& e = rec->ef[key];
  e.state = st;
  e.bytes = bytes;
  e.busy = 1;
  e.lru = g_lru.begin();
  g_ef_bytes += bytes;
  return st;
}

// The memory a state holds once a call has used it: its host residual (on a hierarchical
// communicator only its rank's slice, with the spare the update goes to: 2/S of the tensor, S the
// fewest ranks a host has), or a device residual of `count` floats.
size_t state_bytes(thc_state_t st, size_t count) {
  const thc::engine::ErrorFeedback& ef = st->ef;
  const size_t host = (ef.residual.capacity() + ef.next.capacity()) * sizeof(float);
  return host + (ef.device ? count * sizeof(float) : 0);
}

// The call is done with the state: from now on it counts as what it holds (ef_acquire counted a
// new one as `count` floats), and states no call uses are dropped if that exceeds the budget.
void ef_release(CommRec* rec, const void* buf, size_t count, long max_bytes) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = rec->ef.find(std::make_pair(buf, count));
  if (it == rec->ef.end()) return;
  EfEntry& e = it->second;
  if (--e.busy > 0) return;
  const size_t b = state_bytes(e.state, count);
  g_ef_bytes = g_ef_bytes - e.bytes + b;
  e.bytes = b;
  evict_locked(0, max_bytes);
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

// An MPI error code of the "thc" class for a thc status, created on first use.
int mpi_code(thc_status_t st) {
  if (st <= THC_SUCCESS || st > THC_ERR_INTERNAL) st = THC_ERR_INTERNAL;
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_err_class < 0 && PMPI_Add_error_class(&g_err_class) != MPI_SUCCESS) return MPI_ERR_OTHER;
  if (g_err_codes[st] == 0) {
    int code;
    if (PMPI_Add_error_code(g_err_class, &code) != MPI_SUCCESS) return MPI_ERR_OTHER;
    char text[160];
    std::snprintf(text, sizeof text, "thc (libthc_mpi) compressed MPI_Allreduce: %s (details on stderr)",
                  thc_status_string(st));
    PMPI_Add_error_string(code, text);
    g_err_codes[st] = code;
  }
  return g_err_codes[st];
}

using thc::mpi::exact_op;

int elem_size(MPI_Datatype dt) {
  if (dt == MPI_FLOAT) return 4;
  if (dt == THC_MPI_FLOAT16() || dt == THC_MPI_BFLOAT16()) return 2;
  return 0;
}

thc_dtype_t thc_dtype(MPI_Datatype dt) {
  return dt == MPI_FLOAT ? THC_FLOAT32 : (dt == THC_MPI_FLOAT16() ? THC_FLOAT16 : THC_BFLOAT16);
}

bool intra(MPI_Comm comm) {
  int inter = 0;
  PMPI_Comm_test_inter(comm, &inter);
  return !inter;
}

// Counts a finished compressed call (wire bytes from the communicator's statistics).
void count_done(CommRec* rec, thc_comm_t tc, uint64_t float_bytes) {
  thc_stats_t st;
  const bool have = tc && thc_comm_stats(tc, &st) == THC_SUCCESS;
  std::lock_guard<std::mutex> lk(g_mu);
  g_cnt.compressed++;
  g_cnt.float_bytes += float_bytes;
  if (have) {
    const uint64_t w = st.wire_bytes_up + st.wire_bytes_down;
    g_cnt.wire_bytes += w - rec->wire_seen;
    rec->wire_seen = w;
  }
}

}  // namespace

extern "C" {

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  const Settings& s = settings();
  if (!s.ok || !eligible(datatype, op, count, comm, s.cfg))
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, exact_op(datatype, op), comm);
  CommRec* rec = rec_for(comm);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_cnt.calls++;
  }
  const size_t n = static_cast<size_t>(count);
  const long max_bytes = s.cfg.ef_max_bytes;
  thc_state_t ef = s.cfg.ef ? ef_acquire(rec, recvbuf, n, max_bytes) : nullptr;
  const thc_dtype_t dt =
      datatype == MPI_FLOAT ? THC_FLOAT32 : (datatype == THC_MPI_FLOAT16() ? THC_FLOAT16 : THC_BFLOAT16);
  thc_comm_t tc = nullptr;
  thc_status_t why = THC_Comm_get(comm, &tc);
  if (why == THC_SUCCESS)
    why = thc_allreduce_scheme(static_cast<thc_scheme_t>(s.cfg.mpi_allreduce),
                               sendbuf == MPI_IN_PLACE ? THC_IN_PLACE : sendbuf, recvbuf, n, dt, THC_OP_SUM, tc, ef);
  if (ef) ef_release(rec, recvbuf, n, max_bytes);
  const int elem = datatype == MPI_FLOAT ? 4 : 2;
  if (why == THC_SUCCESS) {
    thc_stats_t st;
    const bool have = thc_comm_stats(tc, &st) == THC_SUCCESS;
    std::lock_guard<std::mutex> lk(g_mu);
    g_cnt.compressed++;
    g_cnt.float_bytes += static_cast<uint64_t>(count) * elem;
    if (have) {
      const uint64_t w = st.wire_bytes_up + st.wire_bytes_down;
      g_cnt.wire_bytes += w - rec->wire_seen;
      rec->wire_seen = w;
    }
    return MPI_SUCCESS;
  }
  if (why == THC_ERR_NONFINITE) {
    // Every rank saw it before anything was reduced (recvbuf untouched): MPI's own sum then
    // propagates NaN and Inf exactly where MPI_Allreduce would (for the 16-bit types through
    // THC_MPI_SUM16, which MPI cannot do without).
    {
      std::lock_guard<std::mutex> lk(g_mu);
      g_cnt.nonfinite++;
    }
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, exact_op(datatype, op), comm);
  }
  std::fprintf(stderr, "libthc_mpi: compressed MPI_Allreduce failed: %s\n", thc_last_error());
  const int code = mpi_code(why);
  PMPI_Comm_call_errhandler(comm, code);
  return code;
}

int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  const Settings& s = settings();
  const int elem = elem_size(datatype);
  // Small ones too when they can be fused: that is what makes them worth compressing.
  const bool eligible = s.ok && s.cfg.mpi_allreduce >= 0 && op == MPI_SUM && count > 0 && elem > 0 &&
                        (static_cast<long>(count) * elem >= s.cfg.min_bytes || s.cfg.fusion_bytes > 0) && intra(comm);
  if (!eligible) return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, exact_op(datatype, op), comm, request);
  CommRec* rec = rec_for(comm);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_cnt.calls++;
  }
  const size_t n = static_cast<size_t>(count);
  const long max_bytes = s.cfg.ef_max_bytes;
  thc_state_t ef = s.cfg.ef ? ef_acquire(rec, recvbuf, n, max_bytes) : nullptr;
  thc_comm_t tc = nullptr;
  if (THC_Comm_get(comm, &tc) != THC_SUCCESS) {
    if (ef) ef_release(rec, recvbuf, n, max_bytes);
    std::fprintf(stderr, "libthc_mpi: compressed MPI_Iallreduce failed: %s\n", thc_last_error());
    const int code = mpi_code(THC_ERR_TRANSPORT);
    PMPI_Comm_call_errhandler(comm, code);
    return code;
  }
  thc::mpi::IallreduceHooks h;
  h.nonfinite_exact = true;
  h.code_of = [](thc_status_t st) { return mpi_code(st); };
  h.done = [rec, recvbuf, n, ef, tc, elem, max_bytes](int code, thc_status_t st, const std::string& msg) {
    if (ef) ef_release(rec, recvbuf, n, max_bytes);
    if (st == THC_SUCCESS) {
      count_done(rec, tc, static_cast<uint64_t>(n) * elem);
    } else if (st == THC_ERR_NONFINITE && code == MPI_SUCCESS) {
      std::lock_guard<std::mutex> lk(g_mu);
      g_cnt.nonfinite++;
    } else {
      std::fprintf(stderr, "libthc_mpi: compressed MPI_Iallreduce failed: %s\n", msg.c_str());
    }
  };
  return thc::mpi::iallreduce(static_cast<thc_scheme_t>(s.cfg.mpi_allreduce), sendbuf, recvbuf, n, datatype, MPI_SUM,
                              comm, ef, request, h);
}

int MPI_Reduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[], MPI_Datatype datatype, MPI_Op op,
                       MPI_Comm comm) {
  const Settings& s = settings();
  const int elem = elem_size(datatype);
  int nranks = 0, me = 0;
  PMPI_Comm_size(comm, &nranks);
  PMPI_Comm_rank(comm, &me);
  long total = 0;
  bool counts_ok = recvcounts != nullptr;
  for (int q = 0; counts_ok && q < nranks; ++q) {
    if (recvcounts[q] < 0) counts_ok = false;
    total += counts_ok ? recvcounts[q] : 0;
  }
  if (!s.ok || s.cfg.mpi_allreduce < 0 || op != MPI_SUM || elem == 0 || !counts_ok || total == 0 ||
      total * elem < s.cfg.min_bytes || !intra(comm))
    return PMPI_Reduce_scatter(sendbuf, recvbuf, recvcounts, datatype, exact_op(datatype, op), comm);
  CommRec* rec = rec_for(comm);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_cnt.calls++;
  }
  // The residual follows the input, as a gradient buffer is reused from step to step.
  const void* key = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
  const size_t n = static_cast<size_t>(total);
  const long max_bytes = s.cfg.ef_max_bytes;
  thc_state_t ef = s.cfg.ef ? ef_acquire(rec, key, n, max_bytes) : nullptr;
  thc_comm_t tc = nullptr;
  thc_status_t why = THC_Comm_get(comm, &tc);
  if (why == THC_SUCCESS) {
    std::vector<size_t> counts(static_cast<size_t>(nranks));
    for (int q = 0; q < nranks; ++q) counts[q] = static_cast<size_t>(recvcounts[q]);
    why = thc_reduce_scatter(static_cast<thc_scheme_t>(s.cfg.mpi_allreduce),
                             sendbuf == MPI_IN_PLACE ? THC_IN_PLACE : sendbuf, recvbuf, counts.data(),
                             thc_dtype(datatype), THC_OP_SUM, tc, ef);
  }
  if (ef) ef_release(rec, key, n, max_bytes);
  if (why == THC_SUCCESS) {
    count_done(rec, tc, static_cast<uint64_t>(total) * elem);
    return MPI_SUCCESS;
  }
  if (why == THC_ERR_NONFINITE) {
    // Every rank saw it before anything was reduced: MPI's own sum, exact.
    {
      std::lock_guard<std::mutex> lk(g_mu);
      g_cnt.nonfinite++;
    }
    return PMPI_Reduce_scatter(sendbuf, recvbuf, recvcounts, datatype, exact_op(datatype, op), comm);
  }
  std::fprintf(stderr, "libthc_mpi: compressed MPI_Reduce_scatter failed: %s\n", thc_last_error());
  const int code = mpi_code(why);
  PMPI_Comm_call_errhandler(comm, code);
  return code;
}

int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype datatype, MPI_Op op,
                             MPI_Comm comm) {
  const Settings& s = settings();
  const int elem = elem_size(datatype);
  int nranks = 0;
  PMPI_Comm_size(comm, &nranks);
  if (!s.ok || s.cfg.mpi_allreduce < 0 || op != MPI_SUM || elem == 0 || recvcount <= 0 ||
      static_cast<long>(recvcount) * nranks * elem < s.cfg.min_bytes || !intra(comm))
    return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, exact_op(datatype, op), comm);
  const std::vector<int> counts(static_cast<size_t>(nranks), recvcount);
  // MPI_Reduce_scatter's path with equal shards.
  return MPI_Reduce_scatter(sendbuf, recvbuf, counts.data(), datatype, op, comm);
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm) {
  const Settings& s = settings();
  const int elem = elem_size(recvtype);
  const bool in_place = sendbuf == MPI_IN_PLACE;
  if (!s.ok || s.cfg.mpi_allgather < 0 || elem == 0 || recvcount <= 0 ||
      (!in_place && (sendtype != recvtype || sendcount != recvcount)) ||
      static_cast<long>(recvcount) * elem < s.cfg.min_bytes || !intra(comm))
    return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
  int me = 0;
  PMPI_Comm_rank(comm, &me);
  CommRec* rec = rec_for(comm);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_cnt.calls++;
  }
  const void* key = in_place ? static_cast<const char*>(recvbuf) + static_cast<size_t>(me) * recvcount * elem : sendbuf;
  const size_t n = static_cast<size_t>(recvcount);
  const long max_bytes = s.cfg.ef_max_bytes;
  thc_state_t ef = s.cfg.ef ? ef_acquire(rec, key, n, max_bytes) : nullptr;
  thc_comm_t tc = nullptr;
  thc_status_t why = THC_Comm_get(comm, &tc);
  int nranks = 0;
  PMPI_Comm_size(comm, &nranks);
  if (why == THC_SUCCESS) {
    const std::vector<size_t> counts(static_cast<size_t>(nranks), n);
    why = thc_allgather(static_cast<thc_scheme_t>(s.cfg.mpi_allgather), in_place ? THC_IN_PLACE : sendbuf, recvbuf,
                        counts.data(), thc_dtype(recvtype), tc, ef);
  }
  if (ef) ef_release(rec, key, n, max_bytes);
  if (why == THC_SUCCESS) {
    count_done(rec, tc, static_cast<uint64_t>(n) * nranks * elem);
    return MPI_SUCCESS;
  }
  if (why == THC_ERR_NONFINITE) {
    {
      std::lock_guard<std::mutex> lk(g_mu);
      g_cnt.nonfinite++;
    }
    return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
  }
  std::fprintf(stderr, "libthc_mpi: compressed MPI_Allgather failed: %s\n", thc_last_error());
  const int code = mpi_code(why);
  PMPI_Comm_call_errhandler(comm, code);
  return code;
}

int MPI_Finalize(void) {
  const Settings& s = settings();
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (s.ok && s.cfg.debug) {
      int rank = 0, n = 1;
      PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
      PMPI_Comm_size(MPI_COMM_WORLD, &n);
      // What a ring allreduce of the same input moves per rank: 2 (n-1)/n of the bytes.
      const double ring = n > 1 ? 2.0 * (n - 1) / n * static_cast<double>(g_cnt.float_bytes) : 0.0;
      const double wire = static_cast<double>(g_cnt.wire_bytes);
      size_t tensors = 0;
      for (CommRec* r : g_recs) tensors += r->ef.size();
      std::fprintf(stderr,
                   "libthc_mpi[%d]: %llu compressed allreduces (%llu eligible, %llu redone exactly for NaN/Inf), "
                   "%.1f MB input, %.1f MB on the wire vs %.1f MB uncompressed ring (%.1f MB saved), "
                   "error-feedback tensors %zu (%.1f MB, %llu evicted)\n",
                   rank, static_cast<unsigned long long>(g_cnt.compressed),
                   static_cast<unsigned long long>(g_cnt.calls), static_cast<unsigned long long>(g_cnt.nonfinite),
                   g_cnt.float_bytes / 1e6, wire / 1e6, ring / 1e6, (ring - wire) / 1e6, tensors, g_ef_bytes / 1e6,
                   static_cast<unsigned long long>(g_cnt.ef_evictions));
    }
    // Communicators that live until MPI_Finalize may never see their attributes deleted: drop
    // their residuals now (the records themselves go with their attributes, if ever).
    for (CommRec* r : g_recs)
      while (!r->ef.empty()) drop_entry_locked(r, r->ef.begin());
  }
  // Unlocked: finalizing deletes attributes, and so runs delete_rec.
  return PMPI_Finalize();
}

}  // extern "C"
