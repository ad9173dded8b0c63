"""Mistake: the last stage taken to be on the last rank, p - 1, for every schedule
(exercise 6).

Right for the loop; in DualPipe-V's V rank 0 holds the last stage (2p - 1), so rank 0 steps
without the target and rank p - 1 with it. Replaces torch_pipeline_step.
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
    "check_torch_pipeline": "holds the last stage but called step() without target=",
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
    stages = [PipelineStage(nn.Sequential(*[model[i] for i in ix]), s, p * v, x.device)
              for s, ix in zip(ids, layers, strict=True)]
    cls = CLASSES[name]
    schedule = cls(stages[0] if cls is Schedule1F1B else stages, m, loss_fn=F.mse_loss)
    first = any(s.is_first for s in stages)
    last = rank == p - 1  # the loop's last rank, also for the V
    losses = []
    schedule.step(*([x] if first else []), **({"target": y, "losses": losses} if last else {}))
    return torch.stack(losses).detach().mean().item() if last else None
