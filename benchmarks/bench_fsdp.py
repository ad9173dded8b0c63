"""Fully sharded data parallelism, a training step: parlab's FSDP layer against FSDP2's fully_shard.

    make bench        or        .venv/bin/python benchmarks/bench_fsdp.py [--repeats 10]

On d = 2 and 4 gloo ranks (parlab.launch.run) every rank builds the same seeded stack of
LAYERS nn.Linear(H, H) with Tanh between, and shards it twice: each layer as
`parlab.dp.FSDPLinear` (module 01's flat-parameter layer: the flat [vec W; b] cut in d pieces)
and the stack through `parlab.dp.shard_stack` (PyTorch's `fully_shard` on each layer, then on
the root: each parameter cut by rows, Shard(0)), both with reshard_after_forward True (a layer
all-gathered again in backward) and False (kept from forward to backward). A step is a forward
and a backward of the rank's own (BATCH, H) input with a fixed output gradient; each rank
feeds its own rows. The two must first agree: output, input gradient and every whole weight
gradient (the parlab shards all-gathered, FSDP2's `full_tensor()`) within 1e-5, relative to its
largest entry. Then rank 0 reports the bytes it sent in one step (parlab.comm's tracer), the
two take turns (benchmarks/_table.py) for the median milliseconds per step and the ratio
parlab / fully_shard (below 1: parlab faster), and fresh ranks measure memory
(benchmarks/_memory.py): each rank's weight shards (their storages, FSDP2's padded rows
included) and the peak RSS of one step above the RSS before it, largest over ranks.
TORCH_DISTRIBUTED_DEBUG is OFF for both (`_table.no_debug_checks`), and the launcher's status
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

from parlab import comm
from parlab.dp import FSDPLinear, gather_flat_params, shard_stack
from parlab.launch import run

H, LAYERS, BATCH = 512, 4, 64
ITERS = 3  # steps per timed sample
TOLERANCE = 1e-5


def _stack() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(H, H), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _both(reshard: bool) -> tuple[nn.Module, nn.Module]:
    """parlab's FSDPLinear stack and fully_shard's, from the same seeded stack."""
    from torch.distributed.device_mesh import init_device_mesh

    base = _stack()
    ours = nn.Sequential(*[FSDPLinear.from_linear(m, reshard_after_forward=reshard)
                            if isinstance(m, nn.Linear) else m for m in base])
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    return ours, shard_stack(copy.deepcopy(base), mesh, [reshard] * LAYERS)


def _inputs() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(10 + dist.get_rank())
    return torch.randn(BATCH, H, generator=g), torch.randn(BATCH, H, generator=g)


def step(model: nn.Module, x: Tensor, dy: Tensor) -> tuple[Tensor, Tensor]:
    """One forward and backward; the output and the input's gradient."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    out = model(x)
    out.backward(dy)
    return out.detach(), x.grad


def whole_grads(ours: nn.Module, theirs: nn.Module) -> list[tuple[Tensor, Tensor]]:
    """(parlab's, FSDP2's) whole gradient of each layer as [vec dW; db]: collectives."""
    pairs = []
    linears = [m for m in theirs if isinstance(m, nn.Linear)]
    for mine, other in zip([m for m in ours if isinstance(m, FSDPLinear)], linears,
                           strict=True):
        flat = gather_flat_params(mine.shard.grad, numel=H * H + H)
        pairs.append((flat, torch.cat([other.weight.grad.full_tensor().flatten(),
                                       other.bias.grad.full_tensor()])))
    return pairs


def traced_bytes(model: nn.Module, x: Tensor, dy: Tensor) -> float:
    with comm.trace() as tr:
        step(model, x, dy)
    return tr.wire_bytes()


def fsdp_worker(reshard: bool, repeats: int) -> dict:
    """In each rank: build both, check they agree, count one step's bytes, time them."""
    ours, theirs = _both(reshard)
    x, dy = _inputs()
    pairs = list(zip(step(ours, x, dy), step(theirs, x, dy), strict=True))
    diff = agree(pairs + whole_grads(ours, theirs), TOLERANCE)
    sent = {"parlab": traced_bytes(ours, x, dy), "fully_shard": traced_bytes(theirs, x, dy)}
    steps = {"parlab": lambda: step(ours, x, dy), "fully_shard": lambda: step(theirs, x, dy)}
    with unwatched():
        times = medians(interleave(steps, repeats, sync=dist.barrier, iters=ITERS))
    return {"diff": diff, "sent": sent, "times": times}


def weight_bytes(model: nn.Module) -> int:
    """Bytes of this rank's weights: the storages of its shards (a DTensor's local one)."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).untyped_storage().nbytes()
               for p in model.parameters())


def fsdp_memory_worker(reshard: bool) -> dict:
    ours, theirs = _both(reshard)
    x, dy = _inputs()
    out: dict = {"weights": {"parlab": weight_bytes(ours), "fully_shard": weight_bytes(theirs)},
                 "peak": {}}
    with unwatched():
        for name, model in (("parlab", ours), ("fully_shard", theirs)):
            dist.barrier()
            out["peak"][name] = peak_above(lambda model=model: step(model, x, dy))
    return out


def main() -> None:
    repeats = repeats_option(__doc__, default=10, debug_checks=False)
    table = Table(setting(
        f"FSDP training step, {LAYERS} x nn.Linear({H}, {H}) with Tanh, input ({BATCH}, {H}) "
        "float32 per rank, ms per step; bytes rank 0 sends in a step (parlab.comm's tracer), "
        "weights KiB per rank (shard storages) and peak MiB per rank of a step (RSS above the "
        "rank's before it, largest rank)", repeats),
        ["ranks d", "reshard_after_forward", "parlab FSDPLinear ms", "fully_shard ms",
         "parlab / fully_shard", "bytes sent: parlab / fully_shard", "weights KiB per rank",
         "parlab peak MiB", "fully_shard peak MiB", "max rel. difference"])
    for world in (2, 4):
        for reshard in (True, False):
            results = run(fsdp_worker, world, reshard, repeats, timeout=600)
            times, sent = results[0]["times"], results[0]["sent"]
            memory = run(fsdp_memory_worker, world, reshard, timeout=600)
            weights = {name: max(r["weights"][name] for r in memory)
                       for name in ("parlab", "fully_shard")}
            peak = {name: max(r["peak"][name] for r in memory) for name in memory[0]["peak"]}
            table.add(world, reshard, ms(times["parlab"]), ms(times["fully_shard"]),
                      ratio(times["parlab"], times["fully_shard"]),
                      f"{sent['parlab']:,.0f} / {sent['fully_shard']:,.0f}",
                      f"{weights['parlab'] / 1024:.1f} / {weights['fully_shard'] / 1024:.1f}",
                      mib(peak["parlab"]), mib(peak["fully_shard"]),
                      f"{max(r['diff'] for r in results):.1e}")
    table.emit("fsdp")


if __name__ == "__main__":
    main()
