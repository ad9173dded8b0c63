"""Mistake: PipelineStage is given the whole batch as its example input and output
(exercise 6): input_args=x, output_args=x.

With both given, torch takes the stage's shapes from them (static mode) and stops at the first
micro-batch, whose shape differs (PipeliningMetadataError). input_args and output_args describe
one micro-batch. Replaces torch_pipeline_step.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

CAUGHT_BY = {
    "check_torch_pipeline": "describe ONE micro-batch",
}


def torch_pipeline_step(name, model, x, y, m, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    layers = layers_of(rank, len(model), p, v)  # noqa: F821
    ids = [stage_of(rank, c, p) for c in range(v)]  # noqa: F821
    stages = [PipelineStage(nn.Sequential(*[model[i] for i in ix]), s, p * v, x.device,
                            input_args=x, output_args=x)
              for s, ix in zip(ids, layers, strict=True)]
    schedule = Schedule1F1B(stages[0], m, loss_fn=F.mse_loss)
    losses = []
    if rank == 0:
        schedule.step(x)
    elif rank == p - 1:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    return torch.stack(losses).detach().mean().item() if rank == p - 1 else None
