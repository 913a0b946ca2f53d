// A reusable barrier for test threads (std::barrier is C++20; the project builds as C++17).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace thc_testing {

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lk(mu_);
    const uint64_t gen = gen_;
    if (++waiting_ == n_) {
      waiting_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lk, [&] { return gen_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_;
  int waiting_ = 0;
  uint64_t gen_ = 0;
};

}  // namespace thc_testing
