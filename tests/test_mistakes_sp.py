"""Module 03's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

As in tests/test_mistakes_tp.py: the solutions notebook's imports cell and answer cells
(BEGIN/END SOLUTION lines dropped) run into one fresh module, not in sys.modules, so
cloudpickle ships its classes to the ranks by value, like notebook cells; a mistake file from
autograder/mistakes/03_sequence_parallel/ runs on top, replacing what it defines. Each mistake
file lists in CAUGHT_BY the checks that must reject it and a phrase the message must contain.
"""

from __future__ import annotations

import textwrap
import types

import mistakes
import pytest
from conftest import ROOT

from parlab.check import CheckFailed, reset_outcomes
from parlab.check import sp as spcheck

pytestmark = pytest.mark.usefixtures("no_orphans")


@pytest.fixture(autouse=True)
def fresh_kernel():
    """Each test starts as a fresh kernel would: no exercise has passed or failed yet."""
    reset_outcomes()
    yield
    reset_outcomes()

NOTEBOOK = ROOT / "solutions" / "03_sequence_parallel" / "03_sequence_parallel.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "03_sequence_parallel"
CHECKS = {
    "check_sp_pair": lambda ns, t: spcheck.check_sp_pair(ns.gather_seq, ns.reduce_scatter_seq,
                                                         world_size=t, quiet=True),
    "check_sp_dropout": lambda ns, t: spcheck.check_sp_dropout(ns.sp_dropout, world_size=t,
                                                               quiet=True),
    "check_sp_block": lambda ns, t: spcheck.check_sp_block(ns.SPBlock, world_size=t, quiet=True),
    "check_sp_bytes": lambda ns, t: spcheck.check_sp_bytes(ns.SPBlock, ns.sp_layer_bytes,
                                                           world_size=t, quiet=True),
    "check_saved_bytes": lambda ns, t: spcheck.check_saved_bytes(ns.saved_bytes, world_size=t,
                                                                 quiet=True),
}


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=5)


CASES = mistakes.cases(MISTAKES)


def test_corpus_is_complete_and_documented():
    required = {"gather_wrong_dim", "ln_grad_not_reduced", "same_seed_every_rank",  # issue 6
                "dropout_scale_over_p", "dropout_in_place", "fresh_layernorm",  # issue 16
                "hardcoded_hidden", "sp_bytes_no_dtype"}
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
    assert "rank " in message or "sp_layer_bytes(b=" in message


REEXPORTS = {  # how an answer could hand back parlab's own code -> the check that must refuse
    "alias_block": ("from parlab.tp.block import SPBlock", "check_sp_block"),
    "subclass_block": ("""
        import parlab.tp.block
        class SPBlock(parlab.tp.SPBlock):
            pass
    """, "check_sp_block"),
    "wrapped_block": ("""
        import parlab.tp.block
        class SPBlock(nn.Module):
            def __init__(self, block):
                super().__init__()
                self.inner = parlab.tp.SPBlock.from_block(block)
                for name in ("ln1", "ln2", "qkv", "proj", "fc1", "fc2"):
                    setattr(self, name, getattr(self.inner, name))
            def forward(self, x, generator):
                return self.inner(x, generator)
            def reduce_replicated_grads(self):
                self.inner.allreduce_sequence_parallel_grads()
    """, "check_sp_block"),
    "alias_gather": ("from parlab.tp import gather_from_sequence_parallel_region as gather_seq",
                     "check_sp_pair"),
    "wrapped_gather": ("""
        import parlab.tp
        def all_gather_sequence(x):
            return parlab.tp.gather_from_sequence_parallel_region(x)
    """, "check_sp_pair"),
    "wrapped_dropout": ("""
        import parlab.tp
        def sp_dropout(x, p_drop, generator):
            return parlab.tp.sequence_parallel_dropout(x, p_drop=p_drop, generator=generator)
    """, "check_sp_dropout"),
    "wrapped_grads": ("""
        import parlab.tp
        def reduce_replicated_grads(self):
            parlab.tp.allreduce_sequence_parallel_grads(
                [*self.ln1.parameters(), *self.ln2.parameters(), self.proj.bias, self.fc2.bias])
        SPBlock.reduce_replicated_grads = reduce_replicated_grads
    """, "check_sp_block"),
    "alias_saved_bytes": ("from parlab.costs.activations import saved_tensor_bytes as saved_bytes",
                          "check_saved_bytes"),
    "wrapped_saved_bytes": ("""
        import parlab.costs.activations
        def saved_bytes(fn, *args, exclude=()):
            return parlab.costs.saved_tensor_bytes(fn, *args, exclude=exclude)
    """, "check_saved_bytes"),
    "alias_sp_bytes": ("from parlab.tp import sp_bytes_per_layer as sp_layer_bytes",
                       "check_sp_bytes"),
    "wrapped_sp_bytes": ("""
        import parlab.tp
        def sp_layer_bytes(b, s, h, t, dtype_bytes=2):
            return parlab.tp.sp_bytes_per_layer(b, s, h, t, dtype_bytes)
    """, "check_sp_bytes"),
    "ring_helper_sp_bytes": ("""
        from parlab import costs
        def sp_layer_bytes(b, s, h, t, dtype_bytes=2):
            n = b * s * h * dtype_bytes
            return {"all_gather": 4 * costs.ring_allgather_bytes(n, t),
                    "reduce_scatter": 4 * costs.ring_reduce_scatter_bytes(n, t)}
    """, "check_sp_bytes"),
}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    source, check = REEXPORTS[how]
    ns = learner_namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match="the course's own reference"):
        CHECKS[check](ns, 2)


def test_a_later_check_names_the_earlier_exercise_it_builds_on():
    """Issue 15.3: a wrong gather fails exercise 1, and the layer check, which uses the
    learner's gather_seq and reduce_scatter_seq inside the layer, then says so first."""
    ns = learner_namespace((MISTAKES / "gather_backward_no_sum.py").read_text())
    with pytest.raises(CheckFailed, match="the all-gather's backward must reduce-scatter"):
        CHECKS["check_sp_pair"](ns, 2)
    with pytest.raises(CheckFailed) as info:
        CHECKS["check_sp_block"](ns, 2)
    assert str(info.value).startswith(
        "this check builds on your gather_seq and reduce_scatter_seq (exercise 1), which failed "
        "its own test above: fix that first"), str(info.value)
