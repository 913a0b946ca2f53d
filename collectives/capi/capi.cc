#include "collectives/capi/capi.h"

#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "collectives/engine/knobs.h"
#include "transport/inproc/inproc.h"

struct thc_inproc_group_s {
  std::shared_ptr<thc::transport::InprocGroup> group;
  long timeout_ms;
};

namespace thc::capi {
namespace {
thread_local std::string t_last_error;
}
const std::string& last_error() { return t_last_error; }

void set_last_error(const std::string& msg) { t_last_error = msg; }

thc_status_t guard(const char* where, const std::function<void()>& fn) {
  try {
    fn();
    return THC_SUCCESS;
  } catch (const Error& e) {
    t_last_error = std::string(where) + ": " + e.what();
    return static_cast<thc_status_t>(e.status());
  } catch (const std::bad_alloc&) {
    t_last_error = std::string(where) + ": out of memory";
    return THC_ERR_NO_MEMORY;
  } catch (const std::exception& e) {
    t_last_error = std::string(where) + ": internal error: " + e.what();
    return THC_ERR_INTERNAL;
  } catch (...) {
    t_last_error = std::string(where) + ": unknown internal error";
    return THC_ERR_INTERNAL;
  }
}

engine::DType to_dtype(thc_dtype_t t) {
  switch (t) {
    case THC_FLOAT32: return engine::DType::kF32;
    case THC_FLOAT16: return engine::DType::kF16;
    case THC_BFLOAT16: return engine::DType::kBF16;
    case THC_FLOAT64: return engine::DType::kF64;
    default: break;
  }
  fail(Status::kInvalidArgument, "unknown datatype " + std::to_string(static_cast<int>(t)));
}

}  // namespace thc::capi

using thc::capi::guard;

namespace thc::capi {
thc_status_t make_comm(const char* where, std::unique_ptr<transport::Reducer>* r,
                              const thc_config_t* cfg, thc_comm_t* comm) {
  return guard(where, [&] {
    if (!comm) fail(Status::kInvalidArgument, "comm is NULL");
    thc_config_t c;
    if (cfg) {
      c = *cfg;
    } else {
      engine::config_from_env(&c);
    }
    auto e = std::make_unique<engine::Engine>(std::move(*r), c);
    *comm = new thc_comm_s(std::move(e));
  });
}


thc_status_t create_comm(std::unique_ptr<transport::Reducer> r, const thc_config_t* cfg, thc_comm_t* comm) {
  return make_comm("thc_comm_create", &r, cfg, comm);
}

thc_status_t create_composite(std::unique_ptr<Composite> c, thc_comm_t* comm) {
  return guard("thc_comm_create", [&] {
    if (!comm) fail(Status::kInvalidArgument, "comm is NULL");
    *comm = new thc_comm_s(std::move(c));
  });
}
}  // namespace thc::capi

using thc::capi::make_comm;

extern "C" {

thc_status_t thc_config_init(thc_config_t* cfg) {
  return guard("thc_config_init", [&] {
    if (!cfg) thc::fail(thc::Status::kInvalidArgument, "cfg is NULL");
    thc::engine::config_from_env(cfg);
  });
}

const char* thc_status_string(thc_status_t s) {
  if (s < THC_SUCCESS || s > THC_ERR_LEFT_BEHIND) return "unknown status";
  return thc::status_text(static_cast<thc::Status>(s));
}

const char* thc_last_error(void) { return thc::capi::last_error().c_str(); }
const char* thc_version(void) { return THC_VERSION_STRING; }

thc_status_t thc_inproc_group_create(int size, thc_inproc_group_t* group) {
  return guard("thc_inproc_group_create", [&] {
    if (!group) thc::fail(thc::Status::kInvalidArgument, "group is NULL");
    thc_config_t cfg;
    thc::engine::config_from_env(&cfg);
    *group = new thc_inproc_group_s{thc::transport::make_inproc_group(size, cfg.timeout_ms), cfg.timeout_ms};
  });
}

thc_status_t thc_inproc_group_destroy(thc_inproc_group_t group) {
  delete group;
  return THC_SUCCESS;
}

thc_status_t thc_comm_create_inproc(thc_inproc_group_t group, int rank, const thc_config_t* cfg,
                                    thc_comm_t* comm) {
  std::unique_ptr<thc::transport::Reducer> r;
  const thc_status_t st = guard("thc_comm_create_inproc", [&] {
    if (!group) thc::fail(thc::Status::kInvalidArgument, "group is NULL");
    r = thc::transport::make_inproc_reducer(group->group, rank);
  });
  if (st != THC_SUCCESS) return st;
  return make_comm("thc_comm_create_inproc", &r, cfg, comm);
}

thc_status_t thc_comm_destroy(thc_comm_t comm) {
  if (comm) thc::capi::drain(comm);  // the nonblocking calls in flight first
  if (comm && comm->engine && comm->engine->config().debug) {
    // THC_DEBUG: what the transport saw (aggregator clients: packets, retransmissions, window,
    // round trips), one line per rank.
    const std::string w = comm->engine->reducer().wire_stats();
    if (!w.empty())
      std::fprintf(stderr, "thc: rank %d %s: %s\n", comm->engine->rank(), comm->engine->reducer().name().c_str(), w.c_str());
  }
  if (comm && comm->composite && comm->composite->config().debug) {
    const std::string w = comm->composite->wire_stats();
    if (!w.empty()) std::fprintf(stderr, "thc: rank %d %s\n", comm->composite->rank(), w.c_str());
  }
  delete comm;
  return THC_SUCCESS;
}

thc_status_t thc_comm_rank(thc_comm_t comm, int* rank) {
  return guard("thc_comm_rank", [&] {
    if (!comm || !rank) thc::fail(thc::Status::kInvalidArgument, "NULL argument");
    *rank = comm->engine ? comm->engine->rank() : comm->composite->rank();
  });
}

thc_status_t thc_comm_size(thc_comm_t comm, int* size) {
  return guard("thc_comm_size", [&] {
    if (!comm || !size) thc::fail(thc::Status::kInvalidArgument, "NULL argument");
    *size = comm->engine ? comm->engine->size() : comm->composite->size();
  });
}

thc_status_t thc_state_create(thc_state_t* state) {
  return guard("thc_state_create", [&] {
    if (!state) thc::fail(thc::Status::kInvalidArgument, "state is NULL");
    *state = new thc_state_s{};
  });
}

thc_status_t thc_state_destroy(thc_state_t state) {
  delete state;
  return THC_SUCCESS;
}

thc_status_t thc_state_reset(thc_state_t state) {
  return guard("thc_state_reset", [&] {
    if (!state) return;
    if (state->busy.exchange(true))
      thc::fail(thc::Status::kInvalidArgument, "the error-feedback state is in use by a call on another thread");
    state->ef.reset();
    state->busy.store(false);
  });
}

thc_status_t thc_allreduce(const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype, thc_op_t op,
                           thc_comm_t comm, thc_state_t state) {
  const thc_scheme_t s = (comm && comm->config().uniform) ? THC_SCHEME_UHC : THC_SCHEME_THC;
  return thc_allreduce_scheme(s, sendbuf, recvbuf, count, dtype, op, comm, state);
}

thc_status_t cnat_allreduce(const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype, thc_op_t op,
                            thc_comm_t comm, thc_state_t state) {
  const thc_scheme_t s =
      (comm && comm->config().nat_scheme == THC_SCHEME_DNAT) ? THC_SCHEME_DNAT : THC_SCHEME_CNAT;
  return thc_allreduce_scheme(s, sendbuf, recvbuf, count, dtype, op, comm, state);
}

thc_status_t thc_comm_stats(thc_comm_t comm, thc_stats_t* stats) {
  return guard("thc_comm_stats", [&] {
    if (!comm || !stats) thc::fail(thc::Status::kInvalidArgument, "NULL argument");
    std::lock_guard<std::mutex> lk(comm->stats_mu);
    const auto& s = comm->stats;
    stats->calls = s.calls;
    stats->elements = s.elements;
    stats->wire_bytes_up = s.wire_bytes_up;
    stats->wire_bytes_down = s.wire_bytes_down;
    stats->float_bytes = s.float_bytes;
    stats->last_algo = s.last_algo == thc::engine::Algo::kPs ? THC_ALGO_PS : THC_ALGO_INT;
    stats->measured_wire = s.measured_wire ? 1 : 0;
    stats->packets = s.packets;
    stats->retransmissions = s.retransmissions;
    stats->hier_hosts = comm->composite ? comm->composite->hosts() : 0;
    stats->groups = s.groups;
    stats->grouped_tensors = s.grouped_tensors;
  });
}

void thc_print_knobs(void) {
  thc_config_t cur;
  std::string err;
  const bool env_ok = thc_config_init(&cur) == THC_SUCCESS;
  for (const auto& k : thc::engine::knobs()) {
    std::printf("%-20s default=%-10s current=%-10s %s\n", k.env, k.def,
                env_ok ? thc::engine::knob_value(k, cur).c_str() : "(env error)", k.help);
  }
  if (!env_ok) std::printf("environment error: %s\n", thc_last_error());
}

namespace {
const thc::engine::Knob* find_knob(const char* name) {
  if (!name) thc::fail(thc::Status::kInvalidArgument, "knob name is NULL");
  for (const auto& k : thc::engine::knobs())
    if (std::strcmp(k.env, name) == 0) return &k;
  thc::fail(thc::Status::kInvalidArgument, std::string("unknown knob '") + name + "' (thc-info lists them)");
}
}  // namespace

thc_status_t thc_config_set(thc_config_t* cfg, const char* name, const char* value) {
  return guard("thc_config_set", [&] {
    if (!cfg || !value) thc::fail(thc::Status::kInvalidArgument, "NULL argument");
    const thc::engine::Knob* k = find_knob(name);
    // Parse into a copy: a malformed value leaves cfg as it was.
    thc_config_t c = *cfg;
    std::string err;
    if (!thc::engine::set_knob(*k, value, &c, &err)) thc::fail(thc::Status::kInvalidArgument, err);
    *cfg = c;
  });
}

thc_status_t thc_config_get(const thc_config_t* cfg, const char* name, char* buf, size_t len) {
  return guard("thc_config_get", [&] {
    if (!cfg || !buf) thc::fail(thc::Status::kInvalidArgument, "NULL argument");
    const std::string v = thc::engine::knob_value(*find_knob(name), *cfg);
    if (v.size() + 1 > len)
      thc::fail(thc::Status::kInvalidArgument, std::string(name) + ": value needs " + std::to_string(v.size() + 1) + " bytes");
    std::memcpy(buf, v.c_str(), v.size() + 1);
  });
}

const char* thc_knob_name(int i) {
  const auto& ks = thc::engine::knobs();
  return i >= 0 && static_cast<size_t>(i) < ks.size() ? ks[static_cast<size_t>(i)].env : nullptr;
}

}  // extern "C"
