"""Module 05's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

A learner's notebook is rebuilt the way a kernel holds it: the solutions notebook's imports
cell and answer cells (BEGIN/END SOLUTION lines dropped) run into one fresh module, and a
mistake file from autograder/mistakes/05_context_parallel/ runs on top of them, replacing the
names it defines, as a learner's wrong cell would. Each mistake file lists in CAUGHT_BY the
checks that must reject it and a phrase the message must contain. The module is not in
sys.modules, so cloudpickle ships its functions to the ranks by value, like notebook cells.

The rank checks run with a 5 s launcher timeout here, so the deadlock costs 5 s, not 20; one
slow test runs the deadlock under the checks' own default timeout.
"""

from __future__ import annotations

import ast
import textwrap
import time
import types
from pathlib import Path

import mistakes
import pytest
from conftest import ROOT

from parlab.check import CHECK_TIMEOUT_S, CheckFailed, reset_outcomes
from parlab.check import cp as cpcheck

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "05_context_parallel" / "05_context_parallel.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "05_context_parallel"
TIMEOUT = 5.0
CHECKS = {  # name -> (check(ns, t), launches ranks?)
    "check_merge": (lambda ns, t: cpcheck.check_merge(ns.merge, quiet=True), False),
    "check_ring_forward": (lambda ns, t: cpcheck.check_ring_forward(
        ns.ring_attention, world_size=t, timeout=TIMEOUT, quiet=True), True),
    "check_ring_backward": (lambda ns, t: cpcheck.check_ring_backward(
        ns.ring_attention_backward, world_size=t, timeout=TIMEOUT, quiet=True), True),
    "check_layouts": (lambda ns, t: cpcheck.check_layouts(
        ns.layout_positions, world_size=t, timeout=TIMEOUT, quiet=True), True),
    "check_ulysses": (lambda ns, t: cpcheck.check_ulysses(
        ns.seq_to_heads, ns.heads_to_seq, world_size=t, timeout=TIMEOUT, quiet=True), True),
}


@pytest.fixture(autouse=True)
def _fresh_kernel():
    """Each test is a kernel of its own: no outcome of an earlier test's check is remembered
    (parlab.check.exercise names an earlier failed exercise a later check builds on)."""

    reset_outcomes()


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=5)


def _sizes(check: str) -> tuple[int, ...]:
    return (2, 3, 4) if CHECKS[check][1] else (2,)


def _world_sizes(path) -> tuple[int, ...] | None:
    """A mistake file's WORLD_SIZES: the only sizes it fails on (a ring that is right on 2
    ranks, where both neighbours are one rank)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "WORLD_SIZES":
            return tuple(ast.literal_eval(node.value))
    return None


CASES = [c for c in mistakes.cases(MISTAKES, _sizes)
         if c.values[3] in (_world_sizes(c.values[0]) or (c.values[3],))]


def test_corpus_is_complete_and_documented():
    required = {"lse_merged_in_bf16", "no_max_shift", "mask_on_wrong_block", "recv_before_send",
                "a2a_wrong_dimension"}
    mistakes.assert_corpus_documented(MISTAKES, required, CHECKS)


@pytest.mark.parametrize("check, t", [(c, t) for c in sorted(CHECKS) for t in _sizes(c)])
def test_solutions_pass(check, t):
    CHECKS[check][0](learner_namespace(), t)


@pytest.mark.parametrize("path, check, phrase, t", CASES)
def test_mistake_is_caught_with_a_pointer(path, check, phrase, t):
    ns = learner_namespace(path.read_text())
    start = time.monotonic()
    message = mistakes.caught_message(lambda: CHECKS[check][0](ns, t), phrase=phrase,
                                      where=f"{path.name} under {check} on {t} ranks")
    took = time.monotonic() - start
    if CHECKS[check][1] and "did not finish" not in message:
        assert "rank " in message  # a rank-level comparison names the rank
    assert took < TIMEOUT + 10, f"{path.name} took {took:.1f} s to be caught"


@pytest.mark.slow
def test_deadlock_is_caught_within_the_checks_own_timeout():
    ns = learner_namespace((MISTAKES / "recv_before_send.py").read_text())
    start = time.monotonic()
    with pytest.raises(CheckFailed, match="A blocking dist.recv") as info:
        cpcheck.check_ring_forward(ns.ring_attention, world_size=2, quiet=True)
    took = time.monotonic() - start
    assert "did not finish on 2 ranks" in str(info.value)
    assert took < CHECK_TIMEOUT_S + 10 < 60, f"took {took:.1f} s (nbgrader's cell limit: 60 s)"


REEXPORTS = {
    "merge_alias": ("check_merge", "from parlab.cp import merge_partials as merge"),
    "merge_wrapper": ("check_merge", """
        import parlab.cp
        def merge(out_a, lse_a, out_b, lse_b):
            return parlab.cp.merge_partials(out_a, lse_a, out_b, lse_b)
    """),
    "ring_alias": ("check_ring_forward",
                   "from parlab.cp.ring import ring_attention_forward as ring_attention"),
    "ring_wrapper": ("check_ring_forward", """
        import parlab.cp.ring
        def ring_attention(q, k, v, pos, *, causal):
            return parlab.cp.ring_attention_forward(q, k, v, pos, causal=causal)
    """),
    "ring_function_wrapper": ("check_ring_forward", """
        from parlab.cp import RingAttention
        def ring_attention(q, k, v, pos, *, causal):
            out = RingAttention.apply(q, k, v, pos, causal)
            return out, torch.zeros(q.shape[:-1])
    """),
    "backward_wrapper": ("check_ring_backward", """
        from parlab.cp import ring_attention_backward as reference_backward
        def ring_attention_backward(q, k, v, out, lse, dout, pos, *, causal):
            return reference_backward(q, k, v, out, lse, dout, pos, causal=causal)
    """),
    "layout_alias": ("check_layouts", "from parlab.cp.layout import layout_positions"),
    "layout_wrapper": ("check_layouts", """
        import parlab.cp.layout
        def layout_positions(layout, rank, world_size, seq_len):
            return parlab.cp.layout_positions(layout, rank, world_size, seq_len)
    """),
    "ulysses_alias": ("check_ulysses", "from parlab.cp import seq_to_heads"),
    "ulysses_wrapper": ("check_ulysses", """
        import parlab.cp
        def seq_to_heads(x):
            return parlab.cp.seq_to_heads(x)
    """),
    "ulysses_layer_wrapper": ("check_ulysses", """
        from parlab.cp import ulysses
        def heads_to_seq(y):
            return ulysses.heads_to_seq(y)
    """),
}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    check, source = REEXPORTS[how]
    ns = learner_namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match="the course's own reference"):
        CHECKS[check][0](ns, 2)


def test_the_ring_check_names_exercise_1_when_the_merge_failed_first():
    # the learner's ring calls the learner's merge: a merge that failed its own check makes the
    # ring check say so first
    ns = learner_namespace((MISTAKES / "no_max_shift.py").read_text())
    with pytest.raises(CheckFailed):
        CHECKS["check_merge"][0](ns, 2)
    with pytest.raises(CheckFailed, match=r"builds on your merge \(exercise 1\), which failed "
                       "its own test above"):
        CHECKS["check_ring_forward"][0](ns, 2)


def test_no_hint_sends_the_learner_to_two_ranks():
    # issue 16.8: a hint must not say "try on 2 ranks to see it fail" (the mistakes that show
    # only from 3 ranks on say why instead)
    import parlab.check.cp as package

    sources = [p.read_text() for p in Path(package.__file__).parent.glob("*.py")]
    assert not any("2 ranks with parlab.launch.run" in s or "to see it fail" in s
                   for s in sources)
