"""Exceptions of thc: one class per status of libthc (``thc_status_t``), each carrying it.

Every class derives from :class:`thc.Error` and, where one fits, from the built-in exception a
Python caller would expect (``ValueError`` for a bad argument, ``TimeoutError``, ``MemoryError``,
...), so ``except ValueError`` works as it does for NumPy. ``err.status`` is the :class:`Status`,
``err.message`` libthc's message (which says what went wrong and where).
"""

from __future__ import annotations

import builtins
import enum
from typing import Optional

__all__ = [
    "Status", "Error", "InvalidArgumentError", "ArrayError", "DtypeError", "NonFiniteError",
    "ConfigMismatchError", "OverflowError", "TransportError", "TimeoutError", "UnsupportedError",
    "NoMemoryError", "InternalError", "LeftBehindError",
]


class Status(enum.IntEnum):
    """``thc_status_t`` (include/thc/thc.h)."""

    SUCCESS = 0
    INVALID_ARG = 1
    NONFINITE = 2
    CONFIG_MISMATCH = 3
    OVERFLOW = 4
    TRANSPORT = 5
    TIMEOUT = 6
    UNSUPPORTED = 7
    NO_MEMORY = 8
    INTERNAL = 9
    LEFT_BEHIND = 10


class Error(Exception):
    """A failed thc call. ``status``: the :class:`Status`; ``message``: what went wrong."""

    status: Status = Status.INTERNAL

    def __init__(self, message: str, status: Optional[Status] = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = Status(status)

    def __str__(self) -> str:
        return f"[{self.status.name}] {self.message}"


class InvalidArgumentError(Error, ValueError):
    """A bad argument or configuration (THC_ERR_INVALID_ARG); also a second call on a busy communicator."""

    status = Status.INVALID_ARG


class ArrayError(InvalidArgumentError, TypeError):
    """An object thc cannot reduce: not an array, not contiguous, read-only where written, or x and out that do not match."""


class DtypeError(ArrayError):
    """An array of a dtype thc does not compress (it takes float32, float16, bfloat16, float64)."""


class NonFiniteError(Error, FloatingPointError):
    """NaN or Inf in some rank's input (THC_ERR_NONFINITE, raised on every rank; nothing was reduced)."""

    status = Status.NONFINITE


class ConfigMismatchError(Error):
    """The ranks disagree on the configuration, count, op or call sequence (THC_ERR_CONFIG_MISMATCH)."""

    status = Status.CONFIG_MISMATCH


class OverflowError(Error, builtins.OverflowError):
    """The configuration's integer sums cannot fit any width (THC_ERR_OVERFLOW)."""

    status = Status.OVERFLOW


class TransportError(Error):
    """The reduction backend failed (THC_ERR_TRANSPORT)."""

    status = Status.TRANSPORT


class TimeoutError(Error, builtins.TimeoutError):
    """A peer or the aggregator did not answer within THC_TIMEOUT_MS (THC_ERR_TIMEOUT)."""

    status = Status.TIMEOUT


class UnsupportedError(Error, NotImplementedError):
    """A feature not built in or not available here (THC_ERR_UNSUPPORTED), e.g. CUDA arrays without libthc_cuda."""

    status = Status.UNSUPPORTED


class NoMemoryError(Error, MemoryError):
    """THC_ERR_NO_MEMORY."""

    status = Status.NO_MEMORY


class InternalError(Error):
    """THC_ERR_INTERNAL: a defect of thc; please report it with the message."""

    status = Status.INTERNAL


class LeftBehindError(Error):
    """The job's quorum went on without this rank; the call's result is gone (THC_ERR_LEFT_BEHIND)."""

    status = Status.LEFT_BEHIND


_BY_STATUS = {c.status: c for c in (InvalidArgumentError, NonFiniteError, ConfigMismatchError, OverflowError,
                                    TransportError, TimeoutError, UnsupportedError, NoMemoryError, InternalError,
                                    LeftBehindError)}
_BY_KIND = {"array": ArrayError, "dtype": DtypeError}


def _from_status(status: int, message: str, kind: Optional[str] = None) -> Error:
    """The exception for a status of libthc (called by the extension)."""
    try:
        st = Status(status)
    except ValueError:
        return InternalError(f"unknown status {status}: {message}")
    cls = _BY_KIND.get(kind) if kind and st == Status.INVALID_ARG else None
    return (cls or _BY_STATUS.get(st, InternalError))(message, st)
