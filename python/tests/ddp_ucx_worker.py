"""Started by test_torch.py the way torchrun starts a job: RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in the environment, no MPI anywhere. DDP over a gloo process group with
thc.torch.ddp_hook on a thc.Comm.ucx() communicator (everything from the environment: rendezvous
at MASTER_ADDR, port THC_UCX_PORT). Every step: the gradient DDP hands back is identical on every rank, close to the
exact mean of the ranks' local gradients (computed apart over gloo), and not this rank's own.
Prints "ok ddp ucx" on rank 0; a failed check exits non-zero."""

from __future__ import annotations

import copy
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import thc
import thc.torch

RANK, SIZE = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1) for p in model.parameters()]).double()


def main() -> int:
    dist.init_process_group("gloo")  # env://, as under torchrun
    # Rank, size and rendezvous from the launcher's environment (MASTER_ADDR, THC_UCX_PORT).
    with thc.Comm.ucx(seed=1) as comm:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 8))
        local = copy.deepcopy(model)
        ddp = DDP(model, bucket_cap_mb=0.05)
        thc.torch.register(ddp, comm, error_feedback=False)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.02)
        g = torch.Generator().manual_seed(100 + RANK)
        x = torch.randn(128, 32, generator=g)
        y = torch.randint(0, 4, (128,), generator=g) + 4 * (RANK % 2)
        for step in range(4):
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            local.load_state_dict(model.state_dict())
            local.zero_grad()
            F.cross_entropy(local(x), y).backward()
            mine = flat_grads(local)
            exact = mine.clone()
            dist.all_reduce(exact)
            exact /= SIZE
            got = flat_grads(model)
            first = got.clone()
            dist.broadcast(first, 0)
            assert torch.equal(first, got), f"step {step}: ranks disagree"
            err = float((got - exact).norm() / mine.norm())
            assert err < 0.2, f"step {step}: error {err} of the local gradient's norm"
            assert float((got - mine).norm() / mine.norm()) > 3 * err, f"step {step}: the hook did not run"
            opt.step()
        calls = comm.stats().calls
        assert calls >= 4, calls
        dist.barrier()
        if RANK == 0:
            print(f"ok ddp ucx calls={calls} compression={comm.stats().compression:.1f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
