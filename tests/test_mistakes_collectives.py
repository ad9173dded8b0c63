"""Module 00's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

As in tests/test_mistakes_fsdp.py: the solutions notebook's imports cell and answer cells
(BEGIN/END SOLUTION lines dropped) run into one fresh module, not in sys.modules, so
cloudpickle ships the learner's functions to the ranks by value, like notebook cells; a
mistake file from autograder/mistakes/00_collectives/ runs on top, replacing what it defines.
The `hidden:<grade id>` checks run that test cell of the solutions notebook, hidden tests
included, as the grader does.
"""

from __future__ import annotations

import ast
import textwrap
import types

import mistakes
import nbformat
import pytest
import torch
from conftest import ROOT

from parlab.check import CheckFailed
from parlab.check import collectives as colcheck
from parlab.grading import grade_id

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "00_collectives" / "00_collectives.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "00_collectives"


def _test_cell(gid: str) -> str:
    cells = [c for c in nbformat.read(NOTEBOOK, as_version=4).cells if grade_id(c) == gid]
    assert len(cells) == 1, f"no test cell {gid}"
    return cells[0].source


def _hidden(gid: str):
    def run(ns: types.ModuleType, t: int) -> None:
        exec(compile(_test_cell(gid), f"<{gid}>", "exec"), ns.__dict__)
    return run


CHECKS = {
    "check_ring_allreduce": lambda ns, t: colcheck.check_ring_allreduce(
        ns.ring_allreduce, world_size=t, quiet=True),
    "check_ring_allreduce_float64": lambda ns, t: colcheck.check_ring_allreduce(
        ns.ring_allreduce, world_size=t, numel=13, dtype=torch.float64, quiet=True),
    "check_intensities": lambda ns, t: colcheck.check_intensities(
        ns.tp_intensity, ns.dp_intensity, ns.link_requirement, quiet=True),
    "check_placement": lambda ns, t: colcheck.check_placement(ns.placement, quiet=True),
    **{f"hidden:{gid}": _hidden(gid) for gid in (
        "ring_allreduce_test", "interconnect_intensities_test", "interconnect_placement_test")},
}
ON_RANKS = {"check_ring_allreduce", "check_ring_allreduce_float64",
            "hidden:ring_allreduce_test"}  # their messages name the rank


def _sizes(check: str) -> tuple[int, ...]:
    return (2, 4) if check.startswith("check_ring") else (2,)


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=2)


CASES = mistakes.cases(MISTAKES, _sizes)


def test_corpus_is_complete_and_documented():
    required = {  # issue 16: a hole each, then foreseeable mistakes (issue 15.2)
        "ring_modifies_input", "ring_float32_buffers", "ring_view_chunks",
        "intensity_wraps_costs", "placement_uses_headroom", "dp_intensity_bf16_bytes",
        "tp_intensity_hard_coded", "ring_uses_all_reduce", "ring_skips_all_gather",
        "ring_adds_in_all_gather", "ring_blocking_send_first", "ring_whole_tensors"}
    mistakes.assert_corpus_documented(MISTAKES, required, CHECKS)


@pytest.mark.parametrize("check, t", [(c, t) for c in sorted(CHECKS) for t in _sizes(c)])
def test_solutions_pass(check, t):
    CHECKS[check](learner_namespace(), t)


@pytest.mark.parametrize("path, check, phrase, t", CASES)
def test_mistake_is_caught_with_a_pointer(path, check, phrase, t):
    ns = learner_namespace(path.read_text())
    message = mistakes.caught_message(lambda: CHECKS[check](ns, t), phrase=phrase,
                                      where=f"{path.name} under {check} on {t} ranks")
    if check in ON_RANKS:
        assert "rank " in message


def test_bf16_bytes_hint_names_both_mistakes_that_give_half():
    ns = learner_namespace((MISTAKES / "dp_intensity_bf16_bytes.py").read_text())
    with pytest.raises(CheckFailed) as info:
        CHECKS["check_intensities"](ns, 2)
    assert "bf16 bytes" in str(info.value) and "3P FLOPs per token instead of 6P" in str(
        info.value)


def test_hidden_asserts_carry_messages():
    for cell in nbformat.read(NOTEBOOK, as_version=4).cells:
        if cell.cell_type == "code" and "### BEGIN HIDDEN TESTS" in cell.source:
            tree = ast.parse(cell.source)
            bare = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert) and not n.msg]
            assert not bare, f"{grade_id(cell)}: assert without a message on lines {bare}"


REEXPORTS = {
    "alias_tp": ("from parlab.costs import tp_flops_per_byte as tp_intensity",
                 "check_intensities"),
    "wrapped_tp": ("""
        from parlab import costs
        def tp_intensity(h):
            return costs.tp_flops_per_byte(h)
    """, "check_intensities"),
    "wrapped_dp": ("""
        import parlab.costs.closed_forms as cf
        def dp_intensity(n_tokens):
            return cf.dp_flops_per_byte(n_tokens)
    """, "check_intensities"),
    "alias_link": ("from parlab.costs import required_flops_per_byte as link_requirement",
                   "check_intensities"),
    "wrapped_placement": ("""
        from parlab.widgets import interconnect_summary
        def placement(h, n_tokens, flops_per_s, bytes_per_s):
            s = interconnect_summary(h, n_tokens, flops_per_s, bytes_per_s)
            return {k: {"compute_bound": s[k + "_headroom"] >= 1, "headroom": s[k + "_headroom"]}
                    for k in ("tp", "dp")}
    """, "check_placement"),
    "alias_placement": ("from parlab.costs import headroom as placement", "check_placement"),
}


def _refusal(how: str) -> str:
    source, check = REEXPORTS[how]
    ns = learner_namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match="the course's own reference") as info:
        CHECKS[check](ns, 2)
    return str(info.value)


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    _refusal(how)


@pytest.mark.parametrize("bare, wrapped", [("alias_tp", "wrapped_tp"), ("alias_tp", "wrapped_dp"),
                                           ("alias_placement", "wrapped_placement")])
def test_a_wrapper_is_refused_with_the_words_of_a_bare_reexport(bare, wrapped):
    assert _refusal(wrapped) == _refusal(bare)
