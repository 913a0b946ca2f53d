"""thc.Comm.from_mpi4py under mpirun (mpi_worker.py holds the checks)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("mpi4py", reason="mpi4py is not installed (Debian: python3-mpi4py)")

import thc  # noqa: E402
from conftest import mpirun  # noqa: E402

CHECKS = ["allreduce", "error_feedback", "nonfinite", "count_mismatch", "split", "nonblocking",
          "reduce_scatter_allgather", "stats"]


@pytest.mark.parametrize("np_", [2, 3])
def test_mpi(np_):
    if not thc._thc.HAVE_MPI:
        pytest.skip("libthc was built without MPI")
    r = mpirun(np_, "mpi_worker.py")
    assert r.returncode == 0, r.stdout
    for c in CHECKS:
        assert f"ok {c}" in r.stdout, r.stdout


def test_mpi_hierarchical(monkeypatch):
    """Four ranks on two emulated hosts: the hierarchical communicator from Python."""
    if not thc._thc.HAVE_MPI:
        pytest.skip("libthc was built without MPI")
    monkeypatch.setenv("THC_HIER_HOSTS", "2,2")
    r = mpirun(4, "mpi_worker.py", "hier")
    assert r.returncode == 0, r.stdout
    assert "ok allreduce" in r.stdout and "ok hier" in r.stdout, r.stdout


def test_from_mpi4py_refuses_other_objects():
    if not thc._thc.HAVE_MPI:
        pytest.skip("libthc was built without MPI")
    with pytest.raises(TypeError):
        thc.Comm.from_mpi4py(object())
    from mpi4py import MPI
    with pytest.raises(thc.InvalidArgumentError):
        thc.Comm.from_mpi4py(MPI.COMM_NULL)
