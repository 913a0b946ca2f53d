// An in-process NCCL for the emulator builds of the NCCL API tests. ncclCommInitAll(n) makes n
// ranks that live in one process; each rank's thread calls the collectives, which meet at a
// rendezvous, compute every rank's result from all ranks' buffers and return (the emulator's
// streams are synchronous). Integer sums wrap like NCCL's. Enough of NCCL for thc_nccl's
// whole flow: prelude MAX, value-form SUM, AlltoAll, lookup-sum, AllGather, decode.
#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

struct Call {
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
};

struct World {
  explicit World(int n) : n(n), calls(n), refs(n) {}
  int n;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t gen = 0;
  std::vector<Call> calls;
  int refs;

  void barrier() {
    std::unique_lock<std::mutex> lk(mu);
    const uint64_t g = gen;
    if (++arrived == n) {
      arrived = 0;
      ++gen;
      cv.notify_all();
      return;
    }
    cv.wait(lk, [&] { return gen != g; });
  }
};

struct FakeComm {
  World* world;
  int rank;
};

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

template <class T>
void reduce_as(const std::vector<Call>& calls, size_t count, ncclRedOp_t op, std::vector<uint8_t>* out) {
  std::vector<T> acc(count);
  for (size_t r = 0; r < calls.size(); ++r) {
    const T* s = static_cast<const T*>(calls[r].send);
    for (size_t i = 0; i < count; ++i) {
      if (r == 0) acc[i] = s[i];
      else if (op == ncclMax) acc[i] = s[i] > acc[i] ? s[i] : acc[i];
      else if (op == ncclMin) acc[i] = s[i] < acc[i] ? s[i] : acc[i];
      else if (op == ncclProd) acc[i] = static_cast<T>(acc[i] * s[i]);
      else acc[i] = static_cast<T>(acc[i] + s[i]);  // sum (and avg below)
    }
  }
  if (op == ncclAvg)
    for (auto& v : acc) v = static_cast<T>(v / static_cast<T>(calls.size()));
  out->resize(count * sizeof(T));
  std::memcpy(out->data(), acc.data(), out->size());
}

// Unsigned arithmetic for the wrapping integer sums.
template <class T, class U>
void reduce_int(const std::vector<Call>& calls, size_t count, ncclRedOp_t op, std::vector<uint8_t>* out) {
  if (op == ncclSum) {
    std::vector<U> acc(count, 0);
    for (const Call& c : calls) {
      const T* s = static_cast<const T*>(c.send);
      for (size_t i = 0; i < count; ++i) acc[i] = static_cast<U>(acc[i] + static_cast<U>(s[i]));
    }
    out->resize(count * sizeof(T));
    std::memcpy(out->data(), acc.data(), out->size());
  } else {
    reduce_as<T>(calls, count, op, out);
  }
}

template <class F>
ncclResult_t collective(ncclComm_t comm, const Call& mine, F&& compute) {
  FakeComm* c = reinterpret_cast<FakeComm*>(comm);
  World& w = *c->world;
  w.calls[c->rank] = mine;
  w.barrier();
  std::vector<uint8_t> result;
  compute(w.calls, c->rank, &result);
  w.barrier();  // every rank has read every send buffer
  if (!result.empty()) std::memcpy(mine.recv, result.data(), result.size());
  w.barrier();
  return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int*) {
  if (ndev < 1) return ncclInvalidArgument;
  World* w = new World(ndev);
  for (int r = 0; r < ndev; ++r) comm[r] = reinterpret_cast<ncclComm_t>(new FakeComm{w, r});
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  FakeComm* c = reinterpret_cast<FakeComm*>(comm);
  bool last;
  {
    std::lock_guard<std::mutex> lk(c->world->mu);
    last = --c->world->refs == 0;
  }
  if (last) delete c->world;
  delete c;
  return ncclSuccess;
}
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = reinterpret_cast<FakeComm*>(comm)->world->n;
  return ncclSuccess;
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = reinterpret_cast<FakeComm*>(comm)->rank;
  return ncclSuccess;
}
ncclResult_t ncclCommCuDevice(const ncclComm_t, int* dev) {
  *dev = 0;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "fake nccl error"; }

ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t) {
  return collective(comm, Call{s, r, count, t, op, 0}, [&](const std::vector<Call>& calls, int, std::vector<uint8_t>* out) {
    switch (t) {
      case ncclInt8: reduce_int<int8_t, uint8_t>(calls, count, op, out); break;
      case ncclUint8: reduce_int<uint8_t, uint8_t>(calls, count, op, out); break;
      case ncclInt32: reduce_int<int32_t, uint32_t>(calls, count, op, out); break;
      case ncclUint32: reduce_int<uint32_t, uint32_t>(calls, count, op, out); break;
      case ncclInt64: reduce_int<int64_t, uint64_t>(calls, count, op, out); break;
      case ncclUint64: reduce_int<uint64_t, uint64_t>(calls, count, op, out); break;
      case ncclFloat32: reduce_as<float>(calls, count, op, out); break;
      case ncclFloat64: reduce_as<double>(calls, count, op, out); break;
      default: break;  // 16-bit and 8-bit floats: not needed by the tests
    }
  });
}

ncclResult_t ncclAlltoAll(const void* s, void* r, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t) {
  const size_t bytes = count * type_size(t);
  return collective(comm, Call{s, r, count, t, ncclSum, 0},
                    [&](const std::vector<Call>& calls, int me, std::vector<uint8_t>* out) {
                      out->resize(bytes * calls.size());
                      for (size_t i = 0; i < calls.size(); ++i)
                        std::memcpy(out->data() + i * bytes, static_cast<const uint8_t*>(calls[i].send) + me * bytes,
                                    bytes);
                    });
}

ncclResult_t ncclAllGather(const void* s, void* r, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t) {
  const size_t bytes = count * type_size(t);
  return collective(comm, Call{s, r, count, t, ncclSum, 0},
                    [&](const std::vector<Call>& calls, int, std::vector<uint8_t>* out) {
                      out->resize(bytes * calls.size());
                      for (size_t i = 0; i < calls.size(); ++i) std::memcpy(out->data() + i * bytes, calls[i].send, bytes);
                    });
}

ncclResult_t ncclBroadcast(const void* s, void* r, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t) {
  const size_t bytes = count * type_size(t);
  return collective(comm, Call{s, r, count, t, ncclSum, root},
                    [&](const std::vector<Call>& calls, int, std::vector<uint8_t>* out) {
                      out->resize(bytes);
                      std::memcpy(out->data(), calls[static_cast<size_t>(root)].send, bytes);
                    });
}

}  // extern "C"
