"""Run under mpirun by test_torch.py: DDP over a gloo process group with thc.torch.ddp_hook.

Every step checks the gradients DDP hands back against the exact mean of the ranks' local
gradients (computed apart with MPI): identical on every rank, close to the mean, and not the
untouched local gradient. Prints "ok ddp" on rank 0; a failed check exits non-zero."""

from __future__ import annotations

import copy
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import thc
import thc.torch

W = MPI.COMM_WORLD
RANK, SIZE = W.Get_rank(), W.Get_size()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flat_grads(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()]).numpy().astype(np.float64)


def train(comm: thc.Comm, error_feedback: bool, steps: int = 4):
    """DDP with the hook for `steps` steps; per step the gradient DDP gives back and the exact mean."""
    torch.manual_seed(0)
    # Over 1 MB of parameters: DDP's first bucket holds 1 MB, the rest go in 20 KB buckets
    # (find_unused_parameters: bucketed by size from the first iteration on).
    model = torch.nn.Sequential(torch.nn.Linear(32, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 8))
    local = copy.deepcopy(model)  # the same weights, no DDP: each rank's own gradient
    ddp = DDP(model, bucket_cap_mb=0.02, find_unused_parameters=True)
    state = thc.torch.register(ddp, comm, error_feedback=error_feedback)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.02)
    g = torch.Generator().manual_seed(100 + RANK)
    x = torch.randn(128, 32, generator=g)
    # Each rank its own classes: the ranks' gradients differ, so the mean is far from either.
    y = torch.randint(0, 4, (128,), generator=g) + 4 * (RANK % 2)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        assert not state._pending, "buckets left pending after the backward pass"
        local.load_state_dict(model.state_dict())
        local.zero_grad()
        F.cross_entropy(local(x), y).backward()
        mine = flat_grads(local)
        exact = np.empty_like(mine)
        W.Allreduce(mine, exact)
        exact /= SIZE
        got = flat_grads(model)
        first = W.bcast(got if RANK == 0 else None, root=0)
        assert np.array_equal(first, got), "ranks disagree"
        out.append((got, exact, mine, W.allreduce(float(loss), op=MPI.SUM) / SIZE))
        opt.step()
    return out, state


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main() -> int:
    port = W.bcast(free_port() if RANK == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=RANK, world_size=SIZE)
    comm = thc.Comm.from_mpi4py(W, seed=1)

    # Without error feedback every step's gradient is the compressed mean of that step. The
    # codec's error scales with what the ranks put in (their gradients, which here mostly cancel
    # in the mean), so it is measured against this rank's own gradient.
    steps, state = train(comm, error_feedback=False)
    for i, (got, exact, mine, _) in enumerate(steps):
        err = float(np.linalg.norm(got - exact) / np.linalg.norm(mine))
        assert err < 0.2, f"step {i}: error {err} of the local gradient's norm"
        # The hook ran: the gradient is the mean, not this rank's own.
        assert rel(got, mine) > 3 * err, f"step {i}: {rel(got, mine)} from the local gradient, {err} from the mean"
    calls = comm.stats().calls
    assert calls >= 2 * len(steps), calls

    # With error feedback (the default) each bucket keeps its residual: what the steps add up to
    # tracks the exact sum, and training goes down.
    steps, state = train(comm, error_feedback=True)
    total_err = float(np.linalg.norm(sum(s[0] for s in steps) - sum(s[1] for s in steps)) /
                      np.linalg.norm(sum(s[2] for s in steps)))
    assert total_err < 0.2, total_err
    assert len(state._states) >= 2, state._states
    losses = [s[3] for s in steps]
    assert losses[-1] < losses[0], losses
    W.Barrier()
    if RANK == 0:
        st = comm.stats()
        print(f"ok ddp buckets={len(state._states)} calls={st.calls} fused groups={st.groups} "
              f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    comm.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        W.Abort(1)
