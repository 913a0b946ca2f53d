#pragma once
// Buffers that something outside our control may still write after the operation that owned
// them was given up on (MPI cannot cancel or free a started collective; a send or a matched
// receive may not cancel; a late peer may still deliver): parked for the life of the process,
// never freed on purpose, so that no later allocation can receive those writes. One parking lot
// per element type, shared by every user (transport/schedules, the MPI link, the hierarchical
// communicator).
#include <mutex>
#include <vector>

namespace thc {

template <class T>
void keep_forever(std::vector<T>&& buf) {
  static std::mutex mu;
  static auto* parked = new std::vector<std::vector<T>>();  // never freed, on purpose
  if (buf.empty()) return;
  std::lock_guard<std::mutex> lk(mu);
  parked->push_back(std::move(buf));
}

}  // namespace thc
