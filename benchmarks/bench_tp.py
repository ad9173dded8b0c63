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
ratio parlab / DTensor (below 1: parlab faster). Then fresh ranks measure memory
(benchmarks/_memory.py): the bytes of each rank's own weight shards (their storages), and the
peak RSS of one iteration above the RSS before it, largest over ranks. The weights, and the
gradients of the iteration before, are in that baseline (an iteration frees the gradients
first and makes new ones of the same size), so the peak is what the iteration adds:
activations, their gradients and communication buffers. The row t = 1 is the unsharded MLP
on one process, for comparison.
TORCH_DISTRIBUTED_DEBUG is OFF for both (see `_table.no_debug_checks`), and the launcher's status
line is not updated at every communication call (`_table.unwatched`), as in a training job.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from _memory import mib, peak_above
from _table import (
    Table,
    agree,
    interleave,
    medians,
    ms,
    ratio,
    repeats_option,
    setting,
    unwatched,
)
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


def _both(mlp: nn.Module) -> tuple[nn.Module, nn.Module]:
    """parlab's TPMLP and DTensor's parallelized copy of the same MLP, on this rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return TPMLP.from_mlp(mlp), parallelize_module(
        copy.deepcopy(mlp), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


def _inputs() -> tuple[nn.Module, Tensor, Tensor]:
    torch.manual_seed(0)
    mlp = MLP(HIDDEN)
    return mlp, torch.randn(BATCH, SEQ, HIDDEN), torch.randn(BATCH, SEQ, HIDDEN)


def tp_worker(repeats: int) -> dict:
    """In each rank: build both, check they agree, time them in turns."""
    mlp, x, dy = _inputs()
    ours, theirs = _both(mlp)
    steps = {"parlab": lambda: step(ours, x, dy), "DTensor": lambda: step(theirs, x, dy)}
    with unwatched():
        diff = difference(ours, theirs, x, dy)
        return {"diff": diff, "times": medians(interleave(steps, repeats, sync=dist.barrier,
                                                          iters=ITERS))}


def weight_bytes(model: nn.Module) -> int:
    """Bytes of this rank's weights: the storages its parameters (or their local shards) use."""
    return sum(t.untyped_storage().nbytes() for t in local_params(model).values())


def local_params(model: nn.Module) -> dict[str, Tensor]:
    from torch.distributed.tensor import DTensor

    return {name: p.to_local() if isinstance(p, DTensor) else p
            for name, p in model.named_parameters()}


def tp_memory_worker() -> dict:
    """In each rank: weight bytes and the peak memory of one iteration of each, and of the
    unsharded MLP on this process alone."""
    mlp, x, dy = _inputs()
    ours, theirs = _both(mlp)
    out = {"weights": {"parlab": weight_bytes(ours), "DTensor": weight_bytes(theirs),
                       "unsharded": weight_bytes(mlp)}}
    peaks = {}
    with unwatched():
        for name, model in (("parlab", ours), ("DTensor", theirs), ("unsharded", mlp)):
            dist.barrier()
            peaks[name] = peak_above(lambda model=model: step(model, x, dy))
    out["peak"] = peaks
    return out


def main() -> None:
    repeats = repeats_option(__doc__, default=10, debug_checks=False)
    table = Table(setting(f"TP MLP forward+backward, h={HIDDEN}, input ({BATCH}, {SEQ}, "
                          f"{HIDDEN}) float32, ms per iteration; weights MiB per rank (parlab's "
                          f"shards, DTensor's the same) and peak MiB per rank of an iteration "
                          f"(RSS above the rank's before it, largest rank)", repeats),
                  ["ranks", "parlab TPMLP ms", "DTensor ms", "parlab / DTensor",
                   "weights MiB per rank", "parlab peak MiB", "DTensor peak MiB",
                   "max rel. difference"])
    unsharded = None
    for world in (2, 4):
        results = run(tp_worker, world, repeats, timeout=600)
        times, diff = results[0]["times"], max(r["diff"] for r in results)
        memory = run(tp_memory_worker, world, timeout=600)
        weights = {r["weights"]["parlab"] for r in memory}
        if weights != {r["weights"]["DTensor"] for r in memory}:
            raise AssertionError(f"parlab's and DTensor's shards differ in size on {world} ranks")
        peak = {name: max(r["peak"][name] for r in memory) for name in memory[0]["peak"]}
        unsharded = unsharded or (memory[0]["weights"]["unsharded"], peak["unsharded"])
        table.add(world, ms(times["parlab"]), ms(times["DTensor"]),
                  ratio(times["parlab"], times["DTensor"]), mib(max(weights)),
                  mib(peak["parlab"]), mib(peak["DTensor"]), f"{diff:.1e}")
    assert unsharded is not None
    table.add("1 (unsharded MLP, one process)", "", "", "", mib(unsharded[0]), mib(unsharded[1]),
              "", "")
    table.emit("tp")


if __name__ == "__main__":
    main()
