"""Mistake: the stages and the schedule are built, and the schedule never stepped (exercise 6):
the function returns as if building the schedule ran it.

Nothing runs: no forward, no backward, no gradient. Replaces torch_pipeline_step.
"""

import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

CAUGHT_BY = {
    "check_torch_pipeline": "returned without calling step() on a schedule",
}


def torch_pipeline_step(name, model, x, y, m, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    layers = layers_of(rank, len(model), p, v)  # noqa: F821
    ids = [stage_of(rank, c, p) for c in range(v)]  # noqa: F821
    stages = [PipelineStage(nn.Sequential(*[model[i] for i in ix]), s, p * v, x.device)
              for s, ix in zip(ids, layers, strict=True)]
    Schedule1F1B(stages[0], m, loss_fn=F.mse_loss)  # built, never stepped
    return None
