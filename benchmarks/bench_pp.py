"""Pipeline steps: parlab's executor against torch.distributed.pipelining, per schedule.

    make bench        or        .venv/bin/python benchmarks/bench_pp.py [--repeats 10]

On p = 2 and 4 gloo ranks (parlab.launch.run) every rank builds the same seeded stack of
LAYERS Linear+tanh layers (`parlab.pp.make_model`) and keeps its stage, LAYERS / p
consecutive layers, twice: once in a `parlab.pp.StageContext` run by `execute` with
`make_schedule("1f1b", p, m)`, once in a torch `PipelineStage` run by `Schedule1F1B`. A step
is one batch of (BATCH, WIDTH) float32 in m microbatches, mean-squared-error loss, forward and
backward (gradients accumulated over the microbatches, scaled by 1/m in both). First the two
must give the same loss and the same gradients within 1e-5 (relative); then they take turns
(benchmarks/_table.py) and rank 0 reports the median step time and the ratio parlab / torch.

Then fresh ranks measure memory (benchmarks/_memory.py): the bytes of each rank's stage
weights, and the peak RSS of one step above the RSS before it, largest over ranks, for both
1F1B executors and for parlab's executor running GPipe (`make_schedule("gpipe", p, m)`, not
timed). The weights and the previous step's gradients are in that baseline (a step frees the
gradients first and makes new ones), so the peak is mostly the activations a stage keeps for
its backward: 1F1B lets rank r hold at most p - r microbatches of them, GPipe all m. The
executor's own count of microbatches held at once (its `peak`, largest over ranks) is shown
beside the bytes.

Then one row per schedule the course builds and torch.distributed.pipelining runs too:
1F1B, interleaved 1F1B (v = 2), ZB-H1 (torch's ScheduleInterleavedZeroBubble) and DualPipe-V
(ScheduleDualPipeV), on 2 and 4 ranks, the same LAYERS split into p v stages: parlab's
executor on `make_schedule`'s table (each rank's chunks from `make_context`) against torch's
stages and schedule object on the same split (`parlab.pp.torch_run`, the loss divided by m
and scale_grads=False, the executor's arithmetic). Both must agree (TOLERANCE), then take
turns; the bytes each side sends in one step, all ranks together, are counted by parlab.comm's
tracer after a first step (torch exchanges the stages' shapes once, before its first).

TORCH_DISTRIBUTED_DEBUG is OFF for both (see `_table.no_debug_checks`), and the launcher's status
line is not updated at every communication call (`_table.unwatched`), as in a training job.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
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
from parlab.launch import run
from parlab.pp import (
    StageContext,
    execute,
    make_context,
    make_data,
    make_model,
    make_schedule,
    torch_run,
)
from parlab.pp.torch_order import torch_name

LAYERS, WIDTH, BATCH, MICROBATCHES = 8, 1024, 128, 8
DTYPE = torch.float32
TOLERANCE = 1e-5
SCHEDULES = (("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1), ("dualpipe_v", 2))


def parlab_step(ctx: StageContext, schedule: list, held: list[float] | None = None
                ) -> float | None:
    """One step of parlab's executor; the loss on the last rank, else None. `held` gets the
    executor's count of microbatches whose activations it held at once."""
    for chunk in ctx.chunks:
        chunk.zero_grad(set_to_none=True)
    ctx.losses.clear()
    _, peak = execute(schedule, ctx)
    if held is not None:
        held.append(peak)
    return float(sum(ctx.losses)) if ctx.losses else None


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


def _pipelines() -> tuple[StageContext, nn.Module, Any, tuple[Tensor, Tensor]]:
    """This rank's stage in parlab's context, a copy in torch's Schedule1F1B, and the data."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank, p = dist.get_rank(), dist.get_world_size()
    ctx, _ = make_context(p, MICROBATCHES, 1, n_layers=LAYERS, width=WIDTH, batch=BATCH,
                          dtype=DTYPE)
    data = make_data(BATCH, WIDTH, dtype=DTYPE)
    theirs = copy.deepcopy(ctx.stage)
    pipe = Schedule1F1B(PipelineStage(theirs, rank, p, torch.device("cpu")), MICROBATCHES,
                        loss_fn=F.mse_loss)
    return ctx, theirs, pipe, data


def pp_worker(repeats: int) -> dict:
    """In each rank: build both pipelines from the same stage, check, time them in turns."""
    ctx, theirs, pipe, data = _pipelines()
    schedule = make_schedule("1f1b", dist.get_world_size(), MICROBATCHES)
    steps = {"parlab": lambda: parlab_step(ctx, schedule),
             "torch": lambda: torch_step(pipe, theirs, data)}
    with unwatched():
        diff = difference(ctx.stage, theirs, (steps["parlab"](), steps["torch"]()))
        return {"diff": diff, "times": medians(interleave(steps, repeats, sync=dist.barrier))}


def pp_memory_worker() -> dict:
    """In each rank: stage weight bytes; peak memory and microbatches held of each step."""
    ctx, theirs, pipe, data = _pipelines()
    p = dist.get_world_size()
    held: dict[str, list[float]] = {"1F1B": [], "GPipe": []}
    steps = {"parlab": lambda: parlab_step(ctx, make_schedule("1f1b", p, MICROBATCHES),
                                           held["1F1B"]),
             "torch": lambda: torch_step(pipe, theirs, data),
             "GPipe": lambda: parlab_step(ctx, make_schedule("gpipe", p, MICROBATCHES),
                                          held["GPipe"])}
    peaks = {}
    with unwatched():
        for name, fn in steps.items():
            dist.barrier()
            peaks[name] = peak_above(fn)
    weights = sum(t.untyped_storage().nbytes() for t in ctx.stage.parameters())
    return {"peak": peaks, "held": {k: max(v) for k, v in held.items()}, "weights": weights}


def schedules_worker(name: str, v: int, repeats: int) -> dict:
    """In each rank: one schedule with parlab's executor and with torch's API on the same
    split; check they agree, time them in turns, count one step's bytes."""
    rank, p = dist.get_rank(), dist.get_world_size()
    placement = torch_name(name).placement
    table = make_schedule(name, p, MICROBATCHES, 1 if name == "dualpipe_v" else v)
    ctx, index = make_context(p, MICROBATCHES, v, n_layers=LAYERS, width=WIDTH, batch=BATCH,
                              dtype=DTYPE, placement=placement)
    model = make_model(LAYERS, WIDTH, dtype=DTYPE)
    stages = torch_run.build_stages(name, model, p, v, rank=rank, device=torch.device("cpu"))
    pipe = torch_run.make_torch_schedule(name, stages, MICROBATCHES)  # loss / m, scale_grads=False
    x, y = make_data(BATCH, WIDTH, dtype=DTYPE)

    def torch_one() -> float | None:
        model.zero_grad(set_to_none=True)
        return torch_run.torch_step(pipe, stages, x, y)

    steps = {"parlab": lambda: parlab_step(ctx, table), "torch": torch_one}
    with unwatched():
        losses = (steps["parlab"](), steps["torch"]())
        ours = [q for chunk, ix in zip(ctx.chunks, index, strict=True) for j, _ in
                enumerate(ix) for q in chunk[j].parameters()]
        theirs = [q for ix in index for i in ix for q in model[i].parameters()]
        pairs = [(a.grad, b.grad) for a, b in zip(ours, theirs, strict=True)]
        if losses[0] is not None:
            pairs.append((torch.tensor(losses[0]), torch.tensor(losses[1])))
        diff = agree(pairs, TOLERANCE)
        sent = {}
        for who, step in steps.items():
            with comm.trace() as tr:
                step()
            sent[who] = tr.wire_bytes()
        times = medians(interleave(steps, repeats, sync=dist.barrier))
    return {"diff": diff, "times": times, "sent": sent}


def main() -> None:
    repeats = repeats_option(__doc__, default=10, debug_checks=False)
    table = Table(setting(f"1F1B pipeline step, {LAYERS} layers of width {WIDTH}, batch "
                          f"{BATCH} in m={MICROBATCHES} microbatches, float32, ms per step; "
                          f"stage weights MiB per rank, peak MiB per rank of a step (RSS above "
                          f"the rank's before it, largest rank) and microbatches held at once",
                          repeats),
                  ["ranks p", "parlab execute ms", "torch Schedule1F1B ms", "parlab / torch",
                   "weights MiB per rank", "parlab 1F1B peak MiB", "torch 1F1B peak MiB",
                   "parlab GPipe peak MiB", "held 1F1B / GPipe", "max rel. difference"])
    for p in (2, 4):
        results = run(pp_worker, p, repeats, timeout=600)
        times, diff = results[0]["times"], max(r["diff"] for r in results)
        memory = run(pp_memory_worker, p, timeout=600)
        peak = {name: max(r["peak"][name] for r in memory) for name in memory[0]["peak"]}
        held = {name: max(r["held"][name] for r in memory) for name in ("1F1B", "GPipe")}
        table.add(p, ms(times["parlab"]), ms(times["torch"]), ratio(times["parlab"],
                  times["torch"]), mib(max(r["weights"] for r in memory)),
                  mib(peak["parlab"]), mib(peak["torch"]), mib(peak["GPipe"]),
                  f"{held['1F1B']:g} / {held['GPipe']:g}", f"{diff:.1e}")
    table.emit("pp")
    table = Table(setting(f"pipeline step per schedule, parlab's executor against "
                          f"torch.distributed.pipelining on the same split: {LAYERS} layers of "
                          f"width {WIDTH}, batch {BATCH} in m={MICROBATCHES} microbatches, "
                          f"float32; ms per step, MiB sent in one step by all ranks (parlab.comm)",
                          repeats),
                  ["schedule", "ranks p", "torch class", "parlab ms", "torch ms",
                   "parlab / torch", "parlab MiB sent", "torch MiB sent",
                   "max rel. difference"])
    for name, v in SCHEDULES:
        for p in (2, 4):
            results = run(schedules_worker, p, name, v, repeats, timeout=600)
            times = results[0]["times"]
            sent = {who: sum(r["sent"][who] for r in results) for who in ("parlab", "torch")}
            table.add(name + (f" (v = {v})" if name == "interleaved_1f1b" else ""), p,
                      torch_name(name).cls, ms(times["parlab"]), ms(times["torch"]),
                      ratio(times["parlab"], times["torch"]), mib(sent["parlab"]),
                      mib(sent["torch"]), f"{max(r['diff'] for r in results):.1e}")
    table.emit("pp_schedules")


if __name__ == "__main__":
    main()
