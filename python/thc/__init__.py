"""thc: compressed homomorphic allreduce (THC, Cnat) for Python.

Communicators::

    comm = thc.Comm.from_mpi4py(MPI.COMM_WORLD)               # an mpi4py communicator
    comm = thc.Comm.aggregator("udp://agg:9471", rank, size, job=7, key="1:ABCD...")
    group = thc.InprocGroup(4); comm = thc.Comm.inproc(group, rank)   # one per thread

Calls take any array with ``__dlpack__`` or the buffer protocol (NumPy arrays, PyTorch tensors,
other DLPack producers), C-contiguous, of float32, float16, bfloat16 (NumPy's through
``ml_dtypes.bfloat16``) or float64::

    comm.allreduce(grad, op="avg", state=ef)      # in place, like torch.distributed.all_reduce
    mean = comm.allreduce(grad, np.empty_like(grad), op="avg")

Semantics are libthc's (include/thc/thc.h): every rank calls the same collectives in the same
order with the same size, dtype, op and scheme; the result is identical on every rank; a failure
raises a :class:`thc.Error` subclass carrying the status, on every rank alike where libthc says so.
Knobs (README "Configuration") are keyword arguments of the constructors: ``bits=2`` is
``THC_BITS=2``; what is not given comes from the environment, then the defaults.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _thc
from .errors import (ArrayError, ConfigMismatchError, DtypeError, Error, InternalError, InvalidArgumentError,
                     LeftBehindError, NoMemoryError, NonFiniteError, OverflowError, Status, TimeoutError,
                     TransportError, UnsupportedError)

__version__ = "0.1.0"

__all__ = [
    "Comm", "InprocGroup", "State", "Request", "waitall", "Stats", "stats", "config", "library_version", "SCHEMES",
    "OPS",
    "Status", "Error", "InvalidArgumentError", "ArrayError", "DtypeError", "NonFiniteError", "ConfigMismatchError",
    "OverflowError", "TransportError", "TimeoutError", "UnsupportedError", "NoMemoryError", "InternalError",
    "LeftBehindError",
]

#: Error-feedback residual of one tensor (``thc_state_t``): pass the same State to every call on
#: that tensor. Bound to the size (and host or device memory) of its first call; ``reset()`` unbinds.
State = _thc.State
#: In-process workers: ``InprocGroup(size)``, then ``Comm.inproc(group, rank)`` on each of ``size`` threads.
InprocGroup = _thc.InprocGroup

#: Schemes by name (``thc_scheme_t``): THC (non-uniform table), uniform THC, Cnat, natural dithering.
SCHEMES = {"thc": 0, "uhc": 1, "cnat": 2, "dnat": 3}
#: Ops by name (``thc_op_t``): the estimated sum or mean over the ranks.
OPS = {"sum": 0, "avg": 1}

Knobs = Dict[str, Union[int, float, str, bool]]


def library_version() -> str:
    """libthc's version (equal to ``thc.__version__`` in a consistent install)."""
    return _thc.version()


def _knob_pairs(knobs: Knobs) -> List[Tuple[str, str]]:
    pairs = []
    for name, value in knobs.items():
        env = name if name.startswith("THC_") else "THC_" + name.upper()
        if isinstance(value, bool):
            value = int(value)
        pairs.append((env, str(value)))
    return pairs


def config(**knobs: Any) -> Dict[str, str]:
    """Every knob's value, spelled as its environment variable takes it, after the defaults, the
    THC_* environment and ``knobs`` (``config(bits=2)["THC_BITS"] == "2"``)."""
    return _thc.config(_knob_pairs(knobs))


def _lookup(table: Dict[str, int], value: Union[str, int], what: str) -> int:
    if isinstance(value, str):
        try:
            return table[value.lower()]
        except KeyError:
            raise InvalidArgumentError(f"unknown {what} {value!r} (one of {', '.join(table)})") from None
    if value in table.values():
        return int(value)
    raise InvalidArgumentError(f"unknown {what} {value!r} (one of {', '.join(table)})")


def _is_numpy_bf16(a: Any) -> bool:
    return isinstance(a, np.ndarray) and a.dtype.name == "bfloat16"


def _bf16_views(x: Any, out: Any) -> Tuple[Any, Any, bool]:
    """NumPy bfloat16 (ml_dtypes) exports neither DLPack nor a buffer format: pass uint16 views
    of the same memory, and say that they hold bfloat16."""
    for name, a in (("x", x), ("out", out)):
        # NumPy exports non-native byte order through neither protocol; say why.
        if isinstance(a, np.ndarray) and not a.dtype.isnative:
            raise DtypeError(f"{name}: {a.dtype.str} is not in the machine's byte order (use a.astype(a.dtype.newbyteorder('='))",
                             Status.INVALID_ARG)
    bx, bo = _is_numpy_bf16(x), out is not None and _is_numpy_bf16(out)
    if not bx and not bo:
        return x, out, False
    if out is not None and bx != bo:
        raise DtypeError("x and out must both be NumPy bfloat16 arrays, or neither", Status.INVALID_ARG)
    return x.view(np.uint16), (out.view(np.uint16) if out is not None else None), True


@dataclasses.dataclass(frozen=True)
class Stats:
    """Counters of a communicator since its creation (``thc_stats_t``), or their sums over every
    communicator of the process (:func:`thc.stats`; then ``last_algo`` and ``hier_hosts`` are None).

    ``wire_bytes_up``: bytes of this rank's codes upstream (aggregator communicators: the datagrams
    sent, headers included, ``measured_wire``); ``float_bytes``: what the same calls would send as
    float32; ``compression``: their ratio. ``groups``/``grouped_tensors``: calls that ran several
    tensors as one stream (allreduce_group, fused nonblocking allreduces) and their tensors.
    """

    calls: int = 0
    elements: int = 0
    wire_bytes_up: int = 0
    wire_bytes_down: int = 0
    float_bytes: int = 0
    packets: int = 0
    retransmissions: int = 0
    groups: int = 0
    grouped_tensors: int = 0
    measured_wire: bool = False
    last_algo: Optional[int] = None
    hier_hosts: Optional[int] = None

    @property
    def compression(self) -> float:
        """float32 bytes per byte on the wire upstream (0.0 before any call)."""
        return self.float_bytes / self.wire_bytes_up if self.wire_bytes_up else 0.0

    _SUMMED = ("calls", "elements", "wire_bytes_up", "wire_bytes_down", "float_bytes", "packets", "retransmissions",
               "groups", "grouped_tensors")

    def _plus(self, other: "Stats") -> "Stats":
        return Stats(**{f: getattr(self, f) + getattr(other, f) for f in self._SUMMED},
                     measured_wire=self.measured_wire or other.measured_wire)


_totals_lock = threading.Lock()
_closed_totals = Stats()
_live: "weakref.WeakSet[Comm]" = weakref.WeakSet()


def _retire(c: Any) -> None:
    """Close a communicator and keep its counters in the process totals."""
    global _closed_totals
    if c.closed:
        return
    s = Stats(**c.stats())
    c.close()
    with _totals_lock:
        _closed_totals = _closed_totals._plus(s)


def stats() -> Stats:
    """Counters summed over every communicator this process created (open or closed)."""
    with _totals_lock:
        total = _closed_totals
        live = list(_live)
    for comm in live:
        try:
            total = total._plus(comm.stats())
        except InvalidArgumentError:  # closed meanwhile: already in _closed_totals
            pass
    return dataclasses.replace(total, last_algo=None, hier_hosts=None)


class Request:
    """A started nonblocking call (``iallreduce``, ``iallreduce_group``, ``ireduce_scatter``,
    ``iallgather``), completed like MPI's requests.

    ``wait()`` blocks until the call completes and returns its result, or raises its failure (a
    :class:`thc.Error` with the status; every rank fails alike). ``test()`` never blocks: False
    while the call runs, True once it has completed (raising its failure then). A failure is
    raised again by every later ``wait()``/``test()``. Until completion the call owns its arrays
    and state. A Request dropped unfinished lets the call run on (``thc_request_free``); its
    arrays stay referenced until a later call on the communicator ends or it is closed.
    """

    __slots__ = ("_r", "_result")

    def __init__(self) -> None:
        raise TypeError("requests come from Comm.iallreduce and the other nonblocking calls")

    @classmethod
    def _wrap(cls, r: Any, result: Any) -> "Request":
        self = cls.__new__(cls)
        self._r = r
        self._result = result
        return self

    def test(self) -> bool:
        """Whether the call has completed (never blocks); raises its failure once it has."""
        return self._r.test()

    def wait(self) -> Any:
        """Block until the call completes; its result (out, or x in place; a list for groups)."""
        self._r.wait()
        return self._result

    @property
    def done(self) -> bool:
        """Whether the call has completed and been waited for or tested (no status is consumed)."""
        return self._r.done


def waitall(requests: Iterable[Request]) -> List[Any]:
    """Wait for every request (``thc_waitall``); their results in order. When calls failed, all
    still complete first, then the first failure (lowest index) is raised."""
    requests = list(requests)
    for q in requests:
        if not isinstance(q, Request):
            raise InvalidArgumentError(f"waitall: not a thc.Request: {type(q).__name__}", Status.INVALID_ARG)
    _thc.waitall([q._r for q in requests])
    return [q._result for q in requests]


class Comm:
    """A thc communicator: ``from_mpi4py``, ``aggregator`` or ``inproc``.

    Like an MPI communicator it takes one call at a time (a second thread's call on a busy one
    raises InvalidArgumentError) and every rank must make the same calls in the same order.
    ``close()`` (or ``with``) frees it; otherwise it is freed with the object.
    """

    __slots__ = ("_c", "_keep", "_finalizer", "__weakref__")

    def __init__(self) -> None:
        raise TypeError("use thc.Comm.from_mpi4py, thc.Comm.aggregator or thc.Comm.inproc")

    @classmethod
    def _wrap(cls, c: Any, keep: Any = None) -> "Comm":
        self = cls.__new__(cls)
        self._c = c
        self._keep = keep
        self._finalizer = weakref.finalize(self, _retire, c)
        _live.add(self)
        return self

    # ---- constructors (each collective over the ranks)

    @classmethod
    def from_mpi4py(cls, comm: Any, **knobs: Any) -> "Comm":
        """A thc communicator over an mpi4py intracommunicator (collective over it).

        thc duplicates ``comm``; the mpi4py communicator may be freed afterwards. mpi4py must use
        the MPI library libthc was built with (checked). Several ranks per host run hierarchically
        (THC_HIER, README "Several ranks per host").
        """
        from mpi4py import MPI

        if not isinstance(comm, MPI.Comm):
            raise ArrayError(f"from_mpi4py: expected an mpi4py communicator, got {type(comm).__name__}",
                             Status.INVALID_ARG)
        if not _thc.HAVE_MPI:
            raise UnsupportedError("from_mpi4py: this libthc was built without MPI", Status.UNSUPPORTED)
        if comm == MPI.COMM_NULL:
            raise InvalidArgumentError("from_mpi4py: MPI.COMM_NULL", Status.INVALID_ARG)
        if comm.Is_inter():
            raise InvalidArgumentError("from_mpi4py: intercommunicators are not supported", Status.INVALID_ARG)
        theirs, ours = MPI.Get_library_version(), _thc.mpi_library_version()
        if theirs.split("\n")[0].strip() != ours.split("\n")[0].strip():
            raise UnsupportedError(
                "from_mpi4py: mpi4py runs on another MPI library than libthc was built with "
                f"(mpi4py: {theirs.splitlines()[0]!r}; libthc: {ours.splitlines()[0]!r}); "
                "install mpi4py built against libthc's MPI (Debian: python3-mpi4py)", Status.UNSUPPORTED)
        return cls._wrap(_thc.Comm.mpi(MPI._addressof(comm), _knob_pairs(knobs)))

    @classmethod
    def aggregator(cls, urls: Union[str, Sequence[str]], rank: int, size: int, job: int,
                   key: Optional[str] = None, **knobs: Any) -> "Comm":
        """Workers of one job of thc-aggregator (or thc-aggregator-dpdk, or a switch).

        urls: "udp://HOST:PORT" or "dpdk://IPv4:PORT", or several (the job is sharded over all).
        job: the job's label, the same on every rank. key: the tenant key "ID:HEX" the aggregator
        holds (its --key-file), or None for THC_AGGREGATOR_KEY / THC_AGGREGATOR_KEY_FILE.
        Collective over the ``size`` ranks.
        """
        if not isinstance(urls, str):
            urls = ",".join(urls)
        return cls._wrap(_thc.Comm.aggregator(urls, rank, size, job, key, _knob_pairs(knobs)))

    @classmethod
    def ucx(cls, rendezvous: Optional[str] = None, rank: Optional[int] = None, size: Optional[int] = None,
            **knobs: Any) -> "Comm":
        """Rank ``rank`` of ``size`` processes that reach each other over UCX (no MPI, no aggregator).

        rendezvous: "HOST:PORT" where rank 0 listens while the group forms. Left out, they come
        from the environment a launcher such as torchrun sets: rank RANK, size WORLD_SIZE, and
        MASTER_ADDR with the port THC_UCX_PORT, else MASTER_PORT + 1 (MASTER_PORT itself is
        torch's store). Collective over the ``size`` ranks; each waits for the others up to
        ``timeout_ms`` (THC_TIMEOUT_MS). The rendezvous is not authenticated (like torch's
        TCPStore) and is closed once the group is up.
        """
        import os

        def env(name: str) -> str:
            v = os.environ.get(name)
            if v is None:
                raise InvalidArgumentError(f"Comm.ucx: {name} is not set (pass rendezvous, rank and size, or run "
                                           "under a launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)",
                                           Status.INVALID_ARG)
            return v

        try:
            if rank is None:
                rank = int(env("RANK"))
            if size is None:
                size = int(env("WORLD_SIZE"))
            if rendezvous is None:
                port = os.environ.get("THC_UCX_PORT") or str(int(env("MASTER_PORT")) + 1)
                rendezvous = f"{env('MASTER_ADDR')}:{port}"
        except ValueError as e:
            raise InvalidArgumentError(f"Comm.ucx: a launcher variable is not a number: {e}", Status.INVALID_ARG)
        return cls._wrap(_thc.Comm.ucx(rendezvous, rank, size, _knob_pairs(knobs)))

    @classmethod
    def inproc(cls, group: InprocGroup, rank: int, **knobs: Any) -> "Comm":
        """Rank ``rank`` of an in-process group; every rank on its own thread (collective)."""
        return cls._wrap(_thc.Comm.inproc(group, rank, _knob_pairs(knobs)), keep=group)

    # ---- properties

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    @property
    def closed(self) -> bool:
        return self._c.closed

    def stats(self) -> Stats:
        """This communicator's counters since its creation."""
        return Stats(**self._c.stats())

    def close(self) -> None:
        """Free the communicator (its counters stay in :func:`thc.stats`). Idempotent."""
        self._finalizer()

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<thc.Comm closed>"
        return f"<thc.Comm rank {self.rank} of {self.size}>"

    # ---- collectives
    #
    # Arrays: anything with __dlpack__ or the buffer protocol, C-contiguous, float32, float16,
    # bfloat16 or float64. op: "sum" or "avg"; scheme: "thc" (default), "uhc", "cnat" or "dnat";
    # state: a thc.State (error feedback), the same one for every call on the same tensor.

    def allreduce(self, x: Any, out: Any = None, *, op: Union[str, int] = "sum", scheme: Union[str, int] = "thc",
                  state: Optional[State] = None) -> Any:
        """Compressed allreduce of ``x``; returns the array holding the result.

        out=None: in place (``x`` must be writable), as torch.distributed.all_reduce; otherwise
        ``out`` (same dtype, size and device as ``x``) receives it and ``x`` is only read. Host
        and CUDA arrays (CUDA: libthc_cuda's codec; writes to x on other streams must be
        complete before the call).
        """
        xv, ov, bf16 = _bf16_views(x, out)
        _thc.allreduce(self._c, xv, ov, _lookup(SCHEMES, scheme, "scheme"), _lookup(OPS, op, "op"), state, bf16)
        return x if out is None else out

    def iallreduce(self, x: Any, out: Any = None, *, op: Union[str, int] = "sum", scheme: Union[str, int] = "thc",
                   state: Optional[State] = None) -> "Request":
        """Nonblocking :meth:`allreduce`: returns a :class:`thc.Request` at once; ``wait()`` returns
        the result. The call runs on the communicator's progress thread; until it completes it
        owns x, out and state. Every rank starts the same calls in the same order (MPI's rule);
        host allreduces started back to back are fused (THC_FUSION_BYTES, THC_FUSION_CYCLE_MS).
        """
        xv, ov, bf16 = _bf16_views(x, out)
        req = _thc.iallreduce(self._c, xv, ov, _lookup(SCHEMES, scheme, "scheme"), _lookup(OPS, op, "op"), state,
                              bf16)
        return Request._wrap(req, x if out is None else out)

    def allreduce_group(self, xs: Sequence[Any], outs: Optional[Sequence[Any]] = None, *,
                        op: Union[str, int] = "sum", scheme: Union[str, int] = "thc",
                        states: Optional[Sequence[Optional[State]]] = None) -> List[Any]:
        """Several tensors compressed as one stream (one prelude, one pipeline; each tensor keeps
        its own blocks and error feedback): what a DDP bucket or Horovod's fusion buffer does,
        without copying. Host and CUDA arrays, also mixed (CUDA ones: libthc_cuda's codec, only
        codes cross to the host). outs=None: in place. Returns the list of results."""
        xl, ol, flags = self._group(xs, outs)
        _thc.allreduce_group(self._c, xl, ol, _lookup(SCHEMES, scheme, "scheme"), _lookup(OPS, op, "op"),
                             None if states is None else list(states), flags)
        return list(xs) if outs is None else list(outs)

    def iallreduce_group(self, xs: Sequence[Any], outs: Optional[Sequence[Any]] = None, *,
                         op: Union[str, int] = "sum", scheme: Union[str, int] = "thc",
                         states: Optional[Sequence[Optional[State]]] = None) -> "Request":
        """Nonblocking :meth:`allreduce_group`; ``wait()`` returns the list of results."""
        xl, ol, flags = self._group(xs, outs)
        req = _thc.iallreduce_group(self._c, xl, ol, _lookup(SCHEMES, scheme, "scheme"), _lookup(OPS, op, "op"),
                                    None if states is None else list(states), flags)
        return Request._wrap(req, list(xs) if outs is None else list(outs))

    def reduce_scatter(self, x: Any, out: Any = None, *, counts: Optional[Sequence[int]] = None,
                       op: Union[str, int] = "sum", scheme: Union[str, int] = "thc",
                       state: Optional[State] = None) -> Any:
        """Compressed reduce-scatter: ``x`` holds sum(counts) elements on every rank; rank r's
        ``out`` receives elements [sum(counts[:r]), +counts[r]) of the (compressed) sum or mean.

        counts: elements per rank, the same on every rank; None splits x as evenly as
        numpy.array_split. out=None allocates an array like x (NumPy, or a torch tensor on x's
        device). Host and CUDA arrays (x and out on the same side). state: error feedback of the
        whole input x.
        """
        xv, ov, bf16, counts, res = self._shards(x, out, counts, scatter=True)
        _thc.reduce_scatter(self._c, xv, ov, counts, _lookup(SCHEMES, scheme, "scheme"), _lookup(OPS, op, "op"),
                            state, bf16)
        return res

    def ireduce_scatter(self, x: Any, out: Any = None, *, counts: Optional[Sequence[int]] = None,
                        op: Union[str, int] = "sum", scheme: Union[str, int] = "thc",
                        state: Optional[State] = None) -> "Request":
        """Nonblocking :meth:`reduce_scatter`; ``wait()`` returns out."""
        xv, ov, bf16, counts, res = self._shards(x, out, counts, scatter=True)
        req = _thc.ireduce_scatter(self._c, xv, ov, counts, _lookup(SCHEMES, scheme, "scheme"),
                                   _lookup(OPS, op, "op"), state, bf16)
        return Request._wrap(req, res)

    def allgather(self, x: Any, out: Any = None, *, counts: Optional[Sequence[int]] = None,
                  scheme: Union[str, int] = "thc", state: Optional[State] = None) -> Any:
        """LOSSY allgather (for when that is wanted; parameters are usually gathered exactly):
        rank r's x (counts[r] elements) is encoded once, and every rank's ``out`` receives all
        sum(counts) decoded elements, rank r's at offset sum(counts[:r]), identical on every rank.

        counts: None means every rank's x has x's size. out=None allocates an array like x
        (NumPy, or a torch tensor on x's device). Host and CUDA arrays (x and out on the same
        side). state: error feedback of this rank's x.
        """
        xv, ov, bf16, counts, res = self._shards(x, out, counts, scatter=False)
        _thc.allgather(self._c, xv, ov, counts, _lookup(SCHEMES, scheme, "scheme"), state, bf16)
        return res

    def iallgather(self, x: Any, out: Any = None, *, counts: Optional[Sequence[int]] = None,
                   scheme: Union[str, int] = "thc", state: Optional[State] = None) -> "Request":
        """Nonblocking :meth:`allgather`; ``wait()`` returns out."""
        xv, ov, bf16, counts, res = self._shards(x, out, counts, scatter=False)
        req = _thc.iallgather(self._c, xv, ov, counts, _lookup(SCHEMES, scheme, "scheme"), state, bf16)
        return Request._wrap(req, res)

    # ---- helpers

    def _group(self, xs: Sequence[Any], outs: Optional[Sequence[Any]]):
        xs = list(xs)
        if outs is not None:
            outs = list(outs)
            if len(outs) != len(xs):
                raise ArrayError("outs must have one array per tensor", Status.INVALID_ARG)
        xl, ol, flags = [], [], []
        for i, x in enumerate(xs):
            xv, ov, bf16 = _bf16_views(x, None if outs is None else outs[i])
            xl.append(xv)
            ol.append(ov)
            flags.append(bf16)
        return xl, (None if outs is None else ol), flags

    def _shards(self, x: Any, out: Any, counts: Optional[Sequence[int]], scatter: bool):
        xv, _, bf16 = _bf16_views(x, None)
        size = self.size
        n = _thc.element_count(xv, bf16)
        if counts is None:
            if scatter:
                counts = [n // size + (1 if r < n % size else 0) for r in range(size)]
            else:
                counts = [n] * size
        counts = [int(c) for c in counts]
        if any(c < 0 for c in counts):
            raise InvalidArgumentError("counts must not be negative", Status.INVALID_ARG)
        if out is None:
            want = counts[self.rank] if scatter else sum(counts)
            if isinstance(x, np.ndarray):
                out = np.empty(want, x.dtype)
            elif hasattr(x, "new_empty"):  # a torch tensor: out on its device
                out = x.new_empty(want)
            else:
                raise ArrayError("out=None allocates a NumPy array or a torch tensor: pass out= for other arrays",
                                 Status.INVALID_ARG)
        xv, ov, bf16 = _bf16_views(x, out)
        return xv, ov, bf16, counts, out
