"""Run under mpirun by test_mpi.py: thc.Comm.from_mpi4py on every rank. Each check prints
"ok NAME" on rank 0; a failed check raises, and the rank exits non-zero (mpirun then fails)."""

from __future__ import annotations

import sys
import traceback

import numpy as np
from mpi4py import MPI

import thc

W = MPI.COMM_WORLD
RANK, SIZE = W.Get_rank(), W.Get_size()


def rel_err(a, b):
    a = np.asarray(a, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def same_everywhere(a: np.ndarray) -> bool:
    first = W.bcast(a if RANK == 0 else None, root=0)
    return bool(W.allreduce(int(np.array_equal(first, a)), op=MPI.MIN))


def exact_mean(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    s = np.empty_like(x64)
    W.Allreduce(x64, s, op=MPI.SUM)
    return s / SIZE


def check_allreduce(comm: thc.Comm) -> None:
    x = np.random.default_rng(RANK).standard_normal(70000).astype(np.float32)
    for scheme in ("thc", "cnat"):
        out = comm.allreduce(x, np.empty_like(x), op="avg", scheme=scheme)
        assert same_everywhere(out), scheme
        assert rel_err(out, exact_mean(x)) < 0.3, (scheme, rel_err(out, exact_mean(x)))
    h = x.astype(np.float16)
    comm.allreduce(h, op="sum")
    assert same_everywhere(h)
    assert rel_err(h, exact_mean(x) * SIZE) < 0.3


def check_error_feedback(comm: thc.Comm) -> None:
    x = np.random.default_rng(10 + RANK).standard_normal(16384).astype(np.float32)
    exact = exact_mean(x)
    errs = []
    for st in (thc.State(), None):
        acc = np.zeros(x.size)
        for _ in range(8):
            acc += comm.allreduce(x, np.empty_like(x), op="avg", state=st)
        errs.append(rel_err(acc / 8, exact))
    assert errs[0] < 0.7 * errs[1], errs


def check_nonfinite_on_one_rank(comm: thc.Comm) -> None:
    x = np.ones(5000, np.float32)
    if RANK == SIZE - 1:
        x[3] = np.inf
    out = np.full_like(x, 5.0)
    try:
        comm.allreduce(x, out)
    except thc.NonFiniteError as e:
        assert e.status == thc.Status.NONFINITE
    else:
        raise AssertionError("no NonFiniteError")
    assert (out == 5.0).all()
    comm.allreduce(np.ones(5000, np.float32))  # still usable


def check_count_mismatch(comm: thc.Comm) -> None:
    try:
        comm.allreduce(np.ones(1000 + (RANK == 0) * 5000, np.float32))
    except thc.ConfigMismatchError as e:
        assert e.status == thc.Status.CONFIG_MISMATCH
    else:
        raise AssertionError("no ConfigMismatchError")


def check_split_communicator() -> None:
    sub = W.Split(RANK % 2, RANK)
    with thc.Comm.from_mpi4py(sub, seed=3) as c:
        assert (c.rank, c.size) == (sub.Get_rank(), sub.Get_size())
        x = np.full(4096, float(RANK), np.float32)
        c.allreduce(x, op="sum")
        members = sub.allgather(RANK)
        assert abs(float(x.mean()) - sum(members)) < 0.1 * max(1, sum(members)), (x.mean(), members)
    sub.Free()


def check_nonblocking(comm: thc.Comm) -> None:
    """Calls in flight on the progress thread (mpi4py initializes MPI_THREAD_MULTIPLE), completed
    by waitall; bit-identical to blocking calls on a twin communicator in the same order."""
    assert MPI.Query_thread() == MPI.THREAD_MULTIPLE
    xs = [np.random.default_rng(20 + RANK + i).standard_normal(30000).astype(np.float32) for i in range(3)]
    with thc.Comm.from_mpi4py(W, seed=5) as a, thc.Comm.from_mpi4py(W, seed=5) as b:
        reqs = [a.iallreduce(x, np.empty_like(x), op="avg") for x in xs]
        got = thc.waitall(reqs)
        want = [b.allreduce(x, np.empty_like(x), op="avg") for x in xs]
    for g, w, x in zip(got, want, xs):
        assert np.array_equal(g, w)
        assert same_everywhere(g)
        assert rel_err(g, exact_mean(x)) < 0.3


def check_reduce_scatter_allgather(comm: thc.Comm) -> None:
    x = np.random.default_rng(30 + RANK).standard_normal(10007).astype(np.float32)
    counts = [10007 // SIZE + (1 if r < 10007 % SIZE else 0) for r in range(SIZE)]
    offs = np.concatenate([[0], np.cumsum(counts)])
    shard = comm.reduce_scatter(x, op="avg")
    assert shard.shape == (counts[RANK],)
    assert rel_err(shard, exact_mean(x)[offs[RANK]:offs[RANK + 1]]) < 0.3
    full = comm.iallgather(shard, np.empty(10007, np.float32), counts=counts).wait()
    assert same_everywhere(full)
    assert rel_err(full, exact_mean(x)) < 0.5


def check_stats(comm: thc.Comm, calls_before: int) -> None:
    s = comm.stats()
    assert s.calls > calls_before and s.float_bytes > 0 and s.wire_bytes_up > 0
    tot = thc.stats()
    assert tot.calls >= s.calls


def main() -> int:
    hier = len(sys.argv) > 1 and sys.argv[1] == "hier"
    comm = thc.Comm.from_mpi4py(W, seed=1)
    checks = [("allreduce", lambda: check_allreduce(comm)),
              ("error_feedback", lambda: check_error_feedback(comm)),
              ("nonfinite", lambda: check_nonfinite_on_one_rank(comm)),
              ("count_mismatch", lambda: check_count_mismatch(comm)),
              ("split", check_split_communicator),
              ("nonblocking", lambda: check_nonblocking(comm)),
              ("reduce_scatter_allgather", lambda: check_reduce_scatter_allgather(comm)),
              ("stats", lambda: check_stats(comm, 0))]
    if hier:
        checks = checks[:1]
    for name, fn in checks:
        try:
            fn()
        except BaseException:
            traceback.print_exc()
            print(f"FAILED {name} on rank {RANK}", flush=True)
            sys.stdout.flush()
            W.Abort(1)
        W.Barrier()
        if RANK == 0:
            print(f"ok {name}", flush=True)
    if hier:
        # THC_HIER_HOSTS emulates hosts: the compressed stage spans them.
        assert comm.stats().hier_hosts == 2, comm.stats()
        if RANK == 0:
            print("ok hier", flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
