"""Mistake: PipelineStage's num_stages given the number of ranks, p, instead of the number
of stages, p v (exercise 6).

Right for v = 1; with v = 2 stage 2p - 1 is out of range for torch, and the stage indices no
longer name the pipeline's stages. Replaces torch_pipeline_step.
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
    "check_torch_pipeline": "num_stages counts stages, not ranks",
}
CLASSES = {"1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B,
           "zb_h1": ScheduleInterleavedZeroBubble, "dualpipe_v": ScheduleDualPipeV}


def torch_pipeline_step(name, model, x, y, m, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    if name == "dualpipe_v":
        k = len(model) // (2 * p)
        ids = [v_stage_of(rank, c, p) for c in (0, 1)]  # noqa: F821
        layers = [list(range(s * k, (s + 1) * k)) for s in ids]
    else:
        ids = [stage_of(rank, c, p) for c in range(v)]  # noqa: F821
        layers = layers_of(rank, len(model), p, v)  # noqa: F821
    stages = [PipelineStage(nn.Sequential(*[model[i] for i in ix]), s, p, x.device)
              for s, ix in zip(ids, layers, strict=True)]
    cls = CLASSES[name]
    schedule = cls(stages[0] if cls is Schedule1F1B else stages, m, loss_fn=F.mse_loss)
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    losses = []
    schedule.step(*([x] if first else []), **({"target": y, "losses": losses} if last else {}))
    return torch.stack(losses).detach().mean().item() if last else None
