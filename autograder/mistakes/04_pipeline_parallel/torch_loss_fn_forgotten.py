"""Mistake: the schedule is built without a loss_fn (exercise 6).

torch's schedules run the backward only when they have a loss_fn; without one every rank runs
forward only (what eval() does) and no gradient is computed (the last rank then raises
"Expecting 7 losses but got 0"). Replaces torch_pipeline_step.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

CAUGHT_BY = {
    "check_torch_pipeline": "run the backward only when they have a loss_fn",
}


def torch_pipeline_step(name, model, x, y, m, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    layers = layers_of(rank, len(model), p, v)  # noqa: F821
    ids = [stage_of(rank, c, p) for c in range(v)]  # noqa: F821
    stages = [PipelineStage(nn.Sequential(*[model[i] for i in ix]), s, p * v, x.device)
              for s, ix in zip(ids, layers, strict=True)]
    schedule = Schedule1F1B(stages[0], m)  # missing: loss_fn=F.mse_loss
    losses = []
    if rank == 0:
        schedule.step(x)
    elif rank == p - 1:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    return torch.stack(losses).detach().mean().item() if rank == p - 1 else None
