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

from parlab.check import CheckFailed, reset_outcomes
from parlab.check import tp as tpcheck

pytestmark = pytest.mark.usefixtures("no_orphans")


@pytest.fixture(autouse=True)
def fresh_kernel():
    """Each test starts as a fresh kernel would: no exercise has passed or failed yet."""
    reset_outcomes()
    yield
    reset_outcomes()

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
                "bias_every_rank", "swapped_order",
                "extra_g", "gelu_forgotten", "swapped_layers",  # issue 15.2
                "extra_f",  # 16.8
                "shard_view", "hardcoded_heads", "fresh_layernorm", "residual_in_place",  # 16
                "layer_bytes_forward_only"}  # 16.8, two mistakes with one formula
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
    # a rank-level comparison names the rank; a byte formula (checked in the kernel) the call
    assert "rank " in message or "layer_bytes(b=" in message


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
    "bytes_alias": "from parlab.costs import tp_bytes_per_layer as layer_bytes",
    "bytes_wrapper": """
        import parlab.costs
        def layer_bytes(b, s, h, t, dtype_bytes=2):
            return parlab.costs.tp_bytes_per_layer(b, s, h, t, dtype_bytes)
    """,
    "bytes_ring_helper": """
        from parlab import costs
        def layer_bytes(b, s, h, t, dtype_bytes=2):
            return 4 * costs.ring_allreduce_bytes(b * s * h * dtype_bytes, t)
    """,
}
REFUSED_BY = {"function": "check_f_g", "wrapped_function": "check_f_g",
              "bytes_alias": "check_tp_block", "bytes_wrapper": "check_tp_block",
              "bytes_ring_helper": "check_tp_block"}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    ns = learner_namespace(textwrap.dedent(REEXPORTS[how]))
    with pytest.raises(CheckFailed, match="the course's own reference") as info:
        CHECKS[REFUSED_BY.get(how, "check_tp_mlp")](ns, 2)
    if how.startswith("bytes"):  # a wrapper is refused with the words of a re-export
        used = "ring_allreduce_bytes" if "ring" in how else "tp_bytes_per_layer"
        assert str(info.value).startswith("your answer uses parlab.costs.") and used in \
            str(info.value), str(info.value)


def test_a_later_check_names_the_earlier_exercise_it_builds_on():
    """Issue 15.3: a wrong f fails exercise 1, and exercise 3, which uses the learner's f
    inside its layers, then says so before its own message."""
    wrong_f = (MISTAKES / "missing_backward_allreduce.py").read_text()
    ns = learner_namespace(wrong_f)
    with pytest.raises(CheckFailed, match="f's backward must all-reduce"):
        CHECKS["check_f_g"](ns, 2)
    with pytest.raises(CheckFailed) as info:
        CHECKS["check_tp_mlp"](ns, 2)
    message = str(info.value)
    assert message.startswith("this check builds on your f and g (exercise 1), which failed its "
                              "own test above: fix that first"), message
    assert "f's backward must all-reduce" in message  # and its own finding follows
    CHECKS["check_f_g"](learner_namespace(), 2)  # fixed: exercise 1 passes again, and then
    with pytest.raises(CheckFailed) as info:  # exercise 3's message is its own
        CHECKS["check_tp_mlp"](ns, 2)
    assert not str(info.value).startswith("this check builds on"), str(info.value)
