// The C API's objects and the one place where C++ exceptions become thc_status_t.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>

#include "collectives/engine/engine.h"
#include "collectives/engine/progress.h"
#include "thc/thc.h"

namespace thc::capi {
// A communicator whose calls compose engines instead of being one engine's: the hierarchical
// MPI allreduce (mpi_wrappers/hier.h) reduces floats inside each host and runs an engine across
// hosts. Same contract as Engine::allreduce: collective, every rank fails alike.
class Composite {
 public:
  virtual ~Composite() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const thc_config_t& config() const = 0;
  virtual void allreduce(codec::Scheme scheme, const void* send, void* recv, uint64_t count, engine::DType dtype,
                         bool mean, engine::ErrorFeedback* ef) = 0;
  // A call (with elements) that failed before it reached the composite on a free communicator (an
  // argument the C API refused, blocking or not): counts it and takes part in its first exchange,
  // so that every rank fails it with `why.status()` (Engine::fail_call). Counts as one call even
  // for a group or shards: a composite runs each as one call.
  virtual void fail_call(const Error& why) = 0;
  virtual engine::EngineStats stats() const = 0;
  // Hosts the compressed stage spans (thc_stats_t::hier_hosts).
  virtual int hosts() const = 0;
  // THC_DEBUG line at destruction ("" if none).
  virtual std::string wire_stats() const { return {}; }
  // Calls on several tensors, with Engine's contracts (allreduce_group, reduce_scatter,
  // allgather): each one call. (No defaults: a group as one allreduce per tensor, a reduce-scatter
  // as an allreduce of the whole, an allgather as an allreduce of zero-padded shards are correct
  // but several times slower.)
  virtual void allreduce_group(codec::Scheme scheme, const engine::Tensor* ts, size_t n, bool mean) = 0;
  virtual void reduce_scatter(codec::Scheme scheme, const void* send, void* recv, const uint64_t* counts,
                              engine::DType dtype, bool mean, engine::ErrorFeedback* ef) = 0;
  virtual void allgather(codec::Scheme scheme, const void* send, void* recv, const uint64_t* counts,
                         engine::DType dtype, engine::ErrorFeedback* ef) = 0;
  // Nonblocking allreduces fuse into groups (requests.cc) on a composite whose groups run as one
  // stream: it says so (the same on every rank) and agrees on each group's members through
  // max_u32 (element-wise MAX over the ranks, bounded by THC_TIMEOUT_MS).
  virtual bool fuses() const { return false; }
  virtual void max_u32(uint32_t* w, size_t n);
};
}  // namespace thc::capi

// A communicator takes one call at a time (thc.h): `busy` turns a second thread's concurrent
// call into an error instead of a data race; statistics are read from a copy taken after each
// call, so thc_comm_stats may run on any thread at any time. Exactly one of engine and
// composite runs the calls.
struct thc_comm_s {
  explicit thc_comm_s(std::unique_ptr<thc::engine::Engine> e) : engine(std::move(e)) {}
  explicit thc_comm_s(std::unique_ptr<thc::capi::Composite> c) : composite(std::move(c)) {}
  const thc_config_t& config() const { return engine ? engine->config() : composite->config(); }
  std::unique_ptr<thc::engine::Engine> engine;
  std::unique_ptr<thc::capi::Composite> composite;
  std::atomic<bool> busy{false};
  std::mutex stats_mu;
  thc::engine::EngineStats stats;
  // Nonblocking calls (requests.cc): the queue and its progress thread, made by the first one.
  // inline_requests: the backend takes no second thread (MPI below MPI_THREAD_MULTIPLE), so calls
  // run on the thread that starts them. Declared last: destroyed (drained, joined) first.
  bool inline_requests = false;
  // No rank of the communicator fuses nonblocking calls (THC_FUSION_BYTES = 0 everywhere, agreed
  // at creation where the backend has such an exchange: MPI): calls skip the per-group agreement.
  bool fusion_off = false;
  std::mutex progress_mu;
  std::unique_ptr<thc::engine::Progress> progress;
};
struct thc_state_s {
  thc::engine::ErrorFeedback ef;
  std::atomic<bool> busy{false};
};

namespace thc::capi {
// Run fn; map thc::Error / std::bad_alloc / anything else to a status and the thread's message.
thc_status_t guard(const char* where, const std::function<void()>& fn);
void set_last_error(const std::string& msg);
const std::string& last_error();
engine::DType to_dtype(thc_dtype_t t);
// For backends built beside the C API (MPI, aggregator clients): wrap a reducer in a
// communicator (collective over the reducer's ranks: agrees on the seed).
thc_status_t create_comm(std::unique_ptr<transport::Reducer> r, const thc_config_t* cfg, thc_comm_t* comm);
// A communicator whose calls go to c.
thc_status_t create_composite(std::unique_ptr<Composite> c, thc_comm_t* comm);

// Runs a blocking call of comm (requests.cc): on this thread when no nonblocking call is in
// flight, else queued behind them (in the order this rank started them) and waited for.
void run_ordered(thc_comm_t comm, const std::function<void()>& fn);
// Waits for comm's nonblocking calls and stops its progress thread (thc_comm_destroy).
void drain(thc_comm_t comm);
// thc_iallreduce_scheme for the MPI-like API: `after` runs on the thread that ran the call, once
// it is over and in the order the calls were started (it completes MPI requests), with the
// call's status and message. request may be NULL (no handle kept).
thc_status_t iallreduce(thc_scheme_t scheme, const void* sendbuf, void* recvbuf, size_t count, thc_dtype_t dtype,
                        thc_op_t op, thc_comm_t comm, thc_state_t state,
                        std::function<void(thc_status_t, const std::string&)> after, thc_request_t* request);
}  // namespace thc::capi
