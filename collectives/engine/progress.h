// Nonblocking calls of one communicator: a queue of calls in the order this rank started them and
// the progress thread that runs them (thc.h, "Nonblocking calls").
//
// Why one thread per communicator (not per process, not per call):
// - A communicator's collectives must run in the order they were started, on every rank alike:
//   one thread draining one FIFO is that order, with no further bookkeeping.
// - Communicators are independent, as in MPI: a call waiting up to THC_TIMEOUT_MS for a slow peer
//   on one communicator must not hold up another's (a process-wide thread would serialize them,
//   and two communicators started in opposite orders on two ranks would deadlock).
// - The backend of a communicator (an MPI link, an aggregator client, its codec workers) is entered
//   by one thread at a time: the progress thread, or the caller of a blocking call while nothing is
//   queued (run_blocking). Backends stay single-threaded as they were written.
// - Not one thread per call: calls of a communicator cannot run concurrently anyway (each is a
//   collective on the same peers), and a thread per call would only add creation cost and
//   contention. The thread is created by the first nonblocking call and sleeps on a condition
//   variable when the queue is empty.
// On a machine with few cores the progress thread competes with the caller's computation for the
// CPU: what overlaps for free is the time the call waits for the network and its peers; its
// encoding and decoding need a core of their own (README, "Nonblocking calls").
//
// Fusion (THC_FUSION_BYTES, THC_FUSION_CYCLE_MS): allreduces started nonblocking may run as one
// group with the allreduces queued behind them. Which ones is agreed with the other ranks before
// every such call: each rank proposes how many of its queued calls could join (a prefix: same
// scheme and op, host buffers, valid arguments, within the byte threshold) and all take the
// smallest proposal, a MAX over complemented words. Every rank has started at least those calls
// (each proposes only calls it has), in the same order (MPI's rule), so every rank runs the same
// calls as one group. Timing decides how many are fused, never which calls are matched.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/codec/codec.h"
#include "collectives/engine/engine.h"
#include "common/status.h"

namespace thc::engine {

// The outcome of one call, set once by whoever runs it.
class Completion {
 public:
  void finish(Status s, std::string msg);
  bool done() const;
  // Blocks until finish().
  void wait() const;
  Status status() const;
  std::string message() const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_ = Status::kSuccess;
  std::string msg_;
};

// One call queued on a communicator.
struct Work {
  // A nonblocking allreduce: it takes part in the agreement on fusion before it runs, whatever its
  // arguments (the peers' same call does).
  bool fusable = false;
  // Whether it may run in a group with others (host buffers, arguments that passed the checks); a
  // fusable call that cannot join proposes 1.
  bool can_join = false;
  // A call of count 0: it communicates on no rank, so at the head of the queue it runs without the
  // agreement; inside a group it is carried along (every rank has it there).
  bool noop = false;
  uint64_t key = 0;    // scheme and op: calls of one group share them
  uint64_t bytes = 0;  // input bytes, for THC_FUSION_BYTES
  Tensor tensor;       // what a group needs of the call
  codec::Scheme scheme = codec::Scheme::kThc;
  bool mean = false;
  // The call alone. Throws thc::Error (or anything; mapped to kInternal).
  std::function<void()> run;
  // On the thread that ran the call, after it and before `done` is set: releases what the call
  // held (its error-feedback state), completes MPI requests. Must not throw.
  std::function<void(Status, const std::string&)> after;
  std::shared_ptr<Completion> done = std::make_shared<Completion>();
  std::chrono::steady_clock::time_point queued{};
};

// Runs the queued calls of one communicator in order on a thread of its own.
class Progress {
 public:
  struct Hooks {
    // The agreement before a fusable call: MAX of u32 over the communicator's ranks, blocking.
    std::function<void(uint32_t*, size_t)> max_u32;
    // A group of calls as one (Engine::allreduce_group); throws like a call.
    std::function<void(codec::Scheme, std::vector<Tensor>&, bool)> run_group;
    // After every call or group, on the thread that ran it (statistics copies).
    std::function<void()> after_any;
  };
  struct Options {
    uint64_t fusion_bytes = 0;   // 0: never fused (still agreed: peers may fuse)
    double cycle_ms = 0;
    bool agree = true;           // false: this communicator never fuses on any rank (no agreement)
    bool inline_only = false;    // run every call on the starting thread (MPI below THREAD_MULTIPLE)
  };
  Progress(Hooks hooks, const Options& opt);
  // Waits for the queued calls (each bounded by THC_TIMEOUT_MS), then joins the thread.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Queues a call; returns its completion. With inline_only the call has run when this returns.
  std::shared_ptr<Completion> submit(Work w);
  // A blocking call: runs fn on this thread when nothing is queued or running, else queues it
  // behind the calls in flight and waits. Throws what fn throws.
  void run_blocking(const std::function<void()>& fn);
  // A waiter wants the queued calls now: ends the fusion cycle's wait.
  void flush();

 private:
  void loop();
  // Runs queue_.front() and whatever the ranks agree to fuse with it; called with mu_ unlocked.
  void run_head(std::unique_lock<std::mutex>& lk);
  size_t proposal_locked() const;
  bool cycle_over_locked() const;
  void finish(Work& w, Status s, const std::string& msg);

  Hooks hooks_;
  Options opt_;
  std::mutex mu_;
  std::condition_variable cv_;       // work queued, flush, stop, a blocking caller done
  std::condition_variable idle_cv_;  // nothing queued or running
  std::deque<Work> queue_;
  bool busy_ = false;   // a call is running (on the thread or inline)
  bool stop_ = false;
  bool flush_ = false;
  std::thread thread_;
};

}  // namespace thc::engine
