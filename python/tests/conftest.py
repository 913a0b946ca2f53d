"""Shared helpers of the thc Python tests: ranks on threads, a real thc-aggregator, mpirun."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(n: int, fn: Callable[[int], Any], timeout: float = 120) -> List[Any]:
    """fn(rank) on n threads at once (the ranks of an in-process group); each rank's return value,
    or the exception it raised, in rank order."""
    out: List[Any] = [None] * n

    def body(r: int) -> None:
        try:
            out[r] = fn(r)
        except BaseException as e:  # handed to the test, which decides
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a rank did not finish"
    return out


def values(results: List[Any]) -> List[Any]:
    """The results, re-raising the first rank's exception."""
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


@pytest.fixture(scope="module")
def aggregator(tmp_path_factory):
    """A thc-aggregator process on 127.0.0.1 with a key file of its own; .url and .key (tenant key 1)."""
    binary = os.environ.get("THC_AGGREGATOR_BIN") or shutil.which("thc-aggregator")
    if not binary:
        pytest.skip("thc-aggregator not found: set THC_AGGREGATOR_BIN (ctest does)")
    d = tmp_path_factory.mktemp("aggregator")
    keys, port_file, log = d / "keys", d / "port", d / "log"
    with open(log, "wb") as lf:
        proc = subprocess.Popen([binary, "--key-file", str(keys), "--create-key-file", "--port", "0", "--port-file",
                                 str(port_file), "--stats-interval", "0", "--seed", "1", "--bind", "127.0.0.1"],
                                stdout=lf, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        port = 0
        while not port:
            if port_file.exists() and port_file.read_text().strip():
                port = int(port_file.read_text())
                break
            if proc.poll() is not None:
                pytest.fail("thc-aggregator exited at start: " + log.read_text())
            if time.monotonic() > deadline:
                pytest.fail("thc-aggregator did not start: " + log.read_text())
            time.sleep(0.01)
        key = next(line.strip() for line in keys.read_text().splitlines() if line.startswith("1:"))
        yield SimpleNamespace(url=f"udp://127.0.0.1:{port}", key=key, log=log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def mpirun(np_: int, script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run a script of this directory under mpirun with np_ ranks and this interpreter."""
    mpiexec = shutil.which("mpirun") or shutil.which("mpiexec")
    if not mpiexec:
        pytest.skip("mpirun not found")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = [mpiexec, "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp", "-np", str(np_),
           sys.executable, os.path.join(HERE, script), *args]
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
