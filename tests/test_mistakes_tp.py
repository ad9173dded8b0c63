"""Module 02's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

A learner's notebook is rebuilt the way a kernel holds it: the solutions notebook's imports
cell and answer cells (BEGIN/END SOLUTION lines dropped) run into one fresh module, and a
mistake file from autograder/mistakes/02_tensor_parallel/ runs on top of them, replacing the
names it defines, as a learner's wrong cell would. Each mistake file lists in CAUGHT_BY the
checks that must reject it and a phrase the message must contain. The module is not in
sys.modules, so cloudpickle ships its classes to the ranks by value, like notebook cells.
"""

from __future__ import annotations

import textwrap
import types

import mistakes
import pytest
from conftest import ROOT

from parlab.check import CheckFailed
from parlab.check import tp as tpcheck

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "02_tensor_parallel" / "02_tensor_parallel.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "02_tensor_parallel"
CHECKS = {
    "check_f_g": lambda ns, t: tpcheck.check_f_g(ns.f, ns.g, world_size=t, quiet=True),
    "check_parallel_linears": lambda ns, t: tpcheck.check_parallel_linears(
        ns.ColumnParallelLinear, ns.RowParallelLinear, world_size=t, quiet=True),
    "check_tp_mlp": lambda ns, t: tpcheck.check_tp_mlp(ns.TPMLP, world_size=t, quiet=True),
    "check_row_first": lambda ns, t: tpcheck.check_row_first(ns.RowFirstMLP, world_size=t,
                                                             quiet=True),
    "check_tp_attention": lambda ns, t: tpcheck.check_tp_attention(ns.TPAttention,
                                                                   world_size=t, quiet=True),
    "check_tp_block": lambda ns, t: tpcheck.check_tp_block(ns.TPBlock, ns.layer_bytes,
                                                           world_size=t, quiet=True),
}


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=6)


CASES = mistakes.cases(MISTAKES)


def test_corpus_is_complete_and_documented():
    required = {"missing_backward_allreduce", "allreduce_twice", "wrong_shard",
                "bias_every_rank", "swapped_order"}
    mistakes.assert_corpus_documented(MISTAKES, required, CHECKS)


@pytest.mark.parametrize("t", [2, 3, 4])
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_solutions_pass(check, t):
    CHECKS[check](learner_namespace(), t)


@pytest.mark.parametrize("path, check, phrase, t", CASES)
def test_mistake_is_caught_with_a_pointer(path, check, phrase, t):
    ns = learner_namespace(path.read_text())
    message = mistakes.caught_message(lambda: CHECKS[check](ns, t), phrase=phrase,
                                      where=f"{path.name} under {check} on {t} ranks")
    assert "rank " in message  # every message from a rank-level comparison names the rank


REEXPORTS = {
    "alias": "from parlab.tp import TPMLP",
    "subclass": """
        import parlab.tp
        class TPMLP(parlab.tp.TPMLP):
            pass
    """,
    "wrapper": """
        import parlab.tp
        class TPMLP(nn.Module):
            def __init__(self, mlp):
                super().__init__()
                inner = parlab.tp.TPMLP.from_mlp(mlp)
                self.fc1, self.fc2 = inner.fc1, inner.fc2
            def forward(self, x):
                return self.fc2(F.gelu(self.fc1(x)))
    """,
    "function": """
        from parlab.tp import copy_to_tp_region as f
    """,
    "wrapped_function": """
        import parlab.tp
        def f(x):
            return parlab.tp.copy_to_tp_region(x)
    """,
}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    ns = learner_namespace(textwrap.dedent(REEXPORTS[how]))
    check = "check_f_g" if "function" in how else "check_tp_mlp"
    with pytest.raises(CheckFailed, match="the course's own reference"):
        CHECKS[check](ns, 2)
