// The C API of the collective calls (thc.h): allreduce, blocking and nonblocking, groups,
// reduce-scatter and allgather, over the engine's queue and progress thread
// (collectives/engine/progress.h).
//
// Every call, blocking or not, is checked here as far as this rank can tell on its own (op,
// scheme, dtype, buffers, the error-feedback states); a call that fails a check still takes part
// in its first exchange (Engine::fail_call, Composite::fail_call), in its place in the order of
// calls, so that the peers fail that call too instead of pairing it with the next one. Only what
// leaves no call to report on (no communicator, no request pointer) fails alone, and so does a
// blocking call on a communicator another thread's call is using (it was not made).
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "collectives/capi/capi.h"

struct thc_request_s {
  std::shared_ptr<thc::engine::Completion> done;  // shared with the queue: outlives the communicator
  const char* where = "";
};

namespace thc::capi {
namespace {

using engine::Completion;
using engine::DType;
using engine::Progress;
using engine::Tensor;
using engine::Work;

void copy_stats(thc_comm_t c) {
  std::lock_guard<std::mutex> lk(c->stats_mu);
  c->stats = c->engine ? c->engine->stats() : c->composite->stats();
}

bool fuses(thc_comm_t comm) { return !comm->fusion_off && (comm->engine != nullptr || comm->composite->fuses()); }

Progress& progress_of(thc_comm_t comm) {
  std::lock_guard<std::mutex> lk(comm->progress_mu);
  if (!comm->progress) {
    Progress::Hooks h;
    h.max_u32 = [comm](uint32_t* w, size_t n) {
      if (comm->engine) {
        comm->engine->reducer().max_u32(w, n);
      } else {
        comm->composite->max_u32(w, n);
      }
    };
    h.run_group = [comm](codec::Scheme s, std::vector<Tensor>& ts, bool mean) {
      if (comm->engine) {
        comm->engine->allreduce_group(s, ts.data(), ts.size(), mean);
      } else {
        comm->composite->allreduce_group(s, ts.data(), ts.size(), mean);
      }
    };
    h.after_any = [comm] { copy_stats(comm); };
    Progress::Options o;
    const thc_config_t& cfg = comm->config();
    o.fusion_bytes = cfg.fusion_bytes > 0 ? static_cast<uint64_t>(cfg.fusion_bytes) : 0;
    o.cycle_ms = cfg.fusion_cycle_ms > 0 ? cfg.fusion_cycle_ms : 0;
    // No agreement where no call can fuse (every rank knows it alike): a composite that does not
    // fuse, or a communicator on which no rank fuses (agreed at creation).
    o.agree = fuses(comm);
    o.inline_only = comm->inline_requests;
    comm->progress = std::make_unique<Progress>(std::move(h), o);
  }
  return *comm->progress;
}

Progress* progress_if_any(thc_comm_t comm) {
  std::lock_guard<std::mutex> lk(comm->progress_mu);
  return comm->progress.get();
}

// What this rank refuses about a call before it reaches the engine.
struct Check {
  Status status = Status::kSuccess;
  std::string why;
  void refuse(Status s, const std::string& w) {
    if (status == Status::kSuccess) {
      status = s;
      why = w;
    }
  }
  bool ok() const { return status == Status::kSuccess; }
};

bool valid_dtype(thc_dtype_t t) { return t == THC_FLOAT32 || t == THC_FLOAT16 || t == THC_BFLOAT16 || t == THC_FLOAT64; }

void check_common(Check& c, thc_scheme_t scheme, thc_op_t op) {
  if (op != THC_OP_SUM && op != THC_OP_AVG) c.refuse(Status::kInvalidArgument, "op must be THC_OP_SUM or THC_OP_AVG");
  if (scheme < THC_SCHEME_THC || scheme > THC_SCHEME_DNAT)
    c.refuse(Status::kInvalidArgument, "unknown scheme " + std::to_string(static_cast<int>(scheme)));
}

void check_dtype(Check& c, thc_dtype_t t) {
  if (!valid_dtype(t)) c.refuse(Status::kInvalidArgument, "unknown datatype " + std::to_string(static_cast<int>(t)));
}

// The states a call uses, marked in use until it is over; a state in use, or bound to another
// count, is refused.
struct States {
  std::vector<thc_state_t> held;
  bool take(Check& c, thc_state_t s, uint64_t count) {
    if (!s) return true;
    for (thc_state_t h : held)
      if (h == s) return true;  // checked by the engine (two tensors, one state)
    if (s->busy.exchange(true)) {
      c.refuse(Status::kInvalidArgument, "the error-feedback state is in use by another call");
      return false;
    }
    held.push_back(s);
    if (s->ef.count != 0 && s->ef.count != count)
      c.refuse(Status::kInvalidArgument, "error-feedback state was bound to count " + std::to_string(s->ef.count) +
                                             ", used with count " + std::to_string(count));
    return true;
  }
  void release() {
    for (thc_state_t s : held) s->busy.store(false);
    held.clear();
  }
};

// Runs one call (blocking or not) built as a Work; `calls` is how many calls it counts as.
thc_status_t issue(const char* where, thc_comm_t comm, Work w, Check check, States states, uint32_t calls,
                   bool blocking, thc_request_t* request,
                   std::function<void(thc_status_t, const std::string&)> after = nullptr) {
  if (!check.ok()) {
    // Refused here: in its place in the sequence, the call takes part in its first exchange (when
    // it communicates at all), so every rank fails it with this status.
    const Status st = check.status;
    const std::string why = check.why;
    w.can_join = false;
    w.run = [comm, st, why, calls] {
      if (calls > 0) {
        if (comm->engine) {
          comm->engine->fail_call(st, calls);
        } else {
          comm->composite->fail_call(Error(st, why));
        }
      }
      fail(st, why);
    };
  }
  auto held = std::make_shared<States>(std::move(states));
  const std::string prefix = std::string(where) + ": ";
  w.after = [held, after, prefix](Status s, const std::string& msg) {
    held->release();
    if (after) after(static_cast<thc_status_t>(s), s == Status::kSuccess ? msg : prefix + msg);
  };
  if (!blocking) {
    auto done = progress_of(comm).submit(std::move(w));
    if (request) *request = new thc_request_s{done, where};
    return THC_SUCCESS;
  }
  // Blocking: one call at a time per communicator from the caller's side (thc.h). Such a call
  // cannot take part in the collective (its exchanges belong to the call in progress), so it is
  // refused on its own and does not count: like a collective issued concurrently on one MPI
  // communicator, it is the program's error.
  if (comm->busy.exchange(true)) {
    held->release();
    set_last_error(prefix + "thc_comm_t is in use by a call on another thread (a communicator takes one call at a "
                            "time, in the same order on every rank, like an MPI communicator); this call was not made");
    return THC_ERR_INVALID_ARG;
  }
  std::string msg;
  const thc_status_t st = guard(where, [&] { run_ordered(comm, w.run); });
  if (st != THC_SUCCESS) msg = last_error().substr(std::min(last_error().size(), prefix.size()));
  w.after(static_cast<Status>(st), msg);
  copy_stats(comm);
  comm->busy.store(false);
  if (st != THC_SUCCESS) set_last_error(prefix + msg);
  return st;
}

uint64_t sum_counts(const size_t* counts, int n) {
  uint64_t t = 0;
  for (int q = 0; q < n; ++q) t += counts[q];
  return t;
}

int comm_size(thc_comm_t c) { return c->engine ? c->engine->size() : c->composite->size(); }
int comm_rank(thc_comm_t c) { return c->engine ? c->engine->rank() : c->composite->rank(); }

thc_status_t allreduce_call(const char* where, thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count,
                            thc_dtype_t dtype, thc_op_t op, thc_comm_t comm, thc_state_t state, bool blocking,
                            thc_request_t* request, std::function<void(thc_status_t, const std::string&)> after) {
  if (!comm || (!blocking && !request)) {
    set_last_error(std::string(where) + ": " + (comm ? "request is NULL" : "comm is NULL"));
    return THC_ERR_INVALID_ARG;
  }
  if (request) *request = THC_REQUEST_NULL;
  Check c;
  check_common(c, scheme, op);
  check_dtype(c, dtype);
  if (count > 0 && !recvbuf) c.refuse(Status::kInvalidArgument, "recvbuf is NULL");
  States states;
  if (count > 0) states.take(c, state, count);
  Work w;
  w.fusable = true;
  w.noop = count == 0;  // a call of count 0 does not communicate, on any rank
  w.can_join = c.ok() && fuses(comm);  // (host or device buffers: the group path takes both)
  w.scheme = static_cast<codec::Scheme>(scheme);
  w.mean = op == THC_OP_AVG;
  w.key = static_cast<uint64_t>(scheme) * 2 + (w.mean ? 1 : 0);
  if (c.ok()) {
    const DType dt = to_dtype(dtype);
    w.bytes = count * engine::dtype_size(dt);
    w.tensor = Tensor{sendbuf, recvbuf, count, dt, state ? &state->ef : nullptr};
    const Tensor t = w.tensor;
    const codec::Scheme sch = w.scheme;
    const bool mean = w.mean;
    w.run = [comm, t, sch, mean] {
      if (comm->engine) {
        comm->engine->allreduce(sch, t.send, t.recv, t.count, t.dtype, mean, t.ef);
      } else {
        comm->composite->allreduce(sch, t.send, t.recv, t.count, t.dtype, mean, t.ef);
      }
    };
  }
  return issue(where, comm, std::move(w), c, std::move(states), count > 0 ? 1 : 0, blocking, request, after);
}

thc_status_t group_call(const char* where, thc_scheme_t scheme, const thc_tensor_t* tensors, size_t n, thc_op_t op,
                        thc_comm_t comm, bool blocking, thc_request_t* request) {
  if (!comm || (!blocking && !request) || (n > 0 && !tensors)) {
    set_last_error(std::string(where) + ": " + (!comm ? "comm is NULL" : (n > 0 && !tensors) ? "tensors is NULL" : "request is NULL"));
    return THC_ERR_INVALID_ARG;
  }
  if (request) *request = THC_REQUEST_NULL;
  Check c;
  check_common(c, scheme, op);
  States states;
  std::vector<Tensor> ts;
  uint32_t calls = 0;
  for (size_t i = 0; i < n; ++i) {
    const thc_tensor_t& t = tensors[i];
    check_dtype(c, t.dtype);
    if (t.count == 0) continue;
    ++calls;
    if (!t.recvbuf) c.refuse(Status::kInvalidArgument, "tensor " + std::to_string(i) + ": recvbuf is NULL");
    states.take(c, t.state, t.count);
    if (c.ok())
      ts.push_back(Tensor{t.sendbuf, t.recvbuf, t.count, to_dtype(t.dtype), t.state ? &t.state->ef : nullptr});
  }
  Work w;
  if (c.ok()) {
    const codec::Scheme sch = static_cast<codec::Scheme>(scheme);
    const bool mean = op == THC_OP_AVG;
    w.run = [comm, ts, sch, mean] {
      if (comm->engine) {
        comm->engine->allreduce_group(sch, ts.data(), ts.size(), mean);
      } else {
        comm->composite->allreduce_group(sch, ts.data(), ts.size(), mean);
      }
    };
  }
  return issue(where, comm, std::move(w), c, std::move(states), calls, blocking, request);
}

thc_status_t shards_call(const char* where, bool rs, thc_scheme_t scheme, const void* sendbuf, void* recvbuf,
                         const size_t* recvcounts, thc_dtype_t dtype, thc_op_t op, thc_comm_t comm,
                         thc_state_t state, bool blocking, thc_request_t* request) {
  if (!comm || (!blocking && !request) || !recvcounts) {
    set_last_error(std::string(where) + ": " + (!comm ? "comm is NULL" : !recvcounts ? "recvcounts is NULL" : "request is NULL"));
    return THC_ERR_INVALID_ARG;
  }
  if (request) *request = THC_REQUEST_NULL;
  const int n = comm_size(comm);
  const int me = comm_rank(comm);
  std::vector<uint64_t> counts(recvcounts, recvcounts + n);
  const uint64_t total = sum_counts(recvcounts, n);
  uint32_t calls = 0;
  for (uint64_t v : counts) calls += v ? 1 : 0;
  Check c;
  check_common(c, scheme, op);
  check_dtype(c, dtype);
  const bool in_place = sendbuf == nullptr || sendbuf == THC_IN_PLACE;
  // recvbuf holds this rank's result (reduce-scatter: its shard), and the input when in place
  if (!recvbuf && (rs ? (counts[static_cast<size_t>(me)] > 0 || (in_place && total > 0)) : total > 0))
    c.refuse(Status::kInvalidArgument, "recvbuf is NULL");
  States states;
  if (total > 0) states.take(c, state, rs ? total : counts[static_cast<size_t>(me)]);
  Work w;
  if (c.ok()) {
    const codec::Scheme sch = static_cast<codec::Scheme>(scheme);
    const bool mean = op == THC_OP_AVG;
    const DType dt = to_dtype(dtype);
    engine::ErrorFeedback* ef = state ? &state->ef : nullptr;
    w.run = [comm, rs, sch, mean, dt, ef, sendbuf, recvbuf, counts] {
      if (rs) {
        if (comm->engine) {
          comm->engine->reduce_scatter(sch, sendbuf, recvbuf, counts.data(), dt, mean, ef);
        } else {
          comm->composite->reduce_scatter(sch, sendbuf, recvbuf, counts.data(), dt, mean, ef);
        }
      } else if (comm->engine) {
        comm->engine->allgather(sch, sendbuf, recvbuf, counts.data(), dt, ef);
      } else {
        comm->composite->allgather(sch, sendbuf, recvbuf, counts.data(), dt, ef);
      }
    };
  }
  return issue(where, comm, std::move(w), c, std::move(states), calls, blocking, request);
}

// A request's outcome on the thread that completes it.
thc_status_t complete(thc_request_t* request) {
  thc_request_s* r = *request;
  const Status s = r->done->status();
  if (s != Status::kSuccess) set_last_error(std::string(r->where) + ": " + r->done->message());
  delete r;
  *request = THC_REQUEST_NULL;
  return static_cast<thc_status_t>(s);
}

}  // namespace

void run_ordered(thc_comm_t comm, const std::function<void()>& fn) {
  Progress* p = progress_if_any(comm);
  if (!p) {
    fn();
    return;
  }
  p->run_blocking(fn);
}

void drain(thc_comm_t comm) {
  std::unique_ptr<Progress> p;
  {
    std::lock_guard<std::mutex> lk(comm->progress_mu);
    p = std::move(comm->progress);
  }
  p.reset();
}

thc_status_t iallreduce(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype,
                        thc_op_t op, thc_comm_t comm, thc_state_t state,
                        std::function<void(thc_status_t, const std::string&)> after, thc_request_t* request) {
  thc_request_t ignored = THC_REQUEST_NULL;
  const thc_status_t st = allreduce_call("thc_iallreduce", scheme, sendbuf, recvbuf, count, dtype, op, comm, state,
                                         false, &ignored, std::move(after));
  if (request) {
    *request = ignored;
  } else if (ignored) {
    delete ignored;
  }
  return st;
}

// ---- Composite defaults
void Composite::max_u32(uint32_t* w, size_t n) {
  (void)w;
  (void)n;
  fail(Status::kInternal, "this communicator does not fuse calls");
}

}  // namespace thc::capi

using thc::capi::allreduce_call;
using thc::capi::group_call;
using thc::capi::shards_call;

extern "C" {

thc_status_t thc_allreduce_scheme(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count,
                                  thc_dtype_t dtype, thc_op_t op, thc_comm_t comm, thc_state_t state) {
  return allreduce_call("thc_allreduce", scheme, sendbuf, recvbuf, count, dtype, op, comm, state, true, nullptr,
                        nullptr);
}

thc_status_t thc_iallreduce_scheme(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count,
                                   thc_dtype_t dtype, thc_op_t op, thc_comm_t comm, thc_state_t state,
                                   thc_request_t* request) {
  return allreduce_call("thc_iallreduce", scheme, sendbuf, recvbuf, count, dtype, op, comm, state, false, request,
                        nullptr);
}

thc_status_t thc_iallreduce(const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype, thc_op_t op,
                            thc_comm_t comm, thc_state_t state, thc_request_t* request) {
  const thc_scheme_t s = (comm && comm->config().uniform) ? THC_SCHEME_UHC : THC_SCHEME_THC;
  return thc_iallreduce_scheme(s, sendbuf, recvbuf, count, dtype, op, comm, state, request);
}

thc_status_t cnat_iallreduce(const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype, thc_op_t op,
                             thc_comm_t comm, thc_state_t state, thc_request_t* request) {
  const thc_scheme_t s =
      (comm && comm->config().nat_scheme == THC_SCHEME_DNAT) ? THC_SCHEME_DNAT : THC_SCHEME_CNAT;
  return thc_iallreduce_scheme(s, sendbuf, recvbuf, count, dtype, op, comm, state, request);
}

thc_status_t thc_test(thc_request_t* request, int* done) {
  if (!request || !done) {
    thc::capi::set_last_error("thc_test: NULL argument");
    return THC_ERR_INVALID_ARG;
  }
  if (*request == THC_REQUEST_NULL) {
    *done = 1;
    return THC_SUCCESS;
  }
  if (!(*request)->done->done()) {
    *done = 0;
    return THC_SUCCESS;
  }
  *done = 1;
  return thc::capi::complete(request);
}

thc_status_t thc_wait(thc_request_t* request) {
  if (!request) {
    thc::capi::set_last_error("thc_wait: request is NULL");
    return THC_ERR_INVALID_ARG;
  }
  if (*request == THC_REQUEST_NULL) return THC_SUCCESS;
  (*request)->done->wait();
  return thc::capi::complete(request);
}

thc_status_t thc_waitall(size_t count, thc_request_t* requests, thc_status_t* statuses) {
  if (count > 0 && !requests) {
    thc::capi::set_last_error("thc_waitall: requests is NULL");
    return THC_ERR_INVALID_ARG;
  }
  thc_status_t first = THC_SUCCESS;
  std::string first_msg;
  for (size_t i = 0; i < count; ++i) {
    const thc_status_t s = thc_wait(&requests[i]);
    if (statuses) statuses[i] = s;
    if (s != THC_SUCCESS && first == THC_SUCCESS) {
      first = s;
      first_msg = thc_last_error();
    }
  }
  if (first != THC_SUCCESS) thc::capi::set_last_error(first_msg);
  return first;
}

thc_status_t thc_request_free(thc_request_t* request) {
  if (!request) {
    thc::capi::set_last_error("thc_request_free: request is NULL");
    return THC_ERR_INVALID_ARG;
  }
  delete *request;  // the call keeps running: the queue holds its completion
  *request = THC_REQUEST_NULL;
  return THC_SUCCESS;
}

thc_status_t thc_allreduce_group(thc_scheme_t scheme, const thc_tensor_t* tensors, size_t ntensors, thc_op_t op,
                                 thc_comm_t comm) {
  return group_call("thc_allreduce_group", scheme, tensors, ntensors, op, comm, true, nullptr);
}

thc_status_t thc_iallreduce_group(thc_scheme_t scheme, const thc_tensor_t* tensors, size_t ntensors, thc_op_t op,
                                  thc_comm_t comm, thc_request_t* request) {
  return group_call("thc_iallreduce_group", scheme, tensors, ntensors, op, comm, false, request);
}

thc_status_t thc_reduce_scatter(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const size_t* recvcounts,
                                thc_dtype_t dtype, thc_op_t op, thc_comm_t comm, thc_state_t state) {
  return shards_call("thc_reduce_scatter", true, scheme, sendbuf, recvbuf, recvcounts, dtype, op, comm, state, true,
                     nullptr);
}

thc_status_t thc_ireduce_scatter(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const size_t* recvcounts,
                                 thc_dtype_t dtype, thc_op_t op, thc_comm_t comm, thc_state_t state,
                                 thc_request_t* request) {
  return shards_call("thc_ireduce_scatter", true, scheme, sendbuf, recvbuf, recvcounts, dtype, op, comm, state, false,
                     request);
}

thc_status_t thc_allgather(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const size_t* recvcounts,
                           thc_dtype_t dtype, thc_comm_t comm, thc_state_t state) {
  return shards_call("thc_allgather", false, scheme, sendbuf, recvbuf, recvcounts, dtype, THC_OP_SUM, comm, state,
                     true, nullptr);
}

thc_status_t thc_iallgather(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, const size_t* recvcounts,
                            thc_dtype_t dtype, thc_comm_t comm, thc_state_t state, thc_request_t* request) {
  return shards_call("thc_iallgather", false, scheme, sendbuf, recvbuf, recvcounts, dtype, THC_OP_SUM, comm, state,
                     false, request);
}

}  // extern "C"
