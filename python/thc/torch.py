"""PyTorch DDP communication hook: gradient buckets averaged by thc instead of the process group.

Importable only where PyTorch is installed (``import thc.torch`` raises ImportError otherwise)::

    import thc, thc.torch
    from mpi4py import MPI
    comm = thc.Comm.from_mpi4py(MPI.COMM_WORLD)     # or thc.Comm.aggregator(url, rank, size, job)
    ddp = torch.nn.parallel.DistributedDataParallel(model)   # gloo (CPU) or NCCL (GPU) group
    ddp.register_comm_hook(thc.torch.HookState(comm), thc.torch.ddp_hook)

The thc communicator carries the gradients; DDP's process group still does everything else
(parameter broadcast at start, buffers). Its ranks must be the process group's, in the same
order (checked: the sizes; rank r of one must be rank r of the other). Each bucket keeps its own
error-feedback state. Buckets are allreduced nonblocking (overlapping the rest of the backward
pass, fused when started back to back). CUDA buckets go to thc's device codec (libthc_cuda)
through DLPack; the hook waits for the current stream first, as thc requires of writes to a
device buffer.
"""

from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

import thc

__all__ = ["HookState", "ddp_hook", "register"]


class HookState:
    """What :func:`ddp_hook` needs: the thc communicator, the scheme, per-bucket error feedback.

    comm: a :class:`thc.Comm` over the same ranks as DDP's process group.
    scheme: "thc" (default), "uhc", "cnat" or "dnat".
    error_feedback: keep each bucket's compression error for its next call (default True).
    process_group: DDP's group, to check that the sizes and ranks agree (default: the default group).
    """

    def __init__(self, comm: thc.Comm, *, scheme: str = "thc", error_feedback: bool = True,
                 process_group: Optional[dist.ProcessGroup] = None):
        if not isinstance(comm, thc.Comm):
            raise thc.InvalidArgumentError(f"HookState: comm must be a thc.Comm, not {type(comm).__name__}",
                                           thc.Status.INVALID_ARG)
        if dist.is_available() and dist.is_initialized():
            size = dist.get_world_size(process_group)
            rank = dist.get_rank(process_group)
            if (comm.size, comm.rank) != (size, rank):
                raise thc.InvalidArgumentError(
                    f"HookState: the thc communicator is rank {comm.rank} of {comm.size}, the process group "
                    f"rank {rank} of {size}: they must be the same ranks", thc.Status.INVALID_ARG)
        thc._lookup(thc.SCHEMES, scheme, "scheme")  # a bad scheme fails here, not in the backward pass
        self.comm = comm
        self.scheme = scheme
        self.error_feedback = error_feedback
        # bucket index -> (numel, device, state): DDP rebuilds its buckets after the first
        # iteration, so a bucket whose size or device changed starts a fresh residual.
        self._states: Dict[int, Tuple[int, torch.device, thc.State]] = {}
        # Buckets started this iteration, not yet completed: (request, future, buffer).
        self._pending: List[Tuple[thc.Request, torch.futures.Future, torch.Tensor]] = []

    def complete_pending(self) -> None:
        """Wait for the buckets' requests in start order and complete their futures."""
        pending, self._pending = self._pending, []
        for req, fut, buf in pending:
            try:
                req.wait()
            except thc.Error as e:
                fut.set_exception(e)
            else:
                fut.set_result(buf)

    def state_for(self, index: int, buf: torch.Tensor) -> Optional[thc.State]:
        if not self.error_feedback:
            return None
        cur = self._states.get(index)
        if cur is None or cur[0] != buf.numel() or cur[1] != buf.device:
            cur = (buf.numel(), buf.device, thc.State())
            self._states[index] = cur
        return cur[2]


def _bucket_buffer(bucket: dist.GradBucket) -> torch.Tensor:
    return bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()


# DDP checks these annotations (the objects, not strings): no `from __future__ import annotations` here.
def ddp_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradients averaged over the ranks by thc (in place).

    Each bucket's allreduce starts nonblocking (``iallreduce``) as DDP hands it over, so it runs
    on the communicator's progress thread while the backward pass computes the next buckets (and
    buckets started back to back are fused). DDP launches its buckets in index order and waits for
    their futures only after the last one has been launched (at the end of the backward pass):
    the last bucket's hook waits for every pending request and completes their futures.
    """
    buf = _bucket_buffer(bucket)
    if buf.is_cuda:
        # thc's device path reads the buffer on its own stream: the backward pass's writes first.
        torch.cuda.current_stream(buf.device).synchronize()
        fut: torch.futures.Future = torch.futures.Future(devices=[buf.device])
    else:
        fut = torch.futures.Future()
    try:
        req = state.comm.iallreduce(buf, op="avg", scheme=state.scheme, state=state.state_for(bucket.index(), buf))
    except thc.Error as e:
        fut.set_exception(e)
        return fut
    state._pending.append((req, fut, buf))
    if bucket.is_last():
        state.complete_pending()
    return fut
def register(model: "torch.nn.parallel.DistributedDataParallel", comm: thc.Comm, **kwargs) -> HookState:
    """``model.register_comm_hook(HookState(comm, **kwargs), ddp_hook)``; returns the state."""
    state = HookState(comm, process_group=getattr(model, "process_group", None), **kwargs)
    model.register_comm_hook(state, ddp_hook)
    return state
