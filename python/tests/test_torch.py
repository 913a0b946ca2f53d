"""PyTorch: tensors through DLPack, and the DDP communication hook (thc.torch).

Skipped, with the reason printed (pytest -rs), where torch is not installed (Debian:
python3-torch, CPU); CUDA tensors only where torch sees a GPU and libthc has CUDA."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import thc
from conftest import mpirun, run_ranks, values


def test_thc_torch_needs_torch():
    """import thc.torch is an ImportError, not a broken module, without torch."""
    code = "import sys; sys.modules['torch'] = None\ntry:\n import thc.torch\nexcept ImportError:\n print('ImportError')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "ImportError", r.stdout + r.stderr


torch = pytest.importorskip("torch", reason="torch is not installed (Debian 12: apt-get install python3-torch)")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_cpu_tensors_through_dlpack(dtype):
    dt = getattr(torch, dtype)
    g = thc.InprocGroup(2)
    xs = [torch.from_numpy(np.random.default_rng(300 + r).standard_normal(20000).astype(np.float32)).to(dt)
          for r in range(2)]
    exact = (xs[0].double() + xs[1].double()) / 2

    def rank(r):
        with thc.Comm.inproc(g, r, seed=1) as c:
            out = torch.empty_like(xs[r])
            c.allreduce(xs[r], out, op="avg")
            y = xs[r].clone()
            assert c.allreduce(y, op="avg") is y
            return out, y

    res = values(run_ranks(2, rank))
    for out, y in res:
        assert out.dtype == dt and torch.equal(out, res[0][0]) and torch.equal(y, res[0][1])
        for t in (out, y):
            assert float((t.double() - exact).norm() / exact.norm()) < 0.3


def test_tensor_errors():
    c = thc.Comm.inproc(thc.InprocGroup(1), 0)
    with pytest.raises(thc.DtypeError):
        c.allreduce(torch.zeros(64, dtype=torch.int64))
    with pytest.raises(thc.ArrayError, match="C-contiguous"):
        c.allreduce(torch.zeros(8, 8).t())
    c.close()


def test_cuda_tensor_through_dlpack():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    if not thc._thc.HAVE_CUDA:
        pytest.skip("libthc was built without CUDA")
    g = thc.InprocGroup(2)
    xs = [torch.randn(50000, generator=torch.Generator().manual_seed(r)).cuda() for r in range(2)]
    exact = ((xs[0] + xs[1]) / 2).double().cpu()

    def rank(r):
        with thc.Comm.inproc(g, r, seed=1) as c:
            out = torch.empty_like(xs[r])
            torch.cuda.synchronize()
            c.allreduce(xs[r], out, op="avg")
            return out.cpu()

    res = values(run_ranks(2, rank))
    assert torch.equal(res[0], res[1])
    assert float((res[0].double() - exact).norm() / exact.norm()) < 0.3


def test_cuda_group_reduce_scatter_and_allgather_give_the_cpu_bits():
    """Groups and shards of CUDA tensors run the device codec; the results are the CPU call's
    (the kernels are bit-identical to the host codec; dyadic values make both preludes exact)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch")
    if not thc._thc.HAVE_CUDA:
        pytest.skip("libthc was built without CUDA")

    def dyadic(n, seed):
        return torch.randint(-128, 129, (n,), generator=torch.Generator().manual_seed(seed)).float() / 64

    def rank(r, device):
        with thc.Comm.inproc(g, r, seed=3) as c:
            xs = [dyadic(5000, 10 * r).to(device), dyadic(70000, 10 * r + 1).half().to(device)]
            c.allreduce_group(xs)
            whole = dyadic(9001, 10 * r + 2).to(device)
            shard = c.reduce_scatter(whole)
            gathered = c.allgather(dyadic(3000, 10 * r + 3).to(device))
            return [t.cpu() for t in xs + [shard, gathered]]

    for dev in ("cpu", "cuda"):
        g = thc.InprocGroup(2)
        got = values(run_ranks(2, lambda r: rank(r, dev)))
        if dev == "cpu":
            want = got
        else:
            for r in range(2):
                for a, b in zip(want[r], got[r]):
                    assert a.dtype == b.dtype and torch.equal(a, b)


def test_shards_of_a_torch_tensor_allocate_a_torch_out():
    g = thc.InprocGroup(2)

    xs = [torch.randn(1001, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    ys = [torch.randn(700, generator=torch.Generator().manual_seed(10 + r)) for r in range(2)]

    def rank(r):
        with thc.Comm.inproc(g, r, seed=3) as c:
            return c.reduce_scatter(xs[r]), c.allgather(ys[r])

    def rel(got, want):
        return float((got.double() - want.double()).norm() / want.double().norm())

    res = values(run_ranks(2, rank))
    whole = xs[0] + xs[1]
    for r in range(2):
        shard, gathered = res[r]
        assert isinstance(shard, torch.Tensor) and shard.shape == (501 - r,)
        assert isinstance(gathered, torch.Tensor) and gathered.shape == (1400,)
        assert rel(shard, whole[501 * r:501 * r + 501 - r]) < 0.3
        assert rel(gathered, torch.cat(ys)) < 0.3


def test_hook_state_checks():
    import thc.torch as tt

    c = thc.Comm.inproc(thc.InprocGroup(1), 0)
    with pytest.raises(thc.InvalidArgumentError):
        tt.HookState(object())
    with pytest.raises(thc.InvalidArgumentError, match="scheme"):
        tt.HookState(c, scheme="zip")
    c.close()


def test_ddp_hook_under_mpirun():
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (Debian: python3-mpi4py)")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo process group")
    r = mpirun(2, "ddp_worker.py", timeout=300)
    assert r.returncode == 0, r.stdout
    assert "ok ddp" in r.stdout, r.stdout
    print(r.stdout.strip().splitlines()[-1])


def test_ddp_hook_on_ucx_as_torchrun_starts_it():
    """No MPI: two processes with torchrun's environment, gloo for DDP, thc over UCX for the hook."""
    import os
    import socket

    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo process group")
    if not thc._thc.HAVE_UCX:
        pytest.skip("this libthc was built without UCX")
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    here = os.path.dirname(os.path.abspath(__file__))
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(ports[0]), THC_UCX_PORT=str(ports[1]))
        procs.append(subprocess.Popen([sys.executable, os.path.join(here, "ddp_ucx_worker.py")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o
    assert "ok ddp ucx" in outs[0], outs[0]
    print(outs[0].strip().splitlines()[-1])
