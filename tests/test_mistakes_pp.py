"""Module 04's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

A learner's notebook is rebuilt the way a kernel holds it: the solutions notebook's imports
cell and answer cells (BEGIN/END SOLUTION lines dropped) run into one fresh module, and a
mistake file from autograder/mistakes/04_pipeline_parallel/ runs on top of them, replacing
the names it defines, as a learner's wrong cell would. Each mistake file lists in CAUGHT_BY
the checks that must reject it and a phrase the message must contain. The module is not in
sys.modules, so cloudpickle ships its functions to the ranks by value, like notebook cells.
"""

from __future__ import annotations

import ast
import textwrap
import types

import mistakes
import pytest
from conftest import ROOT

from parlab.check import CheckFailed, reset_outcomes
from parlab.check import pp as ppcheck

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "04_pipeline_parallel" / "04_pipeline_parallel.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "04_pipeline_parallel"
CHECKS = {
    "check_1f1b": lambda ns, t: ppcheck.check_1f1b(ns.one_f_one_b, quiet=True),
    "check_p2p_step": lambda ns, t: ppcheck.check_p2p_step(
        ns.forward_step, ns.backward_step, ns.one_f_one_b, world_size=t, quiet=True),
    "check_placement": lambda ns, t: ppcheck.check_placement(ns.stage_of, ns.layers_of,
                                                             world_size=t, quiet=True),
    "check_balance": lambda ns, t: ppcheck.check_balance(ns.balance, quiet=True),
    "check_dualpipe_v": lambda ns, t: ppcheck.check_dualpipe_v(
        ns.v_stage_of, ns.dualpipe_v_order, world_size=t, quiet=True),
}
ON_RANKS = {"check_p2p_step", "check_placement", "check_dualpipe_v"}  # the others: any t
NAMES_RANK = {"check_1f1b", "check_p2p_step"}  # their messages say which rank


@pytest.fixture(autouse=True)
def _fresh_kernel():
    """Each test is a kernel of its own: no outcome of an earlier test's check is remembered
    (parlab.check.exercise names an earlier failed exercise a later check builds on)."""

    reset_outcomes()


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=5)


def _sizes(check: str) -> tuple[int, ...]:
    return (2, 3, 4) if check in ON_RANKS else (2,)


def _world_sizes(path) -> tuple[int, ...] | None:
    """A mistake file's WORLD_SIZES: the only sizes it fails on (an answer that is right on
    2 ranks, where both neighbours are one rank, or where a hard-coded size happens to fit)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "WORLD_SIZES":
            return tuple(ast.literal_eval(node.value))
    return None


CASES = [c for c in mistakes.cases(MISTAKES, _sizes)
         if c.values[3] in (_world_sizes(c.values[0]) or (c.values[3],))]


def test_corpus_is_complete_and_documented():
    required = {"backward_before_forward", "missing_recv", "warmup_off_by_one",
                "no_loss_scaling",  # the four
                "v_looped_placement", "dualpipe_v_fixed_sizes"}  # DualPipe-V's (issue 21)
    mistakes.assert_corpus_documented(MISTAKES, required, CHECKS)


@pytest.mark.parametrize("check, t", [(c, t) for c in sorted(CHECKS) for t in _sizes(c)])
def test_solutions_pass(check, t):
    CHECKS[check](learner_namespace(), t)


@pytest.mark.parametrize("path, check, phrase, t", CASES)
def test_mistake_is_caught_with_a_pointer(path, check, phrase, t):
    ns = learner_namespace(path.read_text())
    message = mistakes.caught_message(lambda: CHECKS[check](ns, t), phrase=phrase,
                                      where=f"{path.name} under {check} on {t} ranks")
    if check in NAMES_RANK:
        assert "rank " in message


REEXPORTS = {
    "alias": ("check_1f1b", "from parlab.pp import one_f_one_b"),
    "wrapper": ("check_1f1b", """
        def one_f_one_b(p, m):
            return make_schedule("1f1b", p, m)
    """),
    "captured": ("check_1f1b", """
        from parlab.pp import one_f_one_b as _reference
        def one_f_one_b(p, m):
            return _reference(p, m)
    """),
    "balance_alias": ("check_balance", "from parlab.pp.simulator import balance_stages as balance"),
    "balance_wrapper": ("check_balance", """
        import parlab.pp.simulator
        def balance(costs, p):
            return parlab.pp.balance_stages(costs, p)
    """),
    "stage_of_wrapper": ("check_placement", """
        import parlab.pp
        def stage_of(rank, chunk, p):
            return parlab.pp.stage_of(rank, chunk, p)
    """),
    "v_stage_of_wrapper": ("check_dualpipe_v", """
        import parlab.pp
        def v_stage_of(rank, chunk, p):
            return parlab.pp.stage_of(rank, chunk, p, placement="v")
    """),
    "dualpipe_v_wrapper": ("check_dualpipe_v", """
        def dualpipe_v_order(rank, p, m):
            return make_schedule("dualpipe_v", p, m)[rank]
    """),
    "dualpipe_v_rank_alias": ("check_dualpipe_v",
                              "from parlab.pp import dualpipe_v_rank as dualpipe_v_order"),
}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    check, source = REEXPORTS[how]
    ns = learner_namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match="the course's (own )?reference"):
        CHECKS[check](ns, 2)


def test_the_executor_check_names_exercise_1_when_it_failed_first():
    # exercise 2 runs the learner's own 1F1B: a broken one fails exercise 1's check, and the
    # exercise-2 check then says that it builds on it, instead of an unrelated-looking failure
    ns = learner_namespace((MISTAKES / "backward_before_forward.py").read_text())
    with pytest.raises(CheckFailed):
        CHECKS["check_1f1b"](ns, 2)
    with pytest.raises(CheckFailed, match=r"builds on your one_f_one_b \(exercise 1\), which "
                       r"failed its own test above") as info:
        CHECKS["check_p2p_step"](ns, 2)
    assert "cannot run" in str(info.value)


def test_exercise_2_is_checked_on_its_own_while_exercise_1_is_not_written(capsys):
    ns = learner_namespace("""
        def one_f_one_b(p, m):
            raise NotImplementedError()
    """.replace("\n        ", "\n"))
    ppcheck.check_p2p_step(ns.forward_step, ns.backward_step, ns.one_f_one_b, world_size=2)
    assert "your one_f_one_b is not written yet" in capsys.readouterr().out
