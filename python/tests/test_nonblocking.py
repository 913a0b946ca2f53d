"""Nonblocking calls, groups, reduce-scatter and allgather (libthc's thc_i*, thc_*_group,
thc_reduce_scatter, thc_allgather) on in-process communicators."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import thc
from conftest import run_ranks, values

SEED = 1


def inputs(n, count, base=400):
    return [np.random.default_rng(base + r).standard_normal(count).astype(np.float32) for r in range(n)]


def rel_err(a, b):
    b = np.asarray(b, np.float64)
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def test_iallreduce_equals_the_blocking_calls_bit_for_bit():
    """Four calls in flight, then waitall: the same bits as four blocking calls in the same places
    of the call sequence (fused or not), identical on every rank."""
    n, k, count = 3, 4, 20000
    xs = inputs(n, count)
    g1, g2 = thc.InprocGroup(n), thc.InprocGroup(n)

    def blocking(r):
        with thc.Comm.inproc(g1, r, seed=SEED) as c:
            return [c.allreduce(xs[r] * (i + 1), np.empty_like(xs[r]), op="avg") for i in range(k)]

    def nonblocking(r):
        with thc.Comm.inproc(g2, r, seed=SEED) as c:
            ins = [xs[r] * (i + 1) for i in range(k)]
            reqs = [c.iallreduce(ins[i], np.empty_like(xs[r]), op="avg") for i in range(k)]
            outs = thc.waitall(reqs)
            assert all(q.done for q in reqs)
            return outs, c.stats()

    want = values(run_ranks(n, blocking))
    got = values(run_ranks(n, nonblocking))
    for r in range(n):
        outs, st = got[r]
        assert st.calls == k
        for i in range(k):
            assert np.array_equal(outs[i], want[r][i]), (r, i)
            assert np.array_equal(outs[i], got[0][0][i])
    exact = sum(x.astype(np.float64) for x in xs) / n
    assert rel_err(got[0][0][0], exact) < 0.3


def test_wait_and_test():
    n = 2
    xs = inputs(n, 30000)
    g = thc.InprocGroup(n)

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            y = xs[r].copy()
            q = c.iallreduce(y, op="sum", state=thc.State())  # in place, temporaries held by the request
            while not q.test():
                pass
            assert q.test() and q.done
            assert q.wait() is y
            return y

    res = values(run_ranks(n, rank))
    assert np.array_equal(res[0], res[1])
    assert rel_err(res[0], xs[0] + xs[1]) < 0.3


def test_the_request_keeps_its_arrays_alive():
    g = thc.InprocGroup(2)

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            # Neither array has another reference: the request holds them until it completes.
            q = c.iallreduce(inputs(2, 50000)[r], np.empty(50000, np.float32), op="sum")
            gc.collect()
            return q.wait()

    xs = inputs(2, 50000)
    for out in values(run_ranks(2, rank)):
        assert rel_err(out, xs[0] + xs[1]) < 0.3


def test_errors_are_reported_on_the_request_of_every_rank():
    n = 3
    xs = inputs(n, 5000)
    ones = inputs(n, 5000, base=600)
    exact = sum(o.astype(np.float64) for o in ones) / n
    xs[2][99] = np.nan
    g = thc.InprocGroup(n)

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            out = np.full(5000, 3.0, np.float32)
            ok_before = c.iallreduce(ones[r], np.empty(5000, np.float32), op="avg")
            bad = c.iallreduce(xs[r], out)
            ok_after = c.iallreduce(ones[r], np.empty(5000, np.float32), op="avg")
            errs = []
            for _ in range(2):  # raised again by a second wait: never lost
                try:
                    bad.wait()
                except thc.NonFiniteError as e:
                    errs.append(e)
            with pytest.raises(thc.NonFiniteError):
                bad.test()
            a, b = ok_before.wait(), ok_after.wait()
            # waitall completes every request, then raises the first failure.
            q1 = c.iallreduce(xs[r], np.empty(5000, np.float32))
            q2 = c.iallreduce(np.ones(5000, np.float32), np.empty(5000, np.float32))
            with pytest.raises(thc.NonFiniteError):
                thc.waitall([q2, q1])
            assert q1.done and q2.done
            return errs, out, a, b

    for errs, out, a, b in values(run_ranks(n, rank)):
        assert len(errs) == 2 and all(e.status == thc.Status.NONFINITE for e in errs)
        assert (out == 3.0).all()  # untouched
        # The calls around the failed one (fused with it or not) succeed.
        assert rel_err(a, exact) < 0.3 and rel_err(b, exact) < 0.3


def test_a_dropped_request_runs_on_and_its_arrays_are_released_later():
    g = thc.InprocGroup(2)

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            q = c.iallreduce(np.ones(40000, np.float32), np.empty(40000, np.float32))
            del q
            gc.collect()
            held = c._c.orphans  # the dropped call's arrays, kept while it may still run
            y = c.allreduce(xs[r].copy(), op="sum")  # runs after it: it has ended
            return held, c._c.orphans, y, c.stats().calls

    xs = inputs(2, 10000)
    for held, after, y, calls in values(run_ranks(2, rank)):
        assert held == 1 and after == 0 and calls == 2
        assert rel_err(y, xs[0] + xs[1]) < 0.3


def test_close_waits_for_calls_in_flight():
    g = thc.InprocGroup(2)

    def rank(r):
        c = thc.Comm.inproc(g, r, seed=SEED)
        qs = [c.iallreduce(xs[r] * (i + 1), np.empty(20000, np.float32), op="avg") for i in range(3)]
        c.close()
        return [q.wait() for q in qs]

    xs = inputs(2, 20000)
    for outs in values(run_ranks(2, rank)):
        for i, o in enumerate(outs):
            assert rel_err(o, (xs[0] + xs[1]) * (i + 1) / 2) < 0.3


def test_allreduce_group_equals_separate_calls_bit_for_bit():
    n = 2
    sizes = [7, 1000, 70000, 0, 300]
    xs = [[np.random.default_rng(10 * r + i).standard_normal(m).astype(np.float32) for i, m in enumerate(sizes)]
          for r in range(n)]
    g1, g2, g3 = thc.InprocGroup(n), thc.InprocGroup(n), thc.InprocGroup(n)

    def separate(r):
        with thc.Comm.inproc(g1, r, seed=SEED) as c:
            sts = [thc.State() for _ in sizes]
            return [c.allreduce(x, np.empty_like(x), op="avg", state=s) for x, s in zip(xs[r], sts)]

    def grouped(r):
        with thc.Comm.inproc(g2, r, seed=SEED) as c:
            outs = c.allreduce_group(xs[r], [np.empty_like(x) for x in xs[r]], op="avg",
                                     states=[thc.State() for _ in sizes])
            return outs, c.stats()

    def grouped_nb_in_place(r):
        with thc.Comm.inproc(g3, r, seed=SEED) as c:
            ys = [x.copy() for x in xs[r]]
            q = c.iallreduce_group(ys, op="avg", states=[thc.State() for _ in sizes])
            assert q.wait() == ys
            return ys

    want = values(run_ranks(n, separate))
    got = values(run_ranks(n, grouped))
    got_nb = values(run_ranks(n, grouped_nb_in_place))
    for r in range(n):
        outs, st = got[r]
        # Count-0 tensors are no calls (as a count-0 allreduce is none).
        nonzero = sum(1 for m in sizes if m)
        assert st.groups == 1 and st.grouped_tensors == nonzero and st.calls == nonzero
        for i in range(len(sizes)):
            assert np.array_equal(outs[i], want[r][i]), (r, i)
            assert np.array_equal(got_nb[r][i], want[r][i]), (r, i)


@pytest.mark.parametrize("counts", [None, [5000, 5000, 5000], [12000, 0, 3001]])
def test_reduce_scatter_is_the_shard_of_a_group_of_the_shards(counts):
    n = 3
    total = 15001 if counts is None or sum(counts) == 15001 else sum(counts)
    xs = inputs(n, total)
    shards = counts or [total // n + (1 if r < total % n else 0) for r in range(n)]
    offs = np.concatenate([[0], np.cumsum(shards)])
    g1, g2 = thc.InprocGroup(n), thc.InprocGroup(n)

    def scatter(r):
        with thc.Comm.inproc(g1, r, seed=SEED) as c:
            a = c.reduce_scatter(xs[r], counts=counts, op="avg")
            q = c.ireduce_scatter(xs[r], np.empty(shards[r], np.float32), counts=counts, op="avg")
            return a, q.wait()

    def group(r):
        with thc.Comm.inproc(g2, r, seed=SEED) as c:
            parts = [xs[r][offs[i]:offs[i + 1]].copy() for i in range(n)]
            first = c.allreduce_group(parts, op="avg")
            parts = [xs[r][offs[i]:offs[i + 1]].copy() for i in range(n)]
            second = c.allreduce_group(parts, op="avg")
            return first[r], second[r]

    got = values(run_ranks(n, scatter))
    want = values(run_ranks(n, group))
    exact = sum(x.astype(np.float64) for x in xs) / n
    for r in range(n):
        assert got[r][0].shape == (shards[r],)
        assert np.array_equal(got[r][0], want[r][0]) and np.array_equal(got[r][1], want[r][1])
        if shards[r]:
            assert rel_err(got[r][0], exact[offs[r]:offs[r + 1]]) < 0.3


def test_allgather_is_lossy_and_identical_everywhere():
    n = 3
    counts = [4000, 9000, 1]
    xs = [np.random.default_rng(500 + r).standard_normal(counts[r]).astype(np.float32) for r in range(n)]
    g = thc.InprocGroup(n)

    def rank(r):
        with thc.Comm.inproc(g, r, seed=SEED) as c:
            a = c.allgather(xs[r], counts=counts)
            b = c.iallgather(xs[r], np.empty(sum(counts), np.float32), counts=counts).wait()
            return a, b

    res = values(run_ranks(n, rank))
    offs = np.concatenate([[0], np.cumsum(counts)])
    for a, b in res:
        assert np.array_equal(a, res[0][0]) and np.array_equal(b, res[0][1])
        for r in range(n):
            if counts[r] > 100:
                assert rel_err(a[offs[r]:offs[r + 1]], xs[r]) < 0.3
    # Equal shards: counts may be left out.
    g2 = thc.InprocGroup(2)
    eq = values(run_ranks(2, lambda r: thc.Comm.inproc(g2, r, seed=SEED).allgather(xs[0][:500] * (r + 1))))
    assert eq[0].shape == (1000,) and np.array_equal(eq[0], eq[1])


def test_shard_argument_errors():
    c = thc.Comm.inproc(thc.InprocGroup(1), 0)
    x = np.ones(100, np.float32)
    with pytest.raises(thc.InvalidArgumentError, match="one entry per rank"):
        c.reduce_scatter(x, counts=[50, 50])
    with pytest.raises(thc.ArrayError, match="counts say"):
        c.reduce_scatter(x, counts=[99])
    with pytest.raises(thc.ArrayError, match="counts say"):
        c.reduce_scatter(x, np.empty(50, np.float32))
    with pytest.raises(thc.ArrayError, match="out="):
        c.reduce_scatter(memoryview(bytearray(400)).cast("f"))
    with pytest.raises(thc.InvalidArgumentError, match="negative"):
        c.allgather(x, counts=[-1])
    with pytest.raises(thc.ArrayError, match="one array per tensor"):
        c.allreduce_group([x, x], [x])
    with pytest.raises(thc.InvalidArgumentError):
        thc.waitall([object()])
    with pytest.raises(TypeError):
        thc.Request()
    c.close()
