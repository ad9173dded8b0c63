r"""Train the torchtitan-style Llama on a DP × PP × TP + SP grid with PyTorch's own API.

    rep = setup_titan(LlamaConfig(), Plan(dp=2, pp=2, tp=2, sequence_parallel=True), lr=3e-3)
    losses = [titan_step(rep, step, tokens) for step in range(6)]    # on each of the 8 ranks
    losses = train_titan(LlamaConfig(), plan, 6, lr=3e-3)             # the same, in one call

The same run as `parlab.compose.train`, built the way torchtitan builds it:

1. one `DeviceMesh` (dp, pp, tp) (`world_mesh`);
2. the model split for the pipeline first (`split_stage`: this rank's stage of
   `parlab.compose.split_layers`, module 04's balancing), wrapped in a `PipelineStage` whose
   group is `mesh["pp"]`'s, then parallelized in place (`parallelize_llama`: TP + SP,
   FSDP2), as torchtitan's `pipeline_llm` does;
3. a schedule of `torch.distributed.pipelining` over the stage (`Schedule1F1B` or
   `ScheduleGPipe`, one stage per rank) with `loss_fn` the mean cross-entropy of a
   micro-batch; torch divides the summed gradients by m after the last backward
   (`scale_grads=True`), so a replica's gradient is that of its mean loss; FSDP2 averages
   over dp in its reduce-scatter, which the stage runs after the last micro-batch's backward
   only (`set_requires_gradient_sync`);
4. `loss_parallel()` around the step when tp > 1: the head's logits stay sharded over the
   vocabulary and the cross-entropy is computed from the shards; its backward must run in
   the same context, and the schedule runs every backward inside `step`;
5. a tied head: `sync_tied` adds the gradients of the embedding and of the head's copy (on
   one rank, or over the group of the first and last pipeline stage), Megatron's embedding
   sum, which torchtitan's untied Llama 3 does not need;
6. the optimizer (AdamW by default) steps the DTensor parameters; the loss of a step is the
   last stage's mean over micro-batches, summed over the pipeline and averaged over dp.

Each rank takes its replica's rows of the global batch (`parlab.model.batch`, a function of
the step alone), as `parlab.compose` does, so the two runs see the same data.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from parlab import launch
from parlab.compose.stage import split_layers
from parlab.compose.titan.model import TitanLlama, split_stage
from parlab.compose.titan.names import single_name
from parlab.compose.titan.parallelize import parallelize_llama, world_mesh
from parlab.compose.train import Plan, check_plan
from parlab.model.corpus import batch, load_corpus
from parlab.model.llama import LlamaConfig
from parlab.pp.torch_order import torch_name

__all__ = ["TitanReplica", "check_titan_plan", "build_schedule", "setup_titan", "sync_tied",
           "titan_step", "train_titan", "full_grads", "rows_of", "micro_loss", "step_context"]

Optimizer = Callable[..., torch.optim.Optimizer]
Parallelize = Callable[[TitanLlama, Any, Plan], TitanLlama]


@dataclass
class TitanReplica:
    """What one rank holds while it trains the torchtitan-style model."""

    cfg: LlamaConfig
    plan: Plan
    mesh: Any  # DeviceMesh (dp, pp, tp)
    part: TitanLlama  # this rank's pipeline stage, parallelized in place
    stage: Any  # its PipelineStage
    schedule: Any  # the pipelining schedule over it
    optimizer: torch.optim.Optimizer
    device: torch.device
    tied_group: dist.ProcessGroup | None  # first and last stage of this pipeline (pp > 1)


def check_titan_plan(cfg: LlamaConfig, plan: Plan, *, world_size: int | None = None) -> None:
    """Raise ValueError saying what to change when the torchtitan-style build cannot run
    this plan (the composed run's own conditions first)."""
    check_plan(cfg, plan, world_size=world_size)
    unsupported = [f"{a}={getattr(plan, a)}" for a in ("cp", "ep", "virtual")
                   if getattr(plan, a) != 1]
    if unsupported or plan.distributed_optimizer:
        raise ValueError("the torchtitan-style build runs DP × PP × TP + SP only ("
                         + ", ".join(unsupported + ["distributed_optimizer=True"
                                                    if plan.distributed_optimizer else ""]
                                     ).strip(", ")
                         + " given): FSDP2 already shards the optimizer state over dp")
    if plan.tp > 1 and not plan.sequence_parallel:
        raise ValueError("torchtitan's TP plan is TP + SP: use sequence_parallel=True")
    if torch_name(plan.schedule).multi:
        raise ValueError(f"schedule {plan.schedule!r} runs several stages per rank; the "
                         "torchtitan-style build runs one: use '1f1b' or 'gpipe'")


def micro_loss(logits: Tensor, target: Tensor) -> Tensor:
    """The mean cross-entropy of one micro-batch: logits (b, T, V), target (b, T)."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def build_schedule(plan: Plan, stage: Any, microbatches: int) -> Any:
    """torch's schedule object for `plan.schedule` over this rank's one stage."""
    import torch.distributed.pipelining as pipelining

    cls = getattr(pipelining, torch_name(plan.schedule).cls)
    return cls(stage, microbatches, loss_fn=micro_loss)


def _tied_group(mesh: Any, plan: Plan, cfg: LlamaConfig) -> dist.ProcessGroup | None:
    """The group of this pipeline's first and last stage (every rank makes every group)."""
    if not cfg.tied or plan.pp == 1:
        return None
    if plan.pp == 2:
        return mesh["pp"].get_group()
    lines = mesh.mesh.permute(0, 2, 1).reshape(-1, plan.pp)  # (dp·tp, pp)
    mine = None
    for line in lines.tolist():
        group = dist.new_group([line[0], line[-1]])
        if dist.get_rank() in (line[0], line[-1]):
            mine = group
    return mine


def setup_titan(cfg: LlamaConfig, plan: Plan, *, lr: float,
                make_optimizer: Optimizer | None = None,
                parallelize: Parallelize = parallelize_llama) -> TitanReplica:
    """The mesh, this rank's stage of the seeded model parallelized, its schedule and its
    optimizer (AdamW unless `make_optimizer(params, lr=lr)` is given); every rank calls it.
    `parallelize(part, mesh, plan)` is the seam tests plant bugs in (as `parlab.compose.Parts`)."""
    from torch.distributed.pipelining import PipelineStage

    check_titan_plan(cfg, plan, world_size=dist.get_world_size())
    device = launch.device()
    mesh = world_mesh(plan)
    index = mesh.get_local_rank("pp")
    part = split_stage(TitanLlama(cfg), index, split_layers(cfg, plan.pp)).to(device)
    stage = PipelineStage(part, index, plan.pp, device, group=mesh["pp"].get_group())
    parallelize(part, mesh, plan)
    m = plan.global_batch_size // plan.dp // plan.micro_batch_size
    build = make_optimizer or torch.optim.AdamW
    return TitanReplica(cfg, plan, mesh, part, stage, build_schedule(plan, stage, m),
                        build(part.parameters(), lr=lr), device, _tied_group(mesh, plan, cfg))


def _as_param_layout(param: Any) -> Tensor:
    """param.grad laid out as param (a DTensor gradient may come back Replicate where the
    parameter is sharded: the embedding's under TP); its local tensor."""
    from torch.distributed.tensor import DTensor

    grad = param.grad
    if isinstance(grad, DTensor) and grad.placements != param.placements:
        grad = grad.redistribute(param.device_mesh, param.placements)
        param.grad = grad
    return grad.to_local() if isinstance(grad, DTensor) else grad


def sync_tied(rep: TitanReplica) -> None:
    """A tied head: embedding and head copy take the sum of both gradients (no-op untied)."""
    if not rep.cfg.tied:
        return
    part = rep.part
    copies = [m.weight for m in (part.tok_embeddings, part.output) if m is not None]
    grads = [_as_param_layout(p) for p in copies]
    if len(grads) == 2:  # both on this rank (pp = 1): add them here
        total = grads[0] + grads[1]
        for g in grads:
            g.copy_(total)
    elif grads and rep.tied_group is not None:
        dist.all_reduce(grads[0], group=rep.tied_group)


def rows_of(rep: TitanReplica) -> slice:
    """This replica's rows of every global batch (the dp coordinate's, as parlab.compose)."""
    b = rep.plan.global_batch_size // rep.plan.dp
    r = rep.mesh.get_local_rank("dp")
    return slice(r * b, (r + 1) * b)


@contextlib.contextmanager
def step_context(rep: TitanReplica) -> Iterator[None]:
    """`loss_parallel()` when the head's logits are sharded over TP, else nothing.

    FSDP2 warns that the embedding under TP returns a view (an in-place op on it would skip
    its pre-backward hook); the blocks add out of place (`h = x + ...`), so the warning is
    silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
        if rep.plan.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            with loss_parallel():
                yield
        else:
            yield


def _value(loss: Any) -> Tensor:
    from torch.distributed.tensor import DTensor

    return (loss.to_local() if isinstance(loss, DTensor) else loss).detach()


def titan_step(rep: TitanReplica, step: int, tokens: Tensor) -> float:
    """One step on global batch number `step`; the global mean loss (the same on all ranks)."""
    cfg, plan = rep.cfg, rep.plan
    x, y = batch(tokens, step, batch_size=plan.global_batch_size, seq=cfg.seq, seed=cfg.seed)
    rows = rows_of(rep)
    x, y = x[rows].to(rep.device), y[rows].to(rep.device)  # (B/dp, T): the schedule cuts m
    rep.optimizer.zero_grad(set_to_none=True)
    losses: list[Any] = []
    with step_context(rep):
        rep.schedule.step(*((x,) if rep.stage.is_first else ()),
                          **({"target": y, "losses": losses} if rep.stage.is_last else {}))
    sync_tied(rep)
    rep.optimizer.step()
    total = torch.zeros(1, device=rep.device)
    if losses:
        total += torch.stack([_value(v) for v in losses]).mean()
    dist.all_reduce(total, group=rep.mesh["pp"].get_group())  # only the last stage holds it
    dist.all_reduce(total, group=rep.mesh["dp"].get_group())
    return total.item() / plan.dp


def full_grads(rep: TitanReplica) -> dict[str, Tensor]:
    """This stage's gradients whole (`DTensor.full_tensor()`: a collective over the dp and tp
    ranks of the stage), by the single-device model's names (`names.single_name`); a tied
    head's copy under "tok.weight" as the embedding. Every rank of the mesh calls it."""
    from torch.distributed.tensor import DTensor

    # FSDP2 over TP shards a weight twice on dim 0 (_StridedShard): torch logs that gathering
    # it whole takes two all-gathers, which is what this diagnostic wants
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    out = {}
    for name, param in rep.part.named_parameters():
        grad = param.grad
        assert grad is not None, f"{name} got no gradient"
        whole = grad.full_tensor() if isinstance(grad, DTensor) else grad
        out[single_name(name, tied=rep.cfg.tied)] = whole.detach().clone()
    return out


def train_titan(cfg: LlamaConfig, plan: Plan, steps: int, *, lr: float,
                make_optimizer: Optimizer | None = None,
                parallelize: Parallelize = parallelize_llama) -> list[float]:
    """`setup_titan`, then `steps` steps; the global mean loss of each (on every rank)."""
    rep = setup_titan(cfg, plan, lr=lr, make_optimizer=make_optimizer, parallelize=parallelize)
    tokens, _ = load_corpus()
    return [titan_step(rep, step, tokens) for step in range(steps)]
