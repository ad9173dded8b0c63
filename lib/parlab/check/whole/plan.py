r"""Module 08, exercise 4: a plan of one's own for a 70B-class model on 256 H100.

`memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches, stage)` ->
{part: bytes} (weights, gradients, optimizer state, activations, logits) on the first or the
last pipeline stage (`stage`), and `bytes_per_step(model, cluster, sizes, *, micro_batch,
microbatches)` -> {axis: {"bytes", "link"}} for every axis of size > 1 (dp always), with
`sizes` = {"dp", "tp", "pp", "cp"} (a missing axis has size 1) and a dense `parlab.plan.Model`.
Compared with the planner of module 07 (`parlab.plan.stage_memory`, `axis_bytes` and the
links of `parlab.plan.evaluate`), bytes to 1e-9 relative, both stages, at the learner's own
plan and at shapes where the wrong forms differ. While the functions run, `parlab.plan`
raises CheckFailed; `parlab.costs`' closed forms and `parlab.mesh` are allowed. The hints
(`plan_hints`) name the logits' likely mistakes: bf16, not split over TP, on the first stage.

What a right answer must not depend on, and how the tests vary it (`SHAPES` visible,
`HIDDEN_SHAPES` hidden):

- whether the pipeline divides the 80 layers: 4 and 8 stages divide them, 32 (visible and
  hidden) does not (the first stage holds ceil(L/p));
- the axes used: TP inside a node (4, 8) and across nodes (16, hidden), CP 2 (visible) and 4
  (hidden), DP without TP (hidden), no pipeline (p = 1: one stage holds both ends);
- the strategy (ZeRO-1 over the dp·cp ranks, plain DP) and the recompute policy (all three,
  visible), the micro-batch (1, 2, 4) and the stage (first and last, every shape).

The plan (`my_plan()` returns the plan, a dict of dp, tp, pp, cp, strategy, recompute and
micro_batch, and `why`, a dict of sentences) must use the 256 GPUs, be kept by the planner
(its fullest GPU fits 90% of 80 GB, TP inside a node), and come with a sentence for every axis
it uses.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

from parlab.check._compare import expect_type, fail
from parlab.check._harness import call_learner, exercise, not_reexport
from parlab.check.whole.common import KEY_PLAN
from parlab.check.whole.plan_hints import (
    BYTES_HINTS,
    CHANGED,
    LINK,
    TP_WITHOUT_REGATHER,
    memory_hint,
)
from parlab.errors import CheckFailed

PARTS = ("weights", "gradients", "optimizer state", "activations", "logits")
STAGES = ("first", "last")
SHAPES = [  # (sizes, strategy, recompute, micro_batch)
    ({"dp": 8, "tp": 4, "pp": 4, "cp": 2}, "zero1", "selective", 1),
    ({"dp": 4, "tp": 8, "pp": 8}, "ddp", "full", 1),
    ({"dp": 32, "tp": 8}, "zero1", "none", 2),
    ({"dp": 1, "tp": 8, "pp": 32}, "ddp", "selective", 4),  # 32 stages do not divide 80 layers
]
HIDDEN_SHAPES = [
    ({"dp": 2, "tp": 2, "pp": 16, "cp": 4}, "zero1", "none", 1),
    ({"dp": 16, "tp": 16}, "ddp", "selective", 1),
    ({"dp": 64, "pp": 4}, "zero1", "full", 2),
    ({"dp": 2, "tp": 4, "pp": 32}, "zero1", "full", 1),
]
REFUSAL = "parlab.plan (the planner's own cost model)"
PUBLISHED = {"tp": 4, "pp": 4, "cp": 2, "dp": 8}
"""NVIDIA's Megatron-Bridge recipe for Llama 3 70B on H100 in bf16 (TP 4 with SP, PP 4 with 5
virtual stages, CP 2, micro-batch 1, sequence 8192; 64 GPUs there, so DP 8 on 256)."""


def _shape(sizes: dict[str, int]) -> Any:
    from parlab.plan import Shape

    return Shape(dp=sizes.get("dp", 1), pp=sizes.get("pp", 1), ep=1, cp=sizes.get("cp", 1),
                 tp=sizes.get("tp", 1))


def _reference(model: Any, cluster: Any, sizes: dict[str, int], strategy: str, recompute: str,
               mb: int, m: int) -> tuple[dict[str, dict[str, float]],
                                         dict[str, tuple[str, float]]]:
    from parlab import plan

    shape = _shape(sizes)
    memory = {stage: plan.stage_memory(model, shape, strategy=strategy, micro_batch=mb,
                                       microbatches=m, recompute=recompute, stage=stage)
              for stage in STAGES}
    judged = plan.evaluate(model, cluster, **shape._asdict(), strategy=strategy,
                           recompute=recompute, global_batch=m * mb * shape.dp, micro_batch=mb)
    return memory, {t.axis: (t.link, t.nbytes) for t in judged.traffic}


def _refused() -> list[Any]:
    from parlab import plan
    from parlab.plan import costs

    return [plan.evaluate, plan.plan, costs.state_memory, costs.activation_memory,
            costs.logits_memory, costs.stage_memory, costs.fullest_stage, costs.axis_bytes,
            costs.nodes_spanned, costs.stage_params, costs.stage_layers]


def _near(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(b), 1.0)


def _call_memory(memory_fn: Callable[..., Any], model: Any, case: tuple[dict[str, int], str,
                 str, int], m: int, stage: str) -> tuple[str, Any]:
    sizes, strategy, recompute, mb = case
    args = f"sizes={sizes}, strategy={strategy!r}, recompute={recompute!r}, " \
           f"micro_batch={mb}, microbatches={m}, stage={stage!r}"
    old_answer = False
    try:
        got = call_learner(f"memory_per_gpu(model, {args})", functools.partial(
            memory_fn, model, dict(sizes), strategy=strategy, recompute=recompute,
            micro_batch=mb, microbatches=m, stage=stage), refuse=_refused(), refusal=REFUSAL)
    except CheckFailed as failed:
        if "keyword argument 'stage'" not in str(failed):
            raise
        old_answer = True
    if old_answer:
        fail("memory_per_gpu(...) takes no stage= argument", hint=CHANGED)
    expect_type(got, dict, name="memory_per_gpu", what=f"a dict with keys {PARTS}")
    if "logits" not in got and set(PARTS[:-1]) <= set(got):
        fail(f"memory_per_gpu({args}) has no 'logits' entry", hint=CHANGED)
    return args, got


def _check_memory(memory_fn: Callable[..., Any], model: Any, case: tuple[dict[str, int], str,
                  str, int], m: int, want: dict[str, dict[str, float]]) -> None:
    for stage in STAGES:
        args, got = _call_memory(memory_fn, model, case, m, stage)
        for part in PARTS:
            value = got.get(part)
            expect_type(value, (int, float), name=f"memory_per_gpu(...)[{part!r}]", what="bytes")
            if not _near(value, want[stage][part]):
                fail(f"memory_per_gpu({args})[{part!r}] = {value:,.0f} bytes; the planner "
                     f"says {want[stage][part]:,.0f}",
                     hint=memory_hint(part, value, want[stage][part], stage=stage,
                                      sizes=case[0], microbatches=m,
                                      first_activations=want["first"]["activations"]))


def _check_one(memory_fn: Callable[..., Any], bytes_fn: Callable[..., Any], model: Any,
               cluster: Any, case: tuple[dict[str, int], str, str, int], batch: int) -> None:
    sizes, strategy, recompute, mb = case
    m = batch // (sizes.get("dp", 1) * mb)
    want_mem, want_bytes = _reference(model, cluster, sizes, strategy, recompute, mb, m)
    _check_memory(memory_fn, model, case, m, want_mem)
    args = f"sizes={sizes}, micro_batch={mb}, microbatches={m}"
    got = call_learner(f"bytes_per_step(model, cluster, {args})", functools.partial(
        bytes_fn, model, cluster, dict(sizes), micro_batch=mb, microbatches=m),
        refuse=_refused(), refusal=REFUSAL)
    expect_type(got, dict, name="bytes_per_step", what='a dict {axis: {"bytes": ..., "link": '
                '...}} for every axis of size > 1 and dp')
    for axis, (link, nbytes) in want_bytes.items():
        entry = got.get(axis)
        expect_type(entry, dict, name=f"bytes_per_step(...)[{axis!r}]",
                    what='{"bytes": number, "link": "NVLink" or "InfiniBand"}')
        if not _near(entry.get("bytes", -1.0), nbytes):
            no_regather = axis == "tp" and isinstance(entry.get("bytes"), (int, float)) and \
                _near(entry["bytes"], nbytes * 16 / 20)
            fail(f"bytes_per_step({args})[{axis!r}]['bytes'] = {entry.get('bytes')!r}; the "
                 f"planner says {nbytes:,.0f}",
                 hint=TP_WITHOUT_REGATHER if no_regather else BYTES_HINTS[axis])
        if entry.get("link") != link:
            fail(f"bytes_per_step({args})[{axis!r}]['link'] = {entry.get('link')!r}; on "
                 f"{cluster.gpus_per_node} GPUs per node it rides {link}", hint=LINK)


def _check_plan(model: Any, cluster: Any, my_plan: Any, why: Any, batch: int) -> Any:
    from parlab import plan

    expect_type(my_plan, dict, name="my_plan", what="a dict with dp, tp, pp, cp, strategy, "
                "recompute, micro_batch")
    sizes = {k: my_plan.get(k, 1) for k in ("dp", "tp", "pp", "cp")}
    if math.prod(sizes.values()) != cluster.gpus:
        fail(f"my_plan uses dp·tp·pp·cp = {math.prod(sizes.values())} GPUs; the cluster has "
             f"{cluster.gpus}", hint="the axis sizes multiply to the number of GPUs")
    judged = plan.evaluate(model, cluster, **_shape(sizes)._asdict(),
                           strategy=my_plan.get("strategy", "zero1"),
                           recompute=my_plan.get("recompute", "selective"),
                           global_batch=batch, micro_batch=my_plan.get("micro_batch", 1))
    if not judged.kept:
        fail(f"the planner rejects my_plan ({judged.label}): " + "; ".join(judged.reasons),
             hint="work memory first (add PP or TP, shard the optimizer, recompute), then keep "
                  "TP inside a node")
    expect_type(why, dict, name="why", what="a dict {axis: a sentence}")
    for axis, size in sizes.items():
        text = why.get(axis, "")
        if size > 1 and (not isinstance(text, str) or len(text.split()) < 6):
            fail(f"why[{axis!r}] should be a sentence (6 words or more) saying why "
                 f"{axis.upper()} = {size}", hint="memory first, then the link it rides")
    return judged


@exercise(KEY_PLAN)
def check_plan_70b(memory_per_gpu: Callable[..., Any], bytes_per_step: Callable[..., Any],
                   my_plan: Callable[[], Any], *, model: Any, cluster: Any, global_batch: int,
                   quiet: bool = False) -> Any:
    """The two functions against the planner at the learner's plan and other shapes; the plan
    kept by the planner, with a sentence per axis. Returns the planner's view of the plan."""
    not_reexport(memory_per_gpu, name="memory_per_gpu")
    not_reexport(bytes_per_step, name="bytes_per_step")
    answer = call_learner("my_plan()", my_plan)
    if not isinstance(answer, tuple) or len(answer) != 2:
        fail(f"my_plan() returned {type(answer).__name__}, expected (plan, why): two dicts",
             hint="return the plan's sizes and options, and a sentence per axis")
    my_plan_dict, why = answer
    judged = _check_plan(model, cluster, my_plan_dict, why, global_batch)
    own = ({k: my_plan_dict.get(k, 1) for k in ("dp", "tp", "pp", "cp")},
           my_plan_dict.get("strategy", "zero1"), my_plan_dict.get("recompute", "selective"),
           my_plan_dict.get("micro_batch", 1))
    for case in [own, *SHAPES, *(HIDDEN_SHAPES if quiet else [])]:
        _check_one(memory_per_gpu, bytes_per_step, model, cluster, case, global_batch)
    if not quiet:
        beside = ", ".join(f"{a.upper()} {own[0][a]} ({PUBLISHED[a]})" for a in PUBLISHED)
        print(f"memory_per_gpu (first and last stage) and bytes_per_step agree with the "
              f"planner at your plan and {len(SHAPES)} other shapes; your plan, {judged.label}: "
              f"{judged.memory_total / 1e9:.1f} GB per GPU on its fullest stage "
              f"({judged.stage}), kept. Beside NVIDIA's published "
              f"recipe (in brackets, 5 virtual stages per rank): {beside}")
    return judged
