"""Mistake: two stages per rank written in for the interleaved schedule, whatever v is
(exercise 6): a schedule given the wrong number of stages per rank.

Right for v = 2 (and for DualPipe-V); with v = 3 each rank holds 3 stages (c p + r for c = 0,
1, 2) and torch's table names a stage the rank never built. Replaces torch_pipeline_step.
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
    "check_torch_pipeline": "a schedule given the wrong number of stages per rank",
}
CLASSES = {"1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B,
           "zb_h1": ScheduleInterleavedZeroBubble, "dualpipe_v": ScheduleDualPipeV}


def torch_pipeline_step(name, model, x, y, m, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = 2 if name in ("interleaved_1f1b", "dualpipe_v") else 1  # 2, not v
    k = len(model) // (p * v)
    if name == "dualpipe_v":
        ids = [v_stage_of(rank, c, p) for c in (0, 1)]  # noqa: F821
    else:
        ids = [stage_of(rank, c, p) for c in range(chunks)]  # noqa: F821
    layers = [list(range(s * k, (s + 1) * k)) for s in ids]
    stages = [PipelineStage(nn.Sequential(*[model[i] for i in ix]), s, p * v, x.device)
              for s, ix in zip(ids, layers, strict=True)]
    cls = CLASSES[name]
    schedule = cls(stages[0] if cls is Schedule1F1B else stages, m, loss_fn=F.mse_loss)
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    losses = []
    schedule.step(*([x] if first else []), **({"target": y, "losses": losses} if last else {}))
    return torch.stack(losses).detach().mean().item() if last else None
