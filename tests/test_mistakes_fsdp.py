"""Module 01's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

As in tests/test_mistakes_sp.py: the solutions notebook's imports cell and answer cells
(BEGIN/END SOLUTION lines dropped) run into one fresh module, not in sys.modules, so
cloudpickle ships its classes to the ranks by value, like notebook cells; a mistake file from
autograder/mistakes/01_memory_and_sharding/ runs on top, replacing what it defines.
"""

from __future__ import annotations

import textwrap
import types

import mistakes
import pytest
from conftest import ROOT

from parlab.check import CheckFailed
from parlab.check import fsdp as fsdpcheck

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "01_memory_and_sharding" / "01_memory_and_sharding.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "01_memory_and_sharding"
CHECKS = {
    "check_state_bytes": lambda ns, t: fsdpcheck.check_state_bytes(ns.state_bytes, ns.practice,
                                                                   quiet=True),
    "check_fsdp_layer": lambda ns, t: fsdpcheck.check_fsdp_layer(ns.FSDPLinear, world_size=t,
                                                                 quiet=True),
    "check_reshard_plan": lambda ns, t: fsdpcheck.check_reshard_plan(ns.plan_reshard,
                                                                     quiet=True),
}


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=3)


CASES = mistakes.cases(MISTAKES)


def test_corpus_is_complete_and_documented():
    required = {"grads_allreduced", "gathered_weight_kept", "shard_wrong_offset"}  # issue 9
    mistakes.assert_corpus_documented(MISTAKES, required, CHECKS)


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_solutions_pass(check, t):
    CHECKS[check](learner_namespace(), t)


@pytest.mark.parametrize("path, check, phrase, t", CASES)
def test_mistake_is_caught_with_a_pointer(path, check, phrase, t):
    ns = learner_namespace(path.read_text())
    message = mistakes.caught_message(lambda: CHECKS[check](ns, t), phrase=phrase,
                                      where=f"{path.name} under {check} on {t} ranks")
    assert "rank " in message


REEXPORTS = {
    "alias_layer": ("from parlab.dp.fsdp import FSDPLinear", "check_fsdp_layer"),
    "subclass_layer": ("""
        import parlab.dp.fsdp
        class FSDPLinear(parlab.dp.FSDPLinear):
            pass
    """, "check_fsdp_layer"),
    "wrapped_layer": ("""
        import parlab.dp.fsdp
        class FSDPLinear(nn.Module):
            def __init__(self, linear):
                super().__init__()
                self.inner = parlab.dp.FSDPLinear.from_linear(linear)
            def forward(self, x):
                return self.inner(x)
    """, "check_fsdp_layer"),
    "wrapped_shard": ("""
        import parlab.dp.fsdp
        def take_shard(flat, rank, t):
            return parlab.dp.take_shard(flat, rank, t)
    """, "check_fsdp_layer"),
    "alias_plan": ("from parlab.dp.fsdp import plan_reshard", "check_reshard_plan"),
    "alias_state": ("from parlab.costs import training_state_bytes as state_bytes",
                    "check_state_bytes"),
}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    source, check = REEXPORTS[how]
    ns = learner_namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match="the course's own reference"):
        CHECKS[check](ns, 2)
