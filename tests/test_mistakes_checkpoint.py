"""Module 09's graded check catches the mistakes corpus, passes the solution, rejects DCP's own.

As in tests/test_mistakes_composition.py: the solutions notebook's imports cell and answer
cell (BEGIN/END SOLUTION lines dropped) run into one fresh module, not in sys.modules; a
mistake file from autograder/mistakes/09_checkpoints_and_restarts/ runs on top, replacing
what it defines. Each mistake file lists in CAUGHT_BY the checks that must reject it and a
phrase the message must contain. The check runs as the hidden test does (quiet=True: every
case); its reference is torch.distributed.checkpoint on 4 ranks, about 6 s, once: the check
keeps DCP's pieces of each case for the process's life, so the later cases start no ranks.
"""

from __future__ import annotations

import textwrap
import types

import mistakes
import pytest
from conftest import ROOT
from mistakes import caught_by

from parlab.check import CheckFailed
from parlab.check import checkpoint as ckcheck

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "09_checkpoints_and_restarts" / "09_checkpoints_and_restarts.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "09_checkpoints_and_restarts"
CHECKS = {
    "check_reshard": lambda ns: ckcheck.check_reshard(ns.reshard, quiet=True),
}


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=1)


CASES = [pytest.param(path, check, phrase, id=f"{path.stem}-{check}")
         for path in sorted(MISTAKES.glob("*.py")) for check, phrase in caught_by(path).items()]


def test_corpus_is_complete_and_documented():
    required = {"weight_only", "wrong_dim", "split_in_two", "views_of_whole", "modifies_input",
                "reversed_order", "returns_one_tensor"}
    mistakes.assert_corpus_documented(MISTAKES, required, CHECKS)


@pytest.mark.slow
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_solutions_pass(check):
    CHECKS[check](learner_namespace())


@pytest.mark.parametrize("path, check, phrase", CASES)
def test_mistake_is_caught_with_a_pointer(path, check, phrase):
    ns = learner_namespace(path.read_text())
    mistakes.caught_message(lambda: CHECKS[check](ns), phrase=phrase,
                            where=f"{path.name} under {check}")


REEXPORTS = {  # how an answer could hand back the course's own code -> the check that refuses
    "wrapped_reshard_pieces": ("""
        from parlab.compose import reshard_pieces
        def reshard(pieces, dim, t_new):
            parts = {k: reshard_pieces([p[k] for p in pieces], dim, t_new) for k in pieces[0]}
            return [{k: parts[k][r] for k in parts} for r in range(t_new)]
    """, "check_reshard"),
    "alias_reshard_pieces": ("from parlab.compose import reshard_pieces as reshard",
                             "check_reshard"),
    "dcp_load": ("""
        import torch.distributed.checkpoint as dcp
        def reshard(pieces, dim, t_new):
            dcp.load({}, checkpoint_id="/nonexistent")
    """, "check_reshard"),
    "dtensor_redistribute": ("""
        from torch.distributed.tensor import DTensor
        def reshard(pieces, dim, t_new):
            return DTensor.redistribute(pieces[0]["weight"])
    """, "check_reshard"),
}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    source, check = REEXPORTS[how]
    ns = learner_namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match="the course's own"):
        CHECKS[check](ns)
