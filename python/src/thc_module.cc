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
  // carry any stride, as DLPack producers disagree on them).
  size_t count = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    const size_t n = a.shape(i);
    if (n != 1 && a.stride(i) != static_cast<int64_t>(count))
      raise(THC_ERR_INVALID_ARG,
            std::string(name) + ": needs a C-contiguous array (e.g. numpy.ascontiguousarray, tensor.contiguous())",
            "array");
    count *= n;
  }
  r.count = count;
  r.bytes = count * (d.bits / 8);
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

class Comm {
 public:
  explicit Comm(thc_comm_t c) : c_(c) {}
  ~Comm() {
    if (c_) thc_comm_destroy(c_);
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

  void close() {
    std::lock_guard<std::mutex> lk(mu_);
    if (users_ > 0) raise(THC_ERR_INVALID_ARG, "close(): a call on this communicator is still running");
    if (c_) thc_comm_destroy(c_);
    c_ = nullptr;
  }
  bool closed() {
    std::lock_guard<std::mutex> lk(mu_);
    return c_ == nullptr;
  }

 private:
  std::mutex mu_;
  thc_comm_t c_ = nullptr;
  int users_ = 0;
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
  return d;
}

// src and dst of one call, checked against each other. dst is None: in place (src is written).
struct Operands {
  std::optional<RoArray> src_hold;
  RwArray dst_hold;
  Array src, dst;
};

Operands operands(nb::handle x, nb::handle out, bool bf16_bits) {
  Operands o;
  if (out.is_none()) {
    o.dst_hold = import_rw(x, "x");
    o.dst = describe(o.dst_hold, "x", bf16_bits);
    o.src = o.dst;
    return o;
  }
  o.src_hold = import_ro(x, "x");
  o.src = describe(*o.src_hold, "x", bf16_bits);
  o.dst_hold = import_rw(out, "out");
  o.dst = describe(o.dst_hold, "out", bf16_bits);
  if (o.src.dtype != o.dst.dtype)
    raise(THC_ERR_INVALID_ARG, "out must have the dtype of x", "dtype");
  if (on_device(o.src) != on_device(o.dst) || (on_device(o.src) && o.src.device_id != o.dst.device_id))
    raise(THC_ERR_INVALID_ARG, "x and out must be on the same device", "array");
  // Identical buffers are an in-place call; a partial overlap would read what the call wrote.
  const auto* s0 = static_cast<const char*>(o.src.data);
  const auto* d0 = static_cast<const char*>(o.dst.data);
  if (s0 != d0 && s0 < d0 + o.dst.bytes && d0 < s0 + o.src.bytes)
    raise(THC_ERR_INVALID_ARG, "x and out overlap without being the same array", "array");
  return o;
}

void allreduce(Comm& comm, nb::handle x, nb::handle out, int scheme, int op, State* state, bool bf16_bits) {
  Operands o = operands(x, out, bf16_bits);
  if (o.src.count != o.dst.count)
    raise(THC_ERR_INVALID_ARG,
          "out has " + std::to_string(o.dst.count) + " elements, x has " + std::to_string(o.src.count), "array");
  Comm::Use use(comm);
  thc_status_t st;
  {
    nb::gil_scoped_release nogil;
    st = thc_allreduce_scheme(static_cast<thc_scheme_t>(scheme), o.src.data, o.dst.data, o.src.count, o.src.dtype,
                              static_cast<thc_op_t>(op), use.get(), state ? state->s : nullptr);
  }
  check(st);
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

  nb::class_<State>(m, "State")
      .def(nb::init<>())
      .def("reset", &State::reset);

  nb::class_<InprocGroup>(m, "InprocGroup")
      .def(nb::init<int>(), nb::arg("size"))
      .def_ro("size", &InprocGroup::size);

  nb::class_<Comm>(m, "Comm")
      .def_static("inproc", &create_inproc, nb::arg("group"), nb::arg("rank"), nb::arg("knobs"),
                  nb::rv_policy::take_ownership)
      .def_static("aggregator", &create_aggregator, nb::arg("urls"), nb::arg("rank"), nb::arg("size"),
                  nb::arg("job"), nb::arg("key").none(), nb::arg("knobs"), nb::rv_policy::take_ownership)
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
      .def("allreduce", &allreduce, nb::arg("x"), nb::arg("out").none(), nb::arg("scheme"), nb::arg("op"),
           nb::arg("state").none(), nb::arg("bf16_bits"));

#if THC_HAVE_MPI
  m.def("mpi_library_version", &mpi_library_version);
#endif
}
