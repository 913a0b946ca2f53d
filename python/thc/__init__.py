"""thc: compressed homomorphic allreduce (THC, Cnat) for Python.

Communicators::

    comm = thc.Comm.from_mpi4py(MPI.COMM_WORLD)               # an mpi4py communicator
    comm = thc.Comm.aggregator("udp://agg:9471", rank, size, job=7, key="1:ABCD...")
    group = thc.InprocGroup(4); comm = thc.Comm.inproc(group, rank)   # one per thread

Calls take any array with ``__dlpack__`` or the buffer protocol (NumPy, PyTorch CPU and CUDA
tensors, CuPy, JAX, ...), C-contiguous, of float32, float16, bfloat16 (NumPy's through
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
    "Comm", "InprocGroup", "State", "Stats", "stats", "config", "library_version", "SCHEMES", "OPS",
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
    float32; ``compression``: their ratio.
    """

    calls: int = 0
    elements: int = 0
    wire_bytes_up: int = 0
    wire_bytes_down: int = 0
    float_bytes: int = 0
    packets: int = 0
    retransmissions: int = 0
    measured_wire: bool = False
    last_algo: Optional[int] = None
    hier_hosts: Optional[int] = None

    @property
    def compression(self) -> float:
        """float32 bytes per byte on the wire upstream (0.0 before any call)."""
        return self.float_bytes / self.wire_bytes_up if self.wire_bytes_up else 0.0

    _SUMMED = ("calls", "elements", "wire_bytes_up", "wire_bytes_down", "float_bytes", "packets", "retransmissions")

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

    def allreduce(self, x: Any, out: Any = None, *, op: Union[str, int] = "sum", scheme: Union[str, int] = "thc",
                  state: Optional[State] = None) -> Any:
        """Compressed allreduce of ``x``; returns the array holding the result.

        out=None: in place (``x`` must be writable), as torch.distributed.all_reduce; otherwise
        ``out`` (same dtype, size and device as ``x``) receives it and ``x`` is only read.
        op: "sum" or "avg". scheme: "thc" (default), "uhc", "cnat" or "dnat".
        state: a :class:`thc.State` for error feedback (the same one for every call on this tensor).
        """
        xv, ov, bf16 = _bf16_views(x, out)
        self._c.allreduce(xv, ov, _lookup(SCHEMES, scheme, "scheme"), _lookup(OPS, op, "op"), state, bf16)
        return x if out is None else out
