"""thc on in-process communicators: ranks are threads of this process."""

from __future__ import annotations

import array
import os
import threading
import time

import numpy as np
import pytest

import thc
from conftest import run_ranks, values

SEED = 1  # THC_SEED: the codec's randomness is the same on every run


def rng_input(rank: int, n: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(100 + rank).standard_normal(n).astype(dtype)


def rel_err(a, b) -> float:
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def group_allreduce(n, count, dtype=np.float32, calls=1, **kw):
    """n ranks, each calls allreduce `calls` times on its own input; returns inputs, outputs per rank."""
    g = thc.InprocGroup(n)
    xs = [rng_input(r, count, dtype) for r in range(n)]
    knobs = kw.pop("knobs", {})

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED, **knobs) as c:
            outs = []
            for _ in range(calls):
                outs.append(c.allreduce(xs[r], np.empty_like(xs[r]), **kw))
            return outs, c.stats()

    return xs, values(run_ranks(n, rank))


# ---- results

@pytest.mark.parametrize("scheme,tol", [("thc", 0.3), ("uhc", 0.5), ("cnat", 0.3), ("dnat", 0.5)])
def test_avg_is_identical_on_every_rank_and_close_to_the_mean(scheme, tol):
    xs, res = group_allreduce(3, 40000, op="avg", scheme=scheme)
    outs = [r[0][0] for r in res]
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    exact = sum(x.astype(np.float64) for x in xs) / 3
    assert rel_err(outs[0], exact) < tol


def test_sum_is_the_sum():
    xs, res = group_allreduce(4, 30000, op="sum")
    exact = sum(x.astype(np.float64) for x in xs)
    assert rel_err(res[0][0][0], exact) < 0.3
    # An average where a sum was asked would be 4x off.
    assert rel_err(res[0][0][0] / 4, exact) > 0.5


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_dtypes(dtype):
    xs, res = group_allreduce(2, 20000, dtype=dtype, op="avg")
    out = res[0][0][0]
    assert out.dtype == dtype
    exact = (xs[0].astype(np.float64) + xs[1].astype(np.float64)) / 2
    assert rel_err(out, exact) < 0.3


def test_bfloat16_numpy_through_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed: NumPy has no bfloat16 without it")
    g = thc.InprocGroup(2)
    xs = [rng_input(r, 20000).astype(ml_dtypes.bfloat16) for r in range(2)]

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            out = c.allreduce(xs[r], np.empty_like(xs[r]), op="avg")
            y = xs[r].copy()
            c.allreduce(y, op="avg")  # in place
            return out, y

    res = values(run_ranks(2, rank))
    exact = (xs[0].astype(np.float64) + xs[1].astype(np.float64)) / 2
    for out, y in res:
        assert out.dtype == ml_dtypes.bfloat16 and y.dtype == ml_dtypes.bfloat16
        assert rel_err(out.astype(np.float64), exact) < 0.3
        assert rel_err(y.astype(np.float64), exact) < 0.3


def test_in_place_writes_x_and_returns_it():
    g = thc.InprocGroup(2)
    xs = [rng_input(r, 10000) for r in range(2)]
    orig = [x.copy() for x in xs]

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            return c.allreduce(xs[r], op="avg")

    res = values(run_ranks(2, rank))
    assert res[0] is xs[0] and res[1] is xs[1]
    assert np.array_equal(xs[0], xs[1])
    assert rel_err(xs[0], (orig[0] + orig[1]) / 2) < 0.3


def test_error_feedback_state_tracks_the_repeated_input():
    """The same input K times: with error feedback the mean of the outputs converges like 1/K,
    without it like 1/sqrt(K)."""
    n, count, k = 2, 16384, 16
    g = thc.InprocGroup(n)
    xs = [rng_input(r, count) for r in range(n)]
    exact = sum(x.astype(np.float64) for x in xs) / n

    def rank(r, ef):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            st = thc.State() if ef else None
            acc = np.zeros(count)
            for _ in range(k):
                acc += c.allreduce(xs[r], np.empty_like(xs[r]), op="avg", state=st)
            return acc / k

    with_ef = values(run_ranks(n, lambda r: rank(r, True)))[0]
    without = values(run_ranks(n, lambda r: rank(r, False)))[0]
    assert rel_err(with_ef, exact) < 0.5 * rel_err(without, exact)


def test_state_is_bound_to_its_first_count_until_reset():
    c = thc.Comm.inproc(thc.InprocGroup(1), 0, seed=SEED)
    st = thc.State()
    c.allreduce(rng_input(0, 4096), np.empty(4096, np.float32), state=st)
    with pytest.raises(thc.InvalidArgumentError) as e:
        c.allreduce(rng_input(0, 8192), np.empty(8192, np.float32), state=st)
    assert e.value.status == thc.Status.INVALID_ARG
    st.reset()
    c.allreduce(rng_input(0, 8192), np.empty(8192, np.float32), state=st)
    c.close()


def test_count_zero_is_a_no_op():
    c = thc.Comm.inproc(thc.InprocGroup(1), 0)
    c.allreduce(np.empty(0, np.float32))
    assert c.stats().calls == 0
    c.close()


# ---- DLPack, buffer protocol

class DLPackOnly:
    """A minimal DLPack producer: only __dlpack__ and __dlpack_device__ (of a NumPy array)."""

    def __init__(self, a: np.ndarray):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_dlpack_producer_in_place_and_out():
    g = thc.InprocGroup(2)
    xs = [rng_input(r, 12000) for r in range(2)]
    outs = [np.zeros(12000, np.float32) for _ in range(2)]
    ys = [x.copy() for x in xs]

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            c.allreduce(DLPackOnly(xs[r]), DLPackOnly(outs[r]), op="avg")
            c.allreduce(DLPackOnly(ys[r]), op="avg")

    values(run_ranks(2, rank))
    exact = (xs[0] + xs[1]) / 2
    assert np.array_equal(outs[0], outs[1]) and rel_err(outs[0], exact) < 0.3
    assert np.array_equal(ys[0], ys[1]) and rel_err(ys[0], exact) < 0.3


class RefusesExport:
    def __dlpack__(self, stream=None):
        raise BufferError("this producer cannot export its memory")

    def __dlpack_device__(self):
        return (1, 0)


def test_a_producers_refusal_is_in_the_message(comm1):
    with pytest.raises(thc.ArrayError, match="cannot export its memory"):
        comm1.allreduce(RefusesExport())


def test_buffer_protocol_objects():
    """array.array: float32 ('f') and float64 ('d') through the buffer protocol only."""
    g = thc.InprocGroup(2)
    src = [rng_input(r, 8000) for r in range(2)]
    floats = [array.array("f", s.tolist()) for s in src]
    doubles = [array.array("d", s.tolist()) for s in src]

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            c.allreduce(floats[r], op="avg")
            c.allreduce(doubles[r], op="avg")

    values(run_ranks(2, rank))
    exact = (src[0] + src[1]) / 2
    for a, dt in ((floats, np.float32), (doubles, np.float64)):
        got = np.frombuffer(a[0], dt)
        assert rel_err(got, exact) < 0.3 and np.array_equal(got, np.frombuffer(a[1], dt))


def test_multidimensional_c_contiguous_arrays():
    g = thc.InprocGroup(2)
    xs = [rng_input(r, 64 * 128).reshape(64, 128) for r in range(2)]

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            return c.allreduce(xs[r], np.empty_like(xs[r]), op="avg")

    res = values(run_ranks(2, rank))
    assert res[0].shape == (64, 128)
    assert rel_err(res[0], (xs[0] + xs[1]) / 2) < 0.3


# ---- errors: the status travels with the exception

@pytest.fixture()
def comm1():
    c = thc.Comm.inproc(thc.InprocGroup(1), 0, seed=SEED)
    yield c
    c.close()


@pytest.mark.parametrize("bad", [np.zeros(64, np.int32), np.zeros(64, np.complex64), np.zeros(64, bool),
                                 np.zeros(64, ">f4")])
def test_dtype_errors(comm1, bad):
    with pytest.raises(thc.DtypeError) as e:
        comm1.allreduce(bad)
    assert e.value.status == thc.Status.INVALID_ARG
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)


def test_array_errors(comm1):
    cases = [
        ([1.0, 2.0], None, "expected an array"),
        (np.zeros((8, 8), np.float32)[:, ::2], None, "C-contiguous"),
        (np.zeros(64, np.float32), np.zeros(32, np.float32), "elements"),
    ]
    ro = np.zeros(64, np.float32)
    ro.flags.writeable = False
    cases.append((ro, None, "read-only"))
    base = np.zeros(128, np.float32)
    cases.append((base[:64], base[32:96], "overlap"))
    for x, out, what in cases:
        with pytest.raises(thc.ArrayError) as e:
            comm1.allreduce(x, out)
        assert what in str(e.value), (what, str(e.value))
        assert e.value.status == thc.Status.INVALID_ARG
    with pytest.raises(thc.DtypeError):
        comm1.allreduce(np.zeros(64, np.float32), np.zeros(64, np.float16))
    # A read-only input is fine when the result goes elsewhere.
    assert comm1.allreduce(ro, np.empty(64, np.float32)).shape == (64,)


def test_bad_scheme_op_and_knobs(comm1):
    with pytest.raises(thc.InvalidArgumentError, match="scheme"):
        comm1.allreduce(np.zeros(64, np.float32), scheme="zip")
    with pytest.raises(thc.InvalidArgumentError, match="op"):
        comm1.allreduce(np.zeros(64, np.float32), op="max")
    with pytest.raises(thc.InvalidArgumentError) as e:
        thc.config(no_such_knob=1)
    assert "THC_NO_SUCH_KNOB" in e.value.message and e.value.status == thc.Status.INVALID_ARG
    with pytest.raises(thc.InvalidArgumentError, match="THC_ALGO"):
        thc.config(algo="ring")
    assert thc.config(bits=2, p="1/64", algo="ps")["THC_BITS"] == "2"
    assert thc.config(algo="ps")["THC_ALGO"] == "ps"


def test_invalid_configuration_fails_the_call_with_its_status():
    c = thc.Comm.inproc(thc.InprocGroup(1), 0, bits=9)
    with pytest.raises(thc.InvalidArgumentError) as e:
        c.allreduce(np.ones(4096, np.float32))
    assert e.value.status == thc.Status.INVALID_ARG
    c.close()


def test_nonfinite_input_fails_every_rank_and_leaves_out_untouched():
    g = thc.InprocGroup(3)
    xs = [rng_input(r, 5000) for r in range(3)]
    xs[1][17] = np.nan
    outs = [np.full(5000, 7.0, np.float32) for _ in range(3)]

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            c.allreduce(xs[r], outs[r])

    res = run_ranks(3, rank)
    for r, e in enumerate(res):
        assert isinstance(e, thc.NonFiniteError), e
        assert isinstance(e, FloatingPointError)
        assert e.status == thc.Status.NONFINITE and "NaN" in e.message
        assert (outs[r] == 7.0).all()


def test_count_and_configuration_mismatch():
    g = thc.InprocGroup(2)

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            errs = []
            try:
                c.allreduce(np.ones(1000 * (r + 1), np.float32))
            except thc.Error as e:
                errs.append(e)
            # The communicator stays usable.
            c.allreduce(np.ones(1000, np.float32))
            return errs

    for errs in values(run_ranks(2, rank)):
        assert len(errs) == 1 and isinstance(errs[0], thc.ConfigMismatchError)
        assert errs[0].status == thc.Status.CONFIG_MISMATCH

    def knobs(r):
        with thc.Comm.inproc(g, r, seed=SEED, bits=2 + 2 * r) as c:
            c.allreduce(np.ones(1000, np.float32))

    for e in run_ranks(2, knobs):
        assert isinstance(e, thc.ConfigMismatchError), e


def test_timeout_when_a_peer_never_calls(monkeypatch):
    # An in-process group's waits are bounded by THC_TIMEOUT_MS of the environment at its creation.
    monkeypatch.setenv("THC_TIMEOUT_MS", "300")
    g = thc.InprocGroup(2)
    comms = values(run_ranks(2, lambda r: thc.Comm.inproc(g, r)))
    t0 = time.monotonic()
    with pytest.raises(thc.TimeoutError) as e:
        comms[0].allreduce(np.ones(1000, np.float32))
    assert e.value.status == thc.Status.TIMEOUT and isinstance(e.value, TimeoutError)
    assert time.monotonic() - t0 < 30
    for c in comms:
        c.close()


def test_a_busy_communicator_refuses_a_second_thread():
    g = thc.InprocGroup(2)
    comms = values(run_ranks(2, lambda r: thc.Comm.inproc(g, r, seed=SEED)))
    results = {}

    def call(name):
        try:
            comms[0].allreduce(np.ones(1000, np.float32), np.empty(1000, np.float32))
            results[name] = "ok"
        except thc.Error as e:
            results[name] = e

    a = threading.Thread(target=call, args=("a",))
    b = threading.Thread(target=call, args=("b",))
    a.start()
    b.start()
    # Rank 0 waits for rank 1 in one of the two calls; the other call is refused at once.
    deadline = time.monotonic() + 20
    while len(results) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    comms[1].allreduce(np.ones(1000, np.float32))
    a.join(30)
    b.join(30)
    errs = [v for v in results.values() if isinstance(v, thc.Error)]
    assert sorted(map(str, results.keys())) == ["a", "b"]
    assert len(errs) == 1 and isinstance(errs[0], thc.InvalidArgumentError) and "in use" in errs[0].message
    for c in comms:
        c.close()


def test_closed_communicator():
    c = thc.Comm.inproc(thc.InprocGroup(1), 0)
    c.close()
    c.close()  # idempotent
    assert c.closed
    with pytest.raises(thc.InvalidArgumentError, match="closed"):
        c.allreduce(np.ones(16, np.float32))
    with pytest.raises(TypeError):
        thc.Comm()


def test_exception_classes_carry_every_status():
    for st in thc.Status:
        if st == thc.Status.SUCCESS:
            continue
        e = thc.errors._from_status(int(st), "m")
        assert isinstance(e, thc.Error) and e.status == st and e.message == "m"
        assert st.name in str(e)


# ---- statistics

def test_stats_of_a_communicator_and_of_the_process():
    before = thc.stats()
    count, calls = 50000, 3
    xs, res = group_allreduce(2, count, calls=calls, op="avg")
    for _, s in res:
        assert s.calls == calls and s.elements == calls * count
        assert s.float_bytes == 4 * calls * count
        assert s.wire_bytes_up > 0 and not s.measured_wire
        # 4-bit THC: at least 4x fewer bytes than float32 (8x in index form, 4x in value form).
        assert s.compression >= 4.0
    after = thc.stats()  # both communicators are closed: their counters stay in the totals
    assert after.calls - before.calls == 2 * calls
    assert after.float_bytes - before.float_bytes == 2 * 4 * calls * count
    assert after.wire_bytes_up - before.wire_bytes_up == sum(s.wire_bytes_up for _, s in res)


def test_versions_and_the_bundled_library():
    assert thc.__version__ == thc.library_version()
    # The extension loads the libthc shipped inside the package (a wheel needs no other libthc).
    pkg = os.path.dirname(os.path.realpath(thc.__file__))
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "libthc.so" in line}
    assert libs and all(os.path.dirname(os.path.realpath(p)) == pkg for p in libs), libs
