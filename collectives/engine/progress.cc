#include "collectives/engine/progress.h"

#include <algorithm>
#include <new>

namespace thc::engine {

void Completion::finish(Status s, std::string msg) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    status_ = s;
    msg_ = std::move(msg);
    done_ = true;
  }
  cv_.notify_all();
}

bool Completion::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_;
}

void Completion::wait() const {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return done_; });
}

Status Completion::status() const {
  std::lock_guard<std::mutex> lk(mu_);
  return status_;
}

std::string Completion::message() const {
  std::lock_guard<std::mutex> lk(mu_);
  return msg_;
}

namespace {

// Runs fn; what it throws becomes a status and a message.
Status capture(const std::function<void()>& fn, std::string* msg) {
  try {
    fn();
    return Status::kSuccess;
  } catch (const Error& e) {
    *msg = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    *msg = "out of memory";
    return Status::kOutOfMemory;
  } catch (const std::exception& e) {
    *msg = std::string("internal error: ") + e.what();
    return Status::kInternal;
  } catch (...) {
    *msg = "unknown internal error";
    return Status::kInternal;
  }
}

}  // namespace

Progress::Progress(Hooks hooks, const Options& opt) : hooks_(std::move(hooks)), opt_(opt) {}

Progress::~Progress() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<Completion> Progress::submit(Work w) {
  std::shared_ptr<Completion> done = w.done;
  std::unique_lock<std::mutex> lk(mu_);
  w.queued = std::chrono::steady_clock::now();
  queue_.push_back(std::move(w));
  if (opt_.inline_only) {
    // No thread may enter this backend besides the caller's (MPI below MPI_THREAD_MULTIPLE):
    // the call runs now, after whatever an earlier inline call left queued (nothing).
    while (!queue_.empty()) {
      busy_ = true;
      run_head(lk);
      busy_ = false;
    }
    idle_cv_.notify_all();
    return done;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  lk.unlock();
  cv_.notify_all();
  return done;
}

void Progress::run_blocking(const std::function<void()>& fn) {
  std::unique_lock<std::mutex> lk(mu_);
  if (busy_ || !queue_.empty()) {
    // Calls in flight: this one comes after them, in the order this rank started them.
    Work w;
    w.run = fn;
    std::shared_ptr<Completion> done = w.done;
    w.queued = std::chrono::steady_clock::now();
    queue_.push_back(std::move(w));
    flush_ = true;
    lk.unlock();
    cv_.notify_all();
    done->wait();
    if (done->status() != Status::kSuccess) throw Error(done->status(), done->message());
    return;
  }
  busy_ = true;
  lk.unlock();
  struct Release {
    Progress* p;
    ~Release() {
      {
        std::lock_guard<std::mutex> g(p->mu_);
        p->busy_ = false;
      }
      p->cv_.notify_all();
      p->idle_cv_.notify_all();
    }
  } release{this};
  fn();
}

void Progress::flush() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    flush_ = true;
  }
  cv_.notify_all();
}

size_t Progress::proposal_locked() const {
  const Work& head = queue_.front();
  if (!head.can_join || opt_.fusion_bytes == 0) return 1;
  size_t k = 0;
  uint64_t bytes = 0;
  for (const Work& w : queue_) {
    if (!w.fusable || !w.can_join || w.key != head.key) break;
    if (k > 0 && bytes + w.bytes > opt_.fusion_bytes) break;
    bytes += w.bytes;
    ++k;
  }
  return std::max<size_t>(k, 1);
}

bool Progress::cycle_over_locked() const {
  const Work& head = queue_.front();
  if (!head.fusable || !head.can_join || head.noop || !opt_.agree || opt_.fusion_bytes == 0) return true;
  if (stop_ || flush_) return true;
  if (std::chrono::steady_clock::now() - head.queued >= std::chrono::duration<double, std::milli>(opt_.cycle_ms))
    return true;
  // The group cannot grow any more: the threshold is reached, or a call that cannot join it is
  // queued behind the ones that can.
  uint64_t bytes = 0;
  for (const Work& w : queue_) {
    if (!w.fusable || !w.can_join || w.key != head.key) return true;
    bytes += w.bytes;
    if (bytes >= opt_.fusion_bytes) return true;
  }
  return false;
}

void Progress::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return (stop_ && queue_.empty() && !busy_) || (!queue_.empty() && !busy_); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    while (!cycle_over_locked()) {
      const auto until = queue_.front().queued +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double, std::milli>(opt_.cycle_ms));
      cv_.wait_until(lk, until);
    }
    busy_ = true;
    run_head(lk);
    busy_ = false;
    if (queue_.empty()) {
      flush_ = false;
      idle_cv_.notify_all();
    }
    cv_.notify_all();
  }
}

void Progress::finish(Work& w, Status s, const std::string& msg) {
  if (w.after) w.after(s, msg);
  w.done->finish(s, msg);
}

void Progress::run_head(std::unique_lock<std::mutex>& lk) {
  size_t take = 1;
  if (queue_.front().fusable && !queue_.front().noop && opt_.agree) {
    const size_t mine = proposal_locked();
    lk.unlock();
    uint32_t w = ~static_cast<uint32_t>(mine);
    std::string msg;
    const Status st = capture([&] { hooks_.max_u32(&w, 1); }, &msg);
    lk.lock();
    if (st != Status::kSuccess) {
      Work head = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      if (hooks_.after_any) hooks_.after_any();
      finish(head, st, "agreeing on the calls to fuse: " + msg);
      lk.lock();
      return;
    }
    // Every rank has started at least the smallest proposal's calls.
    take = std::max<size_t>(1, std::min<size_t>(mine, ~w));
  }
  std::vector<Work> batch;
  for (size_t i = 0; i < take; ++i) {
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  lk.unlock();
  // Outcomes are published after the statistics are copied, so a waiter sees its call counted.
  std::vector<Status> sts(batch.size(), Status::kSuccess);
  std::vector<std::string> msgs(batch.size());
  if (batch.size() == 1) {
    sts[0] = capture(batch[0].run, &msgs[0]);
  } else {
    std::vector<Tensor> ts;
    ts.reserve(batch.size());
    for (const Work& w : batch) ts.push_back(w.tensor);
    std::string msg;
    const Status st = capture([&] { hooks_.run_group(batch[0].scheme, ts, batch[0].mean); }, &msg);
    if (st == Status::kNonFinite || st == Status::kConfigMismatch || st == Status::kInvalidArgument ||
        st == Status::kOverflow || st == Status::kUnsupported) {
      // The group failed in its first exchange, on every rank alike, before anything was reduced:
      // NaN/Inf in some call, calls started in another order or refused on some rank. Each call
      // again alone, so that only the calls at fault fail, as they would unfused.
      for (size_t i = 0; i < batch.size(); ++i) sts[i] = capture(batch[i].run, &msgs[i]);
    } else {
      for (size_t i = 0; i < batch.size(); ++i) {
        sts[i] = st;
        msgs[i] = msg;
      }
    }
  }
  if (hooks_.after_any) hooks_.after_any();
  for (size_t i = 0; i < batch.size(); ++i) finish(batch[i], sts[i], msgs[i]);
  lk.lock();
}

}  // namespace thc::engine
