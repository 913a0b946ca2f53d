"""thc on aggregator communicators: a real thc-aggregator process, ranks on threads."""

from __future__ import annotations

import numpy as np
import pytest

import thc
from conftest import run_ranks, values


def inputs(n, count):
    return [np.random.default_rng(200 + r).standard_normal(count).astype(np.float32) for r in range(n)]


def rel_err(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("scheme", ["thc", "cnat"])
def test_aggregator_allreduce(aggregator, scheme):
    n, count = 3, 60000
    xs = inputs(n, count)
    job = {"thc": 11, "cnat": 12}[scheme]

    def rank(r):
        with thc.Comm.aggregator(aggregator.url, r, n, job, key=aggregator.key, seed=1) as c:
            assert (c.rank, c.size) == (r, n)
            st = thc.State()
            out = c.allreduce(xs[r], np.empty_like(xs[r]), op="avg", scheme=scheme, state=st)
            y = xs[r].astype(np.float16)
            c.allreduce(y, op="sum", scheme=scheme)
            return out, y, c.stats()

    res = values(run_ranks(n, rank))
    exact = sum(x.astype(np.float64) for x in xs) / n
    for out, y, s in res:
        assert np.array_equal(out, res[0][0]) and np.array_equal(y, res[0][1])
        assert rel_err(out, exact) < 0.3
        assert rel_err(y, exact * n) < 0.3
        assert s.calls == 2 and s.measured_wire and s.packets > 0
        assert s.float_bytes == 2 * 4 * count and s.compression > 1.0


def test_aggregator_nonblocking(aggregator):
    n = 2
    xs = inputs(n, 40000)

    def rank(r):
        with thc.Comm.aggregator(aggregator.url, r, n, 16, key=aggregator.key, seed=1) as c:
            reqs = [c.iallreduce(xs[r] * (i + 1), np.empty_like(xs[r]), op="avg") for i in range(3)]
            return thc.waitall(reqs)

    res = values(run_ranks(n, rank))
    exact = (xs[0].astype(np.float64) + xs[1]) / 2
    for i in range(3):
        assert np.array_equal(res[0][i], res[1][i])
        assert rel_err(res[0][i], exact * (i + 1)) < 0.3


def test_aggregator_list_of_urls_and_key_from_the_environment(aggregator, monkeypatch, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text(aggregator.key + "\n")
    keyfile.chmod(0o600)
    monkeypatch.setenv("THC_AGGREGATOR_KEY_FILE", str(keyfile))
    xs = inputs(2, 20000)

    def rank(r):
        with thc.Comm.aggregator([aggregator.url], r, 2, 13, seed=1) as c:
            return c.allreduce(xs[r], np.empty_like(xs[r]), op="avg")

    res = values(run_ranks(2, rank))
    assert np.array_equal(res[0], res[1])
    assert rel_err(res[0], (xs[0] + xs[1]) / 2.0) < 0.3


def test_aggregator_errors_carry_their_status(aggregator):
    # A key the aggregator does not hold: it drops every datagram, the workers time out.
    wrong = aggregator.key.split(":")[0] + ":" + "00" * 32

    def rank(r):
        with thc.Comm.aggregator(aggregator.url, r, 2, 14, key=wrong, timeout_ms=500) as c:
            c.allreduce(np.ones(1000, np.float32))

    for e in run_ranks(2, rank):
        assert isinstance(e, thc.Error), e
        assert e.status in (thc.Status.TIMEOUT, thc.Status.TRANSPORT), e
    with pytest.raises(thc.InvalidArgumentError) as e:
        thc.Comm.aggregator("tcp://127.0.0.1:1", 0, 1, 15, key=aggregator.key)
    assert e.value.status == thc.Status.INVALID_ARG
