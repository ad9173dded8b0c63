"""Mistake: DualPipe-V's stages placed by the loop, stage_of(rank, c, p) = c p + r, as for
the other schedules (exercise 6).

ScheduleDualPipeV folds the pipeline in a V: rank r holds stages r and 2p - 1 - r (v_stage_of).
With the loop's stages torch's own table names stages the rank does not hold. Replaces
torch_pipeline_step.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)

CAUGHT_BY = {
    "check_torch_pipeline": "that is the looped placement, c p + r: ScheduleDualPipeV",
}
CLASSES = {"1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B,
           "zb_h1": ScheduleInterleavedZeroBubble, "dualpipe_v": ScheduleDualPipeV}


def torch_pipeline_step(name, model, x, y, m, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    ids = [stage_of(rank, c, p) for c in range(v)]  # noqa: F821  (the loop, for every schedule)
    layers = layers_of(rank, len(model), p, v)  # noqa: F821
    stages = [PipelineStage(nn.Sequential(*[model[i] for i in ix]), s, p * v, x.device)
              for s, ix in zip(ids, layers, strict=True)]
    cls = CLASSES[name]
    schedule = cls(stages[0] if cls is Schedule1F1B else stages, m, loss_fn=F.mse_loss)
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    losses = []
    schedule.step(*([x] if first else []), **({"target": y, "losses": losses} if last else {}))
    return torch.stack(losses).detach().mean().item() if last else None
