#!/usr/bin/env python3
"""Data-parallel training in NumPy + mpi4py: the same model trained twice from the same start,
once averaging gradients with MPI's float32 allreduce and once with thc (4-bit THC, error
feedback), then the test accuracy of both and the bytes each put on the wire.

    mpirun -np 4 python examples/python/train_mpi.py [--steps 600] [--bits 4] [--check]

The task: 10-class classification of 64-dimensional inputs drawn around 30 fixed random centres
(three per class); the model: an MLP 64-256-10 (19,210 parameters, one flat gradient per step, like a DDP
bucket). Every rank draws its own minibatches; seeds are fixed, so a run prints the same figures
every time. Bytes per rank: float32 is the 4 bytes per parameter each rank contributes to every
MPI_Allreduce, up and down; thc's are its counters (thc.stats): the codes this rank sends (up)
and the integer sums it receives (down). --check exits non-zero unless thc's accuracy is within
1 point of float32's, with at least 4x fewer bytes up and down together.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import thc

DIM, HIDDEN, CLASSES, CLUSTERS = 64, 256, 10, 3


def make_data(n: int, seed: int):
    """Inputs around 30 fixed random centres in 64 dimensions (unit Gaussian noise), three
    centres per class: no linear boundary separates the classes."""
    centres = np.random.default_rng(1234).standard_normal((CLASSES * CLUSTERS, DIM)) * 0.5
    r = np.random.default_rng(seed)
    cluster = r.integers(0, CLASSES * CLUSTERS, n)
    x = (centres[cluster] + r.standard_normal((n, DIM))).astype(np.float32)
    return x, cluster // CLUSTERS


class MLP:
    """64-256-10 ReLU MLP whose parameters and gradient are views of one flat float32 buffer."""

    SHAPES = [(DIM, HIDDEN), (HIDDEN,), (HIDDEN, CLASSES), (CLASSES,)]

    def __init__(self, seed: int):
        self.size = sum(int(np.prod(s)) for s in self.SHAPES)
        self.flat = np.zeros(self.size, np.float32)
        self.grad = np.zeros(self.size, np.float32)
        self.w1, self.b1, self.w2, self.b2 = self._views(self.flat)
        self.g1, self.gb1, self.g2, self.gb2 = self._views(self.grad)
        r = np.random.default_rng(seed)
        self.w1[:] = r.standard_normal(self.w1.shape) * np.sqrt(2.0 / DIM)
        self.w2[:] = r.standard_normal(self.w2.shape) * np.sqrt(1.0 / HIDDEN)

    def _views(self, buf):
        out, o = [], 0
        for s in self.SHAPES:
            n = int(np.prod(s))
            out.append(buf[o:o + n].reshape(s))
            o += n
        return out

    def logits(self, x):
        h = np.maximum(x @ self.w1 + self.b1, 0)
        return h, h @ self.w2 + self.b2

    def backward(self, x, y) -> float:
        """Fills self.grad with the mean cross-entropy gradient of the batch; returns the loss."""
        h, z = self.logits(x)
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(len(y)), y] + 1e-12).mean()
        dz = p
        dz[np.arange(len(y)), y] -= 1
        dz /= len(y)
        self.g2[:] = h.T @ dz
        self.gb2[:] = dz.sum(axis=0)
        dh = (dz @ self.w2.T) * (h > 0)
        self.g1[:] = x.T @ dh
        self.gb1[:] = dh.sum(axis=0)
        return float(loss)

    def accuracy(self, x, y) -> float:
        return float((np.argmax(self.logits(x)[1], axis=1) == y).mean())


def train(world, average, steps: int, batch: int, lr: float):
    """SGD with momentum; `average(grad)` returns the mean gradient over the ranks."""
    model = MLP(seed=7)  # the same start on every rank and for both runs
    x, y = make_data(50000, seed=100 + world.rank)  # this rank's shard of the training set
    order = np.random.default_rng(200 + world.rank)
    velocity = np.zeros_like(model.flat)
    losses = []
    for step in range(steps):
        idx = order.integers(0, len(y), batch)
        losses.append(model.backward(x[idx], y[idx]))
        g = average(model.grad)
        velocity *= 0.9
        velocity += g
        model.flat -= (lr * (0.1 if step >= steps * 3 // 4 else 1.0)) * velocity
    return model, losses


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32, help="minibatch per rank")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--bits", type=int, default=4, help="THC index bits")
    ap.add_argument("--scheme", default="thc", choices=sorted(thc.SCHEMES))
    ap.add_argument("--no-ef", action="store_true", help="thc without error feedback")
    ap.add_argument("--check", action="store_true", help="fail unless thc matches float32 with >= 4x fewer bytes")
    a = ap.parse_args()
    world = MPI.COMM_WORLD
    xt, yt = make_data(10000, seed=99)

    # float32: MPI_Allreduce of the flat gradient.
    out = np.empty(MLP(0).size, np.float32)

    def mpi_average(g):
        world.Allreduce(g, out, op=MPI.SUM)
        return out / world.size

    t0 = time.perf_counter()
    m32, l32 = train(world, mpi_average, a.steps, a.batch, a.lr)
    t32 = time.perf_counter() - t0
    f32_bytes = a.steps * m32.size * 4

    # thc: the same calls through a thc communicator over the same ranks.
    comm = thc.Comm.from_mpi4py(world, bits=a.bits, granularity=max(30, 2 ** a.bits - 1), seed=1)
    ef = None if a.no_ef else thc.State()
    res = np.empty_like(out)

    def thc_average(g):
        return comm.allreduce(g, res, op="avg", scheme=a.scheme, state=ef)

    t0 = time.perf_counter()
    mthc, lthc = train(world, thc_average, a.steps, a.batch, a.lr)
    tthc = time.perf_counter() - t0
    s = comm.stats()
    comm.close()

    acc32, accthc = m32.accuracy(xt, yt), mthc.accuracy(xt, yt)
    # The model is the same on every rank (identical averaged gradients): check it is.
    same = world.allreduce(int(np.array_equal(world.bcast(mthc.flat, root=0), mthc.flat)), op=MPI.MIN)
    up, down = f32_bytes / s.wire_bytes_up, f32_bytes / s.wire_bytes_down
    total = 2 * f32_bytes / (s.wire_bytes_up + s.wire_bytes_down)
    ok = same == 1 and s.float_bytes == f32_bytes and abs(accthc - acc32) <= 0.01 and total >= 4
    if world.rank == 0:
        label = f"thc ({a.scheme}, {a.bits}-bit{'' if ef else ', no EF'})"
        print(f"{world.size} ranks, {a.steps} steps, batch {a.batch}/rank, {m32.size} parameters")
        print(f"{'':24} {'test acc':>9} {'final loss':>11} {'bytes up/rank':>14} {'bytes down/rank':>16} {'time':>7}")
        print(f"{'float32 (MPI_Allreduce)':24} {acc32:9.4f} {np.mean(l32[-50:]):11.4f} {f32_bytes:14d} {f32_bytes:16d} "
              f"{t32:6.1f}s")
        print(f"{label:24} {accthc:9.4f} {np.mean(lthc[-50:]):11.4f} {s.wire_bytes_up:14d} {s.wire_bytes_down:16d} "
              f"{tthc:6.1f}s")
        print(f"accuracy difference {100 * (accthc - acc32):+.2f} points; {total:.2f}x fewer bytes on the wire than "
              f"float32 ({up:.2f}x up, {down:.2f}x down)")
        if a.check:
            print("check:", "ok" if ok else "FAILED")
    return 0 if (ok or not a.check) else 1


if __name__ == "__main__":
    sys.exit(main())
