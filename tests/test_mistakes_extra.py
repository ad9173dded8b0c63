"""Module-specific mistakes tests that follow no common pattern (the common ones:
tests/test_mistakes.py). Most are issue 15.3: a later check that builds on an earlier
exercise's answer says so first when that exercise failed its own check in this kernel.
Each runs the checks as the module's table (tests/mistake_tables/) calls them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from mistake_tables import collectives, composition, cp, moe, pp, sp, tp, whole

from parlab.check import CheckFailed, reset_outcomes
from parlab.check import capstone as capcheck
from parlab.check import composition as compcheck
from parlab.check import cp as cpcheck
from parlab.check import pp as ppcheck
from parlab.check._harness import CHECK_TIMEOUT_S
from parlab.check.moe.ep_hints import varied

pytestmark = pytest.mark.usefixtures("no_orphans")


def _entry(table, stem: str) -> str:
    return (table.folder / f"{stem}.py").read_text()


# --- 00 collectives -------------------------------------------------------------------------
def test_bf16_bytes_hint_names_both_mistakes_that_give_half():
    table = collectives.TABLE
    ns = table.namespace(_entry(table, "dp_intensity_bf16_bytes"))
    with pytest.raises(CheckFailed) as info:
        table.checks["check_intensities"](ns, 2)
    assert "bf16 bytes" in str(info.value) and "3P FLOPs per token instead of 6P" in str(
        info.value)


# --- 02 tensor parallel ---------------------------------------------------------------------
def test_tp_later_check_names_the_earlier_exercise_it_builds_on():
    """A wrong f fails exercise 1, and exercise 3, which uses the learner's f inside its
    layers, then says so before its own message."""
    table = tp.TABLE
    ns = table.namespace(_entry(table, "missing_backward_allreduce"))
    with pytest.raises(CheckFailed, match="f's backward must all-reduce"):
        table.checks["check_f_g"](ns, 2)
    with pytest.raises(CheckFailed) as info:
        table.checks["check_tp_mlp"](ns, 2)
    message = str(info.value)
    assert message.startswith("this check builds on your f and g (exercise 1), which failed its "
                              "own test above: fix that first"), message
    assert "f's backward must all-reduce" in message  # and its own finding follows
    table.checks["check_f_g"](table.namespace(), 2)  # fixed: exercise 1 passes again, and then
    with pytest.raises(CheckFailed) as info:  # exercise 3's message is its own
        table.checks["check_tp_mlp"](ns, 2)
    assert not str(info.value).startswith("this check builds on"), str(info.value)


# --- 03 sequence parallel -------------------------------------------------------------------
def test_sp_later_check_names_the_earlier_exercise_it_builds_on():
    """A wrong gather fails exercise 1, and the layer check, which uses the learner's
    gather_seq and reduce_scatter_seq inside the layer, then says so first."""
    table = sp.TABLE
    ns = table.namespace(_entry(table, "gather_backward_no_sum"))
    with pytest.raises(CheckFailed, match="the all-gather's backward must reduce-scatter"):
        table.checks["check_sp_pair"](ns, 2)
    with pytest.raises(CheckFailed) as info:
        table.checks["check_sp_block"](ns, 2)
    assert str(info.value).startswith(
        "this check builds on your gather_seq and reduce_scatter_seq (exercise 1), which failed "
        "its own test above: fix that first"), str(info.value)


# --- 04 pipeline parallel -------------------------------------------------------------------
def test_the_executor_check_names_exercise_1_when_it_failed_first():
    """Exercise 2 runs the learner's own 1F1B: a broken one fails exercise 1's check, and the
    exercise-2 check then says that it builds on it, instead of an unrelated-looking failure."""
    table = pp.TABLE
    ns = table.namespace(_entry(table, "backward_before_forward"))
    with pytest.raises(CheckFailed):
        table.checks["check_1f1b"](ns, 2)
    with pytest.raises(CheckFailed, match=r"builds on your one_f_one_b \(exercise 1\), which "
                       r"failed its own test above") as info:
        table.checks["check_p2p_step"](ns, 2)
    assert "cannot run" in str(info.value)


def test_exercise_2_is_checked_on_its_own_while_exercise_1_is_not_written(capsys):
    ns = pp.TABLE.namespace("""
        def one_f_one_b(p, m):
            raise NotImplementedError()
    """.replace("\n        ", "\n"))
    ppcheck.check_p2p_step(ns.forward_step, ns.backward_step, ns.one_f_one_b, world_size=2)
    assert "your one_f_one_b is not written yet" in capsys.readouterr().out


# --- 05 context parallel --------------------------------------------------------------------
@pytest.mark.slow
def test_deadlock_is_caught_within_the_checks_own_timeout():
    table = cp.TABLE
    ns = table.namespace(_entry(table, "recv_before_send"))
    start = time.monotonic()
    with pytest.raises(CheckFailed, match="A blocking dist.recv") as info:
        cpcheck.check_ring_forward(ns.ring_attention, world_size=2, quiet=True)
    took = time.monotonic() - start
    assert "did not finish on 2 ranks" in str(info.value)
    assert took < CHECK_TIMEOUT_S + 10 < 60, f"took {took:.1f} s (nbgrader's cell limit: 60 s)"


def test_the_ring_check_names_exercise_1_when_the_merge_failed_first():
    """The learner's ring calls the learner's merge: a merge that failed its own check makes
    the ring check say so first."""
    table = cp.TABLE
    ns = table.namespace(_entry(table, "no_max_shift"))
    with pytest.raises(CheckFailed):
        table.checks["check_merge"](ns, 2)
    with pytest.raises(CheckFailed, match=r"builds on your merge \(exercise 1\), which failed "
                       "its own test above"):
        table.checks["check_ring_forward"](ns, 2)


def test_no_hint_sends_the_learner_to_two_ranks():
    """Issue 16.8: a hint must not say "try on 2 ranks to see it fail" (the mistakes that
    show only from 3 ranks on say why instead)."""
    sources = [p.read_text() for p in Path(cpcheck.__file__).parent.glob("*.py")]
    assert sources
    assert not any("2 ranks with parlab.launch.run" in s or "to see it fail" in s
                   for s in sources)


# --- 06 expert parallel ---------------------------------------------------------------------
def test_ep_capacity_says_when_keep_mask_failed():
    """Exercise 4 runs the learner's own keep_mask; when exercise 2's check failed earlier in
    the kernel, exercise 4's message starts by saying so."""
    table = moe.TABLE
    ns = table.namespace(_entry(table, "keep_token_major"))
    with pytest.raises(CheckFailed, match="serve the assignments choice first"):
        table.checks["check_capacity"](ns, 2)
    with pytest.raises(CheckFailed, match=r"builds on your expert_capacity and keep_mask "
                                          r"\(exercise 2\), which failed its own test above"):
        table.checks["check_ep_capacity"](ns, 2)


OFF_EVERYWHERE = """
_right_ep_moe = ep_moe  # noqa: F821


def ep_moe(x, gates, experts, shard):
    return _right_ep_moe(x, gates, experts, shard) + 1e-3 * x  # wrong at every size
"""


def test_ep_hint_names_what_differs_only_when_the_base_passed():
    """A check at 3 experts per rank used to say 'the experts per rank are shard.local' for
    any wrong answer there (issue 44.2: a cause it did not establish). It runs 2 experts per
    rank first: an answer wrong at every size fails there, with no word about shard.local;
    one right at 2 and wrong at 3 is told so, and where both the experts per rank and k
    differ from the base, both are named."""
    table = moe.TABLE
    ns = table.namespace(OFF_EVERYWHERE)
    with pytest.raises(CheckFailed) as info:
        table.checks["check_ep_moe_three_per_rank"](ns, 3)
    message = str(info.value)
    assert "9 experts" not in message and "(6 experts, 2 per rank)" in message, message
    assert "shard.local" not in message and "follow one token" in message, message
    both = varied(3, 3)
    assert "right with 2 experts per rank, wrong with 3" in both and "take k from" in both
    assert "either" in both, both


# --- 07 composition -------------------------------------------------------------------------
@pytest.mark.slow
def test_capstone_says_when_build_groups_failed():
    """The capstone runs the learner's own build_groups; when that failed its own check
    earlier in the kernel, the capstone's message starts by saying so."""
    table = composition.TABLE
    ns = table.namespace(_entry(table, "tp_outermost"))
    reset_outcomes()
    with pytest.raises(CheckFailed, match="TP is the innermost axis"):
        compcheck.check_build_groups(ns.build_groups, world_size=composition.T)
    with pytest.raises(CheckFailed, match=r"builds on your build_groups \(exercise 1b\), which "
                                          r"failed its own test above: fix that first"):
        capcheck.check_capstone(ns.train_dp_tp)


# --- 08 the whole machine -------------------------------------------------------------------
BROKEN_DDP = """
class OverlappedDDP:
    def __init__(self, params, *, group=None, bucket_bytes):
        self.buckets = [list(params)]
        self.buckets[0][len(self.buckets[0])]  # IndexError: off by one
"""


@pytest.mark.slow
def test_whole_later_check_names_the_earlier_exercise_it_builds_on():
    """An OverlappedDDP that fails exercise 1 makes train_3d (exercise 3), which uses it, fail
    too; the later message then says so first."""
    table = whole.TABLE
    ns = table.namespace(BROKEN_DDP)
    with pytest.raises(CheckFailed, match="raised IndexError"):
        table.checks["check_overlapped_ddp"](ns, 2)
    with pytest.raises(CheckFailed) as info:
        table.checks["check_train_3d"](ns, 8)
    assert str(info.value).startswith(
        "this check builds on your OverlappedDDP (exercise 1), which failed its own test "
        "above: fix that first"), str(info.value)
