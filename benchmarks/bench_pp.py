"""Pipeline step with 1F1B: parlab's executor against torch.distributed.pipelining.

    make bench        or        .venv/bin/python benchmarks/bench_pp.py [--repeats 10]

On p = 2 and 4 gloo ranks (parlab.launch.run) every rank builds the same seeded stack of
LAYERS Linear+tanh layers (`parlab.pp.make_model`) and keeps its stage, LAYERS / p
consecutive layers, twice: once in a `parlab.pp.StageContext` run by `execute` with
`make_schedule("1f1b", p, m)`, once in a torch `PipelineStage` run by `Schedule1F1B`. A step
is one batch of (BATCH, WIDTH) float32 in m microbatches, mean-squared-error loss, forward and
backward (gradients accumulated over the microbatches, scaled by 1/m in both). First the two
must give the same loss and the same gradients within 1e-5 (relative); then they take turns
(benchmarks/_table.py) and rank 0 reports the median step time and the ratio parlab / torch.

TORCH_DISTRIBUTED_DEBUG is OFF for both (see `_table.no_debug_checks`), as in a training job.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _table import Table, agree, interleave, medians, ms, ratio, repeats_option, setting
from torch import Tensor, nn

from parlab.launch import run
from parlab.pp import StageContext, execute, make_context, make_data, make_schedule

LAYERS, WIDTH, BATCH, MICROBATCHES = 8, 1024, 128, 8
DTYPE = torch.float32
TOLERANCE = 1e-5


def parlab_step(ctx: StageContext, schedule: list) -> float | None:
    """One 1F1B step of parlab's executor; the loss on the last rank, else None."""
    ctx.stage.zero_grad(set_to_none=True)
    ctx.losses.clear()
    execute(schedule, ctx)
    return float(sum(ctx.losses)) if ctx.is_last else None


def torch_step(schedule: object, stage: nn.Module, data: tuple[Tensor, Tensor]) -> float | None:
    """One step of torch's Schedule1F1B; the loss (mean over microbatches) on the last rank."""
    rank, p = dist.get_rank(), dist.get_world_size()
    stage.zero_grad(set_to_none=True)
    if rank == 0:
        schedule.step(data[0])
        return None
    if rank < p - 1:
        schedule.step()
        return None
    losses: list = []
    schedule.step(target=data[1], losses=losses)
    return float(sum(loss.detach() for loss in losses)) / MICROBATCHES


def difference(ours: nn.Module, theirs: nn.Module, losses: tuple) -> float:
    """Largest relative difference over the loss and this stage's gradients; raises above
    TOLERANCE."""
    pairs = [(a.grad, b.grad) for a, b in zip(ours.parameters(), theirs.parameters(),
                                                strict=True)]
    if losses[0] is not None:
        pairs.append((torch.tensor(losses[0]), torch.tensor(losses[1])))
    return agree(pairs, TOLERANCE)


def pp_worker(repeats: int) -> dict:
    """In each rank: build both pipelines from the same stage, check, time them in turns."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank, p = dist.get_rank(), dist.get_world_size()
    ctx, _ = make_context(p, MICROBATCHES, 1, n_layers=LAYERS, width=WIDTH, batch=BATCH,
                          dtype=DTYPE)
    schedule = make_schedule("1f1b", p, MICROBATCHES)
    data = make_data(BATCH, WIDTH, dtype=DTYPE)
    theirs = copy.deepcopy(ctx.stage)
    pipe = Schedule1F1B(PipelineStage(theirs, rank, p, torch.device("cpu")), MICROBATCHES,
                        loss_fn=F.mse_loss)
    steps = {"parlab": lambda: parlab_step(ctx, schedule),
             "torch": lambda: torch_step(pipe, theirs, data)}
    diff = difference(ctx.stage, theirs, (steps["parlab"](), steps["torch"]()))
    return {"diff": diff, "times": medians(interleave(steps, repeats, sync=dist.barrier))}


def main() -> None:
    repeats = repeats_option(__doc__, default=10, debug_checks=False)
    table = Table(setting(f"1F1B pipeline step, {LAYERS} layers of width {WIDTH}, batch "
                          f"{BATCH} in m={MICROBATCHES} microbatches, float32, ms per step",
                          repeats),
                  ["ranks p", "parlab execute ms", "torch Schedule1F1B ms", "parlab / torch",
                   "max rel. difference"])
    for p in (2, 4):
        results = run(pp_worker, p, repeats, timeout=600)
        times, diff = results[0]["times"], max(r["diff"] for r in results)
        table.add(p, ms(times["parlab"]), ms(times["torch"]), ratio(times["parlab"],
                  times["torch"]), f"{diff:.1e}")
    table.emit("pp")


if __name__ == "__main__":
    main()
