"""Module 08's graded checks catch the mistakes corpus, pass the solutions, reject parlab's own.

As in tests/test_mistakes_sp.py: the solutions notebook's imports cell and answer cells
(BEGIN/END SOLUTION lines dropped) run into one fresh module, not in sys.modules, so
cloudpickle ships its classes to the ranks by value, like notebook cells; a mistake file from
autograder/mistakes/08_the_whole_machine/ runs on top, replacing what it defines. Each mistake
file lists in CAUGHT_BY the checks that must reject it and a phrase the message must contain,
and in SIZES the world sizes it needs when they are not the default (DEFAULT_SIZES).

The 70B model and the cluster of exercise 4 are built here from the Llama 3 paper's
architecture (80 layers, width 8192, SwiGLU 28672, 64 heads over 8 KV heads, vocabulary
128256, untied embeddings), as the notebook builds them.
"""

from __future__ import annotations

import ast
import textwrap
import types

import mistakes
import pytest
from conftest import ROOT

from parlab import plan as planner
from parlab.check import CheckFailed, _harness
from parlab.check import whole as wholecheck
from parlab.widgets import h100_cluster

pytestmark = pytest.mark.usefixtures("no_orphans")


@pytest.fixture(autouse=True)
def fresh_kernel():
    """Each test starts as a fresh kernel would: no exercise has passed or failed yet."""
    _harness._OUTCOMES.clear()
    yield
    _harness._OUTCOMES.clear()


NOTEBOOK = ROOT / "solutions" / "08_the_whole_machine" / "08_the_whole_machine.ipynb"
MISTAKES = ROOT / "autograder" / "mistakes" / "08_the_whole_machine"
_PER_LAYER = 2 * 8192 + 8192 * 8192 * 2 + 2 * 8192 * 8 * 128 + 3 * 8192 * 28672
LLAMA3_70B = planner.Model("Llama 3 70B", float(80 * _PER_LAYER + 2 * 128256 * 8192 + 8192),
                           layers=80, hidden=8192, heads=64, seq=8192, vocab=128256)
PLAN_ARGS = {"model": LLAMA3_70B, "cluster": h100_cluster(256), "global_batch": 512}
CHECKS = {
    # t = 4: four ranks in two DP groups of 2 (as DP inside a DP x TP grid)
    "check_overlapped_ddp": lambda ns, t: wholecheck.check_overlapped_ddp(
        ns.OverlappedDDP, world_size=t, groups=[[0, 2], [1, 3]] if t == 4 else None,
        quiet=True),
    "check_recompute": lambda ns, t: wholecheck.check_recompute(
        ns.recompute_forward, ns.saved_bytes_formula, quiet=True),
    # t = 8: the visible run (DP2 x PP2 x TP2 + SP, AdamW); t = 6: the hidden one (SGD)
    "check_train_3d": lambda ns, t: wholecheck.check_train_3d(ns.train_3d, quiet=t != 8),
    "check_plan_70b": lambda ns, t: wholecheck.check_plan_70b(
        ns.memory_per_gpu, ns.bytes_per_step, ns.my_plan, quiet=True, **PLAN_ARGS),
}
DEFAULT_SIZES = {"check_overlapped_ddp": (2,), "check_recompute": (1,),
                 "check_train_3d": (8,), "check_plan_70b": (1,)}


def learner_namespace(*overlays: str) -> types.ModuleType:
    return mistakes.learner_namespace(NOTEBOOK, *overlays, answers=4)


def sizes(path) -> dict[str, tuple[int, ...]]:
    """A mistake file's SIZES = {check: world sizes}, or {} (the defaults apply)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SIZES":
            return ast.literal_eval(node.value)
    return {}


CASES = [pytest.param(path, check, phrase, t, id=f"{path.stem}-{check}-t{t}",
                      marks=[pytest.mark.slow] if check == "check_train_3d" else [])
         for path in sorted(MISTAKES.glob("*.py"))
         for check, phrase in mistakes.caught_by(path).items()
         for t in sizes(path).get(check, DEFAULT_SIZES[check])]
WHERE = ("rank ", "recompute_forward(", "saved_bytes_formula(", "memory_per_gpu(",
         "bytes_per_step(", "step ")


def test_corpus_is_complete_and_documented():
    required = {"ddp_allreduce_every_microbatch", "ddp_tensor_hook", "ddp_no_overlap",  # 18.3
                "recompute_whole_attention", "recompute_formula_no_ln_stats",  # 18.4
                "train3d_no_sp_reduction", "train3d_whole_model", "train3d_summed_dp",  # 18.5
                "ddp_divide_by_two", "ddp_ignores_group", "plan_floor_layers"}  # 16.1
    mistakes.assert_corpus_documented(MISTAKES, required, CHECKS)


@pytest.mark.parametrize("check, t", [
    ("check_overlapped_ddp", 2), ("check_overlapped_ddp", 4), ("check_recompute", 1),
    ("check_plan_70b", 1)])
def test_solutions_pass(check, t):
    """(train_3d's solution passes both of its runs in tests/test_notebooks.py (a), where the
    course run autogrades the answered notebook; an 8-rank run is not repeated here.)"""
    CHECKS[check](learner_namespace(), t)


@pytest.mark.parametrize("path, check, phrase, t", CASES)
def test_mistake_is_caught_with_a_pointer(path, check, phrase, t):
    ns = learner_namespace(path.read_text())
    message = mistakes.caught_message(lambda: CHECKS[check](ns, t), phrase=phrase,
                                      where=f"{path.name} under {check} on {t} ranks")
    assert any(w in message for w in WHERE), message  # names the rank, the call or the step


REEXPORTS = {  # how an answer could hand back the course's own code -> the check that refuses
    "alias_ddp": ("from parlab.dp import BucketedDDP as OverlappedDDP", "check_overlapped_ddp"),
    "subclass_ddp": ("""
        import parlab.dp
        class OverlappedDDP(parlab.dp.BucketedDDP):
            pass
    """, "check_overlapped_ddp"),
    "wrapped_ddp": ("""
        import parlab.dp
        class OverlappedDDP:
            def __init__(self, params, *, group=None, bucket_bytes):
                self.inner = parlab.dp.BucketedDDP(params, group=group, bucket_bytes=bucket_bytes)
            def no_sync(self):
                return self.inner.no_sync()
            def finish(self):
                self.inner.finish()
    """, "check_overlapped_ddp"),
    "torch_ddp": ("""
        from torch.nn.parallel import DistributedDataParallel
        class OverlappedDDP:
            def __init__(self, params, *, group=None, bucket_bytes):
                self.holder = nn.ParameterList(list(params))
                self.ddp = DistributedDataParallel(self.holder, process_group=group)
            def no_sync(self):
                return self.ddp.no_sync()
            def finish(self):
                pass
    """, "check_overlapped_ddp"),
    "wrapped_layer": ("""
        def recompute_forward(layer, x, recompute):
            layer.recompute = recompute
            return layer(x)
    """, "check_recompute"),
    "wrapped_formula": ("""
        from parlab import costs
        def saved_bytes_formula(b, s, h, a, recompute):
            if recompute == "full":
                return 2 * s * b * h
            return costs.activation_bytes_per_layer(b, s, h, a, keep_scores=recompute == "none") \\
                + 8 * s * b
    """, "check_recompute"),
    "wrapped_planner": ("""
        from parlab import plan as planner
        def memory_per_gpu(model, sizes, *, strategy, recompute, micro_batch, microbatches):
            shape = planner.Shape(dp=sizes.get("dp", 1), pp=sizes.get("pp", 1), ep=1,
                                  cp=sizes.get("cp", 1), tp=sizes.get("tp", 1))
            out = planner.state_memory(model, shape, strategy)
            out["activations"] = planner.activation_memory(
                model, shape, micro_batch=micro_batch, microbatches=microbatches,
                recompute=recompute)
            return out
    """, "check_plan_70b"),
    "wrapped_train": ("""
        def train_3d(cfg, plan, steps, *, lr, make_optimizer):
            return train(cfg, plan, steps, lr=lr)
    """, "check_train_3d"),
}


@pytest.mark.parametrize("how", sorted(REEXPORTS))
def test_reference_implementation_is_rejected(how):
    source, check = REEXPORTS[how]
    ns = learner_namespace(textwrap.dedent(source))
    with pytest.raises(CheckFailed, match="the course's own reference"):
        CHECKS[check](ns, DEFAULT_SIZES[check][0])


BROKEN_DDP = """
class OverlappedDDP:
    def __init__(self, params, *, group=None, bucket_bytes):
        self.buckets = [list(params)]
        self.buckets[0][len(self.buckets[0])]  # IndexError: off by one
"""


@pytest.mark.slow
def test_a_later_check_names_the_earlier_exercise_it_builds_on():
    """Issue 15.3: an OverlappedDDP that fails exercise 1 makes train_3d (exercise 3), which
    uses it, fail too; the later message then says so first."""
    ns = learner_namespace(BROKEN_DDP)
    with pytest.raises(CheckFailed, match="raised IndexError"):
        CHECKS["check_overlapped_ddp"](ns, 2)
    with pytest.raises(CheckFailed) as info:
        CHECKS["check_train_3d"](ns, 8)
    assert str(info.value).startswith(
        "this check builds on your OverlappedDDP (exercise 1), which failed its own test "
        "above: fix that first"), str(info.value)
