// thc._thc: libthc's C API (include/thc/thc.h) for Python. thc/__init__.py is the public face: it
// names the operations, converts NumPy bfloat16 and raises the exception classes of thc/errors.py
// that every failure here turns into (StatusError -> thc.errors._from_status).
//
// Arrays come through nanobind's ndarray import: __dlpack__ (versioned or not), then the buffer
// protocol, never a copy (a copy of an output would drop the result silently). The GIL is released
// for every call that communicates, so threads of one process can be the ranks of an in-process
// group, and collective creation can wait for its peers.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "thc/thc.h"
#if THC_HAVE_MPI
#include "thc/thc_mpi.h"
#endif

namespace nb = nanobind;

namespace {

// A failure with libthc's status; `kind` picks a narrower Python class ("dtype", "array").
struct StatusError {
  thc_status_t status;
  std::string message;
  const char* kind = nullptr;
};

[[noreturn]] void raise(thc_status_t st, std::string msg, const char* kind = nullptr) {
  throw StatusError{st, std::move(msg), kind};
}

// thc_last_error is per thread: read it on the thread that made the call, before anything else.
void check(thc_status_t st) {
  if (st != THC_SUCCESS) raise(st, thc_last_error());
}

using Knobs = std::vector<std::pair<std::string, std::string>>;

thc_config_t make_config(const Knobs& knobs) {
  thc_config_t cfg;
  check(thc_config_init(&cfg));
  for (const auto& [name, value] : knobs) check(thc_config_set(&cfg, name.c_str(), value.c_str()));
  return cfg;
}

// ---- arrays

constexpr int kDevCpu = 1, kDevCuda = 2, kDevCudaHost = 3, kDevCudaManaged = 13;

struct Array {
  void* data = nullptr;
  size_t count = 0;
  size_t bytes = 0;
  thc_dtype_t dtype = THC_FLOAT32;
  int device_type = kDevCpu;
  int device_id = 0;
};

std::string py_type_name(nb::handle h) { return nb::type_name(h.type()).c_str(); }

std::string dtype_name(nb::dlpack::dtype d) {
  const char* code = "?";
  switch (d.code) {
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Int): code = "int"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::UInt): code = "uint"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Float): code = "float"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat): code = "bfloat"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Complex): code = "complex"; break;
    case static_cast<uint8_t>(nb::dlpack::dtype_code::Bool): code = "bool"; break;
    default: break;
  }
  std::string s = std::string(code) + std::to_string(d.bits);
  if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
  return s;
}

// What libthc reduces: float32, float16, bfloat16, float64. `bf16_bits`: the array is uint16
// holding bfloat16 (NumPy's ml_dtypes.bfloat16 exports neither DLPack nor a buffer format, so
// thc/__init__.py passes a uint16 view of it).
template <typename A>
Array describe(const A& a, const char* name, bool bf16_bits) {
  Array r;
  const nb::dlpack::dtype d = a.dtype();
  using C = nb::dlpack::dtype_code;
  const bool f = d.code == static_cast<uint8_t>(C::Float) && d.lanes == 1;
  if (bf16_bits) {
    if (!(d.code == static_cast<uint8_t>(C::UInt) && d.bits == 16 && d.lanes == 1))
      raise(THC_ERR_INVALID_ARG, std::string(name) + ": a bfloat16 view must be uint16, got " + dtype_name(d), "dtype");
    r.dtype = THC_BFLOAT16;
  } else if (f && d.bits == 32) {
    r.dtype = THC_FLOAT32;
  } else if (f && d.bits == 16) {
    r.dtype = THC_FLOAT16;
  } else if (f && d.bits == 64) {
    r.dtype = THC_FLOAT64;
  } else if (d.code == static_cast<uint8_t>(C::Bfloat) && d.bits == 16 && d.lanes == 1) {
    r.dtype = THC_BFLOAT16;
  } else {
    raise(THC_ERR_INVALID_ARG,
          std::string(name) + ": thc reduces float32, float16, bfloat16 and float64 arrays, not " + dtype_name(d) +
              " (integers and other types need an exact allreduce, e.g. mpi4py's)",
          "dtype");
  }
  // Dense row-major only: the call treats the memory as one vector (dimensions of extent 1 may
  // carry any stride, as DLPack producers disagree on them; so may every dimension of an empty
  // array: NumPy 2.4 exports an empty array with strides that failed this check).
  size_t elements = 1;
  for (size_t i = 0; i < a.ndim(); ++i) elements *= a.shape(i);
  size_t count = 1;
  for (size_t i = a.ndim(); elements != 0 && i-- > 0;) {
    const size_t n = a.shape(i);
    if (n != 1 && a.stride(i) != static_cast<int64_t>(count))
      raise(THC_ERR_INVALID_ARG,
            std::string(name) + ": needs a C-contiguous array (e.g. numpy.ascontiguousarray, tensor.contiguous())",
            "array");
    count *= n;
  }
  r.count = elements;
  r.bytes = elements * (d.bits / 8);
  r.data = const_cast<void*>(static_cast<const void*>(a.data()));
  r.device_type = a.device_type();
  r.device_id = a.device_id();
  if (r.device_type != kDevCpu && r.device_type != kDevCuda && r.device_type != kDevCudaHost &&
      r.device_type != kDevCudaManaged)
    raise(THC_ERR_UNSUPPORTED,
          std::string(name) + ": arrays on DLPack device type " + std::to_string(r.device_type) +
              " are not supported (host and CUDA memory are)");
  return r;
}

using RoArray = nb::ndarray<nb::ro>;
using RwArray = nb::ndarray<>;

// Why an object is no array: its own __dlpack__ may say (a tensor that requires grad, a
// producer that cannot export its dtype), else it has neither protocol.
[[noreturn]] void not_an_array(nb::handle h, const char* name) {
  std::string why = "expected an array with __dlpack__ or the buffer protocol, got " + py_type_name(h);
  if (nb::hasattr(h, "__dlpack__")) {
    try {
      h.attr("__dlpack__")();
    } catch (nb::python_error& e) {
      why = py_type_name(h) + ".__dlpack__() failed: " + e.what();
    }
  }
  raise(THC_ERR_INVALID_ARG, std::string(name) + ": " + why, "array");
}

// The writable view of an output; a clear error for read-only objects and non-arrays.
RwArray import_rw(nb::handle h, const char* name) {
  RwArray a;
  if (nb::try_cast(h, a, false)) return a;
  RoArray ro;
  if (nb::try_cast(h, ro, false))
    raise(THC_ERR_INVALID_ARG, std::string(name) + " (" + py_type_name(h) + ") is read-only: the result needs a writable array (pass out=)",
          "array");
  not_an_array(h, name);
}

RoArray import_ro(nb::handle h, const char* name) {
  RoArray a;
  if (nb::try_cast(h, a, false)) return a;
  not_an_array(h, name);
}

bool on_device(const Array& a) { return a.device_type == kDevCuda || a.device_type == kDevCudaManaged; }

// ---- objects

struct State {
  thc_state_t s = nullptr;
  State() { check(thc_state_create(&s)); }
  ~State() { thc_state_destroy(s); }
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  void reset() { check(thc_state_reset(s)); }
};

struct InprocGroup {
  thc_inproc_group_t g = nullptr;
  int size = 0;
  explicit InprocGroup(int n) : size(n) { check(thc_inproc_group_create(n, &g)); }
  ~InprocGroup() { thc_inproc_group_destroy(g); }
  InprocGroup(const InprocGroup&) = delete;
  InprocGroup& operator=(const InprocGroup&) = delete;
};

// A call's buffers and the Python objects it needs until it completes (DLPack/buffer exports,
// error-feedback states, the result handed back).
struct Hold {
  std::vector<RoArray> ro;
  std::vector<RwArray> rw;
  std::vector<nb::object> keep;
};

class Comm {
 public:
  explicit Comm(thc_comm_t c) : c_(c) {}
  ~Comm() {
    if (c_) {
      nb::gil_scoped_release nogil;  // waits for the calls in flight
      thc_comm_destroy(c_);
    }
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Holds the communicator open for one call; close() refuses while any is held.
  class Use {
   public:
    explicit Use(Comm& c) : c_(c) {
      std::lock_guard<std::mutex> lk(c_.mu_);
      if (!c_.c_) raise(THC_ERR_INVALID_ARG, "the communicator is closed");
      ++c_.users_;
    }
    ~Use() {
      std::lock_guard<std::mutex> lk(c_.mu_);
      --c_.users_;
    }
    thc_comm_t get() const { return c_.c_; }

   private:
    Comm& c_;
  };

  // thc_comm_destroy waits for the calls in flight (their requests stay valid), so the GIL is
  // released for it, and mu_ is not held then (a thread holding the GIL may be waiting on it).
  void close() {
    thc_comm_t c;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (users_ > 0) raise(THC_ERR_INVALID_ARG, "close(): a call on this communicator is still running");
      c = c_;
      c_ = nullptr;
    }
    if (c) {
      nb::gil_scoped_release nogil;
      thc_comm_destroy(c);
    }
    orphans_.clear();  // every call has ended
  }
  bool closed() {
    std::lock_guard<std::mutex> lk(mu_);
    return c_ == nullptr;
  }

  // Nonblocking calls, in start order (GIL held for all of these).
  uint64_t next_seq() { return seq_++; }
  // A request dropped before completion: libthc lets it run on, so its buffers stay referenced
  // until a later call is known to have ended (calls on a communicator end in start order) or
  // the communicator is closed.
  void orphan(uint64_t seq, Hold&& h) {
    if (closed()) return;
    orphans_.emplace_back(seq, std::move(h));
  }
  // Every call started before `seq` has ended.
  void ended_before(uint64_t seq) {
    std::vector<std::pair<uint64_t, Hold>> keep;
    for (auto& o : orphans_)
      if (o.first >= seq) keep.push_back(std::move(o));
    orphans_.swap(keep);
  }
  void all_ended() { orphans_.clear(); }
  size_t orphans() const { return orphans_.size(); }

 private:
  std::mutex mu_;
  thc_comm_t c_ = nullptr;
  int users_ = 0;
  uint64_t seq_ = 0;
  std::vector<std::pair<uint64_t, Hold>> orphans_;
};

// A started nonblocking call. Completing it (test() saying done, wait(), waitall) releases its
// buffers; a failure is raised there, and again by every later wait()/test() (it is not lost).
class Request {
 public:
  Request(nb::object comm, uint64_t seq, thc_request_t r, Hold&& h, nb::object result)
      : comm_(std::move(comm)), seq_(seq), r_(r), hold_(std::move(h)), result_(std::move(result)) {}
  ~Request() {
    if (r_ != THC_REQUEST_NULL) {
      thc_request_free(&r_);
      nb::cast<Comm&>(comm_).orphan(seq_, std::move(hold_));
    }
  }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  bool test() {
    {
      std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
      if (!lk.owns_lock()) return false;  // another thread is waiting on it: not done yet
      if (r_ != THC_REQUEST_NULL) {
        int done = 0;
        const thc_status_t st = thc_test(&r_, &done);
        if (!done && st == THC_SUCCESS) return false;
        record(st);
      }
    }
    finish();
    return true;
  }

  nb::object wait() {
    {
      nb::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lk(mu_);
      if (r_ != THC_REQUEST_NULL) record(thc_wait(&r_));
    }
    finish();
    return result_;
  }

  bool done() {
    std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
    return lk.owns_lock() && r_ == THC_REQUEST_NULL;
  }

  // thc_waitall over several requests (each distinct one locked, in address order).
  static nb::list waitall(const std::vector<Request*>& reqs) {
    std::vector<Request*> uniq(reqs.begin(), reqs.end());
    std::sort(uniq.begin(), uniq.end());
    uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
    {
      nb::gil_scoped_release nogil;
      std::vector<std::unique_lock<std::mutex>> locks;
      for (Request* q : uniq) locks.emplace_back(q->mu_);
      std::vector<Request*> pending;
      std::vector<thc_request_t> handles;
      for (Request* q : uniq)
        if (q->r_ != THC_REQUEST_NULL) {
          pending.push_back(q);
          handles.push_back(q->r_);
        }
      std::vector<thc_status_t> st(handles.size(), THC_SUCCESS);
      thc_waitall(handles.size(), handles.data(), st.data());
      // thc_last_error() describes the first failure only; the others get their status's text.
      bool first = true;
      for (size_t i = 0; i < pending.size(); ++i) {
        pending[i]->r_ = THC_REQUEST_NULL;
        if (st[i] != THC_SUCCESS) {
          pending[i]->status_ = st[i];
          pending[i]->message_ = first ? thc_last_error() : thc_status_string(st[i]);
          first = false;
        }
      }
    }
    nb::list out;
    StatusError* failure = nullptr;
    for (Request* q : reqs) {
      q->finish_quietly();
      if (q->status_ != THC_SUCCESS && !failure) failure = new StatusError{q->status_, q->message_};
      out.append(q->result_);
    }
    if (failure) {
      StatusError e = *failure;
      delete failure;
      throw e;
    }
    return out;
  }

 private:
  void record(thc_status_t st) {
    status_ = st;
    if (st != THC_SUCCESS) message_ = thc_last_error();
  }
  // With the GIL: let go of the buffers once, then raise a failure.
  void finish() {
    finish_quietly();
    if (status_ != THC_SUCCESS) raise(status_, message_);
  }
  void finish_quietly() {
    if (finished_) return;
    finished_ = true;
    hold_ = Hold{};
    if (status_ == THC_SUCCESS) nb::cast<Comm&>(comm_).ended_before(seq_);
  }

  std::mutex mu_;
  nb::object comm_;
  uint64_t seq_;
  thc_request_t r_;
  Hold hold_;
  nb::object result_;
  bool finished_ = false;
  thc_status_t status_ = THC_SUCCESS;
  std::string message_;
};

Comm* create_inproc(InprocGroup& g, int rank, const Knobs& knobs) {
  const thc_config_t cfg = make_config(knobs);
  thc_comm_t c = nullptr;
  thc_status_t st;
  {
    nb::gil_scoped_release nogil;  // collective over the group's threads
    st = thc_comm_create_inproc(g.g, rank, &cfg, &c);
  }
  check(st);
  return new Comm(c);
}

Comm* create_aggregator(const std::string& urls, int rank, int size, uint32_t job, std::optional<std::string> key,
                        const Knobs& knobs) {
  const thc_config_t cfg = make_config(knobs);
  thc_comm_t c = nullptr;
  thc_status_t st;
  {
    nb::gil_scoped_release nogil;
    st = thc_comm_create_aggregator(urls.c_str(), rank, size, job, key ? key->c_str() : nullptr, &cfg, &c);
  }
  check(st);
  return new Comm(c);
}

Comm* create_ucx(const std::string& rendezvous, int rank, int size, const Knobs& knobs) {
  const thc_config_t cfg = make_config(knobs);
  thc_comm_t c = nullptr;
  thc_status_t st;
  {
    nb::gil_scoped_release nogil;  // collective over the group's processes (or threads)
    st = thc_comm_create_ucx(rendezvous.c_str(), rank, size, &cfg, &c);
  }
  check(st);
  return new Comm(c);
}

#if THC_HAVE_MPI
std::string mpi_library_version() {
  int init = 0;
  MPI_Initialized(&init);
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  // Allowed before MPI_Init.
  MPI_Get_library_version(buf, &len);
  return std::string(buf, static_cast<size_t>(len));
}

// `address`: where the MPI_Comm handle lives (mpi4py's MPI._addressof(comm)), so it works for
// pointer handles (Open MPI) and integer handles (MPICH) alike.
Comm* create_mpi(uintptr_t address, const Knobs& knobs) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) raise(THC_ERR_INVALID_ARG, "from_mpi4py: MPI is not initialized (or already finalized)");
  MPI_Comm mc;
  std::memcpy(&mc, reinterpret_cast<const void*>(address), sizeof mc);
  const thc_config_t cfg = make_config(knobs);
  thc_comm_t c = nullptr;
  thc_status_t st;
  {
    nb::gil_scoped_release nogil;
    st = thc_comm_create_mpi(mc, &cfg, &c);
  }
  check(st);
  return new Comm(c);
}
#endif

nb::dict stats_dict(const thc_stats_t& s) {
  nb::dict d;
  d["calls"] = s.calls;
  d["elements"] = s.elements;
  d["wire_bytes_up"] = s.wire_bytes_up;
  d["wire_bytes_down"] = s.wire_bytes_down;
  d["float_bytes"] = s.float_bytes;
  d["last_algo"] = s.last_algo;
  d["measured_wire"] = s.measured_wire != 0;
  d["packets"] = s.packets;
  d["retransmissions"] = s.retransmissions;
  d["hier_hosts"] = s.hier_hosts;
  d["groups"] = s.groups;
  d["grouped_tensors"] = s.grouped_tensors;
  return d;
}

// src and dst of one call, checked against each other. out None: in place (x is written).
struct Operands {
  Array src, dst;
  bool in_place = false;
};

Operands operands(nb::handle x, nb::handle out, bool bf16_bits, Hold* hold) {
  Operands o;
  if (out.is_none()) {
    hold->rw.push_back(import_rw(x, "x"));
    o.dst = describe(hold->rw.back(), "x", bf16_bits);
    o.src = o.dst;
    o.in_place = true;
    return o;
  }
  hold->ro.push_back(import_ro(x, "x"));
  o.src = describe(hold->ro.back(), "x", bf16_bits);
  hold->rw.push_back(import_rw(out, "out"));
  o.dst = describe(hold->rw.back(), "out", bf16_bits);
  if (o.src.dtype != o.dst.dtype) raise(THC_ERR_INVALID_ARG, "out must have the dtype of x", "dtype");
  if (on_device(o.src) != on_device(o.dst) || (on_device(o.src) && o.src.device_id != o.dst.device_id))
    raise(THC_ERR_INVALID_ARG, "x and out must be on the same device", "array");
  // Identical buffers are an in-place call; a partial overlap would read what the call wrote.
  const auto* s0 = static_cast<const char*>(o.src.data);
  const auto* d0 = static_cast<const char*>(o.dst.data);
  if (s0 == d0) {
    o.in_place = true;
  } else if (s0 < d0 + o.dst.bytes && d0 < s0 + o.src.bytes) {
    raise(THC_ERR_INVALID_ARG, "x and out overlap without being the same array", "array");
  }
  return o;
}

void same_count(const Operands& o) {
  if (o.src.count != o.dst.count)
    raise(THC_ERR_INVALID_ARG,
          "out has " + std::to_string(o.dst.count) + " elements, x has " + std::to_string(o.src.count), "array");
}

thc_state_t state_of(nb::handle st) { return st.is_none() ? nullptr : nb::cast<State&>(st).s; }

// A blocking call: GIL released; calls started before it have ended once it returns.
template <typename F>
void blocking(Comm& comm, F&& fn) {
  thc_status_t st;
  {
    Comm::Use use(comm);
    nb::gil_scoped_release nogil;
    st = fn(use.get());
  }
  check(st);
  comm.all_ended();
}

// A nonblocking start: the request keeps `hold` (buffers, states) and hands back `result`.
template <typename F>
Request* start(nb::handle comm_obj, Hold&& hold, nb::object result, F&& fn) {
  Comm& comm = nb::cast<Comm&>(comm_obj);
  thc_request_t r = THC_REQUEST_NULL;
  thc_status_t st;
  {
    Comm::Use use(comm);
    nb::gil_scoped_release nogil;
    st = fn(use.get(), &r);
  }
  check(st);
  return new Request(nb::borrow(comm_obj), comm.next_seq(), r, std::move(hold), std::move(result));
}

nb::object result_of(nb::handle x, nb::handle out) { return nb::borrow(out.is_none() ? x : out); }

void allreduce(nb::handle comm, nb::handle x, nb::handle out, int scheme, int op, nb::handle state, bool bf16_bits) {
  Hold h;
  const Operands o = operands(x, out, bf16_bits, &h);
  same_count(o);
  thc_state_t ef = state_of(state);
  blocking(nb::cast<Comm&>(comm), [&](thc_comm_t c) {
    return thc_allreduce_scheme(static_cast<thc_scheme_t>(scheme), o.src.data, o.dst.data, o.src.count, o.src.dtype,
                                static_cast<thc_op_t>(op), c, ef);
  });
}

Request* iallreduce(nb::handle comm, nb::handle x, nb::handle out, int scheme, int op, nb::handle state,
                    bool bf16_bits) {
  Hold h;
  const Operands o = operands(x, out, bf16_bits, &h);
  same_count(o);
  thc_state_t ef = state_of(state);
  if (!state.is_none()) h.keep.push_back(nb::borrow(state));
  return start(comm, std::move(h), result_of(x, out), [&](thc_comm_t c, thc_request_t* r) {
    return thc_iallreduce_scheme(static_cast<thc_scheme_t>(scheme), o.src.data, o.dst.data, o.src.count, o.src.dtype,
                                 static_cast<thc_op_t>(op), c, ef, r);
  });
}

// ---- groups: several tensors, one stream

struct Group {
  std::vector<thc_tensor_t> tensors;
};

using OptList = std::optional<nb::list>;

Group group_operands(const nb::list& xs, const OptList& outs, const OptList& states, const std::vector<bool>& bf16,
                     Hold* hold) {
  const size_t n = nb::len(xs);
  if (outs && nb::len(*outs) != n) raise(THC_ERR_INVALID_ARG, "outs must have one array per tensor", "array");
  if (states && nb::len(*states) != n) raise(THC_ERR_INVALID_ARG, "states must have one State (or None) per tensor");
  if (bf16.size() != n) raise(THC_ERR_INTERNAL, "bf16_bits must have one flag per tensor");
  Group g;
  for (size_t i = 0; i < n; ++i) {
    const nb::object out = outs ? nb::object((*outs)[i]) : nb::none();
    const Operands o = operands(xs[i], out, bf16[i], hold);
    same_count(o);
    thc_tensor_t t{};
    t.sendbuf = o.in_place ? THC_IN_PLACE : o.src.data;
    t.recvbuf = o.dst.data;
    t.count = o.src.count;
    t.dtype = o.src.dtype;
    if (states) {
      const nb::object st = (*states)[i];
      t.state = state_of(st);
      if (!st.is_none()) hold->keep.push_back(st);
    }
    g.tensors.push_back(t);
  }
  return g;
}

void allreduce_group(nb::handle comm, const nb::list& xs, const OptList& outs, int scheme, int op,
                     const OptList& states, const std::vector<bool>& bf16) {
  Hold h;
  const Group g = group_operands(xs, outs, states, bf16, &h);
  blocking(nb::cast<Comm&>(comm), [&](thc_comm_t c) {
    return thc_allreduce_group(static_cast<thc_scheme_t>(scheme), g.tensors.data(), g.tensors.size(),
                               static_cast<thc_op_t>(op), c);
  });
}

Request* iallreduce_group(nb::handle comm, const nb::list& xs, const OptList& outs, int scheme, int op,
                          const OptList& states, const std::vector<bool>& bf16) {
  Hold h;
  const Group g = group_operands(xs, outs, states, bf16, &h);
  nb::object result = outs ? nb::object(*outs) : nb::object(xs);
  return start(comm, std::move(h), std::move(result), [&](thc_comm_t c, thc_request_t* r) {
    return thc_iallreduce_group(static_cast<thc_scheme_t>(scheme), g.tensors.data(), g.tensors.size(),
                                static_cast<thc_op_t>(op), c, r);
  });
}

// ---- reduce-scatter and allgather: shards of `counts`, one per rank

struct Shards {
  Operands o;
  std::vector<size_t> counts;
};

Shards shard_operands(nb::handle comm, nb::handle x, nb::handle out, const std::vector<size_t>& counts, bool scatter,
                      bool bf16_bits, Hold* hold) {
  Comm& c = nb::cast<Comm&>(comm);
  int rank = 0, size = 0;
  {
    Comm::Use use(c);
    check(thc_comm_rank(use.get(), &rank));
    check(thc_comm_size(use.get(), &size));
  }
  if (counts.size() != static_cast<size_t>(size))
    raise(THC_ERR_INVALID_ARG,
          "counts must have one entry per rank (" + std::to_string(size) + "), has " + std::to_string(counts.size()));
  if (out.is_none()) raise(THC_ERR_INVALID_ARG, "out is required here", "array");
  Shards s{operands(x, out, bf16_bits, hold), counts};
  if (s.o.in_place) raise(THC_ERR_INVALID_ARG, "x and out must be different arrays", "array");
  size_t total = 0;
  for (size_t n : counts) total += n;
  const size_t mine = counts[static_cast<size_t>(rank)];
  // The buffers must hold what counts says: libthc only sees pointers.
  const size_t want_src = scatter ? total : mine, want_dst = scatter ? mine : total;
  if (s.o.src.count != want_src)
    raise(THC_ERR_INVALID_ARG,
          "x has " + std::to_string(s.o.src.count) + " elements, counts say " + std::to_string(want_src), "array");
  if (s.o.dst.count != want_dst)
    raise(THC_ERR_INVALID_ARG,
          "out has " + std::to_string(s.o.dst.count) + " elements, counts say " + std::to_string(want_dst), "array");
  return s;
}

void reduce_scatter(nb::handle comm, nb::handle x, nb::handle out, const std::vector<size_t>& counts, int scheme,
                    int op, nb::handle state, bool bf16_bits) {
  Hold h;
  const Shards s = shard_operands(comm, x, out, counts, true, bf16_bits, &h);
  thc_state_t ef = state_of(state);
  blocking(nb::cast<Comm&>(comm), [&](thc_comm_t c) {
    return thc_reduce_scatter(static_cast<thc_scheme_t>(scheme), s.o.src.data, s.o.dst.data, s.counts.data(),
                              s.o.src.dtype, static_cast<thc_op_t>(op), c, ef);
  });
}

Request* ireduce_scatter(nb::handle comm, nb::handle x, nb::handle out, const std::vector<size_t>& counts, int scheme,
                         int op, nb::handle state, bool bf16_bits) {
  Hold h;
  const Shards s = shard_operands(comm, x, out, counts, true, bf16_bits, &h);
  thc_state_t ef = state_of(state);
  if (!state.is_none()) h.keep.push_back(nb::borrow(state));
  // libthc reads recvcounts when the call starts; the vector lives in the lambda's frame until then.
  return start(comm, std::move(h), nb::borrow(out), [&](thc_comm_t c, thc_request_t* r) {
    return thc_ireduce_scatter(static_cast<thc_scheme_t>(scheme), s.o.src.data, s.o.dst.data, s.counts.data(),
                               s.o.src.dtype, static_cast<thc_op_t>(op), c, ef, r);
  });
}

void allgather(nb::handle comm, nb::handle x, nb::handle out, const std::vector<size_t>& counts, int scheme,
               nb::handle state, bool bf16_bits) {
  Hold h;
  const Shards s = shard_operands(comm, x, out, counts, false, bf16_bits, &h);
  thc_state_t ef = state_of(state);
  blocking(nb::cast<Comm&>(comm), [&](thc_comm_t c) {
    return thc_allgather(static_cast<thc_scheme_t>(scheme), s.o.src.data, s.o.dst.data, s.counts.data(),
                         s.o.src.dtype, c, ef);
  });
}

Request* iallgather(nb::handle comm, nb::handle x, nb::handle out, const std::vector<size_t>& counts, int scheme,
                    nb::handle state, bool bf16_bits) {
  Hold h;
  const Shards s = shard_operands(comm, x, out, counts, false, bf16_bits, &h);
  thc_state_t ef = state_of(state);
  if (!state.is_none()) h.keep.push_back(nb::borrow(state));
  return start(comm, std::move(h), nb::borrow(out), [&](thc_comm_t c, thc_request_t* r) {
    return thc_iallgather(static_cast<thc_scheme_t>(scheme), s.o.src.data, s.o.dst.data, s.counts.data(),
                          s.o.src.dtype, c, ef, r);
  });
}

// Elements of an array (for default shard counts), without touching its memory.
size_t element_count(nb::handle x, bool bf16_bits) {
  RoArray a = import_ro(x, "x");
  return describe(a, "x", bf16_bits).count;
}

}  // namespace

NB_MODULE(_thc, m) {
  m.doc() = "libthc's C API; use the thc package, not this module";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      nb::object exc = nb::module_::import_("thc.errors")
                           .attr("_from_status")(static_cast<int>(e.status), e.message,
                                                 e.kind ? nb::cast(e.kind) : nb::none());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });

  m.def("version", [] { return std::string(thc_version()); });
  m.def("status_string", [](int s) { return std::string(thc_status_string(static_cast<thc_status_t>(s))); });
  m.attr("HAVE_MPI") = static_cast<bool>(THC_HAVE_MPI);
  m.attr("HAVE_CUDA") = static_cast<bool>(THC_HAVE_CUDA);
  m.attr("HAVE_UCX") = static_cast<bool>(THC_HAVE_UCX);
  m.def("knob_names", [] {
    std::vector<std::string> v;
    for (int i = 0; const char* n = thc_knob_name(i); ++i) v.emplace_back(n);
    return v;
  });
  m.def("config", [](const Knobs& knobs) {
    const thc_config_t cfg = make_config(knobs);
    nb::dict d;
    char buf[1024];
    for (int i = 0; const char* n = thc_knob_name(i); ++i) {
      check(thc_config_get(&cfg, n, buf, sizeof buf));
      d[n] = std::string(buf);
    }
    return d;
  }, nb::arg("knobs"), "Defaults, then THC_* environment variables, then `knobs` ((name, value) pairs).");

  nb::class_<State>(m, "State",
                   "Error-feedback residual of one tensor (thc_state_t): pass the same State to every call on "
                   "that tensor. Bound to the size (and host or device memory) of its first call; reset() unbinds.")
      .def(nb::init<>())
      .def("reset", &State::reset);

  nb::class_<InprocGroup>(m, "InprocGroup",
                          "In-process workers: InprocGroup(size), then Comm.inproc(group, rank) on each of size "
                          "threads. Its waits are bounded by THC_TIMEOUT_MS of the environment at its creation.")
      .def(nb::init<int>(), nb::arg("size"))
      .def_ro("size", &InprocGroup::size);

  nb::class_<Comm>(m, "Comm")
      .def_static("inproc", &create_inproc, nb::arg("group"), nb::arg("rank"), nb::arg("knobs"),
                  nb::rv_policy::take_ownership)
      .def_static("aggregator", &create_aggregator, nb::arg("urls"), nb::arg("rank"), nb::arg("size"),
                  nb::arg("job"), nb::arg("key").none(), nb::arg("knobs"), nb::rv_policy::take_ownership)
      .def_static("ucx", &create_ucx, nb::arg("rendezvous"), nb::arg("rank"), nb::arg("size"), nb::arg("knobs"),
                  nb::rv_policy::take_ownership)
#if THC_HAVE_MPI
      .def_static("mpi", &create_mpi, nb::arg("address"), nb::arg("knobs"), nb::rv_policy::take_ownership)
#endif
      .def_prop_ro("rank", [](Comm& c) {
        Comm::Use u(c);
        int r = 0;
        check(thc_comm_rank(u.get(), &r));
        return r;
      })
      .def_prop_ro("size", [](Comm& c) {
        Comm::Use u(c);
        int s = 0;
        check(thc_comm_size(u.get(), &s));
        return s;
      })
      .def_prop_ro("closed", &Comm::closed)
      .def("stats", [](Comm& c) {
        Comm::Use u(c);
        thc_stats_t s;
        check(thc_comm_stats(u.get(), &s));
        return stats_dict(s);
      })
      .def("close", &Comm::close)
      .def_prop_ro("orphans", &Comm::orphans);

  nb::class_<Request>(m, "Request",
                      "A started nonblocking call (iallreduce, iallreduce_group, ireduce_scatter, iallgather).\n\n"
                      "wait() blocks until it completes and returns the result (raising its failure); test() says "
                      "whether it has (raising its failure once it has). Until then the call owns its arrays and "
                      "state: do not write x or read out. A Request dropped unfinished lets the call run on; its "
                      "arrays stay referenced until a later call on the communicator ends or it is closed.")
      .def("test", &Request::test)
      .def("wait", &Request::wait)
      .def_prop_ro("done", &Request::done);
  m.def("waitall", &Request::waitall, nb::arg("requests"));

  m.def("allreduce", &allreduce, nb::arg("comm"), nb::arg("x"), nb::arg("out").none(), nb::arg("scheme"),
        nb::arg("op"), nb::arg("state").none(), nb::arg("bf16_bits"));
  m.def("iallreduce", &iallreduce, nb::arg("comm"), nb::arg("x"), nb::arg("out").none(), nb::arg("scheme"),
        nb::arg("op"), nb::arg("state").none(), nb::arg("bf16_bits"), nb::rv_policy::take_ownership);
  m.def("allreduce_group", &allreduce_group, nb::arg("comm"), nb::arg("xs"), nb::arg("outs").none(),
        nb::arg("scheme"), nb::arg("op"), nb::arg("states").none(), nb::arg("bf16_bits"));
  m.def("iallreduce_group", &iallreduce_group, nb::arg("comm"), nb::arg("xs"), nb::arg("outs").none(),
        nb::arg("scheme"), nb::arg("op"), nb::arg("states").none(), nb::arg("bf16_bits"),
        nb::rv_policy::take_ownership);
  m.def("reduce_scatter", &reduce_scatter, nb::arg("comm"), nb::arg("x"), nb::arg("out").none(), nb::arg("counts"),
        nb::arg("scheme"), nb::arg("op"), nb::arg("state").none(), nb::arg("bf16_bits"));
  m.def("ireduce_scatter", &ireduce_scatter, nb::arg("comm"), nb::arg("x"), nb::arg("out").none(),
        nb::arg("counts"), nb::arg("scheme"), nb::arg("op"), nb::arg("state").none(), nb::arg("bf16_bits"),
        nb::rv_policy::take_ownership);
  m.def("allgather", &allgather, nb::arg("comm"), nb::arg("x"), nb::arg("out").none(), nb::arg("counts"),
        nb::arg("scheme"), nb::arg("state").none(), nb::arg("bf16_bits"));
  m.def("iallgather", &iallgather, nb::arg("comm"), nb::arg("x"), nb::arg("out").none(), nb::arg("counts"),
        nb::arg("scheme"), nb::arg("state").none(), nb::arg("bf16_bits"), nb::rv_policy::take_ownership);
  m.def("element_count", &element_count, nb::arg("x"), nb::arg("bf16_bits"));

#if THC_HAVE_MPI
  m.def("mpi_library_version", &mpi_library_version);
#endif
}
