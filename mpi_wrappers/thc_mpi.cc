// The MPI-like API: thc communicators cached on MPI communicators, THC_Allreduce, CNAT_Allreduce.
#include "thc/thc_mpi.h"

#include <climits>
#include <mutex>
#include <string>

#include "collectives/capi/capi.h"
#include "collectives/engine/dtype.h"
#include "collectives/engine/knobs.h"
#include "mpi_wrappers/hier.h"
#include "transport/mpi/mpi_reducer.h"

namespace {

std::mutex g_mu;
int g_keyval = MPI_KEYVAL_INVALID;
MPI_Op g_avg = MPI_OP_NULL;
MPI_Op g_sum16 = MPI_OP_NULL;
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

// MPI_SUM of the byte-based 16-bit types, which MPI's built-in ops do not know (MPI_ERR_OP):
// each element added in float and rounded once to the type, so NaN and Inf propagate as in an
// IEEE sum. The types are created before any op runs on them.
void sum16(void* in, void* inout, int* len, MPI_Datatype* dt) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  if (*dt != MPI_DATATYPE_NULL && *dt == g_f16) {
    for (int i = 0; i < *len; ++i)
      b[i] = thc::engine::float_to_half(thc::engine::half_to_float(a[i]) + thc::engine::half_to_float(b[i]));
  } else if (*dt != MPI_DATATYPE_NULL && *dt == g_bf16) {
    for (int i = 0; i < *len; ++i)
      b[i] = thc::engine::float_to_bf16(thc::engine::bf16_to_float(a[i]) + thc::engine::bf16_to_float(b[i]));
  } else {
    avg_as_sum(in, inout, len, dt);  // float and double (documented: THC_MPI_SUM16 is for the 16-bit types)
  }
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

}  // namespace

extern "C" {

thc_status_t thc_comm_create_mpi(MPI_Comm comm, const thc_config_t* cfg, thc_comm_t* out) {
  std::unique_ptr<thc::transport::Reducer> r;
  std::unique_ptr<thc::capi::Composite> hier;
  thc_config_t c;
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
    hier = thc::mpi::make_hier(comm, c);
    if (!hier) r = thc::transport::make_mpi_reducer(comm, c.timeout_ms);
  });
  if (st != THC_SUCCESS) return st;
  if (hier) return thc::capi::create_composite(std::move(hier), out);
  return thc::capi::create_comm(std::move(r), &c, out);
}

MPI_Op THC_MPI_AVG(void) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_avg == MPI_OP_NULL) PMPI_Op_create(avg_as_sum, 1, &g_avg);
  return g_avg;
}

MPI_Op THC_MPI_SUM16(void) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_sum16 == MPI_OP_NULL) PMPI_Op_create(sum16, 1, &g_sum16);
  return g_sum16;
}

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
    return PMPI_Allreduce(sendbuf, recvbuf, static_cast<int>(count), datatype, op, comm);
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
