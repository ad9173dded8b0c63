r"""The same pipelines with PyTorch's API: `torch.distributed.pipelining` on parlab's toy model.

    run = run_torch_pipeline("interleaved_1f1b", p=4, m=8, v=2)   # or several cases in one
                                                                  # launch: run_torch_pipelines
    run.executed            # what each rank ran, as parlab Actions (`parlab.pp.torch_order`)
    run.stored              # the schedule object's own table (`pipeline_order`)
    run.max_error()         # loss and gradients against one device

On each rank: the same seeded model as `parlab.pp.executor` (`make_model`), split the same
way (`build_stages`: one `PipelineStage` per chunk, an `nn.Sequential` of the model's own
layers of that stage; looped placement, or the V of DualPipe-V), one schedule object over
this rank's stages (`make_torch_schedule`) and one `step` (`torch_step`): the whole batch
goes in on the rank of stage 0, the targets on the rank of the last stage, the schedule cuts
both into m micro-batches.

The loss. torch computes `loss_fn` per micro-batch and, with `scale_grads=True` (its default),
divides the summed gradients by m once, after the last backward. parlab's executor divides
each micro-batch's loss by m instead. Both give the batch's gradients; they round differently
unless m is a power of two. `scale_grads=False` here gives torch the executor's way,
`loss_fn = mse / m` and no division at the end: the same additions in the same order, so the
gradients are bit-identical to `run_pipeline`'s (1F1B, interleaved 1F1B, ZB-H1 and DualPipe-V
on 2 to 4 ranks: tests/test_pp_torch.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from parlab import comm, launch
from parlab.pp.actions import Action, PlacedSchedule, Schedule, placed_stage
from parlab.pp.model import make_data, make_model, reference, stage_layers
from parlab.pp.torch_order import (
    executed_actions,
    recording,
    stored_actions,
    torch_name,
)

__all__ = ["TorchRun", "build_stages", "make_torch_schedule", "torch_step", "torch_worker",
           "run_torch_pipeline", "run_torch_pipelines", "scaled_mse"]


def scaled_mse(m: int) -> Callable[[Tensor, Tensor], Tensor]:
    """The executor's micro-batch loss: mean-squared error / m (a picklable function)."""
    return functools.partial(_scaled_mse, m=m)


def _scaled_mse(output: Tensor, target: Tensor, *, m: int) -> Tensor:
    return F.mse_loss(output, target) / m


def build_stages(name: str, model: nn.Sequential, p: int, v: int, *, rank: int,
                 device: torch.device) -> list[Any]:
    """This rank's PipelineStages for schedule `name`, chunk 0 first: stage
    placed_stage(rank, c, p) of p v, each the model's own layers of that stage."""
    from torch.distributed.pipelining import PipelineStage

    spec = torch_name(name)
    v = 2 if spec.placement == "v" else v
    stages = []
    for c in range(v):
        s = placed_stage(rank, c, p, spec.placement)
        layers = nn.Sequential(*[model[i] for i in stage_layers(s, len(model), p * v)])
        stages.append(PipelineStage(layers, s, p * v, device))
    return stages


def make_torch_schedule(name: str, stages: Sequence[Any], m: int, *,
                        scale_grads: bool = False) -> Any:
    """torch's schedule object for `name` over this rank's stages; see the module docstring
    for `scale_grads` (False: the loss divided by m, as parlab's executor does)."""
    import torch.distributed.pipelining as pipelining

    spec = torch_name(name)
    cls = getattr(pipelining, spec.cls)
    loss_fn = F.mse_loss if scale_grads else scaled_mse(m)
    return cls(list(stages) if spec.multi else stages[0], m, loss_fn=loss_fn,
               scale_grads=scale_grads)


def torch_step(schedule: Any, stages: Sequence[Any], x: Tensor, y: Tensor) -> float | None:
    """One step; the batch loss on the rank holding the last stage, else None."""
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    losses: list[Tensor] = []
    schedule.step(*((x,) if first else ()), **({"target": y, "losses": losses} if last else {}))
    if not last:
        return None
    total = float(sum(loss.detach() for loss in losses))
    return total / len(losses) if schedule.scale_grads else total


def torch_worker(name: str, m: int, v: int, options: dict) -> dict:
    """In each rank: build the model, its stages and the schedule, run one step while
    recording what ran; return it with the loss, the gradients and the bytes sent. With
    options["warm"] = True a first step runs untraced (torch exchanges shapes then), and the
    second, on zeroed gradients, is the one recorded."""
    import torch.distributed as dist

    rank, p = dist.get_rank(), dist.get_world_size()
    device = launch.device()
    opts = dict(options)
    scale_grads = bool(opts.pop("scale_grads", False))
    width, batch = opts["width"], opts["batch"]
    model = make_model(opts["n_layers"], width, seed=opts["seed"], dtype=opts["dtype"]).to(device)
    x, y = (t.to(device) for t in make_data(batch, width, seed=opts["seed"], dtype=opts["dtype"]))
    stages = build_stages(name, model, p, v, rank=rank, device=device)
    schedule = make_torch_schedule(name, stages, m, scale_grads=scale_grads)
    first: float = 0.0
    if opts.get("warm"):
        with comm.trace() as tr:
            torch_step(schedule, stages, x, y)
        first = tr.wire_bytes()
        model.zero_grad(set_to_none=True)
    with recording() as calls, comm.trace() as tr:
        loss = torch_step(schedule, stages, x, y)
    grads = {n: q.grad.detach().cpu().clone() for n, q in model.named_parameters()
             if q.grad is not None}
    return {"executed": executed_actions(calls, p, name), "calls": [str(c) for c in calls],
            "stored": stored_actions(schedule, p, name)[rank], "loss": loss, "grads": grads,
            "sent": tr.wire_bytes(), "first": first or tr.wire_bytes(),
            "messages": tr.count("isend") + tr.count("send")}


def _cases_worker(cases: list[tuple[str, int, int, dict]]) -> list[dict]:
    return [torch_worker(*case) for case in cases]


@dataclass
class TorchRun:
    """One step of torch's schedule `name` on p ranks, beside the single-device reference."""

    name: str
    executed: Schedule  # what each rank ran (parlab Actions; a PlacedSchedule for the V)
    stored: Schedule  # the schedule object's own `pipeline_order`, rank by rank
    calls: list[list[str]]  # the same as `executed`, in torch's notation ("2F0", "1I3")
    loss: float
    grads: dict[str, Tensor]
    reference_loss: float
    reference_grads: dict[str, Tensor]
    sent: list[float] = field(default_factory=list)  # bytes each rank sent in the step
    messages: list[int] = field(default_factory=list)  # point-to-point sends per rank
    first: list[float] = field(default_factory=list)  # bytes of the first step: with the
    # shapes torch exchanges before it (equal to `sent` unless run with warm=True)

    def max_error(self) -> float:
        """Largest relative difference from one device over the loss and the gradients."""
        worst = abs(self.loss - self.reference_loss) / abs(self.reference_loss)
        for n, ref in self.reference_grads.items():
            got = self.grads.get(n)
            if got is None:
                return float("inf")
            worst = max(worst, float((got - ref).abs().max() / ref.abs().max()))
        return worst


def _options(p: int, m: int, v: int, n_layers: int | None, rows: int, **rest: Any) -> dict:
    return {"n_layers": 2 * p * v if n_layers is None else n_layers, "batch": rows * m, **rest}


def run_torch_pipelines(p: int, cases: Sequence[tuple[str, int, int]], *,
                        n_layers: int | None = None, width: int = 16, rows: int = 2,
                        seed: int = 0,
                        dtype: torch.dtype = torch.float64, scale_grads: bool = False,
                        warm: bool = False, backend: str | None = None,
                        timeout: float = 60.0) -> list[TorchRun]:
    """One step of torch's schedule for each case (name, m, v), one after the other on the
    same p ranks (one launch): n_layers (default 2 per stage) of `width`, m micro-batches of
    `rows`, float64 by default.
    warm: a first, untraced step before the recorded one (see `torch_worker`)."""
    jobs = []
    for name, m, v in cases:
        v = 2 if torch_name(name).placement == "v" else v
        jobs.append((name, m, v, _options(p, m, v, n_layers, rows, width=width, seed=seed,
                                           dtype=dtype, scale_grads=scale_grads, warm=warm)))
    results = launch.run(_cases_worker, p, jobs, backend=backend, timeout=timeout)
    return [_assemble(name, opts, [res[k] for res in results])
            for k, (name, _, _, opts) in enumerate(jobs)]


def run_torch_pipeline(name: str, p: int, m: int, v: int = 1, **options: Any) -> TorchRun:
    """`run_torch_pipelines` for one case."""
    return run_torch_pipelines(p, [(name, m, v)], **options)[0]


def _assemble(name: str, opts: dict, results: list[dict]) -> TorchRun:
    grads: dict[str, Tensor] = {}
    for res in results:
        grads.update(res["grads"])
    loss = next(res["loss"] for res in results if res["loss"] is not None)
    n, width, batch, seed, dtype = (opts[k] for k in ("n_layers", "width", "batch", "seed",
                                                      "dtype"))
    ref_loss, ref_grads = reference(make_model(n, width, seed=seed, dtype=dtype),
                                    *make_data(batch, width, seed=seed, dtype=dtype))

    def table(rows: list[list[Action]]) -> Schedule:
        return PlacedSchedule(rows, placement="v") if torch_name(name).placement == "v" else rows

    return TorchRun(name, table([res["executed"] for res in results]),
                    table([res["stored"] for res in results]),
                    [res["calls"] for res in results], loss, grads, ref_loss, ref_grads,
                    [res["sent"] for res in results], [res["messages"] for res in results],
                    [res["first"] for res in results])
