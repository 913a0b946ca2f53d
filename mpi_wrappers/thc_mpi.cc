// The MPI-like API: thc communicators cached on MPI communicators, THC_Allreduce, CNAT_Allreduce.
#include "thc/thc_mpi.h"

#include <climits>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/capi/capi.h"
#include "collectives/engine/dtype.h"
#include "collectives/engine/knobs.h"
#include "mpi_wrappers/hier.h"
#include "mpi_wrappers/thc_mpi_internal.h"
#include "transport/mpi/mpi_reducer.h"

namespace {

std::mutex g_mu;
int g_keyval = MPI_KEYVAL_INVALID;
MPI_Op g_avg = MPI_OP_NULL;
MPI_Op g_sum16 = MPI_OP_NULL, g_prod16 = MPI_OP_NULL, g_max16 = MPI_OP_NULL, g_min16 = MPI_OP_NULL;
MPI_Datatype g_f16 = MPI_DATATYPE_NULL;
MPI_Datatype g_bf16 = MPI_DATATYPE_NULL;

int delete_comm_attr(MPI_Comm, int, void* attr, void*) {
  thc_comm_destroy(static_cast<thc_comm_t>(attr));
  return MPI_SUCCESS;
}

// THC_MPI_AVG is an op for THC_Allreduce*, which never hands it to MPI. Handed to MPI itself
// (MPI_Allreduce without libthc), it sums float and double, as documented in thc_mpi.h.
void avg_as_sum(void* in, void* inout, int* len, MPI_Datatype* dt) {
  if (*dt == MPI_FLOAT) {
    for (int i = 0; i < *len; ++i) static_cast<float*>(inout)[i] += static_cast<float*>(in)[i];
  } else if (*dt == MPI_DOUBLE) {
    for (int i = 0; i < *len; ++i) static_cast<double*>(inout)[i] += static_cast<double*>(in)[i];
  }
}

// MPI's arithmetic ops on the byte-based 16-bit types, which MPI's built-in ops do not know
// (MPI_ERR_OP): each element combined in float and rounded once to the type, NaN propagating (as
// in an IEEE sum; for MAX and MIN too, so a NaN on any rank shows in the result whatever the
// order MPI combines in). Float and double are combined alike. The types are created before any
// op runs on them.
template <class F>
void apply16(void* in, void* inout, int* len, MPI_Datatype* dt, F f) {
  if (*dt != MPI_DATATYPE_NULL && (*dt == g_f16 || *dt == g_bf16)) {
    const bool half = *dt == g_f16;
    const uint16_t* a = static_cast<const uint16_t*>(in);
    uint16_t* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *len; ++i) {
      if (half) {
        b[i] = thc::engine::float_to_half(f(thc::engine::half_to_float(a[i]), thc::engine::half_to_float(b[i])));
      } else {
        b[i] = thc::engine::float_to_bf16(f(thc::engine::bf16_to_float(a[i]), thc::engine::bf16_to_float(b[i])));
      }
    }
  } else if (*dt == MPI_FLOAT) {
    for (int i = 0; i < *len; ++i) static_cast<float*>(inout)[i] = f(static_cast<float*>(in)[i], static_cast<float*>(inout)[i]);
  } else if (*dt == MPI_DOUBLE) {
    for (int i = 0; i < *len; ++i)
      static_cast<double*>(inout)[i] = f(static_cast<double*>(in)[i], static_cast<double*>(inout)[i]);
  }
}
void sum16(void* in, void* inout, int* len, MPI_Datatype* dt) {
  apply16(in, inout, len, dt, [](auto x, auto y) { return x + y; });
}
void prod16(void* in, void* inout, int* len, MPI_Datatype* dt) {
  apply16(in, inout, len, dt, [](auto x, auto y) { return x * y; });
}
void max16(void* in, void* inout, int* len, MPI_Datatype* dt) {
  apply16(in, inout, len, dt, [](auto x, auto y) { return x != x ? x : y != y ? y : x > y ? x : y; });
}
void min16(void* in, void* inout, int* len, MPI_Datatype* dt) {
  apply16(in, inout, len, dt, [](auto x, auto y) { return x != x ? x : y != y ? y : x < y ? x : y; });
}

MPI_Op op16(MPI_Op* slot, MPI_User_function* fn) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (*slot == MPI_OP_NULL) PMPI_Op_create(fn, 1, slot);
  return *slot;
}

// The communicator's thc state, created collectively on first use and freed with the MPI_Comm.
thc_status_t comm_for(MPI_Comm comm, thc_comm_t* out) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_keyval == MPI_KEYVAL_INVALID) PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_comm_attr, &g_keyval, nullptr);
  }
  void* attr = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, g_keyval, &attr, &found);
  if (found) {
    *out = static_cast<thc_comm_t>(attr);
    return THC_SUCCESS;
  }
  thc_status_t st = thc_comm_create_mpi(comm, nullptr, out);
  if (st == THC_SUCCESS) PMPI_Comm_set_attr(comm, g_keyval, *out);
  return st;
}

bool thc_dtype_of(MPI_Datatype dt, thc_dtype_t* out) {
  if (dt == MPI_FLOAT) *out = THC_FLOAT32;
  else if (dt == MPI_DOUBLE) *out = THC_FLOAT64;
  else if (dt != MPI_DATATYPE_NULL && dt == g_f16) *out = THC_FLOAT16;
  else if (dt != MPI_DATATYPE_NULL && dt == g_bf16) *out = THC_BFLOAT16;
#ifdef MPIX_C_FLOAT16
  else if (dt == MPIX_C_FLOAT16) *out = THC_FLOAT16;
#endif
  else return false;
  return true;
}

// ---- nonblocking calls: MPI generalized requests completed by the progress thread.

// One THC_Iallreduce's MPI request. The progress thread fills code and msg, then completes the
// request and never touches this again; MPI calls query (on the thread that completes the request)
// and then free.
struct GReq {
  MPI_Request req = MPI_REQUEST_NULL;
  int code = MPI_SUCCESS;
  std::string msg;
};

int greq_query(void* extra, MPI_Status* status) {
  auto* g = static_cast<GReq*>(extra);
  PMPI_Status_set_elements(status, MPI_BYTE, 0);
  PMPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
  status->MPI_ERROR = g->code;
  if (g->code != MPI_SUCCESS) thc::capi::set_last_error(g->msg);
  return g->code;
}
int greq_free(void* extra) {
  delete static_cast<GReq*>(extra);
  return MPI_SUCCESS;
}
// A started collective cannot be cancelled (its peers take part in it): the request completes
// normally and MPI_Test_cancelled says false.
int greq_cancel(void*, int) { return MPI_SUCCESS; }

// A private duplicate of a communicator for exact redos, cached on it: redos run on the progress
// thread in start order, which need not be the order of the application's own collectives on comm.
int g_redo_keyval = MPI_KEYVAL_INVALID;
int delete_redo_attr(MPI_Comm comm, int, void* attr, void*) {
  thc::mpi::quiesce(comm);  // calls in flight may still redo on it
  auto* c = static_cast<MPI_Comm*>(attr);
  int finalized = 0;
  PMPI_Finalized(&finalized);
  if (!finalized) PMPI_Comm_free(c);
  delete c;
  return MPI_SUCCESS;
}
MPI_Comm redo_comm_for(MPI_Comm comm) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_redo_keyval == MPI_KEYVAL_INVALID)
      PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_redo_attr, &g_redo_keyval, nullptr);
  }
  void* attr = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, g_redo_keyval, &attr, &found);
  if (found) return *static_cast<MPI_Comm*>(attr);
  auto* c = new MPI_Comm(MPI_COMM_NULL);
  if (PMPI_Comm_dup(comm, c) != MPI_SUCCESS) {
    delete c;
    return MPI_COMM_NULL;
  }
  PMPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN);
  PMPI_Comm_set_attr(comm, g_redo_keyval, c);
  return *c;
}

bool compressible(MPI_Datatype datatype, MPI_Op op, thc_dtype_t* dt, bool* avg) {
  *avg = op != MPI_OP_NULL && op == g_avg;
  return thc_dtype_of(datatype, dt) && (op == MPI_SUM || *avg);
}

std::vector<size_t> counts_of(const int* recvcounts, int n, bool* ok) {
  std::vector<size_t> v(static_cast<size_t>(n));
  *ok = recvcounts != nullptr;
  for (int q = 0; *ok && q < n; ++q) {
    if (recvcounts[q] < 0) *ok = false;
    v[q] = *ok ? static_cast<size_t>(recvcounts[q]) : 0;
  }
  return v;
}

}  // namespace

namespace thc::mpi {

MPI_Op exact_op(MPI_Datatype datatype, MPI_Op op) {
  // (the types exist once anything used them: THC_MPI_FLOAT16/BFLOAT16 create them)
  if (datatype == MPI_DATATYPE_NULL || (datatype != g_f16 && datatype != g_bf16)) return op;
  if (op == MPI_SUM) return THC_MPI_SUM16();
  if (op == MPI_PROD) return THC_MPI_PROD16();
  if (op == MPI_MAX) return THC_MPI_MAX16();
  if (op == MPI_MIN) return THC_MPI_MIN16();
  return op;
}

void quiesce(MPI_Comm comm) {
  void* attr = nullptr;
  int found = 0;
  if (g_keyval != MPI_KEYVAL_INVALID) PMPI_Comm_get_attr(comm, g_keyval, &attr, &found);
  if (found && attr) thc::capi::drain(static_cast<thc_comm_t>(attr));
}

int iallreduce(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count, MPI_Datatype datatype,
               MPI_Op op, MPI_Comm comm, thc_state_t state, MPI_Request* request, const IallreduceHooks& hooks) {
  if (!request) {
    thc::capi::set_last_error("THC_Iallreduce: request is NULL");
    return MPI_ERR_REQUEST;
  }
  thc_dtype_t dt;
  bool avg = false;
  if (!compressible(datatype, op, &dt, &avg)) {
    if (avg) {
      thc::capi::set_last_error("THC_Iallreduce: THC_MPI_AVG is defined for float, double, half and bfloat16 only; "
                                "use MPI_SUM and divide");
      return MPI_ERR_OP;
    }
    if (count > static_cast<size_t>(INT_MAX)) {
      thc::capi::set_last_error("THC_Iallreduce: exact fallback supports at most INT_MAX elements");
      return MPI_ERR_COUNT;
    }
    return PMPI_Iallreduce(sendbuf, recvbuf, static_cast<int>(count), datatype, exact_op(datatype, op), comm, request);
  }
  thc_comm_t tc;
  if (comm_for(comm, &tc) != THC_SUCCESS) return MPI_ERR_OTHER;
  MPI_Comm redo = MPI_COMM_NULL;
  if (hooks.nonfinite_exact && count > 0 && count <= static_cast<size_t>(INT_MAX)) {
    redo = redo_comm_for(comm);
    exact_op(datatype, MPI_SUM);  // the op created here, on the application's thread
  }
  auto* g = new GReq;
  const int rc = PMPI_Grequest_start(greq_query, greq_free, greq_cancel, g, request);
  if (rc != MPI_SUCCESS) {
    delete g;
    return rc;
  }
  g->req = *request;
  const void* sb = sendbuf == MPI_IN_PLACE ? THC_IN_PLACE : sendbuf;
  const IallreduceHooks h = hooks;
  auto after = [g, h, sendbuf, recvbuf, count, datatype, redo](thc_status_t st, const std::string& msg) {
    int code = MPI_SUCCESS;
    std::string m = msg;
    if (st == THC_ERR_NONFINITE && h.nonfinite_exact && redo != MPI_COMM_NULL) {
      // Every rank saw it before anything was reduced (recvbuf untouched): MPI's own sum, exact.
      code = PMPI_Allreduce(sendbuf, recvbuf, static_cast<int>(count), datatype, exact_op(datatype, MPI_SUM), redo);
      if (code != MPI_SUCCESS) m = "the exact redo of a call with NaN/Inf (PMPI_Allreduce) failed";
    } else if (st != THC_SUCCESS) {
      code = h.code_of ? h.code_of(st) : MPI_ERR_OTHER;
    }
    if (h.done) h.done(code, st, m);
    g->code = code;
    g->msg = m;
    PMPI_Grequest_complete(g->req);
  };
  const thc_status_t st = thc::capi::iallreduce(scheme, sb, recvbuf, count, dt, avg ? THC_OP_AVG : THC_OP_SUM, tc,
                                                state, after, nullptr);
  if (st != THC_SUCCESS) {
    // No call was queued (cannot happen with a communicator and a request): complete it failed.
    g->code = MPI_ERR_OTHER;
    g->msg = thc_last_error();
    PMPI_Grequest_complete(g->req);
  }
  return MPI_SUCCESS;
}

}  // namespace thc::mpi

extern "C" {

thc_status_t thc_comm_create_mpi(MPI_Comm comm, const thc_config_t* cfg, thc_comm_t* out) {
  std::unique_ptr<thc::transport::Reducer> r;
  std::unique_ptr<thc::capi::Composite> hier;
  thc_config_t c;
  bool fusing = true;  // whether some rank fuses nonblocking calls (agreed in make_hier)
  const thc_status_t st = thc::capi::guard("thc_comm_create_mpi", [&] {
    if (comm == MPI_COMM_NULL) thc::fail(thc::Status::kInvalidArgument, "MPI_COMM_NULL");
    if (!out) thc::fail(thc::Status::kInvalidArgument, "comm is NULL");
    if (cfg) {
      c = *cfg;
    } else {
      thc::engine::config_from_env(&c);
    }
    // Several ranks per host: a float reduction inside each host around a compressed stage
    // across hosts (THC_HIER, mpi_wrappers/hier.h); otherwise one engine over all ranks.
    hier = thc::mpi::make_hier(comm, c, &fusing);
    if (!hier) r = thc::transport::make_mpi_reducer(comm, c.timeout_ms);
  });
  if (st != THC_SUCCESS) return st;
  const thc_status_t made =
      hier ? thc::capi::create_composite(std::move(hier), out) : thc::capi::create_comm(std::move(r), &c, out);
  if (made == THC_SUCCESS) {
    // Nonblocking calls run on a progress thread that calls MPI: only MPI_THREAD_MULTIPLE allows
    // that while the application calls MPI too. Below it they run on the starting thread.
    int provided = MPI_THREAD_SINGLE;
    PMPI_Query_thread(&provided);
    (*out)->inline_requests = provided < MPI_THREAD_MULTIPLE;
    (*out)->fusion_off = !fusing;
  }
  return made;
}

MPI_Op THC_MPI_AVG(void) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_avg == MPI_OP_NULL) PMPI_Op_create(avg_as_sum, 1, &g_avg);
  return g_avg;
}

MPI_Op THC_MPI_SUM16(void) { return op16(&g_sum16, sum16); }
MPI_Op THC_MPI_PROD16(void) { return op16(&g_prod16, prod16); }
MPI_Op THC_MPI_MAX16(void) { return op16(&g_max16, max16); }
MPI_Op THC_MPI_MIN16(void) { return op16(&g_min16, min16); }

MPI_Datatype THC_MPI_FLOAT16(void) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_f16 == MPI_DATATYPE_NULL) {
    PMPI_Type_contiguous(2, MPI_BYTE, &g_f16);
    PMPI_Type_commit(&g_f16);
  }
  return g_f16;
}

MPI_Datatype THC_MPI_BFLOAT16(void) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_bf16 == MPI_DATATYPE_NULL) {
    PMPI_Type_contiguous(2, MPI_BYTE, &g_bf16);
    PMPI_Type_commit(&g_bf16);
  }
  return g_bf16;
}

int THC_Allreduce_x(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count, MPI_Datatype datatype,
                    MPI_Op op, MPI_Comm comm, thc_state_t state) {
  thc_dtype_t dt;
  const bool avg = op != MPI_OP_NULL && op == g_avg;
  const bool compressible = thc_dtype_of(datatype, &dt) && (op == MPI_SUM || avg);
  if (!compressible) {
    if (avg) {
      // An average of integers is no integer, and MPI has no such op to fall back on.
      thc::capi::set_last_error("THC_Allreduce_x: THC_MPI_AVG is defined for float, double, half and bfloat16 only; "
                                "use MPI_SUM and divide");
      return MPI_ERR_OP;
    }
    // Exact path, untouched.
    if (count > static_cast<size_t>(INT_MAX)) {
      thc::capi::set_last_error("THC_Allreduce_x: exact fallback supports at most INT_MAX elements");
      return MPI_ERR_COUNT;
    }
    return PMPI_Allreduce(sendbuf, recvbuf, static_cast<int>(count), datatype, thc::mpi::exact_op(datatype, op), comm);
  }
  thc_comm_t tc;
  if (comm_for(comm, &tc) != THC_SUCCESS) return MPI_ERR_OTHER;
  const void* sb = sendbuf == MPI_IN_PLACE ? THC_IN_PLACE : sendbuf;
  const thc_status_t st =
      thc_allreduce_scheme(scheme, sb, recvbuf, count, dt, avg ? THC_OP_AVG : THC_OP_SUM, tc, state);
  return st == THC_SUCCESS ? MPI_SUCCESS : MPI_ERR_OTHER;
}

int THC_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  if (count < 0) return MPI_ERR_COUNT;
  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) return MPI_ERR_OTHER;
  return THC_Allreduce_x(cfg.uniform ? THC_SCHEME_UHC : THC_SCHEME_THC, sendbuf, recvbuf, static_cast<size_t>(count),
                         datatype, op, comm, nullptr);
}

int CNAT_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  if (count < 0) return MPI_ERR_COUNT;
  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) return MPI_ERR_OTHER;
  return THC_Allreduce_x(cfg.nat_scheme == THC_SCHEME_DNAT ? THC_SCHEME_DNAT : THC_SCHEME_CNAT, sendbuf, recvbuf,
                         static_cast<size_t>(count), datatype, op, comm, nullptr);
}

int THC_Iallreduce_x(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count, MPI_Datatype datatype,
                     MPI_Op op, MPI_Comm comm, thc_state_t state, MPI_Request* request) {
  return thc::mpi::iallreduce(scheme, sendbuf, recvbuf, count, datatype, op, comm, state, request, {});
}

int THC_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                   MPI_Request* request) {
  if (count < 0) return MPI_ERR_COUNT;
  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) return MPI_ERR_OTHER;
  return THC_Iallreduce_x(cfg.uniform ? THC_SCHEME_UHC : THC_SCHEME_THC, sendbuf, recvbuf, static_cast<size_t>(count),
                          datatype, op, comm, nullptr, request);
}

int CNAT_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                    MPI_Request* request) {
  if (count < 0) return MPI_ERR_COUNT;
  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) return MPI_ERR_OTHER;
  return THC_Iallreduce_x(cfg.nat_scheme == THC_SCHEME_DNAT ? THC_SCHEME_DNAT : THC_SCHEME_CNAT, sendbuf, recvbuf,
                          static_cast<size_t>(count), datatype, op, comm, nullptr, request);
}

int THC_Reduce_scatter_x(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const int recvcounts[],
                         MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, thc_state_t state) {
  thc_dtype_t dt;
  bool avg = false;
  if (!compressible(datatype, op, &dt, &avg)) {
    if (avg) {
      thc::capi::set_last_error("THC_Reduce_scatter: THC_MPI_AVG is defined for float, double, half and bfloat16 only");
      return MPI_ERR_OP;
    }
    return PMPI_Reduce_scatter(sendbuf, recvbuf, recvcounts, datatype, thc::mpi::exact_op(datatype, op), comm);
  }
  int n = 0;
  if (PMPI_Comm_size(comm, &n) != MPI_SUCCESS) return MPI_ERR_COMM;
  bool ok = false;
  const std::vector<size_t> counts = counts_of(recvcounts, n, &ok);
  if (!ok) {
    thc::capi::set_last_error("THC_Reduce_scatter: recvcounts is NULL or has a negative count");
    return MPI_ERR_COUNT;
  }
  thc_comm_t tc;
  if (comm_for(comm, &tc) != THC_SUCCESS) return MPI_ERR_OTHER;
  const void* sb = sendbuf == MPI_IN_PLACE ? THC_IN_PLACE : sendbuf;
  const thc_status_t st =
      thc_reduce_scatter(scheme, sb, recvbuf, counts.data(), dt, avg ? THC_OP_AVG : THC_OP_SUM, tc, state);
  return st == THC_SUCCESS ? MPI_SUCCESS : MPI_ERR_OTHER;
}

int THC_Reduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[], MPI_Datatype datatype, MPI_Op op,
                       MPI_Comm comm) {
  thc_config_t cfg;
  if (thc_config_init(&cfg) != THC_SUCCESS) return MPI_ERR_OTHER;
  return THC_Reduce_scatter_x(cfg.uniform ? THC_SCHEME_UHC : THC_SCHEME_THC, sendbuf, recvbuf, recvcounts, datatype, op,
                              comm, nullptr);
}

int THC_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype datatype, MPI_Op op,
                             MPI_Comm comm) {
  if (recvcount < 0) return MPI_ERR_COUNT;
  int n = 0;
  if (PMPI_Comm_size(comm, &n) != MPI_SUCCESS) return MPI_ERR_COMM;
  const std::vector<int> counts(static_cast<size_t>(n), recvcount);
  return THC_Reduce_scatter(sendbuf, recvbuf, counts.data(), datatype, op, comm);
}

int THC_Allgather_x(thc_scheme_t scheme, const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                    int recvcount, MPI_Datatype recvtype, MPI_Comm comm, thc_state_t state) {
  thc_dtype_t dt;
  const bool in_place = sendbuf == MPI_IN_PLACE;
  if (!thc_dtype_of(recvtype, &dt) || (!in_place && (sendtype != recvtype || sendcount != recvcount)))
    return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
  if (recvcount < 0) return MPI_ERR_COUNT;
  int n = 0;
  if (PMPI_Comm_size(comm, &n) != MPI_SUCCESS) return MPI_ERR_COMM;
  const std::vector<size_t> counts(static_cast<size_t>(n), static_cast<size_t>(recvcount));
  thc_comm_t tc;
  if (comm_for(comm, &tc) != THC_SUCCESS) return MPI_ERR_OTHER;
  const thc_status_t st = thc_allgather(scheme, in_place ? THC_IN_PLACE : sendbuf, recvbuf, counts.data(), dt, tc, state);
  return st == THC_SUCCESS ? MPI_SUCCESS : MPI_ERR_OTHER;
}

thc_status_t THC_Comm_get(MPI_Comm comm, thc_comm_t* out) {
  if (!out) {
    thc::capi::set_last_error("THC_Comm_get: out is NULL");
    return THC_ERR_INVALID_ARG;
  }
  return comm_for(comm, out);
}

thc_status_t THC_Comm_stats(MPI_Comm comm, thc_stats_t* stats) {
  void* attr = nullptr;
  int found = 0;
  if (g_keyval != MPI_KEYVAL_INVALID) PMPI_Comm_get_attr(comm, g_keyval, &attr, &found);
  if (!found) {
    thc::capi::set_last_error("THC_Comm_stats: thc has not run on this communicator");
    return THC_ERR_INVALID_ARG;
  }
  return thc_comm_stats(static_cast<thc_comm_t>(attr), stats);
}

}  // extern "C"
