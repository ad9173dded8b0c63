"""Tensor-parallel MLP, forward + backward: parlab's reference layers against PyTorch's DTensor.

    make bench        or        .venv/bin/python benchmarks/bench_tp.py [--repeats 10]

On t = 2 and 4 gloo ranks (parlab.launch.run) every rank builds the same seeded MLP (hidden
h -> 4h -> h) and shards it twice: `parlab.tp.TPMLP.from_mlp` (fc1 column-parallel, fc2
row-parallel) and torch's `parallelize_module` with ColwiseParallel / RowwiseParallel on a
CPU DeviceMesh. Both do the same GEMMs on the same shards with one all-reduce forward and one
backward. An iteration is a forward and a backward of one (batch, seq, h) input with a fixed
output gradient. The two must first agree: output, input gradient and every local weight
gradient within 1e-5, relative to its largest entry. Then they take turns
(benchmarks/_table.py) and rank 0 reports the median milliseconds per iteration and the
ratio parlab / DTensor (below 1: parlab faster).
TORCH_DISTRIBUTED_DEBUG is OFF for both (see `_table.no_debug_checks`).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from _table import Table, agree, interleave, medians, ms, ratio, repeats_option, setting
from torch import Tensor, nn

from parlab.launch import run
from parlab.model import MLP
from parlab.tp import TPMLP

HIDDEN, BATCH, SEQ = 512, 4, 128
ITERS = 3  # iterations per timed sample
TOLERANCE = 1e-5


def step(model: nn.Module, x: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
    """One forward and backward; returns the output and the input's gradient."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    out = model(x)
    out.backward(dy)
    return out.detach(), x.grad


def local_grads(model: nn.Module) -> dict[str, Tensor]:
    """This rank's shard of every weight gradient (a DTensor's own part for torch's)."""
    from torch.distributed.tensor import DTensor

    return {name: p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            for name, p in model.named_parameters()}


def difference(ours: nn.Module, theirs: nn.Module, x: Tensor, dy: Tensor) -> float:
    """Largest relative difference parlab vs DTensor over the output, the input gradient and
    this rank's weight gradients; raises above TOLERANCE."""
    pairs = list(zip(step(ours, x, dy), step(theirs, x, dy), strict=True))
    a, b = local_grads(ours), local_grads(theirs)
    return agree(pairs + [(a[name], b[name]) for name in a], TOLERANCE)


def tp_worker(repeats: int) -> dict:
    """In each rank: build both, check they agree, time them in turns."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    mlp = MLP(HIDDEN)
    x, dy = torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)
    ours = TPMLP.from_mlp(mlp)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    theirs = parallelize_module(copy.deepcopy(mlp), mesh,
                                {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    diff = difference(ours, theirs, x, dy)
    steps = {"parlab": lambda: step(ours, x, dy), "DTensor": lambda: step(theirs, x, dy)}
    return {"diff": diff, "times": medians(interleave(steps, repeats, sync=dist.barrier,
                                                      iters=ITERS))}


def main() -> None:
    repeats = repeats_option(__doc__, default=10, debug_checks=False)
    table = Table(setting(f"TP MLP forward+backward, h={HIDDEN}, input ({BATCH}, {SEQ}, "
                          f"{HIDDEN}) float32, ms per iteration", repeats),
                  ["ranks", "parlab TPMLP ms", "DTensor ms", "parlab / DTensor",
                   "max rel. difference"])
    for world in (2, 4):
        results = run(tp_worker, world, repeats, timeout=600)
        times, diff = results[0]["times"], max(r["diff"] for r in results)
        table.add(world, ms(times["parlab"]), ms(times["DTensor"]),
                  ratio(times["parlab"], times["DTensor"]), f"{diff:.1e}")
    table.emit("tp")


if __name__ == "__main__":
    main()
