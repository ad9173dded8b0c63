"""PyTorch given the executor's arithmetic: loss_fn = mse / m and scale_grads=False (then its
gradients equal the executor's bit for bit); the batch's loss is the sum of the m losses; the
V's layers by v_stage_of, the loop's by stage_of alone; step called in four branches."""

import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining

PASSES = ["check_torch_pipeline"]
CLASS_NAMES = {"1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B",
               "zb_h1": "ScheduleInterleavedZeroBubble", "dualpipe_v": "ScheduleDualPipeV"}


def torch_pipeline_step(name, model, x, y, m, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    place = v_stage_of if name == "dualpipe_v" else stage_of  # noqa: F821
    k = len(model) // (p * v)
    stages = []
    for c in range(v):
        s = place(rank, c, p)
        stages.append(pipelining.PipelineStage(nn.Sequential(*model[s * k:(s + 1) * k]), s,
                                               p * v, x.device))

    def loss_fn(output, target):
        return F.mse_loss(output, target) / m  # the executor's L_i / m

    cls = getattr(pipelining, CLASS_NAMES[name])
    schedule = cls(stages if name != "1f1b" else stages[0], m, loss_fn=loss_fn,
                   scale_grads=False)
    holds_first = any(s.is_first for s in stages)
    holds_last = any(s.is_last for s in stages)
    losses = []
    if holds_first and holds_last:
        schedule.step(x, target=y, losses=losses)
    elif holds_first:
        schedule.step(x)
    elif holds_last:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    if not holds_last:
        return None
    return float(sum(loss.detach() for loss in losses))  # each already divided by m
