r"""Exercise 6 of module 04, `check_torch_pipeline(torch_pipeline_step, ...)`: the same pipelines
with PyTorch's API.

The learner's `torch_pipeline_step(name, model, x, y, m, v)` runs in every rank: it builds
this rank's `PipelineStage`s from `model` (its own split: layers_of / v_stage_of), torch's
schedule object for `name` and one `step`, and returns the batch loss on the rank that holds
the last stage. For each case (name, m, v), on p = world_size ranks, with 3 layers per stage
(n_layers = 3 p v), micro-batches of 3 rows, float64, mean-squared error:

    1f1b              m = 2p + 1            zb_h1        m = 3p (torch's ZB1P needs
    interleaved_1f1b  m = 3p (v = 2),                   m a multiple of m // p)
                      m = 2p (v = 3)        dualpipe_v   m = 2p + 1 (v = 2, the V)

While it runs, `TorchGuard` (parlab.check.pp.torch_guard) names an argument torch would trip
over (a loss_fn on some ranks only, the wrong stages or number of stages per rank, a
micro-batch count that is not m, input_args of the wrong shape) before torch acts, and records
what the stages compute. Then, against one device (float64, rtol 1e-9): every gradient (a
ratio of m or 1/m is named: the loss divided by m twice, or not at all) and the returned loss
(the sum of the micro-batch losses named); and what torch ran, rank by rank, against the
learner's table: their one_f_one_b (exercise 1) and dualpipe_v_order (exercise 4),
make_schedule's for interleaved 1F1B and ZB-H1 (torch's full backward B counts as B then W
where the table splits the backward).

Last, in the visible run (quiet=False), the learner's own executor runs the same cases
(exercise 2's steps for 1F1B, parlab's executor with the learner's tables for the others;
gloo, a launch of its own: its receives are posted the way gloo allows) and the summary says
whether torch's gradients equal it bit for bit (they do with loss_fn = mse / m and
scale_grads=False; with torch's default, dividing the summed gradients by m once, they round
differently unless m is a power of two). That part is told, not graded: when torch matches
one device and so does the executor they agree to 2e-9 anyway, and an executor that fails is
exercise 2's mistake, which its own test names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import parlab.check._harness as harness
from parlab.check._compare import assert_close, fail
from parlab.check.pp.common import TOL, _ratio, reference
from parlab.check.pp.torch_guard import TorchGuard
from parlab.pp import schedules as pp
from parlab.pp import torch_run
from parlab.pp.order import validate
from parlab.pp.torch_order import (
    TORCH_SCHEDULES,
    executed_actions,
    first_difference,
    torch_name,
)

__all__ = ["check_torch_pipeline", "torch_cases"]

ROWS, WIDTH = 3, 16
REFUSED = [torch_run.build_stages, torch_run.make_torch_schedule, torch_run.torch_step,
           torch_run.torch_worker, torch_run.run_torch_pipeline]
REFUSAL = "parlab.pp.torch_run (the course's torch pipeline)"
HANG = ("every rank calls schedule.step() once (rank of stage 0 with the inputs, rank of the "
        "last stage with target= and losses=, any other with no arguments): a rank that skips "
        "it, or steps twice, leaves its neighbours waiting")
SCALED_TWICE = ("the loss divided by m twice: your loss_fn divides by m and the schedule's "
                "scale_grads=True (its default) divides the summed gradients by m again; do "
                "one of the two")
NOT_SCALED = ("the loss not divided by m: with scale_grads=False the schedule leaves the "
              "summed gradients as they are, so the loss_fn must divide by m (or keep "
              "scale_grads=True and a plain mse)")


def torch_cases(p: int) -> list[tuple[str, int, int]]:
    """(schedule, m, v) run on p ranks; see the module docstring."""
    return [("1f1b", 2 * p + 1, 1), ("interleaved_1f1b", 3 * p, 2),
            ("interleaved_1f1b", 2 * p, 3), ("zb_h1", 3 * p, 1), ("dualpipe_v", 2 * p + 1, 2)]


def _options(p: int, m: int, v: int) -> dict[str, Any]:
    return {"n_layers": 3 * p * v, "width": WIDTH, "batch": ROWS * m, "seed": 0, "m": m}


def _as_loss(value: Any) -> Any:
    """A returned loss as a float, or a description of what came back instead."""
    import torch

    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None if value is None else f"{type(value).__name__} {value!r:.40}"


def _one_case(fn: Callable, name: str, m: int, v: int) -> dict:
    """In a rank: one call of the learner's step under the guard."""
    import torch.distributed as dist

    from parlab import launch
    from parlab.pp.model import make_data, make_model

    rank, p = dist.get_rank(), dist.get_world_size()
    spec, opts, device = torch_name(name), _options(p, m, v), launch.device()
    model = make_model(opts["n_layers"], WIDTH, seed=opts["seed"]).to(device)
    x, y = (t.to(device) for t in make_data(opts["batch"], WIDTH, seed=opts["seed"]))
    where = f"torch_pipeline_step({name!r}, model, x, y, m={m}, v={v})"
    with TorchGuard(name, spec, rank=rank, p=p, m=m, v=v, model=model, rows=ROWS,
                    width=WIDTH) as guard:
        out = harness.call_learner(where, fn, name, model, x, y, m, v,
                                   refuse=REFUSED, refusal=REFUSAL)
    if not guard.stages:
        fail(f"{where} built no PipelineStage", rank=rank, hint="one PipelineStage per chunk "
             "of this rank, from the model's layers, handed to the schedule")
    if not guard.steps:
        fail(f"{where} returned without calling step() on a schedule", rank=rank,
             hint="build the schedule over this rank's stages, then call schedule.step(...) "
                  "once: it runs every forward and backward")
    grads = {n: None if q.grad is None else harness.cpu(q.grad)
             for _, _, params in guard.stages for n, q in params.items()}
    return {"loss": _as_loss(out), "grads": grads,
            "executed": executed_actions(guard.calls, p, name)}


def _torch_worker(fn: Callable, cases: list[tuple[str, int, int]]) -> list[dict]:
    return [_one_case(fn, *case) for case in cases]


def _executor_worker(steps: tuple[Callable, Callable] | None, tables: list[pp.Schedule],
                     cases: list[tuple[str, int, int]]) -> list[dict]:
    """In a rank: the learner's own executor on each case's table (exercise 2's steps for
    1F1B when written, parlab's executor otherwise)."""
    import torch.distributed as dist

    from parlab.check.pp.p2p import _run_schedule
    from parlab.pp.executor import execute, make_context
    from parlab.pp.run import rank_result

    out = []
    for (name, m, v), table in zip(cases, tables, strict=True):
        opts = _options(dist.get_world_size(), m, v)
        if name == "1f1b" and steps is not None:
            try:
                out.append(_run_schedule(steps[0], steps[1], name, table, opts))
                continue
            except NotImplementedError:
                pass
        model_opts = {k: val for k, val in opts.items() if k != "m"}
        ctx, index = make_context(dist.get_world_size(), m, v, **model_opts,
                                  placement=torch_name(name).placement)
        execute(table, ctx)
        out.append(rank_result(ctx, index))
    return out


def _table(name: str, p: int, m: int, v: int, one_f_one_b: Callable | None,
           dualpipe_v_order: Callable | None) -> tuple[pp.Schedule, str]:
    """The learner's table for the case (parlab's where theirs is not written) and whose."""
    from parlab.check.pp.p2p import learner_1f1b

    if name == "1f1b":
        return learner_1f1b(one_f_one_b, p, m)
    if name == "dualpipe_v" and dualpipe_v_order is not None:
        try:
            rows = [harness.call_learner(f"your dualpipe_v_order({r}, {p}, {m}) (exercise 4)",
                                         dualpipe_v_order, r, p, m) for r in range(p)]
        except NotImplementedError:
            return pp.make_schedule(name, p, m), "parlab's DualPipe-V"
        try:
            validate(rows, placement="v")
        except (pp.ScheduleError, TypeError, AttributeError) as err:
            fail(f"your dualpipe_v_order (exercise 4) cannot run for p = {p}, m = {m}: {err}",
                 hint="fix exercise 4 first: its own test says how")
        return [list(r) for r in rows], "your DualPipe-V"
    return pp.make_schedule(name, p, m, v), f"make_schedule({name!r})"


def _compare(name: str, m: int, v: int, results: list[dict]) -> None:
    """Gradients, then the returned loss, against one device."""
    p, spec = len(results), TORCH_SCHEDULES[name]
    opts = _options(p, m, v)
    ref_loss, ref_grads = reference(opts)
    case = f"{name} (p = {p}, m = {m}, v = {v})"
    for r, res in enumerate(results):
        for pname, got in res["grads"].items():
            label = f"{case}: gradient of layer {pname}"
            if got is None:
                fail(f"{label} is None: no backward reached it", rank=r,
                     hint="the schedule runs the backward itself in step(); check that step "
                          "ran with the loss_fn on every rank")
            c = _ratio(got, ref_grads[pname])
            hint = (SCALED_TWICE if c is not None and abs(c * m - 1) < 1e-6 else NOT_SCALED
                    if c is not None and abs(c - m) < 1e-6 else
                    "compare your stages' layers with the model's split")
            assert_close(got, ref_grads[pname], name=label, rank=r, hint=hint, **TOL)
    last = next(r for r in range(p) if spec.placement == "v" and r == 0
                or spec.placement == "looped" and r == p - 1)
    loss = results[last]["loss"]
    if not isinstance(loss, float):
        fail(f"{case}: your step returned {loss} on rank {last}, which holds the last stage",
             rank=last, hint="return the batch's loss there (a float: the micro-batch losses "
                             "the schedule put in losses=, combined), None on other ranks")
    if abs(loss - ref_loss) > TOL["rtol"] * abs(ref_loss):
        c = loss / ref_loss
        hint = ("that is the sum of the m micro-batch losses: with a plain mse loss_fn the "
                "batch's loss is their mean" if abs(c - m) < 1e-6 else
                "with loss_fn = mse / m the batch's loss is the sum of the losses, with a "
                "plain mse their mean" if abs(c * m - 1) < 1e-6 else
                "combine the m losses the schedule returns in losses= into the batch's")
        fail(f"{case}: your step returned the loss {loss:.10g}, one device's is "
             f"{ref_loss:.10g} ({c:.4g} times)", rank=last, hint=hint)


def _orders(name: str, m: int, v: int, table: pp.Schedule, whose: str,
            results: list[dict]) -> None:
    """What torch ran, rank by rank, against the learner's table."""
    executed = [res["executed"] for res in results]
    diff = first_difference(executed, [list(r) for r in table], names=("torch ran", whose))
    if diff is None:
        return
    standard = pp.make_schedule(name, len(results), m, v if name == "interleaved_1f1b" else 1)
    theirs = first_difference(executed, [list(r) for r in standard])
    fail(f"{name} (m = {m}): what torch ran differs from {whose}: {diff}",
         hint=f"torch ran the standard {name}; {whose} differs from make_schedule's: fix that "
              "exercise first" if theirs is None else "torch ran another order than the "
              "course's tables: build the class the exercise names, with its defaults")


def _agreement(torch_res: list[list[dict]], mine: list[list[dict]]) -> tuple[bool, float]:
    """Whether torch's gradients equal the executor's bit for bit, and the largest relative
    difference, over every case and rank."""
    same, worst = True, 0.0
    for tr, mr in zip(torch_res, mine, strict=True):
        for t, e in zip(tr, mr, strict=True):
            for n, g in t["grads"].items():
                other = e["grads"].get(n)
                if g is None or other is None:
                    continue
                same = same and bool((g == other).all())
                worst = max(worst, float((g - other).abs().max() / other.abs().max()))
    return same, worst


@harness.exercise("04.torch", needs={"04.1f1b": "one_f_one_b (exercise 1)",
                                     "04.p2p": "forward_step and backward_step (exercise 2)",
                                     "04.placement": "stage_of and layers_of (exercise 3)",
                                     "04.dualpipe_v": "v_stage_of and dualpipe_v_order "
                                                      "(exercise 4)"})
def check_torch_pipeline(torch_pipeline_step: Callable, one_f_one_b: Callable | None = None,
                         forward_step: Callable | None = None,
                         backward_step: Callable | None = None,
                         dualpipe_v_order: Callable | None = None, *, world_size: int = 2,
                         cases: Sequence[tuple[str, int, int]] | None = None,
                         timeout: float = harness.CHECK_TIMEOUT_S, quiet: bool = False) -> None:
    """Exercise 6: torch.distributed.pipelining on the learner's split against one device, the
    learner's tables and the learner's executor."""
    harness.not_reexport(torch_pipeline_step, name="torch_pipeline_step")
    p = world_size
    cases = list(cases or torch_cases(p))
    tables = [_table(n, p, m, v, one_f_one_b, dualpipe_v_order) for n, m, v in cases]
    results = harness.run_checked(_torch_worker, p, torch_pipeline_step, cases,
                                  what="your torch pipeline", timeout=timeout, hang_hint=HANG)
    by_case = [[results[r][k] for r in range(p)] for k in range(len(cases))]
    for (name, m, v), res in zip(cases, by_case, strict=True):
        _compare(name, m, v, res)
    for (name, m, v), (table, whose), res in zip(cases, tables, by_case, strict=True):
        _orders(name, m, v, table, whose, res)
    if quiet:
        return
    steps = (forward_step, backward_step) if forward_step and backward_step else None
    names = ", ".join(f"{n} (m = {m}" + (f", v = {v})" if n == "interleaved_1f1b" else ")")
                      for n, m, v in cases)
    print(f"torch pipeline OK on {p} ranks: {names}. Loss and every gradient equal one "
          "device's (rtol 1e-9); on every rank torch ran your table action for action. "
          + _beside_executor(steps, tables, cases, by_case, timeout))


def _beside_executor(steps: tuple[Callable, Callable] | None, tables: list, cases: list,
                     by_case: list[list[dict]], timeout: float) -> str:
    """A sentence on torch's gradients beside the learner's executor's, which runs the same
    cases (told, not graded: an executor that fails is exercise 2's, whose own test says why)."""
    try:
        mine = harness.run_checked(_executor_worker, len(by_case[0]), steps,
                                   [t for t, _ in tables], cases,
                                   what="your executor on the same cases", timeout=timeout,
                                   hang_hint="see exercise 2's check", backend="gloo")
    except Exception as exc:  # noqa: BLE001 - a note for the learner, not a verdict
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (f"Your executor did not run the same cases ({first[:160]}); exercise 2's "
                "test says why.")
    same, worst = _agreement(by_case, [[mine[r][k] for r in range(len(mine))]
                                       for k in range(len(cases))])
    return ("Its gradients equal your executor's bit for bit." if same else
            f"Its gradients differ from your executor's by {worst:.1e} at most (rounding: "
            "scale_grads=True divides once at the end, your executor each loss).")
