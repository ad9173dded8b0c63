"""parlab.pp beside torch.distributed.pipelining: what torch runs, its own table, its numbers.

The references are independent of the code under test: the course's tables (make_schedule,
tested against their definitions in test_pp.py and test_pp_dualpipe.py), the course's
executor (run_pipeline, tested against one device in test_pp_exec.py), one device, and
torch's own `_Action` objects. What the rank tests establish is what module 04's section 12
says: torch 2.13 runs the course's 1F1B, interleaved 1F1B, ZB-H1 and DualPipe-V tables action
for action; Schedule1F1B's stored `pipeline_order` is wrong on the last rank only (forwards 1
.. m there); given loss / m and scale_grads=False torch's gradients are the executor's bit for
bit, and with its default they differ in the last bits unless m is a power of two; torch's
messages pass NCCL's rules (PARLAB_NCCL_RULES, set by conftest) where the executor's do not.
"""

from __future__ import annotations

import pytest
import torch

from parlab.launch import NcclRuleBroken, run
from parlab.pp import Action, make_schedule, pipeline_worker, run_pipeline
from parlab.pp.plot_compare import differences, plot_lists
from parlab.pp.torch_compare import compare_with_torch
from parlab.pp.torch_order import (
    TORCH_SCHEDULES,
    TorchCall,
    executed_actions,
    first_difference,
    recording,
    stored_actions,
)
from parlab.pp.torch_run import run_torch_pipeline, run_torch_pipelines

pytestmark = pytest.mark.usefixtures("no_orphans")
A = Action


def test_torch_kinds_become_the_course_actions() -> None:
    """I is B, W is W; a full backward B is B alone where the table has no W, B then W where
    it splits backwards; the chunk follows the placement (loop: s // p; V: stage 2p - 1 - r
    is chunk 1)."""
    calls = [TorchCall("F", 5, 0), TorchCall("B", 5, 0), TorchCall("I", 1, 2), TorchCall("W", 1, 2)]
    assert executed_actions(calls, 4, "interleaved_1f1b") == [
        A("F", 0, 1), A("B", 0, 1), A("B", 2), A("W", 2)]
    assert executed_actions(calls[:2], 3, "dualpipe_v") == [A("F", 0, 1), A("B", 0, 1),
                                                             A("W", 0, 1)]
    assert executed_actions([TorchCall("B", 2, 3)], 3, "1f1b") == [A("B", 3)]
    with pytest.raises(ValueError, match="choose one of"):
        executed_actions(calls, 4, "zb_v")


def test_stored_actions_read_torchs_own_action_objects() -> None:
    from torch.distributed.pipelining.schedules import _Action
    from torch.distributed.pipelining.schedules import _ComputationType as T

    class Stored:  # what a schedule object keeps: rank -> actions, None an idle step
        pipeline_order = {0: [_Action(0, T.FORWARD, 0), None, _Action(3, T.FORWARD, 0),
                              _Action(-1, T.OVERLAP_F_B, None, (_Action(0, T.FORWARD, 1),
                                                                _Action(3, T.FULL_BACKWARD, 0))),
                              _Action(3, T.REDUCE_GRAD, None)],
                          1: [_Action(1, T.BACKWARD_INPUT, 0), _Action(1, T.BACKWARD_WEIGHT, 0)]}

    assert stored_actions(Stored(), 2, "dualpipe_v") == [
        [A("F", 0), A("F", 0, 1), A("F", 1), A("B", 0, 1), A("W", 0, 1)],
        [A("B", 0), A("W", 0)]]


def test_first_difference_names_the_rank_and_the_place() -> None:
    one = [[A("F", 0), A("B", 0)], [A("F", 0), A("B", 0)]]
    assert first_difference(one, one) is None
    assert first_difference(one, [one[0], [A("F", 1), A("B", 0)]], names=("a", "b")) == \
        "rank 1, position 0: a has F0, b F1"
    assert "goes on with B0 at position 1" in first_difference(one, [one[0], [A("F", 0)]])
    assert differences(one, [one[0], [A("F", 1), A("B", 0), A("W", 0)]]) == [[], [0, 2]]


def test_recording_leaves_torchs_stage_methods_as_they_were() -> None:
    from torch.distributed.pipelining.stage import _PipelineStageBase as Base

    before = {m: Base.__dict__[m] for m in ("forward_one_chunk", "backward_one_chunk",
                                            "backward_weight_one_chunk")}
    with recording() as outer, recording() as inner:
        assert Base.__dict__["forward_one_chunk"] is not before["forward_one_chunk"]
        assert outer == inner == []
    assert {m: Base.__dict__[m] for m in before} == before


def test_the_guard_leaves_torchs_classes_as_they_were() -> None:
    import torch.distributed.pipelining as pipelining

    from parlab.check.pp.torch_guard import SCHEDULE_CLASSES, TorchGuard
    from parlab.pp import make_model

    classes = [getattr(pipelining, n) for n in SCHEDULE_CLASSES] + [pipelining.PipelineStage]
    own = {c: c.__dict__.get("__init__") for c in classes}
    guard = TorchGuard("1f1b", TORCH_SCHEDULES["1f1b"], rank=0, p=2, m=4, v=1,
                       model=make_model(4, 8), rows=2, width=8)
    with guard:
        assert all("__init__" in c.__dict__ for c in classes)
    assert {c: c.__dict__.get("__init__") for c in classes} == own


def test_torch_runs_the_course_tables_with_the_executors_numbers() -> None:
    """Four schedules on 3 ranks: the order torch ran is make_schedule's; only Schedule1F1B's
    stored table differs, on the last rank, whose forwards are 1 .. m; loss and gradients
    bit-identical to the executor's (loss / m, scale_grads=False) and within 1e-12 of one
    device; the same messages, and the same bytes once shapes are exchanged."""
    cases = [("1f1b", 5, 1), ("interleaved_1f1b", 6, 2), ("zb_h1", 6, 1), ("dualpipe_v", 7, 2)]
    for c in compare_with_torch(3, cases):
        assert c.order_difference is None, (c.name, c.order_difference)
        assert c.bit_identical, (c.name, c.max_difference)
        assert c.torch.max_error() < 1e-12
        assert c.torch.messages == c.executor.sends
        assert c.torch.sent == c.executor_bytes
        assert all(f > s for f, s in zip(c.torch.first, c.torch.sent, strict=True)
                   if s), "the first step also sends the shapes"
        if c.name != "1f1b":
            assert c.stored_difference is None, (c.name, c.stored_difference)
            continue
        stored, ran = [list(r) for r in c.torch.stored], [list(r) for r in c.torch.executed]
        assert stored[:-1] == ran[:-1]
        assert [a.microbatch for a in stored[-1] if a.kind == "F"] == list(range(1, c.m + 1))
        assert [a for a in stored[-1] if a.kind == "B"] == [a for a in ran[-1] if a.kind == "B"]


def test_torchs_default_scaling_rounds_differently_unless_m_is_a_power_of_two() -> None:
    """scale_grads=True (a plain mse, the summed gradients divided by m at the end) against
    the executor (each loss divided by m): m = 8 the same bits, m = 5 not, both within
    1e-14 relative."""
    runs = run_torch_pipelines(2, [("1f1b", 5, 1), ("1f1b", 8, 1)], scale_grads=True)
    for run_, m in zip(runs, (5, 8), strict=True):
        mine = run_pipeline(make_schedule("1f1b", 2, m), n_layers=4, batch=2 * m)
        same = all(torch.equal(g, mine.grads[n]) for n, g in run_.grads.items())
        worst = max(float((g - mine.grads[n]).abs().max() / mine.grads[n].abs().max())
                    for n, g in run_.grads.items())
        assert worst < 1e-14
        assert same == (m == 8), (m, worst)


def test_torchs_messages_pass_ncclrules_and_the_executors_do_not() -> None:
    """What section 12 shows under PARLAB_NCCL_RULES=1 (conftest sets it for every test)."""
    assert run_torch_pipeline("1f1b", 2, 4).max_error() < 1e-12
    with pytest.raises(NcclRuleBroken, match="both receive first"):
        run(pipeline_worker, 2, make_schedule("1f1b", 2, 4), None,
            {"n_layers": 4, "width": 16, "batch": 8}, timeout=30)


def test_plot_lists_outlines_what_differs() -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    ran = make_schedule("1f1b", 2, 3)
    stored = [ran[0], [A("F", 1), A("B", 0), A("F", 2), A("B", 1), A("F", 3), A("B", 2)]]
    fig = plot_lists(ran, stored)
    outlined = [p for p in fig.axes[1].patches if p.get_edgecolor()[:3] != (1.0, 1.0, 1.0)]
    assert len(outlined) == 3 and "3 actions differ" in fig.axes[1].get_title()
    plt.close(fig)


def test_a_table_of_exercise_1_that_differs_is_named_before_torch() -> None:
    """A valid 1F1B with one warm-up forward too many (exercise 1's mistake) is not what torch
    runs: exercise 6's check says the learner's table differs from the standard one torch
    ran, after exercise 1's check failed, and names that exercise first."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from mistake_tables import pp as table_module

    from parlab.check import CheckFailed, reset_outcomes

    table = table_module.TABLE
    reset_outcomes()
    ns = table.namespace((table.folder / "warmup_off_by_one.py").read_text())
    with pytest.raises(CheckFailed):
        table.checks["check_1f1b"](ns, 3)
    with pytest.raises(CheckFailed, match=r"builds on your one_f_one_b \(exercise 1\)") as info:
        table.checks["check_torch_pipeline"](ns, 3)
    assert "what torch ran differs from your 1F1B" in str(info.value)
    assert "differs from make_schedule's: fix that exercise first" in str(info.value)
