"""Each stage a deep copy of its layers (torchtitan copies the model and drops what a stage
does not hold), given its shapes up front (input_args and output_args: one micro-batch, static
mode, requires_grad where a gradient must flow); the loss returned as a 0-d tensor."""

import copy

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

PASSES = ["check_torch_pipeline"]


def torch_pipeline_step(name, model, x, y, m, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    n = len(model)
    if name == "dualpipe_v":
        chunks = [(v_stage_of(rank, c, p), None) for c in range(2)]  # noqa: F821
        k = n // (2 * p)
        chunks = [(s, list(range(s * k, (s + 1) * k))) for s, _ in chunks]
    else:
        chunks = [(stage_of(rank, c, p), ix)  # noqa: F821
                  for c, ix in enumerate(layers_of(rank, n, p, v))]  # noqa: F821
    rows, width = x.shape[0] // m, x.shape[1]
    stages = []
    for s, ix in chunks:
        example_in = torch.empty(rows, width, dtype=x.dtype, device=x.device,
                                 requires_grad=s > 0)
        example_out = torch.empty(rows, width, dtype=x.dtype, device=x.device,
                                  requires_grad=True)
        layers = nn.Sequential(*[copy.deepcopy(model[i]) for i in ix])
        stages.append(PipelineStage(layers, s, p * v, x.device, input_args=example_in,
                                    output_args=example_out))
    if name == "1f1b":
        schedule = Schedule1F1B(stages[0], m, loss_fn=F.mse_loss)
    else:
        cls = {"interleaved_1f1b": ScheduleInterleaved1F1B,
               "zb_h1": ScheduleInterleavedZeroBubble, "dualpipe_v": ScheduleDualPipeV}[name]
        schedule = cls(stages, m, loss_fn=F.mse_loss)
    losses = []
    args = (x,) if stages[0].is_first else ()
    kwargs = {"target": y, "losses": losses} if any(s.is_last for s in stages) else {}
    schedule.step(*args, **kwargs)
    return torch.stack([loss.detach() for loss in losses]).mean() if losses else None
