#include "collectives/engine/host_codec.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

namespace thc::engine {

// threads - 1 threads that sleep between runs; run() hands out task indices one at a time.
class WorkerPool {
 public:
  explicit WorkerPool(int threads) {
    for (int w = 1; w < threads; ++w) threads_.emplace_back([this, w] { loop(w); });
  }
  ~WorkerPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // task(i, worker) for every i in [0, n), the caller being worker 0; returns when all are done
  // and rethrows the first exception a task threw.
  void run(uint64_t n, const std::function<void(uint64_t, int)>& task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      task_ = &task;
      n_ = n;
      next_.store(0);
      active_ = static_cast<int>(threads_.size());
      err_ = nullptr;
      ++gen_;
    }
    wake_.notify_all();
    work(0);
    std::unique_lock<std::mutex> lk(mu_);
    done_.wait(lk, [this] { return active_ == 0; });
    task_ = nullptr;
    if (err_) std::rethrow_exception(err_);
  }

 private:
  void work(int worker) {
    for (uint64_t i; (i = next_.fetch_add(1)) < n_;) {
      try {
        (*task_)(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        if (!err_) err_ = std::current_exception();
        next_.store(n_);  // hand out nothing more
      }
    }
  }
  void loop(int worker) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        wake_.wait(lk, [&] { return stop_ || gen_ != seen; });
        if (stop_) return;
        seen = gen_;
      }
      work(worker);
      {
        std::lock_guard<std::mutex> lk(mu_);
        --active_;
      }
      done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t gen_ = 0;
  bool stop_ = false;
  const std::function<void(uint64_t, int)>* task_ = nullptr;
  uint64_t n_ = 0;
  std::atomic<uint64_t> next_{0};
  int active_ = 0;
  std::exception_ptr err_;
};

HostCodec::HostCodec(int threads) : threads_(std::max(1, threads)), ws_(static_cast<size_t>(threads_)) {
  if (threads_ > 1) pool_ = std::make_unique<WorkerPool>(threads_);
}

HostCodec::~HostCodec() = default;

bool HostCodec::prelude(const codec::Codec& c, const float* x, uint64_t count, float* stats, const float* add) {
  if (!pool_) return c.prelude(x, count, stats, add);
  const uint64_t B = c.block();
  const uint64_t nb = (count + B - 1) / B;
  std::atomic<bool> finite{true};
  pool_->run(nb, [&](uint64_t k, int) {
    if (!c.prelude(x + k * B, std::min(B, count - k * B), stats + k, add ? add + k * B : nullptr)) finite.store(false);
  });
  return finite.load();
}

void HostCodec::encode(const codec::Codec& c, const codec::Layout& lay, uint64_t first, uint64_t n, const float* x,
                       const float* stats, const codec::CallRng& rng, const codec::Codec::EncodeOut& out,
                       const std::function<void()>& progress, const float* add) {
  // Every block but the call's last is whole, so block k of the range starts k * B into each
  // output (B >= 1024: whole bytes of packed codes).
  const uint64_t B = lay.block;
  const size_t wsz = codec::int_size(c.sum_type());
  // The transfer in flight moves only while the caller is in the transport (MPI over TCP), but
  // each progress is a poll(2) of every socket plus the schedules' reactions: after every block
  // of 2^14 (~17 us of encode) that was most of ~3300 polls per 64 MB call and rank on the TCP
  // testbed, ~5 ms of its CPU. Once per kProgressElems (~70 us of encode; ~0.9 MB of a
  // 100 Gbit/s link, which a socket's send buffer holds) the wire stays fed.
  uint64_t unpolled = 0;  // elements the caller encoded since it last ran progress
  auto one = [&](uint64_t k, int worker) {
    codec::Codec::EncodeOut o;
    if (out.packed) o.packed = out.packed + k * B * c.index_bits() / 8;
    if (out.values) o.values = static_cast<uint8_t*>(out.values) + k * B * wsz;
    if (out.residual) o.residual = out.residual + k * B;
    if (out.staged) o.staged = out.staged + k * B;
    c.encode(lay, first + k, 1, x + k * B, stats + k, rng, o, &ws_[static_cast<size_t>(worker)],
             add ? add + k * B : nullptr);
    if (worker == 0 && progress && (unpolled += B) >= kProgressElems) {
      unpolled = 0;
      progress();
    }
  };
  if (!pool_) {
    for (uint64_t k = 0; k < n; ++k) one(k, 0);
    return;
  }
  pool_->run(n, one);
}

void HostCodec::decode(const codec::Codec& c, const codec::Layout& lay, uint64_t first, uint64_t n, const void* sums,
                       const float* stats, const codec::CallRng& rng, int contributors, bool mean, float* out) {
  if (!pool_) {
    c.decode(lay, first, n, sums, stats, rng, contributors, mean, out, &ws_[0]);
    return;
  }
  const uint64_t B = lay.block;
  const size_t wsz = codec::int_size(c.sum_type());
  pool_->run(n, [&](uint64_t k, int worker) {
    c.decode(lay, first + k, 1, static_cast<const uint8_t*>(sums) + k * B * wsz, stats + k, rng, contributors, mean,
             out + k * B, &ws_[static_cast<size_t>(worker)]);
  });
}

}  // namespace thc::engine
