"""thc.Comm.ucx: ranks that reach each other over UCX, bootstrapped from a rendezvous address
(here: threads of this process, each with its own UCX endpoints; across processes and under
DDP in test_torch.py)."""

from __future__ import annotations

import socket

import numpy as np
import pytest

import thc
from conftest import run_ranks, values

pytestmark = pytest.mark.skipif(not thc._thc.HAVE_UCX, reason="this libthc was built without UCX")


def rendezvous() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_same_results_as_an_inproc_group():
    n, count = 3, 50000
    xs = [np.random.default_rng(7 + r).standard_normal(count).astype(np.float32) for r in range(n)]
    rv = rendezvous()

    def over_ucx(r):
        with thc.Comm.ucx(rv, r, n, seed=3) as c:
            assert (c.rank, c.size) == (r, n)
            return c.allreduce(xs[r], np.empty_like(xs[r]), op="avg"), c.allreduce(xs[r], np.empty_like(xs[r]),
                                                                                  scheme="cnat")

    g = thc.InprocGroup(n)

    def over_inproc(r):
        with thc.Comm.inproc(g, r, seed=3) as c:
            return c.allreduce(xs[r], np.empty_like(xs[r]), op="avg"), c.allreduce(xs[r], np.empty_like(xs[r]),
                                                                                  scheme="cnat")

    a, b = values(run_ranks(n, over_ucx)), values(run_ranks(n, over_inproc))
    for r in range(n):
        for k in range(2):
            assert np.array_equal(a[r][k], b[r][k])
            assert np.array_equal(a[r][k], a[0][k])


def test_errors_name_what_is_wrong():
    with pytest.raises(thc.InvalidArgumentError, match="rendezvous"):
        thc.Comm.ucx("no-port-here", 0, 2)
    rv = rendezvous()
    res = run_ranks(2, lambda r: thc.Comm.ucx(rv, r, 2 + r, timeout_ms=20000))
    for e in res:
        assert isinstance(e, thc.ConfigMismatchError), e
        assert "group" in str(e)
    res = run_ranks(1, lambda r: thc.Comm.ucx(rendezvous(), 0, 2, timeout_ms=500))
    assert isinstance(res[0], thc.TimeoutError), res[0]
    assert "rank(s) 1" in str(res[0])


def test_rank_size_and_rendezvous_from_a_launchers_environment(monkeypatch):
    monkeypatch.delenv("THC_UCX_PORT", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(thc.InvalidArgumentError, match="RANK is not set"):
        thc.Comm.ucx()
    host, port = rendezvous().rsplit(":", 1)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", host)
    monkeypatch.setenv("MASTER_PORT", str(int(port) - 1))  # thc takes MASTER_PORT + 1
    with thc.Comm.ucx() as c:
        assert (c.rank, c.size) == (0, 1)
        x = np.arange(1000, dtype=np.float32)
        y = c.allreduce(x, np.empty_like(x), op="sum")
        assert np.linalg.norm(y - x) / np.linalg.norm(x) < 0.2
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(thc.InvalidArgumentError, match="not a number"):
        thc.Comm.ucx()
