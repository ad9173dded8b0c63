r"""What exercise 6's check watches in a rank while the learner's torch pipeline runs.

`TorchGuard` is open around one call of the learner's `torch_pipeline_step` in a rank. It
wraps the constructors of `PipelineStage` and of torch's schedule classes, and their `step`,
so that an argument torch would trip over later (or never, computing something else) is named
before torch acts on it:

- `PipelineStage(submodule, stage_index, num_stages, device, input_args=, output_args=)`:
  num_stages must be p v; the submodule must hold the model's own layers of that stage (its
  parameters matched by value against the model the check handed over, so copies count);
  given input_args / output_args must be one micro-batch's shape.
- a schedule's constructor: the class the exercise names for the schedule; one PipelineStage
  for Schedule1F1B / ScheduleGPipe, this rank's list for the others, holding the stages this
  rank holds under the schedule's placement, chunk 0 first; n_microbatches = m.
- `step`: every rank tells every other (one all_gather_object) whether its schedule has a
  loss_fn and whether it passed the inputs and the target; a rank that differs is named on
  every rank at once, before any tensor moves (a loss_fn on one rank only would otherwise
  deadlock: that rank runs a backward, the others forward only). A second step on one rank is
  refused (gradients would add up).

While open it also records what the stages compute (`parlab.pp.torch_order.recording`).
Failures are `CheckFailed`, raised in the learner's call and passed on as they are.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from parlab.check._compare import fail
from parlab.pp.actions import placed_stage
from parlab.pp.model import stage_layers
from parlab.pp.torch_order import TorchSchedule, recording

__all__ = ["TorchGuard", "SCHEDULE_CLASSES", "expected_stages"]

SCHEDULE_CLASSES = ("Schedule1F1B", "ScheduleGPipe", "ScheduleInterleaved1F1B",
                    "ScheduleLoopedBFS", "ScheduleInterleavedZeroBubble",
                    "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
SINGLE = ("Schedule1F1B", "ScheduleGPipe")


def expected_stages(spec: TorchSchedule, rank: int, p: int, v: int) -> list[int]:
    """The stage indices rank `rank` holds, chunk 0 first."""
    return [placed_stage(rank, c, p, spec.placement) for c in range(v)]


def _shape(value: Any) -> tuple[int, ...] | None:
    first = value[0] if isinstance(value, (tuple, list)) and value else value
    return tuple(first.shape) if isinstance(first, torch.Tensor) else None


class TorchGuard:
    """See the module docstring. `model` is the model handed to the learner, `rows` and
    `width` one micro-batch's shape."""

    def __init__(self, name: str, spec: TorchSchedule, *, rank: int, p: int, m: int, v: int,
                 model: nn.Sequential, rows: int, width: int) -> None:
        self.name, self.spec, self.rank, self.p, self.m, self.v = name, spec, rank, p, m, v
        self.rows, self.width = rows, width
        self.values = {n: q.detach().clone() for n, q in model.named_parameters()}
        self.stages: list[tuple[int, list[int], dict[str, nn.Parameter]]] = []
        self.built: list[str] = []  # schedule classes built on this rank
        self.steps = 0
        self.summary: list[dict] = []  # every rank's, gathered at step
        self._saved: list[tuple[type, str, Any]] = []  # (class, method, its own or None)
        self._depth = 0
        self._recording: Any = None
        self.calls: list = []

    # --- PipelineStage ---------------------------------------------------------------------
    def _layers(self, submodule: Any, stage: int) -> tuple[list[int], dict[str, nn.Parameter]]:
        """The model's layers the submodule holds (matched by value), name -> its parameter."""
        if not isinstance(submodule, nn.Module):
            fail(f"PipelineStage of stage {stage} got a {type(submodule).__name__} as its "
                 "submodule, expected an nn.Module", rank=self.rank,
                 hint="nn.Sequential(*[model[i] for i in the stage's layers])")
        found: dict[str, nn.Parameter] = {}
        for q in submodule.parameters():
            name = next((n for n, t in self.values.items() if n not in found and t.shape ==
                         q.shape and torch.equal(t, q.detach().to(t.device))), None)
            if name is None:
                fail(f"the submodule of stage {stage} holds a parameter of shape "
                     f"{tuple(q.shape)} that is none of the model's", rank=self.rank,
                     hint="build each stage from the layers of the model the step was given "
                          "(model[i]), not from new layers")
            found[name] = q
        return sorted({int(n.split(".")[0]) for n in found}), found

    def stage_init(self, original: Callable[..., Any], obj: Any, *args: Any,
                   **kwargs: Any) -> Any:
        bound = inspect.signature(original).bind(obj, *args, **kwargs).arguments
        stage, n_stages = bound.get("stage_index"), bound.get("num_stages")
        want = self.p * self.v
        if n_stages != want:
            fail(f"PipelineStage(..., stage_index={stage}, num_stages={n_stages}): this "
                 f"pipeline has p v = {self.p} x {self.v} = {want} stages", rank=self.rank,
                 hint=f"num_stages counts stages, not ranks: p v = {want}, with v = {self.v} "
                      "stages per rank")
        if not isinstance(stage, int) or not 0 <= stage < want:
            fail(f"PipelineStage(..., stage_index={stage!r}): the stages are numbered 0 .. "
                 f"{want - 1}", rank=self.rank, hint="stage_index is the stage's place in the "
                 "whole pipeline (your stage_of / v_stage_of), not the chunk's on this rank")
        layers, params = self._layers(bound.get("submodule"), stage)
        expect = stage_layers(stage, len({n.split(".")[0] for n in self.values}), want)
        if layers != expect:
            fail(f"PipelineStage of stage {stage} holds layers {layers}, stage {stage} of "
                 f"{want} is layers {expect}", rank=self.rank,
                 hint="a stage is its own n_layers / (p v) consecutive layers (your layers_of "
                      "or v_stage_of says which), not the whole model or another stage's")
        self._examples(bound, stage)
        self.stages.append((stage, layers, params))
        return original(obj, *args, **kwargs)

    def _examples(self, bound: dict, stage: int) -> None:
        """input_args / output_args, where given: one micro-batch, and requires_grad where a
        gradient must flow (torch derives the gradients' buffers from it)."""
        micro = (self.rows, self.width)
        for arg in ("input_args", "output_args"):
            value = bound.get(arg)
            shape = _shape(value)
            if shape is None:
                continue
            if shape != micro:
                fail(f"PipelineStage(..., {arg}=...) of stage {stage} has shape {shape}; one "
                     f"micro-batch is {micro}", rank=self.rank,
                     hint="input_args and output_args describe ONE micro-batch (the batch cut "
                          f"in m = {self.m}), not the whole batch; or leave them out and torch "
                          "infers the shapes from the first micro-batch")
            first = value[0] if isinstance(value, (tuple, list)) else value
            needs = arg == "output_args" or stage > 0
            if needs and not getattr(first, "requires_grad", False):
                fail(f"PipelineStage(..., {arg}=...) of stage {stage} does not require grad",
                     rank=self.rank, hint="with input_args and output_args torch takes the "
                     "shapes from them and no longer looks (static mode): a gradient is "
                     "exchanged only for an example with requires_grad=True, so the output's "
                     "(and, after stage 0, the input's) must have it")

    # --- the schedules ---------------------------------------------------------------------
    def schedule_init(self, original: Callable[..., Any], cls_name: str, obj: Any,
                      *args: Any, **kwargs: Any) -> Any:
        if self._depth:
            return original(obj, *args, **kwargs)
        bound = inspect.signature(original).bind(obj, *args, **kwargs).arguments
        given = bound.get("stage", bound.get("stages"))
        if cls_name != self.spec.cls:
            fail(f"{cls_name} built for {self.name!r}", rank=self.rank, hint=f"torch's class "
                 f"for {self.name!r} is {self.spec.cls} (the table of the exercise)")
        if cls_name in SINGLE and isinstance(given, (list, tuple)):
            fail(f"{cls_name} was given a list of {len(given)} stages", rank=self.rank,
                 hint=f"{cls_name} runs one stage per rank: pass the PipelineStage itself; "
                      "the classes for several stages per rank take the list")
        if cls_name not in SINGLE and not isinstance(given, (list, tuple)):
            fail(f"{cls_name} was given one {type(given).__name__}, not a list", rank=self.rank,
                 hint=f"{cls_name} takes the list of this rank's PipelineStages, chunk 0 first")
        held = [getattr(s, "stage_index", None) for s in
                (given if isinstance(given, (list, tuple)) else [given])]
        want = expected_stages(self.spec, self.rank, self.p, self.v)
        if held != want:
            fail(f"{cls_name} was given stages {held}; for {self.name!r} with p = {self.p}, "
                 f"v = {self.v} this rank holds stages {want}",
                 rank=self.rank, hint=_stages_hint(held, want, self, self.rank))
        n_mb = bound.get("n_microbatches")
        if n_mb != self.m:
            fail(f"{cls_name}(..., n_microbatches={n_mb}): the check's batch of "
                 f"{self.rows * self.m} rows is m = {self.m} micro-batches of {self.rows}",
                 rank=self.rank, hint=self._microbatch_hint(n_mb))
        self.built.append(cls_name)
        self._depth += 1
        try:
            return original(obj, *args, **kwargs)
        finally:
            self._depth -= 1

    def _microbatch_hint(self, n_mb: Any) -> str:
        batch = self.rows * self.m
        if isinstance(n_mb, int) and n_mb > 0 and batch % n_mb:
            sizes = [len(c) for c in torch.arange(batch).tensor_split(n_mb)]
            return (f"{n_mb} micro-batches do not divide {batch} rows: torch cuts them "
                    f"{sizes}, takes a micro-batch's shape from the first and stops at the "
                    "first that differs (PipeliningMetadataError); pass the m you were given")
        return "pass the m the step was given as n_microbatches"

    def step(self, original: Callable[..., Any], schedule: Any, *args: Any,
             **kwargs: Any) -> Any:
        import torch.distributed as dist

        self.steps += 1
        if self.steps > 1:
            fail(f"{type(schedule).__name__}.step ran a second time", rank=self.rank,
                 hint="one step per call: each step adds its gradients to .grad")
        mine = {"loss_fn": getattr(schedule, "_loss_fn", None) is not None, "x": bool(args),
                "target": kwargs.get("target") is not None}
        everyone: list[Any] = [None] * self.p
        dist.all_gather_object(everyone, mine)
        self.summary = everyone
        _check_ranks(everyone, self)
        return original(schedule, *args, **kwargs)

    def owner(self, stage: int) -> int:
        """The rank that holds `stage`."""
        return next(r for r in range(self.p) if stage in expected_stages(self.spec, r, self.p,
                                                                          self.v))

    # --- open and close --------------------------------------------------------------------
    def _patch(self, cls: type, method: str, wrapper: Callable[..., Any]) -> None:
        original = getattr(cls, method)
        self._saved.append((cls, method, cls.__dict__.get(method)))  # None: inherited

        @functools.wraps(original)
        def patched(obj: Any, *args: Any, **kwargs: Any) -> Any:
            return wrapper(original, obj, *args, **kwargs)
        setattr(cls, method, patched)

    def __enter__(self) -> TorchGuard:
        import torch.distributed.pipelining as pipelining
        from torch.distributed.pipelining import schedules

        self._patch(pipelining.PipelineStage, "__init__", self.stage_init)
        for name in SCHEDULE_CLASSES:
            self._patch(getattr(pipelining, name), "__init__",
                        functools.partial(self._named_init, name))
        for base in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
            self._patch(base, "step", self.step)
        self._recording = recording()
        self.calls = self._recording.__enter__()
        return self

    def _named_init(self, cls_name: str, original: Callable[..., Any], obj: Any, *args: Any,
                    **kwargs: Any) -> Any:
        return self.schedule_init(original, cls_name, obj, *args, **kwargs)

    def __exit__(self, *exc: object) -> None:
        self._recording.__exit__(*exc)
        for cls, method, own in reversed(self._saved):
            if own is None:
                delattr(cls, method)
            else:
                setattr(cls, method, own)
        self._saved.clear()


def _stages_hint(got: list, want: list[int], g: TorchGuard, r: int) -> str:
    looped = [c * g.p + r for c in range(g.v)]
    folded = [r, 2 * g.p - 1 - r] if g.v == 2 else []
    if len(got) != len(want):
        return (f"a schedule given the wrong number of stages per rank: {g.spec.cls} with "
                f"v = {g.v} runs {g.v} PipelineStage(s) on every rank, one per chunk")
    if sorted(got) == want:
        return "list this rank's stages chunk 0 first, as your layers_of / v_stage_of number them"
    if g.spec.placement == "v" and got == looped:
        return ("that is the looped placement, c p + r: ScheduleDualPipeV folds the pipeline "
                "in a V, rank r holds stages r and 2p - 1 - r (your v_stage_of)")
    if g.spec.placement == "looped" and got == folded:
        return (f"that is DualPipe-V's V placement: {g.spec.cls} places stages in a loop, "
                "chunk c of rank r is stage c p + r (your stage_of)")
    return ("chunk c of rank r is stage c p + r (stage_of)" if g.spec.placement == "looped"
            else "rank r holds stages r and 2p - 1 - r (v_stage_of)")


def _check_ranks(everyone: list[dict], g: TorchGuard) -> None:
    """Every rank's summary (gathered at step): a loss_fn on every rank, the inputs and the
    target where they belong; the same verdict on every rank."""
    given = [r for r, e in enumerate(everyone) if e["loss_fn"]]
    if not given:
        fail(f"no rank gave its {g.spec.cls} a loss_fn", hint="torch's schedules run the "
             "backward only when they have a loss_fn (without one they run forward only, as "
             "eval() does, and no gradient is computed): pass loss_fn= on every rank")
    if len(given) < g.p:
        missing = [r for r in range(g.p) if r not in given]
        fail(f"the {g.spec.cls} of rank(s) {missing} has no loss_fn; rank(s) {given} have one",
             hint="every rank's schedule needs the loss_fn, also where no loss is computed: it "
                  "tells the schedule to run a backward. Without it a rank runs forward only "
                  "and never takes the gradients its neighbour sends back (a deadlock)")
    first, last = g.owner(0), g.owner(g.p * g.v - 1)
    if not everyone[first]["x"]:
        fail(f"rank {first} holds stage 0 but called step() without the inputs",
             hint="schedule.step(x) on the rank that holds stage 0: it cuts x into m "
                  "micro-batches")
    if not everyone[last]["target"]:
        fail(f"rank {last} holds the last stage but called step() without target=",
             hint="schedule.step(target=y, losses=losses) on the rank that holds the last "
                  "stage: the loss needs the targets")
