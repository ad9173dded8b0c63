r"""Run a schedule on p real ranks and compare it with one device and with the simulator.

    from parlab.pp import make_schedule, run_pipeline

    run = run_pipeline(make_schedule("1f1b", 4, 8), costs=(0.02, 0.04, 0.0))
    run.max_error()             # largest |pipeline - single device| over loss and gradients
    run.measured.bubble_fraction, run.predicted.bubble_fraction

Each rank builds the same seeded model, keeps its chunks (`parlab.pp.executor`), runs its list
of actions and returns its gradients and timeline. Here they are put together under the full
model's parameter names and compared with the single-device, full-batch run in float64,
where only the order of the additions differs (~1e-16 relative).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from parlab import comm, launch
from parlab.pp.actions import Schedule, placement_of
from parlab.pp.executor import StageContext, execute, make_context
from parlab.pp.model import make_data, make_model, reference
from parlab.pp.order import validate
from parlab.pp.schedules import shape_of
from parlab.pp.simulator import SimResult, Span, simulate, timeline_stats

__all__ = ["PipelineRun", "run_pipeline", "pipeline_worker", "rank_result", "measured_result"]


@dataclass
class PipelineRun:
    """One run of a schedule on real ranks, beside the single-device reference."""

    schedule: Schedule
    loss: float  # sum of the last stage's microbatch losses (each already divided by m)
    grads: dict[str, Tensor]  # full-model parameter name -> gradient
    reference_loss: float
    reference_grads: dict[str, Tensor]
    measured: SimResult  # the real timeline, seconds from the first action's start
    predicted: SimResult | None = None  # simulate() with the same costs (when costs given)
    sends: list[int] = field(default_factory=list)  # point-to-point sends per rank

    def max_error(self) -> float:
        """Largest relative difference from the reference over the loss and all gradients."""
        worst = abs(self.loss - self.reference_loss) / abs(self.reference_loss)
        for name, ref in self.reference_grads.items():
            got = self.grads.get(name)
            if got is None:
                return float("inf")
            worst = max(worst, float((got - ref).abs().max() / ref.abs().max()))
        return worst


def rank_result(ctx: StageContext, index: list[list[int]]) -> dict:
    """What a rank returns: its losses' sum and its gradients under the full model's names."""
    grads = {}
    for chunk, layers in zip(ctx.chunks, index, strict=True):
        for j, layer in enumerate(layers):
            for name, p in chunk[j].named_parameters():
                grads[f"{layer}.{name}"] = None if p.grad is None else p.grad.detach().clone()
    loss = float(sum(ctx.losses)) if ctx.losses else None
    return {"loss": loss, "grads": grads}


def pipeline_worker(schedule: Schedule, costs: tuple[float, float, float] | None,
                    options: dict, layers_of: Callable | None = None) -> dict:
    """In each rank: build the context, run the schedule, return gradients and timeline."""
    p, m, v, _ = shape_of(schedule)
    placement = options.get("placement", placement_of(schedule))
    opts = {k: val for k, val in options.items() if k != "placement"}
    ctx, index = make_context(p, m, v, layers_of=layers_of, placement=placement, **opts)
    with comm.trace() as tr:
        spans, peak = execute(schedule, ctx, costs=costs)
    out = rank_result(ctx, index)
    out.update(spans=spans, peak=peak, sends=tr.count("isend") + tr.count("send"),
               rank=dist.get_rank())
    return out


def measured_result(spans: list[list[Span]], schedule: Schedule) -> SimResult:
    """A real timeline as a SimResult (times from the earliest start, in seconds)."""
    p, m, v, split = shape_of(schedule)
    t0 = min(s.start for row in spans for s in row)
    shifted = [[Span(s.rank, s.action, s.start - t0, s.end - t0) for s in row] for row in spans]
    makespan, busy, fraction, ratio, _ = timeline_stats(shifted, v=v, split=split)
    return SimResult(shifted, makespan, busy, fraction, ratio, [], p, m, v)


def run_pipeline(schedule: Schedule, *, costs: tuple[float, float, float] | None = None,
                 n_layers: int = 8, width: int = 16, batch: int = 16, seed: int = 0,
                 dtype: torch.dtype = torch.float64, layers_of: Callable | None = None,
                 backend: str = "gloo", timeout: float = 60.0,
                 trace: str | os.PathLike | None = None,
                 placement: str | None = None) -> PipelineRun:
    """Run `schedule` on len(schedule) ranks; see the module docstring.

    costs: (t_f, t_b, t_w) seconds for a rank's whole share of layers, as in simulate; each
    action then sleeps until it has lasted its cost, so the timeline can be predicted.
    trace: a path for the run's merged profiler trace (`parlab.launch.run(..., trace=)`):
    one row per rank, each action a range named "F mb3 chunk1" (`parlab.pp.range_name`).
    backend: gloo with CPU tensors, also on a GPU box. The executor posts its receives ahead
    of its sends; NCCL runs a pair's sends and receives on one stream, where a receive posted
    early would hold up the sends behind it (not tried: NCCL needs a GPU per rank).
    placement: "looped" or "v"; default the schedule's own (`parlab.pp.placement_of`)."""
    placement = placement or placement_of(schedule)
    validate(schedule, placement=placement)
    p, m, v, split = shape_of(schedule)
    options = {"n_layers": n_layers, "width": width, "batch": batch, "seed": seed,
               "dtype": dtype, "placement": placement}
    results = launch.run(pipeline_worker, p, schedule, costs, options, layers_of,
                         backend=backend, timeout=timeout, trace=trace)
    grads: dict[str, Tensor] = {}
    for res in results:
        grads.update(res["grads"])
    loss = next(res["loss"] for res in results if res["loss"] is not None)
    model = make_model(n_layers, width, seed=seed, dtype=dtype)
    ref_loss, ref_grads = reference(model, *make_data(batch, width, seed=seed, dtype=dtype))
    measured = measured_result([res["spans"] for res in results], schedule)
    measured.peak_activations = [res["peak"] for res in results]
    predicted = None if costs is None else simulate(schedule, *costs, placement=placement)
    return PipelineRun(schedule, loss, grads, ref_loss, ref_grads, measured, predicted,
                       [res["sends"] for res in results])
