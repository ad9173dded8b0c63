"""Mistake: only the rank holding the last stage gives its schedule the loss_fn (exercise 6),
"since only it computes a loss".

The loss_fn is what tells a schedule to run a backward: the other ranks run forward only and
never take the gradients the last rank sends back, a deadlock (torch itself never says why).
Replaces torch_pipeline_step.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

CAUGHT_BY = {
    "check_torch_pipeline": "every rank's schedule needs the loss_fn",
}


def torch_pipeline_step(name, model, x, y, m, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    layers = layers_of(rank, len(model), p, v)  # noqa: F821
    ids = [stage_of(rank, c, p) for c in range(v)]  # noqa: F821
    stages = [PipelineStage(nn.Sequential(*[model[i] for i in ix]), s, p * v, x.device)
              for s, ix in zip(ids, layers, strict=True)]
    last = stages[-1].is_last
    schedule = Schedule1F1B(stages[0], m, loss_fn=F.mse_loss if last else None)
    losses = []
    if rank == 0:
        schedule.step(x)
    elif last:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    return torch.stack(losses).detach().mean().item() if last else None
