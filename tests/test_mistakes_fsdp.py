"""Module 01's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

As in tests/test_mistakes_sp.py: the solutions notebook's imports cell and answer cells
(BEGIN/END SOLUTION lines dropped) run into one fresh module, not in sys.modules, so
cloudpickle ships its classes to the ranks by value, like notebook cells; a mistake file from
autograder/mistakes/01_memory_and_sharding/ runs on top, replacing what it defines. The
`hidden:<grade id>` checks run that test cell of the solutions notebook, hidden tests
included, as the grader does.
"""

from __future__ import annotations

import ast
import textwrap
import types

import mistakes
import nbformat
import pytest
from conftest import ROOT

from parlab.check import CheckFailed
from parlab.check import fsdp as fsdpcheck
from parlab.grading import grade_id

pytestmark = pytest.mark.usefixtures("no_orphans")
NOTEBOOK = ROOT / "solutions" / "01_memory_and_sharding" / "01_memory_and_sharding.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "01_memory_and_sharding"


def _test_cell(gid: str) -> str:
    cells = [c for c in nbformat.read(NOTEBOOK, as_version=4).cells if grade_id(c) == gid]
    assert len(cells) == 1, f"no test cell {gid}"
    return cells[0].source


def _hidden(gid: str):
    def run(ns: types.ModuleType, t: int) -> None:
        exec(compile(_test_cell(gid), f"<{gid}>", "exec"), ns.__dict__)
    return run


CHECKS = {
    "check_state_bytes": lambda ns, t: fsdpcheck.check_state_bytes(ns.state_bytes, ns.practice,
                                                                   quiet=True),
    "check_flat_shards": lambda ns, t: fsdpcheck.check_flat_shards(
        ns.take_shard, ns.all_gather_flat, ns.reduce_scatter_flat, world_size=t, quiet=True),
    "check_fsdp_layer": lambda ns, t: fsdpcheck.check_fsdp_layer(ns.FSDPLinear, world_size=t,
                                                                 quiet=True),
    "check_reshard_plan": lambda ns, t: fsdpcheck.check_reshard_plan(ns.plan_reshard,
                                                                     quiet=True),
    **{f"hidden:{gid}": _hidden(gid) for gid in ("state_bytes_test", "fsdp_shards_test",
                                                 "fsdp_layer_test", "reshard_test")},
}
ON_RANKS = {"check_flat_shards", "check_fsdp_layer", "hidden:fsdp_shards_test",
            "hidden:fsdp_layer_test"}  # their messages name the rank


def _sizes(check: str) -> tuple[int, ...]:
    return (2, 4) if check in ("check_flat_shards", "check_fsdp_layer") else (2,)


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=3)


CASES = mistakes.cases(MISTAKES, _sizes)


def test_corpus_is_complete_and_documented():
    required = {"grads_allreduced", "gathered_weight_kept", "shard_wrong_offset",  # issue 9
                "shard_is_view", "shard_size_hard_coded", "grads_divided_in_place",  # 16
                "state_wraps_costs", "plan_wraps_reference", "plan_sorts_sizes_in_place"}
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


def test_hidden_asserts_carry_messages():
    # a bare assert in a hidden test shows nothing once feedback hides the line
    for cell in nbformat.read(NOTEBOOK, as_version=4).cells:
        if cell.cell_type == "code" and "### BEGIN HIDDEN TESTS" in cell.source:
            tree = ast.parse(cell.source)
            bare = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert) and not n.msg]
            assert not bare, f"{grade_id(cell)}: assert without a message on lines {bare}"


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
    "alias_shard": ("from parlab.dp.fsdp import take_shard", "check_flat_shards"),
    "wrapped_shard": ("""
        import parlab.dp.fsdp
        def take_shard(flat, rank, t):
            return parlab.dp.take_shard(flat, rank, t)
    """, "check_flat_shards"),
    "wrapped_gather": ("""
        import parlab.dp.fsdp
        def all_gather_flat(shard):
            return parlab.dp.gather_flat_params(shard, numel=shard.numel() * 2)
    """, "check_flat_shards"),
    "alias_plan": ("from parlab.dp.fsdp import plan_reshard", "check_reshard_plan"),
    "wrapped_plan": ("""
        import parlab.dp
        def plan_reshard(sizes, budget):
            return parlab.dp.plan_reshard(sizes, budget)
    """, "check_reshard_plan"),
    "alias_state": ("from parlab.costs import training_state_bytes as state_bytes",
                    "check_state_bytes"),
    "wrapped_state": ("""
        from parlab import costs
        def state_bytes(n_params, strategy, dp):
            return sum(costs.state_breakdown(n_params, strategy, dp).values())
    """, "check_state_bytes"),
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


@pytest.mark.parametrize("bare, wrapped", [
    ("alias_layer", "wrapped_layer"), ("alias_layer", "subclass_layer"),
    ("alias_shard", "wrapped_shard"), ("alias_shard", "wrapped_gather"),
    ("alias_plan", "wrapped_plan"), ("alias_state", "wrapped_state")])
def test_a_wrapper_is_refused_with_the_words_of_a_bare_reexport(bare, wrapped):
    assert _refusal(wrapped) == _refusal(bare)
